"""One epoch of the Trainer's loop (`EpochLoop`): its global steps in the epoch's shared order, each step settled
once its numbers are read, and the epoch's history row.

    row = trainer.epochs.run(epoch, first_step)      # the Trainer composes it (`pydtnn.training.loop`)

A step: this rank's b_i samples of the epoch's shared order (`pydtnn.parallel.sharding.shard`), the next ones
prefetched meanwhile, run by the Trainer's step (`pydtnn.training.step.TrainerStep` on the engine's
`DataParallel.step`); then, once its numbers are read (at its end, or a step later on a GPU:
`pydtnn.parallel.lagged_step`), it is settled: the checks, the epoch's running sums, the callbacks'
`on_batch_end` with what every rank agreed on, the balance policy; then a full checkpoint where the ranks
agreed on one (`pydtnn.training.preemption`). Every rank runs the same number of steps whatever the split and
the dataset size, so the collectives match.
"""
from __future__ import annotations

import math
import time

import numpy as np

from pydtnn.callbacks import call
from pydtnn.errors import NumericalError
from pydtnn.observe.timing import epoch_summary
from pydtnn.parallel import sharding
from pydtnn.training import trainer_state
from pydtnn.training.tokens import add_language_model_logs, epoch_line_suffix


class EpochLoop:
    """Owns what lives for one epoch: its running sums and samples (the progress bar reads them), the step
    whose numbers are still to be read, and where the epoch started. The Trainer (`trainer`) holds the run:
    the engine, the step, the callbacks, the checkpoints."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.first_step = 0             # where this epoch started (a resumed one: inside it)
        self.sums = np.zeros(1 + len(trainer.metric_fns))   # loss and metrics, weighted by samples
        self.samples = 0

    def run(self, epoch, first_step=0):
        """Steps `first_step`.. of `epoch`, then its history row (the epoch's logs)."""
        t = self.trainer
        split = t.dataset.train
        n = len(split)
        order = split.epoch_order(t.seed, epoch)
        t.stats.reset()
        self.first_step = first_step
        self.sums = np.zeros(1 + len(t.metric_fns))
        self.samples = 0
        if first_step:                 # resumed inside this epoch: its sums so far come from the checkpoint
            self.samples = trainer_state.resume_partial_epoch(t.resumed_partial, self.sums, t.stats, t.rank,
                                                              t.nreplicas)
        t0 = time.perf_counter()
        callbacks = t.callback_order()
        B, per_epoch, steps = t.global_batch, t.steps_per_epoch_arg, t.steps_per_epoch

        # lagged (a GPU, one replica): a step's numbers are read after the next step is queued, so the
        # device always has work; a step is settled at once where the loop acts on it (the epoch's end, a
        # checkpoint, a failed output), so every checkpoint holds whole steps
        pending = None
        for step in range(first_step, steps):
            global_step = epoch * steps + step
            call(callbacks, "on_batch_begin", t, global_step)
            rate = t.optimizer.learning_rate        # the rate this step trains with
            sizes = sharding.step_sizes(step, B, t.sizes, n, per_epoch)
            idx = sharding.shard(order, step, B, t.sizes, t.rank, n, per_epoch)
            nxt = sharding.shard(order, step + 1, B, t.sizes, t.rank, n, per_epoch) if step + 1 < steps else None
            t.insight.begin_step(global_step + 1, len(idx))
            t.dp.emulator.step = global_step                # --emulate_schedule's clock
            t_step = time.perf_counter()
            try:
                handle = t.train_step(idx, epoch, sizes, nxt)
            except BaseException:
                if pending is not None:         # the outputs then hold every step before the failing one
                    self.settle(epoch, *pending[0], time.perf_counter() - pending[1], callbacks)
                raise
            if pending is not None:
                self.settle(epoch, *pending[0], t_step - pending[1], callbacks)
            pending = ((global_step, step, sizes, rate, handle), t_step)
            last = step + 1 == steps
            due = not last and t.checkpoints.due(epoch, step, steps)
            if t.lagged and not (last or due or handle.output_failed):
                continue
            self.settle(epoch, *pending[0], time.perf_counter() - t_step, callbacks)
            pending = None
            if handle.output_failed and not last:
                t.agree_on_outputs()          # raises on every rank: fit's rescue follows
            if due:
                t.step_checkpoint(epoch, step + 1, trainer_state.partial_epoch(t, self.sums, self.samples))
        t.dp.average_running_stats()
        return self.row(epoch, time.perf_counter() - t0)

    def settle(self, epoch, global_step, step, sizes, rate, handle, seconds, callbacks):
        """Step `step` of `epoch` (its split `sizes`, its learning `rate`, its StepRecord or LaggedStep `handle`,
        this rank's wall `seconds` of it) into the epoch's running sums; the callbacks' `on_batch_end`; the
        balance policy's decision; the point a rescue restarts from."""
        t = self.trainer
        record = handle.settled()
        if t.run_first_step is None:
            t.run_first_step = (seconds, sum(sizes))
        timing = t.insight.end_step(sizes, record, seconds)
        if not math.isfinite(record.loss):
            overflow = ("; with --grad_compression fp16 a gradient element above 65504 becomes inf: bf16 has "
                        "float32's range"
                        if t.dp.compression.name == "fp16" and t.nreplicas > 1 else "")
            raise NumericalError(f"the loss became {record.loss} at epoch {epoch + 1}, step {step + 1}: "
                                 f"training diverged (try a lower --learning_rate{overflow})")
        step_total = sum(sizes)
        self.sums += record.means * step_total
        self.samples += step_total
        call(callbacks, "on_batch_end", t, global_step,
             {"loss": record.loss, **{m: float(v) for m, v in zip(t.metric_names, record.metrics)},
              "learning_rate": rate, "batch_size": step_total, **timing})
        t.dp.after_step(global_step, record, sizes)
        t.last_point = (epoch, step + 1, self.sums.copy(), self.samples)

    def row(self, epoch, elapsed):
        """The epoch's history row (validation and every replica's totals included); its lines on stdout."""
        t, sums, samples = self.trainer, self.sums, self.samples
        logs = {"epoch": epoch + 1, "loss": sums[0] / samples,
                **{m: v / samples for m, v in zip(t.metric_names, sums[1:])},
                "time_s": elapsed, "samples_per_s": samples / elapsed, "learning_rate": t.optimizer.learning_rate}
        val = t.dataset.val
        if val is not None and len(val):
            logs.update({f"val_{k}": v for k, v in t.evaluate(val).items()})
        if t.tokens_per_sample:
            add_language_model_logs(logs, t.tokens_per_sample)
        summary = epoch_summary(t.comm, t.stats)
        for r in summary.rows:
            r["b_i"] = t.sizes[r["rank"]]      # the split in force, not a short last step's
            logs[f"rank{r['rank']}_b"] = r["b_i"]
            logs[f"rank{r['rank']}_samples"] = r["samples"]
            logs[f"rank{r['rank']}_compute_s"] = r["compute_s"]
            logs[f"rank{r['rank']}_wait_s"] = r["wait_s"]
        if t.rank == 0:
            t.log(f"epoch {epoch + 1}: " + ", ".join(f"{k}={v:.4f}" for k, v in logs.items()
                                                    if k in ("loss", "val_loss", "perplexity")
                                                    or k.startswith(("val_", *t.metric_names))
                                                    or k in t.metric_names) + f", {elapsed:.2f} s"
                  + epoch_line_suffix(logs))
            if t.nreplicas > 1:
                t.log(summary.format())
        return logs
