"""cuDNN of the stand-in: the frontend's Python graph API (`import cudnn`) and the legacy C API as the
backend calls it through ctypes, both computing with the CPU backend's convolutions in float64.

What is checked (the glue, not NVIDIA's library): every tensor's dims and strides IN ELEMENTS against the
device memory its pointer lands in (byte strides would run past the allocation), the data types against
the arrays' dtypes, that dgrad/wgrad outputs got set_dim/set_stride, the output shape against the
convolution's, that a graph is validated, built and has plans before it runs, the workspace size; for the
legacy API each argument's ctypes type and order per cuDNN 9's headers (handles and descriptors as
c_void_p, alpha/beta passed by reference in the data's precision, size_t sizes as c_size_t...).
Calls are recorded in `FRONTEND_CALLS` / `LEGACY_CALLS`.

Modes ($PYDTNN_STANDIN_FRONTEND, or `configure`): "ok"; "missing" (import fails); "no_libcudnn"
(imports, then create_handle raises RuntimeError as the frontend does without libcudnn); "old" (no
`select_plan`, like frontends before 1.32). `DECLINE_DOUBLE` makes the frontend refuse float64 graphs.
"""
from __future__ import annotations

import ctypes
import os
import types

import numpy as np

from pydtnn.backends import ConvSpec
from . import device_memory

FRONTEND_CALLS: list[tuple] = []
LEGACY_CALLS: list[tuple] = []
SETTINGS = {"mode": os.environ.get("PYDTNN_STANDIN_FRONTEND", "ok"), "decline_double": False}
WORKSPACE_BYTES = 4096              # what every plan asks for, so the backend's workspace is exercised


def _cpu():
    from pydtnn.backends.cpu import CPUBackend
    return CPUBackend(dtype="float64")


def conv_reference(op, spec, x=None, w=None, dy=None, xshape=None):
    """fprop -> y, dgrad -> dx, wgrad -> dw (NCHW, float64), with the CPU backend's kernels."""
    cpu = _cpu()
    if op == "fprop":
        y, _ = cpu.conv2d_forward(cpu.to_internal(np.asarray(x, np.float64)), np.asarray(w, np.float64), None, spec)
        return cpu.to_user(y)
    if op == "dgrad":
        ctx = (cpu.to_internal(np.zeros(xshape)),)
        return cpu.to_user(cpu.conv2d_backward_data(cpu.to_internal(np.asarray(dy, np.float64)),
                                                    np.asarray(w, np.float64), ctx, spec))
    ctx = (cpu.to_internal(np.asarray(x, np.float64)),)
    return cpu.conv2d_backward_weights(cpu.to_internal(np.asarray(dy, np.float64)), ctx, spec, False)[0]


def _contiguous_strides(dims):
    out, acc = [], 1
    for d in reversed(dims):
        out.append(acc)
        acc *= int(d)
    return out[::-1]


def _spec(xdims, wdims, padding, stride, dilation):
    groups = int(xdims[1]) // int(wdims[1])
    return ConvSpec(int(xdims[1]), int(wdims[0]), (int(wdims[2]), int(wdims[3])), tuple(map(int, stride)),
                    tuple(map(int, padding)), tuple(map(int, dilation)), groups)


# =========================================================================================== frontend

class data_type:  # noqa: N801 - the frontend's spelling
    FLOAT, DOUBLE, HALF = "FLOAT", "DOUBLE", "HALF"


class heur_mode:  # noqa: N801
    A, B, FALLBACK = "A", "B", "FALLBACK"


class numerical_note:  # noqa: N801
    TENSOR_CORE, DOWN_CONVERT_INPUTS, REDUCED_PRECISION_REDUCTION = "TENSOR_CORE", "DOWN_CONVERT_INPUTS", "RPR"
    FFT, NONDETERMINISTIC, WINOGRAD = "FFT", "NONDETERMINISTIC", "WINOGRAD"


class build_plan_policy:  # noqa: N801
    HEURISTICS_CHOICE, ALL = "HEURISTICS_CHOICE", "ALL"


_NP = {data_type.FLOAT: np.float32, data_type.DOUBLE: np.float64}


class Handle:
    def __init__(self):
        self.stream = None


def create_handle():
    if SETTINGS["mode"] == "no_libcudnn":
        raise RuntimeError("Unable to find symbol cudnnCreate (stand-in: the frontend found no libcudnn)")
    return Handle()


