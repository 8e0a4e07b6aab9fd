"""pydtnn-simulate: predict a cluster before booking it.

    pydtnn-simulate calibrate --model resnet20_cifar10 --out p.json          # measures this machine (~60 s)
    pydtnn-simulate calibrate --model resnet20_cifar10 --trace trace.json --out p.json
    pydtnn-simulate calibrate --model resnet20_cifar10 --roofline --cpu_speed 2e12 --out p.json
    pydtnn-simulate run --profile p.json --model resnet20_cifar10 --global_batch_size 4096 --replicas 1024 \\
        --balance dynamic --noise 0.05 --stragglers 8:2.0 --steps 1000 --json
    pydtnn-simulate cost_model --checkpoint run/epoch_0001.npz --out costs.json     # a run's t_i(b), as a file
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

from pydtnn.launch.flags import (OneLineParser, boolean, float_list, nonneg_float, policy_options, positive_int,
                                 positive_int_list)
from pydtnn.errors import ConfigError, PyDTNNError
from pydtnn.parallel.comm.compression import GRAD_COMPRESSIONS

SAMPLES = {"mnist": 60000, "cifar10": 50000, "imagenet": 1281167}
SWEEP_POLICIES = ("equal", "static", "dynamic")


def build_parser():
    p = OneLineParser(prog="pydtnn-simulate", description="PyDTNN's performance model and cluster simulator")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    c = sub.add_parser("calibrate", help="measure (or derive) a profile and write it as JSON")
    c.add_argument("--model", dest="model_name", required=True)
    c.add_argument("--dataset", dest="dataset_name", default=None, help="only fixes the input shape")
    c.add_argument("--out", required=True, help="profile JSON to write (checked before any measurement)")
    c.add_argument("--dtype", default="float32")
    c.add_argument("--batch_points", type=positive_int_list, default=[1, 8, 32, 128],
                   help="local batch sizes at which each layer is timed")
    c.add_argument("--seconds", type=nonneg_float, default=60.0,
                   help="time budget: 40%% layers, 20%% network sweeps, 20%% contention, the rest the launcher "
                        "overhead runs")
    c.add_argument("--mpi_processes", type=positive_int, default=2, help="processes of the network sweeps")
    c.add_argument("--network", type=boolean, default=True, help="measure the MPI (false: alpha=beta=gamma=0)")
    c.add_argument("--overhead", type=boolean, default=True,
                   help="time the launcher's per-step work outside compute (two short one-rank runs)")
    c.add_argument("--threads_per_replica", type=positive_int, default=1,
                   help="threads of the replica being profiled, as the launcher's flag (default 1)")
    c.add_argument("--contention", type=boolean, default=True,
                   help="time the model with 1, 2, ... cores+1 processes on this node (ranks slowing each "
                        "other), and the network with more processes than cores")
    c.add_argument("--trace", default=None, help="build the profile from a launcher Chrome trace instead")
    c.add_argument("--trace_sizes", type=positive_int_list, default=None, help="the split b_0,b_1,... of a trace without per-layer events")
    c.add_argument("--trace_rank", type=int, default=0)
    c.add_argument("--roofline", action="store_true", help="build the profile from the five flags below")
    _roofline_flags(c, "measured or --trace profiles: the link between nodes, which one machine cannot measure "
                       "(written as network_inter); --roofline: upstream's meaning, the whole cluster's network")

    r = sub.add_parser("run", help="simulate training on a (possibly imaginary) cluster")
    r.add_argument("--profile", default=None,
                   help="FILE[:COUNT],... device profiles (COUNT replicas each; one file: every replica); "
                        "without it, the roofline mode from the flags below")
    r.add_argument("--model", dest="model_name", default=None)
    r.add_argument("--dataset", dest="dataset_name", default=None, choices=sorted(SAMPLES))
    r.add_argument("--samples", type=positive_int, default=None, help="training samples per epoch")
    r.add_argument("--global_batch_size", type=positive_int, required=True)
    r.add_argument("--replicas", type=positive_int, required=True)
    r.add_argument("--nodes", type=positive_int, default=None,
                   help="nodes the replicas share (default: as many ranks per node as the profiled node holds "
                        "replicas, its cores / threads per replica; one per node when the profile does not say)")
    r.add_argument("--ranks_per_node", type=positive_int, default=None,
                   help="ranks on each node: --replicas / K nodes; a --sweep keeps K and grows the nodes")
    r.add_argument("--balance", default="none",
                   help="none | equal | static | probe | dynamic, or a user's FILE.py:CLASS / module:CLASS "
                        "(a pydtnn.parallel.balance.BalancePolicy), as the launcher's")
    r.add_argument("--balance_options", type=policy_options, default=None,
                   help="key=value,... for the policy, as the launcher's")
    r.add_argument("--devices", default=None,
                   help="each replica's device: KIND[:COUNT],... (cpu, gpu), e.g. gpu:16,cpu:48; counts summing to "
                        "--replicas, or to a divisor of it, repeated (a node's devices); one bare kind: every "
                        "replica. What a policy is told (fpm buckets GPUs), and which --cost_model entry a replica "
                        "takes")
    r.add_argument("--cost_model", default=None,
                   help="each replica's compute t_i(b) from a cost model: a checkpoint of a run whose policy kept "
                        "one (fpm, dynamic), or its JSON (docs/simulation.md: the model it was measured on, its "
                        "gradient bytes, devices and points); with --devices a replica takes the file's replicas of "
                        "its kind in turn, without, the file's replica i mod its count")
    r.add_argument("--replica_speeds", type=float_list, default=None, help="static: split proportional to these")
    r.add_argument("--speed_factors", type=float_list, default=None,
                   help="F1,...,FP relative replica speeds, the launcher's --emulate_speeds meaning")
    r.add_argument("--rebalance_interval", type=positive_int, default=20)
    r.add_argument("--non_blocking_mpi", type=boolean, default=False)
    r.add_argument("--sync_batchnorm", type=boolean, default=False)
    r.add_argument("--bucket_bytes", type=positive_int, default=1 << 20)
    r.add_argument("--grad_compression", default="none", choices=GRAD_COMPRESSIONS,
                   help="the gradient sent in 16 bits: half the modelled bytes of a float32 profile, plus the casts")
    r.add_argument("--stragglers", default=None, help="K:FACTOR[:PERIOD]")
    r.add_argument("--noise", type=nonneg_float, default=0.0, help="sigma of a lognormal factor on compute")
    r.add_argument("--steps", type=positive_int, default=100)
    r.add_argument("--steps_per_epoch", type=int, default=0)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--sweep", default="none",
                   help="P1,P2,... or 'auto' (powers of two up to --replicas, times the ranks per node when "
                        "given): a table of time against P for equal, static, dynamic; each P keeps the ranks "
                        "per node and the --speed_factors / --profile mix of the --replicas cluster")
    r.add_argument("--plot", default=None, help="PNG of the sweep (needs --sweep; checked before any work)")
    r.add_argument("--json", action="store_true",
                   help="print one JSON document instead of the text (what the run says while it works: stderr)")
    _roofline_flags(r, "with --profile: the link between nodes, overriding the profile's; without: upstream's "
                       "meaning, the whole cluster's network")

    e = sub.add_parser("cost_model", help="write a run's cost model t_i(b) (from its checkpoint) as the JSON "
                                          "--cost_model reads")
    e.add_argument("--checkpoint", required=True, help="a checkpoint of a --balance fpm or dynamic run")
    e.add_argument("--out", required=True, help="the JSON to write (checked before reading the checkpoint)")
    e.add_argument("--devices", default=None,
                   help="KIND,... one per replica of the run: relabel them (an emulated GPU ran as a cpu)")
    e.add_argument("--measured_on", default=None, help="text saying where the times come from")
    return p


def _roofline_flags(p, network_words):
    g = p.add_argument_group("roofline (upstream PyDTNN's performance-model flags, upstream's meaning)")
    g.add_argument("--cpu_speed", type=float, default=4e12, help="FLOP/s")
    g.add_argument("--memory_bw", type=float, default=50e9, help="B/s")
    g.add_argument("--network_bw", type=float, default=None,
                   help=f"bits/s (default: upstream's 1e9). {network_words}")
    g.add_argument("--network_lat", type=float, default=None,
                   help=f"s (default: upstream's 5e-07). {network_words}")
    g.add_argument("--network_alg", default="auto",
                   help="auto (MPICH's choice), ring, rabenseifner, recursive_doubling, binomial, hierarchical; "
                        "upstream's vdg = rabenseifner, bta = binomial")


def _roofline_kw(a):
    """The roofline flags, the network's at upstream's defaults where not given, and the words that say so."""
    from pydtnn.sim.links import DEFAULT_BW, DEFAULT_LAT
    bw = DEFAULT_BW if a.network_bw is None else a.network_bw
    lat = DEFAULT_LAT if a.network_lat is None else a.network_lat
    words = ", ".join(f"{flag} {v:g} ({'given' if given is not None else 'upstream default'})"
                      for flag, v, given in (("--network_bw", bw, a.network_bw), ("--network_lat", lat, a.network_lat)))
    return dict(cpu_speed=a.cpu_speed, memory_bw=a.memory_bw, network_bw=bw, network_lat=lat,
                network_words=f"roofline: {words}")


def _calibrate(a):
    from pydtnn.outputs import check_output_file
    from pydtnn.sim import calibrate, links, roofline, trace_profile
    check_output_file(a.out, "--out")          # before the measurement, not after it
    links.check_flags(a.network_bw, a.network_lat)
    if a.trace:
        prof = trace_profile.trace_profile(a.trace, a.model_name, a.trace_sizes, a.trace_rank, a.dtype)
        prof.network_source = prof.network_source or f"from the allreduce events of --trace {a.trace}"
    elif a.roofline:
        prof = roofline.roofline_profile(a.model_name, dtype=a.dtype, **_roofline_kw(a))
    else:
        prof = calibrate.calibrate(a.model_name, a.batch_points, layer_seconds=a.seconds * 0.4,
                                   network_seconds=a.seconds * 0.2, nprocs=a.mpi_processes, measure_net=a.network,
                                   dtype=a.dtype, overhead=a.overhead, contention=a.contention,
                                   contention_seconds=a.seconds * 0.2, threads=a.threads_per_replica,
                                   log=lambda m: print(m, file=sys.stderr, flush=True))
    if not a.roofline and (a.network_bw is not None or a.network_lat is not None):
        inter = links.between_nodes(prof, "the profile", a.network_bw, a.network_lat)
        prof.network_inter = inter.network
        prof.network_inter_source = (f"{inter.source} to calibrate (one machine cannot measure a link to "
                                     f"another)")
    prof.save(a.out)
    print(f"profile of {a.model_name} ({prof.source}) written to {a.out}: "
          f"{prof.compute_seconds([prof.batch_points[-1]])[0] * 1e3:.3f} ms per step at b={prof.batch_points[-1]}")
    print(f"network inside a node: {links.Link(prof.network, prof.network_source or 'the profile').describe()}")
    if prof.network_inter is not None:
        print(f"network between nodes: {links.Link(prof.network_inter, prof.network_inter_source).describe()}")
    else:
        print(f"network between nodes: none (one machine cannot measure a link to another): give it here or to "
              f"run with --network_bw BITS/S --network_lat S (e.g. 1e11 and 1.5e-6 for a 100 Gb/s fabric); "
              f"without, run models {links.DEFAULT_WORDS} and says so")


def _profiles(a, P):
    from pydtnn.sim.profile import load_profile
    from pydtnn.sim.roofline import roofline_profile
    if a.profile is None:
        if a.model_name is None:
            raise ConfigError("give --profile, or --model for the roofline mode")
        return [roofline_profile(a.model_name, **_roofline_kw(a))] * P
    parts = [x for x in a.profile.split(",") if x]
    loaded, counts = [], []
    for part in parts:
        path, _, count = part.rpartition(":") if part.rsplit(":", 1)[-1].isdigit() else (part, "", "")
        loaded.append(load_profile(path))
        counts.append(int(count) if count else None)
    if len(parts) == 1 and counts[0] is None:
        out = [loaded[0]] * P
    else:
        if None in counts or sum(counts) != P:
            raise ConfigError(f"--profile: give FILE:COUNT for every file, the counts summing to --replicas {P}")
        out = [p for p, n in zip(loaded, counts) for _ in range(n)]
    if a.model_name and out[0].model and out[0].model != a.model_name:
        raise ConfigError(f"--profile {parts[0]} was measured for model {out[0].model}, not {a.model_name}")
    return out


def _scenario(a, P, policy, profiles, speed_factors, devices=None, cost_index=None):
    """The scenario of P replicas; `devices` and `cost_index` are those of these P (`_scenario_at` mixes them)."""
    from pydtnn.sim.engine import Scenario
    from pydtnn.sim.variability import parse_stragglers
    stragglers = parse_stragglers(a.stragglers)
    if stragglers is not None and stragglers.count > P:
        stragglers = type(stragglers)(P, stragglers.factor, stragglers.period)
    return Scenario(profiles=profiles, global_batch=a.global_batch_size, policy=policy,
                    replica_speeds=a.replica_speeds, speed_factors=speed_factors, non_blocking=a.non_blocking_mpi,
                    sync_bn=a.sync_batchnorm, algorithm=a.network_alg, nodes=a.nodes, noise=a.noise,
                    stragglers=stragglers, steps=a.steps, steps_per_epoch=a.steps_per_epoch, samples=_samples(a)[0],
                    rebalance_interval=a.rebalance_interval, bucket_bytes=a.bucket_bytes, seed=a.seed,
                    grad_compression=a.grad_compression,
                    balance_options=a.balance_options if policy == {"none": "equal"}.get(a.balance, a.balance) else None,
                    devices=devices, cost_model=a.cost.model if a.cost is not None else None, cost_index=cost_index,
                    network_inter=a.inter.network)


def _samples(a):
    """(training samples per epoch, where that number comes from)."""
    if a.samples:
        return a.samples, f"--samples {a.samples}"
    name = a.dataset_name or "cifar10"
    return SAMPLES[name], (f"--dataset {name}'s training set" if a.dataset_name else
                           f"CIFAR-10's training set, the default without --dataset or --samples")


def _sweep_sizes(a, step=1):
    """The sweep's replica counts; 'auto': ``step`` (the ranks per node, when fixed) times powers of two."""
    if a.sweep == "none":
        return []
    if a.sweep == "auto":
        out, p = [], step
        while p < a.replicas:
            out.append(p)
            p *= 2
        return (out + [a.replicas])[-8:]
    try:
        return positive_int_list(a.sweep)
    except Exception:
        raise ConfigError(f"--sweep must be 'auto', 'none' or P1,P2,..., got {a.sweep!r}") from None


