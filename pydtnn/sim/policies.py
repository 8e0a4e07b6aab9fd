"""The balancing policies of the simulator are the launcher's: `pydtnn.parallel.balance.policies.make_policy`.

`--balance` takes what the launcher's takes: none | equal | static | probe | fpm | dynamic, or a user's
`FILE.py:CLASS` / `module:CLASS` (a `pydtnn.parallel.balance.BalancePolicy` subclass) with
`--balance_options`. `PolicyDriver` is the part of the training loop that talks to a policy, as `pydtnn.cli`
and `pydtnn.parallel.DataParallel` do it: bound to rank 0 of P, the initial split, checked
(`balance.check_split`) and put in `policy.sizes`; the probe a policy asks for before the first step (the
FPM's `probe_costs(probe)`, timed by the step model, or the constant model's `probed(B, speeds, caps)`);
then after every step `after_step(step, report)` with the step's `StepReport` (only to a policy that
listens: one without `after_step` is told nothing, as in the launcher), each new split checked. A
user's policy that raises is one line plus its own frames (`pydtnn.parallel.balance.policy_calls`).
"""
from __future__ import annotations

from pydtnn.parallel import balance
from pydtnn.parallel.balance.policies import NAMES, make_policy as launcher_policy
from pydtnn.parallel.balance.policy_calls import call
from pydtnn.parallel.balance.step_report import StepReport

__all__ = ["NAMES", "make_policy", "PolicyDriver"]


def make_policy(spec, replica_speeds=None, rebalance_interval=20, options=None):
    """The launcher's policy for a --balance value (its replica speeds, rebalance interval and options)."""
    return launcher_policy(spec, speeds=replica_speeds, interval=rebalance_interval, options=options)


class PolicyDriver:
    """One policy, called as the launcher calls it."""

    def __init__(self, policy, global_batch: int, nreplicas: int, caps=None, devices=None):
        self.policy, self.global_batch, self.nreplicas, self.caps = policy, int(global_batch), int(nreplicas), caps
        self.who = f"balance policy {policy.name}"
        policy.bind(0, self.nreplicas, devices, policy.options)
        self.sizes = self._take(call(policy, "initial_sizes", self.global_batch, self.nreplicas, caps))

    def _take(self, sizes):
        sizes = balance.check_split(sizes, self.global_batch, self.nreplicas, self.caps, self.who,
                                    self.policy.allow_zero)
        self.policy.sizes, self.sizes = list(sizes), list(sizes)
        return list(sizes)

    @property
    def wants_probe(self) -> bool:
        return bool(getattr(self.policy, "wants_probe", False))

    @property
    def wants_costs(self) -> bool:
        return bool(getattr(self.policy, "wants_costs", False))

    @property
    def listens(self) -> bool:
        """Whether the policy reads the steps: one that does not (equal, static, fpm) is told nothing, as in the
        launcher's loop, so no report is built for it."""
        return bool(getattr(self.policy, "listens", True))

    def probed(self, speeds) -> list | None:
        """The constant probe's result (every replica's samples/s before training): the new split, or None."""
        new = call(self.policy, "probed", self.global_batch, [float(v) for v in speeds], self.caps)
        return None if new is None else self._take(new)

    def probe_costs(self, probe) -> list | None:
        """The FPM probe (`probe.measure(sizes)` times every replica at a split): the new split, or None."""
        new = call(self.policy, "probe_costs", probe)
        return None if new is None else self._take(new)

    def after_step(self, step: int, compute_s, wait_s=None) -> list | None:
        """The policy's decision after `step`, told every replica's compute (and wait) seconds."""
        new = call(self.policy, "after_step", step, StepReport.of_compute(self.sizes, compute_s, wait_s))
        if new is None:
            return None
        return self._take(new)
