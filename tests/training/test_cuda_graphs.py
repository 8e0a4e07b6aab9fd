"""--cuda_graphs (`pydtnn.parallel.step_graphs`, `pydtnn.backends.gpu.graphs`): a step's forward and backward
captured once as a CUDA graph and replayed. Over the stand-in of CuPy/cuDNN, which models capture as a real
device does (`tests/gpu_standin/graphs.py`): a capture runs nothing, a replay reruns the recorded kernels on
the same memory with the arguments they were captured with, and a wait, a read to the host or an allocation
from the shared pool inside a capture fails it. So a host value baked into the graph that should change
between steps (the dropout stream's offset) shows up as a run that differs from the eager one.
- graphed training equals eager training bit for bit (every step's logs, the epoch rows, the weights, the
  running statistics), with dropout, BatchNorm and an epoch's shorter last batch (run eagerly), and the
  steps did replay;
- a checkpoint inside an epoch resumes onto the uninterrupted graphed run's weights;
- a step that cannot be captured (a layer that reads the device inside forward) turns graphs off with one
  notice, and the run still equals the eager one;
- where graphs cannot work the Trainer and the launcher refuse before any work.
"""
import numpy as np
import pytest

import gpu_standin
from pydtnn import Model
from pydtnn.activations import Softmax
from pydtnn.backends import available_backends
from pydtnn.callbacks import Callback
from pydtnn.datasets import from_arrays
from pydtnn.errors import ConfigError
from pydtnn.layers import FC, BatchNormalization, Conv2D, Dropout, Flatten, Input, Relu
from pydtnn.layers.base import Layer
from pydtnn.optimizers import SGD
from pydtnn.parallel.comm import SerialComm
from pydtnn.training.loop import Trainer
from paths import sibling

LAGGED = sibling("training", "test_lagged_steps")     # its run of the Trainer and its comparison of states


class Steps(Callback):
    def __init__(self):
        self.ends = []

    def on_batch_end(self, trainer, step, logs):
        self.ends.append((step, logs["loss"], logs["categorical_accuracy"]))


class ReadsTheDevice(Layer):
    """An identity layer that reads a device value to the host in forward: a step with it cannot be captured."""

    def forward(self, x, training=False):
        self.seen = float(x.sum())
        return x

    def backward(self, dy):
        return dy


def _data(n=42):            # 10 steps of 4 and a last one of 2 (run eagerly: another shape)
    rng = np.random.default_rng(0)
    return from_arrays(rng.standard_normal((n, 1, 8, 8)), rng.integers(0, 5, n))


def _model(backend, extra=()):
    model = Model(backend=backend, seed=0)
    for layer in (Input(shape=(1, 8, 8)), Conv2D(4, (3, 3), padding=1), BatchNormalization(), Relu(), *extra,
                  Dropout(0.3), Flatten(), FC(5), Softmax()):
        model.add(layer)
    return model


def _gpu():
    from pydtnn.backends.gpu.backend import GPUBackend
    return GPUBackend(dtype="float64", seed=0, auto_conv_alg=False, deterministic=True)


def _train(graphs, epochs=2, resume=None, extra=(), log=None, **options):
    model = _model(_gpu(), extra)
    steps = Steps()
    trainer, state = LAGGED.fit(model, _data(), steps, epochs, resume, cuda_graphs=graphs, log=log, **options)
    return trainer, steps, state


_same, _rows = LAGGED.same, LAGGED.epoch_rows


def test_graphed_steps_train_exactly_as_eager_steps():
    with gpu_standin.active():
        graphed, graphed_steps, graphed_state = _train(True)
        eager, eager_steps, eager_state = _train(False)
    graphs = graphed.dp.graphs
    assert eager.dp.graphs is None
    # 2 epochs of 11 steps: the 10 of 4 samples each epoch, the first 2 warm up, the 3rd is captured, then
    # every one replays; the shorter last steps run eagerly
    assert (graphs.captures, graphs.replays) == (1, 18)
    assert len(graphed_steps.ends) == 22 and graphed_steps.ends == eager_steps.ends   # every step, bit for bit
    assert _rows(graphed) == _rows(eager)
    _same(graphed_state, eager_state)
    assert any(k.endswith("/var") for k in graphed_state)       # BatchNorm's running statistics compared


