"""The integer partition with equal finish times (FuPerMod's FPM partitioning), under memory caps and GPU
shape buckets.

    sizes = equal_finish(256, model)                       # model: pydtnn.parallel.balance.cost_model.CostModel
    sizes = equal_finish(256, model, caps=[240, 96, 96], minimum=[1, 1, 1], buckets=[8, 1, 1])

Without buckets: hand each sample, one at a time, to the replica whose time would grow least, the smallest
t_i(b_i + 1) (ties to the lower rank). For non-decreasing t_i this greedy split minimizes the makespan
max_i t_i(b_i) (an exchange argument: any split can be turned into the greedy one, sample by sample,
without raising the maximum). It is computed in O(P log B) model evaluations, not B heap steps: a bisection
on the finish time T finds b_i(T) = the most samples replica i takes within T, for the largest T with
sum_i b_i(T) <= B; every sample the greedy hands out up to T is then placed, and the few left go one by one.

Buckets (GPU replicas, `buckets[i]` = q > 1): the replica's b_i is a multiple of q, so that a re-split
only ever runs shapes that were warmed (cuDNN plans, autotuning) while probing. The replicas without a
bucket share what the bucketed ones leave, by the greedy; the bucketed ones start at the multiple below
their unbucketed share and move by one bucket at a time while that lowers the makespan (exact for one
bucketed replica, whose makespan is unimodal in its b). With every replica bucketed, the largest holds the
remainder B mod q.

`minimum[i]` is 1, or 0 for a replica the user allows to sit a step out (it then only joins the reduction).
"""
from __future__ import annotations

import heapq

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance.cost_model import vectorized

__all__ = ["equal_finish"]

TABLE_MAX = 1 << 16         # a piecewise replica's t(b) is tabulated when it may hold at most this many b


def equal_finish(global_batch: int, model, caps=None, minimum=None, buckets=None) -> list[int]:
    """The split of `global_batch` samples with the smallest predicted makespan under `model`."""
    P, B = len(model), int(global_batch)
    lo = np.ones(P, dtype=np.int64) if minimum is None else np.asarray(minimum, dtype=np.int64)
    hi = np.full(P, B, dtype=np.int64) if caps is None else np.minimum(np.asarray(caps, dtype=np.int64), B)
    if lo.sum() > B:
        raise ConfigError(f"global batch size {B} is smaller than the number of replicas {P}: every replica "
                          f"needs at least one sample")
    if hi.sum() < B:
        raise ConfigError(f"the local batch caps {hi.tolist()} hold {int(hi.sum())} samples, fewer than the "
                          f"global batch {B}: raise the caps or lower --global_batch_size")
    q = np.ones(P, dtype=np.int64) if buckets is None else np.asarray(buckets, dtype=np.int64)
    if np.all(q <= 1):
        return _greedy(B, model, lo, hi, np.arange(P))
    return _bucketed(B, model, lo, hi, q)


# ------------------------------------------------------------------------------------- the greedy split

def _greedy(B, model, lo, hi, members) -> list[int]:
    """The greedy split of B among `members` (the other replicas get 0 here)."""
    P = len(model)
    members = np.asarray(members)
    costs = [model.replicas[i] for i in members]
    lo_m, hi_m = lo[members], hi[members]
    seconds = vectorized(costs)
    b = lo_m.copy()
    left = B - int(b.sum())
    if left > 0:
        b = _fill_to(seconds, lo_m, hi_m, B)
        left = B - int(b.sum())
    after = seconds(b + 1)                      # every replica's time with one sample more, at once
    heap = [(float(after[k]), k) for k in range(len(costs)) if b[k] < hi_m[k]]
    heapq.heapify(heap)
    while left > 0:
        _, k = heapq.heappop(heap)
        b[k] += 1
        left -= 1
        if b[k] < hi_m[k]:
            heapq.heappush(heap, (float(costs[k].seconds(b[k] + 1)), k))
    out = np.zeros(P, dtype=np.int64)
    out[members] = b
    return [int(v) for v in out]