def _check_flags(a, P):
    """Every check that needs no model: before the first line, in one line each."""
    from pydtnn.outputs import check_output_file
    from pydtnn.sim import links
    from pydtnn.sim.budget import check_memory
    from pydtnn.sim.variability import parse_stragglers
    if a.steps_per_epoch < 0:
        raise ConfigError("--steps_per_epoch must be >= 0")
    if a.replica_speeds and len(a.replica_speeds) != P:
        raise ConfigError(f"--replica_speeds has {len(a.replica_speeds)} values for {P} replicas")
    if a.plot is not None:               # before any work: the plot comes last
        if a.sweep == "none":
            raise ConfigError("--plot draws the sweep: give --sweep auto or --sweep P1,P2,...")
        check_output_file(a.plot, "--plot")
    listed = _sweep_sizes(a) if a.sweep != "auto" else []     # 'auto' stays within --replicas
    check_memory(max([P, *listed]))        # before anything of that size is allocated (with the points: below)
    samples, where = _samples(a)
    if a.global_batch_size > samples:
        raise ConfigError(f"--global_batch_size {a.global_batch_size} is larger than the {samples} samples of "
                          f"{where}: an epoch would not hold one step (give --samples, the dataset's size, or a "
                          f"smaller batch)")
    links.check_flags(a.network_bw, a.network_lat)
    parse_stragglers(a.stragglers)


