"""What follows a step once its numbers are read (mixed into `Trainer`): the checks, the epoch's running sums,
the callbacks' `on_batch_end`, the balance policy, the point a rescue restarts from. At the step's end, or
a step later where the loop reads its steps lagged (`pydtnn.parallel.lagged_step`)."""
from __future__ import annotations

import math

from pydtnn.callbacks import call
from pydtnn.errors import NumericalError


class StepSettle:
    """Mixed into `pydtnn.training.loop.Trainer`."""

    def _settle(self, epoch, global_step, step, sizes, rate, handle, seconds, callbacks):
        """Step `step` of `epoch` (its split `sizes`, its learning `rate`, its StepRecord or LaggedStep `handle`,
        this rank's wall `seconds` of it) into self.epoch_sums and self.epoch_samples (in place)."""
        record = handle.settled()
        if self.run_first_step is None:
            self.run_first_step = (seconds, sum(sizes))
        timing = self.insight.end_step(sizes, record, seconds)
        if not math.isfinite(record.loss):
            raise NumericalError(f"the loss became {record.loss} at epoch {epoch + 1}, step {step + 1}: "
                                 f"training diverged (try a lower --learning_rate)")
        step_total = sum(sizes)
        self.epoch_sums += record.means * step_total
        self.epoch_samples += step_total
        call(callbacks, "on_batch_end", self, global_step,
             {"loss": record.loss, **{m: float(v) for m, v in zip(self.metric_names, record.metrics)},
              "learning_rate": rate, "batch_size": step_total, **timing})
        self.dp.after_step(global_step, record, sizes)
        self.last_point = (epoch, step + 1, self.epoch_sums.copy(), self.epoch_samples)
