"""A rank's next batch on its way to the GPU while the current step computes (`GPUBackend.input_pipeline`).

On the H200 the launcher's Input layer spent 7 ms of a 101 ms ResNet-50 step in a synchronous copy of the
batch from ordinary (pageable) host memory. Here the training loop's prefetch thread hands each batch to
`put`: it is copied into one of two pinned host buffers and sent by an asynchronous copy on a copy stream
into one of two device buffers; `get` (the main thread, at the step) makes the compute stream wait for that
copy's event, so no thread waits for the device; `done` (after the step) records that the step has read its
buffers, and the copy that reuses them two batches later waits for that on the device. Labels travel as
integers (a loss's one-hot targets are made on the device: `GPUBackend.one_hot`).
"""
from __future__ import annotations

import numpy as np


class _Slot:
    def __init__(self, cupy):
        self.pinned = {}                     # name -> pinned host array
        self.device = {}                     # name -> device array
        self.copied = cupy.cuda.Event(disable_timing=True)      # the copy into `device` is done
        self.read = cupy.cuda.Event(disable_timing=True)        # the step that read `device` is done
        self.copying = self.reading = False                     # whether those events were ever recorded


class Ticket:
    """A batch on its way: `get` gives its device arrays once the compute stream waits for them."""
    __slots__ = ("slot", "arrays")

    def __init__(self, slot, arrays):
        self.slot, self.arrays = slot, arrays


class DeviceInputs:
    SLOTS = 2

    def __init__(self, cupy, device):
        import cupyx
        self.cp, self.cupyx, self.device = cupy, cupyx, device
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.slots = [_Slot(cupy) for _ in range(self.SLOTS)]
        self._next = 0

    def _buffer(self, slot, name, a):
        """The slot's pinned and device buffers for host array `a` (made anew when its shape or dtype
        changes: a re-split, a short last step), `a` copied into the pinned one."""
        pinned = slot.pinned.get(name)
        if pinned is None or pinned.shape != a.shape or pinned.dtype != a.dtype:
            if slot.reading:              # the old device buffer may still be read: wait before dropping it
                slot.read.synchronize()
            pinned = slot.pinned[name] = self.cupyx.empty_pinned(a.shape, a.dtype)
            slot.device[name] = self.cp.empty(a.shape, a.dtype)
        np.copyto(pinned, a)
        return pinned, slot.device[name]

    def put(self, *arrays):
        """Start sending host arrays to the device (any thread: the prefetcher's); returns the Ticket."""
        with self.cp.cuda.Device(self.device):
            slot = self.slots[self._next]
            self._next = (self._next + 1) % self.SLOTS
            if slot.copying:              # the previous copy out of these pinned buffers is long done
                slot.copied.synchronize()
            pairs = [self._buffer(slot, i, np.ascontiguousarray(a)) for i, a in enumerate(arrays)]
            if slot.reading:              # the device buffers are overwritten only after their last step read them
                self.stream.wait_event(slot.read)
            for pinned, dev in pairs:
                dev.set(pinned, stream=self.stream)
            slot.copied.record(self.stream)
            slot.copying = True
            return Ticket(slot, tuple(dev for _, dev in pairs))

    def get(self, ticket):
        """The batch's device arrays; the compute stream waits for their copy (the host does not)."""
        self.cp.cuda.get_current_stream().wait_event(ticket.slot.copied)
        return ticket.arrays

    def done(self, ticket):
        """The step that read the batch is queued: its buffers may be refilled once the device has run it."""
        ticket.slot.read.record(self.cp.cuda.get_current_stream())
        ticket.slot.reading = True
