"""Synchronized BatchNorm that is exact for unequal local batches (--sync_batchnorm).

In training, every BatchNormalization layer normalizes with the statistics of the GLOBAL batch: the
replicas sum their per-channel sums over their own b_i samples (never P * b: the counts travel with the
sums), so a replica with 5 samples and one with 50 weigh 5 and 50. Backward sums sum(dy) and
sum(dy * (x - mean)) the same way. The running statistics are then updated from the global mean and the
unbiased global variance on every replica alike, which is what one process on the global batch does.

The layer hands a `BatchNormSync` to the backend's `batchnorm_forward_train(..., sync=)` and
`batchnorm_backward(..., sync=)`; the backend computes its local sums (its own kernels) and calls
`forward_moments` / `backward_sums`, which do one small SUM-allreduce each (2C + 1 and 2C float64
values, through host memory on any communicator). Collectives stay matched for any split because every
replica has at least one sample and runs every BatchNormalization layer of every step.

Time blocked in these reductions is wait, not compute: with a ``timer`` (the trainer's
`pydtnn.observe.timing.StepTimer`) each one is counted as the step's wait and, when tracing, is a `bn_sync` event.
"""
from __future__ import annotations

import contextlib

import numpy as np

from pydtnn.parallel.comm import to_host

__all__ = ["BatchNormSync"]


class BatchNormSync:
    def __init__(self, comm, timer=None):
        self.comm = comm
        self.timer = timer
        self.count = None           # the global number of rows of the last forward reduction

    def _reduce(self, buf, name):
        waiting = (contextlib.nullcontext() if self.timer is None else
                   self.timer.wait(name, category="bn_sync", bytes=buf.nbytes))
        with waiting:
            self.comm.allreduce_sum_(buf)

    def forward_moments(self, xp, t1, t2, m, shift, center):
        """Local float64 sums t1 = sum(x - shift), t2 = sum((x - shift)^2) over ``m`` rows, per channel ->
        (S1, S2, M): the same sums over every replica's rows, about ``center``.

        ``center`` must be the same on every replica (the layer passes its running mean, which sync keeps
        identical); the local shift moves to it exactly: sum(x - c) = t1 + m d and
        sum((x - c)^2) = t2 + 2 d t1 + m d^2 with d = shift - c.
        """
        c = t1.shape[0]
        d = shift - center
        buf = np.empty(2 * c + 1)
        buf[:c] = to_host(t1 + m * d)
        buf[c:2 * c] = to_host(t2 + 2.0 * d * t1 + m * d * d)
        buf[2 * c] = m
        self._reduce(buf, "bn_sync forward")
        self.count = float(buf[2 * c])
        return xp.asarray(buf[:c]), xp.asarray(buf[c:2 * c]), self.count

    def backward_sums(self, xp, sdy, sdyx):
        """Per-channel sum(dy) and sum(dy * (x - mean)) of this replica -> the sums over all replicas."""
        c = sdy.shape[0]
        buf = np.empty(2 * c)
        buf[:c] = to_host(sdy)
        buf[c:] = to_host(sdyx)
        self._reduce(buf, "bn_sync backward")
        return xp.asarray(buf[:c]), xp.asarray(buf[c:])
