"""Per-step scalars and per-epoch metrics, to plot: a CSV (--step_history_file), TensorBoard event files
(--tensorboard_dir, in tensorboardX's format, written in the loop's thread: `pydtnn.observe.event_file`;
`tensorboard --logdir DIR` shows them) and the per-replica plot (--plots_dir). A `pydtnn.callbacks.Callback`;
only rank 0 writes.

Per step (global step s, 1-based): loss and metrics of the global batch, learning_rate, samples_per_s
(the global batch over the step's wall time), and for each replica r: rank{r}_b, rank{r}_compute_s and
rank{r}_wait_s (its time blocked in the step's collectives before the step's statistics reduction, whose
own wait the per-epoch table adds). TensorBoard tags are one naming, the columns' own: step/<column> per
step (the --step_history_file's: step/loss, step/rank0_b, ...) and epoch/<column> per epoch (the
--history_file's: epoch/loss, epoch/rank0_b, ...).

A write that fails never raises into the loop and never blocks it: that output stops, the others go on, and
`output_failure` holds the first failure, which the loop agrees on with the other ranks and answers with its
rescue (a full checkpoint, the weights: `pydtnn.training.loop`). `keep_rows`: the rows of a resumed run's
step history file (steps up to where it resumes), written again before the new ones.
"""
from __future__ import annotations

import contextlib
import csv
import io
import os

from pydtnn.callbacks import Callback
from pydtnn.errors import OutputError
from pydtnn.observe.event_file import EventFile
from pydtnn.outputs import atomic_write

__all__ = ["StepMetrics", "PLOT_NAME"]

PLOT_NAME = "replicas.png"


class StepMetrics(Callback):
    def __init__(self, rank: int, tensorboard_dir=None, csv_path=None, plots_dir=None, keep_rows=()):
        self.writes = rank == 0 and bool(tensorboard_dir or csv_path or plots_dir)
        self.tensorboard_dir, self.csv_path, self.plots_dir = tensorboard_dir, csv_path, plots_dir
        self.rows: list[dict] = list(keep_rows)
        self.writer = None
        self.output_failure = None        # the first OutputError of any of the three outputs
        self._failed: set[str] = set()

    def _guarded(self, output, work):
        """Run one output's `work` unless that output failed before; a failure stops that output only."""
        if not self.writes or output in self._failed:
            return
        try:
            work()
        except OutputError as e:
            self._failed.add(output)
            if output == "tensorboard":
                self._drop_writer()
            self.output_failure = self.output_failure or e

    def _drop_writer(self):
        writer, self.writer = self.writer, None
        if writer is not None:
            with contextlib.suppress(OutputError):
                writer.close()

    def on_train_begin(self, trainer):
        if self.tensorboard_dir:
            def start():
                self.writer = EventFile(self.tensorboard_dir)
            self._guarded("tensorboard", start)

    def on_batch_end(self, trainer, step, logs):
        if not self.writes:
            return
        self.rows.append({"step": step + 1, **logs})
        if self.writer is not None:
            def scalars():
                for name, value in logs.items():
                    self.writer.scalar(f"step/{name}", value, step + 1)
            self._guarded("tensorboard", scalars)

    def on_epoch_end(self, trainer, epoch, logs):
        if self.writer is not None:
            def scalars():
                step = (epoch + 1) * trainer.steps_per_epoch
                for name, value in logs.items():
                    if name != "epoch" and isinstance(value, (int, float)):
                        self.writer.scalar(f"epoch/{name}", value, step)
                self.writer.flush()
            self._guarded("tensorboard", scalars)
        self._guarded("csv", self._write_csv)

    def flush(self, trainer):
        """What the files would hold at the end, written now (the loop stops early: a preemption, a rescue)."""
        self._guarded("csv", self._write_csv)
        if self.writer is not None:
            self._guarded("tensorboard", self.writer.flush)

    def on_train_end(self, trainer):
        self._guarded("csv", self._write_csv)
        if self.writer is not None:
            writer, self.writer = self.writer, None
            self._guarded("tensorboard", writer.close)
        if self.plots_dir and self.rows:
            from pydtnn.observe.replica_plot import plot_replicas
            self._guarded("plot", lambda: plot_replicas(os.path.join(self.plots_dir, PLOT_NAME), self.rows,
                                                        trainer.nreplicas))

    def _write_csv(self):
        if not self.csv_path or not self.rows:
            return
        buf = io.StringIO(newline="")
        writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for row in self.rows for k in row)))
        writer.writeheader()
        writer.writerows(self.rows)
        text = buf.getvalue()
        atomic_write(self.csv_path, lambda f: f.write(text.encode()))
