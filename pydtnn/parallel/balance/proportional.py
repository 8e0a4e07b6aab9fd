"""The partition arithmetic: the global batch split into integer local batches in proportion to the
replicas' speeds, within their memory caps.

Plain arithmetic on its arguments (no MPI, no clocks, no state): every rank that calls `partition` with the
same arguments gets the same split, so the ranks agree on batch sizes without talking about it.

Notation: P replicas, global batch B, replica i holds b_i samples, sum_i b_i = B, speeds v_i in samples/s.
The checks of integers and of local batch sizes (`checked_int`, `checked_sizes`) are shared with
`pydtnn.parallel.sharding` and `pydtnn.parallel.balance`: a bad value meets the same one-line ConfigError.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Sequence

import numpy as np

from pydtnn.errors import ConfigError

__all__ = ["partition", "caps_for", "predicted_step_time", "checked_int", "checked_sizes"]


# ----------------------------------------------------------------------------------------- validation

def checked_int(value, name: str, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (an integral float is accepted), or a ConfigError naming ``name``."""
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


def checked_sizes(sizes, global_batch: int | None = None, minimum: int = 1) -> list[int]:
    """Local batch sizes as ints >= ``minimum`` (1; 0 where a policy lets a replica sit out, but not all),
    summing to ``global_batch`` when given, or a ConfigError."""
    try:
        vals = [int(s) for s in sizes]
        exact = all(int(s) == s for s in sizes)
    except (TypeError, ValueError):
        raise ConfigError(f"local batch sizes must be integers, got {sizes!r}") from None
    if not vals or not exact or min(vals) < minimum or max(vals) < 1:
        raise ConfigError(f"local batch sizes must be integers >= {minimum}, got {list(sizes)!r}")
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
    return [checked_int(v, what, 1) for v in vals]


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
    batch = checked_int(global_batch, "global batch size", 1)
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


def predicted_step_time(sizes: Sequence[int], speeds: Sequence[float]) -> float:
    """Compute time of one synchronous step: the slowest replica's b_i / v_i (seconds)."""
    return max(b / v for b, v in zip(sizes, speeds))
