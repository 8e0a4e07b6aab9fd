"""What a person reads of the loop (mixed into `Trainer`): each epoch's history row and lines, the final report."""
from __future__ import annotations

import resource

from pydtnn.observe.timing import epoch_summary
from pydtnn.training.tokens import add_language_model_logs, epoch_line_suffix


class EpochReport:
    """Mixed into `pydtnn.training.loop.Trainer`."""

    def _epoch_logs(self, epoch, sums, samples, elapsed):
        """The epoch's history row (validation and every replica's totals included); its lines on stdout."""
        logs = {"epoch": epoch + 1, "loss": sums[0] / samples,
                **{m: v / samples for m, v in zip(self.metric_names, sums[1:])},
                "time_s": elapsed, "samples_per_s": samples / elapsed, "learning_rate": self.optimizer.learning_rate}
        val = self.dataset.val
        if val is not None and len(val):
            logs.update({f"val_{k}": v for k, v in self.evaluate(val).items()})
        if self.tokens_per_sample:
            add_language_model_logs(logs, self.tokens_per_sample)
        summary = epoch_summary(self.comm, self.stats)
        for r in summary.rows:
            r["b_i"] = self.sizes[r["rank"]]      # the split in force, not a short last step's
            logs[f"rank{r['rank']}_b"] = r["b_i"]
            logs[f"rank{r['rank']}_samples"] = r["samples"]
            logs[f"rank{r['rank']}_compute_s"] = r["compute_s"]
            logs[f"rank{r['rank']}_wait_s"] = r["wait_s"]
        if self.rank == 0:
            self.log(f"epoch {epoch + 1}: " + ", ".join(f"{k}={v:.4f}" for k, v in logs.items()
                                                       if k in ("loss", "val_loss", "perplexity")
                                                       or k.startswith(("val_", *self.metric_names))
                                                       or k in self.metric_names) + f", {elapsed:.2f} s"
                     + epoch_line_suffix(logs))
            if self.nreplicas > 1:
                self.log(summary.format())
        return logs

    def report(self):
        """The final report's lines: time, time per epoch, throughput (the run's first step, which compiles,
        left out), peak memory."""
        samples = sum(h["samples_per_s"] * h["time_s"] for h in self.history[-self.epochs_run:]) if self.epochs_run else 0
        first_s, first_samples = self.run_first_step or (0.0, 0)
        if samples > first_samples and self.elapsed > first_s:
            rate, why = (samples - first_samples) / (self.elapsed - first_s), "the first step, which compiles, left out"
        else:
            rate, why = samples / max(self.elapsed, 1e-9), "one step: its compilation included"
        tokens = f" = {rate * self.tokens_per_sample:,.0f} tokens/s" if self.tokens_per_sample else ""
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return [f"training time: {self.elapsed:.2f} s over {self.epochs_run} epoch(s)",
                f"time per epoch: {self.elapsed / max(self.epochs_run, 1):.2f} s",
                f"throughput: {rate:.1f} samples/s{tokens} (all replicas; {why})",
                f"peak host memory (rank 0): {peak_mib:.0f} MiB"]
