"""Heterogeneity-aware data parallelism: speeds, batch partition, gradient weights, sharding, rebalancing.

Everything here is plain arithmetic on its arguments (no MPI, no clocks, no hidden state shared between
ranks), except `probe_speeds`, which times a callable and allgathers the result. Every rank that calls
these functions with the same arguments gets the same answer, so the ranks agree on batch sizes, on
the number of steps and on who takes which sample without ever talking about it.

Notation (DESIGN.md, "Data-parallel step"): P replicas, global batch B, replica i holds b_i samples,
sum_i b_i = B, speeds v_i in samples/s.

Sharding policy
---------------
Every epoch all ranks hold the same permutation ``order`` of the N sample indices
(`epoch_permutation`). Global step s covers the positions [s*B, (s+1)*B) of ``order`` and replica i
takes its contiguous sub-slice of b_i positions, starting at sum(b_<i).

* ``steps_per_epoch == 0`` (a full epoch): ``ceil(N / B)`` steps. All steps but the last are full. The
  last one holds r = N - (steps - 1) * B samples (1 <= r <= B); when r < B it is re-split in proportion
  to the current sizes with the same largest-remainder rule (``partition(r, sizes)``). When r < P
  (fewer samples left than replicas, or N < P) the last step is padded to P samples by wrapping around
  to the start of ``order``, so that every replica still gets exactly one sample: those P - r samples
  are seen twice in that epoch. This is the only case in which an epoch is not an exact cover of the
  data set.
* ``steps_per_epoch > 0``: exactly that many FULL steps (B samples each); positions are taken modulo N,
  so the epoch is trimmed when steps * B < N and tiles (wraps around) the order when steps * B > N.

Gradient weights of a step are computed from that step's sizes (``gradient_weights(step_sizes(...))``),
so a short last step is still the exact mean over its samples.
"""
from __future__ import annotations

import math
import numbers
import time
from fractions import Fraction
from typing import Callable, Sequence

import numpy as np

from pydtnn.errors import ConfigError

__all__ = [
    "partition", "caps_for", "gradient_weights", "predicted_step_time", "steps_in_epoch", "step_span", "step_sizes",
    "shard", "epoch_permutation", "DynamicBalancer", "probe_speeds", "median_call_seconds", "WEIGHTING_MODES",
    "BalancePolicy", "check_split",
]

WEIGHTING_MODES = ("proportional", "uniform")


# ----------------------------------------------------------------------------------------- validation

