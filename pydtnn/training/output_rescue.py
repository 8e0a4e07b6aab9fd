"""Nothing trained is lost when an output fails (`OutputRescue`, one of the parts the Trainer composes).

The writers (history file, step metrics, TensorBoard) never raise into the loop nor enter a collective of their
own: each keeps its first failure (`output_failure`). The ranks agree on a failure after the step (a flag in
its record) or at the epoch's end, and every rank stops there together and writes the full checkpoint of the
last point the run completed (`rescue`).
"""
from __future__ import annotations

from pydtnn.parallel.comm import agree_on_error
from pydtnn.training import trainer_state


class OutputRescue:
    def __init__(self, comm, checkpoints, callbacks):
        """`checkpoints`: the Trainer's StepCheckpoints; `callbacks()`: every callback, in the order hooks run."""
        self.comm, self.checkpoints, self.callbacks = comm, checkpoints, callbacks

    def local_flags(self):
        """This rank's flags for the step's record: a signal, a checkpoint due, an output that failed here."""
        return dict(self.checkpoints.local_flags(self.comm.rank), output_failed=self.failure() is not None)

    def failure(self):
        """The first OutputError one of this rank's writers kept (`output_failure`), or None."""
        return next((c.output_failure for c in self.callbacks()
                     if getattr(c, "output_failure", None) is not None), None)

    def agree(self):
        """A collective: if any rank's writer failed, every rank raises that OutputError (rank 0 its text)."""
        agree_on_error(self.comm, self.failure(), "another rank could not write an output")

    def flush(self, trainer):
        """The writers' files brought up to the last step (rank 0 writes; a failure is only kept)."""
        for c in self.callbacks():
            if callable(getattr(c, "flush", None)):
                c.flush(trainer)

    def rescue(self, trainer, num_epochs):
        """After an output failed (every rank calls it, together): the other outputs flushed, then a full
        checkpoint of the last point `trainer` completed, where it can be written; returns what to tell."""
        self.flush(trainer)
        if trainer.last_point is None:
            return "no training step had run: nothing to save"
        epoch, step, sums, samples = trainer.last_point
        partial = trainer_state.partial_epoch(trainer, sums, samples) if step else None
        return self.checkpoints.rescue(trainer.save_checkpoint, epoch, step, partial, num_epochs,
                                       trainer.steps_per_epoch)
