"""Per-replica timing: each step's compute and wait seconds (`StepTimer`), their totals over an epoch
(`ReplicaStats`) and every replica's totals side by side (`epoch_summary`, the table the training loop prints).

    stats = ReplicaStats()
    timer = StepTimer(stats, timeline=Timeline(comm.rank) if tracing else None)
    for step ...:
        timer.start_step(b_i)
        with timer.compute():            # forward + backward
            ...                          # a collective inside (synchronized BatchNorm) enters timer.wait()
        with timer.wait():               # inside the gradient reduction: idle + transfer
            ...
        with timer.phase("update"):      # any other phase: a timeline event, not counted
            ...
        timer.end_step()
    summary = epoch_summary(comm, stats)  # collective: every rank calls it
    if comm.rank == 0:
        print(summary.format())
    stats.reset()

Waits are waits: time blocked in a collective is wait wherever it happens, also inside ``compute()``
(synchronized BatchNorm's reductions in the forward and backward passes), whose compute then excludes it.
So a replica's compute seconds measure its own speed, which the per-replica table, the training history's
per-replica columns and the balancing policies read: after each step, every replica's
``timer.step_compute_s / b_i`` (``stats.last_compute_per_sample`` once the step has ended) is its compute
seconds per sample, what `pydtnn.parallel.balance.BalancePolicy.after_step` is given for every replica.

The timeline and its Chrome trace live in `pydtnn.observe.timeline`.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from pydtnn.observe.timeline import Timeline

__all__ = ["ReplicaStats", "StepTimer", "EpochSummary", "epoch_summary"]


@dataclass
class ReplicaStats:
    """Totals of one replica since the last ``reset()`` (typically one epoch)."""

    steps: int = 0
    samples: int = 0
    compute_s: float = 0.0
    wait_s: float = 0.0
    last_batch: int = 0
    last_compute_s: float = 0.0
    history: list = field(default_factory=list, repr=False)   # (b_i, compute_s, wait_s) per step
    keep_history: bool = False

    def add_step(self, samples: int, compute_s: float, wait_s: float) -> None:
        self.steps += 1
        self.samples += int(samples)
        self.compute_s += float(compute_s)
        self.wait_s += float(wait_s)
        self.last_batch = int(samples)
        self.last_compute_s = float(compute_s)
        if self.keep_history:
            self.history.append((int(samples), float(compute_s), float(wait_s)))

    @property
    def last_compute_per_sample(self) -> float:
        return self.last_compute_s / self.last_batch if self.last_batch else float("nan")

    def reset(self) -> None:
        self.steps = self.samples = self.last_batch = 0
        self.compute_s = self.wait_s = self.last_compute_s = 0.0
        self.history = []

    def totals(self) -> np.ndarray:
        return np.array([self.steps, self.last_batch, self.samples, self.compute_s, self.wait_s],
                        dtype=np.float64)


class StepTimer:
    """Times the phases of a step into a `ReplicaStats` (and a `Timeline` when given).

    ``compute()`` and ``wait()`` accumulate into the step's compute and wait seconds (they may be
    entered several times per step); ``phase(name)`` only records a timeline event.
    """

    def __init__(self, stats: ReplicaStats | None = None, timeline: Timeline | None = None):
        self.stats = stats if stats is not None else ReplicaStats()
        self.timeline = timeline
        self._samples = 0
        self._compute = 0.0
        self._wait = 0.0
        self._step = 0

    def start_step(self, samples: int) -> None:
        self._samples = int(samples)
        self._compute = 0.0
        self._wait = 0.0

    @contextmanager
    def _timed(self, name: str | None, counter: str | None, category: str | None = None, args=None):
        t0 = time.perf_counter()
        waited = self._wait
        try:
            yield
        finally:
            t1 = time.perf_counter()
            if counter == "compute":          # minus the waits inside it (collectives in the passes)
                self._compute += (t1 - t0) - (self._wait - waited)
            elif counter == "wait":
                self._wait += t1 - t0
            if self.timeline is not None and name is not None:
                origin = self.timeline.t0
                self.timeline.add(name, t0 - origin, t1 - origin, category or counter or "", **(args or {}))

    def compute(self, name: str | None = "compute"):
        """Compute seconds (a timeline event named ``name``; None: none, the layers' events say it)."""
        return self._timed(name, "compute")

    def wait(self, name: str = "allreduce", category: str = "allreduce", **args):
        """Seconds blocked in a collective; may be entered inside ``compute()``."""
        return self._timed(name, "wait", category, args)

    def phase(self, name: str, category: str | None = None, **args):
        return self._timed(name, None, category, args)

    def end_step(self) -> None:
        self.add_step(self._samples, self._compute, self._wait)

    def add_step(self, samples: int, compute_s: float, wait_s: float) -> None:
        """A step's totals given (a lagged step's compute time is the device's, read a step later)."""
        self.stats.add_step(samples, compute_s, wait_s)
        self._step += 1

    @property
    def step_compute_s(self) -> float:
        return self._compute

    @property
    def step_wait_s(self) -> float:
        return self._wait


@dataclass
class EpochSummary:
    """Every replica's totals, identical on every rank (rows in rank order)."""

    rows: list

    def format(self) -> str:
        head = f"{'rank':>4} {'b_i':>6} {'samples':>9} {'compute s':>10} {'wait s':>9} {'wait %':>7} {'samples/s':>10}"
        lines = [head]
        for r in self.rows:
            busy = r["compute_s"] + r["wait_s"]
            wait_pct = 100.0 * r["wait_s"] / busy if busy > 0 else 0.0
            lines.append(f"{r['rank']:>4} {r['b_i']:>6} {r['samples']:>9} {r['compute_s']:>10.3f} "
                         f"{r['wait_s']:>9.3f} {wait_pct:>7.1f} {r['samples_per_s']:>10.1f}")
        return "\n".join(lines)


def epoch_summary(comm, stats: ReplicaStats) -> EpochSummary:
    """Allgather every rank's totals (a collective: every rank must call it)."""
    table = np.asarray(comm.allgather(stats.totals())).reshape(comm.size, -1)
    rows = []
    for rank, (steps, b_i, samples, compute_s, wait_s) in enumerate(table):
        rows.append({"rank": rank, "steps": int(steps), "b_i": int(b_i), "samples": int(samples),
                     "compute_s": float(compute_s), "wait_s": float(wait_s),
                     "samples_per_s": float(samples / compute_s) if compute_s > 0 else float("nan")})
    return EpochSummary(rows)