def _int(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def _speeds(speeds, what: str = "replica speeds") -> list[float]:
    try:
        arr = np.asarray(speeds, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be numbers, got {speeds!r}") from None
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1 or arr.size == 0:
        raise ConfigError(f"{what} must be a non-empty list of numbers, got {speeds!r}")
    if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ConfigError(f"{what} must be finite and > 0, got {arr.tolist()}")
    return [float(x) for x in arr]


def _sizes(sizes, global_batch: int | None = None) -> list[int]:
    try:
        vals = [int(s) for s in sizes]
        exact = all(int(s) == s for s in sizes)
    except (TypeError, ValueError):
        raise ConfigError(f"local batch sizes must be integers, got {sizes!r}") from None
    if not vals or not exact or min(vals) < 1:
        raise ConfigError(f"local batch sizes must be integers >= 1, got {list(sizes)!r}")
    if global_batch is not None and sum(vals) != global_batch:
        raise ConfigError(f"local batch sizes {vals} sum to {sum(vals)}, not to the global batch {global_batch}")
    return vals


# ------------------------------------------------------------------------------------------ partition

def caps_for(caps, nreplicas: int, what: str = "--max_local_batch") -> list[int] | None:
    """Per-replica local batch caps from one value for all or one per replica (None: no caps)."""
    if caps is None:
        return None
    vals = [caps] if isinstance(caps, (int, float, np.integer, np.floating)) else list(caps)
    if len(vals) == 1:
        vals = vals * nreplicas
    if len(vals) != nreplicas:
        raise ConfigError(f"{what} has {len(vals)} values for {nreplicas} replicas (give one for all, or one "
                          f"per replica)")
    return [_int(v, what, 1) for v in vals]


def partition(global_batch: int, speeds: Sequence[float], caps: Sequence[int] | None = None) -> list[int]:
    """Split ``global_batch`` samples into P integer local batches b_i proportional to ``speeds``.

    Largest-remainder (Hamilton) apportionment, computed in exact rational arithmetic:
    quota q_i = B * v_i / sum(v); b_i = floor(q_i), and the B - sum(floor) samples left go one each to
    the largest fractional parts, ties to the lower rank. Constraint b_i >= 1: a replica whose quota is
    below 1 gets exactly 1 sample and the others share the rest by the same rule (repeated until no
    quota is below 1). So |b_i - q_i| < 1 whenever every q_i >= 1, b_i < q_i + 1 always, faster
    replicas never get fewer samples, and sum(b) == B.

    Memory caps (``caps``, one int >= 1 per replica, e.g. from --max_local_batch): b_i <= cap_i. A
    replica whose quota exceeds its cap gets exactly its cap, and the excess is shared by the others in
    proportion to their speeds (water filling: repeated until no quota exceeds its cap); the rounding
    above never lifts a replica over its cap, since one at its cap has no fractional part.

    Raises ConfigError when B < P, when the caps sum to less than B, or when a speed is not finite and > 0.
    """
    v = _speeds(speeds)
    nrep = len(v)
    batch = _int(global_batch, "global batch size", 1)
    if batch < nrep:
        raise ConfigError(f"global batch size {batch} is smaller than the number of replicas {nrep}: "
                          f"every replica needs at least one sample")
    caps = caps_for(caps, nrep, "local batch caps")
    if caps is not None and sum(caps) < batch:
        raise ConfigError(f"the local batch caps {caps} (--max_local_batch) hold {sum(caps)} samples, fewer than "
                          f"the global batch {batch}: raise the caps or lower --global_batch_size")
    if caps is None:
        fast = _proportional_in_integers(batch, v)
        if fast is not None:
            return fast
    quota = _water_level(batch, [Fraction(x) for x in v], caps)
    sizes = [math.floor(q) for q in quota]
    left = batch - sum(sizes)
    by_remainder = sorted(range(nrep), key=lambda i: (-(quota[i] - sizes[i]), i))
    for i in by_remainder[:left]:
        sizes[i] += 1
    return sizes


def _proportional_in_integers(batch: int, v: list[float]) -> list[int] | None:
    """The same split when no cap binds and every quota is >= 1, in integers (about 100x faster
    than fractions at 16,384 replicas, and exact): every float is n / 2^k, so over their common
    denominator the speeds are integers m_i and q_i = B m_i / S with S = sum(m). Then b_i = (B m_i) // S,
    and the fractional parts, all over the same S, compare as the remainders (B m_i) % S. None when a
    quota is below 1 (the water level's job)."""
    ratios = [x.as_integer_ratio() for x in v]
    den = max(d for _, d in ratios)                  # powers of two: each divides the largest
    m = [n * (den // d) for n, d in ratios]
    total = sum(m)
    if batch * min(m) < total:
        return None
    sizes, rem = zip(*(divmod(batch * x, total) for x in m))
    sizes = list(sizes)
    for i in sorted(range(len(m)), key=lambda i: (-rem[i], i))[:batch - sum(sizes)]:
        sizes[i] += 1
    return sizes


def _water_level(batch: int, v: list[Fraction], caps: list[int] | None) -> list[Fraction]:
    """Exact quotas q_i = clamp(lam * v_i, 1, cap_i) with sum(q) == batch: the proportional shares of the
    replicas within their bounds, the others at a bound. sum(q) grows piecewise linearly in lam, with
    breakpoints where a replica reaches 1 or its cap; find the segment that holds ``batch`` and solve."""
    hi_of = [None if caps is None else Fraction(c) for c in (caps or [None] * len(v))]
    clamp = lambda lam, i: max(Fraction(1), lam * v[i] if hi_of[i] is None else min(lam * v[i], hi_of[i]))  # noqa: E731
    total = lambda lam: sum(clamp(lam, i) for i in range(len(v)))                                       # noqa: E731
    if total(Fraction(0)) >= batch:                  # B == P: one sample each
        return [Fraction(1)] * len(v)
    points = sorted({1 / x for x in v} | ({c / x for c, x in zip(hi_of, v)} if caps is not None else set()))
    a, b = 0, len(points)                            # the first breakpoint with total >= batch (bisection)
    while a < b:
        k = (a + b) // 2
        if total(points[k]) >= batch:
            b = k
        else:
            a = k + 1
    lo = points[a - 1] if a else Fraction(0)
    hi = points[a] if a < len(points) else lo + 1    # past every breakpoint: all without a cap are proportional
    mid = (lo + hi) / 2
    inside = [i for i in range(len(v)) if 1 < mid * v[i] and (hi_of[i] is None or mid * v[i] < hi_of[i])]
    at_bound = sum(clamp(mid, i) for i in range(len(v)) if i not in inside)
    lam = (batch - at_bound) / sum(v[i] for i in inside)
    return [clamp(lam, i) for i in range(len(v))]


def gradient_weights(sizes: Sequence[int], mode: str = "proportional") -> np.ndarray:
    """Weights w_i of the replicas' mean gradients g_i in the reduced gradient sum_i w_i g_i.

    ``"proportional"``: w_i = b_i / B (the exact gradient of the mean loss over the global batch);
    ``"uniform"``: w_i = 1 / P (naive averaging, the baseline). Returns a float64 array of P weights.
    """
    b = _sizes(sizes)
    if mode == "proportional":
        return np.asarray(b, dtype=np.float64) / float(sum(b))
    if mode == "uniform":
        return np.full(len(b), 1.0 / len(b))
    raise ConfigError(f"gradient weighting must be one of {', '.join(WEIGHTING_MODES)}, got {mode!r}")


def predicted_step_time(sizes: Sequence[int], speeds: Sequence[float]) -> float:
    """Compute time of one synchronous step: the slowest replica's b_i / v_i (seconds)."""
    return max(b / v for b, v in zip(sizes, speeds))


# ------------------------------------------------------------------------------------------- sharding

def steps_in_epoch(n_samples: int, global_batch: int, steps_per_epoch: int = 0) -> int:
    """Number of global steps in an epoch; the same on every rank whatever the split.

    ``ceil(N / B)`` (the last step possibly short) when ``steps_per_epoch == 0``, else ``steps_per_epoch``.
    """
    n = _int(n_samples, "number of samples", 1)
    batch = _int(global_batch, "global batch size", 1)
    spe = _int(steps_per_epoch, "steps per epoch", 0)
    return spe if spe > 0 else -(-n // batch)


def step_span(step: int, n_samples: int, global_batch: int, nreplicas: int,
              steps_per_epoch: int = 0) -> tuple[int, int]:
    """(start, length): global step ``step`` covers positions start .. start+length-1 of the epoch's
    order, taken modulo ``n_samples`` (see the module's sharding policy)."""
    n_steps = steps_in_epoch(n_samples, global_batch, steps_per_epoch)
    nrep = _int(nreplicas, "number of replicas", 1)
    if global_batch < nrep:
        raise ConfigError(f"global batch size {global_batch} is smaller than the number of replicas {nrep}: "
                          f"every replica needs at least one sample")
    step = int(step)
    if not 0 <= step < n_steps:
        raise IndexError(f"step {step} outside the epoch's {n_steps} steps")
    start = step * global_batch
    if steps_per_epoch > 0:
        return start, global_batch
    return start, max(min(global_batch, n_samples - start), nrep)


def step_sizes(step: int, global_batch: int, sizes: Sequence[int], n_samples: int,
               steps_per_epoch: int = 0) -> list[int]:
    """Per-replica sizes at global step ``step``: ``sizes`` for a full step, else the short last step's
    size re-split by ``partition(length, sizes)`` (all ones when it was padded to P samples)."""
    b = _sizes(sizes, _int(global_batch, "global batch size", 1))
    _, length = step_span(step, n_samples, global_batch, len(b), steps_per_epoch)
    if length == global_batch:
        return b
    return partition(length, b)


def shard(order, step: int, global_batch: int, sizes: Sequence[int], rank: int,
          n_samples: int | None = None, steps_per_epoch: int = 0) -> np.ndarray:
    """Sample indices replica ``rank`` takes at global step ``step``.

    ``order`` is the epoch's permutation (the same array on every rank), ``sizes`` the current local
    batch sizes (sum == global_batch). Replica i takes ``step_sizes(...)[i]`` consecutive positions,
    starting at the step's start plus the sizes of the replicas before it; positions wrap modulo N.
    Returns a new array (or a read-only-by-convention view when nothing wraps).
    """
    order = np.asarray(order)
    n = len(order) if n_samples is None else int(n_samples)
    if n != len(order):
        raise ValueError(f"order has {len(order)} entries but n_samples is {n}")
    this = step_sizes(step, global_batch, sizes, n, steps_per_epoch)
    if not 0 <= rank < len(this):
        raise ValueError(f"rank {rank} outside 0..{len(this) - 1}")
    start, _ = step_span(step, n, global_batch, len(this), steps_per_epoch)
    lo = start + sum(this[:rank])
    hi = lo + this[rank]
    if lo >= n or hi > n:
        return order[np.arange(lo, hi) % n]
    return order[lo:hi]


def epoch_permutation(n_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of range(n_samples) that every rank uses in ``epoch`` (a pure function)."""
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)])
    return rng.permutation(int(n_samples))


# ------------------------------------------------------------------------------------ policies

class BalancePolicy:
    """How the global batch is split among the replicas: the plug-in interface (`--balance FILE.py:CLASS`).

    The built-ins (`pydtnn.parallel.policies`: equal, static, probe, dynamic) are written on it. Every rank
    owns one instance and calls it with the same arguments, so every rank takes the same decision; every
    split it returns is checked (`check_split`: sum B, each >= 1, within the caps) before it is used.

    - ``initial_sizes(global_batch, nreplicas, caps)``: the split to start with (caps: None or one int per
      replica, from --max_local_batch);
    - ``after_step(step, seconds_per_sample)``: after global step ``step`` (0-based, over epochs), every
      replica's compute seconds per sample of that step (the same list on every rank); a new split, or
      None to keep the current one;
    - ``state_dict()`` / ``load_state_dict(state)``: plain JSON-able values saved in checkpoints.

    ``self.sizes`` holds the split in force: the training loop sets it (at the start, after a resume, after
    a re-split). A policy whose split is measured (``measured = True``) has its split restored on resume; one
    fixed by flags (equal, static) is recomputed from them. A policy with ``wants_probe = True`` gets
    ``probed(global_batch, speeds, caps)`` once before training, with every replica's speed (samples/s)
    measured by a few timed local steps.
    """

    name = "custom"
    measured = True
    wants_probe = False
    sizes: list | None = None
    # where checkpoints keep the state (the dynamic policy keeps the key older checkpoints used)
    checkpoint_key = "balance_policy_state"

    def initial_sizes(self, global_batch, nreplicas, caps):
        return partition(global_batch, [1.0] * int(nreplicas), caps)

    def after_step(self, step, seconds_per_sample):
        return None

    def probed(self, global_batch, speeds, caps):
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:
        pass


def check_split(sizes, global_batch: int, nreplicas: int, caps=None, who: str = "balance policy") -> list[int]:
    """A split a policy returned, or a one-line ConfigError naming the policy: P integers >= 1 summing to B,
    each within its cap."""
    try:
        vals = [int(s) for s in sizes]
        exact = all(int(s) == s and not isinstance(s, bool) for s in sizes)
    except (TypeError, ValueError):
        raise ConfigError(f"{who} returned {sizes!r}, not a list of {nreplicas} integers") from None
    why = None
    if not exact or len(vals) != nreplicas:
        why = f"not a list of {nreplicas} integers"
    elif min(vals) < 1:
        why = "every replica needs at least one sample"
    elif sum(vals) != global_batch:
        why = f"it sums to {sum(vals)}, not to the global batch {global_batch}"
    elif caps and any(b > c for b, c in zip(vals, caps)):
        why = f"it exceeds the local batch caps {list(caps)} (--max_local_batch)"
    if why:
        raise ConfigError(f"{who} returned the split {list(sizes)!r}: {why}")
    return vals


# ------------------------------------------------------------------------------------ dynamic balance

class DynamicBalancer:
    """Re-splits the global batch during training from measured replica speeds.

    Every rank owns one instance and feeds it the same allgathered numbers, so every rank takes the
    same decision without further communication.

    - ``observe(t)``: ``t`` holds P compute seconds per sample (replica i's forward+backward time of the
      last step divided by its b_i). The current window of ``interval`` steps is summarized by each
      replica's median (a first step that compiles kernels, or a pause, would drag a mean for several
      windows). An observation with a non-finite or non-positive entry is ignored (returns False).
    - ``maybe_rebalance(step)``: ``step`` is the 0-based index of the global step that has just been
      observed. Every ``interval`` steps (when ``(step + 1) % interval == 0``) the window's speeds
      v = 1 / median(t) update an exponential moving average,
      ``ema = smoothing * v + (1 - smoothing) * ema`` (the first window sets it; ``smoothing=1`` keeps
      only the last window). The candidate split ``partition(B, ema, caps)`` is then adopted, and returned,
      only if its predicted step time (max_i b_i / v_i) beats the current split's by more than the
      fraction ``hysteresis``; otherwise None. ``sizes`` always holds the split in force.

    Averaging a window, then smoothing across windows, divides the per-step timing noise by about
    sqrt(interval); ``hysteresis`` should exceed the noise that is left (a few percent), else the split
    flaps by a sample or two at each decision.
    """

    def __init__(self, global_batch: int, nreplicas: int, interval: int = 50, smoothing: float = 0.3,
                 hysteresis: float = 0.05, initial_sizes: Sequence[int] | None = None,
                 caps: Sequence[int] | None = None):
        self.global_batch = _int(global_batch, "global batch size", 1)
        self.nreplicas = _int(nreplicas, "number of replicas", 1)
        if self.global_batch < self.nreplicas:
            raise ConfigError(f"global batch size {self.global_batch} is smaller than the number of "
                              f"replicas {self.nreplicas}: every replica needs at least one sample")
        self.interval = _int(interval, "rebalance interval", 1)
        smoothing = float(smoothing)
        if not 0.0 < smoothing <= 1.0:
            raise ConfigError(f"rebalance smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        hysteresis = float(hysteresis)
        if not 0.0 <= hysteresis < 1.0:
            raise ConfigError(f"rebalance hysteresis must be in [0, 1), got {hysteresis}")
        self.hysteresis = hysteresis
        self.caps = caps_for(caps, self.nreplicas, "local batch caps")
        if initial_sizes is None:
            self.sizes = partition(self.global_batch, [1.0] * self.nreplicas, self.caps)
        else:
            self.sizes = _sizes(initial_sizes, self.global_batch)
            if len(self.sizes) != self.nreplicas:
                raise ConfigError(f"{len(self.sizes)} initial local batch sizes for {self.nreplicas} replicas")
        self._ema: np.ndarray | None = None
        self._window: list[np.ndarray] = []
        self.n_observed = 0
        self.n_rebalances = 0

    @property
    def speeds(self) -> np.ndarray | None:
        """Smoothed speeds (samples/s) or None before the first window was folded in."""
        return None if self._ema is None else self._ema.copy()

    def observe(self, compute_times_per_sample) -> bool:
        t = np.asarray(compute_times_per_sample, dtype=np.float64).reshape(-1)
        if t.size != self.nreplicas:
            raise ValueError(f"expected {self.nreplicas} compute times, got {t.size}")
        if not np.all(np.isfinite(t)) or np.any(t <= 0):
            return False
        self._window.append(t)
        self.n_observed += 1
        return True

    def maybe_rebalance(self, step: int) -> list[int] | None:
        if (int(step) + 1) % self.interval != 0:
            return None
        if self._window:
            v = 1.0 / np.median(np.asarray(self._window), axis=0)
            self._ema = v if self._ema is None else self.smoothing * v + (1.0 - self.smoothing) * self._ema
            self._window = []
        if self._ema is None:
            return None
        speeds = self._ema.tolist()
        candidate = partition(self.global_batch, speeds, self.caps)
        if candidate == self.sizes:
            return None
        now = predicted_step_time(self.sizes, speeds)
        new = predicted_step_time(candidate, speeds)
        if new < now * (1.0 - self.hysteresis):
            self.sizes = candidate
            self.n_rebalances += 1
            return list(candidate)
        return None

    def state_dict(self) -> dict:
        """Plain numbers/arrays for a checkpoint (no pickle needed)."""
        return {"sizes": np.asarray(self.sizes, dtype=np.int64),
                "ema": np.zeros(0) if self._ema is None else self._ema.copy(),
                "window": np.asarray(self._window, dtype=np.float64).reshape(-1, self.nreplicas),
                "n_observed": self.n_observed, "n_rebalances": self.n_rebalances}

    def load_state_dict(self, state: dict) -> None:
        self.sizes = _sizes(np.asarray(state["sizes"]).tolist(), self.global_batch)
        ema = np.asarray(state["ema"], dtype=np.float64)
        self._ema = ema.copy() if ema.size else None
        if "window" in state:
            window = np.asarray(state["window"], dtype=np.float64).reshape(-1, self.nreplicas)
        else:       # a checkpoint of a version that kept the window's sum: its mean, as often as it was seen
            n = int(state["window_n"])
            window = np.tile(np.asarray(state["window_sum"], dtype=np.float64) / max(n, 1), (n, 1))
        self._window = [row.copy() for row in window]
        self.n_observed = int(state["n_observed"])
        self.n_rebalances = int(state["n_rebalances"])


# ------------------------------------------------------------------------------------------ the probe

def probe_speeds(step_fn: Callable[[], object], comm, k: int = 5, samples_per_call: int = 1,
                 warmup: int = 1) -> np.ndarray:
    """Measure every replica's speed (samples/s); every rank returns the same P-vector.

    Each rank calls ``step_fn()`` ``warmup`` times untimed, then ``k`` times timed; ``step_fn`` runs one
    local forward+backward on ``samples_per_call`` samples (the caller's choice, typically the local
    batch it would train with) and must not communicate. This replica's speed is
    ``samples_per_call / median(times)``; the speeds are then allgathered through ``comm``.
    """
    k = _int(k, "probe steps", 1)
    samples = _int(samples_per_call, "probe samples per call", 1)
    median = max(median_call_seconds(step_fn, k, _int(warmup, "probe warm-up steps", 0)), 1e-9)
    return np.asarray(comm.allgather(samples / median), dtype=np.float64).reshape(-1)


def median_call_seconds(fn: Callable[[], object], k: int, warmup: int = 1, clock=time.perf_counter) -> float:
    """Call ``fn()`` ``warmup`` times untimed (allocations, compilation), then ``k`` times: the median
    seconds of those k calls (what the probe and the speed emulation's calibration measure)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(k):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return float(np.median(times))
