"""CUDA graphs: a call captured once on the device and replayed with one launch (`Backend.capture`).

    call = backend.capture(lambda x, y: model.compute_gradients(x, y, loss), (x, y))
    value, y_pred = call.replay((x_next, y_next))     # copies the inputs in, one graph launch, same outputs

A replay does what the capture queued, on the same memory, with the same kernel arguments. So:
- inputs are copied into the capture's own static buffers, and the outputs are the same arrays every replay
  (read or copy them before the next one);
- memory allocated during the capture comes from a private pool kept with the graph: CuPy's default pool
  would hand it to other arrays afterwards while the graph still writes there;
- the capture runs on a stream of its own (capture is illegal on the legacy stream; cuDNN follows CuPy's
  current stream, `cudnn.ConvRunner`); the replay is queued on the current stream, in order with the rest;
- the random generator's state is read from a device pair written before each replay (`rng.drawing_from`),
  not baked into the kernels' arguments; every other host value the call reads is baked, so it must be a
  constant of the call (the caller keys graphs by those: shapes, the loss weight);
- nothing may wait for the device or copy to the host inside (a step does neither: `tests/backends/
  test_gpu_step_counts.py`); a capture that fails raises `CaptureFailed` with the reason, and nothing of it
  stays.
A capture executes nothing: the first replay is the call's first run.
"""
from __future__ import annotations

from pydtnn.backends.contract import CaptureFailed


class CapturedCall:
    def __init__(self, backend, graph, pool, stream, inputs, outputs, base, drawn):
        self.backend, self.graph, self.pool, self.stream = backend, graph, pool, stream
        self.inputs, self.outputs, self.base, self.drawn = inputs, outputs, base, drawn

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


def capture(backend, fn, inputs) -> CapturedCall:
    """`fn(*static_inputs)` captured as a CUDA graph (see the module docstring); CaptureFailed if it cannot
    be. The workspace cuDNN shares growing inside the capture means the captured calls used a buffer since
    freed: captured again, once, with the grown one."""
    for _attempt in range(2):
        workspace = backend.conv.workspace.nbytes
        call = _capture_once(backend, fn, inputs)
        if backend.conv.workspace.nbytes == workspace:
            # the graph's pool now holds a step's activations: the blocks the eager steps left cached in the
            # default pool go back to the device, so that the two do not double a step's memory
            backend.xp.get_default_memory_pool().free_all_blocks()
            return call
    raise CaptureFailed("cuDNN's workspace grew during two captures")


def _capture_once(backend, fn, inputs) -> CapturedCall:
    cp = backend.xp
    static = []
    for a in inputs:
        s = cp.empty(a.shape, a.dtype)          # the default pool's, kept by the call
        s[...] = a
        static.append(s)
    base = cp.zeros(2, dtype=cp.uint64)
    pool = cp.cuda.MemoryPool()
    stream = cp.cuda.Stream(non_blocking=True)
    graph, error = None, None
    with cp.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        try:
            with backend.rng.drawing_from(base) as drawn:
                outputs = fn(*static)
        except Exception as e:  # noqa: BLE001 - any failure inside: the capture is abandoned, said in one line
            error = e
        finally:
            try:
                graph = stream.end_capture()
            except Exception as e:  # noqa: BLE001 - an invalidated capture ends with an error of its own
                error = error or e
    if error is not None:
        raise CaptureFailed(" ".join(f"{type(error).__name__}: {error}".split())) from None
    return CapturedCall(backend, graph, pool, stream, static, outputs, base, drawn[0])
