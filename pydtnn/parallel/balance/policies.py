"""The built-in balancing policies, written on `pydtnn.parallel.balance.BalancePolicy`, registered in ONE place
(`BUILTINS`, at the end): each entry's name, its `--balance_options`, its factory and its line of `--balance`'s
help; `NAMES`, `OPTIONS`, `make_policy` and `balance_help` are read from it.

    --balance none | equal      EqualPolicy     b_i = B / P (largest remainder)
    --balance static            StaticPolicy    b_i proportional to --replica_speeds;
                                                without them, FPMPolicy
    --balance probe             ProbePolicy     the constant model: b_i proportional to speeds timed at B / P
    --balance fpm               FPMPolicy       the functional model: t_i(b) probed at several b, equal finish
                                                times (pydtnn.parallel.balance.fpm_probe, fpm_partition)
    --balance dynamic           DynamicPolicy   fpm, then each interval's measured t_i(b_i) folded in and
                                                re-solved; a re-split when the makespan improves enough
    --balance FILE.py:CLASS     a user's BalancePolicy subclass, constructed with --balance_options
    --balance module:CLASS
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from dataclasses import dataclass
from typing import Callable

from pydtnn import plugins
from pydtnn.errors import ConfigError
from pydtnn.parallel.balance import BalancePolicy
from pydtnn.parallel.balance.proportional import partition
from pydtnn.parallel.balance.cost_model import CostModel, ReplicaCost
from pydtnn.parallel.balance.fpm_partition import equal_finish
from pydtnn.parallel.balance.fpm_probe import build_model, grown_buckets
from pydtnn.parallel.balance.policy_state import check_state
from pydtnn.parallel.balance.step_report import StepReport

class EqualPolicy(BalancePolicy):
    name = "equal"
    measured = False
    deterministic = True


class StaticPolicy(BalancePolicy):
    """b_i proportional to given relative speeds (one per replica)."""
    name = "static"
    measured = False
    deterministic = True

    def __init__(self, speeds):
        self.speeds = [float(v) for v in speeds]

    def initial_sizes(self, global_batch, nreplicas, caps):
        if len(self.speeds) != nreplicas:
            raise ConfigError(f"--replica_speeds has {len(self.speeds)} values for {nreplicas} replicas")
        return partition(global_batch, self.speeds, caps)


class ProbePolicy(BalancePolicy):
    """The constant model (FuPerMod's CPM): b_i proportional to each replica's speed, timed at B / P."""
    name = "probe"
    wants_probe = True
    deterministic = True
    speeds = None

    def probed(self, global_batch, speeds, caps):
        self.speeds = [float(v) for v in speeds]
        return partition(global_batch, self.speeds, caps)

    def describe(self):
        if self.speeds is None:
            return []
        return ["constant model: speeds probed at the equal split " +
                ", ".join(f"{v:.4g}" for v in self.speeds) + " samples/s"]


class FPMPolicy(BalancePolicy):
    """The functional performance model: each replica's t_i(b) probed at several local batches and refined
    (`pydtnn.parallel.balance.fpm_probe`), then the split with equal finish times (`fpm_partition.equal_finish`).

    Options: points (per replica, >= 4), rounds (refinement, 3), tolerance (0.05), bucket (GPU replicas'
    local batches are multiples of it, 8; 1: none), allow_zero (replicas that may get 0 samples, e.g. 2:3),
    probe_s (seconds of timed passes per probe point, 0.2, in [0.01, 60]: longer probes for noisy times).
    """
    name = "fpm"
    wants_costs = True
    deterministic = True

    def __init__(self, points=4, rounds=3, tolerance=0.05, bucket=8, allow_zero="", probe_s=0.2):
        self.points = _int_option("points", points, 4, 64)
        self.rounds = _int_option("rounds", rounds, 0, 64)
        self.tolerance = _float_option("tolerance", tolerance, 0.0, 1.0)
        self.bucket = _int_option("bucket", bucket, 1)
        self.probe_s = _float_option("probe_s", probe_s, 0.01, 60.0, closed=True)
        self._zero = str(allow_zero)
        self.model: CostModel | None = None
        self.buckets = None
        self.lines: list[str] = []
        self.global_batch, self.caps = 0, None

    def bind(self, rank, nreplicas, devices=None, options=None):
        super().bind(rank, nreplicas, devices, options)
        try:
            zero = {int(v) for v in self._zero.replace(":", " ").split()}
        except ValueError:
            raise ConfigError(f"--balance_options allow_zero={self._zero}: replicas as 0:2:...") from None
        if any(not 0 <= r < self.nreplicas for r in zero):
            raise ConfigError(f"--balance_options allow_zero={self._zero}: replicas are 0..{self.nreplicas - 1}")
        self.allow_zero = tuple(sorted(zero))

    def minimum(self):
        return [0 if i in self.allow_zero else 1 for i in range(self.nreplicas)]

    def initial_sizes(self, global_batch, nreplicas, caps):
        if self.nreplicas != nreplicas:
            self.bind(self.rank, nreplicas, None, self.options)
        self.global_batch = int(global_batch)
        self.limit(caps)
        if self.model is not None:
            return self.solve()
        return partition(global_batch, [1.0] * int(nreplicas), caps)

    def limit(self, caps):
        """The bounds on the shares in force (None under the launcher, whose memory caps bound a pass: the probe
        hands them to the engine) and the buckets under them."""
        self.caps = caps
        asked = [self.bucket if d == "gpu" else 1 for d in self.devices]
        self.buckets = grown_buckets(self.global_batch, caps, self.minimum(), asked)

    def probe_costs(self, probe):
        if hasattr(probe, "target_s"):                    # the launcher's lock-step probe: longer with probe_s
            probe.target_s = self.probe_s
        self.limit(probe.caps)
        self.model, split, self.lines = build_model(probe, self.minimum(), self.buckets, self.points,
                                                    self.rounds, self.tolerance)
        return split

    def solve(self):
        return equal_finish(self.global_batch, self.model, self.caps, self.minimum(), self.buckets)

    def describe(self):
        if self.model is None:
            return []
        doubts = self.model.doubts()
        advice = ([f"advice: {'; '.join(doubts)}: the probe's times are noisy (a loaded machine?); more points "
                   f"(--balance_options points={2 * self.points}), longer probes (probe_s={min(60.0, 5 * self.probe_s):g}) "
                   f"or a quieter machine give a firmer model"] if doubts else [])
        return [f"cost model ({self.name}, t_i(b) = compute seconds of a step of b samples):",
                *(f"  {line}" for line in self.model.describe()), *self.lines, *advice]

    def state_dict(self):
        return {"model": None if self.model is None else self.model.state_dict()}

    def load_state_dict(self, state):
        check_state(state, self.nreplicas)               # a checkpoint is data: types and ranges first
        model = state.get("model")
        self.model = None if model is None else CostModel.from_state(model, "balance policy state")
        if self.model is not None and len(self.model) != self.nreplicas:
            raise ConfigError(f"its cost model has {len(self.model)} replicas, this run {self.nreplicas}")


class DynamicPolicy(FPMPolicy):
    """FPM, then refits during training: every `interval` steps each replica's median compute seconds at
    its b_i (warm-up steps left out) is folded into its model, and the model solved again; the new split
    is taken when it predicts a makespan at least `hysteresis` (5%) shorter.

    Folding: a median at a local batch the replica has a point at, off that point by more than `drift`
    (10%) and by more than 3 standard errors of the replica's step-to-step noise (its robust spread,
    averaged over intervals), in two intervals in a row and the same direction, means the device changed
    speed (a straggler, another job): every point of that replica is scaled by the same factor and the
    median replaces its point, so the model follows within two intervals (a large deviation seen once, a
    pause or a hiccup, is left out). Anything else is noise: the median moves its point by `SMOOTHING` of
    the difference (an average over intervals, so that noise does not flip the split back and forth). A
    median at a new local batch is a new point: the model's shape.

    Options: those of fpm, and hysteresis, drift, probe (false: start from the equal split and learn
    from training steps alone)."""
    name = "dynamic"
    checkpoint_key = "balancer"          # the key of the checkpoints written before policies were plug-ins
    SMOOTHING = 0.15

    def __init__(self, interval=20, hysteresis=0.05, drift=0.10, probe=True, **fpm):
        super().__init__(**fpm)
        self.interval = _int_option("interval", interval, 1)
        self.hysteresis = _float_option("hysteresis", hysteresis, 0.0, 1.0)
        self.drift = _float_option("drift", drift, 0.0, math.inf)
        self.wants_costs = _bool_option("probe", probe)
        self.window: list = []         # the interval's steps: (sizes, compute seconds or NaN where unusable)
        self.noise: list = []          # per replica: its steps' relative spread, averaged over intervals
        self.suspect: list = []        # per replica: the direction of last interval's large deviation, or 0
        self.n_rebalances = 0

    def initial_sizes(self, global_batch, nreplicas, caps):
        self.window = []
        self.noise, self.suspect = [None] * int(nreplicas), [0] * int(nreplicas)
        return super().initial_sizes(global_batch, nreplicas, caps)

    def after_step(self, step, report):
        report = StepReport.of(report, self.sizes)
        b, t = np.asarray(report.sizes, dtype=np.float64), np.asarray(report.compute_s, dtype=np.float64)
        usable = (b > 0) & ~np.asarray(report.warmup, dtype=bool) & np.isfinite(t) & (t > 0)
        self.window.append((b, np.where(usable, t, np.nan)))
        if (int(step) + 1) % self.interval:
            return None
        self.fold()
        if self.model is None:
            return None
        candidate = self.solve()
        now, new = self.model.makespan(self.sizes), self.model.makespan(candidate)
        if candidate == list(self.sizes) or new > now * (1 - self.hysteresis):
            return None
        self.reason = f"predicted makespan {now * 1e3:.4g} -> {new * 1e3:.4g} ms ({new / now - 1:+.0%})"
        self.n_rebalances += 1
        return candidate

    def fold(self):
        """Each replica's window (the steps of the interval) into its model: the median at its usual b."""
        points = _window_points(self.window, self.nreplicas)
        self.window = []
        if self.model is None:
            if any(p is None for p in points):
                return
            self.model = CostModel([ReplicaCost([p[:2]]) for p in points], self.devices)
            self.noise = [p[2] for p in points]
            return
        for i, (cost, p) in enumerate(zip(self.model.replicas, points)):
            if p is None:
                continue
            b, t, spread, n = p
            self.noise[i] = spread if self.noise[i] is None else self.noise[i] + 0.2 * (spread - self.noise[i])
            if b not in cost.points:                          # a new local batch: the model's shape there
                cost.add(b, t)
                self.suspect[i] = 0
                continue
            off = t / cost.points[b] - 1                      # at a b it ran before: the same work
            large = abs(off) > max(self.drift, 3 * 1.25 * self.noise[i] / np.sqrt(n))
            if large and np.sign(off) == self.suspect[i]:    # twice: the device changed speed, all its points
                cost.scale(1 + off)
                cost.add(b, t)
                self.suspect[i] = 0
                continue
            self.suspect[i] = int(np.sign(off)) if large else 0
            if not large:                                     # noise: an average over intervals (once large:
                cost.add(b, cost.points[b] + self.SMOOTHING * (t - cost.points[b]))   # a hiccup, or to confirm)

    def state_dict(self):
        per_replica = [[[float(b[i]), float(t[i])] for b, t in self.window if np.isfinite(t[i])]
                       for i in range(self.nreplicas)]
        return {**super().state_dict(), "window": per_replica,
                "noise": list(self.noise), "suspect": list(self.suspect), "n_rebalances": self.n_rebalances}

    def load_state_dict(self, state):
        if isinstance(state, dict) and "ema" in state:    # a checkpoint of the constant-model balancer: its speeds
            ema = np.asarray(state.get("ema", []), dtype=np.float64).reshape(-1)
            if ema.size not in (0, self.nreplicas):
                raise ConfigError(f"'ema' has {ema.size} speeds for {self.nreplicas} replicas")
            sizes = [int(b) for b in np.asarray(state["sizes"]).reshape(-1)]
            self.model = (CostModel([ReplicaCost([(b, b / v)]) for b, v in zip(sizes, ema)], self.devices)
                          if ema.size else None)
            self.n_rebalances = int(state.get("n_rebalances", 0))
            return
        super().load_state_dict(state)
        window = state.get("window", [])
        if len(window) not in (0, self.nreplicas):
            raise ConfigError(f"'window' has {len(window)} replicas for {self.nreplicas}")
        rows = max((len(w) for w in window), default=0)        # back to steps (each replica's column alone)
        self.window = [(np.array([float(w[k][0]) if k < len(w) else 0.0 for w in window]),
                        np.array([float(w[k][1]) if k < len(w) else np.nan for w in window])) for k in range(rows)]
        noise, suspect = state.get("noise", []), state.get("suspect", [])
        self.noise = [None if v is None else float(v) for v in noise] if len(noise) == self.nreplicas \
            else [None] * self.nreplicas
        self.suspect = [int(v) for v in suspect] if len(suspect) == self.nreplicas else [0] * self.nreplicas
        self.n_rebalances = int(state.get("n_rebalances", 0))


