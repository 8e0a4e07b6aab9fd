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


def test_user_callbacks_run_before_the_loops_own_in_the_documented_order(tmp_path, capsys, monkeypatch):
    """The order in pydtnn.callbacks: a user's on_batch_end before the progress bar counts the step; a user's
    on_epoch_end before the epoch's row is recorded and written; a user's saves_files callback after both."""
    import csv
    import sys

    from pydtnn.datasets import from_arrays
    from pydtnn.training.loop import Trainer
    monkeypatch.setenv("PYDTNN_PROGRESS_INTERVAL_S", "0")       # a plain progress line at every counted step
    history_file = tmp_path / "h.csv"
    rows_on_disk = lambda: len(list(csv.DictReader(open(history_file)))) if history_file.exists() else 0  # noqa: E731
    seen = []

    class Reader(Callback):
        def on_batch_end(self, trainer, step, logs):
            print(f"user batch {step}", file=sys.stderr, flush=True)

        def on_epoch_end(self, trainer, epoch, logs):
            seen.append(("reader", epoch, len(trainer.history), rows_on_disk()))

    class Saver(Callback):
        saves_files = True

        def on_epoch_end(self, trainer, epoch, logs):
            seen.append(("saver", epoch, len(trainer.history), rows_on_disk()))

    x, y = _data()                                   # 20 samples, batch 8: 3 steps per epoch
    model = _tiny_model()
    trainer = Trainer(model, from_arrays(x, y), SGD(learning_rate=0.1), global_batch=8, progress=True,
                      history_file=str(history_file), log=lambda m: None, callbacks=[Saver(), Reader()])
    trainer.fit(2)
    # given as [Saver, Reader]: the Reader (no files) still runs first, before the row exists anywhere
    assert seen == [("reader", 0, 0, 0), ("saver", 0, 1, 1), ("reader", 1, 1, 1), ("saver", 1, 2, 2)]
    err = capsys.readouterr().err.splitlines()
    # the plain bar prints after counting steps 1 and 2 of 3 (not at the total): each after the user's line
    bar = [i for i, line in enumerate(err) if line.startswith(("epoch 1/2: step", "epoch 2/2: step"))]
    user = [i for i, line in enumerate(err) if line.startswith("user batch")]
    assert [err[i].split(",")[0] for i in bar] == ["epoch 1/2: step 1/3 (33%)", "epoch 1/2: step 2/3 (67%)",
                                                  "epoch 2/2: step 1/3 (33%)", "epoch 2/2: step 2/3 (67%)"]
    assert len(user) == 6 and [u < b for u, b in zip(user[0:2] + user[3:5], bar)] == [True] * 4
    assert [b < u for b, u in zip(bar, user[1:3] + user[4:6])] == [True] * 4
