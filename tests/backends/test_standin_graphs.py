"""The stand-in's model of CUDA stream capture and graph replay (tests/gpu_standin/graphs.py), tested itself:
the CUDA-graph glue is only checked as far as this model is faithful. A capture runs nothing (fresh results
are poisoned), a replay recomputes from the memory as it is then with the host values of the capture. What
CuPy 14 and CUDA refuse during a capture raises here as there (the same exception, and a capture that stays
valid or not as there), what they allow runs; every such test names its source (CuPy v14.2.0's code and
tests, the CUDA Programming Guide's "CUDA Graphs" chapter, the CUDA Runtime API). The stand-in's own checks
(work that would escape the graph, memory a graph uses but does not hold) are AssertionErrors.
"""
import sys
import threading

import numpy as np
import pytest

import gpu_standin
from gpu_standin import counters, fake_cudnn, fake_cupy
from pydtnn.backends import ConvSpec


@pytest.fixture
def cp():
    with gpu_standin.active() as cupy:
        yield cupy


def _capture(cp, fn, pool=None):
    """fn() captured on a non-blocking stream with a private pool: (graph, what fn returned, pool)."""
    pool = pool or cp.cuda.MemoryPool()
    s = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.using_allocator(pool.malloc), s:
        s.begin_capture()
        try:
            out = fn()
        except BaseException:
            try:
                s.end_capture()                         # ended, whatever fn raised
            except RuntimeError:
                pass
            raise
        graph = s.end_capture()
    return graph, out, pool


def _poisoned_bytes(a):
    return np.all(a.get().view(np.uint8) == 0x5A)


# ================================================================================== capture and replay

def test_a_capture_runs_nothing_and_a_replay_reads_memory_with_host_values_baked(cp):
    x, b = cp.asarray(np.arange(4.0)), cp.asarray(np.full(4, 0.5))
    k = 2.0
    with counters.counting() as c:
        graph, y, _ = _capture(cp, lambda: x * k + b)
    assert np.all(np.isnan(y.get()))                    # nothing ran: the result is poison
    assert c.n["captured"] == 2 and c.n["launch"] == 0 and c.kernels == []
    assert graph.kernels == ["launch:__mul__", "launch:__add__"]
    with counters.counting() as c:
        graph.launch()
    np.testing.assert_array_equal(y.get(), np.arange(4.0) * 2 + 0.5)
    assert c.n["graph_launch"] == 1 and c.n["launch"] == 0 and c.kernels == ["graph_launch:graph"]
    x[...] = 10.0                                       # new contents in the same memory: followed
    k = 3.0                                             # a host value: baked at capture, not followed
    graph.launch(stream=cp.cuda.Stream(non_blocking=True))
    np.testing.assert_array_equal(y.get(), np.full(4, 20.5))
    assert k == 3.0


def test_fresh_integer_and_boolean_results_are_poisoned_with_a_byte_pattern(cp):
    x = cp.asarray(np.array([-1.0, 2.0, 3.0]))
    graph, (mask, ints, total), _ = _capture(cp, lambda: (x > 0, x.astype(np.int32), x.sum()))
    assert _poisoned_bytes(mask) and _poisoned_bytes(ints) and np.isnan(total.get())
    graph.launch()
    np.testing.assert_array_equal(mask.get(), [False, True, True])
    np.testing.assert_array_equal(ints.get(), [-1, 2, 3])
    assert total.get() == 4.0


_FRESH = {      # every way a CuPy operation writes a fresh result (`i`: a device index array)
    "operator": lambda cp, x, i: -(x * x),        # (not x @ x.T: CuPy refuses cuBLAS in a capture, R1 below)
    "ufunc": lambda cp, x, i: cp.maximum(x, 1.0),
    "ufunc method": lambda cp, x, i: np.add.reduce(x, axis=0),     # NumPy's ufunc, dispatched
    "function": lambda cp, x, i: cp.concatenate([cp.where(x > 2, x, 0.0), cp.tanh(x)]),
    "method": lambda cp, x, i: x.astype(np.float32).sum(axis=1),
    "fancy index": lambda cp, x, i: x[i],
    "scalar index": lambda cp, x, i: x[1, 2],
    "array copy": lambda cp, x, i: cp.array(x),
    "contiguous copy": lambda cp, x, i: cp.ascontiguousarray(x.T),
}


@pytest.mark.parametrize("name", _FRESH)
def test_every_fresh_result_is_poisoned_then_recomputed_from_current_memory(cp, name):
    op = _FRESH[name]
    x, i = cp.asarray(np.arange(6.0).reshape(2, 3)), cp.asarray(np.array([1, 0]))
    graph, y, _ = _capture(cp, lambda: op(cp, x, i))
    assert np.all(np.isnan(y.get()))
    x[...] = cp.asarray(np.arange(6.0).reshape(2, 3) * 3 - 4)
    i[...] = cp.asarray(np.array([0, 0]))
    graph.launch()
    np.testing.assert_array_equal(y.get(), op(cp, x, i).get())


def test_in_place_operations_are_recorded_and_run_only_by_a_replay(cp):
    x = cp.asarray(np.arange(3.0))
    y, z = cp.zeros(3), cp.zeros(3)

    def step():
        y[...] = x
        y[0] = 7.0
        t = y
        t += x
        cp.multiply(x, 2.0, out=z)
        return cp.zeros(2), cp.arange(3.0), cp.empty(5)     # creation kernels recorded; empty allocates only
    with counters.counting() as c:
        graph, (zeros, ramp, _), _ = _capture(cp, step)
    assert c.n["captured"] == 6 and c.n["alloc"] == 3
    assert y.get().tolist() == [0, 0, 0] and z.get().tolist() == [0, 0, 0]
    assert np.all(np.isnan(zeros.get())) and np.all(np.isnan(ramp.get()))
    graph.launch()
    assert y.get().tolist() == [7, 2, 4] and z.get().tolist() == [0, 2, 4]
    assert zeros.get().tolist() == [0, 0] and ramp.get().tolist() == [0, 1, 2]


