"""Simulate a training run: a policy chooses the split, the step model times each step, the policy sees
what the trainer would have measured (compute seconds per sample of every replica) and may re-split.

    result = simulate(Scenario(profiles=[prof] * 64, global_batch=4096, policy="dynamic", noise=0.05,
                               stragglers=Stragglers(8, 2.0, 50), steps=1000))
    result.step_seconds, result.epoch_seconds, result.per_replica

Nothing here loops over replicas: each step is a few (P,)- and (P, points)-array operations.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel import sharding
from pydtnn.sim.collectives import resolve_algorithm
from pydtnn.sim.policies import PolicyDriver, make_policy
from pydtnn.sim.kinds import codes, row_kinds
from pydtnn.sim.links import default_inter
from pydtnn.sim.step_model import Collective, StepModel, profile_groups
from pydtnn.sim.variability import Stragglers, Variability

__all__ = ["Scenario", "Result", "simulate", "best_partition"]


@dataclass
class Scenario:
    profiles: list                     # one Profile per replica (the same object may repeat)
    global_batch: int
    policy: str = "equal"
    replica_speeds: list | None = None
    speed_factors: list | None = None  # the launcher's --emulate_speeds meaning
    non_blocking: bool = False
    sync_bn: bool = False
    algorithm: str = "auto"
    nodes: int = 1
    noise: float = 0.0
    stragglers: Stragglers | None = None
    steps: int = 100
    steps_per_epoch: int = 0           # 0: ceil(samples / global_batch)
    samples: int = 50000
    rebalance_interval: int = 20
    bucket_bytes: int = 1 << 20
    grad_compression: str = "none"     # fp16 / bf16: the gradient sent in 2 bytes an element (`step_model`)
    seed: int = 0
    balance_options: dict | None = None
    devices: list | None = None        # one of "cpu" / "gpu" per replica (what a policy is told)
    cost_model: object = None          # a run's pydtnn.parallel.balance.cost_model.CostModel: replica compute from it
    cost_index: object = None          # (P,) ints: replica i's compute is cost_model.replicas[cost_index[i]]
    #                                    (None: replica i mod the model's count)
    network_inter: object = None       # a Network between nodes (None: the profile's, else links' default)
    _groups: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def replicas(self) -> int:
        return len(self.profiles)

    def groups(self):
        """(distinct profiles, index (P,)), found once (`step_model.profile_groups`)."""
        if self._groups is None or len(self._groups[1]) != len(self.profiles):
            self._groups = profile_groups(self.profiles)
        return self._groups


@dataclass
class Result:
    scenario: Scenario
    step_times: np.ndarray
    sizes: list                        # the split in force at the end
    compute_s: np.ndarray              # per replica, mean per step
    wait_s: np.ndarray
    rebalances: int                    # re-splits during training (a probe's first split is not counted)
    steps_per_epoch: int
    extra: dict = field(default_factory=dict)

    @property
    def step_seconds(self) -> float:
        return float(np.mean(self.step_times))

    @property
    def epoch_seconds(self) -> float:
        return self.step_seconds * self.steps_per_epoch

    @property
    def per_replica(self) -> list:
        return [{"replica": i, "b_i": int(b), "compute_s": float(c), "wait_s": float(w)}
                for i, (b, c, w) in enumerate(zip(self.sizes, self.compute_s, self.wait_s))]


def _check(sc: Scenario):
    P = sc.replicas
    if P < 1:
        raise ConfigError("--replicas must be >= 1")
    if sc.global_batch < P:
        raise ConfigError(f"--global_batch_size {sc.global_batch} is smaller than --replicas {P}: every replica "
                          f"needs at least one sample")
    if sc.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {sc.steps}")
    if sc.nodes < 1 or P % sc.nodes:
        raise ConfigError(f"--replicas {P} must be a multiple of --nodes {sc.nodes}")
    if sc.speed_factors is not None:
        if len(sc.speed_factors) != P:
            raise ConfigError(f"--speed_factors has {len(sc.speed_factors)} values for {P} replicas")
        if min(sc.speed_factors) <= 0:
            raise ConfigError("--speed_factors must be > 0")
    names = {tuple(p.layer_names) for p in sc.groups()[0]}
    if len(names) > 1:
        raise ConfigError("the profiles describe different models (their layer lists differ)")
    resolve_algorithm(sc.algorithm)


def _model(sc, sizes, collective, emulate):
    per_node = sc.replicas // sc.nodes
    model = _step_model(sc, sizes, collective, emulate, np.full(sc.replicas, float(per_node)))
    slots = sc.profiles[0].replica_slots
    if model.emulate is not None and slots and per_node > slots:
        # ranks outnumber the cores: the launcher's emulator then sleeps to its deadline (it spins when
        # every rank has its cores), leaving its core to the others for that part of the step; so a node's
        # ranks at work are counted by the share of the step each works
        busy = model.compute_alone / np.maximum(model.compute_alone, model.emulate)
        model = _step_model(sc, sizes, collective, emulate,
                            busy.reshape(sc.nodes, per_node).sum(axis=1).repeat(per_node))
    return model


def _step_model(sc, sizes, collective, emulate, ranks_at_work):
    """The step model with every replica's contention factor at its node's count of ranks at work; with a
    run's cost model, each replica's layers scaled so that its compute is the model's t_i(b_i)."""
    groups = sc.groups()
    contention = _contention(groups, ranks_at_work)
    scale = None
    if sc.cost_model is not None:
        wanted = _cost_seconds(sc, sizes)
        alone = StepModel(sc.profiles, sizes, collective, groups=groups).compute_alone * contention
        scale = np.where(alone > 0, wanted / np.maximum(alone, 1e-300), 1.0)    # the model's time, contention in
    return StepModel(sc.profiles, sizes, collective, non_blocking=sc.non_blocking, sync_bn=sc.sync_bn,
                     bucket_bytes=sc.bucket_bytes, emulate=emulate, contention=contention, scale=scale, groups=groups,
                     compression=sc.grad_compression)


