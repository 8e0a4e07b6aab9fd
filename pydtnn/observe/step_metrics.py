"""Per-step scalars and per-epoch metrics, to plot: a CSV (--step_history_file), TensorBoard event files
(--tensorboard_dir, written with tensorboardX: no TensorFlow needed; `tensorboard --logdir DIR` shows
them) and the per-replica plot (--plots_dir). A `pydtnn.callbacks.Callback`; only rank 0 writes.

Per step (global step s, 1-based): loss and metrics of the global batch, learning_rate, samples_per_s
(the global batch over the step's wall time), and for each replica r: rank{r}_b, rank{r}_compute_s and
rank{r}_wait_s (its time blocked in the step's collectives before the step's statistics reduction, whose
own wait the per-epoch table adds). TensorBoard tags are one naming, the columns' own: step/<column> per
step (the --step_history_file's: step/loss, step/rank0_b, ...) and epoch/<column> per epoch (the
--history_file's: epoch/loss, epoch/rank0_b, ...).
"""
from __future__ import annotations

import csv
import io
import os

from pydtnn.callbacks import Callback
from pydtnn.outputs import atomic_write

__all__ = ["StepMetrics", "PLOT_NAME"]

PLOT_NAME = "replicas.png"


class StepMetrics(Callback):
    def __init__(self, rank: int, tensorboard_dir=None, csv_path=None, plots_dir=None):
        self.writes = rank == 0 and bool(tensorboard_dir or csv_path or plots_dir)
        self.tensorboard_dir, self.csv_path, self.plots_dir = tensorboard_dir, csv_path, plots_dir
        self.rows: list[dict] = []
        self.writer = None

    def on_train_begin(self, trainer):
        if self.writes and self.tensorboard_dir:
            from tensorboardX import SummaryWriter
            self.writer = SummaryWriter(logdir=self.tensorboard_dir, flush_secs=30)

    def on_batch_end(self, trainer, step, logs):
        if not self.writes:
            return
        self.rows.append({"step": step + 1, **logs})
        if self.writer is not None:
            for name, value in logs.items():
                self.writer.add_scalar(f"step/{name}", value, step + 1)

    def on_epoch_end(self, trainer, epoch, logs):
        if not self.writes:
            return
        if self.writer is not None:
            step = (epoch + 1) * trainer.steps_per_epoch
            for name, value in logs.items():
                if name != "epoch" and isinstance(value, (int, float)):
                    self.writer.add_scalar(f"epoch/{name}", value, step)
            self.writer.flush()
        self._write_csv()

    def on_train_end(self, trainer):
        if not self.writes:
            return
        self._write_csv()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.plots_dir and self.rows:
            from pydtnn.observe.replica_plot import plot_replicas
            plot_replicas(os.path.join(self.plots_dir, PLOT_NAME), self.rows, trainer.nreplicas)

    def _write_csv(self):
        if not self.csv_path or not self.rows:
            return
        buf = io.StringIO(newline="")
        writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for row in self.rows for k in row)))
        writer.writeheader()
        writer.writerows(self.rows)
        text = buf.getvalue()
        atomic_write(self.csv_path, lambda f: f.write(text.encode()))
