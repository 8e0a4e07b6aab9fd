"""The Trainer's side of one global step, on the engine's protocol (`pydtnn.parallel.DataParallel.step`).

Around the protocol (forward + backward, reduction, update, the step's record reduction; the emulated speed
and the CUDA graph's replay are the engine's too) this adds what only the launcher's loop has: this rank's
batch of the epoch's shared order, taken in the background during the previous step
(`pydtnn.training.prefetch`) and sent on to the device by the backend's input pipeline
(`Backend.input_pipeline`: on a GPU an asynchronous copy from pinned memory; integer labels travel as they are
and become one-hot targets there); the emulation's calibration before the first step; the loop's metrics;
the GPU's convolution plans checked after the first step (`DataParallel.guard_plans`); and the agreement on a
rank that could not read its batch (the flag rides in the step's record, then every rank raises it).
"""
from __future__ import annotations

import threading

import numpy as np

from pydtnn.errors import PyDTNNError
from pydtnn.observe.timeline import PREFETCH
from pydtnn.parallel.comm import agree_on_error
from pydtnn.targets import labels_or_targets
from pydtnn.training.prefetch import BatchPrefetcher


class TrainerStep:
    def __init__(self, model, dataset, dp, metric_fns, span, lagged=False):
        """`dp`: the engine (its `timer` times the step); `span(name, category, **args)`: a timeline event when
        tracing (the Trainer's); `lagged`: steps read a step late (`pydtnn.parallel.lagged_step`)."""
        self.model, self.dataset, self.dp = model, dataset, dp
        self.metric_fns = metric_fns
        self.span = span
        self.lagged = lagged
        self.nclasses = model.output_shape[-1]        # classes of (N, K) or per-position (N, T, K) outputs
        self.inputs = model.backend.input_pipeline()
        self.prefetcher = BatchPrefetcher(self.take)
        # where steps replay a CUDA graph, which checks nothing, the ids a table right after the input looks up
        # are checked on the host (elsewhere its forward does)
        first = model.layers[1] if len(model.layers) > 1 and dp.graphs is not None else None
        self.check_ids = getattr(first, "check_ids", None)

    # --- this rank's batch ------------------------------------------------------------------------------
    def take(self, indices, epoch):
        """The batch of `indices`, in this thread or the prefetcher's, handed to the input pipeline: its ticket."""
        background = threading.current_thread() is not threading.main_thread()
        with self.span("prefetch" if background else "take batch", "data", tid=PREFETCH if background else 0,
                       samples=len(indices)):
            x, labels = self.dataset.train.take(indices, epoch=epoch)
            if self.check_ids is not None:
                self.check_ids(x)
            return self.inputs.put(x, labels_or_targets(labels, self.nclasses, self.model.dtype))

    def targets(self, y):
        """The loss's targets from what travelled: integer labels one-hot encoded on the backend."""
        if np.issubdtype(y.dtype, np.integer):
            return self.model.backend.one_hot(y, self.nclasses)
        return y

    def batch(self, indices, epoch, next_indices):
        """This step's batch as a ticket of the input pipeline, or (when this rank cannot read it: a corrupt
        shard) one of zeros of its shape, and the error, which the step's record reduction then makes every
        rank's."""
        try:
            return self.prefetcher.get(indices, epoch, next_indices), None
        except PyDTNNError as e:
            n, first = len(indices), self.model.layers[0]
            x = np.zeros((n,) + tuple(self.model.input_shape), np.int64 if getattr(first, "ids", False) else np.float32)
            return self.inputs.put(x, np.zeros((n,) + tuple(self.model.output_shape), self.model.dtype)), e

    # --- one step ---------------------------------------------------------------------------------------
    def run(self, indices, epoch, step_sizes, next_indices=None, flags=None):
        """The step on this rank's `indices` of a step of `step_sizes`; returns the agreed StepRecord (with
        `lagged`, a LaggedStep whose flags are known and whose record is read later). `flags()`: this rank's
        preemption flags (`DataParallel.step`)."""
        with self.dp.timer.phase("data", category="data"):
            ticket, data_error = self.batch(indices, epoch, next_indices)
            x, y = self.inputs.get(ticket)
            y = self.targets(y)
        weight = self.dp.weight(step_sizes)
        self.dp.calibrate_emulation(x, y, weight)       # before the step's timer: not its compute
        record = self.dp.step(x, y, weight, len(indices) / sum(step_sizes), metric_fns=self.metric_fns,
                              data_error=data_error is not None, flags=flags, lagged=self.lagged,
                              step_sizes=step_sizes)
        self.dp.guard_plans(x, y, weight)               # after the first step: its plans built and tuned
        self.inputs.done(ticket)
        if record.data_error:
            agree_on_error(self.dp.comm, data_error, "another rank could not read its batch")
        return record