def _contention(groups, ranks_at_work):
    """Every replica's contention factor (its profile's, at its node's ranks at work), once per distinct pair."""
    distinct, which = groups
    k_code, k_values = codes(np.asarray(ranks_at_work, dtype=np.float64))
    out = np.empty(k_code.size)
    for g, prof in enumerate(distinct):
        factors = np.array([prof.contention_factor(k) for k in k_values.tolist()])
        rows = slice(None) if len(distinct) == 1 else which == g
        out[rows] = factors[k_code[rows]]
    return out


def _cost_seconds(sc, sizes):
    """Every replica's t_i(b_i) from the run's cost model, once per distinct (model replica, b)."""
    model = sc.cost_model
    P = len(sizes)
    index = (np.arange(P) % len(model)) if sc.cost_index is None else np.asarray(sc.cost_index, dtype=np.int64)
    b = np.asarray(sizes, dtype=np.int64)
    kind, first = row_kinds(index, b)
    wanted = np.array([float(model.replicas[index[r]].seconds(b[r])) for r in first.tolist()])
    return wanted[kind]


class SimProbe:
    """The FPM probe of the simulator: every replica's compute at a split, from the step model without noise
    (as the launcher's probe times every replica at once and takes medians)."""

    def __init__(self, sc, collective, emulate, caps=None):
        self.sc, self.collective, self.emulate = sc, collective, emulate
        self.global_batch, self.caps = sc.global_batch, caps
        self.devices = list(sc.devices or ["cpu"] * sc.replicas)

    def measure(self, sizes):
        model = _model(self.sc, list(sizes), self.collective, self.emulate)
        alone = model.compute_alone if model.emulate is None else np.maximum(model.compute_alone, model.emulate)
        return alone, [()] * len(sizes)              # nothing flagged (one shared empty tuple: 10^7 replicas)

    def warm(self, sizes_per_replica):
        pass


def cost_model_of(sc, points=12):
    """The scenario's replicas as a CostModel (pydtnn.parallel.balance.cost_model): each one's compute, from the
    step model without noise, at `points` local batches spaced geometrically up to B."""
    from pydtnn.parallel.balance.cost_model import CostModel, ReplicaCost
    collective = _collective(sc)
    emulate = None if sc.speed_factors is None else (max(sc.speed_factors) / np.asarray(sc.speed_factors, float))
    probe = SimProbe(sc, collective, emulate)
    ladder = sorted({max(1, int(round(sc.global_batch ** (k / (points - 1))))) for k in range(points)})
    times = np.array([probe.measure([b] * sc.replicas)[0] for b in ladder])          # (points, P)
    # replicas alike (profile, speed, contention) share one fit: 10^6 replicas are a handful of kinds
    kind, first = row_kinds(*times)
    fits = [ReplicaCost([(b, t) for b, t in zip(ladder, times[:, j]) if t > 0]) for j in first.tolist()]
    return CostModel([fits[j] for j in kind.tolist()], probe.devices)