def _window_points(window, P):
    """Per replica (b, median seconds, relative spread of the steps, their count) of an interval's usable steps
    at the b most of them ran (the larger b on a tie), or None where none was usable; all replicas at once."""
    if not window:
        return [None] * P
    B = np.array([w[0] for w in window])                       # (steps, P)
    T = np.array([w[1] for w in window])
    usable = np.isfinite(T)
    counts = ((B[:, None, :] == B[None, :, :]) & usable[None, :, :]).sum(axis=1)   # steps at each row's b
    best = np.argmax(np.where(usable, counts * (B.max() + 1) + B, -1), axis=0)
    b = B[best, np.arange(P)]
    sel = np.where(usable & (B == b), T, np.nan)
    n = np.sum(np.isfinite(sel), axis=0)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)           # a replica without usable steps: all NaN
        med = np.nanmedian(sel, axis=0)
        spread = 1.4826 * np.nanmedian(np.abs(np.log(sel / med)), axis=0)    # the MAD of log times: a robust sigma
    return [None if n[i] == 0 else (int(b[i]), float(med[i]), float(spread[i]), int(n[i])) for i in range(P)]


# ----------------------------------------------------------------------------------------- options

def _int_option(name, value, minimum, maximum=None):
    try:
        v = int(value)
        if v != value and not isinstance(value, str):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"--balance_options {name}={value}: must be an integer") from None
    if v < minimum or (maximum is not None and v > maximum):
        raise ConfigError(f"--balance_options {name}={value}: must be >= {minimum}"
                          + (f" and <= {maximum}" if maximum is not None else ""))
    return v


