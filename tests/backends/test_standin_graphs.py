"""The stand-in's model of CUDA stream capture and graph replay (tests/gpu_standin/graphs.py), tested itself:
the CUDA-graph glue is only checked as far as this model is faithful. A capture runs nothing (fresh results
are poisoned), a replay recomputes from the memory as it is then with the host values of the capture, and
what a real capture refuses (waits, host copies, the default pool, work on another stream) raises here.
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
    "operator": lambda cp, x, i: -(x @ x.T),
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

def _forbidden(cp):
    """name -> (what the capture does, the error's type, its message)."""
    host, before = np.ones(3), cp.cuda.Event()
    before.record()
    unsupported = (cp.cuda.runtime.CUDARuntimeError, "cudaErrorStreamCaptureUnsupported")
    x = cp.asarray(np.arange(3.0))
    return {
        "stream sync": (lambda s: s.synchronize(), *unsupported),
        "other stream sync": (lambda s: cp.cuda.Stream(non_blocking=True).synchronize(), *unsupported),
        "device sync": (lambda s: cp.cuda.runtime.deviceSynchronize(), *unsupported),
        "event sync": (lambda s: before.synchronize(), *unsupported),
        "event record": (lambda s: cp.cuda.Event().record(s), *unsupported),
        "elapsed time": (lambda s: cp.cuda.get_elapsed_time(before, before), *unsupported),
        "float()": (lambda s: float(x.sum()), *unsupported),
        "get()": (lambda s: x.get(), *unsupported),
        "asarray(host)": (lambda s: cp.asarray(host), *unsupported),
        "set(pageable)": (lambda s: x.set(host), *unsupported),
        "nonzero": (lambda s: cp.nonzero(x), *unsupported),
        "null stream sync": (lambda s: cp.cuda.Stream.null.synchronize(), cp.cuda.runtime.CUDARuntimeError,
                             "cudaErrorStreamCaptureImplicit"),
        "wait for an earlier event": (lambda s: s.wait_event(before), cp.cuda.runtime.CUDARuntimeError,
                                      "cudaErrorStreamCaptureIsolation"),
        "kernel on the null stream": (lambda s: _on_null_stream(cp, lambda: x + 1), AssertionError,
                                      "outside the graph"),
        "default pool": (lambda s: _with_default_pool(cp, lambda: cp.empty(3)), AssertionError,
                         "allocation during capture from the default pool"),
        "free a pool's blocks": (lambda s: cp.get_default_memory_pool().free_all_blocks(), *unsupported),
    }


def _on_null_stream(cp, fn):
    with cp.cuda.Stream.null:
        return fn()


def _with_default_pool(cp, fn):
    with cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
        return fn()


_FORBIDDEN = ("stream sync", "other stream sync", "device sync", "event sync", "event record", "elapsed time",
              "float()", "get()", "asarray(host)", "set(pageable)", "nonzero", "null stream sync",
              "wait for an earlier event", "kernel on the null stream", "default pool", "free a pool's blocks")


@pytest.mark.parametrize("name", _FORBIDDEN)
def test_what_a_capture_refuses_raises_and_invalidates_it(cp, name):
    action, error, message = _forbidden(cp)[name]
    s = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
        s.begin_capture()
        with pytest.raises(error, match=message):
            action(s)
        assert s.is_capturing()
        with pytest.raises(cp.cuda.runtime.CUDARuntimeError, match="^cudaErrorStreamCaptureInvalidated"):
            s.end_capture()
    assert not s.is_capturing()                         # ended all the same: the caller can go on
    cp.cuda.runtime.deviceSynchronize()


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


def test_a_pinned_copy_on_the_capturing_stream_is_recorded_and_reads_the_host_at_replay(cp):
    import cupyx
    pinned = cupyx.empty_pinned(2)
    pinned[...] = 1.0
    dev = cp.zeros(2)
    graph, _, _ = _capture(cp, lambda: dev.set(pinned, stream=cp.cuda.get_current_stream()))
    assert dev.get().tolist() == [0, 0]
    pinned[...] = 9.0
    graph.launch()
    assert dev.get().tolist() == [9, 9]
