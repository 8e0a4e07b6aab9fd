#!/usr/bin/env python
"""Measure the functional performance model (FPM) balancing on this CPU, with emulated devices (docs/balancing.md).

    python scripts/experiments/fpm_experiment.py --rounds 3 --out out/fpm

Two experiments, each run side by side in one invocation, in alternated rounds (A B A B A B), reporting medians:

1. Emulated affine costs (--emulate_costs): one GPU-like replica (a fixed 40 ms per step, 0.1 ms per sample)
   beside two proportional CPU-like ones (1.5 ms per sample), B = 256. The FPM split (--balance fpm) and the
   constant model's (--balance probe: speeds timed at B/P) are compared with the integer-optimal makespan under
   the true emulated costs (pydtnn.parallel.balance.fpm_partition.equal_finish on the exact model): the split's makespan
   under the true costs, and the measured compute of the slowest replica per step.
2. A time-varying straggler (--emulate_schedule): three equal replicas (1 ms per sample), replica 1 three times
   slower during steps [60, 120); --balance dynamic against the static FPM split (--balance fpm), B = 120,
   180 steps, a decision every 10 steps. Reported: the run's total compute time of the slowest replica per step,
   and for dynamic the intervals from the onset (and from the end) until the slowest replica's compute is within
   10% of the optimum under the costs in force.

The emulated per-sample times are set well above this machine's real ones (simplemlp: about 0.02 ms per sample),
so each replica's compute is its emulated a + c b whatever the load: the comparison is of splits, not of this
machine. It writes every run's history under --out (a folder of the current one) and prints the tables.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from pydtnn.parallel.balance.cost_model import CostModel            # noqa: E402
from pydtnn.parallel.balance.fpm_partition import equal_finish      # noqa: E402
from pydtnn.parallel.runtime.mpirun import mpi_command      # noqa: E402

LAUNCHER = REPO / "scripts" / "pydtnn_benchmark.py"
COMMON = ["--model", "simplemlp", "--dataset", "synthetic", "--parallel", "data", "--lr_schedulers", "",
          "--progress_bar", "false", "--threads_per_replica", "1", "--seed", "1"]
AFFINE = "40ms+0.1ms,0+1.5ms,0+1.5ms"
AFFINE_TRUTH = CostModel.affine([0.040, 0.0, 0.0], [1e-4, 1.5e-3, 1.5e-3])
STRAGGLER = dict(costs="0+1ms,0+1ms,0+1ms", schedule="1:3@60-120", first=60, last=120, interval=10, steps=180)


def run(args, out, name):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    r = subprocess.run(mpi_command(3, LAUNCHER, [*COMMON, *map(str, args)]), capture_output=True, text=True,
                       env=env, timeout=900)
    (out / f"{name}.log").write_text(r.stdout + r.stderr)
    if r.returncode:
        raise SystemExit(f"{name} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r.stdout


def split_of(stdout):
    line = next(l for l in stdout.splitlines() if "split as [" in l)
    return json.loads(line[line.index("["):line.index("]") + 1])


def affine_round(out, k, policy):
    name = f"affine_{policy}_{k}"
    history = out / f"{name}.json"
    stdout = run(["--balance", policy, "--emulate_costs", AFFINE, "--global_batch_size", 256,
                  "--synthetic_samples", 256 * 20, "--num_epochs", 2, "--history_file", history], out, name)
    row = json.loads(history.read_text())[-1]                 # epoch 2: 20 steps, nothing compiles
    compute = [row[f"rank{i}_compute_s"] / 20 for i in range(3)]
    return {"split": split_of(stdout), "slowest_compute_s": max(compute), "epoch_s": row["time_s"],
            "compute_s": compute}


def straggler_round(out, k, policy):
    s = STRAGGLER
    name = f"straggler_{policy}_{k}"
    steps = out / f"{name}.csv"
    run(["--balance", policy, "--rebalance_interval", s["interval"], "--emulate_costs", s["costs"],
         "--emulate_schedule", s["schedule"], "--global_batch_size", 120, "--synthetic_samples", 120 * 20,
         "--steps_per_epoch", 20, "--num_epochs", s["steps"] // 20, "--step_history_file", steps], out, name)
    rows = list(csv.DictReader(open(steps)))
    slowest = [max(float(r[f"rank{i}_compute_s"]) for i in range(3)) for r in rows]
    log = (out / f"{name}.log").read_text()
    train = float(log.split("training time: ")[1].split(" s")[0])
    return {"slowest": slowest, "total_s": sum(slowest), "training_s": train}


def recovery_intervals(slowest, start, stop, optimum, interval):
    """How many whole intervals from `start` pass before the slowest replica's compute (each interval's median)
    is within 10% of `optimum` and stays there until `stop`."""
    medians = [statistics.median(slowest[s:s + interval]) for s in range(start, stop, interval)]
    for k in range(len(medians)):
        if all(m <= 1.10 * optimum for m in medians[k:]):
            return k
    return None


def main(argv=None):
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--out", default="out/fpm", help="folder for the runs' histories and logs (of the current one)")
    p = a.parse_args(argv)
    out = Path(p.out)
    out.mkdir(parents=True, exist_ok=True)
    affine, straggler = {"probe": [], "fpm": []}, {"fpm": [], "dynamic": []}
    for k in range(p.rounds):                                 # alternated: A B A B ..., same conditions
        for policy in ("probe", "fpm"):
            affine[policy].append(affine_round(out, k, policy))
        for policy in ("fpm", "dynamic"):
            straggler[policy].append(straggler_round(out, k, policy))
    best = equal_finish(256, AFFINE_TRUTH)
    best_t = AFFINE_TRUTH.makespan(best)
    report = {"affine": {}, "straggler": {}}
    print(f"1. emulated affine costs {AFFINE}, B = 256; integer-optimal split {best}, makespan "
          f"{best_t * 1e3:.2f} ms (true costs)\n")
    print("| policy | split | split's makespan, true costs | / optimal | measured slowest compute per step "
          "(median) | / optimal | epoch of 20 steps (median) |")
    print("|---|---|---|---|---|---|---|")
    for policy, name in (("probe", "constant model (probe)"), ("fpm", "FPM (fpm)")):
        runs = affine[policy]
        splits = {tuple(r["split"]) for r in runs}
        true_t = statistics.median(AFFINE_TRUTH.makespan(r["split"]) for r in runs)
        measured = statistics.median(r["slowest_compute_s"] for r in runs)
        epoch = statistics.median(r["epoch_s"] for r in runs)
        shown = ", ".join(str(list(v)) for v in sorted(splits))
        report["affine"][policy] = {"splits": sorted(map(list, splits)), "true_makespan_s": true_t,
                                    "measured_slowest_s": measured, "epoch_s": epoch, "runs": runs}
        print(f"| {name} | {shown} | {true_t * 1e3:.2f} ms | {true_t / best_t:.3f} | {measured * 1e3:.2f} ms | "
              f"{measured / best_t:.3f} | {epoch:.3f} s |")
    s = STRAGGLER
    slow = CostModel.affine([0.0] * 3, [1e-3, 3e-3, 1e-3])
    even = CostModel.affine([0.0] * 3, [1e-3] * 3)
    opt_slow, opt_even = slow.makespan(equal_finish(120, slow)), even.makespan(equal_finish(120, even))
    print(f"\n2. straggler {s['schedule']} on {s['costs']}, B = 120, {s['steps']} steps, decisions every "
          f"{s['interval']}; optimum {opt_even * 1e3:.1f} ms, {opt_slow * 1e3:.1f} ms during the straggler\n")
    print("| policy | training time (median) | slowest replica's compute, all 180 steps (median) | steps 60-119 "
          "(median) | intervals before it is within 10% of the optimum, after the onset / after the end |")
    print("|---|---|---|---|---|")
    for policy in ("fpm", "dynamic"):
        runs = straggler[policy]
        train = statistics.median(r["training_s"] for r in runs)
        total = statistics.median(r["total_s"] for r in runs)
        during = statistics.median(sum(r["slowest"][s["first"]:s["last"]]) for r in runs)
        rec = [(recovery_intervals(r["slowest"], s["first"], s["last"], opt_slow, s["interval"]),
                recovery_intervals(r["slowest"], s["last"], s["steps"], opt_even, s["interval"])) for r in runs]
        report["straggler"][policy] = {"training_s": train, "total_s": total, "during_s": during, "recovery": rec}
        shown = ", ".join(f"{a}/{b}" for a, b in rec)
        print(f"| {policy} | {train:.2f} s | {total:.3f} s | {during:.3f} s | {shown} (rounds) |")
    (out / "report.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
