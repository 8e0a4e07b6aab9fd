"""The balancing policies of the simulator are the launcher's: `pydtnn.parallel.policies.make_policy`.

`--balance` takes what the launcher's takes: none | equal | static | probe | dynamic, or a user's
`FILE.py:CLASS` / `module:CLASS` (a `pydtnn.parallel.balance.BalancePolicy` subclass). `drive` is the part of
the training loop that talks to a policy, as `pydtnn.cli` and `pydtnn.parallel.DataParallel` do it: the
initial split, checked (`balance.check_split`) and put in `policy.sizes`; for a policy that wants a probe
(static without speeds, probe), `probed(B, speeds, caps)` once before the first step with every replica's
speed in samples/s; then after every step `after_step(step, seconds_per_sample)`, each new split checked.
"""
from __future__ import annotations

from pydtnn.parallel import balance
from pydtnn.parallel.policies import NAMES, make_policy as launcher_policy

__all__ = ["NAMES", "make_policy", "PolicyDriver"]


def make_policy(spec, replica_speeds=None, rebalance_interval=20):
    """The launcher's policy for a --balance value (its replica speeds and rebalance interval)."""
    return launcher_policy(spec, speeds=replica_speeds, interval=rebalance_interval)


class PolicyDriver:
    """One policy, called as the launcher calls it."""

    def __init__(self, policy, global_batch: int, nreplicas: int, caps=None):
        self.policy, self.global_batch, self.nreplicas, self.caps = policy, int(global_batch), int(nreplicas), caps
        self.who = f"balance policy {policy.name}"
        self.sizes = self._take(policy.initial_sizes(self.global_batch, self.nreplicas, caps))

    def _take(self, sizes):
        sizes = balance.check_split(sizes, self.global_batch, self.nreplicas, self.caps, self.who)
        self.policy.sizes = list(sizes)
        return list(sizes)

    @property
    def wants_probe(self) -> bool:
        return bool(getattr(self.policy, "wants_probe", False))

    def probed(self, speeds) -> list | None:
        """The probe's result (every replica's samples/s before training): the new split, or None."""
        new = self.policy.probed(self.global_batch, [float(v) for v in speeds], self.caps)
        return None if new is None else self._take(new)

    def after_step(self, step: int, seconds_per_sample) -> list | None:
        new = self.policy.after_step(step, [float(t) for t in seconds_per_sample])
        if new is None:
            return None
        return self._take(new)
