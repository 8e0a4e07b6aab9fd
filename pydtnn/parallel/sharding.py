"""Sharding: which samples each replica takes at each global step of an epoch.

Plain arithmetic on its arguments, like the partition it builds on (`pydtnn.parallel.balance.proportional`): every rank
computes the same number of steps and every replica's sample indices without talking about it.

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

The gradient weights of a step are computed from that step's sizes (``weights(step_sizes(...))``, with the
`pydtnn.parallel.weighting` function in force), so a short last step is still the exact mean over its samples.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance.proportional import checked_int, checked_sizes, partition

__all__ = ["steps_in_epoch", "step_span", "step_sizes", "shard", "epoch_permutation"]


def steps_in_epoch(n_samples: int, global_batch: int, steps_per_epoch: int = 0) -> int:
    """Number of global steps in an epoch; the same on every rank whatever the split.

    ``ceil(N / B)`` (the last step possibly short) when ``steps_per_epoch == 0``, else ``steps_per_epoch``.
    """
    n = checked_int(n_samples, "number of samples", 1)
    batch = checked_int(global_batch, "global batch size", 1)
    spe = checked_int(steps_per_epoch, "steps per epoch", 0)
    return spe if spe > 0 else -(-n // batch)


def step_span(step: int, n_samples: int, global_batch: int, nreplicas: int,
              steps_per_epoch: int = 0) -> tuple[int, int]:
    """(start, length): global step ``step`` covers positions start .. start+length-1 of the epoch's
    order, taken modulo ``n_samples`` (see the module's sharding policy)."""
    n_steps = steps_in_epoch(n_samples, global_batch, steps_per_epoch)
    nrep = checked_int(nreplicas, "number of replicas", 1)
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
    b = checked_sizes(sizes, checked_int(global_batch, "global batch size", 1), minimum=0)
    _, length = step_span(step, n_samples, global_batch, len(b), steps_per_epoch)
    if length == global_batch:
        return b
    held = [i for i, v in enumerate(b) if v > 0]      # a replica the split leaves out stays out
    out = [0] * len(b)
    for i, v in zip(held, partition(length, [b[i] for i in held])):
        out[i] = v
    return out


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