def set_stream(handle, stream):
    if not isinstance(handle, Handle) or not isinstance(stream, int):
        raise TypeError("set_stream(handle=<cudnn handle>, stream=<int pointer>)")
    handle.stream = stream
    FRONTEND_CALLS.append(("set_stream", stream))


class Tensor:
    def __init__(self, graph, name, dim, stride, data_type):
        self.graph, self.name = graph, name
        self.dim = None if dim is None else [int(d) for d in dim]
        self.stride = None if stride is None else [int(s) for s in stride]
        self.data_type, self.is_output = data_type, False

    def set_output(self, flag):
        self.is_output = bool(flag)
        return self

    def set_dim(self, dim):
        self.dim = [int(d) for d in dim]
        return self

    def set_stride(self, stride):
        self.stride = [int(s) for s in stride]
        return self

    def set_data_type(self, dt):
        self.data_type = dt
        return self

    def __hash__(self):
        return id(self)


class pygraph:  # noqa: N801
    def __init__(self, io_data_type=None, intermediate_data_type=None, compute_data_type=None, handle=None,
                 name=None):
        if not isinstance(handle, Handle):
            raise TypeError("pygraph needs handle=<cudnn handle>")
        if SETTINGS["decline_double"] and data_type.DOUBLE in (io_data_type, compute_data_type):
            raise RuntimeError("cudnnGraphNotSupportedError: no engine for DOUBLE (stand-in)")
        self.io, self.compute, self.handle = io_data_type, compute_data_type, handle
        self.op = None
        self.stage = "new"
        self.deselected = []
        self.selected_plan = None
        FRONTEND_CALLS.append(("pygraph", io_data_type, compute_data_type))

    def __getattribute__(self, name):
        if name == "select_plan" and SETTINGS["mode"] == "old":
            raise AttributeError("'pygraph' object has no attribute 'select_plan' (frontend < 1.32)")
        return object.__getattribute__(self, name)

    def tensor(self, name, dim, stride, data_type):
        return Tensor(self, name, dim, stride, data_type)

    def _conv(self, kind, a, b, padding, stride, dilation, compute_data_type):
        if self.op is not None:
            raise AssertionError("the stand-in builds one convolution per graph")
        for t in (a, b):
            if not isinstance(t, Tensor) or t.graph is not self:
                raise TypeError(f"{kind}: inputs must be tensors of this graph")
        for what, v in (("padding", padding), ("stride", stride), ("dilation", dilation)):
            if not (isinstance(v, list) and len(v) == 2 and all(isinstance(i, int) for i in v)):
                raise TypeError(f"{kind}: {what} must be a list of two ints, got {v!r}")
        out = Tensor(self, f"{kind}_out", None, None, compute_data_type)
        self.op = (kind, a, b, out, padding, stride, dilation)
        FRONTEND_CALLS.append((kind, a.dim, b.dim, padding, stride, dilation))
        return out

    def conv_fprop(self, image, weight, padding, stride, dilation, compute_data_type=None, name=None):
        return self._conv("fprop", image, weight, padding, stride, dilation, compute_data_type)

    def conv_dgrad(self, loss, filter, padding, stride, dilation, compute_data_type=None, name=None):
        return self._conv("dgrad", loss, filter, padding, stride, dilation, compute_data_type)

    def conv_wgrad(self, image, loss, padding, stride, dilation, compute_data_type=None, name=None):
        return self._conv("wgrad", image, loss, padding, stride, dilation, compute_data_type)

    def _shapes(self):
        """(x, w, y) dims of the convolution, from the tensors as the backend declared them."""
        kind, a, b, out = self.op[:4]
        if kind == "fprop":
            return a.dim, b.dim, out.dim
        if kind == "dgrad":
            return out.dim, b.dim, a.dim
        return a.dim, out.dim, b.dim

    def validate(self):
        if self.op is None:
            raise AssertionError("validate: the graph has no operation")
        kind, a, b, out = self.op[:4]
        for t in (a, b, out):
            if t.dim is None or t.stride is None:
                raise AssertionError(f"{kind}: tensor {t.name} has no dims/strides (dgrad and wgrad outputs "
                                     "need set_dim and set_stride)")
            if len(t.dim) != 4 or t.stride != _contiguous_strides(t.dim):
                raise AssertionError(f"{kind}: tensor {t.name} dims {t.dim} strides {t.stride}: expected 4-D "
                                     f"NCHW with C-contiguous strides in ELEMENTS {_contiguous_strides(t.dim)}")
            if t.data_type != self.io:
                raise AssertionError(f"{kind}: tensor {t.name} is {t.data_type}, the graph's io type {self.io}")
        if not out.is_output:
            raise AssertionError(f"{kind}: the result tensor was not marked set_output(True)")
        xd, wd, yd = self._shapes()
        spec = _spec(xd, wd, *self.op[4:])
        if xd[1] % wd[1] or wd[0] % spec.groups:
            raise AssertionError(f"{kind}: channels {xd[1]} / filter {wd} do not make groups")
        expected = [xd[0], wd[0], *spec.output_hw(xd[2], xd[3])]
        if list(yd) != expected:
            raise AssertionError(f"{kind}: y dims {yd}, the convolution gives {expected}")
        self.spec, self.stage = spec, "validated"

    def _expect(self, stage, what):
        if self.stage != stage:
            raise AssertionError(f"{what} called at stage {self.stage!r}, expected after {stage!r}")

    def build_operation_graph(self):
        self._expect("validated", "build_operation_graph")
        self.stage = "op_graph"

    def create_execution_plans(self, modes):
        self._expect("op_graph", "create_execution_plans")
        if not modes or any(m not in (heur_mode.A, heur_mode.B, heur_mode.FALLBACK) for m in modes):
            raise TypeError(f"create_execution_plans: heuristic modes expected, got {modes!r}")
        self.stage = "plans"

    def deselect_numeric_notes(self, notes):
        self._expect("plans", "deselect_numeric_notes")
        self.deselected += list(notes)
        FRONTEND_CALLS.append(("deselect_numeric_notes", tuple(notes)))

    def check_support(self):
        self._expect("plans", "check_support")
        self.stage = "supported"

    def build_plans(self, policy=build_plan_policy.HEURISTICS_CHOICE):
        if self.stage not in ("supported", "built"):
            raise AssertionError(f"build_plans called at stage {self.stage!r}")
        self.stage = "built"

    def get_execution_plan_count(self):
        return 3

    def get_workspace_size(self):
        return WORKSPACE_BYTES

    def get_workspace_size_plan_at_index(self, index):
        return WORKSPACE_BYTES * (int(index) + 1)

    def select_plan(self, index):
        self.selected_plan = int(index)
        FRONTEND_CALLS.append(("select_plan", int(index)))

    def execute_plan_at_index(self, pack, workspace, index, handle=None):
        self._run(pack, workspace, self.get_workspace_size_plan_at_index(index), handle)

    def execute(self, pack, workspace, handle=None):
        self._run(pack, workspace, WORKSPACE_BYTES, handle)

    def _run(self, pack, workspace, ws_bytes, handle):
        self._expect("built", "execute")
        if handle is not self.handle:
            raise AssertionError("execute: a different handle than the graph's")
        kind, a, b, out = self.op[:4]
        if set(pack) != {a, b, out}:
            raise AssertionError("execute: the variant pack must map exactly the graph's 3 tensors")
        device_memory.find(workspace, ws_bytes, f"{kind} workspace")
        np_dt = _NP[self.io]
        view = {t: device_memory.view(pack[t], t.dim, t.stride, np_dt, f"{kind} tensor {t.name}")
                for t in (a, b, out)}
        FRONTEND_CALLS.append(("execute", kind, tuple(out.dim)))
        if kind == "fprop":
            res = conv_reference("fprop", self.spec, x=view[a], w=view[b])
        elif kind == "dgrad":
            res = conv_reference("dgrad", self.spec, dy=view[a], w=view[b], xshape=out.dim)
        else:
            res = conv_reference("wgrad", self.spec, x=view[a], dy=view[b])
        view[out][...] = res.astype(np_dt)


