"""cuDNN convolutions for the GPU backend, over CuPy device pointers (NCHW, C-contiguous tensors).

Two implementations of one call, `run(op, x, w, y, spec)` with op in "fprop" (x, w -> y), "dgrad"
(dy in `y`, w -> dx in `x`) and "wgrad" (x, dy in `y` -> dw in `w`):

- `FrontendConv` (primary): the cuDNN Frontend Python graph API (`nvidia-cudnn-frontend`, `cudnn.pygraph`,
  conv_fprop / conv_dgrad / conv_wgrad). A graph is built once per (op, shapes, spec) -- dtype and
  precision are fixed per backend -- and cached; building (heuristics, plan compilation) is slow, running
  is not. Strides are given in ELEMENTS (CuPy's `strides` are bytes).
- `LegacyConv` (fallback): a small ctypes binding of the cuDNN 9 legacy C API (cudnnConvolutionForward /
  BackwardData / BackwardFilter), descriptors cached per shape, algorithms from the
  cudnnGet*Algorithm_v7 heuristics or, with `autotune`, measured by cudnnFind*AlgorithmEx.

`ConvRunner` uses the frontend where it is importable and falls back to the legacy API, per convolution
geometry, where the frontend cannot build or run a graph (float64, an unusual geometry...), and
altogether where the frontend cannot start (not installed, or installed without a loadable libcudnn).
Which one: the `impl` argument ("frontend" | "legacy" | "auto") when given, else the PYDTNN_GPU_CONV
environment variable, else "auto". WHICH OF THE TWO IS THE
BETTER DEFAULT IS TO BE CONFIRMED BY MEASUREMENT ON THE DEVICE (scripts/bench_gpu.py --conv frontend /
--conv legacy): gpu-notes.md has per-op frontend timings (N=64 C=K=64 56x56 3x3: fprop/dgrad/wgrad
0.157/0.152/0.231 ms TF32, 0.364/0.244/0.570 ms strict fp32); the frontend's Python-side cost per
execute and the legacy API's algorithm choice are what the measurement must weigh.

Precision: with float32 data, "fp32" is strict: the frontend deselects plans with the TENSOR_CORE /
DOWN_CONVERT_INPUTS / REDUCED_PRECISION_REDUCTION numerical notes, and the FFT and WINOGRAD(_TILE_*) ones,
whose float32 error can exceed the 1e-5 the tests promise; the legacy API uses CUDNN_FMA_MATH and skips the
FFT, FFT_TILING, WINOGRAD and WINOGRAD_NONFUSED algorithms. "tf32" lets cuDNN use TF32 tensor cores (and
any algorithm). float64 is always computed in double.

Determinism (`deterministic=True`, for bit-exact reruns and resumes): the frontend deselects plans with the
NONDETERMINISTIC numerical note (atomics: the bits vary from run to run); the legacy API takes only
algorithms whose `determinism` is CUDNN_DETERMINISTIC (1). Bit-exact ACROSS PROCESSES (a resumed run
against the uninterrupted one) also needs the same plan in both: autotuning measures, so it may pin
different plans in two processes; with `autotune=False` the choice is the heuristics', the same every time.

Plans are built one index at a time, each inside a try: in Frontend 1.32 only NotImplementedError,
cudnnGraphNotSupportedError and ImportError count as a plan declining in `build_plans()`, and a plan that
raises anything else (a deselected plan raises RuntimeError too) would take the whole graph down with it.
Without autotuning the first plan that builds serves the graph (the heuristics' order); with it, every
plan that builds is timed and the fastest is pinned; plans run by index (`execute_plan_at_index`). The
first plan that fails (other than deselected by our filters or declining) is logged once per runner (logger
"pydtnn.gpu"); `report()` counts every plan passed over, by reason.

Both share one workspace buffer (CuPy memory pool, grown on demand, reused) and run on CuPy's current
stream. Nothing is allocated per call in steady state.

NOT RUN ON HARDWARE (written on a machine without a GPU): everything here except `find_libcudnn`, a pure
file search. The device checks of scripts/gpu_check.sh exercise it.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os
import site
import sys
import sysconfig

import numpy as np

from pydtnn.errors import ConfigError

OPS = ("fprop", "dgrad", "wgrad")
IMPLS = ("auto", "frontend", "legacy")
_AUTOTUNE_WS_LIMIT = 1 << 30          # plans / algorithms needing more workspace are not tried
_CUDNN_SUBDIRS = ("nvidia/cudnn/lib", "nvidia/cu13/lib", "nvidia/cu12/lib")
LOG = logging.getLogger("pydtnn.gpu")
# numerical notes whose float32 error can exceed strict fp32's 1e-5 (besides tensor cores' TF32)
_STRICT_NOTES = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT", "WINOGRAD",
                 "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13")


# ----------------------------------------------------------------------------------- library locator

def _site_dirs():
    dirs = list(sys.path)
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:   # some virtualenvs' site module
        pass
    dirs.append(sysconfig.get_path("purelib"))
    seen, out = set(), []
    for d in dirs:
        if d and d not in seen:
            seen.add(d)
            out.append(d)
    return out


def find_libcudnn(env=None, search_paths=None, system=True):
    """Path of libcudnn.so.9, or None. Looks, in order, at $PYDTNN_CUDNN_LIB, the LD_LIBRARY_PATH folders,
    the nvidia-cudnn-cu12/cu13 wheels (site-packages/nvidia/cudnn/lib, .../nvidia/cu1x/lib) and, with
    `system`, the system's libraries (ldconfig). The same order as the cuDNN frontend's own loader, so
    both end up with the same library in one process."""
    env = os.environ if env is None else env
    override = env.get("PYDTNN_CUDNN_LIB")
    if override:
        return override if os.path.isfile(override) else None
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    for base in (_site_dirs() if search_paths is None else search_paths):
        dirs += [os.path.join(base, sub) for sub in _CUDNN_SUBDIRS]
    for d in dirs:
        for name in ("libcudnn.so.9", "libcudnn.so"):
            path = os.path.join(d, name)
            if os.path.isfile(path):
                return path
        found = sorted(glob.glob(os.path.join(d, "libcudnn.so.9.*")))
        if found:
            return found[-1]
    if system:
        return ctypes.util.find_library("cudnn")     # a soname ("libcudnn.so.9") that dlopen resolves
    return None


def load_libcudnn():
    path = find_libcudnn()
    if path is None:
        raise ConfigError("libcudnn.so.9 not found: pip install nvidia-cudnn-cu13 (or -cu12), "
                          "or set PYDTNN_CUDNN_LIB to the library's path")
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        raise ConfigError(f"cannot load cuDNN from {path}: {' '.join(str(e).split())}") from None


# ---------------------------------------------------------------------------------------- helpers

def _strides(shape):
    """C-contiguous strides in elements."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= int(d)
    return out[::-1]


