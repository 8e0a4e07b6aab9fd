"""--emulate_speeds: make replica i behave as a device f_i / max(f) as fast as the one it runs on.

What it models: a replica whose forward + backward of b samples takes b * t0 / f seconds, where t0 is the
replica's OWN unslowed time per sample. Every step's compute is padded to that deadline.

- t0 starts from calibration passes before the replica's first step (one warm-up pass, then
  `CALIBRATION_PASSES` timed ones on its first local batch; the median per sample).
- When the node's cores hold every rank's threads (`spin=True`, what the launcher decides), the replica
  busy-waits to the deadline, and t0 follows the median of its last `WINDOW` steps' real compute per
  sample, so it drifts with the machine as the other replicas do.
- Otherwise (more threads than cores) it sleeps, to leave the cores to the others, and spins only for the
  last `SPIN_S` (a sleep can wake late); t0 then stays the calibrated one.

Why: a process computes slower just after a sleep. On a 2-vCPU VM the real compute of a 128-sample step
went from 8 ms to 16 ms after each sleep (measured), so "sleep compute * (1/f - 1)" made 1 : 0.5 measure
as 1 : 0.33-0.54, and so does a deadline that sleeps. Spinning keeps the core and its caches warm.

In spin mode the whole of the step's real compute is stretched by 1/f, its part that does not scale with b
included (the slower device is slower at everything); in sleep mode the deadline is linear in b from the
calibration batch. What it does not model: memory (the emulated device holds what this one holds) and
communication (reductions run at this machine's speed).
"""
from __future__ import annotations

import collections
import statistics
import time

from pydtnn.errors import ConfigError

__all__ = ["SpeedEmulator", "CALIBRATION_PASSES", "SPIN_S", "WINDOW"]

CALIBRATION_PASSES = 5
SPIN_S = 0.002
WINDOW = 16


class SpeedEmulator:
    def __init__(self, fraction: float, spin: bool = False, clock=time.perf_counter, sleep=time.sleep):
        fraction = float(fraction)
        if not 0.0 < fraction <= 1.0:
            raise ConfigError(f"an emulated speed fraction must be in (0, 1], got {fraction} (--emulate_speeds)")
        self.fraction = fraction
        self.spin = bool(spin)
        self.clock, self.sleep = clock, sleep
        self.t0 = None                  # unslowed seconds per sample, once calibrated
        self._recent = collections.deque(maxlen=WINDOW)   # spin mode: real compute per sample of the last steps

    @property
    def active(self) -> bool:
        return self.fraction < 1.0

    @property
    def calibrated(self) -> bool:
        return self.t0 is not None

    def calibrate(self, run_once, samples: int, passes: int = CALIBRATION_PASSES) -> float:
        """Time ``run_once()`` (a forward + backward of ``samples`` samples that changes no state the caller
        keeps) after one warm-up call; t0 = the median time per sample."""
        run_once()
        times = []
        for _ in range(passes):
            start = self.clock()
            run_once()
            times.append(self.clock() - start)
        self.t0 = statistics.median(times) / max(int(samples), 1)
        return self.t0

    def deadline(self, start: float, samples: int) -> float:
        return start + samples * self.t0 / self.fraction

    def pad(self, start: float, samples: int) -> float:
        """Wait until the emulated compute of ``samples`` samples begun at ``start`` would end; returns the
        seconds waited (0 when the real compute already took longer)."""
        if not self.active or self.t0 is None:
            return 0.0
        now = self.clock()
        if self.spin:
            self._recent.append((now - start) / max(int(samples), 1))
            if len(self._recent) >= 3:
                self.t0 = statistics.median(self._recent)
        end = self.deadline(start, samples)
        if end <= now:
            return 0.0
        if not self.spin and end - now > SPIN_S:
            self.sleep(end - now - SPIN_S)
        while self.clock() < end:
            pass
        return self.clock() - now
