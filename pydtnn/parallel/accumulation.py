"""Gradient accumulation (--accumulation_steps K): a replica's local batch of a global step run as micro-batches.

Replica i runs its b_i rows as n_i micro-batches, consecutive rows in order (their concatenation is exactly
its b_i rows), of sizes as equal as possible, the larger ones first (10 rows in 4: 3, 3, 2, 2):
- n_i = K, or more where a memory cap (`--max_local_batch`, a GPU's measured cap) holds fewer than b_i / K
  rows: n_i = max(K, ceil(b_i / cap_i));
- never an empty micro-batch: a replica with b_i < K rows runs b_i micro-batches of one row (a dynamic policy
  may give a replica few samples; nothing is refused for it), and one given 0 samples runs none;
- with synchronized BatchNorm every replica runs the same number n of micro-batches (each micro-batch's
  BatchNorm reductions are collectives): the largest n_i, but no more than the smallest local batch of the
  step holds rows (a short last step of an epoch), so that no micro-batch is empty. Micro-batch j of the
  global step is the union of every replica's j-th micro-batch, whatever their sizes, and its statistics are
  that union's (`pydtnn.parallel.sync_batchnorm` is exact for unequal parts). Where a memory cap would then
  be exceeded (a small replica beside one that must split its share finely), the split is refused
  (`micro_batch_counts`).

Micro-batch j of m_j rows runs forward and backward with the loss gradient scaled by w_i * m_j / b_i, and
its gradient is added to the ones before: sum_j (m_j / b_i) * w_i * (mean gradient of micro-batch j) =
w_i * g_i, the mean gradient of the b_i rows, exactly as without accumulation up to rounding. The reduction
then runs once per global step (with --non_blocking_mpi its buckets overlap the last micro-batch's backward:
`AccumulatedGradients.ready` adds what the earlier micro-batches left before a bucket starts), then one update.
The loss and metrics of the step are those of the whole b_i rows (the micro-batches' losses weighted by m_j /
b_i; the metrics on their predictions put back together).
"""
from __future__ import annotations

import math
import numbers

from pydtnn.errors import ConfigError

__all__ = ["check_steps", "micro_batch_count", "micro_batch_counts", "micro_batch_bounds", "AccumulatedGradients"]


def check_steps(steps) -> int:
    """--accumulation_steps: an integer >= 1, or one ConfigError line."""
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
        raise ConfigError(f"--accumulation_steps must be an integer of at least 1, got {steps!r}")
    return int(steps)


def micro_batch_count(b: int, steps: int, cap: int | None = None) -> int:
    """How many micro-batches a replica of b rows runs: K, more where its cap holds fewer than b / K rows,
    at most b (no empty micro-batch)."""
    n = max(steps, math.ceil(b / cap)) if cap else steps
    return min(n, b)


def micro_batch_counts(sizes, steps: int, caps=None, common: bool = False) -> list[int]:
    """Every replica's number of micro-batches for the split `sizes` (`caps`: one per replica, or None).
    `common` (synchronized BatchNorm): every replica with samples runs the same count, the largest but at most
    the smallest local batch; one ConfigError line when a replica's cap cannot hold its micro-batches then."""
    caps = caps or [None] * len(sizes)
    counts = [micro_batch_count(b, steps, cap) for b, cap in zip(sizes, caps)]
    held = [b for b in sizes if b > 0]
    if not common or not held:
        return counts
    n = min(max(counts), min(held))
    over = [i for i, (b, cap) in enumerate(zip(sizes, caps)) if cap and b > n * cap]
    if over:
        i = over[0]
        raise ConfigError(f"--sync_batchnorm: every replica runs the same number of micro-batches, at most "
                          f"{n} in the split {list(sizes)} (the rows of its smallest local batch), and replica "
                          f"{i}'s {sizes[i]} samples in {n} micro-batches exceed its memory cap of {caps[i]}: "
                          f"give the small replica more samples, or leave --sync_batchnorm out")
    return [n if b else 0 for b in sizes]


def micro_batch_bounds(b: int, n: int) -> list[tuple[int, int]]:
    """The rows [lo, hi) of each of n micro-batches of b rows: consecutive, the larger ones first."""
    q, r = divmod(int(b), int(n))
    bounds, lo = [], 0
    for j in range(int(n)):
        hi = lo + q + (1 if j < r else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


class AccumulatedGradients:
    """The sum of the earlier micro-batches' gradients, added into the gradient buffer during (or after) the
    last micro-batch's backward.

        acc.start(grads)            # before a step of several micro-batches
        acc.add()                   # after each micro-batch but the last: its gradients kept
        ... the last backward, hook=acc.ready(on_ready): grads[lo:] += kept[lo:] before on_ready(lo)
        acc.finish()                # what is left added: grads holds the sum of them all
    """

    def __init__(self):
        self.kept = None            # one buffer of the gradients' size, allocated on first use
        self.grads = None
        self.added_from = 0         # grads[added_from:] already hold the sum
        self.count = 0              # micro-batches kept this step

    def start(self, grads):
        if self.kept is None or self.kept.shape != grads.shape or self.kept.dtype != grads.dtype:
            self.kept = grads.copy()
        self.grads, self.count, self.added_from = grads, 0, grads.size

    def add(self):
        """The micro-batch just run: its gradients kept (the first copied, the others added)."""
        if self.count == 0:
            self.kept[...] = self.grads
        else:
            self.kept += self.grads
        self.count += 1

    def ready(self, on_ready=None):
        """The hook of the last micro-batch's backward: on `lo` (grads[lo:] final), the kept sum added to
        grads[lo:], then `on_ready(lo)` (the reduction's bucket starts on the whole sum)."""
        def hook(lo):
            lo = max(0, int(lo))
            if lo < self.added_from:
                self.grads[lo:self.added_from] += self.kept[lo:self.added_from]
                self.added_from = lo
            if on_ready is not None:
                on_ready(lo)
        return hook

    def finish(self):
        """What the hook did not add yet (all of it without one)."""
        if self.count and self.added_from > 0:
            self.ready()(0)
        self.count = 0