def test_a_raw_kernel_is_captured_with_its_arguments_baked(cp):
    from pydtnn.backends.gpu import kernels
    fill = kernels.module(cp, np.float64).get_function("uniform_fill")
    n, key = 300, np.uint64(12345)
    expected = cp.zeros(n)
    fill((2,), (256,), (expected, np.int64(n), key, np.uint64(0)))
    out = cp.zeros(n)
    offset = 0
    with counters.counting() as c:
        graph, _, _ = _capture(cp, lambda: fill((2,), (256,), (out, np.int64(n), key, np.uint64(offset))))
    assert c.n["captured"] == 1 and c.n["launch"] == 0
    assert not out.get().any()                          # not run
    graph.launch()
    np.testing.assert_array_equal(out.get(), expected.get())
    out.fill(0.0)
    offset = 1000                                       # the captured offset stays 0: the same numbers again
    graph.launch()
    np.testing.assert_array_equal(out.get(), expected.get())


def test_a_replay_in_dry_mode_computes_cupy_operations_not_kernels(cp):
    from pydtnn.backends.gpu import kernels
    fill = kernels.module(cp, np.float64).get_function("uniform_fill")
    x, out = cp.asarray(np.arange(4.0)), cp.ones(64)

    def step():
        fill((1,), (64,), (out, np.int64(64), np.uint64(1), np.uint64(0)))
        return x + 1
    graph, y, _ = _capture(cp, step)
    with counters.dry():
        graph.launch()
    assert not out.get().any()                          # zeroed as an eager dry kernel
    np.testing.assert_array_equal(y.get(), np.arange(4.0) + 1)


def test_a_graph_launch_is_one_kernel_for_events_and_counts(cp):
    graph, _, _ = _capture(cp, lambda: None)             # an empty graph
    e = cp.cuda.Event()
    e.record()
    with counters.counting() as c:
        e.synchronize()
        e.record()
        graph.launch()
        e.synchronize()
    assert (c.n["sync"], c.n["sync_queued"], c.n["graph_launch"]) == (1, 1, 1)
    # a graph launched inside another capture is a node of it, run by that graph's replay
    x = cp.asarray(np.arange(3.0))
    inner, y, _ = _capture(cp, lambda: x * 2)
    with counters.counting() as c:
        outer, _, _ = _capture(cp, lambda: inner.launch())
    assert c.n["captured"] == 1 and outer.kernels == ["graph_launch:graph"] and np.all(np.isnan(y.get()))
    outer.launch()
    assert y.get().tolist() == [0, 2, 4]


@pytest.mark.parametrize("impl", ["frontend", "legacy"])
def test_cudnn_executes_at_replay_on_its_handles_stream(cp, impl, monkeypatch):
    from pydtnn.backends.gpu.backend import GPUBackend
    be = GPUBackend(dtype="float64", conv_impl=impl, auto_conv_alg=False)
    spec = ConvSpec(3, 4, (3, 3), (1, 1), (1, 1))
    rng = np.random.default_rng(0)
    x, w = be.asarray(rng.standard_normal((2, 3, 6, 6))), be.asarray(rng.standard_normal((4, 3, 3, 3)))
    eager, _ = be.conv2d_forward(x, w, None, spec)      # plans and workspace made before the capture
    clock = fake_cupy._Clock.now_ms
    with counters.counting() as c:
        graph, (y, _), _ = _capture(cp, lambda: be.conv2d_forward(x, w, None, spec))
    assert c.n["cudnn"] == 0 and c.n["captured"] >= 1 and "cudnn:fprop" in graph.kernels
    assert fake_cupy._Clock.now_ms == clock             # the device clock moves when a convolution runs
    graph.launch()
    assert fake_cupy._Clock.now_ms > clock
    np.testing.assert_array_equal(y.get(), eager.get())
    # a handle left on the legacy stream while its thread captures: the convolution would run outside
    if impl == "frontend":
        monkeypatch.setattr(sys.modules["cudnn"], "set_stream", lambda handle, stream: None)
    else:
        monkeypatch.setattr(fake_cudnn.LegacyLibrary, "cudnnSetStream", lambda self, handle, stream: 0)
    with pytest.raises(AssertionError, match="would run now, outside the graph"):
        _capture(cp, lambda: be.conv2d_forward(x, w, None, spec))


# ===================================================================================== what is refused
# Each rule names its source: CuPy v14.2.0 (cupy/..., cupy_backends/...; its tests in
# tests/cupy_tests/cuda_tests/test_graph.py) or the CUDA Programming Guide, "CUDA Graphs" -> "Stream Capture"
# (the sections quoted), or the CUDA Runtime API reference.

_D2H = "the current stream is capturing, so D2H transfers are disallowed"
_H2D = "the current stream is capturing, so H2D transfers are disallowed"


