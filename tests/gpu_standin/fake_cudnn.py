"""cuDNN of the stand-in: the frontend's Python graph API (`import cudnn`) and the legacy C API as the
backend calls it through ctypes, computing with the CPU backend's convolutions.

What is checked (the glue, not NVIDIA's library): every tensor's dims and strides IN ELEMENTS against the
device memory its pointer lands in (byte strides would run past the allocation), the data types against
the arrays' dtypes, that dgrad/wgrad outputs got set_dim/set_stride, the output shape against the
convolution's, that a graph is validated, planned and its plan built before it runs, the workspace size;
for the legacy API each argument's ctypes type and order per cuDNN 9's headers (handles and descriptors as
c_void_p, alpha/beta passed by reference in the data's precision, size_t sizes as c_size_t...).
Calls are recorded in `FRONTEND_CALLS` / `LEGACY_CALLS`. An execution goes to its handle's stream
(`set_stream` / `cudnnSetStream`; the legacy stream before any) through `graphs.launch`: run now, or
recorded by a capture of that stream (then computed, and the clock advanced, at each replay); a handle left
on another stream while its thread captures is an AssertionError.

So that mistakes of plan choice show in results, as they would on a GPU, plans differ the way real ones do:
- numerics: every plan computes in the data's precision (float32 data: float32 arithmetic); tensor-core
  plans round their inputs to TF32 (~1e-3); FFT and Winograd plans add float32-sized errors (~5e-5 of the
  largest value, over strict fp32's 1e-5); plans sum in different orders (so two plans differ in the last
  bits), and a NONDETERMINISTIC plan in a different order on every call;
- timings: each execution advances the CuPy stand-in's event clock by the plan's cost times a random
  factor (1 +- SETTINGS["noise"], 0.3 by default), so single timings mislead and medians do not;
- a Winograd wgrad plan without any Winograd numerical note, as cuDNN 9.19 ran on the H200 under a
  note filter that deselected every Winograd note (why "fp32_strict" runs on the legacy API);
- building: like Frontend 1.32's graphs, a deselected plan raises RuntimeError from build_plan_at_index
  (cuDNN's "Deselecting execution plan"); one plan of every graph fails to build with a RuntimeError, one
  declines (cudnnGraphNotSupportedError) where its engine does not apply; `build_plans()` walks the list
  as 1.32's does, skipping declines only, so any other error escapes it.
The legacy API offers, per op, algorithms of each kind (FFT, Winograd, tensor-op math, non-deterministic,
plain), with their `determinism` and `mathType` set as cuDNN reports them, and computes as they would.

Modes ($PYDTNN_STANDIN_FRONTEND, or `configure`): "ok"; "missing" (import fails); "no_libcudnn"
(imports, then create_handle raises RuntimeError as the frontend does without libcudnn).
`decline_double` makes the frontend refuse float64 graphs.
"""
from __future__ import annotations

import ctypes
import os
import random
import types

import numpy as np

from pydtnn.backends import ConvSpec
from . import counters, device_memory, fake_cupy, graphs

FRONTEND_CALLS: list[tuple] = []
LEGACY_CALLS: list[tuple] = []
SETTINGS = {"mode": os.environ.get("PYDTNN_STANDIN_FRONTEND", "ok"), "decline_double": False,
            "noise": 0.3}     # an execution takes its plan's cost times uniform(1 - noise, 1 + noise)
WORKSPACE_BYTES = 4096              # per plan index (plan i asks for (i + 1) times this)
_RANDOM = random.Random()           # timings and non-deterministic orders: different in every process
_CPU = {}


def _cpu(dtype):
    from pydtnn.backends.cpu.backend import CPUBackend
    dtype = np.dtype(dtype)
    if dtype not in _CPU:
        _CPU[dtype] = CPUBackend(dtype=dtype.name, conv_algorithm="direct")
    return _CPU[dtype]


