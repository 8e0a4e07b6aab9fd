"""--emulate_speeds: make replica i behave as a device f_i / max(f) as fast as the fastest replicas.

What it models: a replica whose forward + backward of b samples takes b * t0 / f seconds, where t0 is the
time per sample of a replica running at full speed. Every step's compute is padded to that deadline.

- t0 starts as the replica's own time per sample, from calibration passes before its first step (one
  warm-up pass, then `CALIBRATION_PASSES` timed ones on its first local batch; the median per sample).
- Busy-waiting (below), until the reference is known (a speed probe before training) it follows the
  median of its own last `WINDOW` real computes per sample, which spinning leaves undistorted.
- Then it follows the reference replicas (those with f = max f, which are not slowed): the mean of
  their compute time per sample over the last `WINDOW` steps but the slowest one (a step that compiles
  kernels), which every rank has from the step's stats reduction (`follow`). So the replicas' speeds
  stay in the ratio of the factors while the machine's speed drifts, and one core being faster than
  another (a shared VM host) does not skew the ratio.
- When the node's cores hold every rank's threads (`spin=True`, what the launcher decides), the replica
  busy-waits to the deadline; otherwise (more threads than cores) it sleeps, to leave the cores to the
  others, and spins only for the last `SPIN_S` (a sleep can wake late).

Why not "sleep compute * (1/f - 1)": a process computes slower just after a sleep. On a 2-vCPU VM the real
compute of a 128-sample step went from 8 ms to 16 ms after each sleep (measured), so that made 1 : 0.5
measure as 1 : 0.33-0.54. A deadline absorbs the slowdown, and spinning avoids it.

The deadline is linear in b (a device f times as fast per sample as the reference at the reference's batch
size). What it does not model: memory (the emulated device holds what this one holds) and communication
(reductions run at this machine's speed).
"""
from __future__ import annotations

import collections
import statistics
import time

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance import median_call_seconds

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
        self._reference = collections.deque(maxlen=WINDOW)   # the reference replicas' time per sample
        self._own = collections.deque(maxlen=WINDOW)         # this replica's, until the reference is known

    @property
    def active(self) -> bool:
        return self.fraction < 1.0

    @property
    def calibrated(self) -> bool:
        return self.t0 is not None

    def calibrate(self, run_once, samples: int, passes: int = CALIBRATION_PASSES) -> float:
        """Time ``run_once()`` (a forward + backward of ``samples`` samples that changes no state the caller
        keeps) after one warm-up call; t0 = the median time per sample."""
        self.t0 = median_call_seconds(run_once, passes, warmup=1, clock=self.clock) / max(int(samples), 1)
        return self.t0

    def follow(self, reference_s_per_sample: float) -> None:
        """The last step's compute seconds per sample of the full-speed (reference) replicas."""
        if reference_s_per_sample > 0:
            self._reference.append(float(reference_s_per_sample))
            if len(self._reference) >= 3:       # a mean, as speeds are (a median would miss the slow steps),
                self.t0 = statistics.fmean(sorted(self._reference)[:-1])   # but not one compiling step

    def deadline(self, start: float, samples: int) -> float:
        return start + samples * self.t0 / self.fraction

    def pad(self, start: float, samples: int) -> float:
        """Wait until the emulated compute of ``samples`` samples begun at ``start`` would end; returns the
        seconds waited (0 when the real compute already took longer)."""
        if not self.active or self.t0 is None:
            return 0.0
        now = self.clock()
        if self.spin and len(self._reference) < 3:     # no reference yet (a speed probe): its own real compute
            self._own.append((now - start) / max(int(samples), 1))
            if len(self._own) >= 3:
                self.t0 = statistics.median(self._own)
        end = self.deadline(start, samples)
        if end <= now:
            return 0.0
        if not self.spin and end - now > SPIN_S:
            self.sleep(end - now - SPIN_S)
        while self.clock() < end:
            pass
        return self.clock() - now