def _guarded(cp):
    """name -> what the capture does, refused by CuPy's own guard before any CUDA call (RuntimeError)."""
    import cupyx
    host, pinned = np.ones(3), cupyx.empty_pinned(3)
    x = cp.asarray(np.arange(3.0))
    return {
        # cupy/cuda/memory.pyx MemoryPointer.copy_to_host_async: `if runtime.streamIsCapturing(stream_ptr):
        # raise RuntimeError('the current stream is capturing, so D2H transfers are disallowed')`; get() ends
        # there, and item(), tolist(), __float__/__int__/__bool__ (`__nonzero__`: `bool(self.get())`) and
        # __repr__ call get() (cupy/_core/core.pyx)
        "get()": (lambda s: x.get(), _D2H),
        "get(out=pinned, blocking=False)": (lambda s: x.get(stream=s, out=pinned, blocking=False), _D2H),
        "float()": (lambda s: float(x.sum()), _D2H),
        "int()": (lambda s: int(x.sum()), _D2H),
        "bool()": (lambda s: bool(x.sum()), _D2H),
        "item()": (lambda s: x.sum().item(), _D2H),
        "tolist()": (lambda s: x.tolist(), _D2H),
        "repr()": (lambda s: repr(x), _D2H),
        # a result shaped by device values reads a count back (CuPy's test_stream_capture_failure3:
        # `cupy.where(a > 0.5)` raises RuntimeError 'is capturing')
        "nonzero": (lambda s: cp.nonzero(x), _D2H),
        "where(condition)": (lambda s: cp.where(x > 0.5), _D2H),
        "boolean mask": (lambda s: x[x > 1.0], _D2H),
        # memory.pyx copy_from_host_async: '... H2D transfers are disallowed'; ndarray.set() ends there, and
        # so does cupy.asarray / cupy.array of a host array (core.pyx _array_default), and a host index array
        # (_routines_indexing.pyx converts it with core.array)
        "asarray(host)": (lambda s: cp.asarray(host), _H2D),
        "array(host)": (lambda s: cp.array(host), _H2D),
        "set(pageable)": (lambda s: x.set(host), _H2D),
        "set(pinned, stream)": (lambda s: x.set(pinned, stream=s), _H2D),
        "host index array": (lambda s: x[np.array([0, 2])], _H2D),
    }


_GUARDED = ("get()", "get(out=pinned, blocking=False)", "float()", "int()", "bool()", "item()", "tolist()",
            "repr()", "nonzero", "where(condition)", "boolean mask", "asarray(host)", "array(host)", "set(pageable)",
            "set(pinned, stream)", "host index array")


@pytest.mark.parametrize("name", _GUARDED)
def test_a_host_copy_on_a_capturing_stream_is_refused_by_cupy_and_the_capture_stays_valid(cp, name):
    """CuPy's guards raise before any CUDA call: the capture goes on (CuPy's test_stream_capture_failure5
    catches the RuntimeError, then `s.end_capture()` succeeds)."""
    action, message = _guarded(cp)[name]
    y = cp.asarray(np.arange(3.0))
    s = cp.cuda.Stream(non_blocking=True)
    with counters.counting() as c, cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
        s.begin_capture()
        with pytest.raises(RuntimeError, match=f"^{message}$"):
            action(s)
        assert s.is_capturing()
        z = y * 2
        graph = s.end_capture()
    assert c.n["d2h"] == c.n["d2h_async"] == c.n["h2d_pageable"] == c.n["sync"] == 0, dict(c.n)
    graph.launch()
    assert z.get().tolist() == [0, 2, 4]


def test_a_0d_host_value_becomes_a_fill_kernel_which_a_capture_records(cp):
    """cupy/_core/core.pyx _array_default: `if a_cpu.ndim == 0: a.fill(a_cpu); return a`: no host copy, a
    fill kernel with the value baked in; eagerly as well."""
    with counters.counting() as c:
        eager = cp.asarray(np.float64(2.5))
    assert (c.n["h2d_pageable"], c.n["launch"]) == (0, 1) and eager.get() == 2.5
    graph, (v, w), _ = _capture(cp, lambda: (cp.asarray(3.5), cp.array(np.int32(7))))
    assert graph.kernels == ["launch:fill", "launch:fill"]
    graph.launch()
    assert v.get() == 3.5 and w.get() == 7 and w.dtype == np.int32


_CUBLAS_PRODUCTS = {     # CuPy's float products, each of which reaches cuBLAS
    "cupy.matmul": lambda cp, a, b: cp.matmul(a, b),
    "@": lambda cp, a, b: a @ b,
    "@=": lambda cp, a, b: a.__imatmul__(b),
    "cupy.dot": lambda cp, a, b: cp.dot(a, b),
    "ndarray.dot": lambda cp, a, b: a.dot(b),
    "cupy.tensordot": lambda cp, a, b: cp.tensordot(a, b, axes=1),
    "cupy.inner": lambda cp, a, b: cp.inner(a, b.T),
    "batched matmul": lambda cp, a, b: cp.matmul(a.reshape(1, 3, 3), b),
    "matmul into out": lambda cp, a, b: cp.matmul(a, b, out=cp.empty((3, 3))),
}


@pytest.mark.parametrize("name", _CUBLAS_PRODUCTS)
def test_cupy_refuses_cublas_during_a_capture_and_the_capture_stays_valid(cp, name):
    """R1, cupy_backends/cuda/libs/cublas.pyx: setStream (CuPy v14.2.0): every cuBLAS wrapper first sets the
    CURRENT stream on CuPy's handle, and that raises NotImplementedError('calling cuBLAS API during stream
    capture is currently unsupported') while the stream captures, before any CUDA work, so the capture ends
    normally (CuPy's tests/cupy_tests/cuda_tests/test_graph.py::test_stream_capture_failure_cublas)."""
    a, b = cp.asarray(np.arange(9.0).reshape(3, 3)), cp.asarray(np.eye(3))
    s = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
        s.begin_capture()
        with pytest.raises(NotImplementedError,
                           match="^calling cuBLAS API during stream capture is currently unsupported$"):
            _CUBLAS_PRODUCTS[name](cp, a, b)
        y = a + b                                           # the capture goes on
        graph = s.end_capture()
    assert graph.kernels == ["launch:__add__"]
    graph.launch()
    np.testing.assert_array_equal(y.get(), np.arange(9.0).reshape(3, 3) + np.eye(3))
    assert _CUBLAS_PRODUCTS[name](cp, a, b).shape[-2:] == (3, 3)          # outside a capture: runs


