"""A user's callback keeps its state across a resume (`Callback.state_dict` / `load_state_dict`, saved in the
training checkpoint under the callback's `state_key`), as Lightning's callbacks do."""
import numpy as np
import pytest

from pydtnn import Model
from pydtnn.callbacks import Callback, state_keys
from pydtnn.datasets import from_arrays
from pydtnn.errors import CheckpointError
from pydtnn.layers import FC, Input
from pydtnn.optimizers import SGD
from pydtnn.training.checkpointing import read_meta
from pydtnn.training.loop import Trainer


class LossTally(Callback):
    """Counts the steps it saw and sums their losses: a resumed run must go on from the saved numbers."""

    def __init__(self):
        self.steps, self.total = 0, 0.0

    def on_batch_end(self, trainer, step, logs):
        self.steps += 1
        self.total += logs["loss"]

    def state_dict(self):
        return {"steps": self.steps, "total": self.total}

    def load_state_dict(self, state):
        self.steps, self.total = int(state["steps"]), float(state["total"])


class Picky(LossTally):
    def load_state_dict(self, state):
        raise ValueError("not my state")


def _trainer(callbacks):
    m = Model(dtype="float64", seed=0)
    m.add(Input(shape=(3,)))
    m.add(FC(shape=(2,), activation="softmax"))
    rng = np.random.default_rng(1)
    data = from_arrays(rng.standard_normal((24, 3)), np.eye(2)[rng.integers(0, 2, 24)])
    return Trainer(m, data, SGD(learning_rate=0.1), global_batch=8, seed=2, callbacks=callbacks,
                   progress=False, log=lambda line: None)


def test_a_stateful_callback_goes_on_after_a_resume(tmp_path):
    straight = [LossTally(), LossTally()]
    _trainer(straight).fit(3)
    first = [LossTally(), LossTally()]
    t = _trainer(first)
    t.fit(1)
    path = str(tmp_path / "epoch_0001.npz")
    t.save_checkpoint(path, 1)
    assert read_meta(path)["callbacks"] == {"LossTally": first[0].state_dict(), "LossTally#2": first[1].state_dict()}
    again = [LossTally(), LossTally()]
    resumed = _trainer(again)
    resumed.resume(path)
    resumed.fit(3)
    assert [c.steps for c in again] == [c.steps for c in straight] == [9, 9]     # 3 steps a epoch, 3 epochs
    for a, b in zip(again, straight):
        assert a.total == b.total         # resume is bit-exact: the same float64 losses, added in the same order
    assert state_keys([LossTally(), Picky(), LossTally()]) == ["LossTally", "Picky", "LossTally#2"]


def test_a_checkpoint_without_a_callbacks_state_starts_it_fresh(tmp_path):
    t = _trainer([])                       # a run with no callbacks: its checkpoint has none to give
    t.fit(1)
    path = str(tmp_path / "c.npz")
    t.save_checkpoint(path, 1)
    assert read_meta(path)["callbacks"] == {}
    fresh = LossTally()
    _trainer([fresh]).resume(path)
    assert (fresh.steps, fresh.total) == (0, 0.0)


def test_a_state_the_callback_refuses_is_one_line_naming_it(tmp_path):
    t = _trainer([LossTally()])
    t.fit(1)
    path = str(tmp_path / "c.npz")
    t.save_checkpoint(path, 1)
    picky = Picky()
    picky.state_key = "LossTally"          # the same key, another class that refuses it
    with pytest.raises(CheckpointError, match=r"'callbacks.LossTally' refused by the callback: ValueError: "
                                              r"not my state") as e:
        _trainer([picky]).resume(path)
    assert "\n" not in str(e.value)