def _conv_once(op, spec, dtype, x=None, w=None, dy=None, xshape=None):
    """fprop -> y, dgrad -> dx, wgrad -> dw (NCHW), with the CPU backend's kernels in `dtype`."""
    cpu = _cpu(dtype)
    cast = lambda a: np.ascontiguousarray(a, dtype=dtype)      # noqa: E731
    if op == "fprop":
        y, _ = cpu.conv2d_forward(cpu.to_internal(cast(x)), cast(w), None, spec)
        return cpu.to_user(y)
    if op == "dgrad":
        ctx = (cpu.to_internal(np.zeros(xshape, dtype)),)
        return cpu.to_user(cpu.conv2d_backward_data(cpu.to_internal(cast(dy)), cast(w), ctx, spec))
    ctx = (cpu.to_internal(cast(x)),)
    return cpu.conv2d_backward_weights(cpu.to_internal(cast(dy)), ctx, spec, False)[0]


def _tf32(a):
    """float32 values rounded to TF32 (10 mantissa bits, to nearest even), as tensor cores read them."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x0FFF + ((u >> 13) & 1)) & ~np.uint64(0x1FFF)
    return u.astype(np.uint32).view(np.float32)


def conv_emulated(kind, op, spec, dtype, x=None, w=None, dy=None, xshape=None, split=0.5):
    """A convolution as a plan of `kind` computes it: "exact" (one pass), "split" (two partial sums added:
    kernel taps for fprop/dgrad, output rows for wgrad, cut at fraction `split`), "nondeterministic" (split
    at a random place on every call), "tf32" (inputs rounded to TF32), "fft" / "winograd" (a float32-sized
    error of 5e-5 of the largest value)."""
    dtype = np.dtype(dtype)
    if kind == "tf32" and dtype == np.float32:
        x, w, dy = (None if a is None else _tf32(a) for a in (x, w, dy))
    if kind == "nondeterministic":
        kind, split = "split", _RANDOM.uniform(0.2, 0.8)
    if kind != "split":
        res = _conv_once(op, spec, dtype, x, w, dy, xshape)
        if kind in ("fft", "winograd") and dtype == np.float32 and res.size:
            noise = np.random.default_rng(len(kind)).uniform(-1, 1, res.shape)
            res = (res + 5e-5 * float(np.max(np.abs(res))) * noise).astype(dtype)
        return res
    if op in ("fprop", "dgrad"):
        taps = np.zeros(w.shape[2:], dtype)
        taps.reshape(-1)[:max(1, int(round(taps.size * split)))] = 1
        w = np.asarray(w, dtype)
        a = _conv_once(op, spec, dtype, x, w * taps, dy, xshape)
        b = _conv_once(op, spec, dtype, x, w * (1 - taps), dy, xshape)
    else:
        rows = np.zeros((1, 1, dy.shape[2], 1), dtype)
        rows[:, :, :max(1, int(round(dy.shape[2] * split)))] = 1
        dy = np.asarray(dy, dtype)
        a = _conv_once(op, spec, dtype, x, w, dy * rows, xshape)
        b = _conv_once(op, spec, dtype, x, w, dy * (1 - rows), xshape)
    return (a + b).astype(dtype)


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
    WINOGRAD_TILE_4x4, WINOGRAD_TILE_6x6, WINOGRAD_TILE_13x13 = "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "W13"
    STRICT_NAN_PROP = "STRICT_NAN_PROP"


class build_plan_policy:  # noqa: N801
    HEURISTICS_CHOICE, ALL = "HEURISTICS_CHOICE", "ALL"


class cudnnGraphNotSupportedError(RuntimeError):  # noqa: N801 - the frontend's name (a RuntimeError there too)
    pass


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


class Plan:
    """One entry of a graph's ranked plan list: its numerical notes, how it computes, what it costs (ms), and
    what building it does ("ok", "raise": a RuntimeError, "decline": cudnnGraphNotSupportedError)."""

    def __init__(self, name, notes, kind, cost, build="ok"):
        self.name, self.notes, self.kind, self.cost, self.build = name, tuple(notes), kind, cost, build


def _plans(op, io, spec) -> list:
    """The ranked plans of a convolution graph (FLOAT graphs also get tensor-core, Winograd and FFT plans)."""
    n = numerical_note
    plans = []
    if io == data_type.FLOAT:
        plans.append(Plan("tensor_core", [n.TENSOR_CORE], "tf32", 0.10))
    plans.append(Plan("fails_to_build", [], "exact", 0.05, build="raise"))
    if io == data_type.FLOAT:
        winograd_ok = spec.kernel == (3, 3) and spec.stride == (1, 1) and spec.dilation == (1, 1) and spec.groups == 1
        plans.append(Plan("winograd", [n.WINOGRAD, n.WINOGRAD_TILE_4x4], "winograd", 0.15,
                          build="ok" if winograd_ok else "decline"))
        plans.append(Plan("fft", [n.FFT], "fft", 0.20, build="ok" if spec.groups == 1 else "decline"))
        if op == "wgrad":       # as on the H200: a Winograd wgrad engine whose plans carry no Winograd note
            plans.append(Plan("winograd_nonfused", [], "winograd", 0.14, build="ok" if winograd_ok else "decline"))
    if op != "fprop":
        plans.append(Plan("atomics", [n.NONDETERMINISTIC], "nondeterministic", 0.12))
    plans.append(Plan("split", [], "split", 0.25))
    plans.append(Plan("exact", [], "exact", 0.30))
    return plans


class pygraph:  # noqa: N801
    def __init__(self, name="test_graph", io_data_type=None, intermediate_data_type=None, compute_data_type=None,
                 handle=None, **kwargs):
        if not isinstance(handle, Handle):
            raise TypeError("pygraph needs handle=<cudnn handle>")
        if SETTINGS["decline_double"] and data_type.DOUBLE in (io_data_type, compute_data_type):
            raise cudnnGraphNotSupportedError("no engine for DOUBLE (stand-in)")
        self.io, self.compute, self.handle = io_data_type, compute_data_type, handle
        self.op = None
        self.stage = "new"
        self.plans, self.barred, self.built = [], set(), set()
        self.plan_index = None
        FRONTEND_CALLS.append(("pygraph", io_data_type, compute_data_type))

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

    def _expect(self, stages, what):
        if self.stage not in stages:
            raise AssertionError(f"{what} called at stage {self.stage!r}, expected after {' or '.join(stages)}")

    def build_operation_graph(self):
        self._expect(("validated",), "build_operation_graph")
        self.stage = "op_graph"

    def create_execution_plans(self, modes):
        self._expect(("op_graph",), "create_execution_plans")
        if not modes or any(m not in (heur_mode.A, heur_mode.B, heur_mode.FALLBACK) for m in modes):
            raise TypeError(f"create_execution_plans: heuristic modes expected, got {modes!r}")
        self.plans = _plans(self.op[0], self.io, self.spec)
        self.stage = "plans"

    def deselect_numeric_notes(self, notes):
        self._expect(("plans", "supported"), "deselect_numeric_notes")
        for note in notes:
            if note not in vars(numerical_note).values():
                raise TypeError(f"deselect_numeric_notes: not a cudnn.numerical_note: {note!r}")
        self.barred |= {i for i, p in enumerate(self.plans) if set(p.notes) & set(notes)}
        FRONTEND_CALLS.append(("deselect_numeric_notes", tuple(notes)))

    def check_support(self):
        self._expect(("plans",), "check_support")
        if all(i in self.barred or p.build != "ok" for i, p in enumerate(self.plans)):
            raise RuntimeError("[cudnn_frontend] Error: No execution plans support the graph. (stand-in)")
        self.stage = "supported"

    def get_execution_plan_count(self):
        self._expect(("plans", "supported"), "get_execution_plan_count")
        return len(self.plans)

    def get_plan_name_at_index(self, index):
        return self.plans[self._index(index)].name

    def _index(self, index):
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.plans):
            raise IndexError(f"plan index {index!r} out of range for {len(self.plans)} plan(s)")
        return index

    def build_plan_at_index(self, index):
        """Build the plan and select it (1.32: "selecting is what makes the autotune idiom work")."""
        self._expect(("supported",), "build_plan_at_index")
        plan = self.plans[self._index(index)]
        FRONTEND_CALLS.append(("build_plan_at_index", index, plan.name))
        if index in self.barred:
            raise RuntimeError("Deselecting execution plan (stand-in)")
        if plan.build == "raise":
            raise RuntimeError("CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: CUDNN_STATUS_INTERNAL_ERROR (stand-in: this "
                               "engine fails to build)")
        if plan.build == "decline":
            raise cudnnGraphNotSupportedError(f"engine {plan.name} does not support this convolution (stand-in)")
        self.built.add(index)
        self.plan_index = index
        return self

    def build_plans(self, policy=build_plan_policy.HEURISTICS_CHOICE):
        """As Frontend 1.32's walk: a decline moves on, any other error escapes."""
        for i in range(len(self.plans)):
            try:
                self.build_plan_at_index(i)
            except cudnnGraphNotSupportedError:
                continue
            if policy != build_plan_policy.ALL:
                return
        if self.plan_index is None:
            raise cudnnGraphNotSupportedError("no plan in the list could be built (stand-in)")

    def _built(self, index, what):
        if index not in self.built or index in self.barred:
            raise RuntimeError(f"{what}: plan {index} is not built (stand-in: GRAPH_EXECUTION_FAILED)")
        return index

    def get_workspace_size(self):
        return self.get_workspace_size_plan_at_index(self.plan_index)

    def get_workspace_size_plan_at_index(self, index):
        return WORKSPACE_BYTES * (self._built(self._index(index), "get_workspace_size_plan_at_index") + 1)

    def execute_plan_at_index(self, pack, workspace, index, handle=None):
        self._run(pack, workspace, self._built(self._index(index), "execute_plan_at_index"), handle)

    def execute(self, pack, workspace, handle=None):
        if self.plan_index is None:
            raise RuntimeError("execute: no plan built (stand-in)")
        self._run(pack, workspace, self.plan_index, handle)

    def _run(self, pack, workspace, index, handle):
        if handle is not self.handle:
            raise AssertionError("execute: a different handle than the graph's")
        kind, a, b, out = self.op[:4]
        if set(pack) != {a, b, out}:
            raise AssertionError("execute: the variant pack must map exactly the graph's 3 tensors")
        for t, ptr in pack.items():
            if type(ptr) is not int:
                raise TypeError(f"execute: tensor {t.name} bound to a {type(ptr).__name__}, a device pointer (int) "
                                "expected")
        device_memory.find(workspace, WORKSPACE_BYTES * (index + 1), f"{kind} workspace")
        np_dt = _NP[self.io]
        view = {t: device_memory.view(pack[t], t.dim, t.stride, np_dt, f"{kind} tensor {t.name}")
                for t in (a, b, out)}
        plan = self.plans[index]
        FRONTEND_CALLS.append(("execute", kind, tuple(out.dim), index, plan.name, pack[a]))   # + first input's address

        def execute():
            fake_cupy.advance_clock(plan.cost * _RANDOM.uniform(1 - SETTINGS["noise"], 1 + SETTINGS["noise"]))
            if not counters.SETTINGS["execute"]:
                view[out][...] = 0
                return
            if kind == "fprop":
                res = conv_emulated(plan.kind, "fprop", self.spec, np_dt, x=view[a], w=view[b])
            elif kind == "dgrad":
                res = conv_emulated(plan.kind, "dgrad", self.spec, np_dt, dy=view[a], w=view[b], xshape=out.dim)
            else:
                res = conv_emulated(plan.kind, "wgrad", self.spec, np_dt, x=view[a], dy=view[b])
            view[out][...] = res
        graphs.launch("cudnn", kind, execute, stream=handle.stream or 0)