class Workspace:
    """One device scratch buffer from CuPy's memory pool, grown on demand and reused by every call (all
    calls run in order on one stream, so sharing is safe)."""

    def __init__(self, cupy):
        self.cp = cupy
        self.buf = cupy.empty(1 << 20, dtype=cupy.uint8)

    def ptr(self, nbytes: int) -> int:
        if nbytes > self.buf.nbytes:
            self.buf = None
            self.buf = self.cp.empty(int(nbytes), dtype=self.cp.uint8)
        return self.buf.data.ptr

    @property
    def nbytes(self):
        return self.buf.nbytes


def _time_ms(cupy, fn, reps=3):
    """Median-free quick timing of `fn` (one warm-up, then `reps` runs between two events)."""
    fn()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / reps


# ------------------------------------------------------------------------------ frontend (primary)

class FrontendConv:
    """Convolutions through `cudnn.pygraph`; built graphs cached per (op, shapes, spec)."""
    name = "frontend"

    def __init__(self, cupy, dtype, precision, autotune, workspace, deterministic=False):
        import cudnn     # ImportError when nvidia-cudnn-frontend is missing: the caller falls back
        self.cudnn, self.cp, self.ws = cudnn, cupy, workspace
        self.dt = cudnn.data_type.DOUBLE if np.dtype(dtype) == np.float64 else cudnn.data_type.FLOAT
        self.strict = np.dtype(dtype) == np.float32 and precision == "fp32"
        self.autotune, self.deterministic = autotune, deterministic
        self.handle = cudnn.create_handle()
        self.graphs = {}
        self.passed_over = {"deselected": 0, "declined": 0, "failed": 0}      # plans the walks passed over
        self._logged = False
        self._stream = None

    def _set_stream(self):
        s = self.cp.cuda.get_current_stream().ptr
        if s != self._stream:
            self.cudnn.set_stream(handle=self.handle, stream=s)
            self._stream = s

    def deselected_notes(self) -> list:
        """The numerical notes this runner's precision and determinism rule out."""
        names = list(_STRICT_NOTES if self.strict else ()) + (["NONDETERMINISTIC"] if self.deterministic else [])
        return [getattr(self.cudnn.numerical_note, n) for n in names]

    def _build(self, op, x, w, y, spec):
        c, dt = self.cudnn, self.dt
        g = c.pygraph(io_data_type=dt, intermediate_data_type=dt, compute_data_type=dt, handle=self.handle)

        def tensor(name, shape):
            return g.tensor(name=name, dim=list(shape), stride=_strides(shape), data_type=dt)

        kw = dict(padding=list(spec.padding), stride=list(spec.stride), dilation=list(spec.dilation),
                  compute_data_type=dt)
        if op == "fprop":
            X, W = tensor("X", x.shape), tensor("W", w.shape)
            Y = g.conv_fprop(image=X, weight=W, **kw)
            out = (Y, y.shape)
        elif op == "dgrad":
            Y, W = tensor("DY", y.shape), tensor("W", w.shape)
            X = g.conv_dgrad(loss=Y, filter=W, **kw)
            out = (X, x.shape)
        else:
            X, Y = tensor("X", x.shape), tensor("DY", y.shape)
            W = g.conv_wgrad(image=X, loss=Y, **kw)
            out = (W, w.shape)
        out[0].set_output(True).set_dim(list(out[1])).set_stride(_strides(out[1])).set_data_type(dt)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
        notes = self.deselected_notes()
        if notes:
            g.deselect_numeric_notes(notes)
        g.check_support()
        pack = {X: x.data.ptr, W: w.data.ptr, Y: y.data.ptr}
        plan = self._choose_plan(op, g, pack)
        return g, X, W, Y, int(g.get_workspace_size_plan_at_index(plan)), plan

    def _passed_over(self, e) -> str:
        """Why a plan is not a candidate: "deselected" (by our numerical-note filter: the backend raises
        RuntimeError "Deselecting execution plan", the Python layer ValueError "excluded by"), "declined" (the
        frontend's decline types: the engine does not serve this graph) or "failed" (anything else)."""
        text = str(e)
        if "Deselect" in text or "excluded by" in text:
            return "deselected"
        declines = (NotImplementedError, ImportError, getattr(self.cudnn, "cudnnGraphNotSupportedError", ()))
        # "Skipping plan since shared memory / workspace violation": the backend's own limits, a decline too
        return "declined" if isinstance(e, declines) or "Skipping plan" in text else "failed"

    def _choose_plan(self, op, g, pack) -> int:
        """The index of the plan to run: without autotuning the first that builds, with it the fastest of
        those that build and run (timed here, which may overwrite the output buffer: computed right after)."""
        best, failed = None, []
        for i in range(int(g.get_execution_plan_count())):
            try:
                g.build_plan_at_index(i)
                need = int(g.get_workspace_size_plan_at_index(i))
                if self.autotune and need > _AUTOTUNE_WS_LIMIT:
                    continue
                if self.autotune:
                    ws = self.ws.ptr(need)
                    ms = _time_ms(self.cp, lambda: g.execute_plan_at_index(pack, ws, index=i, handle=self.handle))
            except Exception as e:  # noqa: BLE001 - a deselected, declining or failing plan: the next one
                why = self._passed_over(e)
                self.passed_over[why] += 1
                if why == "failed":
                    failed.append((i, " ".join(f"{type(e).__name__}: {e}".split())[:200]))
                continue
            if not self.autotune:
                best = (0.0, i)
                break
            if best is None or ms < best[0]:
                best = (ms, i)
        if failed and not self._logged:
            self._logged = True
            served = f"plan {best[1]} serves it" if best else "no plan serves it"
            LOG.warning("pydtnn: note: cuDNN frontend %s graph: plan %d failed to build or run (%s); %s (this note "
                        "is printed once; GPUBackend.conv_report() counts every plan passed over)",
                        op, failed[0][0], failed[0][1], served)
        if best is None:
            raise RuntimeError(f"no execution plan of the {op} graph builds and runs"
                               + (": " + "; ".join(f"[{i}] {why}" for i, why in failed[:3]) if failed else ""))
        return best[1]

    def run(self, op, x, w, y, spec):
        key = (op, x.shape, w.shape, y.shape, spec)
        self._set_stream()
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._build(op, x, w, y, spec)
        g, X, W, Y, wsize, plan = entry
        pack = {X: x.data.ptr, W: w.data.ptr, Y: y.data.ptr}
        g.execute_plan_at_index(pack, self.ws.ptr(wsize), index=plan, handle=self.handle)


