"""pydtnn-simulate: predict a cluster before booking it.

    pydtnn-simulate calibrate --model resnet20_cifar10 --out p.json          # measures this machine (~60 s)
    pydtnn-simulate calibrate --model resnet20_cifar10 --trace trace.json --out p.json
    pydtnn-simulate calibrate --model resnet20_cifar10 --roofline --cpu_speed 2e12 --out p.json
    pydtnn-simulate run --profile p.json --model resnet20_cifar10 --global_batch_size 4096 --replicas 1024 \\
        --balance dynamic --noise 0.05 --stragglers 8:2.0 --steps 1000 --json
"""
from __future__ import annotations

import json
import os
import sys

from pydtnn.launch.flags import (OneLineParser, boolean, float_list, nonneg_float, policy_options, positive_int,
                                 positive_int_list)
from pydtnn.errors import ConfigError, PyDTNNError

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
    _roofline_flags(c)

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
    r.add_argument("--devices", default=None, help="cpu/gpu per replica (what a policy is told; fpm buckets GPUs)")
    r.add_argument("--cost_model", default=None,
                   help="each replica's compute t_i(b) from a run's cost model: the JSON a probe's model was saved "
                        "as, or a checkpoint of a run whose policy kept one (fpm, dynamic); replica i uses the "
                        "model's replica i mod its count")
    r.add_argument("--replica_speeds", type=float_list, default=None, help="static: split proportional to these")
    r.add_argument("--speed_factors", type=float_list, default=None,
                   help="F1,...,FP relative replica speeds, the launcher's --emulate_speeds meaning")
    r.add_argument("--rebalance_interval", type=positive_int, default=20)
    r.add_argument("--non_blocking_mpi", type=boolean, default=False)
    r.add_argument("--sync_batchnorm", type=boolean, default=False)
    r.add_argument("--bucket_bytes", type=positive_int, default=1 << 20)
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
    r.add_argument("--json", action="store_true", help="print one JSON document instead of the text")
    _roofline_flags(r)
    return p


def _roofline_flags(p):
    g = p.add_argument_group("roofline (upstream PyDTNN's performance-model flags, upstream's meaning)")
    g.add_argument("--cpu_speed", type=float, default=4e12, help="FLOP/s")
    g.add_argument("--memory_bw", type=float, default=50e9, help="B/s")
    g.add_argument("--network_bw", type=float, default=1e9, help="bits/s")
    g.add_argument("--network_lat", type=float, default=0.5e-6, help="s")
    g.add_argument("--network_alg", default="auto",
                   help="auto (MPICH's choice), ring, rabenseifner, recursive_doubling, binomial, hierarchical; "
                        "upstream's vdg = rabenseifner, bta = binomial")


def _roofline_kw(a):
    return dict(cpu_speed=a.cpu_speed, memory_bw=a.memory_bw, network_bw=a.network_bw, network_lat=a.network_lat)


def _calibrate(a):
    from pydtnn.outputs import check_output_file
    from pydtnn.sim import calibrate, roofline, trace_profile
    check_output_file(a.out, "--out")          # before the measurement, not after it
    if a.trace:
        prof = trace_profile.trace_profile(a.trace, a.model_name, a.trace_sizes, a.trace_rank, a.dtype)
    elif a.roofline:
        prof = roofline.roofline_profile(a.model_name, dtype=a.dtype, **_roofline_kw(a))
    else:
        prof = calibrate.calibrate(a.model_name, a.batch_points, layer_seconds=a.seconds * 0.4,
                                   network_seconds=a.seconds * 0.2, nprocs=a.mpi_processes, measure_net=a.network,
                                   dtype=a.dtype, overhead=a.overhead, contention=a.contention,
                                   contention_seconds=a.seconds * 0.2, threads=a.threads_per_replica,
                                   log=lambda m: print(m, file=sys.stderr, flush=True))
    prof.save(a.out)
    print(f"profile of {a.model_name} ({prof.source}) written to {a.out}: {prof.compute_seconds([prof.batch_points[-1]])[0] * 1e3:.3f} "
          f"ms per step at b={prof.batch_points[-1]}, alpha={prof.network.alpha:.3g} s, beta={prof.network.beta:.3g} "
          f"s/B, gamma={prof.network.gamma:.3g} s/B")


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


def _scenario(a, P, policy, profiles, speed_factors):
    from pydtnn.sim.engine import Scenario
    from pydtnn.sim.variability import parse_stragglers
    stragglers = parse_stragglers(a.stragglers)
    if stragglers is not None and stragglers.count > P:
        stragglers = type(stragglers)(P, stragglers.factor, stragglers.period)
    samples = a.samples or SAMPLES.get(a.dataset_name or "cifar10")
    devices = None
    if a.devices:
        kinds = [d.strip().lower() for d in a.devices.split(",")]
        if any(d not in ("cpu", "gpu") for d in kinds):
            raise ConfigError(f"--devices needs cpu or gpu per replica, got {a.devices!r}")
        devices = [kinds[i % len(kinds)] for i in range(P)]
    return Scenario(profiles=profiles, global_batch=a.global_batch_size, policy=policy,
                    replica_speeds=a.replica_speeds, speed_factors=speed_factors, non_blocking=a.non_blocking_mpi,
                    sync_bn=a.sync_batchnorm, algorithm=a.network_alg, nodes=a.nodes, noise=a.noise,
                    stragglers=stragglers, steps=a.steps, steps_per_epoch=a.steps_per_epoch, samples=samples,
                    rebalance_interval=a.rebalance_interval, bucket_bytes=a.bucket_bytes, seed=a.seed,
                    balance_options=a.balance_options if policy == {"none": "equal"}.get(a.balance, a.balance) else None,
                    devices=devices, cost_model=_cost_model(a))


