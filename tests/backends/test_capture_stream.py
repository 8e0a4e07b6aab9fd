"""Capture as PyTorch does (`pydtnn.backends.gpu.graphs`), over the host stand-in of CuPy/cuDNN/cuBLAS.

PyTorch (torch/cuda/graphs.py) keeps one side stream for its captures (`graph.default_capture_stream`, made
once) and runs `make_graphed_callables`' warm-up on the stream it then captures on ("hipBLASLt handles are
per-(device, stream) on ROCm and lazily created. Need to use the same stream for warmup and capture to avoid
capture errors"; "prevents cudnn benchmarking and other lazy-initialization cuda work from ending up in any
captures"). So here:
- a backend captures on ONE stream, made once and reused by every capture and warm-up; never the legacy
  stream (CuPy, cupy/cuda/stream.pyx `begin_capture`: "cannot capture on the default (legacy) stream");
- the last warm-up step (`capture_warmup()`) runs on that stream, after what the current stream queued before
  and before what it queues after (an event each way: CUDA Programming Guide, "Cross-stream Dependencies and
  Events"); cuDNN's handle is set to that stream there, before the capture;
- every kernel a step launches, the generator's graph kernels included, is loaded before `begin_capture`;
- the warm-up step draws the eager step's random numbers and computes its bits.
"""
import numpy as np

import gpu_standin
from gpu_standin import fake_cupy
from pydtnn import Model
from pydtnn.activations import Softmax
from pydtnn.layers import FC, BatchNormalization, Conv2D, Dropout, Flatten, Input, Relu
from pydtnn.losses import get_loss

LOSS = get_loss("categorical_cross_entropy")


def _model(backend):
    model = Model(backend=backend, seed=0)
    for layer in (Input(shape=(1, 8, 8)), Conv2D(4, (3, 3), padding=1), BatchNormalization(), Relu(), Dropout(0.3),
                  Flatten(), FC(5), Softmax()):
        model.add(layer)
    return model


def _gpu():
    from pydtnn.backends.gpu.backend import GPUBackend
    return GPUBackend(dtype="float64", seed=0, auto_conv_alg=False, deterministic=True)


def _batch(backend, n, seed=0):
    rng = np.random.default_rng(seed)
    return backend.asarray(rng.standard_normal((n, 1, 8, 8))), backend.asarray(np.eye(5)[rng.integers(0, 5, n)])


def test_one_capture_stream_per_backend_serves_the_last_warm_up_and_every_capture():
    with gpu_standin.active() as cp:
        be = _gpu()
        model = _model(be)
        seen = []                   # (what, current stream, the stream cuDNN's handle runs on)

        def step(what):
            def run(x, y):
                out = model.compute_gradients(x, y, LOSS)
                seen.append((what, cp.cuda.get_current_stream().ptr, be.conv.frontend.handle.stream))
                return out
            return run
        for n in (4, 3):
            x, y = _batch(be, n)
            with be.capture_warmup():
                step("warm-up")(x, y)
            be.capture(step("capture"), (x, y))
        other = _gpu()
        with other.capture_warmup():
            _model(other).compute_gradients(*_batch(other, 4), LOSS)
            elsewhere = cp.cuda.get_current_stream().ptr
    assert [w for w, _, _ in seen] == ["warm-up", "capture"] * 2
    streams = {s for _, s, _ in seen}
    assert len(streams) == 1 and streams.isdisjoint({0, 1}), seen       # one stream, not the legacy one
    assert all(handle == s for _, s, handle in seen)                    # cuDNN runs there from the warm-up on
    assert elsewhere not in streams                                     # each backend its own


def test_the_warm_up_orders_with_the_current_stream_both_ways():
    with gpu_standin.active() as cp:
        be = _gpu()
        model = _model(be)
        x, y = _batch(be, 4)
        fake_cupy.CALLS.clear()
        with be.capture_warmup():
            inside = cp.cuda.get_current_stream().ptr
            model.compute_gradients(x, y, LOSS)
        calls = [c for c in fake_cupy.CALLS if c[0] in ("record", "wait_event")]
    current = 0                                         # the legacy stream: the test's current one
    (r1, s1, e1), (w1, t1, f1) = calls[0], calls[1]
    (r2, s2, e2), (w2, t2, f2) = calls[-2], calls[-1]
    assert (r1, s1, w1, t1) == ("record", current, "wait_event", inside) and e1 == f1      # waits for before
    assert (r2, s2, w2, t2) == ("record", inside, "wait_event", current) and e2 == f2      # after waits for it


def test_every_kernel_a_step_launches_is_loaded_before_its_capture():
    with gpu_standin.active():
        be = _gpu()
        model = _model(be)
        x, y = _batch(be, 4)
        with be.capture_warmup():
            model.compute_gradients(x, y, LOSS)
        loaded = []

        def step(xs, ys):
            loaded.append(set(be._fns))
            out = model.compute_gradients(xs, ys, LOSS)
            loaded.append(set(be._fns))
            return out
        be.capture(step, (x, y))
    assert loaded[0] == loaded[1]                               # nothing loaded inside the capture
    assert {"uniform_fill_at", "rng_base_set"} <= loaded[0]     # the generator's graph kernels included


def test_a_capture_without_a_warm_up_still_loads_the_generators_graph_kernels_first():
    with gpu_standin.active():
        be = _gpu()
        model = _model(be)
        x, y = _batch(be, 4)
        model.compute_gradients(x, y, LOSS)                     # eager, on the current stream
        offset, loaded = be.rng.offset, []

        def step(xs, ys):
            loaded.append(set(be._fns))
            return model.compute_gradients(xs, ys, LOSS)
        be.capture(step, (x, y))
    assert {"uniform_fill_at", "rng_base_set"} <= loaded[0] and be.rng.offset == offset     # nothing drawn


def test_the_warm_up_step_is_the_eager_step():
    with gpu_standin.active():
        be = _gpu()
        model = _model(be)
        x, y = _batch(be, 4)
        model.compute_gradients(x, y, LOSS)
        state, offset = model.state_arrays(), be.rng.offset
        value, y_pred = model.compute_gradients(x, y, LOSS)
        eager = (float(value), y_pred.get(), model.grads.get(), model.state_arrays(), be.rng.offset)
        model.load_state_arrays(state)
        be.rng.offset = offset
        with be.capture_warmup():
            value, y_pred = model.compute_gradients(x, y, LOSS)
        warm = (float(value), y_pred.get(), model.grads.get(), model.state_arrays(), be.rng.offset)
    assert eager[4] > offset and warm[4] == eager[4]            # a dropout mask drawn, the same count
    assert warm[0] == eager[0]
    np.testing.assert_array_equal(warm[1], eager[1])
    np.testing.assert_array_equal(warm[2], eager[2])
    for key, value in eager[3].items():
        np.testing.assert_array_equal(warm[3][key], value, err_msg=key)
