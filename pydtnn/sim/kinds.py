"""Replicas alike: the simulator's P replicas are a handful of kinds even at 10^7 (one or two profiles, a few
local batches, one contention factor), so a step's per-layer work is computed once per kind, not per replica.

    kind, first = row_kinds(profile_index, sizes, contention)    # kind (P,), first (K,): a replica of each kind

Linear time where the values are few or small integers (a constant column, local batches); a sort otherwise.
"""
from __future__ import annotations

import numpy as np

__all__ = ["codes", "row_kinds"]


def codes(column):
    """(codes, values): ``column == values[codes]``, ``values`` sorted and distinct."""
    col = np.asarray(column).reshape(-1)
    if col.size == 0:
        return np.zeros(0, np.int64), col[:0].copy()
    lo, hi = col.min(), col.max()
    if lo == hi:                                            # one value: the common case, O(P)
        return np.zeros(col.size, np.int64), col[:1].copy()
    small = int(hi) - int(lo) <= 4 * col.size + 1024 if np.isfinite(lo) and np.isfinite(hi) else False
    if small and (np.issubdtype(col.dtype, np.integer) or bool(np.all(col == np.floor(col)))):
        shifted = (col - lo).astype(np.int64)               # small integers (local batches): a table, O(P + range)
        present = np.zeros(int(hi) - int(lo) + 1, dtype=bool)
        present[shifted] = True
        where = np.cumsum(present) - 1
        return where[shifted], (np.flatnonzero(present) + lo).astype(col.dtype)
    values, inverse = np.unique(col, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), values


def row_kinds(*columns):
    """(kind (P,), first (K,)): replicas with equal values in every column share a kind, numbered 0..K-1;
    ``first[k]`` is a replica of kind k. A column may be None (left out)."""
    key, size = None, 0
    for col in columns:
        if col is None:
            continue
        c, values = codes(col)
        key = c if key is None else key * len(values) + c
        key, combos = codes(key)                            # compact again: key < the combinations seen
        size = len(combos)
    if key is None:
        raise ValueError("row_kinds needs a column")
    first = np.empty(size, np.int64)
    first[key] = np.arange(key.size)
    return key, first
