"""Nothing trained is lost when an output fails (the Trainer's side of it, mixed into `Trainer`).

The writers (history file, step metrics, TensorBoard) never raise into the loop nor enter a collective of their
own: each keeps its first failure (`output_failure`). The ranks agree on a failure after the step (a flag in
its record) or at the epoch's end, and every rank stops there together and writes the full checkpoint of the
last point the run completed (`rescue`).
"""
from __future__ import annotations

from pydtnn.parallel.comm import agree_on_error
from pydtnn.training import trainer_state


class OutputRescue:
    """Mixed into `pydtnn.training.loop.Trainer` (its `_callbacks`, `checkpoints`, `last_point`, ...)."""

    def _local_flags(self):
        """This rank's flags for the step's record: a signal, a checkpoint due, an output that failed here."""
        return dict(self.checkpoints.local_flags(self.rank), output_failed=self.output_failure() is not None)

    def output_failure(self):
        """The first OutputError one of this rank's writers kept (`output_failure`), or None."""
        return next((c.output_failure for c in self._callbacks()
                     if getattr(c, "output_failure", None) is not None), None)

    def agree_on_outputs(self):
        """A collective: if any rank's writer failed, every rank raises that OutputError (rank 0 its text)."""
        agree_on_error(self.comm, self.output_failure(), "another rank could not write an output")

    def flush_outputs(self):
        """The writers' files brought up to the last step (rank 0 writes; a failure is only kept)."""
        for c in self._callbacks():
            if callable(getattr(c, "flush", None)):
                c.flush(self)

    def rescue(self, num_epochs):
        """After an output failed (every rank calls it, together): the other outputs flushed, then a full
        checkpoint of the last point this run completed, where it can be written; returns what to tell."""
        self.flush_outputs()
        if self.last_point is None:
            return "no training step had run: nothing to save"
        epoch, step, sums, samples = self.last_point
        partial = trainer_state.partial_epoch(self, sums, samples) if step else None
        return self.checkpoints.rescue(self.save_checkpoint, epoch, step, partial, num_epochs, self.steps_per_epoch)

