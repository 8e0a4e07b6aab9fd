"""Convolutions through the cuDNN 9 legacy C API (ctypes): cudnnConvolutionForward / BackwardData /
BackwardFilter, descriptors built once per convolution, algorithms from the cudnnGet*Algorithm_v7
heuristics or, with autotuning, chosen by measurement (`autotune`). Algorithms are named by enum, so this is
where "fp32_strict" runs (see `precision`)."""
from __future__ import annotations

import ctypes

import numpy as np

from pydtnn.backends.gpu.cudnn import autotune, library
from pydtnn.backends.gpu.cudnn.precision import LEGACY_FFT_WINOGRAD, no_tf32, strict


class _AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (the three share one layout)."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("mathType", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]


_DATA_FLOAT, _DATA_DOUBLE = 0, 1
_TENSOR_NCHW = 0
_CROSS_CORRELATION = 1
_DEFAULT_MATH, _TENSOR_OP_MATH, _TENSOR_OP_MATH_ALLOW_CONVERSION, _FMA_MATH = 0, 1, 2, 3
_DETERMINISTIC = 1
# op -> (heuristics, workspace size, execution) entry points
_FUNCS = {
    "fprop": ("cudnnGetConvolutionForwardAlgorithm_v7", "cudnnGetConvolutionForwardWorkspaceSize",
              "cudnnConvolutionForward"),
    "dgrad": ("cudnnGetConvolutionBackwardDataAlgorithm_v7", "cudnnGetConvolutionBackwardDataWorkspaceSize",
              "cudnnConvolutionBackwardData"),
    "wgrad": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7", "cudnnGetConvolutionBackwardFilterWorkspaceSize",
              "cudnnConvolutionBackwardFilter"),
}


class LegacyCall:
    """One convolution's descriptors and algorithm: `run(x, w, y)` (see frontend.ConvCall)."""
    __slots__ = ("conv", "op", "descs", "plans", "active")

    def __init__(self, conv, op, descs, plans):
        self.conv, self.op, self.descs, self.plans = conv, op, descs, plans
        self.active = plans["tuned"]

    def use(self, which: str) -> None:
        self.active = self.plans[which]

    def run(self, x, w, y):
        self.conv.set_stream()
        self.conv.execute(self.op, self.descs, self.active, x, w, y)