def test_the_last_warm_up_step_runs_as_the_capture_will_just_before_it(monkeypatch):
    """PyTorch's order (torch/cuda/graphs.py, `make_graphed_callables`): the warm-up runs on the stream the capture
    then uses. Of the WARMUP eager steps of a shape, the last runs inside `capture_warmup()` (on the backend's
    capture stream: tests/backends/test_capture_stream.py), and the capture follows it."""
    from pydtnn.backends.gpu.backend import GPUBackend
    from pydtnn.parallel.step_graphs import WARMUP
    order = []
    warmup, capture = GPUBackend.capture_warmup, GPUBackend.capture

    def spied_warmup(self):
        order.append("warm-up")
        return warmup(self)

    def spied_capture(self, fn, inputs):
        order.append("capture")
        return capture(self, fn, inputs)
    monkeypatch.setattr(GPUBackend, "capture_warmup", spied_warmup)
    monkeypatch.setattr(GPUBackend, "capture", spied_capture)
    with gpu_standin.active():
        graphed, graphed_steps, _ = _train(True, epochs=1)
        _, eager_steps, _ = _train(False, epochs=1)
    assert WARMUP >= 1 and order == ["warm-up", "capture"]
    assert (graphed.dp.graphs.captures, graphed.dp.graphs.replays) == (1, 10 - WARMUP)
    assert graphed_steps.ends == eager_steps.ends


def test_a_graphed_run_checkpointed_inside_an_epoch_resumes_on_the_same_weights(tmp_path):
    with gpu_standin.active():
        _, _, full = _train(True, checkpoint_dir=str(tmp_path / "a"), save_steps=7)
        _train(True, epochs=1, checkpoint_dir=str(tmp_path / "b"), save_steps=7)
        mid = tmp_path / "b" / "epoch_0000_step_000007.npz"
        assert mid.exists(), sorted(p.name for p in (tmp_path / "b").iterdir())
        resumed_trainer, _, resumed = _train(True, checkpoint_dir=str(tmp_path / "c"), resume=str(mid))
    assert resumed_trainer.dp.graphs.replays > 0
    _same(full, resumed)


def test_a_step_that_cannot_be_captured_runs_eagerly_after_one_notice():
    said = []
    with gpu_standin.active():
        trainer, steps, state = _train(True, extra=(ReadsTheDevice(),), log=said.append)
        _, eager_steps, eager_state = _train(False, extra=(ReadsTheDevice(),))
    graphs = trainer.dp.graphs
    assert (graphs.captures, graphs.replays) == (0, 0) and graphs.off
    notices = [line for line in said if "CUDA graphs off" in line]
    assert len(notices) == 1 and "could not be captured" in notices[0] and "\n" not in notices[0], said
    assert steps.ends == eager_steps.ends
    _same(state, eager_state)


def test_a_token_id_out_of_range_in_a_replayed_step_is_still_one_line():
    """Embedding reads its ids' range to the host, which a capture cannot hold: captured, it leaves the check
    to the training loop, which checks each batch's ids on the host before they go to the device. So a byte
    model's step captures, and an id out of range in a step that replays a graph is the eager run's one line."""
    from pydtnn.errors import DatasetError
    from pydtnn.layers import Embedding
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 6, (40, 5))
    data = from_arrays(ids, (ids + 1) % 6)
    takes, take = [], data.train.take

    def take_with_a_bad_id_in_the_sixth_batch(indices, epoch=None):
        x, y = take(indices, epoch=epoch)
        takes.append(len(indices))
        if len(takes) == 6:
            x = x.copy()
            x[-1, 2] = 6
        return x, y
    data.train.take = take_with_a_bad_id_in_the_sixth_batch
    with gpu_standin.active():
        model = Model(backend=_gpu(), seed=0)
        for layer in (Input(shape=(5,), dtype="int64"), Embedding(6, 8), FC(6), Softmax()):
            model.add(layer)
        trainer = Trainer(model, data, SGD(learning_rate=0.05), global_batch=4, progress=False, seed=3,
                          cuda_graphs=True)
        with pytest.raises(DatasetError, match=r"token id 6 is outside \[0, 6\)") as e:
            trainer.fit(1)
    assert "\n" not in str(e.value)
    graphs = trainer.dp.graphs
    assert graphs.off is None and graphs.captures == 1 and graphs.replays >= 1, graphs.summary()


