"""Graph memory held for the graph's life (`pydtnn.backends.gpu.graphs`, `cudnn.Workspace`), over the host
stand-in of CuPy/cuDNN/cuBLAS.

A CUDA graph bakes in the addresses it captured ("Because capture bakes in memory addresses, the memory used
during capture must be available for the graph to use during replay": PyTorch, c10/cuda/
CUDACachingAllocator.cpp, Note [Interaction with CUDA graph capture]). CuPy's pool knows nothing of graphs
(cupy/cuda/memory.pyx, SingleDeviceMemoryPool._malloc / free: a freed chunk goes back to its arena and
serves the next allocation), so an array freed while a graph still uses its memory hands that memory to other
arrays, and every later replay writes into them.
- the call holds the library workspaces it captured: cuDNN's (grown on demand) and cuBLAS's (set with
  cublasSetWorkspace);
- an eager call after the capture that grows cuDNN's workspace (another batch size) RETIRES the captured
  buffer: the memory stays allocated, no new array is given it, and the replay still equals an eager step bit
  for bit; dropping the graph frees it;
- a workspace that grows INSIDE a capture means the calls captured before it used the retired buffer: the
  step is captured again, with the grown one.
"""
import gc

import numpy as np

import gpu_standin
from gpu_standin import device_memory, fake_cudnn
from pydtnn import Model
from pydtnn.activations import Softmax
from pydtnn.layers import FC, BatchNormalization, Conv2D, Flatten, Input, Relu
from pydtnn.losses import get_loss

LOSS = get_loss("categorical_cross_entropy")


def _model(backend):
    model = Model(backend=backend, seed=0)
    for layer in (Input(shape=(1, 8, 8)), Conv2D(4, (3, 3), padding=1), BatchNormalization(), Relu(), Flatten(),
                  FC(5), Softmax()):
        model.add(layer)
    return model


def _gpu():
    from pydtnn.backends.gpu.backend import GPUBackend
    return GPUBackend(dtype="float64", seed=0, auto_conv_alg=False, deterministic=True)


def _batch(backend, n, seed):
    rng = np.random.default_rng(seed)
    return backend.asarray(rng.standard_normal((n, 1, 8, 8))), backend.asarray(np.eye(5)[rng.integers(0, 5, n)])


def _live(ptr, nbytes) -> bool:
    """Whether [ptr, ptr + nbytes) is allocated device memory of the stand-in."""
    try:
        device_memory.find(ptr, nbytes, "the captured workspace")
        return True
    except AssertionError:
        return False


def _step(model, x, y):
    value, _ = model.compute_gradients(x, y, LOSS)
    return float(value), model.grads.get()


def test_a_capture_holds_the_library_workspaces_it_used():
    with gpu_standin.active():
        be = _gpu()
        model = _model(be)
        x, y = _batch(be, 4, 0)
        with be.capture_warmup():
            model.compute_gradients(x, y, LOSS)
        call = be.capture(lambda xs, ys: model.compute_gradients(xs, ys, LOSS), (x, y))
        assert call.workspaces == be.workspaces() and len(call.workspaces) == 2
        assert call.workspaces[0] is be.conv.workspace.buf and call.workspaces[1] is be.cublas.workspace


def test_a_workspace_grown_after_a_capture_retires_its_buffer_to_the_graph(monkeypatch):
    with gpu_standin.active() as cp:
        be = _gpu()
        model = _model(be)
        x, y = _batch(be, 4, 0)
        with be.capture_warmup():
            model.compute_gradients(x, y, LOSS)
        state = model.state_arrays()
        call = be.capture(lambda xs, ys: model.compute_gradients(xs, ys, LOSS), (x, y))
        captured = be.conv.workspace.buf
        ptr, nbytes = captured.data.ptr, captured.nbytes
        del captured

        # an eager step at another batch size whose convolutions need more workspace: it grows
        monkeypatch.setattr(fake_cudnn, "WORKSPACE_BYTES", 2 * nbytes)
        _step(model, *_batch(be, 3, 1))
        monkeypatch.undo()
        assert be.conv.workspace.nbytes > nbytes and be.conv.workspace.buf.data.ptr != ptr

        # the replay (the stand-in refuses one that uses memory freed since its capture) equals an eager step
        # of the same batch from the same state
        model.load_state_arrays(state)
        value, _ = call.replay((x, y))
        replayed = float(value), model.grads.get()
        model.load_state_arrays(state)
        eager = _step(model, x, y)
        assert replayed[0] == eager[0]
        np.testing.assert_array_equal(replayed[1], eager[1])

        assert _live(ptr, nbytes)                           # retired to the graph, not freed
        fresh = [cp.empty(nbytes // 8, dtype=cp.float64) for _ in range(8)]
        assert not any(ptr <= a.data.ptr < ptr + nbytes for a in fresh)       # and given to no new array

        del call                                            # the last graph that holds it: freed
        gc.collect()
        assert not _live(ptr, nbytes)


def test_a_workspace_grown_inside_a_capture_makes_it_capture_again(monkeypatch):
    with gpu_standin.active():
        be = _gpu()
        model = _model(be)
        x, y = _batch(be, 4, 0)
        model.compute_gradients(x, y, LOSS)     # plans built: the next records' needs come from the stand-in
        first = be.conv.workspace.buf
        state = model.state_arrays()
        x3, y3 = _batch(be, 3, 1)               # a batch size not seen yet: its plans are built in the capture
        monkeypatch.setattr(fake_cudnn, "WORKSPACE_BYTES", 2 * first.nbytes)
        captures = []                           # the workspace buffer at the start of each capture

        def step(xs, ys):
            captures.append(be.conv.workspace.buf)
            return model.compute_gradients(xs, ys, LOSS)
        call = be.capture(step, (x3, y3))
        monkeypatch.undo()
        assert len(captures) == 2 and captures[0] is first and captures[1] is not first
        assert call.workspaces[0] is be.conv.workspace.buf is captures[1]
        model.load_state_arrays(state)
        monkeypatch.setattr(fake_cudnn, "WORKSPACE_BYTES", 2 * first.nbytes)
        eager = _step(model, x3, y3)
        monkeypatch.undo()
        model.load_state_arrays(state)
        value, _ = call.replay((x3, y3))
        assert float(value) == eager[0]
        np.testing.assert_array_equal(model.grads.get(), eager[1])