def test_cupy_products_that_are_no_cublas_call_are_captured(cp):
    """R1b, cupy/_core/_routines_linalg.pyx (CuPy v14.2.0): integer and boolean products are CuPy kernels
    (`dtype.kind in 'biu'`, `dtype.char not in 'efdFD'`), size-0 operands `out.fill(0)`, vector . vector
    `_tensordot_core_mul_sum`: no cuBLAS, so a capture records them."""
    ints = cp.asarray(np.arange(6).reshape(2, 3))
    v = cp.asarray(np.arange(3.0))
    empty, empty_t = cp.zeros((2, 0)), cp.zeros((0, 4))
    graph, (p, q, r), _ = _capture(cp, lambda: (ints @ ints.T, cp.dot(v, v), cp.matmul(empty, empty_t)))
    assert graph.kernels == ["launch:__matmul__", "launch:dot", "launch:matmul"]      # CuPy kernels, no cuBLAS
    graph.launch()
    assert p.get().tolist() == [[5, 14], [14, 50]] and float(q.get()) == 5.0 and r.get().tolist() == [[0.0] * 4] * 2


def _invalidating(cp):
    """name -> (what the capture does, the CUDARuntimeError's status)."""
    before = cp.cuda.Event()
    before.record()

    def captured_event(s, then):
        e = cp.cuda.Event()
        e.record(s)
        return then(e)
    return {
        # Guide, "Prohibited and Unhandled Operations": "It is invalid to synchronize or query the execution
        # status of a stream which is being captured or a captured event"; CuPy's test_stream_capture_failure1:
        # s.synchronize() -> 'cudaErrorStreamCaptureUnsupported', then end_capture ->
        # 'cudaErrorStreamCaptureInvalidated'
        "stream sync": (lambda s: s.synchronize(), "cudaErrorStreamCaptureUnsupported"),
        # same section: "... or synchronize a broader handle which encompasses an active stream capture, such as
        # a device or context handle"
        "device sync": (lambda s: cp.cuda.runtime.deviceSynchronize(), "cudaErrorStreamCaptureUnsupported"),
        "Device.synchronize": (lambda s: cp.cuda.Device().synchronize(), "cudaErrorStreamCaptureUnsupported"),
        # the cuBLAS guide, 2.1.5: "cudaFree() does an implicit cudaDeviceSynchronize()" (modelled as that wait)
        "free a pool's blocks": (lambda s: cp.get_default_memory_pool().free_all_blocks(),
                                 "cudaErrorStreamCaptureUnsupported"),
        # a captured event: driver_types.h cudaErrorCapturedEvent (907) "The operation is not permitted on an
        # event which was last recorded in a capturing stream"
        "captured event sync": (lambda s: captured_event(s, lambda e: e.synchronize()), "cudaErrorCapturedEvent"),
        "captured event timing": (lambda s: captured_event(s, lambda e: cp.cuda.get_elapsed_time(before, e)),
                                  "cudaErrorCapturedEvent"),
        # same section: "It is invalid to wait on a non-captured event from a stream which is being captured"
        # (CuPy's wait_event passes no cudaEventWaitExternal flag)
        "wait for an earlier event": (lambda s: s.wait_event(before), "cudaErrorStreamCaptureIsolation"),
    }


_INVALIDATING = ("stream sync", "device sync", "Device.synchronize", "free a pool's blocks", "captured event sync",
                 "captured event timing", "wait for an earlier event")


def _invalidated(cp, s, probe):
    """After an invalidation: CuPy's streamIsCapturing raises (cupy_backends/cuda/api/runtime.pyx: 'the stream
    was capturing, but an error has invalidated the capture sequence'), and so does its D2H guard (`probe`: a
    device array made before the capture); end_capture ends the capture with
    'cudaErrorStreamCaptureInvalidated' (Guide, "Invalidation": "will also return an error value and a NULL
    graph")."""
    message = "^the stream was capturing, but an error has invalidated the capture sequence$"
    with pytest.raises(RuntimeError, match=message):
        s.is_capturing()
    with pytest.raises(RuntimeError, match=message):
        probe.get(stream=s)
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="^cudaErrorStreamCaptureInvalidated"):
        s.end_capture()
    assert not s.is_capturing()                         # ended all the same: the caller can go on
    s.synchronize()


@pytest.mark.parametrize("name", _INVALIDATING)
def test_what_cuda_refuses_in_a_capture_raises_and_invalidates_it(cp, name):
    action, status = _invalidating(cp)[name]
    s, probe = cp.cuda.Stream(non_blocking=True), cp.zeros(1)
    with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
        s.begin_capture()
        with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match=f"^{status}"):
            action(s)
        _invalidated(cp, s, probe)
    cp.cuda.runtime.deviceSynchronize()


def test_a_query_cuda_refuses_reads_false_and_invalidates_the_capture(cp):
    """CuPy's `Stream.done` / `Event.done` return `streamQuery(...) == 0` / `eventQuery(...) == 0` without
    raising (cupy/cuda/stream.pyx); CuPy's test_stream_capture_failure4: `s.done`, then end_capture ->
    'cudaErrorStreamCaptureInvalidated'. The same for a captured event (Runtime API,
    cudaThreadExchangeStreamCaptureMode: even relaxed mode prohibits "cudaEventQuery on an event that was last
    recorded inside a capture sequence")."""
    probe = cp.zeros(1)
    for query in (lambda s: s.done, lambda s: s.record().done):
        s = cp.cuda.Stream(non_blocking=True)
        with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
            s.begin_capture()
            assert query(s) is False
            _invalidated(cp, s, probe)
    assert s.done and s.record().done                   # outside a capture: done (the stand-in runs at once)