def build_frontend_module():
    """The `cudnn` module (None, i.e. not importable, in mode "missing")."""
    if SETTINGS["mode"] == "missing":
        return None
    m = types.ModuleType("cudnn")
    m.__version__ = "1.32.0" if SETTINGS["mode"] != "old" else "1.8.0"
    m.__standin__ = True
    for obj in (data_type, heur_mode, numerical_note, build_plan_policy, pygraph, create_handle, set_stream):
        setattr(m, obj.__name__, obj)
    m.backend_version_string = lambda: "9.19.0 (stand-in)"
    return m


# ========================================================================================= legacy API

_CUDNN_DATA = {0: np.float32, 1: np.float64}


class _Desc:
    def __init__(self, kind):
        self.kind, self.values = kind, None


class LegacyLibrary:
    """The ctypes library object `LegacyConv` gets from `load_libcudnn()`."""

    def __init__(self):
        self._objects = {}
        self._next = 0x1000
        self.cudnnGetErrorString = _ErrorString()

    # --- argument checks ----------------------------------------------------------------------------
    def _new(self, out, kind, fname):
        if not isinstance(out, type(ctypes.byref(ctypes.c_int()))):
            raise TypeError(f"{fname}: expected ctypes.byref(c_void_p), got {type(out).__name__}")
        target = out._obj
        if not isinstance(target, ctypes.c_void_p):
            raise TypeError(f"{fname}: the out argument must be a c_void_p, got {type(target).__name__}")
        self._next += 0x10
        target.value = self._next
        self._objects[self._next] = _Desc(kind)
        return 0

    def _obj(self, v, kind, fname, i):
        if not isinstance(v, ctypes.c_void_p):
            raise TypeError(f"{fname} argument {i}: a {kind} must be passed as c_void_p, got {type(v).__name__}")
        o = self._objects.get(v.value)
        if o is None or o.kind != kind:
            raise AssertionError(f"{fname} argument {i}: not a {kind} created by cudnnCreate*")
        return o

    @staticmethod
    def _ints(vals, fname, first):
        for i, v in enumerate(vals):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{fname} argument {first + i}: an int expected, got {type(v).__name__}")
        return [int(v) for v in vals]

    @staticmethod
    def _ptr(v, fname, i):
        if not isinstance(v, ctypes.c_void_p):
            raise TypeError(f"{fname} argument {i}: a device pointer must be a c_void_p, got {type(v).__name__}")
        return v.value

    @staticmethod
    def _ref(v, ctype, fname, i):
        if not isinstance(v, type(ctypes.byref(ctypes.c_int()))) or not isinstance(v._obj, ctype):
            got = type(getattr(v, "_obj", v)).__name__
            raise TypeError(f"{fname} argument {i}: byref({ctype.__name__}) expected, got {got}")
        return v._obj

    # --- handles and descriptors --------------------------------------------------------------------
    def cudnnCreate(self, out):
        LEGACY_CALLS.append(("cudnnCreate",))
        return self._new(out, "handle", "cudnnCreate")

    def cudnnSetStream(self, handle, stream):
        self._obj(handle, "handle", "cudnnSetStream", 0)
        self._ptr(stream, "cudnnSetStream", 1)
        return 0

    def cudnnCreateTensorDescriptor(self, out):
        return self._new(out, "tensor", "cudnnCreateTensorDescriptor")

    def cudnnCreateFilterDescriptor(self, out):
        return self._new(out, "filter", "cudnnCreateFilterDescriptor")

    def cudnnCreateConvolutionDescriptor(self, out):
        return self._new(out, "conv", "cudnnCreateConvolutionDescriptor")

    def cudnnSetTensor4dDescriptor(self, d, fmt, dt, n, c, h, w):
        o = self._obj(d, "tensor", "cudnnSetTensor4dDescriptor", 0)
        fmt, dt, *dims = self._ints((fmt, dt, n, c, h, w), "cudnnSetTensor4dDescriptor", 1)
        if fmt != 0 or dt not in _CUDNN_DATA:
            raise AssertionError(f"cudnnSetTensor4dDescriptor: format {fmt} (NCHW is 0), data type {dt}")
        o.values = (np.dtype(_CUDNN_DATA[dt]), dims)
        return 0

    def cudnnSetFilter4dDescriptor(self, d, dt, fmt, k, c, h, w):
        o = self._obj(d, "filter", "cudnnSetFilter4dDescriptor", 0)
        dt, fmt, *dims = self._ints((dt, fmt, k, c, h, w), "cudnnSetFilter4dDescriptor", 1)
        if fmt != 0 or dt not in _CUDNN_DATA:
            raise AssertionError(f"cudnnSetFilter4dDescriptor: data type {dt}, format {fmt} (NCHW is 0)")
        o.values = (np.dtype(_CUDNN_DATA[dt]), dims)
        return 0

    def cudnnSetConvolution2dDescriptor(self, d, ph, pw, sh, sw, dh, dw, mode, dt):
        o = self._obj(d, "conv", "cudnnSetConvolution2dDescriptor", 0)
        ph, pw, sh, sw, dh, dw, mode, dt = self._ints((ph, pw, sh, sw, dh, dw, mode, dt),
                                                      "cudnnSetConvolution2dDescriptor", 1)
        if mode != 1:
            raise AssertionError(f"cudnnSetConvolution2dDescriptor: mode {mode}, CROSS_CORRELATION (1) expected")
        o.values = {"padding": (ph, pw), "stride": (sh, sw), "dilation": (dh, dw), "dtype": _CUDNN_DATA[dt],
                    "groups": 1, "math": 0}
        return 0

    def cudnnSetConvolutionGroupCount(self, d, groups):
        self._obj(d, "conv", "cudnnSetConvolutionGroupCount", 0).values["groups"] = self._ints(
            (groups,), "cudnnSetConvolutionGroupCount", 1)[0]
        return 0

    def cudnnSetConvolutionMathType(self, d, math):
        math = self._ints((math,), "cudnnSetConvolutionMathType", 1)[0]
        if math not in (0, 1, 2, 3):
            raise AssertionError(f"cudnnSetConvolutionMathType: unknown math type {math}")
        self._obj(d, "conv", "cudnnSetConvolutionMathType", 0).values["math"] = math
        LEGACY_CALLS.append(("math", math))
        return 0

    # --- convolutions -------------------------------------------------------------------------------
    _ROLES = {"fprop": ("tensor", "filter", "tensor"), "dgrad": ("filter", "tensor", "tensor"),
              "wgrad": ("tensor", "tensor", "filter")}

    def _geometry(self, op, fname, a, b, conv, out, first=1):
        """(x dims, w dims, y dims, dtype, conv values) of an op's (A, B, conv, out) descriptors."""
        ka, kb, ko = self._ROLES[op]
        da = self._obj(a, ka, fname, first).values
        db = self._obj(b, kb, fname, first + 1).values
        cv = self._obj(conv, "conv", fname, first + 2).values
        do = self._obj(out, ko, fname, first + 3).values
        dts = {da[0], db[0], do[0], np.dtype(cv["dtype"])}
        if len(dts) != 1:
            raise AssertionError(f"{fname}: descriptors of different data types {dts}")
        x, w, y = {"fprop": (da, db, do), "dgrad": (do, da, db), "wgrad": (da, do, db)}[op]
        spec = ConvSpec(x[1][1], w[1][0], tuple(w[1][2:]), cv["stride"], cv["padding"], cv["dilation"],
                        cv["groups"])
        if w[1][1] * cv["groups"] != x[1][1]:
            raise AssertionError(f"{fname}: filter {w[1]} with {cv['groups']} groups on {x[1][1]} channels")
        expected = [x[1][0], w[1][0], *spec.output_hw(x[1][2], x[1][3])]
        if y[1] != expected:
            raise AssertionError(f"{fname}: y descriptor {y[1]}, the convolution gives {expected}")
        return x[1], w[1], y[1], dts.pop(), spec, cv

    def _perf(self, op, fname, handle, a, b, conv, out, n, count, perf):
        self._obj(handle, "handle", fname, 0)
        self._geometry(op, fname, a, b, conv, out)
        n = self._ints((n,), fname, 5)[0]
        cnt = self._ref(count, ctypes.c_int, fname, 6)
        if len(perf) < n:
            raise AssertionError(f"{fname}: room for {len(perf)} results, {n} requested")
        # two algorithms: 0 with tensor-op math (must be skipped in strict fp32), 1 with FMA math
        for i, (algo, math) in enumerate(((0, 1), (1, 3))):
            perf[i].algo, perf[i].status, perf[i].time, perf[i].memory, perf[i].mathType = algo, 0, 0.1, 256, math
        cnt.value = 2
        LEGACY_CALLS.append((fname,))
        return 0

    def cudnnGetConvolutionForwardAlgorithm_v7(self, h, a, b, conv, out, n, count, perf):
        return self._perf("fprop", "cudnnGetConvolutionForwardAlgorithm_v7", h, a, b, conv, out, n, count, perf)

    def cudnnGetConvolutionBackwardDataAlgorithm_v7(self, h, a, b, conv, out, n, count, perf):
        return self._perf("dgrad", "cudnnGetConvolutionBackwardDataAlgorithm_v7", h, a, b, conv, out, n, count,
                          perf)

    def cudnnGetConvolutionBackwardFilterAlgorithm_v7(self, h, a, b, conv, out, n, count, perf):
        return self._perf("wgrad", "cudnnGetConvolutionBackwardFilterAlgorithm_v7", h, a, b, conv, out, n, count,
                          perf)

    def _find(self, op, fname, h, a, ap, b, bp, conv, out, op_, n, count, perf, ws, wsize):
        self._ptr(ap, fname, 2), self._ptr(bp, fname, 4), self._ptr(op_, fname, 7)
        self._ptr(ws, fname, 11)
        if not isinstance(wsize, ctypes.c_size_t):
            raise TypeError(f"{fname} argument 12: c_size_t expected, got {type(wsize).__name__}")
        device_memory.find(ws.value, wsize.value, f"{fname} workspace")
        return self._perf(op, fname, h, a, b, conv, out, n, count, perf)

    def cudnnFindConvolutionForwardAlgorithmEx(self, *args):
        return self._find("fprop", "cudnnFindConvolutionForwardAlgorithmEx", *args)

    def cudnnFindConvolutionBackwardDataAlgorithmEx(self, *args):
        return self._find("dgrad", "cudnnFindConvolutionBackwardDataAlgorithmEx", *args)

    def cudnnFindConvolutionBackwardFilterAlgorithmEx(self, *args):
        return self._find("wgrad", "cudnnFindConvolutionBackwardFilterAlgorithmEx", *args)

    def _wsize(self, op, fname, h, a, b, conv, out, algo, size):
        self._obj(h, "handle", fname, 0)
        self._geometry(op, fname, a, b, conv, out)
        self._ints((algo,), fname, 5)
        self._ref(size, ctypes.c_size_t, fname, 6).value = 512
        return 0

    def cudnnGetConvolutionForwardWorkspaceSize(self, *args):
        return self._wsize("fprop", "cudnnGetConvolutionForwardWorkspaceSize", *args)

    def cudnnGetConvolutionBackwardDataWorkspaceSize(self, *args):
        return self._wsize("dgrad", "cudnnGetConvolutionBackwardDataWorkspaceSize", *args)

    def cudnnGetConvolutionBackwardFilterWorkspaceSize(self, *args):
        return self._wsize("wgrad", "cudnnGetConvolutionBackwardFilterWorkspaceSize", *args)

    def _run(self, op, fname, h, alpha, a, ap, b, bp, conv, algo, ws, wsize, beta, out, outp):
        self._obj(h, "handle", fname, 0)
        xd, wd, yd, dt, spec, cv = self._geometry(op, fname, a, b, conv, out, first=2)
        scalar = ctypes.c_double if dt == np.float64 else ctypes.c_float
        al, be = self._ref(alpha, scalar, fname, 1), self._ref(beta, scalar, fname, 10)
        if (al.value, be.value) != (1.0, 0.0):
            raise AssertionError(f"{fname}: alpha={al.value} beta={be.value}, the backend means 1 and 0")
        self._ints((algo,), fname, 7)
        if not isinstance(wsize, ctypes.c_size_t):
            raise TypeError(f"{fname} argument 9: c_size_t expected, got {type(wsize).__name__}")
        device_memory.find(self._ptr(ws, fname, 8), wsize.value, f"{fname} workspace")
        shapes = {"fprop": (xd, wd, yd), "dgrad": (wd, yd, xd), "wgrad": (xd, yd, wd)}[op]
        arrays = [device_memory.view(self._ptr(p, fname, i), s, _contiguous_strides(s), dt, f"{fname} argument {i}")
                  for p, s, i in zip((ap, bp, outp), shapes, (3, 5, 12))]
        LEGACY_CALLS.append((fname, cv["math"]))
        if op == "fprop":
            res = conv_reference(op, spec, x=arrays[0], w=arrays[1])
        elif op == "dgrad":
            res = conv_reference(op, spec, w=arrays[0], dy=arrays[1], xshape=xd)
        else:
            res = conv_reference(op, spec, x=arrays[0], dy=arrays[1])
        arrays[2][...] = res.astype(dt)
        return 0

    def cudnnConvolutionForward(self, *args):
        return self._run("fprop", "cudnnConvolutionForward", *args)

    def cudnnConvolutionBackwardData(self, *args):
        return self._run("dgrad", "cudnnConvolutionBackwardData", *args)

    def cudnnConvolutionBackwardFilter(self, *args):
        return self._run("wgrad", "cudnnConvolutionBackwardFilter", *args)

    def __getattr__(self, name):
        raise AttributeError(f"the cuDNN stand-in has no {name} (undefined symbol)")


class _ErrorString:
    restype = None

    def __call__(self, status):
        return b"CUDNN_STATUS_STAND_IN_ERROR"