def _run(a):
    import gc
    from pydtnn.sim.talk import Talk
    talk = Talk(out=sys.stderr if a.json else sys.stdout)
    collecting = gc.isenabled()
    # no cycle collection while simulating: 10^7 replicas make tens of millions of small objects (splits,
    # reports, rows), none in a cycle; a full collection over them held the interpreter for half a minute,
    # progress lines included
    gc.disable()
    try:
        _run_talking(a, talk)
    finally:
        talk.close()
        if collecting:
            gc.enable()


def _run_talking(a, talk):
    from pydtnn.sim import links, report
    from pydtnn.sim.budget import check_memory, say_how_long
    from pydtnn.sim.cost_file import read_cost_file
    from pydtnn.sim.devices import parse_devices
    from pydtnn.sim.engine import best_partition, simulate
    from pydtnn.sim.layout import node_layout, sweep_layouts
    P = a.replicas
    _check_flags(a, P)
    spec = parse_devices(a.devices, P) if a.devices else None
    a.cost = read_cost_file(a.cost_model) if a.cost_model else None
    policy = {"none": "equal"}.get(a.balance, a.balance)
    # --profile files are read now (JSON: fast); the roofline mode builds the model after the first line, and
    # knows no node (0 slots: one replica per node), so every layout check is done before that line
    profiles = _profiles(a, P) if a.profile else None
    slots = profiles[0].replica_slots if profiles else 0
    layout = node_layout(P, a.nodes, a.ranks_per_node, slots)
    a.nodes = layout.nodes               # what the scenarios model
    if a.network_alg == "hierarchical" and layout.nodes == 1:
        raise ConfigError(f"--network_alg hierarchical needs more than one node ({layout.describe(slots)})")
    given = a.ranks_per_node is not None
    sizes = _sweep_sizes(a, layout.ranks_per_node if (given or a.nodes_given) else 1)
    check_memory(max([P, *sizes]))
    layouts = sweep_layouts(sizes, layout, a.nodes_given, given, a.global_batch_size, slots)
    model_name = a.model_name or profiles[0].model
    if a.cost is not None and a.cost.model_name != model_name:
        a.cost.check_model(model_name, 0)
    talk.say(f"pydtnn-simulate: {P} replica(s) of {model_name}, global batch {a.global_batch_size}, {a.steps} "
             f"steps, policy {policy}"
             + (f", gradients sent in {a.grad_compression} (2 bytes an element, plus the casts)"
                if a.grad_compression != "none" else ""))
    if profiles is None:
        with talk.phase("setting up: the model's layers"):
            profiles = _profiles(a, P)
    if a.cost is not None:
        a.cost.check_model(model_name, profiles[0].gradient_bytes)
    points = _step_points(a, profiles[0])
    check_memory(max([P, *sizes]), points)
    where = "--profile " + a.profile.split(",")[0].rsplit(":", 1)[0] if a.profile else "the roofline profile"
    if a.profile is None:
        a.inter = links.Link(profiles[0].network_inter, profiles[0].network_inter_source)
    else:
        a.inter = links.between_nodes(profiles[0], where, a.network_bw, a.network_lat)
    intra = links.inside_node(profiles[0], where, layout.ranks_per_node)
    a.device_list, a.cost_index, device_words = None, None, None
    if a.cost is not None:
        a.cost_index, a.device_list, device_words = a.cost.assign(P, spec)
    elif spec is not None:
        a.device_list, device_words = spec.kinds(P), spec.describe(P)
    modelled = {"layout": layout.describe(slots), "nodes": layout.nodes, "ranks_per_node": layout.ranks_per_node,
                "network": {"inside_node": intra.to_json(),
                            "between_nodes": dict(a.inter.to_json(), used=layout.nodes > 1)}}
    talk.say(f"modelled: {modelled['layout']}")
    talk.say(f"network inside a node: {intra.describe()}")
    talk.say(f"network between nodes: {a.inter.describe()}"
             + ("" if layout.nodes > 1 else " (not used: one node)"))
    if device_words:
        modelled["devices"] = {k: a.device_list.count(k) for k in ("cpu", "gpu")}
        talk.say(f"devices: {device_words}")
    if a.cost is not None:
        modelled["cost_model"] = {"path": a.cost.path, "model": a.cost.model_name,
                                  "gradient_bytes": a.cost.gradient_bytes, "measured_on": a.cost.measured_on}
        talk.say(f"compute t_i(b): {a.cost.describe()}")
    with talk.phase(f"estimating: the same run at fewer replicas, to say how long {P} take"):
        say_how_long(P, lambda p: _run_at(a, p, policy, profiles, layout, slots),
                     f"estimate for {P} replicas (the run and its best partition)", talk.say, points)
    with talk.phase(f"simulating {P} replicas", total=a.steps) as steps:
        sc = _scenario(a, P, policy, profiles, a.speed_factors, a.device_list, a.cost_index)
        result = simulate(sc, steps)
    with talk.phase(f"the best partition of {P} replicas (a cost model of each kind of replica, then the split)"):
        best = best_partition(_scenario(a, P, "equal", profiles, a.speed_factors, a.device_list, a.cost_index))
    sweep = None
    if sizes:
        sweep = {}
        for pol in dict.fromkeys(SWEEP_POLICIES + (policy,)):
            rows = []
            for at in layouts:
                p = at.replicas
                a.nodes = at.nodes
                s = _scenario_at(a, p, pol, profiles)
                with talk.phase(f"sweep: {pol}, {p} replicas", total=a.steps) as steps:
                    res = simulate(s, steps)
                rows.append((p, res.step_seconds, res.epoch_seconds, report.scaling_efficiency(res), at.nodes))
            sweep[pol] = rows
        a.nodes = layout.nodes
        if a.plot:
            report.plot_sweep(sweep, a.plot, f"{model_name}, B={a.global_batch_size}")
    if sweep:
        modelled["sweep_layout"] = _sweep_words(a, layouts)
    with talk.phase("writing the results"):
        if a.json:
            print(json.dumps(dict(report.to_json(result, best, sweep), **modelled)))
            return
        print(report.summary_text(result, best))
        if sweep:
            print()
            print(f"sweep: {modelled['sweep_layout']}")
            print(report.sweep_table(sweep))
            if a.plot:
                print(f"plot written to {a.plot}")


