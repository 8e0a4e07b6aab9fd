"""The loop's own callbacks (`pydtnn.callbacks.Callback`): the history file and the progress bar.

`pydtnn.training.loop.Trainer` adds them itself, after the schedulers and the user's callbacks (the order is in
`pydtnn.callbacks`): a user's callback never needs to create them.
"""
from __future__ import annotations

import csv
import io
import json
import time

from pydtnn.callbacks import Callback
from pydtnn.errors import OutputError
from pydtnn.outputs import atomic_write
from pydtnn.observe.progress import progress


class HistoryWriter(Callback):
    """After every epoch, `trainer.history` (the new row included) to `path`: CSV, or JSON for a .json name.

    Rank 0 writes, atomically, and enters no collective (every rank runs the same collectives whatever its
    own flags). A failure is kept in `output_failure`: the loop agrees on it with the other ranks at the
    epoch's end and answers with its rescue (the full checkpoint of that epoch, the weights), so nothing
    trained is lost.
    """
    saves_files = True      # runs after the epoch's row is recorded, first of the callbacks that write

    def __init__(self, path):
        self.path = path
        self.output_failure = None

    def on_epoch_end(self, trainer, epoch, logs):
        if trainer.rank != 0 or self.output_failure is not None:
            return
        try:
            self.write(trainer.history)
        except OutputError as e:
            self.output_failure = e

    def write(self, history):
        if self.path.endswith(".json"):
            text = json.dumps(history, indent=1)
        else:
            buf = io.StringIO(newline="")
            writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for row in history for k in row)))
            writer.writeheader()
            writer.writerows(history)
            text = buf.getvalue()
        atomic_write(self.path, lambda f: f.write(text.encode()))


class ProgressBar(Callback):
    """One bar per epoch on stderr (`pydtnn.observe.progress`): the epoch's running loss, metrics, samples/s
    and time left.

    The rate and the time left are measured from the end of the epoch's first step: the run's first step
    compiles the CPU kernels (numba) and allocates, and counted in, it made a 22 s epoch "2647 s left".
    Until a second step ends the line says so instead. It closes after the epoch's last step (before the
    epoch's line on stdout), and without counting the step when the ranks agreed to stop inside the epoch
    (the preemption checkpoint follows); `close` ends it on any other way out of the loop.
    """

    def __init__(self, metric_names):
        self.metric_names = list(metric_names)
        self.bar = None
        self.steps_run = 0                 # by this run: its first step is the one that compiles

    def on_epoch_begin(self, trainer, epoch):
        self.warm = None                   # (time, samples, steps) at the end of the epoch's first step
        self.bar = progress(total=trainer.steps_per_epoch, desc=f"epoch {epoch + 1}/{trainer.num_epochs}",
                            unit="step", leave=True, initial=trainer.first_step, estimate=False)

    def on_batch_end(self, trainer, step, logs):
        last = (step + 1) % trainer.steps_per_epoch == 0
        if trainer.stop_requested and not last:
            self.close()
            return
        sums, samples = trainer.epoch_sums, trainer.epoch_samples
        now, done = time.perf_counter(), self.bar.n + 1
        self.steps_run += 1
        if self.warm is None:
            self.warm = (now, samples, done)
            pace = "(the first step compiles the kernels: no estimate yet)" if self.steps_run == 1 else ""
        else:
            t, s, n = self.warm
            left = (now - t) / (done - n) * (trainer.steps_per_epoch - done)
            pace = f"{(samples - s) / (now - t):.0f} samples/s, {left:.0f} s left"
        parts = [f"loss={sums[0] / samples:.4f}", *(f"{_short(m)}={v / samples:.4f}"
                                                    for m, v in zip(self.metric_names, sums[1:])), pace]
        self.bar.set_postfix_str(" ".join(p for p in parts if p), refresh=False)
        self.bar.update(1)
        if last:
            self.close()

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _short(name):
    return {"categorical_accuracy": "acc"}.get(name, name)