def _float_option(name, value, lo, hi, closed=False):
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"--balance_options {name}={value}: must be a number") from None
    if not (lo <= v <= hi if closed else lo <= v < hi):
        raise ConfigError(f"--balance_options {name}={value}: must be in [{lo}, {hi}{']' if closed else ')'}")
    return v


def _bool_option(name, value):
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise ConfigError(f"--balance_options {name}={value}: must be true or false")
    return text in ("true", "1", "yes")


# ---------------------------------------------------------------------------------------- the registry

@dataclass(frozen=True)
class Builtin:
    """A built-in policy: `make(speeds, interval, options)` builds it; `options` are the --balance_options it
    takes; `help` is its part of --balance's help; `without_speeds`: the built-in it becomes when no
    --replica_speeds are given (static: fpm)."""
    make: Callable[..., BalancePolicy]
    options: tuple = ()
    help: str = ""
    without_speeds: str | None = None


_FPM_OPTIONS = ("points", "rounds", "tolerance", "bucket", "allow_zero", "probe_s")


def _fpm(speeds, interval, options):
    policy = FPMPolicy(**options)
    policy.options = options
    return policy


BUILTINS = {
    "none": Builtin(lambda *_: EqualPolicy(), help="none or equal: B/P each"),
    "equal": Builtin(lambda *_: EqualPolicy()),
    "static": Builtin(lambda speeds, *_: StaticPolicy(speeds), without_speeds="fpm",
                      help="static: proportional to --replica_speeds (without them: fpm)"),
    "probe": Builtin(lambda *_: ProbePolicy(),
                     help="probe: proportional to speeds probed at B/P (the constant model)"),
    "fpm": Builtin(_fpm, _FPM_OPTIONS,
                   help="fpm: each replica's compute time probed at several local batches (a functional performance "
                        "model) and the split with equal finish times"),
    "dynamic": Builtin(lambda speeds, interval, options: DynamicPolicy(interval=interval, **options),
                       _FPM_OPTIONS + ("hysteresis", "drift", "probe"),
                       help="dynamic: fpm, refitted and re-split during training"),
}
NAMES = tuple(BUILTINS)
OPTIONS = {name: b.options for name, b in BUILTINS.items() if b.options}