# --------------------------------------------------------------------------- legacy C API (fallback)

class _AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (the three share one layout)."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int), ("mathType", ctypes.c_int),
                ("reserved", ctypes.c_int * 3)]


_CUDNN_DATA_FLOAT, _CUDNN_DATA_DOUBLE = 0, 1
_CUDNN_TENSOR_NCHW = 0
_CUDNN_CROSS_CORRELATION = 1
_CUDNN_DEFAULT_MATH, _CUDNN_TENSOR_OP_MATH, _CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION, _CUDNN_FMA_MATH = 0, 1, 2, 3
_CUDNN_DETERMINISTIC = 1
# FFT, FFT_TILING, WINOGRAD, WINOGRAD_NONFUSED of cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t (cudnn_cnn.h):
# not strict fp32 (their float32 error can exceed 1e-5)
_LEGACY_INEXACT = {"fprop": {4, 5, 6, 7}, "dgrad": {2, 3, 4, 5}, "wgrad": {2, 4, 5, 6}}
# op -> (heuristics, measurement, workspace size, execution) entry points
_LEGACY_FUNCS = {
    "fprop": ("cudnnGetConvolutionForwardAlgorithm_v7", "cudnnFindConvolutionForwardAlgorithmEx",
              "cudnnGetConvolutionForwardWorkspaceSize", "cudnnConvolutionForward"),
    "dgrad": ("cudnnGetConvolutionBackwardDataAlgorithm_v7", "cudnnFindConvolutionBackwardDataAlgorithmEx",
              "cudnnGetConvolutionBackwardDataWorkspaceSize", "cudnnConvolutionBackwardData"),
    "wgrad": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7", "cudnnFindConvolutionBackwardFilterAlgorithmEx",
              "cudnnGetConvolutionBackwardFilterWorkspaceSize", "cudnnConvolutionBackwardFilter"),
}