class LegacyConv:
    name = "legacy"

    def __init__(self, cupy, dtype, precision, autotune_on, workspace, deterministic=False):
        self.lib, self.cp, self.ws, self.autotune = library.load_libcudnn(), cupy, workspace, autotune_on
        self.deterministic = deterministic
        self.lib.cudnnGetErrorString.restype = ctypes.c_char_p
        double = np.dtype(dtype) == np.float64
        self.dt = _DATA_DOUBLE if double else _DATA_FLOAT
        self.no_tf32 = no_tf32(precision, not double)
        self.strict = strict(precision, not double)
        scalar = ctypes.c_double if double else ctypes.c_float
        self.one, self.zero = scalar(1.0), scalar(0.0)
        self.handle = ctypes.c_void_p()
        self._check("cudnnCreate", ctypes.byref(self.handle))
        self._stream = None
        try:
            self.version = str(self.lib.cudnnGetVersion())
        except Exception:  # noqa: BLE001 - the version only keys the plan cache
            self.version = "unknown"

    def _check(self, fname, *args):
        status = getattr(self.lib, fname)(*args)
        if status != 0:
            msg = self.lib.cudnnGetErrorString(status).decode(errors="replace")
            raise RuntimeError(f"{fname} failed: {msg} ({status})")

    def set_stream(self):
        s = self.cp.cuda.get_current_stream().ptr
        if s != self._stream:
            self._check("cudnnSetStream", self.handle, ctypes.c_void_p(s))
            self._stream = s

    def _descriptors(self, xs, ws, ys, spec):
        xd, wd, yd, cd = (ctypes.c_void_p() for _ in range(4))
        for t, shape in ((xd, xs), (yd, ys)):
            self._check("cudnnCreateTensorDescriptor", ctypes.byref(t))
            self._check("cudnnSetTensor4dDescriptor", t, _TENSOR_NCHW, self.dt, *map(int, shape))
        self._check("cudnnCreateFilterDescriptor", ctypes.byref(wd))
        self._check("cudnnSetFilter4dDescriptor", wd, self.dt, _TENSOR_NCHW, *map(int, ws))
        self._check("cudnnCreateConvolutionDescriptor", ctypes.byref(cd))
        (ph, pw), (sh, sw), (dh, dw) = spec.padding, spec.stride, spec.dilation
        self._check("cudnnSetConvolution2dDescriptor", cd, ph, pw, sh, sw, dh, dw, _CROSS_CORRELATION, self.dt)
        self._check("cudnnSetConvolutionGroupCount", cd, int(spec.groups))
        math = _FMA_MATH if self.no_tf32 else _DEFAULT_MATH
        self._check("cudnnSetConvolutionMathType", cd, math)
        return [xd, wd, yd, cd, math]

    @staticmethod
    def _roles(op, d, x, w, y):
        """(descA, ptrA), (descB, ptrB), (descOut, ptrOut): the argument order all three ops share."""
        xd, wd, yd = d[0], d[1], d[2]
        X, W, Y = (ctypes.c_void_p(a.data.ptr) for a in (x, w, y))
        if op == "fprop":
            return (xd, X), (wd, W), (yd, Y)
        if op == "dgrad":
            return (wd, W), (yd, Y), (xd, X)
        return (xd, X), (yd, Y), (wd, W)

    def _set_math(self, d, math):
        if d[4] != math:
            self._check("cudnnSetConvolutionMathType", d[3], math)
            d[4] = math

    def _candidates(self, op, d, arrays, limit):
        """(algo, workspace bytes, math type) of the heuristics' usable algorithms, in their order."""
        heur, wsize_fn, _ = _FUNCS[op]
        (ad, _), (bd, _), (od, _) = self._roles(op, d, *arrays)
        n = 16
        perf = (_AlgoPerf * n)()
        count = ctypes.c_int(0)
        self._check(heur, self.handle, ad, bd, d[3], od, n, ctypes.byref(count), perf)
        out = []
        for p in perf[:count.value]:
            if p.status != 0:
                continue
            if self.no_tf32 and p.mathType in (_TENSOR_OP_MATH, _TENSOR_OP_MATH_ALLOW_CONVERSION):
                continue
            if self.strict and p.algo in LEGACY_FFT_WINOGRAD[op]:
                continue
            if self.deterministic and p.determinism != _DETERMINISTIC:
                continue
            math = _FMA_MATH if self.no_tf32 else p.mathType
            self._set_math(d, math)
            size = ctypes.c_size_t(0)
            try:
                self._check(wsize_fn, self.handle, ad, bd, d[3], od, p.algo, ctypes.byref(size))
            except RuntimeError:
                continue
            out.append((int(p.algo), int(size.value), math))
            if len(out) >= limit:
                break
        if not out:
            rules = [r for r, on in (("no TF32", self.no_tf32), ("no FFT or Winograd", self.strict),
                                     ("deterministic", self.deterministic)) if on]
            raise RuntimeError(f"cuDNN offers no usable {op} algorithm for this convolution"
                               + (f" ({' and '.join(rules)})" if rules else ""))
        return out

    def build(self, op, x, w, y, spec, cache_key):
        d = self._descriptors(x.shape, w.shape, y.shape, spec)
        candidates = self._candidates(op, d, (x, w, y), autotune.MAX_CANDIDATES if self.autotune else 1)
        heuristic = candidates[0]
        plans = {"heuristic": heuristic, "tuned": heuristic}
        if self.autotune and len(candidates) > 1:
            byname = {f"algo{c[0]}": c for c in candidates}
            cached = autotune.lookup(cache_key)
            if cached is not None and cached["plan"] in byname:
                plans["tuned"] = byname[cached["plan"]]
            else:
                plans["tuned"] = byname[self._tune(op, d, byname, heuristic, x, w, y, cache_key)]
        return LegacyCall(self, op, d, plans)

    def _tune(self, op, d, byname, heuristic, x, w, y, cache_key):
        inputs = {"fprop": (x, w), "dgrad": (y, w), "wgrad": (x, y)}[op]
        sets = autotune.rotations(self.cp, inputs)
        timed = {}
        for name, choice in byname.items():
            def run(ops, choice=choice):
                a, b = ops
                args = {"fprop": (a, b, y), "dgrad": (x, b, a), "wgrad": (a, w, b)}[op]
                self.execute(op, d, choice, *args)
            try:
                timed[name] = autotune.time_ms(self.cp, run, sets)
            except RuntimeError:
                continue
        heur_name = f"algo{heuristic[0]}"
        best = autotune.pick(timed, heur_name) if timed else heur_name
        autotune.store(cache_key, {"plan": best, "ms": {k: round(v, 4) for k, v in timed.items()}})
        return best

    def execute(self, op, d, choice, x, w, y):
        algo, wsize, math = choice
        self._set_math(d, math)
        (ad, ap), (bd, bp), (od, optr) = self._roles(op, d, x, w, y)
        self._check(_FUNCS[op][2], self.handle, ctypes.byref(self.one), ad, ap, bd, bp, d[3], algo,
                    ctypes.c_void_p(self.ws.ptr(wsize)), ctypes.c_size_t(wsize), ctypes.byref(self.zero),
                    od, optr)
