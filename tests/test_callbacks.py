"""Keras-style callbacks (pydtnn.callbacks) on the one training loop that Model.fit and the launcher share."""
import numpy as np
import pytest

from pydtnn import Model
from pydtnn.callbacks import HOOKS, Callback
from pydtnn.layers import FC, Input
from pydtnn.optimizers import SGD
from pydtnn.schedulers import Scheduler


def _tiny_model(dtype="float64"):
    m = Model(dtype=dtype, seed=0)
    m.add(Input(shape=(4,)))
    m.add(FC(shape=(3,), activation="softmax"))
    return m


def _data(n=20):
    rng = np.random.default_rng(2)
    return rng.standard_normal((n, 4)), rng.integers(0, 3, n)


class Everything(Callback):
    def __init__(self):
        self.calls = []

    def on_train_begin(self, trainer):
        self.calls.append(("train_begin",))

    def on_train_end(self, trainer):
        self.calls.append(("train_end",))

    def on_epoch_begin(self, trainer, epoch):
        self.calls.append(("epoch_begin", epoch))

    def on_epoch_end(self, trainer, epoch, logs):
        self.calls.append(("epoch_end", epoch, dict(logs)))

    def on_batch_begin(self, trainer, step):
        self.calls.append(("batch_begin", step))

    def on_batch_end(self, trainer, step, logs):
        self.calls.append(("batch_end", step, dict(logs)))


def test_base_class_hooks_are_no_ops_and_schedulers_are_callbacks():
    base = Callback()
    for hook in HOOKS:
        assert hasattr(base, hook)
    base.on_train_begin(None), base.on_epoch_end(None, 0, {}), base.on_batch_end(None, 0, {})
    assert issubclass(Scheduler, Callback)


def test_all_six_hooks_in_order_with_per_step_logs():
    x, y = _data()                                   # 20 samples, batch 8: steps of 8, 8, 4
    cb = Everything()
    history = _tiny_model().fit(x, y, epochs=2, batch_size=8, optimizer=SGD(learning_rate=0.1), callbacks=[cb])
    kinds = [c[0] if c[0].startswith("train") else c[:2] for c in cb.calls]
    per_epoch = lambda e: [("epoch_begin", e)] + [p for s in range(3 * e, 3 * e + 3)
                                                  for p in (("batch_begin", s), ("batch_end", s))] + [("epoch_end", e)]
    assert kinds == ["train_begin"] + per_epoch(0) + per_epoch(1) + ["train_end"]
    batch_logs = [c[2] for c in cb.calls if c[0] == "batch_end"]
    assert all(logs["learning_rate"] == 0.1 for logs in batch_logs)
    assert [logs["batch_size"] for logs in batch_logs] == [8, 8, 4, 8, 8, 4]
    # the epoch's loss is the sample-weighted mean of its steps' global-batch losses; float64 sums of
    # three terms of size ~1: a few ulps
    for e in range(2):
        steps = batch_logs[3 * e:3 * e + 3]
        mean = sum(s["loss"] * s["batch_size"] for s in steps) / 20
        assert mean == pytest.approx(history["loss"][e], rel=1e-14)
    epoch_logs = [c[2] for c in cb.calls if c[0] == "epoch_end"]
    assert [logs["loss"] for logs in epoch_logs] == history["loss"]
    assert all("learning_rate" in logs for logs in epoch_logs)


class OnlyEpochEnd:                                  # a Keras-like object, no base class, one hook
    def __init__(self):
        self.epochs = []

    def on_epoch_end(self, trainer, epoch, logs):
        self.epochs.append(epoch)
        if epoch == 1:
            trainer.stop_training = True


class OnlyBatchEnd:
    def __init__(self):
        self.losses = []

    def on_batch_end(self, trainer, step, logs):
        self.losses.append(logs["loss"])


def test_objects_with_only_some_hooks():
    x, y = _data()
    a, b = OnlyEpochEnd(), OnlyBatchEnd()
    history = _tiny_model().fit(x, y, epochs=5, batch_size=10, callbacks=[a, b])
    assert a.epochs == [0, 1] and len(history["loss"]) == 2          # stop_training after epoch 2
    assert len(b.losses) == 4 and all(np.isfinite(b.losses))