def build_frontend_module():
    """The `cudnn` module (None, i.e. not importable, in mode "missing")."""
    if SETTINGS["mode"] == "missing":
        return None
    m = types.ModuleType("cudnn")
    m.__version__ = "1.32.0"
    m.__standin__ = True
    for obj in (data_type, heur_mode, numerical_note, build_plan_policy, pygraph, create_handle, set_stream,
                cudnnGraphNotSupportedError):
        setattr(m, obj.__name__, obj)
    m.backend_version_string = lambda: "9.19.0 (stand-in)"
    return m


# ========================================================================================= legacy API

_CUDNN_DATA = {0: np.float32, 1: np.float64}
# per op, the algorithms the heuristics offer, in their order: (algo, math type, determinism, how it computes,
# cost). Algorithm numbers as in cudnn_cnn.h (fprop: 1 IMPLICIT_PRECOMP_GEMM, 2 GEMM, 4 FFT, 6 WINOGRAD; dgrad:
# 0 ALGO_0 (atomics), 1 ALGO_1, 2 FFT, 4 WINOGRAD; wgrad: 0 ALGO_0 and 3 ALGO_3 (atomics), 1 ALGO_1,
# 5 WINOGRAD_NONFUSED); math 1 = TENSOR_OP, 3 = FMA; determinism 1 = CUDNN_DETERMINISTIC.
_LEGACY_ALGOS = {
    "fprop": [(6, 3, 1, "winograd", 0.15), (1, 1, 1, "tf32", 0.10), (4, 3, 1, "fft", 0.2), (1, 3, 1, "split", 0.25),
              (2, 3, 1, "exact", 0.3)],
    "dgrad": [(4, 3, 1, "winograd", 0.15), (1, 1, 1, "tf32", 0.10), (0, 3, 0, "nondeterministic", 0.12),
              (2, 3, 1, "fft", 0.2), (1, 3, 1, "exact", 0.3)],
    "wgrad": [(5, 3, 1, "winograd", 0.15), (1, 1, 1, "tf32", 0.10), (0, 3, 0, "nondeterministic", 0.12),
              (3, 3, 0, "nondeterministic", 0.13), (1, 3, 1, "exact", 0.3)],
}


