"""The built-in balancing policies, written on `pydtnn.parallel.balance.BalancePolicy`, and `make_policy`.

    --balance none | equal      EqualPolicy     b_i = B / P (largest remainder)
    --balance static            StaticPolicy    b_i proportional to --replica_speeds
                                ProbePolicy     (static without speeds) proportional to speeds probed before training
    --balance dynamic           DynamicPolicy   re-measured and re-split during training (balance.DynamicBalancer)
    --balance FILE.py:CLASS     a user's BalancePolicy subclass, constructed with no arguments
    --balance module:CLASS
"""
from __future__ import annotations

import numpy as np

from pydtnn import plugins
from pydtnn.errors import ConfigError
from pydtnn.parallel.balance import BalancePolicy, DynamicBalancer, partition

NAMES = ("none", "equal", "static", "probe", "dynamic")


class EqualPolicy(BalancePolicy):
    name = "equal"
    measured = False


class StaticPolicy(BalancePolicy):
    """b_i proportional to given relative speeds (one per replica)."""
    name = "static"
    measured = False

    def __init__(self, speeds):
        self.speeds = [float(v) for v in speeds]

    def initial_sizes(self, global_batch, nreplicas, caps):
        if len(self.speeds) != nreplicas:
            raise ConfigError(f"--replica_speeds has {len(self.speeds)} values for {nreplicas} replicas")
        return partition(global_batch, self.speeds, caps)


class ProbePolicy(BalancePolicy):
    """b_i proportional to each replica's speed, measured by a few timed local steps before training."""
    name = "probe"
    wants_probe = True

    def probed(self, global_batch, speeds, caps):
        return partition(global_batch, list(speeds), caps)


class DynamicPolicy(BalancePolicy):
    """Re-measures the speeds every `interval` steps and re-splits when that pays (see DynamicBalancer)."""
    name = "dynamic"
    checkpoint_key = "balancer"          # the key of the checkpoints written before policies were plug-ins

    def __init__(self, interval=20, smoothing=0.3, hysteresis=0.05):
        self.options = dict(interval=interval, smoothing=smoothing, hysteresis=hysteresis)
        self.balancer = None

    def initial_sizes(self, global_batch, nreplicas, caps):
        self.balancer = DynamicBalancer(global_batch, nreplicas, caps=caps, **self.options)
        return list(self.balancer.sizes)

    @property
    def sizes(self):
        return None if self.balancer is None else self.balancer.sizes

    @sizes.setter
    def sizes(self, value):              # the split in force, as the loop sets it (start, resume)
        if self.balancer is not None and value is not None:
            self.balancer.sizes = list(value)

    def after_step(self, step, seconds_per_sample):
        if not self.balancer.observe(seconds_per_sample):
            return None
        return self.balancer.maybe_rebalance(step)

    def state_dict(self):
        return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in self.balancer.state_dict().items()}

    def load_state_dict(self, state):
        ema = np.asarray(state.get("ema", []), dtype=np.float64)
        if ema.size not in (0, self.balancer.nreplicas):
            raise ConfigError(f"'ema' has {ema.size} speeds for {self.balancer.nreplicas} replicas")
        self.balancer.load_state_dict({k: np.asarray(v) if isinstance(v, list) else v for k, v in state.items()})


def make_policy(spec="none", *, speeds=None, interval=20) -> BalancePolicy:
    """The policy a --balance value names (a built-in name, FILE.py:CLASS or module:CLASS), or `spec` itself
    when it already is a BalancePolicy."""
    if isinstance(spec, BalancePolicy):
        return spec
    if plugins.is_spec(spec):
        policy = plugins.construct(spec, "--balance", BalancePolicy)
        # what its methods raise, in the launcher or the simulator: one line and the user's own frames
        plugins.guard_methods(policy, ("initial_sizes", "after_step", "probed", "state_dict", "load_state_dict"),
                              f"--balance {spec}")
        if not isinstance(getattr(policy, "name", None), str) or policy.name == BalancePolicy.name:
            policy.name = type(policy).__name__      # what checkpoints match on resume, wherever the file is
        return policy
    if spec in ("none", "equal"):
        return EqualPolicy()
    if spec == "static":
        return StaticPolicy(speeds) if speeds else ProbePolicy()
    if spec == "probe":
        return ProbePolicy()
    if spec == "dynamic":
        return DynamicPolicy(interval=interval)
    raise ConfigError(f"--balance must be one of {', '.join(NAMES)}, FILE.py:CLASS or module:CLASS, got {spec!r}")
