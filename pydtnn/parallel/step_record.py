"""What every rank agrees on after a data-parallel step: one record, reduced by ONE SUM-allreduce.

    mine = StepRecord.of_replica(rank, nreplicas, weighted, compute_s_per_sample, wait_s, signal=True)
    packed = mine.pack()                   # one float64 array: [loss, metrics, compute, wait, flags]
    comm.allreduce_sum_(packed)
    agreed = StepRecord.unpack(packed, nmetrics, nreplicas)

Each rank contributes its b_i-weighted share of the global batch's loss and metrics, its own compute
seconds per sample and wait seconds in its own slot (zeros in the others), and each flag as 0 or 1. The
sum is then the global batch's mean loss and metrics, every replica's seconds, and each flag raised where
any rank raised it: every rank takes the same decision after the same step (stop on a NaN loss, raise a
rank's read error everywhere, write a checkpoint on a signal or when rank 0's clock says it is due, stop
and rescue the training when an output failed).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLAGS = ("data_error", "signal", "checkpoint_due", "output_failed")


@dataclass
class StepRecord:
    loss: float                       # the global batch's mean loss (a rank's own record: its weighted share)
    metrics: np.ndarray               # the same for each metric, in the caller's order
    compute_s_per_sample: np.ndarray  # (nreplicas,) each replica's compute seconds per sample of the step
    wait_s: np.ndarray                # (nreplicas,) each replica's wait seconds before this record's reduction
    data_error: bool = False          # a rank could not read its batch
    signal: bool = False              # a preemption signal arrived on a rank
    checkpoint_due: bool = False      # rank 0's clock says a timed checkpoint is due
    output_failed: bool = False       # an output (a file rank 0 writes) failed on a rank: stop and rescue

    @classmethod
    def of_replica(cls, rank, nreplicas, weighted, compute_s_per_sample, wait_s, **flags) -> StepRecord:
        """Replica `rank`'s contribution: `weighted` = [loss, *metrics] times its share b_i / (step's samples)."""
        compute, wait = np.zeros(nreplicas), np.zeros(nreplicas)
        compute[rank], wait[rank] = compute_s_per_sample, wait_s
        return cls(weighted[0], weighted[1:], compute, wait, **flags)

    def settled(self) -> StepRecord:
        """The record itself (its numbers were read at its step's end; a `LaggedStep` reads them later)."""
        return self

    @property
    def means(self) -> np.ndarray:
        """[loss, *metrics] as one array (what an epoch's sums add up)."""
        return np.concatenate(([self.loss], self.metrics))

    def pack(self) -> np.ndarray:
        """The one float64 array the ranks SUM-allreduce."""
        return np.concatenate((self.means, self.compute_s_per_sample, self.wait_s,
                               [1.0 if getattr(self, flag) else 0.0 for flag in FLAGS]))

    @classmethod
    def unpack(cls, packed, nmetrics, nreplicas) -> StepRecord:
        """The record of a packed (and reduced) array; a flag is raised where its sum is positive."""
        n, p = 1 + nmetrics, nreplicas
        return cls(float(packed[0]), packed[1:n], packed[n:n + p], packed[n + p:n + 2 * p],
                   **{flag: bool(v > 0) for flag, v in zip(FLAGS, packed[n + 2 * p:])})