def test_the_stand_ins_own_checks_refuse_work_that_would_escape_the_graph(cp):
    """Not CUDA refusals (AssertionError "stand-in: ..."): bugs a device would not report. A kernel the
    capturing thread issues on another stream would run now, outside the graph; memory the capture allocates
    from the default pool would be handed to other arrays after it."""
    x = cp.asarray(np.arange(3.0))
    for action, message in ((lambda: _on_other_stream(cp, lambda: x + 1), "outside the graph"),
                            (lambda: _with_default_pool(cp, lambda: cp.empty(3)),
                             "allocation during capture from the default pool")):
        s = cp.cuda.Stream(non_blocking=True)
        with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
            s.begin_capture()
            with pytest.raises(AssertionError, match=message):
                action()
            with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="^cudaErrorStreamCaptureInvalidated"):
                s.end_capture()


def _on_other_stream(cp, fn):
    with cp.cuda.Stream(non_blocking=True):
        return fn()


def _with_default_pool(cp, fn):
    with cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
        return fn()


# ------------------------------------------------------------------------- what relaxed mode allows

def _unrelated(cp):
    """name -> a call of the capturing thread that concerns nothing of the capture."""
    before, other = cp.cuda.Event(), cp.cuda.Stream(non_blocking=True)
    before.record()
    x = cp.asarray(np.arange(3.0))
    return {
        "other stream sync": lambda: other.synchronize(),
        "other stream done": lambda: other.done,
        "legacy stream sync": lambda: cp.cuda.Stream.null.synchronize(),        # (the capture's is non-blocking)
        "earlier event sync": lambda: before.synchronize(),
        "earlier event done": lambda: before.done,
        "earlier events timed": lambda: cp.cuda.get_elapsed_time(before, before),
        "read on another stream": lambda: _on_other_stream(cp, lambda: x.get()),
        "pool miss (cudaMalloc)": lambda: cp.empty(12345),
    }


_UNRELATED = ("other stream sync", "other stream done", "legacy stream sync", "earlier event sync",
              "earlier event done", "earlier events timed", "read on another stream", "pool miss (cudaMalloc)")


@pytest.mark.parametrize("name", _UNRELATED)
def test_relaxed_mode_lets_the_capturing_thread_wait_query_and_allocate_outside_the_capture(cp, name):
    """cupy/cuda/stream.pyx begin_capture: mode None is `runtime.streamCaptureModeRelaxed` ("During the
    capture the memory pool might need to increase size ... other modes would not permit such a (legitimate)
    operation"); Runtime API, cudaThreadExchangeStreamCaptureMode: "cudaStreamCaptureModeRelaxed: The local
    thread is not prohibited from potentially unsafe API calls"; what the Guide prohibits concerns the capture's
    own streams and events, the device and the legacy stream (with a blocking capture) only."""
    action = _unrelated(cp)[name]
    x = cp.asarray(np.arange(3.0))
    graph, y, _ = _capture(cp, lambda: (action(), x * 2)[1])
    graph.launch()
    assert y.get().tolist() == [0, 2, 4]


_UNSAFE = ("other stream sync", "earlier event sync", "earlier event done", "pool miss (cudaMalloc)")


@pytest.mark.parametrize("mode", ["global", "thread_local"])
@pytest.mark.parametrize("name", _UNSAFE)
def test_global_and_thread_local_modes_refuse_potentially_unsafe_calls(cp, name, mode):
    """Runtime API, cudaThreadExchangeStreamCaptureMode: "If the local thread has an ongoing capture sequence
    that was not initiated with cudaStreamCaptureModeRelaxed ... this thread is prohibited from potentially
    unsafe API calls", the example being cudaMalloc (a pool miss); event queries count among them (PyTorch,
    aten/src/ATen/cuda/CUDAGraph.cpp: "event queries are not allowed during a graph capture in the default
    capture mode"; the HIP port, ROCm/rocm-systems#3169, refuses hipEventQuery/hipEventSynchronize alike)."""
    action = _unrelated(cp)[name]
    done = name.endswith("done")
    rt = cp.cuda.runtime
    s, probe = cp.cuda.Stream(non_blocking=True), cp.zeros(1)
    with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
        s.begin_capture(rt.streamCaptureModeGlobal if mode == "global" else rt.streamCaptureModeThreadLocal)
        if done:
            assert action() is False                    # CuPy's `done` reads the refused query as False
        else:
            with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorStreamCaptureUnsupported"):
                action()
        _invalidated(cp, s, probe)


def test_only_a_global_capture_refuses_unsafe_calls_of_other_threads(cp):
    """cudaThreadExchangeStreamCaptureMode: Global: "... or if any other thread has a concurrent capture sequence
    initiated with cudaStreamCaptureModeGlobal, this thread is prohibited from potentially unsafe API calls";
    ThreadLocal: "Concurrent capture sequences in other threads are ignored"; Relaxed likewise."""
    rt = cp.cuda.runtime
    before, probe = cp.cuda.Event(), cp.zeros(1)
    before.record()
    for mode, refused in ((rt.streamCaptureModeGlobal, True), (rt.streamCaptureModeThreadLocal, False),
                          (None, False)):
        seen = []

        def other_thread():
            try:
                before.synchronize()
                seen.append("ran")
            except rt.CUDARuntimeError as e:
                seen.append(e.status)
        s = cp.cuda.Stream(non_blocking=True)
        with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
            s.begin_capture(mode)
            t = threading.Thread(target=other_thread)
            t.start()
            t.join()
            if refused:
                assert seen == ["cudaErrorStreamCaptureUnsupported"]
                _invalidated(cp, s, probe)
            else:
                assert seen == ["ran"]
                assert isinstance(s.end_capture(), cp.cuda.Graph)


