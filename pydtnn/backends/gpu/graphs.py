"""CUDA graphs: a call captured once on the device and replayed with one launch (`Backend.capture`).

    with backend.capture_warmup():                    # the call's last eager run: as the capture will run it
        model.compute_gradients(x, y, loss)
    call = backend.capture(lambda x, y: model.compute_gradients(x, y, loss), (x, y))
    value, y_pred = call.replay((x_next, y_next))     # copies the inputs in, one graph launch, same outputs

A replay does what the capture queued, on the same memory, with the same kernel arguments. So:
- inputs are copied into the capture's own static buffers, and the outputs are the same arrays every replay
  (read or copy them before the next one);
- every buffer the graph reads or writes lives as long as the graph. Memory allocated during the capture
  comes from a private pool kept with the graph (CuPy's default pool would hand it to other arrays afterwards
  while the graph still writes there); the call holds the libraries' workspaces it captured
  (`GPUBackend.workspaces()`), so one that grows later retires its buffer to the graph instead of freeing it
  (`cudnn.Workspace.retire`); what the caller hands in (a model's parameters, gradients and statistics) the
  caller keeps where it is (`pydtnn.parallel.step_graphs` drops a graph whose arrays moved);
- a backend captures on ONE stream of its own, made once (capture is illegal on the legacy stream; cuDNN and
  cuBLAS follow CuPy's current stream), and, as PyTorch does (torch/cuda/graphs.py, `make_graphed_callables`:
  the warm-up runs on the stream the capture uses), the call's last eager run before its capture runs there
  too (`warmup`): what a library keeps per stream, and kernels loaded on first use (the generator's
  `uniform_fill_at`, `rng_base_set`), exist before `begin_capture`. The replay is queued on the current
  stream, in order with the rest;
- the random generator's state is read from a device pair written before each replay (`rng.drawing_from`),
  not baked into the kernels' arguments; every other host value the call reads is baked, so it must be a
  constant of the call (the caller keys graphs by those: shapes, the loss weight);
- nothing may wait for the device or copy to the host inside (a step does neither: `tests/backends/
  test_gpu_step_counts.py`); `backend.capturing` is True meanwhile, so that a check which reads the device
  (an Embedding's ids) leaves it to the eager runs. A capture that fails raises `CaptureFailed` with the
  reason, and nothing of it stays.
A capture executes nothing: the first replay is the call's first run.
"""
from __future__ import annotations

import contextlib

from pydtnn.backends.contract import CaptureFailed


class CapturedCall:
    def __init__(self, backend, graph, pool, inputs, outputs, base, drawn, workspaces):
        self.backend, self.graph, self.pool = backend, graph, pool
        self.inputs, self.outputs, self.base, self.drawn = inputs, outputs, base, drawn
        self.workspaces = workspaces        # the library workspaces captured: alive while the graph is

    def replay(self, inputs):
        """Copy `inputs` (arrays of the captured shapes and dtypes) in, launch the graph on the current
        stream, advance the random generator by its draws; returns the captured call's outputs."""
        for static, a in zip(self.inputs, inputs):
            if a is not static:
                if a.shape != static.shape or a.dtype != static.dtype:
                    raise ValueError(f"a graph captured for {static.shape} {static.dtype} was given "
                                     f"{a.shape} {a.dtype}")
                static[...] = a
        rng = self.backend.rng
        if self.drawn:
            rng.set_base(self.base)
        self.graph.launch(stream=self.backend.xp.cuda.get_current_stream())
        rng.offset += self.drawn
        return self.outputs


class _CaptureStream:
    """A backend's capture stream (non-blocking: work on the legacy stream neither waits for it nor joins a
    capture on it) and the device pair its warm-ups draw from."""

    def __init__(self, cp):
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.base = cp.zeros(2, dtype=cp.uint64)


def _stream_of(backend) -> _CaptureStream:
    """The backend's one capture stream, made at its first warm-up or capture and reused by every later one."""
    made = getattr(backend, "_capture_stream", None)
    if made is None:
        made = backend._capture_stream = _CaptureStream(backend.xp)
    return made


@contextlib.contextmanager
def warmup(backend):
    """The block (a call's last eager run before its capture) runs as the capture will: on the capture stream,
    after what the current stream queued before it and before what it queues after, its random numbers drawn
    from a device pair (the numbers the eager generator draws: `rng`)."""
    cp, rng, made = backend.xp, backend.rng, _stream_of(backend)
    current = cp.cuda.get_current_stream()
    # CuPy's pool keeps a cache per stream: the eager steps' cached blocks cannot serve this stream, so they go
    # back to the device, and the warm-up does not hold a second step's memory (PyTorch empties its cache too)
    cp.get_default_memory_pool().free_all_blocks()
    made.stream.wait_event(current.record())
    try:
        with made.stream:
            rng.set_base(made.base)
            try:
                with rng.drawing_from(made.base) as drawn:
                    yield
            finally:
                rng.offset += drawn[0]          # it ran: its draws are taken, unlike a capture's
    finally:
        current.wait_event(made.stream.record())


def capture(backend, fn, inputs) -> CapturedCall:
    """`fn(*static_inputs)` captured as a CUDA graph (see the module docstring); CaptureFailed if it cannot
    be. A library workspace that grows inside the capture means the calls captured before used the buffer
    it retired: captured again, once, with the grown one."""
    for _attempt in range(2):
        workspaces = backend.workspaces()
        call = _capture_once(backend, fn, inputs, workspaces)
        if _same(workspaces, backend.workspaces()):
            # the graph's pool now holds a step's activations, and the default pool caches the warm-up's that the
            # capture replaced: those go back to the device, so that the two do not double a step's memory
            backend.xp.get_default_memory_pool().free_all_blocks()
            return call
    raise CaptureFailed("a library workspace grew during two captures")


def _same(before, after) -> bool:
    return len(before) == len(after) and all(a is b for a, b in zip(before, after))


def _capture_once(backend, fn, inputs, workspaces) -> CapturedCall:
    cp = backend.xp
    cp.get_default_memory_pool().free_all_blocks()      # as much memory as can be for the graph's pool
    static = []
    for a in inputs:
        s = cp.empty(a.shape, a.dtype)          # the default pool's, kept by the call
        s[...] = a
        static.append(s)
    base = cp.zeros(2, dtype=cp.uint64)
    stream = _stream_of(backend).stream
    backend.rng.load_graph_kernels(base)        # a module loads outside the capture, not inside
    pool = cp.cuda.MemoryPool()
    graph, error = None, None
    with cp.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        backend.capturing = True
        try:
            with backend.rng.drawing_from(base) as drawn:
                outputs = fn(*static)
        except Exception as e:  # noqa: BLE001 - any failure inside: the capture is abandoned, said in one line
            error = e
        finally:
            backend.capturing = False
            try:
                graph = stream.end_capture()
            except Exception as e:  # noqa: BLE001 - an invalidated capture ends with an error of its own
                error = error or e
    if error is not None:
        raise CaptureFailed(" ".join(f"{type(error).__name__}: {error}".split())) from None
    return CapturedCall(backend, graph, pool, static, outputs, base, drawn[0], workspaces)