def test_graphs_are_refused_where_they_cannot_work():
    from pydtnn.backends import get_backend

    def trainer(backend, comm=None, **options):
        return Trainer(_model(backend), _data(), SGD(learning_rate=0.05), global_batch=4, progress=False,
                       comm=comm, cuda_graphs=True, **options)
    with pytest.raises(ConfigError, match="needs a replica on a GPU"):
        trainer(get_backend("cpu", dtype="float64"))

    class TwoRanks(SerialComm):             # what the Trainer is told (nothing is reduced before the refusal)
        size = 2
    with gpu_standin.active():
        with pytest.raises(ConfigError, match="--sync_batchnorm"):
            trainer(_gpu(), comm=TwoRanks(), sync_batchnorm=True, lagged_reads=False)
        with pytest.raises(ConfigError, match="--profile_layers"):
            trainer(_gpu(), profile_layers=True)


def test_the_graph_draws_the_numbers_the_eager_generator_draws():
    """`uniform_fill_at` (key and offset from a device pair, plus the draws before it) gives the numbers
    `uniform_fill` gives at that offset: a replay's dropout masks are the eager run's."""
    with gpu_standin.active() as cp:
        be = _gpu()
        be.rng.offset = 1000
        eager = be.rng.random((3, 7)).get()
        after = be.rng.random(5).get()
        be.rng.offset = 1000
        base = cp.zeros(2, dtype=cp.uint64)
        be.rng.set_base(base)
        be.rng.offset = 0                       # what the pair holds is what counts
        with be.rng.drawing_from(base) as drawn:
            first = be.rng.random((3, 7))
            second = be.rng.random(5)
        assert drawn == [26] and be.rng.offset == 0
        np.testing.assert_array_equal(first.get(), eager)
        np.testing.assert_array_equal(second.get(), after)


@pytest.mark.skipif("gpu" not in available_backends(),
                    reason="no GPU visible (the stand-in tests above run everywhere; the device check runs this)")
def test_gpu_graphed_steps_train_exactly_as_eager_steps_on_the_device():
    """On a real GPU (scripts/gpu_check.sh's conformance stage): the same run as the stand-in test above. Both
    runs take the same deterministic cuDNN plans and our deterministic kernels, so a replay must give the
    eager step's bits."""
    graphed, graphed_steps, graphed_state = _train(True)
    eager, eager_steps, eager_state = _train(False)
    graphs = graphed.dp.graphs
    assert graphs.off is None, graphs.off
    assert (graphs.captures, graphs.replays) == (1, 18)
    assert graphed_steps.ends == eager_steps.ends and _rows(graphed) == _rows(eager)
    _same(graphed_state, eager_state)


def test_a_capture_replays_the_eager_pass_and_returns_the_cached_memory():
    """`Backend.capture` alone: a replay from the generator's state of an eager pass computes that pass's loss
    and gradients bit for bit (its dropout mask included), and after the capture the blocks the eager passes
    left cached in the default pool are given back (the graph's own pool holds a step's activations)."""
    from pydtnn.losses import get_loss
    loss = get_loss("categorical_cross_entropy")
    with gpu_standin.active() as cp:
        be = _gpu()
        model = _model(be)
        rng = np.random.default_rng(1)
        x = be.asarray(rng.standard_normal((4, 1, 8, 8)))
        y = be.asarray(np.eye(5)[rng.integers(0, 5, 4)])
        params = model.params.copy()
        model.compute_gradients(x, y, loss)
        offset = be.rng.offset
        value, _ = model.compute_gradients(x, y, loss)
        eager_value, eager_grads, drawn = float(value), model.grads.get(), be.rng.offset - offset
        assert drawn > 0                                # a dropout mask was drawn
        pool = cp.get_default_memory_pool()
        assert pool.n_free_blocks() > 0
        call = be.capture(lambda xs, ys: model.compute_gradients(xs, ys, loss), (x, y))
        assert pool.n_free_blocks() == 0 and be.rng.offset == offset + drawn      # a capture draws nothing
        model.grads[...] = 0
        be.rng.offset = offset
        value, _ = call.replay((x, y))
        assert be.rng.offset == offset + drawn
        assert float(value) == eager_value
        np.testing.assert_array_equal(model.grads.get(), eager_grads)
        np.testing.assert_array_equal(model.params.get(), params.get())     # forward and backward only
