"""Building the cost model by probing (FuPerMod's partial FPM): points at several local batches, then
refinement at the proposed split.

    buckets = grown_buckets(B, caps, minimum, [8, 1, 1])
    model, split, lines = build_model(probe, minimum, buckets, points=4, rounds=3, tolerance=0.05)

`probe` times every replica at once at a split of its choosing (the launcher's lock-step probe,
`pydtnn.parallel.balance.probe`, or the simulator's step model); `minimum` is 1 per replica (0 where allowed),
`buckets` the GPU shape bucket per replica (1: none):

    probe.global_batch, probe.caps (None or one per replica), probe.devices
    probe.measure(sizes) -> (seconds, flagged)   every replica's median compute seconds at its sizes[i],
                                                 and per replica the timed steps left out as outliers
    probe.warm(sizes_per_replica)                untimed passes at these local batches (GPU shapes)

1. Points: `points` local batches per replica, spaced geometrically (halving) down from its top, the most
   it could hold (its cap, or B less one sample for each other replica), rounded to its GPU bucket. A GPU
   replica first warms every bucket up to its top (at most `MAX_WARMED`: the bucket grows when there would
   be more), so that no split it can get builds a cuDNN plan or autotunes during training.
2. Fit (`pydtnn.parallel.balance.cost_model`) and solve (`pydtnn.parallel.balance.fpm_partition.equal_finish`).
3. Refine: run the proposed split, add its points, fit and solve again; stop when the measured max/min
   compute of the proposal is within `tolerance` (balanced), when the model had predicted every replica's
   time there within `tolerance` (nothing left to learn, e.g. a cap keeps one replica short), or after
   `rounds` rounds.
"""
from __future__ import annotations

import numpy as np

from pydtnn.parallel.balance.cost_model import CostModel, ReplicaCost
from pydtnn.parallel.balance.fpm_partition import equal_finish

__all__ = ["build_model", "probe_sizes", "tops", "grown_buckets", "MAX_WARMED"]

MAX_WARMED = 64


def tops(global_batch, caps, minimum, buckets) -> list[int]:
    """The most samples each replica could hold, rounded down to its bucket."""
    P = len(minimum)
    out = []
    for i in range(P):
        top = global_batch - (sum(minimum) - minimum[i])
        if caps is not None:
            top = min(top, caps[i])
        q = buckets[i]
        out.append(max(q, (top // q) * q) if top >= q else top)
    return out


def probe_sizes(top: int, points: int = 4, bucket: int = 1) -> list[int]:
    """`points` local batches up to `top`, halving, rounded to `bucket` (ascending; fewer when top is small)."""
    sizes = []
    for k in range(points):
        b = max(1, top >> k)
        if bucket > 1 and b >= bucket:
            b = (b // bucket) * bucket
        sizes.append(b)
    return sorted(set(sizes))


def grown_buckets(global_batch, caps, minimum, buckets) -> list[int]:
    """Each bucket, doubled until at most MAX_WARMED of its multiples fit under the replica's top."""
    out = []
    for top, q in zip(tops(global_batch, caps, minimum, [1] * len(minimum)), buckets):
        q = max(1, int(q))
        while q > 1 and top // q > MAX_WARMED:
            q *= 2
        out.append(q)
    return out


def build_model(probe, minimum, buckets, points: int = 4, rounds: int = 3, tolerance: float = 0.05):
    """(the CostModel, its equal-finish split, the lines that say how it was built)."""
    B, P = probe.global_batch, len(probe.devices)
    tops_ = tops(B, probe.caps, minimum, buckets)
    lists = [probe_sizes(t, points, q) for t, q in zip(tops_, buckets)]
    log = getattr(probe, "log", None)
    if log is not None:              # the plan first: a probe of slow replicas takes a while
        log(f"probe plan: {max(map(len, lists))} points at b = {_per_replica(lists)}, then up to {int(rounds)} "
            f"round(s) at the proposed split")
    lines = []
    if any(q > 1 for q in buckets):
        warm = [list(range(q, t + 1, q)) if q > 1 else [] for t, q in zip(tops_, buckets)]
        probe.warm(warm)
        lines.append("probe: warmed GPU shapes " + "; ".join(f"replica {i}: {len(w)} of b = {w[0]}..{w[-1]}"
                                                            for i, w in enumerate(warm) if w))
    costs = [ReplicaCost() for _ in range(P)]
    n = max(len(s) for s in lists)
    for k in range(n):
        sizes = [s[min(k, len(s) - 1)] for s in lists]
        seconds, flagged = probe.measure(sizes)
        for i in range(P):
            costs[i].points[int(sizes[i])] = float(seconds[i])
            costs[i].flagged += [(int(sizes[i]), float(t)) for t in flagged[i]]
    for c in costs:
        c.refit()
    model = CostModel(costs, probe.devices)
    split = equal_finish(B, model, probe.caps, minimum, buckets)
    for r in range(int(rounds)):
        predicted = model.seconds(split)
        seconds, flagged = probe.measure(split)
        seconds = np.asarray(seconds, dtype=np.float64)
        active = [i for i in range(P) if split[i] > 0]
        for i in active:
            costs[i].flagged += [(int(split[i]), float(t)) for t in flagged[i]]
            costs[i].add(split[i], seconds[i])
        ratio = float(seconds[active].max() / seconds[active].min())
        held = bool(np.all(np.abs(seconds[active] / predicted[active] - 1) <= tolerance))
        lines.append(f"probe round {r + 1}: split {split}, measured compute {_ms(seconds)} ms, max/min "
                     f"{ratio:.3f}, predicted within {tolerance:.0%}: {'yes' if held else 'no'}")
        new = equal_finish(B, model, probe.caps, minimum, buckets)
        if ratio <= 1 + tolerance or held or new == split:
            split = new
            break
        split = new
    lines.append(f"predicted compute at {split}: {_ms(model.seconds(split))} ms (makespan "
                 f"{model.makespan(split) * 1e3:.4g} ms)")
    return model, split, lines


def _per_replica(lists, shown=4) -> str:
    """Each replica's local batches, replicas with the same list together (the first `shown` groups)."""
    groups = {}
    for i, sizes in enumerate(lists):
        groups.setdefault(tuple(sizes), []).append(i)
    text = [f"{', '.join(map(str, sizes))} (replica{'s' if len(who) > 1 else ''} {_ranges(who)})"
            for sizes, who in list(groups.items())[:shown]]
    more = len(groups) - shown
    return "; ".join(text) + (f"; and {more} other list(s)" if more > 0 else "")


def _ranges(indices) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], indices[0]
    for prev, cur in zip(indices, indices[1:] + [None]):
        if cur != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(out)


def _ms(seconds) -> str:
    return ", ".join(f"{t * 1e3:.4g}" for t in seconds)
