"""A step's loss and metrics read one step late (`GPUBackend.read_scalars_later`), so the host never waits
for the device inside a step.

`start(values)` stacks the step's scalars on the device (one small kernel on the compute stream), makes a
side stream wait for them (an event), and queues their copy into a pinned host buffer there, without waiting
for it (`get(blocking=False)`: CuPy's default, `blocking=True`, would synchronize the side stream, and so wait
for the whole step); `result()`, a step later, waits for that copy's event (by then the device is a step
further on: the wait is for work long done) and hands the numbers back. The stacked array is kept until
then, so CuPy's pool cannot give its memory to the compute stream while the side stream still reads it; the
pinned buffers are reused.
"""
from __future__ import annotations

import numpy as np


class PendingScalars:
    """One step's numbers on their way to the host."""
    __slots__ = ("owner", "host", "copied", "device")

    def __init__(self, owner, host, copied, device):
        self.owner, self.host, self.copied, self.device = owner, host, copied, device

    def result(self) -> np.ndarray:
        if self.device is not None:
            self.copied.synchronize()
            out = np.array(self.host, dtype=np.float64)
            self.owner.free.setdefault(out.size, []).append(self.host)
            self.host, self.device = out, None
        return self.host


class Readback:
    def __init__(self, cupy, device):
        import cupyx
        self.cp, self.cupyx = cupy, cupyx
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.free: dict[int, list] = {}         # pinned buffers by length, for the next reads

    def start(self, stacked) -> PendingScalars:
        """`stacked`: a 1-D float64 device array of the step's numbers, queued on the current stream."""
        cp = self.cp
        ready = cp.cuda.Event(disable_timing=True)
        ready.record(cp.cuda.get_current_stream())
        self.stream.wait_event(ready)
        spare = self.free.get(stacked.size)
        host = spare.pop() if spare else self.cupyx.empty_pinned((stacked.size,), np.float64)
        # pinned `out`: the copy is truly asynchronous (into pageable memory CUDA would return only once done)
        stacked.get(stream=self.stream, out=host, blocking=False)
        copied = cp.cuda.Event(disable_timing=True)
        copied.record(self.stream)
        return PendingScalars(self, host, copied, stacked)