def _step_points(a, profile) -> int:
    """The points of a step's timeline (its end, each sync-BN barrier, each bucket): the memory it takes."""
    points = 1
    if a.sync_batchnorm:
        points += 2 * int((profile.bn_channels > 0).sum())
    if a.non_blocking_mpi:
        points += -(-profile.gradient_bytes // a.bucket_bytes)
    return points


def _scenario_at(a, p, policy, profiles):
    """The scenario of `p` replicas (a sweep point, a timing run) with the full cluster's mix: replica i takes
    the profile, speed factor, speed, device and cost model entry of replica floor(i x P / p) (`layout.mix`)."""
    from pydtnn.sim.layout import mix
    index = None if a.cost_index is None else a.cost_index[np.arange(p) * len(a.cost_index) // p]
    s = _scenario(a, p, policy, mix(profiles, p), mix(a.speed_factors, p), mix(a.device_list, p), index)
    s.replica_speeds = mix(a.replica_speeds, p)
    return s


def _run_at(a, p, policy, profiles, layout, slots):
    """The run of `_run` at about `p` replicas, on nodes of as many ranks as the full run's (a multiple of them),
    the cluster's mix kept and the global batch scaled, to time it; returns the replicas it ran (None when
    that many cannot be laid out)."""
    from pydtnn.sim.engine import best_partition, simulate
    k = layout.ranks_per_node
    p = max(k, p // k * k)
    nodes = a.nodes
    try:
        a.nodes = p // k
        for pol, run in ((policy, simulate), ("equal", best_partition)):
            s = _scenario_at(a, p, pol, profiles)
            s.global_batch = max(p, a.global_batch_size * p // a.replicas)
            run(s)
        return p
    except ConfigError:
        return None
    finally:
        a.nodes = nodes


def _sweep_words(a, layouts) -> str:
    """What each point of the sweep models, in one sentence."""
    k = {at.ranks_per_node for at in layouts}
    nodes = (f"{k.pop()} rank(s) per node, the nodes growing with P" if len(k) == 1 else
             "each P on nodes of the default ranks per node (the nodes column)")
    kept = [f for f, v in (("--speed_factors", a.speed_factors), ("--replica_speeds", a.replica_speeds),
                           ("--profile", a.profile and "," in a.profile)) if v]
    mixed = (f"; replica i of P takes {' and '.join(kept)} of replica floor(i x {a.replicas} / P), the cluster's "
             f"mix at every size" if kept else "")
    return nodes + mixed


def _export(a):
    """`cost_model`: a run's cost model (its checkpoint's) as the JSON `run --cost_model` reads."""
    from pydtnn.outputs import check_output_file
    from pydtnn.sim.cost_file import from_checkpoint, write_cost_file
    from pydtnn.sim.devices import KINDS
    check_output_file(a.out, "--out")
    devices = None
    if a.devices is not None:
        devices = [d.strip().lower() for d in a.devices.split(",")]
        if any(d not in KINDS for d in devices):
            raise ConfigError(f"--devices {a.devices}: one of {' or '.join(KINDS)} per replica")
    cost = from_checkpoint(a.checkpoint)
    write_cost_file(cost, a.out, devices, a.measured_on)
    print(f"cost model of {cost.model_name} ({len(cost.model)} replica(s), {cost.gradient_bytes} gradient bytes) "
          f"written to {a.out}")
    for line in cost.model.describe():
        print(f"  {line}")


def main(argv=None) -> int:
    try:
        a = build_parser().parse_args(argv)
        a.nodes_given = getattr(a, "nodes", None) is not None
        {"calibrate": _calibrate, "run": _run, "cost_model": _export}[a.command](a)
        sys.stdout.flush()                  # inside the try: a closed pipe fails here, not at exit
    except PyDTNNError as e:
        print(f"pydtnn: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader went away (`... | head`): no traceback; stdout now points nowhere, so that Python's
        # own flush at exit cannot fail a second time
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
