"""A step whose loss, metrics and compute time are read one step late, so that the host never waits for the
device inside a step (`DataParallel.step(..., lagged=True)`; the launcher's loop: `pydtnn.training.loop`).

    pending = dp.step(x, y, w, share, lagged=True)    # queued: forward, backward, update; flags known now
    ...                                               # the next step is queued meanwhile
    record = pending.settled()                        # the StepRecord: waits only for work long done

On a GPU (`Backend.asynchronous`) the step's numbers are copied to pinned memory on a side stream
(`Backend.read_scalars_later`) and its compute time is the device's, between two events (`Backend.mark`);
both are read by `settled()`. The flags the ranks agree on (a signal, a checkpoint due, a failed output, a
rank's read error) are this rank's own and known at once: one replica (`DataParallel.step` refuses
`lagged` with several, whose records are reduced every step).
"""
from __future__ import annotations

import numpy as np

from pydtnn.parallel.step_record import FLAGS, StepRecord


class LaggedStep:
    def __init__(self, engine, read, share, samples, start, end, wait_s, flags):
        """`engine`: the DataParallel (its model's backend, its timer); `read`: the pending read of the step's
        [loss, *metrics] (`Backend.read_scalars_later`); `share`: b_i / the step's samples; `start`, `end`:
        marks around forward + backward (`Backend.mark`); `wait_s`: the step's waits; `flags`: this rank's."""
        self.engine, self.read, self.share, self.samples = engine, read, share, samples
        self.start, self.end, self.wait_s = start, end, wait_s
        for flag in FLAGS:
            setattr(self, flag, bool(flags.get(flag, False)))
        self._record = None

    def settled(self) -> StepRecord:
        """The step's record (read once; later calls return it again)."""
        if self._record is None:
            engine = self.engine
            values = np.asarray(self.read.result(), dtype=np.float64) * self.share
            compute = (engine.model.backend.seconds_between(self.start, self.end) if self.samples else 0.0)
            engine.timer.add_step(self.samples, compute, self.wait_s)
            self._record = StepRecord.of_replica(0, 1, values, compute / self.samples if self.samples
                                                 else float("nan"), self.wait_s,
                                                 **{flag: getattr(self, flag) for flag in FLAGS})
        return self._record