def _collective(sc):
    first = sc.profiles[0]
    inter = sc.network_inter or first.network_inter or default_inter(first.network)
    return Collective(resolve_algorithm(sc.algorithm), sc.replicas, first.network_for(sc.replicas // sc.nodes),
                      inter, sc.nodes)


def simulate(sc: Scenario, progress=None) -> Result:
    """`progress`: what counts the steps (`update`, `close`; a `pydtnn.sim.talk.Phase`, which is also told what
    runs before the first step: `stage`)."""
    _check(sc)
    P = sc.replicas
    collective = _collective(sc)
    emulate = None
    if sc.speed_factors is not None:
        f = np.asarray(sc.speed_factors, dtype=np.float64)
        emulate = f.max() / f
    say = getattr(progress, "stage", lambda doing: None)      # what runs before the first step, if told
    say("the policy's first split")
    driver = PolicyDriver(make_policy(sc.policy, sc.replica_speeds, sc.rebalance_interval, sc.balance_options),
                          sc.global_batch, P, devices=sc.devices)
    sizes = driver.sizes
    say("the step model of the first split")
    model = _model(sc, sizes, collective, emulate)
    var = Variability(P, sc.noise, sc.stragglers, sc.seed)
    rebalances = 0                     # re-splits during training; the first split (a probe's) is not one
    first_split = "initial_sizes"
    if driver.wants_costs:
        say("the policy's probe of every replica's t_i(b)")
        new = driver.probe_costs(SimProbe(sc, collective, emulate))
        if new is not None and new != sizes:
            sizes, first_split = new, "probe"
            model = _model(sc, sizes, collective, emulate)
    elif driver.wants_probe:
        # the launcher's probe times each replica alone at its starting split before training: its speed
        # there, in samples/s, from the same compute model (without noise: a probe takes a median)
        alone = model.compute_alone if model.emulate is None else np.maximum(model.compute_alone, model.emulate)
        new = driver.probed(model.sizes / np.maximum(alone, 1e-300))
        if new is not None and new != sizes:
            sizes, first_split = new, "probe"
            model = _model(sc, sizes, collective, emulate)
    say("the first step")
    steps = np.zeros(sc.steps)
    compute_sum, wait_sum = np.zeros(P), np.zeros(P)
    for s in range(sc.steps):
        t, compute, wait = model.step(var.factors(s))
        steps[s] = t
        compute_sum += compute
        wait_sum += wait
        new = driver.after_step(s, compute, wait) if driver.listens else None
        if new is not None and list(new) != sizes:
            sizes = list(new)
            model = _model(sc, sizes, collective, emulate)
            rebalances += 1
        if progress is not None:
            progress.update(1)
    if progress is not None:
        progress.close()
    spe = sharding.steps_in_epoch(sc.samples, sc.global_batch, sc.steps_per_epoch)
    return Result(sc, steps, sizes, compute_sum / sc.steps, wait_sum / sc.steps, rebalances, spe,
                  extra={"compute_alone": model.compute_alone if model.emulate is None else
                         np.maximum(model.compute_alone, model.emulate), "first_split": first_split})


def best_partition(sc: Scenario):
    """The split with equal finish times under the scenario's cost model (`cost_model_of`, solved by the
    launcher's `pydtnn.parallel.balance.fpm_partition.equal_finish`), and its noise-free step seconds."""
    from pydtnn.parallel.balance.fpm_partition import equal_finish
    _check(sc)
    sizes = equal_finish(sc.global_batch, cost_model_of(sc))
    t, _, _ = _model(sc, sizes, _collective(sc), None if sc.speed_factors is None else
                     (max(sc.speed_factors) / np.asarray(sc.speed_factors, float))).step(np.ones(sc.replicas))
    return list(sizes), float(t)
