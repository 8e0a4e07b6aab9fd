#!/usr/bin/env python
"""Validate pydtnn-simulate against real launcher jobs on this machine: predicted against measured.

    python scripts/experiments/validate_sim.py --quick            # ~5 min: 3 models, 1-3 ranks, one round
    python scripts/experiments/validate_sim.py --rounds 3         # the full table (run it on a quiet machine)

1. Calibrate each model here (``pydtnn-simulate calibrate`` in a subprocess, one BLAS/Numba thread,
   as every launcher rank below gets ``--threads_per_replica 1``), at the start of every round: this
   machine's speed drifts by 20-40% over minutes when nothing else runs on it (a VM on a shared host),
   so a profile is compared with the measurements of its own round (``--calibrate_once``: one profile).
2. Run the cases, alternately: every round runs every case once, in the same order, so a load that
   drifts hits all cases alike. A case is the real launcher (``mpiexec -n P scripts/pydtnn_benchmark.py``)
   on synthetic data for ``--epochs`` epochs of ``--steps`` steps; its measured time is the median of
   the epochs after the first (the first pays for warm-up, the emulation's calibration, kernel compiles).
3. Predict each case with the simulator (the same split policy, speeds, overlap, steps) from that
   round's profile and print predicted against measured: per case the medians over rounds, the spread
   (max - min) / median of the measurements, and the median over rounds of each round's error.
4. Partition check (2 ranks, emulated 1 : 0.5): measure several static splits; the simulator's best
   partition, as measured, must be within 5% of the best measured one. Policy check: equal, static and
   dynamic in the measured order.

Writes the markdown table to ``--out`` (docs/simulation.md embeds it) with the machine's load.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "scripts" / "pydtnn_benchmark.py"
ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")}


@dataclass
class Case:
    model: str
    ranks: int
    batch: int
    non_blocking: bool = False
    balance: str = "none"                       # none | static | dynamic
    emulate: list | None = None
    speeds: list | None = None                  # static: --replica_speeds
    measured: list = field(default_factory=list)
    predicted: list = field(default_factory=list)          # one per round (that round's profile)

    @property
    def label(self) -> str:
        parts = [self.model, f"P={self.ranks}", f"B={self.batch}", "overlap" if self.non_blocking else "blocking",
                 {"none": "equal"}.get(self.balance, self.balance)]
        if self.emulate:
            parts.append("emulate " + ":".join(f"{x:g}" for x in self.emulate))
        if self.speeds:
            parts.append("split " + ":".join(f"{x:g}" for x in self.speeds))
        return ", ".join(parts)


def load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def cases(quick: bool) -> list[Case]:
    models = ["simplemlp", "simplecnn", "vgg1"] if quick else ["simplemlp", "simplecnn", "vgg1", "resnet20_cifar10"]
    batches = [32, 64, 128]
    out = []
    for model, batch in itertools.product(models, batches):
        out.append(Case(model, 1, batch))
        out.append(Case(model, 2, batch))
    for model in models:                       # 3 ranks, overlap, emulated heterogeneity
        out.append(Case(model, 3, 96))
        out.append(Case(model, 2, 64, non_blocking=True))
        out.append(Case(model, 2, 64, emulate=[1, 0.5]))
        out.append(Case(model, 2, 64, balance="static", emulate=[1, 0.5], speeds=[1, 0.5]))
        out.append(Case(model, 3, 96, balance="static", emulate=[1, 1, 0.5], speeds=[1, 1, 0.5]))
    if quick:                                  # fewer, but every kind of case is still there
        out = [c for c in out if not (c.ranks == 1 and c.batch == 64) and not (c.ranks == 2 and c.batch == 32
                                                                                  and not c.emulate)]
    return out


def partition_cases(model: str) -> list[Case]:
    """2 ranks at 1 : 0.5, B = 64: splits from equal to beyond proportional, plus the dynamic policy."""
    splits = [[1, 1], [1, 0.75], [1, 0.5], [1, 0.35]]
    return ([Case(model, 2, 64, balance="static", emulate=[1, 0.5], speeds=s) for s in splits]
            + [Case(model, 2, 64, balance="dynamic", emulate=[1, 0.5])])


def launcher_cmd(c: Case, args, history: Path) -> list[str]:
    from pydtnn.parallel.runtime.mpirun import mpi_command
    cmd = mpi_command(c.ranks, str(LAUNCHER), [])
    cmd += ["--model", c.model, "--dataset", "synthetic", "--synthetic_samples", str(c.batch * args.steps),
            "--parallel", "data", "--global_batch_size", str(c.batch), "--steps_per_epoch", str(args.steps),
            "--num_epochs", str(args.epochs), "--threads_per_replica", "1", "--lr_schedulers", "",
            "--progress_bar", "false", "--history_file", str(history), "--balance", c.balance,
            "--non_blocking_mpi", "true" if c.non_blocking else "false", "--seed", "0"]
    if c.emulate:
        cmd += ["--emulate_speeds", ",".join(f"{x:g}" for x in c.emulate)]
    if c.speeds:
        cmd += ["--replica_speeds", ",".join(f"{x:g}" for x in c.speeds)]
    if c.balance == "dynamic":
        cmd += ["--rebalance_interval", str(args.rebalance_interval)]
    return cmd


def measure(c: Case, args, tmp: Path) -> float:
    history = tmp / "history.json"
    if history.exists():
        history.unlink()
    env = dict(os.environ, **ONE_THREAD, PYTHONPATH=str(REPO))
    out = subprocess.run(launcher_cmd(c, args, history), capture_output=True, text=True, env=env, cwd=str(REPO),
                         timeout=args.timeout)
    if out.returncode != 0:
        sys.exit(f"validate_sim: launcher failed on {c.label}:\n{(out.stderr or out.stdout)[-2000:]}")
    rows = json.loads(history.read_text())
    return float(np.median([r["time_s"] for r in rows[1:]]))


def calibrate(model: str, args, tmp: Path, tag: str = ""):
    from pydtnn.sim.profile import load_profile
    where = Path(args.keep_profiles) if args.keep_profiles else tmp
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{model}{tag}.json"
    env = dict(os.environ, **ONE_THREAD, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "pydtnn.sim", "calibrate", "--model", model, "--batch_points", "1,8,32,64,128",
           "--seconds", str(args.calibrate_seconds), "--out", str(path)]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(REPO), timeout=600)
    if out.returncode != 0:
        sys.exit(f"validate_sim: calibration of {model} failed: {(out.stderr or out.stdout)[-1000:]}")
    print(f"calibrated {model} in {time.monotonic() - t0:.0f} s (load {load()})", flush=True)
    return load_profile(str(path))


def predict(c: Case, profile, args) -> float:
    from pydtnn.sim.engine import Scenario, simulate
    policy = {"none": "equal"}.get(c.balance, c.balance)
    sc = Scenario([profile] * c.ranks, c.batch, policy=policy, replica_speeds=c.speeds, speed_factors=c.emulate,
                  non_blocking=c.non_blocking, steps=args.steps * args.epochs, steps_per_epoch=args.steps,
                  rebalance_interval=args.rebalance_interval)
    res = simulate(sc)
    return float(np.mean(res.step_times[args.steps:]) * args.steps)      # the epochs after the first


def best_predicted_split(model, profile, args):
    from pydtnn.sim.engine import Scenario, best_partition
    sizes, _ = best_partition(Scenario([profile] * 2, 64, speed_factors=[1, 0.5], steps=args.steps))
    return sizes


def papers(args):
    """The seed papers' claims at 8 .. 1,024 simulated replicas (roofline profile: no measurement).

    ResNet-20 on CIFAR-10 shapes, local batch 32 per replica on average (B = 32 P), devices of 1 TFLOP/s
    and 20 GB/s, a 10 Gb/s network with 5 us latency, ring allreduce, 200 steps, noise sigma 0.05.
    (a) heterogeneous: a quarter of the replicas at half speed (--speed_factors): equal vs proportional
        (static, --replica_speeds = the true speeds) vs the homogeneous cluster;
    (b) transient stragglers: P/8 replicas 3x slower for 20 steps at a time, fresh ones each window:
        static (proportional to the nominal, equal speeds) vs dynamic (re-split every 5 steps)."""
    from pydtnn.sim.engine import Scenario, simulate
    from pydtnn.sim.roofline import roofline_profile
    from pydtnn.sim.variability import Stragglers
    prof = roofline_profile("resnet20_cifar10", cpu_speed=1e12, memory_bw=20e9, network_bw=10e9, network_lat=5e-6)
    rows = ["| P | homogeneous ms | equal ms | proportional ms | loss recovered | stragglers: static ms | "
            "dynamic ms | dynamic / static |", "|---|---|---|---|---|---|---|---|"]
    for P in (8, 32, 128, 512, 1024):
        f = [0.5 if i % 4 == 0 else 1.0 for i in range(P)]
        common = dict(global_batch=32 * P, algorithm="ring", noise=0.05, steps=200, seed=1)
        homo = simulate(Scenario([prof] * P, **common)).step_seconds
        eq = simulate(Scenario([prof] * P, speed_factors=f, **common)).step_seconds
        prop = simulate(Scenario([prof] * P, speed_factors=f, policy="static", replica_speeds=f, **common)).step_seconds
        strag = Stragglers(P // 8, 3.0, 20)
        st = simulate(Scenario([prof] * P, stragglers=strag, **common)).step_seconds
        dy = simulate(Scenario([prof] * P, stragglers=strag, policy="dynamic", rebalance_interval=5,
                               **common)).step_seconds
        rows.append(f"| {P} | {homo * 1e3:.2f} | {eq * 1e3:.2f} | {prop * 1e3:.2f} | "
                    f"{100 * (eq - prop) / (eq - homo):.0f}% | {st * 1e3:.2f} | {dy * 1e3:.2f} | {dy / st:.2f} |")
    print("\n".join(rows))


def scale(args):
    """CPU seconds (one process, time.process_time) of 1,000 steps with noise 0.05 and 8 stragglers."""
    from pydtnn.sim.engine import Scenario, simulate
    from pydtnn.sim.roofline import roofline_profile
    from pydtnn.sim.variability import Stragglers
    prof = roofline_profile("resnet20_cifar10")
    print(f"load before: {load()}")
    for P in (1024, 16384):
        for policy, nb in (("equal", False), ("equal", True), ("dynamic", False)):
            t0 = time.process_time()
            simulate(Scenario([prof] * P, 4 * P, policy=policy, non_blocking=nb, noise=0.05,
                              stragglers=Stragglers(8, 2.0), steps=1000))
            print(f"P={P} policy={policy} overlap={nb}: {time.process_time() - t0:.2f} CPU s (load {load()})",
                  flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--papers", action="store_true", help="only print the seed papers' claims at scale (simulated)")
    ap.add_argument("--scale", action="store_true", help="only time the simulator at 1,024 and 16,384 replicas")
    ap.add_argument("--quick", action="store_true", help="fewer cases, one round (a smoke run on a busy machine)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of alternating measurements (default 3, quick 1)")
    ap.add_argument("--steps", type=int, default=None, help="steps per epoch (default 30, quick 15)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rebalance_interval", type=int, default=5)
    ap.add_argument("--calibrate_seconds", type=float, default=None, help="per model and round (default 30, quick 20)")
    ap.add_argument("--calibrate_once", action="store_true", help="one calibration before all rounds")
    ap.add_argument("--keep_profiles", default=None, help="a folder to keep each round's profiles in")
    ap.add_argument("--raw", default=None, help="a JSON file for every case's measured and predicted seconds")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default="validation.md")
    args = ap.parse_args()
    if args.papers or args.scale:
        return papers(args) if args.papers else scale(args)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.steps = args.steps or (15 if args.quick else 30)
    args.calibrate_seconds = args.calibrate_seconds or (20.0 if args.quick else 30.0)
    load_start = load()
    all_cases = cases(args.quick)
    part_model = "simplecnn"
    parts = partition_cases(part_model)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        models = list(dict.fromkeys([c.model for c in all_cases]))
        profiles = None
        for r in range(args.rounds):
            if profiles is None or not args.calibrate_once:
                profiles = {m: calibrate(m, args, tmp, f".round{r + 1}") for m in models}
            for c in all_cases + parts:
                c.measured.append(measure(c, args, tmp))
                c.predicted.append(predict(c, profiles[c.model], args))
                print(f"round {r + 1}: {c.label}: {c.measured[-1]:.3f} s, predicted {c.predicted[-1]:.3f} s "
                      f"(load {load()})", flush=True)
    load_end = load()

    def med(c):
        return float(np.median(c.measured))

    def pred(c):
        return float(np.median(c.predicted))
    errors = np.array([np.median(np.array(c.predicted) / np.array(c.measured) - 1) for c in all_cases])
    lines = [f"Measured on this machine ({os.cpu_count()} cores), load average (1, 5, 15 min) {load_start} at the "
             f"start and {load_end} at the end; {args.rounds} round(s), {args.epochs} epochs of {args.steps} steps, "
             f"epoch time = median of the epochs after the first; "
             f"{'one calibration' if args.calibrate_once else 'calibrated at the start of every round'}; error = "
             f"median over rounds of predicted / measured - 1.", "",
             "| case | measured s (median) | spread | predicted s (median) | error |", "|---|---|---|---|---|"]
    for c, e in zip(all_cases, errors):
        spread = (max(c.measured) - min(c.measured)) / med(c)
        lines.append(f"| {c.label} | {med(c):.3f} | {100 * spread:.0f}% | {pred(c):.3f} | {100 * e:+.1f}% |")
    lines += ["", f"median |error| {100 * np.median(np.abs(errors)):.1f}%, max |error| {100 * np.max(np.abs(errors)):.1f}% "
              f"over {len(errors)} cases (goals: 5% and 10%)."]
    best = best_predicted_split(part_model, profiles[part_model], args)
    statics = parts[:-1]
    times = {tuple(c.speeds): med(c) for c in statics}
    best_measured = min(times.values())
    # the measured split closest to the predicted best one
    from pydtnn.parallel.balance.proportional import partition
    nearest = min(statics, key=lambda c: sum(abs(a - b) for a, b in zip(partition(64, c.speeds), best)))
    lines += ["", f"Partition ({part_model}, 2 ranks emulated 1 : 0.5, B = 64): predicted best split {best}; measured "
              + ", ".join(f"{partition(64, c.speeds)}: {med(c):.3f} s" for c in statics)
              + f". The measured split nearest the predicted best is {100 * (med(nearest) / best_measured - 1):.1f}% "
              f"slower than the best measured (goal: within 5%)."]
    ranking = {"equal": med(statics[0]), "static": med(statics[2]), "dynamic": med(parts[-1])}
    predicted = {"equal": pred(statics[0]), "static": pred(statics[2]), "dynamic": pred(parts[-1])}
    order_m = sorted(ranking, key=ranking.get)
    order_p = sorted(predicted, key=predicted.get)
    lines += ["", f"Policies (same case): measured {', '.join(f'{k} {v:.3f} s' for k, v in ranking.items())} -> order "
              f"{' < '.join(order_m)}; predicted {', '.join(f'{k} {v:.3f} s' for k, v in predicted.items())} -> order "
              f"{' < '.join(order_p)} ({'same' if order_m == order_p else 'DIFFERENT'} order)."]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    if args.raw:
        Path(args.raw).write_text(json.dumps([{"case": c.label, "measured_s": c.measured, "predicted_s": c.predicted}
                                              for c in all_cases + parts], indent=1))
    print()
    print(text)


if __name__ == "__main__":
    main()
