"""Measure a profile on the machine at hand: every layer's forward and backward time at a few local
batch sizes (the functional model), the optimizer step, the MPI's alpha, beta, gamma, and how much
several ranks on this node slow each other (contention; with more ranks than cores, the network again).

Per-layer times come from timing each top-level layer's ``forward_internal`` / ``backward_internal``
inside the trainer's own ``Model.compute_gradients`` (so the fused softmax + loss and the layout
conversions are in); what those timers miss (the loss) is added to the last layer's forward, so the
layers sum to the measured step. Each point is the mean of repeated passes over a few distinct batches.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel.runtime.threads import THREAD_VARS, usable_cores
from pydtnn.sim import model_table, network_fit
from pydtnn.sim.profile import Network, Profile

__all__ = ["measure_layers", "measure_network", "measure_contention", "contention_points", "calibrate"]

DEFAULT_BATCH_POINTS = (1, 8, 32, 128)
_THREAD_VARS = (*THREAD_VARS, "NUMBA_NUM_THREADS")


def _threads_env(n: int) -> dict:
    return dict(os.environ, **{k: str(int(n)) for k in _THREAD_VARS})


class _LayerClock:
    """Wraps each top-level layer's forward/backward with a timer (instance attributes: the class and
    every other model stay untouched)."""

    def __init__(self, model):
        self.fwd = np.zeros(len(model.layers))
        self.bwd = np.zeros(len(model.layers))
        sync = model.backend.synchronize
        for i, layer in enumerate(model.layers):
            for kind, acc in (("forward_internal", self.fwd), ("backward_internal", self.bwd)):
                orig = getattr(layer, kind)

                def timed(*a, _orig=orig, _acc=acc, _i=i, **k):
                    t0 = time.perf_counter()
                    out = _orig(*a, **k)
                    sync()
                    _acc[_i] += time.perf_counter() - t0
                    return out
                setattr(layer, kind, timed)

    def reset(self):
        self.fwd[:] = 0.0
        self.bwd[:] = 0.0


def measure_layers(model, batch_points=DEFAULT_BATCH_POINTS, seconds=30.0, loss="categorical_cross_entropy"):
    """(forward (L, K), backward (L, K), update seconds) of ``model`` at each batch point."""
    from pydtnn.optimizers import get_optimizer
    rng = np.random.default_rng(0)
    clock = _LayerClock(model)
    L, K = len(model.layers), len(batch_points)
    fwd, bwd = np.zeros((L, K)), np.zeros((L, K))
    per_point = seconds / K
    for k, b in enumerate(batch_points):
        # a few distinct batches in turn: the launcher's every step brings fresh data into the caches
        batches = [model_table.random_batch(model, b, rng) for _ in range(4)]
        xs, y = [x for x, _ in batches], batches[0][1]
        runs_f, runs_b, t_start = [], [], time.perf_counter()
        model.compute_gradients(xs[0], y, loss)      # warm-up: allocations, compiled kernels
        while len(runs_f) < 4 or (time.perf_counter() - t_start < per_point and len(runs_f) < 200):
            clock.reset()
            t0 = time.perf_counter()
            model.compute_gradients(xs[len(runs_f) % len(xs)], y, loss)
            model.backend.synchronize()
            total = time.perf_counter() - t0
            f, bk = clock.fwd.copy(), clock.bwd.copy()
            f[-1] += max(0.0, total - f.sum() - bk.sum())          # the loss and what the timers missed
            runs_f.append(f)
            runs_b.append(bk)
        # the mean, not the median: an epoch is a sum of steps, so its time is the steps' mean times
        # their number, slow steps (interrupts, the collector, page faults) included
        fwd[:, k] = np.mean(runs_f, axis=0)
        bwd[:, k] = np.mean(runs_b, axis=0)
    opt = get_optimizer("sgd", learning_rate=0.01, momentum=0.9)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        opt.step(model.params, model.grads)
        times.append(time.perf_counter() - t0)
    return fwd, bwd, float(np.mean(times[2:]))


def measure_network(nprocs=2, seconds=20.0, timeout=120.0) -> dict:
    """Run the ping-pong and Allreduce sweeps under mpiexec; returns the probe's JSON."""
    from pydtnn.parallel.runtime import mpirun
    probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "network_probe.py")
    cmd = mpirun.mpi_command(nprocs, probe, [str(seconds)])
    env = _threads_env(1)
    out = _run(cmd, timeout, env, f"the network probe ({nprocs} processes)")
    return json.loads(out.stdout.strip().splitlines()[-1])