def balance_help() -> str:
    """--balance's help, one clause per built-in, then a user's policy."""
    return ("split of the global batch: " + "; ".join(b.help for b in BUILTINS.values() if b.help)
            + "; or a user's BalancePolicy, FILE.py:CLASS or module:CLASS (docs/balancing.md)")


def make_policy(spec="none", *, speeds=None, interval=20, options=None) -> BalancePolicy:
    """The policy a --balance value names (a built-in name, FILE.py:CLASS or module:CLASS), or `spec` itself
    when it already is a BalancePolicy. `options`: the --balance_options dict."""
    options = dict(options or {})
    if isinstance(spec, BalancePolicy):
        return spec
    if plugins.is_spec(spec):
        policy = plugins.construct(spec, "--balance", BalancePolicy, kwargs=options)
        if not isinstance(getattr(policy, "name", None), str) or policy.name == BalancePolicy.name:
            policy.name = type(policy).__name__      # what checkpoints match on resume, wherever the file is
        policy.options = options
        return policy
    if spec not in BUILTINS:
        raise ConfigError(f"--balance must be one of {', '.join(NAMES)}, FILE.py:CLASS or module:CLASS, "
                          f"got {spec!r}")
    kind = BUILTINS[spec].without_speeds if not speeds and BUILTINS[spec].without_speeds else spec
    builtin = BUILTINS[kind]
    unknown = sorted(set(options) - set(builtin.options))
    if unknown:
        takes = ", ".join(builtin.options) or "none"
        raise ConfigError(f"--balance_options {', '.join(unknown)}: --balance {spec} takes {takes}")
    return builtin.make(speeds, interval, options)