def test_end_capture_from_another_thread_is_refused_unless_relaxed(cp):
    """Runtime API, cudaStreamBeginCapture: "If mode is not cudaStreamCaptureModeRelaxed, cudaStreamEndCapture
    must be called on this stream from the same thread" (else cudaErrorStreamCaptureWrongThread)."""
    rt = cp.cuda.runtime
    for mode, refused in ((rt.streamCaptureModeThreadLocal, True), (None, False)):
        s, ended = cp.cuda.Stream(non_blocking=True), []

        def end():
            try:
                ended.append(s.end_capture())
            except rt.CUDARuntimeError as e:
                ended.append(e.status)
        s.begin_capture(mode)
        t = threading.Thread(target=end)
        t.start()
        t.join()
        if refused:
            assert ended == ["cudaErrorStreamCaptureWrongThread"] and s.is_capturing()
            s.end_capture()
        else:
            assert isinstance(ended[0], cp.cuda.Graph) and not s.is_capturing()


# ------------------------------------------------------------------------------------ the legacy stream

def test_the_legacy_stream_is_unusable_while_a_blocking_stream_captures(cp):
    """Guide, "Prohibited and Unhandled Operations": "When any stream in the same context is being captured,
    and it was not created with cudaStreamNonBlocking, any attempted use of the legacy stream is invalid".
    Asking whether it captures raises cudaErrorStreamCaptureImplicit and leaves the capture valid (CuPy's
    test_null_stream_cannot_capture, which then ends the capture and launches the graph); so does CuPy's
    transfer guard, which asks that; a kernel or a synchronization there invalidates the capture."""
    rt = cp.cuda.runtime
    x = cp.asarray(np.arange(3.0))
    s = cp.cuda.Stream(non_blocking=False)
    with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
        s.begin_capture()
        b = x + 4
        assert s.is_capturing()
        with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorStreamCaptureImplicit"):
            cp.cuda.Stream.null.is_capturing()
        with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorStreamCaptureImplicit"):
            x.get(stream=cp.cuda.Stream.null)
        graph = s.end_capture()
    assert not s.is_capturing() and not cp.cuda.Stream.null.is_capturing()
    graph.launch()
    assert b.get().tolist() == [4, 5, 6]
    for action in (lambda: cp.cuda.Stream.null.synchronize(), lambda: _on_null_stream(cp, lambda: x + 1)):
        s = cp.cuda.Stream(non_blocking=False)
        with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
            s.begin_capture()
            with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorStreamCaptureImplicit"):
                action()
            _invalidated(cp, s, x)


def _on_null_stream(cp, fn):
    with cp.cuda.Stream.null:
        return fn()


# ----------------------------------------------------------------------------------- events, fork, join

def test_an_event_recorded_on_the_capturing_stream_is_allowed_and_adds_no_node(cp):
    """Guide, "Cross-stream Dependencies and Events": "When an event is recorded in a stream that is in capture
    mode, it results in a captured event. A captured event represents a set of nodes in a capture graph." (no
    node of its own); CuPy's test_stream_fork_join records e1 on the capturing stream."""
    x = cp.asarray(np.arange(3.0))

    def step():
        y = x * 2
        cp.cuda.Event().record(cp.cuda.get_current_stream())
        cp.cuda.Event(disable_timing=True).record()
        return y + 1
    graph, z, _ = _capture(cp, step)
    assert graph.kernels == ["launch:__mul__", "launch:__add__"]
    graph.launch()
    assert z.get().tolist() == [1, 3, 5]


def test_a_stream_that_waits_for_a_captured_event_is_forked_into_the_capture_and_joins_back(cp):
    """Guide, "Cross-stream Dependencies and Events": "When a captured event is waited on by a stream, it places
    the stream in capture mode ... The two streams are then being captured to the same capture graph", and
    every such stream "must also be joined back to the origin stream". CuPy's test_stream_fork_join, as it is."""
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    e1, e2 = cp.cuda.Event(), cp.cuda.Event()
    a = cp.asarray(np.arange(100.0))
    with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s1:
        s1.begin_capture()
        out1 = a * 100
        e1.record(s1)
        s2.wait_event(e1)
        assert s2.is_capturing()
        with s2:
            out2 = 3 * out1 + 1
            e2.record(s2)
        s1.wait_event(e2)
        g = s1.end_capture()
    assert not s1.is_capturing() and not s2.is_capturing()
    assert g.kernels == ["launch:__mul__", "launch:__rmul__", "launch:__add__"] and np.all(np.isnan(out2.get()))
    g.launch()
    np.testing.assert_array_equal(out2.get(), 3 * (np.arange(100.0) * 100) + 1)


def test_a_fork_left_unjoined_or_ended_on_its_own_fails_the_capture(cp):
    """CuPy's test_stream_capture_failure3: a forked stream not joined back -> end_capture raises
    'cudaErrorStreamCaptureUnjoined' (Guide: "Failure to rejoin to the origin stream will result in failure of
    the overall capture operation"); test_stream_capture_failure2: end_capture on the forked stream ->
    'cudaErrorStreamCaptureUnmatched', which invalidates the origin's capture. Both leave capture mode."""
    rt = cp.cuda.runtime
    a = cp.asarray(np.arange(3.0))
    for end_on_fork in (False, True):
        s1, s2, e = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True), cp.cuda.Event()
        with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s1:
            s1.begin_capture()
            with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorIllegalState"):
                s2.end_capture()
            e.record(s1)
            s2.wait_event(e)
            with s2:
                _ = a ** 3
                if not end_on_fork:
                    with pytest.raises(RuntimeError, match="is capturing"):
                        cp.where(a > 0.5)
            if end_on_fork:
                with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorStreamCaptureUnmatched"):
                    s2.end_capture()
            status = "cudaErrorStreamCaptureInvalidated" if end_on_fork else "cudaErrorStreamCaptureUnjoined"
            with pytest.raises(rt.CUDARuntimeError, match=f"^{status}"):
                s1.end_capture()
        assert not s1.is_capturing() and not s2.is_capturing()
        s1.synchronize()
        s2.synchronize()