def contention_points(slots: int) -> list:
    """Process counts the contention probe runs at: 1, 2, 4, ... up to the node's replica slots (cores /
    threads per replica), the slots, and one more (the first oversubscribed count)."""
    ks = {1, slots, slots + 1}
    k = 2
    while k < slots:
        ks.add(k)
        k *= 2
    return sorted(ks)


def measure_contention(model_name, batch, points, seconds=12.0, timeout=300.0, threads=1, rounds=2,
                       probe=None) -> dict:
    """{k: slowdown} of the model's synchronized compute step with k processes on this node against one
    (`contention_probe.py` under mpiexec at each k), in alternating rounds (1, 2, ..., 1, 2, ...): this
    machine's speed drifts over a minute, so each round's k is divided by the same round's one process,
    and the factor is the median over rounds. ``probe(k, budget) -> step seconds`` replaces the mpiexec
    run (tests)."""
    from statistics import median
    if probe is None:
        from pydtnn.parallel.runtime import mpirun
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "contention_probe.py")
        env = _threads_env(threads)

        def probe(k, budget):
            cmd = mpirun.mpi_command(k, script, [model_name, str(batch), f"{budget:.3f}"])
            out = _run(cmd, timeout, env, f"the contention probe ({k} processes)")
            return json.loads(out.stdout.strip().splitlines()[-1])["step_s"]
    budget = seconds / (rounds * len(points))
    ratios = {k: [] for k in points}
    for _ in range(rounds):
        step = {k: probe(k, budget) for k in points}
        for k in points:
            ratios[k].append(step[k] / step[points[0]])
    return {k: float(median(r)) for k, r in ratios.items()}


