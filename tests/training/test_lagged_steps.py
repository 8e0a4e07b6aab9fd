"""A GPU run's steps read a step late (`pydtnn.parallel.lagged_step`): the host never waits for the device
inside a step, and nothing else changes. Over the stand-in of CuPy/cuDNN (executing), one replica:
- every step's logs, the epoch rows and the weights equal those of the same run read at each step's end, bit
  for bit (BatchNorm's running statistics and a dropout stream included); only on_batch_end(k) comes after
  on_batch_begin(k + 1);
- a checkpoint inside an epoch holds whole steps: resumed, the run ends on the uninterrupted run's weights;
- a non-finite loss still stops the training, one step later;
- the CPU backend, whose work is done as it is called, reads at once; several replicas cannot lag.
"""
import numpy as np
import pytest

import gpu_standin
from pydtnn import Model
from pydtnn.callbacks import Callback
from pydtnn.datasets import from_arrays
from pydtnn.errors import ConfigError, NumericalError
from pydtnn.layers import FC, BatchNormalization, Conv2D, Dropout, Flatten, Input, Relu
from pydtnn.activations import Softmax
from pydtnn.optimizers import SGD
from pydtnn.parallel.comm import SerialComm
from pydtnn.training.loop import Trainer


class Steps(Callback):
    """Every callback call in order, with the numbers each step's logs give."""

    def __init__(self, poison_at=None, model=None):
        self.calls, self.poison_at, self.model = [], poison_at, model

    def on_batch_begin(self, trainer, step):
        self.calls.append(("begin", step))
        if step == self.poison_at:              # this step's forward gives a non-finite loss
            self.model.params[...] = np.nan

    def on_batch_end(self, trainer, step, logs):
        self.calls.append(("end", step, logs["loss"], logs["categorical_accuracy"], logs["rank0_b"]))


def _data():
    rng = np.random.default_rng(0)
    return from_arrays(rng.standard_normal((40, 1, 8, 8)), rng.integers(0, 5, 40))


def _model(backend):
    model = Model(backend=backend, seed=0)
    for layer in (Input(shape=(1, 8, 8)), Conv2D(4, (3, 3), padding=1), BatchNormalization(), Relu(),
                  Dropout(0.3), Flatten(), FC(5), Softmax()):
        model.add(layer)
    return model


def _gpu():
    from pydtnn.backends.gpu.backend import GPUBackend
    return GPUBackend(dtype="float64", seed=0, auto_conv_alg=False, deterministic=True)


def fit(model, data, callback, epochs, resume=None, **options):
    """`epochs` epochs of steps of 4 samples, SGD with momentum, seed 3 (resumed from `resume` if given);
    returns (the trainer, every state array). Shared with tests/training/test_cuda_graphs.py."""
    trainer = Trainer(model, data, SGD(learning_rate=0.05, momentum=0.9), global_batch=4, progress=False,
                      seed=3, callbacks=[callback], **options)
    if resume is not None:
        trainer.resume(resume)
    trainer.fit(epochs)
    return trainer, {k: np.array(v) for k, v in model.state_arrays().items()}


def _train(lagged, epochs=2, backend=_gpu, resume=None, **options):
    """A run of `epochs` epochs of 10 steps; returns (trainer, the callback's record, every state array)."""
    model = _model(backend())
    steps = Steps(model=model)
    trainer, state = fit(model, _data(), steps, epochs, resume, lagged_reads=lagged, **options)
    return trainer, steps, state


def epoch_rows(trainer):
    """The trainer's epoch rows without their timings (which differ run to run)."""
    timing = ("time_s", "samples_per_s", "rank0_compute_s", "rank0_wait_s")
    return [{k: v for k, v in row.items() if k not in timing} for row in trainer.history]


def same(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_lagged_steps_train_exactly_as_steps_read_at_their_end():
    with gpu_standin.active():
        lag, lag_steps, lag_state = _train(None)          # the default on a GPU with one replica: lagged
        now, now_steps, now_state = _train(False)
    assert lag.lagged and not now.lagged
    assert sorted(lag_steps.calls) == sorted(now_steps.calls)        # every step's numbers, bit for bit
    ends = [c for c in now_steps.calls if c[0] == "end"]
    assert [c for c in lag_steps.calls if c[0] == "end"] == ends and len(ends) == 2 * 10
    # read at its end, a step's on_batch_end comes before the next's on_batch_begin; lagged, after it (but
    # the epoch's last step is read before the epoch ends)
    assert [c[:2] for c in now_steps.calls[:4]] == [("begin", 0), ("end", 0), ("begin", 1), ("end", 1)]
    assert [c[:2] for c in lag_steps.calls[:5]] == [("begin", 0), ("begin", 1), ("end", 0), ("begin", 2), ("end", 1)]
    assert [c[:2] for c in lag_steps.calls[17:21]] == [("begin", 9), ("end", 8), ("end", 9), ("begin", 10)]
    assert epoch_rows(lag) == epoch_rows(now)
    same(lag_state, now_state)


def test_a_lagged_run_checkpointed_inside_an_epoch_resumes_on_the_same_weights(tmp_path):
    with gpu_standin.active():
        _, _, full = _train(None, checkpoint_dir=str(tmp_path / "a"), save_steps=7)
        first, _, _ = _train(None, epochs=1, checkpoint_dir=str(tmp_path / "b"), save_steps=7)
        assert first.lagged
        mid = tmp_path / "b" / "epoch_0000_step_000007.npz"
        assert mid.exists(), sorted(p.name for p in (tmp_path / "b").iterdir())
        _, resumed_steps, resumed = _train(None, checkpoint_dir=str(tmp_path / "c"), resume=str(mid))
    assert resumed_steps.calls[0] == ("begin", 7)
    same(full, resumed)


@pytest.mark.parametrize("lagged", [True, False])
def test_a_non_finite_loss_stops_the_training_one_step_later_when_lagged(lagged):
    with gpu_standin.active():
        model = _model(_gpu())
        steps = Steps(poison_at=4, model=model)
        trainer = Trainer(model, _data(), SGD(learning_rate=0.05), global_batch=4, progress=False, seed=3,
                          callbacks=[steps], lagged_reads=lagged)
        with pytest.raises(NumericalError, match="at epoch 1, step 5: training diverged"):
            trainer.fit(1)
    begun = [c[1] for c in steps.calls if c[0] == "begin"]
    ended = [c[1] for c in steps.calls if c[0] == "end"]
    assert ended == [0, 1, 2, 3]                     # the poisoned step's numbers never reach the callbacks
    assert begun == ([0, 1, 2, 3, 4, 5] if lagged else [0, 1, 2, 3, 4])


def test_the_cpu_reads_each_step_at_its_end_and_several_replicas_cannot_lag():
    from pydtnn.backends import get_backend
    trainer, _, _ = _train(None, epochs=1, backend=lambda: get_backend("cpu", dtype="float64"))
    assert not trainer.lagged

    class TwoRanks(SerialComm):             # what the Trainer is told (nothing is reduced before the refusal)
        size = 2
    with pytest.raises(ConfigError, match="lagged_reads needs one replica"):
        Trainer(_model(get_backend("cpu", dtype="float64")), _data(), SGD(learning_rate=0.05), global_batch=4,
                progress=False, comm=TwoRanks(), lagged_reads=True)