def test_a_wait_that_would_merge_two_captures_is_refused(cp):
    """Guide, "Prohibited and Unhandled Operations": "It is invalid to merge two separate capture graphs by
    waiting on a captured event from a stream which is being captured and is associated with a different
    capture graph than the event" (cudaErrorStreamCaptureMerge); both captures are invalidated."""
    rt = cp.cuda.runtime
    e, probe = cp.cuda.Event(), cp.zeros(1)
    recorded, go, ended = threading.Event(), threading.Event(), []

    def other_capture():
        s2 = cp.cuda.Stream(non_blocking=True)
        with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s2:
            s2.begin_capture()
            e.record(s2)
            recorded.set()
            go.wait()
            try:
                s2.end_capture()
            except rt.CUDARuntimeError as error:
                ended.append(error.status)
    t = threading.Thread(target=other_capture)
    t.start()
    recorded.wait()
    s1 = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s1:
        s1.begin_capture()
        with pytest.raises(rt.CUDARuntimeError, match="^cudaErrorStreamCaptureMerge"):
            s1.wait_event(e)
        go.set()
        t.join()
        _invalidated(cp, s1, probe)
    assert ended == ["cudaErrorStreamCaptureInvalidated"]


# ------------------------------------------------------------------------------- memory a graph uses

def test_a_replay_that_uses_memory_freed_since_the_capture_is_caught(cp):
    """Memory a graph uses but does not hold: an array from CuPy's default pool used by the capture and
    dropped afterwards goes back to that pool (cupy/cuda/memory.pyx SingleDeviceMemoryPool: `free` ->
    `arena.insert_chunk`, reused by the next `_malloc` of its size), which hands it to another array; every
    replay then writes there. PyTorch's caching allocator keeps a graph's memory in a graph-private pool "and
    doesn't begin cudaFreeing those addresses until the graph is destroyed" (c10/cuda/CUDACachingAllocator.cpp,
    Note [Interaction with CUDA graph capture])."""
    x = cp.asarray(np.arange(3.0))
    graph, y, _ = _capture(cp, lambda: x * 2)
    graph.launch()
    del x
    with pytest.raises(AssertionError, match=r"a replay of this graph uses an operand \(launch:__mul__\): 24 "
                                             r"bytes at 0x[0-9a-f]+, freed back to CuPy's default memory pool"):
        graph.launch()
    assert y.get().tolist() == [0, 2, 4]                # the replay ran nothing


def test_memory_freed_into_the_capture_pool_stays_the_graphs_until_the_pool_gives_it_back(cp):
    """Intermediates of a capture come from its private pool and are freed inside it: the pool keeps them for
    the graph (it serves captures only), so replays are safe, until `free_all_blocks` hands the cached blocks
    back to the device (cupy/cuda/memory.pyx: free_all_blocks cudaFrees the arena's free chunks)."""
    x = cp.asarray(np.arange(3.0))
    graph, y, pool = _capture(cp, lambda: (x * 2) + 1)  # x * 2: freed during the capture
    graph.launch()
    assert y.get().tolist() == [1, 3, 5]
    pool.free_all_blocks()
    with pytest.raises(AssertionError, match=r"\(launch:__add__\).*given back to the device by its capture pool"):
        graph.launch()


def test_a_pointer_handed_to_a_library_is_memory_the_graph_uses(cp):
    """cuDNN, cuBLAS and NCCL get raw pointers (`device_memory.find`); the graph bakes them in."""
    from gpu_standin import device_memory, graphs
    scratch, out = cp.zeros(64, dtype=cp.uint8), cp.zeros(4)
    scratch_ptr, out_ptr = scratch.data.ptr, out.data.ptr      # (taken before, as a library's handle keeps them)

    def library_call():
        device_memory.find(scratch_ptr, 64, "a library's workspace")
        target = device_memory.find(out_ptr, 32, "its output").view(np.float64)
        graphs.launch("cudnn", "fprop", lambda: target.fill(1.0))
    graph, _, _ = _capture(cp, library_call)
    graph.launch()
    assert out.get().tolist() == [1, 1, 1, 1]
    del scratch
    with pytest.raises(AssertionError, match=r"uses a library's workspace \(cudnn:fprop\): 64 bytes"):
        graph.launch()


@pytest.mark.parametrize("impl", ["frontend", "legacy"])
def test_a_cudnn_workspace_grown_after_a_capture_is_still_the_graphs_at_replay(cp, impl):
    """Issue 45, item 3: an eager call after a capture that needs more cuDNN workspace (an epoch's shorter last
    batch, another batch size at evaluation, autotuning new shapes) must not free the buffer the graph baked
    in; the replay still computes the captured convolution."""
    from pydtnn.backends.gpu.backend import GPUBackend
    be = GPUBackend(dtype="float64", conv_impl=impl, auto_conv_alg=False)
    spec = ConvSpec(3, 4, (3, 3), (1, 1), (1, 1))
    rng = np.random.default_rng(0)
    x, w = be.asarray(rng.standard_normal((2, 3, 6, 6))), be.asarray(rng.standard_normal((4, 3, 3, 3)))
    eager, _ = be.conv2d_forward(x, w, None, spec)
    call = be.capture(lambda xs: be.conv2d_forward(xs, w, None, spec)[0], (x,))
    be.conv.workspace.ptr(be.conv.workspace.nbytes * 4)    # what an eager call needing more workspace does
    y = call.replay((x,))
    np.testing.assert_array_equal(y.get(), eager.get())


# ------------------------------------------------------------------------------------------- pools