def _legacy_kind(op, algo, math, dtype):
    """How the legacy algorithm `algo` computes with the descriptor's math type."""
    if math in (1, 2) and dtype == np.float32:
        return "tf32"
    for a, _m, _d, kind, _c in _LEGACY_ALGOS[op]:
        if a == algo and kind != "tf32":
            return kind
    return "exact"


class _Desc:
    def __init__(self, kind):
        self.kind, self.values = kind, None
        self.stream = 0             # a handle's stream (the legacy stream until cudnnSetStream)


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
        h = self._obj(handle, "handle", "cudnnSetStream", 0)
        h.stream = self._ptr(stream, "cudnnSetStream", 1) or 0      # where its executions go
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

    def _perf(self, op, fname, handle, a, b, conv, out, n, count, perf, measured=False):
        self._obj(handle, "handle", fname, 0)
        dt = self._geometry(op, fname, a, b, conv, out)[3]
        n = self._ints((n,), fname, 5)[0]
        cnt = self._ref(count, ctypes.c_int, fname, 6)
        if len(perf) < n:
            raise AssertionError(f"{fname}: room for {len(perf)} results, {n} requested")
        rows = [r for r in _LEGACY_ALGOS[op] if dt == np.float32 or r[3] in ("exact", "split", "nondeterministic")]
        if measured:                     # cudnnFind*: sorted by a time measured now (varies run to run)
            rows = sorted(rows, key=lambda r: r[4] * _RANDOM.uniform(0.7, 1.3))
        for i, (algo, math, det, _kind, cost) in enumerate(rows[:n]):
            p = perf[i]
            p.algo, p.status, p.time, p.memory, p.mathType, p.determinism = algo, 0, cost, 256, math, det
        cnt.value = min(n, len(rows))
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
        return self._perf(op, fname, h, a, b, conv, out, n, count, perf, measured=True)

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
        handle = self._obj(h, "handle", fname, 0)
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
        LEGACY_CALLS.append((fname, cv["math"], algo))
        kind = _legacy_kind(op, algo, cv["math"], dt)
        tensor_op = cv["math"] in (1, 2)
        cost = next((c for a, m, _d, _k, c in _LEGACY_ALGOS[op] if a == algo and (m in (1, 2)) == tensor_op), 0.3)

        def execute():
            fake_cupy.advance_clock(cost * _RANDOM.uniform(1 - SETTINGS["noise"], 1 + SETTINGS["noise"]))
            if not counters.SETTINGS["execute"]:
                arrays[2][...] = 0
                return
            if op == "fprop":
                res = conv_emulated(kind, op, spec, dt, x=arrays[0], w=arrays[1])
            elif op == "dgrad":
                res = conv_emulated(kind, op, spec, dt, w=arrays[0], dy=arrays[1], xshape=xd)
            else:
                res = conv_emulated(kind, op, spec, dt, x=arrays[0], dy=arrays[1])
            arrays[2][...] = res
        graphs.launch("cudnn", op, execute, stream=handle.stream)
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
