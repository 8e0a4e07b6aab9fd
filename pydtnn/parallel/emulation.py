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

--emulate_costs (`EmulatedCost`, `parse_costs`): replica i's compute of b samples takes a_i + c_i * b, a
fixed part per step and a per-sample part, so that a GPU (a large fixed cost, little per sample) can be
studied on a CPU. c_i is a factor on the replica's own per-sample time t0 (`2.0`: twice as slow per sample
as this machine) or an absolute time per sample (`0.5ms`). Here t0 is the replica's own, calibrated before
its first step (or, in a loop of your own, the median of its first real steps) and then kept: the costs are
a fixed function of b, which is what a cost model should find. Where the real compute already takes longer
than the emulated time, nothing is padded (the cost is then this machine's).

--emulate_schedule (`parse_schedule`): replica i's emulated time is multiplied by a factor during steps
[first, last) of the run (0-based global steps over epochs): a straggler, e.g. `1:3@200-400`. A replica
with a schedule also keeps its own t0 (it no longer follows the reference replicas, whose times it may slow).
"""
from __future__ import annotations

import collections
import re
import statistics
import time
from dataclasses import dataclass

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance import median_call_seconds

__all__ = ["SpeedEmulator", "EmulatedCost", "parse_costs", "parse_schedule", "for_replica",
           "CALIBRATION_PASSES", "SPIN_S", "WINDOW"]

CALIBRATION_PASSES = 5
SPIN_S = 0.002
WINDOW = 16


@dataclass(frozen=True)
class EmulatedCost:
    """a + c * b seconds for b samples: `fixed_s` = a; `per_sample_s` = c in seconds, or None and
    `factor` = c / t0 (t0 the replica's own real seconds per sample)."""
    fixed_s: float = 0.0
    factor: float = 1.0
    per_sample_s: float | None = None

    def text(self) -> str:
        c = f"{self.per_sample_s * 1e3:g}ms" if self.per_sample_s is not None else f"{self.factor:g}"
        return f"{self.fixed_s * 1e3:g}ms+{c}"


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(s|ms|us)?\s*$", re.IGNORECASE)


def _seconds(text, what):
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"--emulate_costs {what}: expected a duration such as 30ms, 0.5ms or 0, got {text!r}")
    return float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6, None: 1.0}[(m.group(2) or "").lower() or None], m.group(2)


def parse_costs(text: str) -> list[EmulatedCost]:
    """`A+C,A+C,...`: per replica a fixed time A (30ms, 0.03s, 0) plus C per sample (a factor on this
    machine's own time per sample, 2.0, or a time per sample, 0.5ms)."""
    out = []
    for part in [p for p in str(text).split(",") if p.strip()]:
        fixed, sep, per = part.partition("+")
        if not sep:
            raise ConfigError(f"--emulate_costs {part!r}: expected FIXED+PER_SAMPLE, e.g. 30ms+1.0 or 0+0.5ms")
        a, _ = _seconds(fixed, part)
        c, unit = _seconds(per, part)
        cost = EmulatedCost(a, 1.0, c) if unit else EmulatedCost(a, c, None)
        if (cost.per_sample_s is None and cost.factor < 1.0) or (a == 0 and c == 0):
            raise ConfigError(f"--emulate_costs {part!r}: a factor per sample is >= 1 (the real compute cannot be "
                              f"made faster), and a cost needs a fixed or a per-sample part")
        out.append(cost)
    if not out:
        raise ConfigError("--emulate_costs: give one FIXED+PER_SAMPLE per replica")
    return out


def parse_schedule(text: str) -> list[tuple[int, float, int, int]]:
    """`REPLICA:FACTOR@FIRST-LAST,...` -> [(replica, factor, first, last)]: the replica's emulated time times
    FACTOR during global steps FIRST <= s < LAST (0-based, over epochs)."""
    out = []
    for part in [p for p in str(text).split(",") if p.strip()]:
        m = re.fullmatch(r"\s*(\d+):([0-9.eE+-]+)@(\d+)-(\d+)\s*", part)
        try:
            rep, factor, first, last = int(m.group(1)), float(m.group(2)), int(m.group(3)), int(m.group(4))
        except (AttributeError, ValueError):
            raise ConfigError(f"--emulate_schedule {part!r}: expected REPLICA:FACTOR@FIRST-LAST, e.g. 1:3@200-400") from None
        if not (factor >= 1.0 and first < last):
            raise ConfigError(f"--emulate_schedule {part!r}: needs FACTOR >= 1 and FIRST < LAST")
        out.append((rep, factor, first, last))
    return out


