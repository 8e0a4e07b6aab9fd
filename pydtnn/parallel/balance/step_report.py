"""What a balancing policy is told after every step: `StepReport`, the same on every rank.

    report.sizes            each replica's actual b_i in this step (a short last step's too)
    report.compute_s        each replica's compute seconds (forward + backward + device sync, no waits)
    report.wait_s           each replica's seconds blocked in the step's collectives
    report.wall_s           the step's wall time: max_i(compute_i + wait_i), compute start to reduced gradient
    report.warmup           per replica: True when this step is not a fair measurement (the first step of
                            the run, or the first at a local batch this replica had not run: allocation,
                            compilation, a cuDNN plan)
    report.seconds_per_sample

A report also reads as the list of seconds per sample (`len`, indexing, iteration, `np.asarray`), which
is what earlier versions passed to `after_step`: a policy written for them keeps working.

`StepReports` builds them from the step's agreed record (`pydtnn.parallel.step_record.StepRecord`) and
remembers which local batches each replica has run (a probe's warmed shapes count as run).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["StepReport", "StepReports"]


@dataclass(frozen=True)
class StepReport:
    sizes: tuple
    compute_s: tuple
    wait_s: tuple
    wall_s: float
    warmup: tuple

    @property
    def seconds_per_sample(self) -> list[float]:
        return [c / b if b else math.nan for c, b in zip(self.compute_s, self.sizes)]

    # the list of seconds per sample, as `after_step` got before reports existed
    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        return self.seconds_per_sample[i]

    def __iter__(self):
        return iter(self.seconds_per_sample)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.seconds_per_sample, dtype=dtype)

    @classmethod
    def of(cls, seconds_per_sample, sizes, wait_s=None, warmup=None) -> "StepReport":
        """A report from per-sample seconds (a list, or a report already) and the step's sizes."""
        if isinstance(seconds_per_sample, StepReport):
            return seconds_per_sample
        b = np.asarray(sizes, dtype=np.int64).reshape(-1)
        with np.errstate(invalid="ignore"):
            compute = np.where(b > 0, np.asarray(seconds_per_sample, dtype=np.float64).reshape(-1) * b, 0.0)
        return cls.of_compute(b, compute, wait_s, warmup)

    @classmethod
    def of_compute(cls, sizes, compute_s, wait_s=None, warmup=None) -> "StepReport":
        """A report from every replica's compute seconds (and wait seconds, warm-up flags)."""
        b = np.asarray(sizes, dtype=np.int64).reshape(-1)
        compute = np.asarray(compute_s, dtype=np.float64).reshape(-1)
        wait = np.zeros(b.size) if wait_s is None else np.asarray(wait_s, dtype=np.float64).reshape(-1)
        busy = compute + wait
        busy = busy[np.isfinite(busy)]
        warm = (False,) * b.size if warmup is None else tuple(bool(w) for w in warmup)
        return cls(tuple(b.tolist()), tuple(compute.tolist()), tuple(wait.tolist()),
                   float(busy.max()) if busy.size else 0.0, warm)


class StepReports:
    """The reports of one run: which replica has run which local batch (so which step is a warm-up)."""

    def __init__(self, nreplicas: int):
        self.seen = [set() for _ in range(int(nreplicas))]
        self.first = True

    def warmed(self, replica: int, sizes) -> None:
        """Local batches `replica` has run outside training steps (a probe's warm-up passes)."""
        self.seen[replica].update(int(b) for b in sizes)

    def restart(self) -> None:
        """The next step is a process's first (a resumed run): a warm-up for every replica."""
        self.first = True

    def report(self, record, sizes) -> StepReport:
        """The report of a step of `sizes` whose agreed record is `record`."""
        warm = tuple(self.first or int(b) not in seen for b, seen in zip(sizes, self.seen))
        for b, seen in zip(sizes, self.seen):
            seen.add(int(b))
        self.first = False
        return StepReport.of(np.asarray(record.compute_s_per_sample, dtype=np.float64).tolist(), sizes,
                             np.asarray(record.wait_s, dtype=np.float64).tolist(), warm)