def _fill_to(seconds, lo, hi, B):
    """b_i(T) for the largest T (bisection) with sum_i b_i(T) <= B: every sample whose increment
    t_i(b + 1) is below T, which the greedy would have handed out first."""
    affine, a_, c_ = seconds.affine, seconds.a, seconds.c
    # the others (piecewise) tabulated at every b they may hold, where that is small: b(T) by a search
    tables = {}
    for k in seconds.others:
        if hi[k] - lo[k] <= TABLE_MAX:
            bs = np.arange(lo[k], hi[k] + 1)
            tables[int(k)] = seconds.costs[k].seconds(bs)
    searched = np.array([k for k in seconds.others if int(k) not in tables], dtype=np.int64)

    def taken(T):
        # per replica, the largest b in [lo, hi] with t(b) <= T (t non-decreasing): for a line at once
        # (then checked against t itself, which rounding could put one sample off), else integer bisection
        with np.errstate(divide="ignore", invalid="ignore"):
            guess = np.where(c_ > 0, np.floor((T - a_) / np.where(c_ > 0, c_, 1.0)), np.where(a_ <= T, hi, lo))
        b = np.clip(np.where(affine, guess, lo), lo, hi).astype(np.int64)
        b = np.where(affine & (b > lo) & (seconds(b) > T), b - 1, b)
        for k, table in tables.items():
            b[k] = lo[k] + max(int(np.searchsorted(table, T, side="right")) - 1, 0)
        if searched.size:
            k = searched
            x, z = lo[k].copy(), hi[k].copy()
            while np.any(x < z):
                mid = (x + z + 1) // 2
                full = b.copy()
                full[k] = mid
                ok = seconds(full)[k] <= T
                x = np.where(ok, mid, x)
                z = np.where(ok, z, mid - 1)
            b[k] = x
        return b
    t_lo = 0.0
    t_hi = float(np.max(seconds(hi)))
    best = lo.copy()
    for _ in range(64):
        T = 0.5 * (t_lo + t_hi)
        b = taken(T)
        if b.sum() <= B:
            best, t_lo = b, T
        else:
            t_hi = T
        if t_hi - t_lo <= 1e-12 * max(t_hi, 1e-300):
            break
    return best


# ------------------------------------------------------------------------------------------ buckets

def _bucketed(B, model, lo, hi, q):
    P = len(model)
    free = np.flatnonzero(q <= 1)
    held = np.flatnonzero(q > 1)
    if free.size == 0:                            # every replica bucketed: the largest holds B mod q
        free = np.array([int(np.argmax(_greedy(B, model, lo, hi, np.arange(P))))])
        held = np.array([i for i in held if i != free[0]])
    share = _greedy(B, model, lo, hi, np.arange(P))
    steps = {int(i): int(q[i]) for i in held}

    def allowed(i, v):
        return lo[i] <= v <= hi[i] and (v % steps[i] == 0 or v == 0)

    def floor_of(i):
        v = (share[i] // steps[i]) * steps[i]
        while v > 0 and not allowed(i, v):
            v -= steps[i]
        return v if allowed(i, v) else None

    def complete(fixed):
        rest = B - sum(fixed.values())
        if rest < lo[free].sum() or rest > hi[free].sum():
            return None
        out = _greedy(rest, model, lo, hi, free)
        for i, v in fixed.items():
            out[i] = v
        return out

    fixed = {}
    for i in held:
        v = floor_of(int(i))
        if v is None:
            raise ConfigError(f"replica {int(i)}'s local batch cannot be a multiple of {steps[int(i)]} within "
                              f"[{int(lo[i])}, {int(hi[i])}] (GPU shape buckets: lower the bucket)")
        fixed[int(i)] = v
    best = complete(fixed)
    while best is None:                           # the others cannot hold the rest: grow the bucketed ones
        grown = next((i for i in fixed if allowed(i, fixed[i] + steps[i])), None)
        if grown is None:
            raise ConfigError("no split of the global batch fits the GPU shape buckets and the caps")
        fixed[grown] += steps[grown]
        best = complete(fixed)
    best_t = model.makespan(best)
    improved = True
    while improved:                               # one bucket up or down at a time, while it pays
        improved = False
        for i in sorted(fixed):
            for d in (steps[i], -steps[i]):
                if not allowed(i, fixed[i] + d):
                    continue
                trial = {**fixed, i: fixed[i] + d}
                cand = complete(trial)
                if cand is not None and model.makespan(cand) < best_t:
                    fixed, best, best_t, improved = trial, cand, model.makespan(cand), True
    return best