def test_a_pool_that_served_a_capture_serves_nothing_outside_one(cp):
    _graph, _, pool = _capture(cp, lambda: cp.zeros(4))     # (the graph holds its memory in the pool)
    assert pool.used_bytes() == 512
    with cp.cuda.using_allocator(pool.malloc):
        with pytest.raises(AssertionError, match="served a capture"):
            cp.zeros(4)
    other = cp.cuda.MemoryPool()
    with cp.cuda.using_allocator(other.malloc):         # a pool no capture used: fine outside
        a = cp.zeros(100)                               # 800 bytes: a block of 1024 (CuPy rounds to 512)
        with cp.cuda.using_allocator(None):             # nested: raw allocations, then restored
            raw = cp.zeros(1)
        b = cp.zeros(1)
    assert other.used_bytes() == 1536
    del a
    assert other.used_bytes() == 512 and other.n_free_blocks() == 1 and other.total_bytes() == 1536
    other.free_all_blocks()
    assert other.total_bytes() == 512 and other.n_free_blocks() == 0
    assert raw.size == b.size == 1
    assert cp.cuda.get_allocator() == cp.get_default_memory_pool().malloc      # the default pool again


def test_capture_needs_a_stream_of_its_own(cp):
    with pytest.raises(RuntimeError, match=r"cannot capture on the default \(legacy\) stream"):
        cp.cuda.Stream.null.begin_capture()
    s = cp.cuda.Stream(non_blocking=True)
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="not capturing"):
        s.end_capture()
    with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
        s.begin_capture()
        with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="capturing already"):
            s.begin_capture()
        assert isinstance(s.end_capture(), cp.cuda.Graph)


# ===================================================================================== reads, counted

def test_a_blocking_read_is_a_synchronization_and_a_queued_one_is_not(cp):
    """cupy/_core/core.pyx `ndarray.get(stream=None, order='C', out=None, blocking=True)`: the copy
    (`copy_to_host_async(ptr, nbytes, stream)`) then `if blocking: stream.synchronize()`: a blocking read (the
    default, and float(), int(), item()... through get()) synchronizes its stream. With blocking=False into
    pinned memory the host goes on; into pageable memory it still waits for the copy (CUDA Runtime API, "API
    synchronization behavior", Memcpy, Asynchronous: "For transfers from device memory to pageable host
    memory, the function will return only once the copy has completed")."""
    import cupyx
    x, side = cp.asarray(np.arange(3.0)), cp.cuda.Stream(non_blocking=True)
    pinned, pageable = cupyx.empty_pinned(3), np.empty(3)
    reads = {   # -> (d2h, sync, d2h_async), and the stream synchronized
        "get()": (lambda: x.get(), (1, 1, 0), 0),
        "float()": (lambda: float(x[1]), (1, 1, 0), 0),
        "get(stream, out=pinned)": (lambda: x.get(stream=side, out=pinned), (1, 1, 0), side.ptr),
        "get(stream, out=pinned, blocking=False)": (lambda: x.get(stream=side, out=pinned, blocking=False),
                                                    (0, 0, 1), None),
        "get(stream, out=pageable, blocking=False)": (lambda: x.get(stream=side, out=pageable, blocking=False),
                                                      (1, 0, 0), None),
        "asnumpy(out=pinned, blocking=False)": (lambda: cp.asnumpy(x, stream=side, out=pinned, blocking=False),
                                                (0, 0, 1), None),
    }
    for name, (read, expected, synchronized) in reads.items():
        fake_cupy.CALLS.clear()
        with counters.counting() as c:
            host = read()
        assert (c.n["d2h"], c.n["sync"], c.n["d2h_async"]) == expected, name
        assert [call[1] for call in fake_cupy.CALLS if call[0] == "stream_synchronize"] == (
            [] if synchronized is None else [synchronized]), name
        assert np.asarray(host).tolist() in ([0.0, 1.0, 2.0], 1.0), name


# ===================================================================================== streams, threads

def test_the_current_stream_is_per_thread_and_nests(cp):
    s1, s2 = cp.cuda.Stream(), cp.cuda.Stream(non_blocking=True)
    assert cp.cuda.get_current_stream() is cp.cuda.Stream.null
    seen = []
    with s1:
        with s2:
            assert cp.cuda.get_current_stream() is s2
            t = threading.Thread(target=lambda: seen.append(cp.cuda.get_current_stream()))
            t.start()
            t.join()
        assert cp.cuda.get_current_stream() is s1
    assert cp.cuda.get_current_stream() is cp.cuda.Stream.null and seen == [cp.cuda.Stream.null]


def test_other_threads_run_as_usual_during_a_capture(cp):
    """A prefetch thread's pinned copies and arithmetic on its own stream run at once; the main thread's
    capture is untouched."""
    import cupyx
    x = cp.asarray(np.arange(3.0))
    pinned = cupyx.empty_pinned(3)
    pinned[...] = [5.0, 6.0, 7.0]
    dev, result = cp.zeros(3), []

    def prefetch():
        side = cp.cuda.Stream(non_blocking=True)
        with side:
            dev.set(pinned, stream=side)
            result.append((dev + 1).get())
            side.synchronize()

    def step():
        t = threading.Thread(target=prefetch)
        t.start()
        t.join()
        return x * 2
    graph, y, _ = _capture(cp, step)
    assert result[0].tolist() == [6, 7, 8] and dev.get().tolist() == [5, 6, 7]
    assert np.all(np.isnan(y.get()))
    graph.launch()
    assert y.get().tolist() == [0, 2, 4]


def test_cupy_wraps_out_of_bounds_integer_indices(cp):
    """CuPy's documentation, "Differences between CuPy and NumPy: Out-of-bounds indices" (and
    cupy/_core/_routines_indexing.pyx, `_take_kernel_core`: `indices % index_range`): integer-array indexing and
    `take` wrap where NumPy raises IndexError, so a missing bounds check gives wrong numbers on a device."""
    x = cp.asarray(np.arange(5.0))
    idx = cp.asarray(np.array([0, 6, -1]))
    assert cp.asnumpy(x[idx]).tolist() == [0.0, 1.0, 4.0]
    assert cp.asnumpy(x.take(idx)).tolist() == [0.0, 1.0, 4.0]
