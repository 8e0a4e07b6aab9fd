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
studied on a CPU. c_i is a factor on this machine's time per sample t0 (`2.0`: twice as slow per sample as this
machine) or an absolute time per sample (`0.5ms`). Under the launcher t0 is measured once, before the probe
and training, and agreed by every rank (`SpeedEmulator.agree_on_base`, timed by
`pydtnn.parallel.balance.probe.agree_on_emulated_base`): every replica times passes on the same B/P samples,
all at once, and t0 is the median of the replicas' times per sample, printed. So two replicas given the same factor get the same cost
whatever load each saw (each replica's own t0 once fitted the same "15.0" at 1.9 and 3.9 ms per sample in
one run). In a loop of your own (no such collective point), t0 is the replica's own, the median of its
first real steps. Either way t0 is then kept: the costs are a fixed function of b, which is what a cost model
should find. Where the real compute already takes longer than the emulated time, nothing is padded (the cost
is then this machine's).

--emulate_schedule (`parse_schedule`): replica i's emulated time is multiplied by a factor during steps
[first, last) of the run (0-based global steps over epochs): a straggler, e.g. `1:3@200-400`. A replica
with a schedule also keeps its own t0 (it no longer follows the reference replicas, whose times it may slow).

Bounds (`check_emulation`, before any work, for the command line's values and a resumed checkpoint's): a fixed
part of at most `MAX_FIXED_S` (60 s), an absolute time per sample of at most `MAX_PER_SAMPLE_S` (10 s), and no
replica emulated more than `MAX_SLOWDOWN` (1000) times slower than this machine: a factor per sample, a
schedule's factors in force at once times its cost factor, and the slowest --emulate_speeds against the
fastest; a schedule's steps are below `MAX_STEP` (10^9). Infinite values and a fixed cost of years were
once accepted and ended in a traceback or a step that never ended.

A padded step looks at `interrupted()` (the Trainer's: a stop signal is pending) at least every `CHECK_S`
(0.25 s) and returns early when it is: a signal stops an emulated step of any length within a second, and
the step's record then carries the signal to every rank.
"""
from __future__ import annotations

import collections
import contextlib
import math
import re
import statistics
import time
from dataclasses import dataclass, field, replace

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance import median_call_seconds

__all__ = ["SpeedEmulator", "EmulatedCost", "parse_costs", "parse_schedule", "for_replica", "check_emulation",
           "check_speeds", "CALIBRATION_PASSES", "SPIN_S", "WINDOW", "CHECK_S", "MAX_FIXED_S", "MAX_PER_SAMPLE_S",
           "MAX_SLOWDOWN", "MAX_STEP"]

CALIBRATION_PASSES = 5
SPIN_S = 0.002
WINDOW = 16
CHECK_S = 0.25                 # a padded step looks for a pending stop this often
MAX_FIXED_S = 60.0             # --emulate_costs' fixed part per step
MAX_PER_SAMPLE_S = 10.0        # --emulate_costs' absolute time per sample
MAX_SLOWDOWN = 1000.0          # the most times slower than this machine that a replica is emulated
MAX_STEP = 10 ** 9             # --emulate_schedule's steps (the message says 10^9)


@dataclass(frozen=True)
class EmulatedCost:
    """a + c * b seconds for b samples: `fixed_s` = a; `per_sample_s` = c in seconds, or None and
    `factor` = c / t0 (t0 the replica's own real seconds per sample)."""
    fixed_s: float = 0.0
    factor: float = 1.0
    per_sample_s: float | None = None
    # some replica's cost is a factor: the ranks agree on t0 before training (how c is grounded, not the cost)
    agreed_base: bool = field(default=False, compare=False)

    def text(self) -> str:
        c = f"{self.per_sample_s * 1e3:g}ms" if self.per_sample_s is not None else f"{self.factor:g}"
        return f"{self.fixed_s * 1e3:g}ms+{c}"


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(s|ms|us)?\s*$", re.IGNORECASE)


def _seconds(text, what):
    m = _DURATION.match(text)
    if not m:
        raise ConfigError(f"--emulate_costs {what}: expected a duration such as 30ms, 0.5ms or 0, got {text!r}")
    value = float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6, None: 1.0}[(m.group(2) or "").lower() or None]
    if not math.isfinite(value):
        raise ConfigError(f"--emulate_costs {what!r}: {text.strip()} is not a finite number")
    return value, m.group(2)


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
        if a > MAX_FIXED_S:
            raise ConfigError(f"--emulate_costs {part!r}: the fixed part per step must be at most "
                              f"{MAX_FIXED_S:g} s, got {a:g} s")
        if unit and c > MAX_PER_SAMPLE_S:
            raise ConfigError(f"--emulate_costs {part!r}: a time per sample must be at most {MAX_PER_SAMPLE_S:g} s, "
                              f"got {c:g} s")
        if not unit and c > MAX_SLOWDOWN:
            raise ConfigError(f"--emulate_costs {part!r}: a factor per sample must be in [1, {MAX_SLOWDOWN:g}] (at "
                              f"most {MAX_SLOWDOWN:g} times slower than this machine), got {c:g}")
        out.append(cost)
    if not out:
        raise ConfigError("--emulate_costs: give one FIXED+PER_SAMPLE per replica")
    agreed = any(c.per_sample_s is None for c in out)      # a factor: every rank takes part in t0's agreement
    return [replace(c, agreed_base=agreed) for c in out]


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
        if not (1.0 <= factor <= MAX_SLOWDOWN and first < last <= MAX_STEP):
            raise ConfigError(f"--emulate_schedule {part!r}: needs 1 <= FACTOR <= {MAX_SLOWDOWN:g} and "
                              f"FIRST < LAST <= 10^9 (0-based global steps)")
        out.append((rep, factor, first, last))
    return out


def check_speeds(speeds) -> None:
    """--emulate_speeds: positive finite numbers (the parser's), the slowest at most MAX_SLOWDOWN times slower."""
    if speeds and max(speeds) / min(speeds) > MAX_SLOWDOWN:
        raise ConfigError(f"--emulate_speeds {','.join(f'{v:g}' for v in speeds)}: the slowest replica would be "
                          f"{max(speeds) / min(speeds):.3g} times slower than the fastest; at most "
                          f"{MAX_SLOWDOWN:g}")


def peak_slowdown(schedule) -> float:
    """The largest product of a replica's schedule factors [(factor, first, last)] in force at one step."""
    return max((math.prod(f for f, a, b in schedule if a <= s < b) for _, s, _ in schedule), default=1.0)


def check_emulation(nreplicas, speeds=None, costs=None, schedule=None) -> None:
    """Every --emulate_* value within its range and for `nreplicas` replicas (`costs`, `schedule`: the flags'
    text or parsed lists), or one ConfigError line naming the flag: no replica is emulated more than
    MAX_SLOWDOWN times slower than this machine, a factor per sample times its schedule's included."""
    if speeds is not None:
        check_speeds(speeds)
    costs = parse_costs(costs) if isinstance(costs, str) else costs
    schedule = parse_schedule(schedule) if isinstance(schedule, str) else (schedule or [])
    for rank in range(int(nreplicas)):
        emulator = for_replica(rank, nreplicas, costs, schedule)
        cost = emulator.cost
        factor = cost.factor if cost is not None and cost.per_sample_s is None else 1.0
        if speeds:
            factor = max(speeds) / speeds[rank] if len(speeds) == nreplicas else 1.0
        peak = peak_slowdown(emulator.schedule)
        if factor * peak > MAX_SLOWDOWN:
            given = "--emulate_costs' factor" if cost is not None and cost.per_sample_s is None else (
                "--emulate_speeds'" if speeds else "")
            why = f" ({given} {factor:.3g} x the schedule's {peak:.3g})" if given else ""
            raise ConfigError(f"--emulate_schedule: replica {rank} would be emulated {factor * peak:.3g} times "
                              f"slower than this machine at once{why}; at most {MAX_SLOWDOWN:g}")


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
        self.base = None                # agree_on_base: (t0, every replica's seconds per sample, samples, passes)
        self.interrupted = lambda: False   # a stop is pending (the Trainer's signal flag): a pad returns early
        self.cut_short = False          # the last pad returned early on it
        self._paused = False            # unpadded(): passes that must not be padded (a warm-up, the base's timing)
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

    @property
    def agrees_on_base(self) -> bool:
        """Whether this run's ranks agree on t0 before training (some replica's cost is a factor): the same on
        every rank of a launcher's run (`parse_costs`), so it decides a collective."""
        return self.cost is not None and self.cost.agreed_base and self.base is None

    def agree_on_base(self, every_s_per_sample, samples: int, passes: int) -> str:
        """t0 = the median of every replica's time per sample (`every_s_per_sample`, gathered by the caller,
        the same list on every rank); returns the line that says so."""
        every = [float(v) for v in every_s_per_sample]
        base = float(statistics.median(every))
        self.base = (base, every, int(samples), int(passes))
        if self.cost.per_sample_s is None:
            self.t0 = base
        shown = ", ".join(f"{v * 1e3:.4g}" for v in every)
        return (f"emulation: --emulate_costs factors multiply a base of {base * 1e3:.4g} ms per sample, the median "
                f"of the replicas' own ({shown} ms; {passes} passes of {samples} samples, all replicas at once), "
                f"agreed by every rank")

    @contextlib.contextmanager
    def unpadded(self):
        """Passes run at this machine's own speed (a warm-up, the timing of the base): no pad, no calibration."""
        before, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = before

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
        self.cut_short = False
        if not self.active or samples <= 0 or self._paused:
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
        self._wait(now, end)
        return self.clock() - now

    def _wait(self, now, end):
        """Sleep (or spin) from `now` to `end`, looking for a pending stop at least every CHECK_S: a stop ends
        it early (`cut_short`)."""
        while True:
            if self.interrupted():
                self.cut_short = True
                return
            leg = min(end, now + CHECK_S)
            if not self.spin and end - now > SPIN_S:
                self.sleep(min(leg, end - SPIN_S) - now)      # a sleep, then the last SPIN_S spun
            else:
                while self.clock() < leg:
                    pass
                if leg == end:
                    return
            now = self.clock()
            if now >= end:
                return