def _cost_model(a):
    """--cost_model: a CostModel JSON, or a checkpoint whose policy state holds one."""
    from pydtnn.parallel.balance.cost_model import CostModel
    if not a.cost_model:
        return None
    if not a.cost_model.endswith(".npz"):
        return CostModel.load(a.cost_model)
    from pydtnn.training.checkpointing import read_meta
    meta = read_meta(a.cost_model)
    for key in ("balancer", "balance_policy_state"):
        state = meta.get(key)
        if isinstance(state, dict) and state.get("model"):
            return CostModel.from_state(state["model"], f"--cost_model {a.cost_model}")
    raise ConfigError(f"--cost_model {a.cost_model}: the checkpoint's balance policy kept no cost model "
                      f"(run with --balance fpm or dynamic)")


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


def _run(a):
    from pydtnn.outputs import check_output_file
    from pydtnn.sim import report
    from pydtnn.sim.budget import check_memory, progress_for, say_how_long
    from pydtnn.sim.engine import best_partition, simulate
    from pydtnn.sim.layout import node_layout, sweep_layouts
    P = a.replicas
    if a.steps_per_epoch < 0:
        raise ConfigError("--steps_per_epoch must be >= 0")
    if a.replica_speeds and len(a.replica_speeds) != P:
        raise ConfigError(f"--replica_speeds has {len(a.replica_speeds)} values for {P} replicas")
    if a.plot is not None:               # before any work: the plot comes last
        if a.sweep == "none":
            raise ConfigError("--plot draws the sweep: give --sweep auto or --sweep P1,P2,...")
        check_output_file(a.plot, "--plot")
    check_memory(P)                        # before anything of that size is allocated (the sweep's: below)
    profiles = _profiles(a, P)
    slots = profiles[0].replica_slots
    layout = node_layout(P, a.nodes, a.ranks_per_node, slots)
    a.nodes = layout.nodes               # what the scenarios model
    if a.network_alg == "hierarchical" and layout.nodes == 1:
        raise ConfigError(f"--network_alg hierarchical needs more than one node ({layout.describe(slots)})")
    given = a.ranks_per_node is not None
    sizes = _sweep_sizes(a, layout.ranks_per_node if (given or a.nodes_given) else 1)
    check_memory(max([P, *sizes]))
    layouts = sweep_layouts(sizes, layout, a.nodes_given, given, a.global_batch_size, slots)
    policy = {"none": "equal"}.get(a.balance, a.balance)
    say_how_long(P, lambda p: _run_at(a, p, policy, profiles, layout, slots),
                 f"simulating {P} replicas (the run and its best partition)")
    sc = _scenario(a, P, policy, profiles, a.speed_factors)
    result = simulate(sc, progress_for(P, a.steps, f"simulating {P} replicas"))
    best = best_partition(_scenario(a, P, "equal", profiles, a.speed_factors))
    sweep = None
    if sizes:
        sweep = {}
        for pol in dict.fromkeys(SWEEP_POLICIES + (policy,)):
            rows = []
            for at in layouts:
                p = at.replicas
                a.nodes = at.nodes
                s = _scenario_at(a, p, pol, profiles)
                res = simulate(s, progress_for(p, a.steps, f"sweep: {pol}, {p} replicas"))
                rows.append((p, res.step_seconds, res.epoch_seconds, report.scaling_efficiency(res), at.nodes))
            sweep[pol] = rows
        a.nodes = layout.nodes
        if a.plot:
            report.plot_sweep(sweep, a.plot, f"{a.model_name or profiles[0].model}, B={a.global_batch_size}")
    modelled = {"layout": layout.describe(slots), "nodes": layout.nodes, "ranks_per_node": layout.ranks_per_node}
    if sweep:
        modelled["sweep_layout"] = _sweep_words(a, layouts)
    if a.json:
        print(json.dumps(dict(report.to_json(result, best, sweep), **modelled)))
        return
    print(f"modelled: {modelled['layout']}")
    print(report.summary_text(result, best))
    if sweep:
        print()
        print(f"sweep: {modelled['sweep_layout']}")
        print(report.sweep_table(sweep))
        if a.plot:
            print(f"plot written to {a.plot}")


def _scenario_at(a, p, policy, profiles):
    """The scenario of `p` replicas (a sweep point, a timing run) with the full cluster's mix: replica i takes
    the profile, speed factor and speed of replica floor(i x P / p) (`layout.mix`)."""
    from pydtnn.sim.layout import mix
    s = _scenario(a, p, policy, mix(profiles, p), mix(a.speed_factors, p))
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


def main(argv=None) -> int:
    try:
        a = build_parser().parse_args(argv)
        a.nodes_given = getattr(a, "nodes", None) is not None
        (_calibrate if a.command == "calibrate" else _run)(a)
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