def _run(cmd, timeout, env, what):
    """Run a measuring job; a time-out or a failure is one line naming `what`."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what} did not finish in {timeout:.0f} s") from None
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"{what} failed (exit {out.returncode}): {tail[0]}")
    return out


def measure_step_overhead(model_name, batches=(8, 64), steps=20, dataset=None, timeout=300.0, threads=1):
    """The launcher's own per-step cost outside forward, backward and the reduction (taking the batch,
    targets, metrics, the per-step stats, the optimizer): one-rank launcher runs with --tracing, the
    mean step period (from one step's first layer event to the next's) minus the mean compute (its layer
    events, `trace_profile.step_computes`), at two
    local batches. Returns (o0, o1): overhead = o0 + o1 * b seconds per step."""
    from pydtnn.parallel.runtime import mpirun
    from pydtnn.sim.trace_profile import step_computes
    launcher = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                            "scripts", "pydtnn_benchmark.py")
    if not os.path.isfile(launcher):
        raise ConfigError(f"no launcher at {launcher} (run calibrate from a source checkout, or --overhead false)")
    env = _threads_env(threads)
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for b in batches:
            trace = os.path.join(tmp, f"trace{b}.json")
            cmd = mpirun.mpi_command(1, launcher, [])
            cmd += ["--model", model_name, "--dataset", "synthetic", "--synthetic_samples", str(b * steps),
                    "--parallel", "data", "--global_batch_size", str(b), "--steps_per_epoch", str(steps),
                    "--num_epochs", "1", "--threads_per_replica", str(threads), "--lr_schedulers", "", "--progress_bar",
                    "false", "--tracing", "true", "--tracer_output", trace, "--trace_steps", f"1:{steps}",
                    "--seed", "0"]
            _run(cmd, timeout, env, "the launcher run of the overhead probe")
            with open(trace) as f:
                events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
            starts, durs = (np.array(v) for v in zip(*step_computes(events)))
            period = np.mean(np.diff(starts[1:]))                 # the first step pays for warm-up
            points.append((b, max(0.0, float(period - np.mean(durs[1:-1])))))
    (b0, t0), (b1, t1) = points
    slope = max(0.0, (t1 - t0) / (b1 - b0))
    return max(0.0, t0 - slope * b0), slope


def calibrate(model_name, batch_points=DEFAULT_BATCH_POINTS, layer_seconds=30.0, network_seconds=20.0,
              nprocs=2, measure_net=True, dtype="float32", log=print, overhead=True, contention=True,
              contention_seconds=12.0, threads=1) -> Profile:
    """The profile of one replica running ``threads`` threads (the launcher's --threads_per_replica)."""
    from threadpoolctl import threadpool_limits
    cores = len(usable_cores())
    slots = max(1, cores // threads)              # replicas this node holds before they outnumber its cores
    model = model_table.build(model_name, dtype=dtype)
    info = model_table.describe(model)
    log(f"calibrate: {model_name}, {len(info)} layers, batch points {list(batch_points)} (~{layer_seconds:.0f} s)")
    with threadpool_limits(threads):
        fwd, bwd, update = measure_layers(model, batch_points, layer_seconds)
    extra = {}
    over = None
    if measure_net:
        counts = [nprocs] + ([slots + 1] if contention and slots + 1 != nprocs else [])
        nets = []
        for n in counts:
            log(f"calibrate: ping-pong and Allreduce sweeps 4 KB .. 64 MB on {n} processes "
                f"(~{network_seconds / len(counts):.0f} s)")
            sweep = measure_network(n, network_seconds / len(counts))
            nets.append(network_fit.fit(sweep["sizes"], sweep["pingpong_s"], sweep["allreduce_s"], sweep["processes"]))
            extra["network_sweep" if n == nprocs else "network_sweep_oversubscribed"] = sweep
        net = nets[0]
        over = nets[1] if len(nets) > 1 else None              # counts[1] is slots + 1: oversubscribed
        net_words = (f"measured by calibrate: MPI ping-pong and Allreduce sweeps on {nprocs} processes of "
                     f"{platform.node()}, {time.strftime('%Y-%m-%d')}")
    else:
        net = Network(0.0, 0.0, 0.0)
        net_words = "not measured (calibrate --network false): alpha = beta = gamma = 0"
    factors = {}
    if contention:
        batch = min(batch_points, key=lambda b: abs(b - 32))
        points = contention_points(slots)
        log(f"calibrate: contention of {points} processes x {threads} thread(s) on this node's {cores} cores, b={batch} "
            f"(~{contention_seconds:.0f} s)")
        factors = measure_contention(model_name, batch, points, contention_seconds, threads=threads)
    if overhead:
        log("calibrate: the launcher's per-step overhead (two one-rank launcher runs with --tracing)")
        o0, o1 = measure_step_overhead(model_name, threads=threads)
        step_overhead = (max(0.0, o0 - update), o1)        # the launcher's step period holds the update too
    else:
        step_overhead = (0.0, 0.0)
    return Profile(model=model_name, batch_points=list(batch_points), layer_names=[r.name for r in info],
                   layer_types=[r.type for r in info], param_bytes=np.array([r.param_bytes for r in info]),
                   bn_channels=np.array([r.bn_channels for r in info]), forward_s=fwd, backward_s=bwd,
                   network=net, update_s=update, step_overhead_s=step_overhead, dtype_bytes=model.dtype.itemsize,
                   source="measured", device=f"{platform.machine()} cpu, {cores} cores, {platform.node()}",
                   cores=cores, threads_per_replica=int(threads), contention=factors,
                   network_oversubscribed=over, network_source=net_words, extra=extra)


if __name__ == "__main__":      # pragma: no cover - manual use
    calibrate(sys.argv[1]).save(sys.argv[2])