class LegacyConv:
    """Convolutions through the cuDNN 9 legacy C API (ctypes); descriptors cached per geometry."""
    name = "legacy"

    def __init__(self, cupy, dtype, precision, autotune, workspace, deterministic=False):
        self.lib, self.cp, self.ws, self.autotune = load_libcudnn(), cupy, workspace, autotune
        self.deterministic = deterministic
        self.lib.cudnnGetErrorString.restype = ctypes.c_char_p
        double = np.dtype(dtype) == np.float64
        self.dt = _CUDNN_DATA_DOUBLE if double else _CUDNN_DATA_FLOAT
        self.strict = not double and precision == "fp32"
        scalar = ctypes.c_double if double else ctypes.c_float
        self.one, self.zero = scalar(1.0), scalar(0.0)
        self.handle = ctypes.c_void_p()
        self._check("cudnnCreate", ctypes.byref(self.handle))
        self.descs = {}     # (shapes, spec) -> [x, w, y, conv descriptors, math type currently set]
        self.algos = {}     # (op, shapes, spec) -> (algo, workspace bytes, math type)
        self._stream = None

    def _check(self, fname, *args):
        status = getattr(self.lib, fname)(*args)
        if status != 0:
            msg = self.lib.cudnnGetErrorString(status).decode(errors="replace")
            raise RuntimeError(f"{fname} failed: {msg} ({status})")

    def _set_stream(self):
        s = self.cp.cuda.get_current_stream().ptr
        if s != self._stream:
            self._check("cudnnSetStream", self.handle, ctypes.c_void_p(s))
            self._stream = s

    def _descriptors(self, xs, ws, ys, spec):
        key = (xs, ws, ys, spec)
        d = self.descs.get(key)
        if d is not None:
            return d
        xd, wd, yd, cd = (ctypes.c_void_p() for _ in range(4))
        for t, shape in ((xd, xs), (yd, ys)):
            self._check("cudnnCreateTensorDescriptor", ctypes.byref(t))
            self._check("cudnnSetTensor4dDescriptor", t, _CUDNN_TENSOR_NCHW, self.dt, *map(int, shape))
        self._check("cudnnCreateFilterDescriptor", ctypes.byref(wd))
        self._check("cudnnSetFilter4dDescriptor", wd, self.dt, _CUDNN_TENSOR_NCHW, *map(int, ws))
        self._check("cudnnCreateConvolutionDescriptor", ctypes.byref(cd))
        (ph, pw), (sh, sw), (dh, dw) = spec.padding, spec.stride, spec.dilation
        self._check("cudnnSetConvolution2dDescriptor", cd, ph, pw, sh, sw, dh, dw, _CUDNN_CROSS_CORRELATION,
                    self.dt)
        self._check("cudnnSetConvolutionGroupCount", cd, int(spec.groups))
        math = _CUDNN_FMA_MATH if self.strict else _CUDNN_DEFAULT_MATH
        self._check("cudnnSetConvolutionMathType", cd, math)
        d = self.descs[key] = [xd, wd, yd, cd, math]
        return d

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

    def _choose(self, op, d, roles):
        heur, find, wsize_fn, _ = _LEGACY_FUNCS[op]
        (ad, ap), (bd, bp), (od, optr) = roles
        n = 16
        perf = (_AlgoPerf * n)()
        count = ctypes.c_int(0)
        if self.autotune:     # measured; may overwrite the output buffer, which is computed right after
            limit = min(_AUTOTUNE_WS_LIMIT, max(self.ws.nbytes, 256 << 20))
            self._check(find, self.handle, ad, ap, bd, bp, d[3], od, optr, n, ctypes.byref(count), perf,
                        ctypes.c_void_p(self.ws.ptr(limit)), ctypes.c_size_t(limit))
        else:
            self._check(heur, self.handle, ad, bd, d[3], od, n, ctypes.byref(count), perf)
        for p in perf[:count.value]:
            if p.status != 0:
                continue
            if self.strict and (p.mathType in (_CUDNN_TENSOR_OP_MATH, _CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
                                or p.algo in _LEGACY_INEXACT[op]):
                continue
            if self.deterministic and p.determinism != _CUDNN_DETERMINISTIC:
                continue
            math = _CUDNN_FMA_MATH if self.strict else p.mathType
            self._set_math(d, math)
            size = ctypes.c_size_t(0)
            try:
                self._check(wsize_fn, self.handle, ad, bd, d[3], od, p.algo, ctypes.byref(size))
            except RuntimeError:
                continue
            return p.algo, size.value, math
        rules = [r for r, on in (("strict fp32", self.strict), ("deterministic", self.deterministic)) if on]
        raise RuntimeError(f"cuDNN offers no usable {op} algorithm for this convolution"
                           + (f" ({' and '.join(rules)})" if rules else ""))

    def run(self, op, x, w, y, spec):
        self._set_stream()
        d = self._descriptors(x.shape, w.shape, y.shape, spec)
        roles = self._roles(op, d, x, w, y)
        key = (op, x.shape, w.shape, y.shape, spec)
        choice = self.algos.get(key)
        if choice is None:
            choice = self.algos[key] = self._choose(op, d, roles)
        algo, wsize, math = choice
        self._set_math(d, math)
        (ad, ap), (bd, bp), (od, optr) = roles
        self._check(_LEGACY_FUNCS[op][3], self.handle, ctypes.byref(self.one), ad, ap, bd, bp, d[3], algo,
                    ctypes.c_void_p(self.ws.ptr(wsize)), ctypes.c_size_t(wsize), ctypes.byref(self.zero),
                    od, optr)


# ------------------------------------------------------------------------------------- the runner

class ConvRunner:
    """Frontend first, legacy API where the frontend is missing or declines a geometry (see the module
    docstring). `report()` says which implementation serves which convolution."""

    def __init__(self, cupy, dtype, precision="fp32", impl=None, autotune=False, deterministic=False):
        if impl is None:                         # an explicit argument beats the environment
            impl = os.environ.get("PYDTNN_GPU_CONV") or "auto"
        if impl not in IMPLS:
            raise ConfigError(f"GPU convolution implementation must be one of {', '.join(IMPLS)}, got {impl!r}")
        self.cp, self.dtype, self.precision, self.impl, self.autotune = cupy, dtype, precision, impl, autotune
        self.deterministic = bool(deterministic)
        self.workspace = Workspace(cupy)
        self.frontend = self.legacy = None
        self.fallbacks = {}          # key (or "frontend") -> why the legacy API serves it
        self.served = {}             # key -> "frontend" | "legacy"
        if impl in ("auto", "frontend"):
            try:
                self.frontend = FrontendConv(cupy, dtype, precision, autotune, self.workspace, self.deterministic)
            except (ImportError, RuntimeError, OSError) as e:
                # ImportError: not installed; RuntimeError / OSError: installed, but its loader finds no
                # usable libcudnn ("Unable to find symbol cudnnCreate" from create_handle)
                why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                if impl == "frontend":
                    raise ConfigError(f"the cuDNN frontend cannot start ({why}): pip install "
                                      "nvidia-cudnn-frontend and nvidia-cudnn-cu13 (or -cu12)") from None
                self.fallbacks["frontend"] = f"cannot start: {why}"

    def _legacy(self, why=None):
        if self.legacy is None:
            try:
                self.legacy = LegacyConv(self.cp, self.dtype, self.precision, self.autotune, self.workspace,
                                         self.deterministic)
            except ConfigError as e:
                if why is None:
                    raise
                raise ConfigError(f"{e} (the cuDNN frontend could not serve a convolution either: {why})") from None
        return self.legacy

    def run(self, op, x, w, y, spec):
        key = (op, x.shape, w.shape, y.shape, spec)
        how = self.served.get(key)
        if how == "frontend":
            return self.frontend.run(op, x, w, y, spec)
        if how == "legacy":
            return self._legacy().run(op, x, w, y, spec)
        why = self.fallbacks.get("frontend")
        if self.frontend is not None:
            try:
                self.frontend.run(op, x, w, y, spec)
                self.served[key] = "frontend"
                return None
            except Exception as e:  # noqa: BLE001 - any decline of the frontend: fall back, say why
                if self.impl == "frontend":
                    raise
                why = self.fallbacks[key] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                if sum(1 for k in self.fallbacks if k != "frontend") == 1:
                    LOG.warning("pydtnn: note: the cuDNN frontend cannot serve a %s convolution (%s): the legacy "
                                "cuDNN API serves it (this note is printed once; GPUBackend.conv_report() lists "
                                "every fall-back)", op, why)
        self._legacy(why).run(op, x, w, y, spec)
        self.served[key] = "legacy"
        return None

    def report(self) -> dict:
        counts = {"frontend": 0, "legacy": 0}
        for how in self.served.values():
            counts[how] += 1
        return {"impl": self.impl, "autotune": self.autotune, "deterministic": self.deterministic,
                "served": counts, "plans_passed_over": dict(self.frontend.passed_over) if self.frontend else {},
                "fallbacks": {str(k): v for k, v in self.fallbacks.items()}}