def for_replica(rank: int, nreplicas: int, costs=None, schedule=None, spin=False, **kw) -> "SpeedEmulator":
    """The emulator of replica `rank` from --emulate_costs and --emulate_schedule text (or parsed lists)."""
    costs = parse_costs(costs) if isinstance(costs, str) else costs
    schedule = parse_schedule(schedule) if isinstance(schedule, str) else (schedule or [])
    if costs is not None and len(costs) != nreplicas:
        raise ConfigError(f"--emulate_costs has {len(costs)} values for {nreplicas} replicas")
    if any(r >= nreplicas for r, *_ in schedule):
        raise ConfigError(f"--emulate_schedule names replica {max(r for r, *_ in schedule)}; replicas are "
                          f"0..{nreplicas - 1}")
    mine = [(f, a, b) for r, f, a, b in schedule if r == rank]
    return SpeedEmulator(1.0, spin=spin, cost=None if costs is None else costs[rank], schedule=mine, **kw)


class SpeedEmulator:
    def __init__(self, fraction: float, spin: bool = False, clock=time.perf_counter, sleep=time.sleep,
                 cost: EmulatedCost | None = None, schedule=()):
        fraction = float(fraction)
        if not 0.0 < fraction <= 1.0:
            raise ConfigError(f"an emulated speed fraction must be in (0, 1], got {fraction} (--emulate_speeds)")
        self.fraction = fraction
        self.spin = bool(spin)
        self.clock, self.sleep = clock, sleep
        self.cost = cost                # --emulate_costs: a + c b instead of b t0 / fraction
        self.schedule = list(schedule)  # [(factor, first, last)]: this replica's slowdowns by global step
        self.step = 0                   # the global step being run (the loop sets it)
        self.own_t0 = cost is not None or bool(self.schedule)    # its own t0, kept (no reference followed)
        self.t0 = None                  # unslowed seconds per sample, once calibrated
        if cost is not None and cost.per_sample_s is not None:
            self.t0 = 0.0               # absolute costs: nothing to calibrate
        self._reference = collections.deque(maxlen=WINDOW)   # the reference replicas' time per sample
        self._own = collections.deque(maxlen=WINDOW)         # this replica's, until the reference is known

    @property
    def active(self) -> bool:
        return self.fraction < 1.0 or self.cost is not None or bool(self.schedule)

    @property
    def calibrated(self) -> bool:
        return self.t0 is not None

    def slowdown(self) -> float:
        """The schedule's factor at the current step."""
        f = 1.0
        for factor, first, last in self.schedule:
            if first <= self.step < last:
                f *= factor
        return f

    def calibrate(self, run_once, samples: int, passes: int = CALIBRATION_PASSES) -> float:
        """Time ``run_once()`` (a forward + backward of ``samples`` samples that changes no state the caller
        keeps) after one warm-up call; t0 = the median time per sample."""
        self.t0 = median_call_seconds(run_once, passes, warmup=1, clock=self.clock) / max(int(samples), 1)
        return self.t0

    def follow(self, reference_s_per_sample: float) -> None:
        """The last step's compute seconds per sample of the full-speed (reference) replicas."""
        if reference_s_per_sample > 0 and not self.own_t0:
            self._reference.append(float(reference_s_per_sample))
            if len(self._reference) >= 3:       # a mean, as speeds are (a median would miss the slow steps),
                self.t0 = statistics.fmean(sorted(self._reference)[:-1])   # but not one compiling step

    def deadline(self, start: float, samples: int) -> float:
        if self.cost is None:
            return start + samples * self.t0 / self.fraction * self.slowdown()
        per = self.cost.per_sample_s if self.cost.per_sample_s is not None else self.cost.factor * self.t0
        return start + (self.cost.fixed_s + samples * per) * self.slowdown()

    def pad(self, start: float, samples: int) -> float:
        """Wait until the emulated compute of ``samples`` samples begun at ``start`` would end; returns the
        seconds waited (0 when the real compute already took longer)."""
        if not self.active or samples <= 0:
            return 0.0
        now = self.clock()
        if self.own_t0 and (self.t0 is None or 0 < len(self._own) < 3):
            # not calibrated (a loop of your own): its own real time per sample, the median of its first steps
            self._own.append((now - start) / int(samples))
            self.t0 = statistics.median(self._own)
        elif self.spin and not self.own_t0 and len(self._reference) < 3:   # no reference yet: its own real compute
            self._own.append((now - start) / max(int(samples), 1))
            if len(self._own) >= 3:
                self.t0 = statistics.median(self._own)
        if self.t0 is None:
            return 0.0
        end = self.deadline(start, samples)
        if end <= now:
            return 0.0
        if not self.spin and end - now > SPIN_S:
            self.sleep(end - now - SPIN_S)
        while self.clock() < end:
            pass
        return self.clock() - now
