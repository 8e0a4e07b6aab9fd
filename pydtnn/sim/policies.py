"""The balancing policies, driven through the project's own code (pydtnn.parallel.balance).

This is the one adapter between the simulator and the launcher's policies: each class has the interface
of `pydtnn.parallel.balance.BalancePolicy` (``initial_sizes(global_batch, nreplicas, caps)``,
``after_step(step, seconds_per_sample) -> list | None``, ``state_dict`` / ``load_state_dict``), and calls
the functions the trainer calls: `balance.partition` for every split, `balance.DynamicBalancer` for
``dynamic`` exactly as `Trainer.train_epoch` feeds it (``observe`` the step's compute seconds per
sample, then ``maybe_rebalance(step)``). When the plug-in interface lands in balance.py, this file
becomes a call to its ``make_policy``.

- ``equal``: B split evenly (the launcher's ``--balance none``).
- ``static``: proportional to ``replica_speeds`` (``--replica_speeds``); without them, the probe.
- ``probe``: equal for the first ``probe_steps`` steps, then proportional to the speeds measured over
  them (samples / median seconds), as the launcher's speed probe before training.
- ``dynamic``: `DynamicBalancer` (``interval`` = ``--rebalance_interval``).
"""
from __future__ import annotations

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel import balance

__all__ = ["POLICIES", "make_policy", "Equal", "Static", "Probe", "Dynamic"]


class Equal:
    name = "equal"

    def initial_sizes(self, global_batch, nreplicas, caps=None):
        return balance.partition(global_batch, [1.0] * nreplicas, caps)

    def after_step(self, step, seconds_per_sample):
        return None

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class Static(Equal):
    name = "static"

    def __init__(self, speeds=None):
        self.speeds = None if speeds is None else list(speeds)

    def initial_sizes(self, global_batch, nreplicas, caps=None):
        if self.speeds is not None and len(self.speeds) != nreplicas:
            raise ConfigError(f"--replica_speeds has {len(self.speeds)} values for {nreplicas} replicas")
        return balance.partition(global_batch, self.speeds or [1.0] * nreplicas, caps)


class Probe(Equal):
    name = "probe"

    def __init__(self, probe_steps=5):
        self.probe_steps = int(probe_steps)
        self._seen = []

    def initial_sizes(self, global_batch, nreplicas, caps=None):
        self.global_batch, self.caps = global_batch, caps
        return balance.partition(global_batch, [1.0] * nreplicas, caps)

    def after_step(self, step, seconds_per_sample):
        if len(self._seen) >= self.probe_steps:
            return None
        self._seen.append(np.asarray(seconds_per_sample, dtype=np.float64))
        if len(self._seen) < self.probe_steps:
            return None
        speeds = 1.0 / np.median(np.asarray(self._seen), axis=0)
        return balance.partition(self.global_batch, speeds.tolist(), self.caps)

    def state_dict(self):
        return {"seen": np.asarray(self._seen)}

    def load_state_dict(self, state):
        self._seen = [np.asarray(r) for r in state["seen"]]


class Dynamic(Equal):
    name = "dynamic"

    def __init__(self, interval=20, initial=None):
        self.interval = int(interval)
        self.initial = initial             # a policy whose split starts training (equal by default)
        self.balancer = None

    def initial_sizes(self, global_batch, nreplicas, caps=None):
        sizes = (self.initial or Equal()).initial_sizes(global_batch, nreplicas, caps)
        self.balancer = balance.DynamicBalancer(global_batch, nreplicas, interval=self.interval,
                                                initial_sizes=sizes, caps=caps)
        return list(sizes)

    def after_step(self, step, seconds_per_sample):
        if self.balancer.observe(seconds_per_sample):          # the trainer's two calls, in its order
            return self.balancer.maybe_rebalance(step)
        return None

    def state_dict(self):
        return self.balancer.state_dict()

    def load_state_dict(self, state):
        self.balancer.load_state_dict(state)


POLICIES = ("equal", "static", "probe", "dynamic")


def make_policy(spec: str, replica_speeds=None, rebalance_interval=20, probe_steps=5):
    """A policy by name (the launcher's ``none`` is ``equal``); ``static`` without speeds probes."""
    spec = {"none": "equal"}.get(spec, spec)
    if spec == "equal":
        return Equal()
    if spec == "static":
        return Static(replica_speeds) if replica_speeds else Probe(probe_steps)
    if spec == "probe":
        return Probe(probe_steps)
    if spec == "dynamic":
        return Dynamic(rebalance_interval)
    raise ConfigError(f"--balance must be one of none, {', '.join(POLICIES)}, got {spec!r}")
