"""Calling a balancing policy: its failures as one line, and its splits agreed on by every rank.

    new = call(policy, "after_step", step, report)          # a bug in a user's policy: one ConfigError
    new = agree(comm, policy, new, error, "in after_step(step=11), after step 12")  # the same split on every rank

A user's policy is code we do not control: an exception in it is a ConfigError naming the policy and the
method, with the user's own frames (file, line, source) after the line, never our stack. And it is given
its rank (`BalancePolicy.bind`), so it could return a split that depends on it: the ranks would then train
on different splits (samples seen twice or never, weights that do not add up) without a word. So every
decision of a policy that is not a built-in is agreed on: one allgather of two numbers per call (an error
code and a checksum of the split, or of None), and a ConfigError on every rank when they differ. The
built-ins are pure functions of what every rank is given alike and skip it.
"""
from __future__ import annotations

import numpy as np

from pydtnn import plugins
from pydtnn.errors import ConfigError, PyDTNNError, error_code
from pydtnn.parallel.balance import check_split
from pydtnn.parallel.comm import agree_on_error

__all__ = ["call", "initial_split", "agree", "needs_agreement"]


def call(policy, method: str, *args):
    """``policy.method(*args)``; an exception other than our own errors becomes one ConfigError."""
    try:
        return getattr(policy, method)(*args)
    except PyDTNNError:
        raise
    except Exception as e:                          # noqa: BLE001  (a user's code: one line and its frames)
        raise plugins.user_error(f"balance policy {policy.name}: {method} failed", e) from None


def initial_split(policy, global_batch, nreplicas, caps, rank=0, devices=None) -> list[int]:
    """The policy's first split, asked once in a run: the policy bound (its rank, the devices, its options),
    asked, its answer checked (`check_split`), then held as `policy.sizes`. Pure: where the policy needs it,
    the caller agrees on the split across the ranks (`agree`)."""
    policy.bind(rank, nreplicas, devices, policy.options)
    sizes = check_split(call(policy, "initial_sizes", global_batch, nreplicas, caps), global_batch, nreplicas,
                        caps, f"balance policy {policy.name}", policy.allow_zero)
    policy.sizes = list(sizes)
    return sizes


def needs_agreement(policy, comm) -> bool:
    return comm.size > 1 and not getattr(policy, "deterministic", False)


def checksum(split) -> float:
    """A number that differs between different splits (None included), exactly representable."""
    if split is None:
        return -1.0
    h = 0
    for b in split:
        h = (h * 1000003 + int(b) + 1) % (1 << 52)
    return float(h)


def agree(comm, policy, split, error, when: str):
    """Every rank's `split` (or None) and `error` (a PyDTNNError or None) from one decision: the split,
    when every rank returned the same; every rank raises when any rank failed or they differ. `when` ends
    the line: "for the initial split", or "in after_step(step=S), after step S + 1" (the call as the policy
    received it, 0-based, then the step as every other message counts it, from 1)."""
    if comm.size == 1:
        if error is not None:
            raise error
        return split
    mine = np.array([float(error_code(error)), checksum(split if error is None else None)])
    every = np.asarray(comm.allgather(mine)).reshape(comm.size, 2)
    if np.any(every[:, 0]):
        agree_on_error(comm, error, f"balance policy {policy.name} failed on another rank {when}")
    if np.all(every[:, 1] == every[0, 1]):
        return split
    splits = comm.gather_object(None if split is None else [int(b) for b in split], root=0)
    shown = "; ".join(f"rank {r}: {s}" for r, s in list(enumerate(splits or []))[:4])
    raise ConfigError(f"balance policy {policy.name} returned different splits on different ranks {when} "
                      f"({shown}): a policy must decide the same on every rank (it is given the same numbers)")
