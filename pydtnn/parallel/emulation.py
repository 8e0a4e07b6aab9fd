"""--emulate_speeds: make replica i behave as a device f_i / max(f) as fast as the one it runs on.

What it models: a replica whose forward + backward of b samples takes b * t0 / f seconds, where t0 is the
replica's OWN unslowed time per sample, measured once in calibration passes before its first step (one
warm-up pass, then `CALIBRATION_PASSES` timed ones on its first local batch; the median). Every step's
compute is then padded to that deadline: the replica sleeps until shortly before it and spins for the
last `SPIN_S`, because a sleep can wake late on a busy machine.

Why a deadline and not "sleep compute * (1/f - 1)": a process computes slower just after a sleep (cold
caches, a descheduled virtual CPU), so stretching each step's measured compute stretched the slowdown
too, and 1 : 0.5 measured as 1 : 0.41-0.54. A deadline from a fixed t0 absorbs that slowdown as long as
the real compute stays under the deadline.

What it does not model: memory (the emulated device holds what this one holds), a per-step cost that
does not scale with b (the deadline is linear in b, calibrated at the first batch size), communication
(reductions run at this machine's speed), and drift: t0 is measured once, so if the machine becomes
busier later the emulated replica keeps its calibrated speed while the real ones slow down.
"""
from __future__ import annotations

import statistics
import time

from pydtnn.errors import ConfigError

__all__ = ["SpeedEmulator", "CALIBRATION_PASSES", "SPIN_S"]

CALIBRATION_PASSES = 5
SPIN_S = 0.002


class SpeedEmulator:
    def __init__(self, fraction: float, clock=time.perf_counter, sleep=time.sleep):
        fraction = float(fraction)
        if not 0.0 < fraction <= 1.0:
            raise ConfigError(f"an emulated speed fraction must be in (0, 1], got {fraction} (--emulate_speeds)")
        self.fraction = fraction
        self.clock, self.sleep = clock, sleep
        self.t0 = None                  # unslowed seconds per sample, once calibrated

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
        end = self.deadline(start, samples)
        now = self.clock()
        waited_from = now
        if end - now > SPIN_S:
            self.sleep(end - now - SPIN_S)
        while self.clock() < end:
            pass
        return max(0.0, self.clock() - waited_from) if end > waited_from else 0.0
