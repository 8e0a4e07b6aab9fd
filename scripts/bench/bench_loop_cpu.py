#!/usr/bin/env python
"""Where a training step's wall time goes on the CPU, and what the loop itself costs: the launcher's own run
(`scripts/pydtnn_benchmark.py`) for 1 replica and for 2 replicas emulated at speeds 1 : 0.5 and balanced
(static split 2 : 1), on real MNIST (the repository's t10k files).

    python scripts/bench/bench_loop_cpu.py                       # simplecnn, B = 256, 120 steps, 3 epochs
    python scripts/bench/bench_loop_cpu.py --replicas 2 --balance dynamic --epochs 4

Per replica count, rank 0's milliseconds per step, medians over the epochs after the first (kernels compiled,
the emulation calibrated):
  compute     forward + backward (the emulated replica's padding included; its waits excluded)
  reduction   the gradient allreduce (part of the waits)
  wait other  every other collective: the step's record, synchronized BatchNorm's reductions
  update      the optimizer's step (and clipping)
  loop        the loop's own work: the rest of the step's wall time (the batch, the settle, the callbacks,
              the policy)
and, for 2 replicas, the epoch against the ideal steps * B / (v0 + v1), each v_i a replica's samples per
compute second. The launcher runs under `mpiexec` from the MPI beside this Python; each run's per-epoch JSON
history and rank 0's step breakdown stay in --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "scripts" / "pydtnn_benchmark.py"
MNIST = REPO / "tests" / "data" / "mnist-t10k"


# ------------------------------------------------------------------------------------- inside each rank

def instrumented_launch(argv, breakdown_path):
    """The launcher's `main(argv)`, with the engine's reduction and update timed per epoch (rank 0 writes them
    to `breakdown_path`): wrappers of a few perf_counter calls, far below a step's millisecond."""
    sys.path.insert(0, str(REPO))
    from pydtnn import cli
    from pydtnn.parallel.data_parallel import DataParallel
    from pydtnn.training.epoch import EpochLoop
    acc = {"reduction_s": 0.0, "update_s": 0.0}
    epochs = []

    def timed(method, key):
        def wrapper(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                acc[key] += time.perf_counter() - t0
        return wrapper
    DataParallel.reduce = timed(DataParallel.reduce, "reduction_s")
    DataParallel.update = timed(DataParallel.update, "update_s")
    run = EpochLoop.run

    def epoch_run(self, epoch, first_step=0):
        acc.update(reduction_s=0.0, update_s=0.0)
        row = run(self, epoch, first_step)
        epochs.append(dict(acc, epoch=epoch + 1, steps=self.trainer.steps_per_epoch - first_step,
                           rank=self.trainer.rank))
        return row
    EpochLoop.run = epoch_run
    status = cli.main(argv)
    if epochs and epochs[0]["rank"] == 0:
        Path(breakdown_path).write_text(json.dumps(epochs))
    return status


# ------------------------------------------------------------------------------------------ the driver

def mpiexec():
    """The mpiexec of the MPI installed beside this Python (the `mpich` or `openmpi` extra), else PATH's."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


def launch(args, replicas, out):
    history, breakdown = out / f"history_{replicas}.json", out / f"breakdown_{replicas}.json"
    flags = ["--model", args.model, "--dataset", "mnist", "--dataset_train_path", str(args.data),
             "--global_batch_size", str(args.batch), "--steps_per_epoch", str(args.steps),
             "--num_epochs", str(args.epochs), "--progress_bar", "false", "--history_file", str(history),
             "--overwrite", "true", "--learning_rate", "0.01", "--seed", "0"]
    if replicas > 1:
        speeds = ",".join(["1"] + ["0.5"] * (replicas - 1))
        flags += ["--parallel", "data", "--emulate_speeds", speeds]
        flags += (["--balance", "static", "--replica_speeds", speeds] if args.balance == "static"
                  else ["--balance", args.balance])
    me = [sys.executable, "-m", "mpi4py", __file__, "--worker", str(breakdown), "--"] + flags
    cmd = [mpiexec(), "-n", str(replicas)] + me if replicas > 1 else me
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
    (out / f"log_{replicas}.txt").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        sys.exit(f"bench_loop_cpu: the run of {replicas} replica(s) failed (status {r.returncode}):\n"
                 + (r.stderr or r.stdout)[-2000:])
    return json.loads(history.read_text()), json.loads(breakdown.read_text())


def summarize(history, breakdown, replicas):
    """Rank 0's milliseconds per step by part, and the epoch against the ideal, medians over the epochs after
    the first."""
    rows = [(h, b) for h, b in zip(history, breakdown)][1:] or list(zip(history, breakdown))
    ms = lambda values: 1e3 * statistics.median(values)
    per = []
    for h, b in rows:
        steps = b["steps"]
        wall, compute, wait = h["time_s"] / steps, h["rank0_compute_s"] / steps, h["rank0_wait_s"] / steps
        reduction, update = b["reduction_s"] / steps, b["update_s"] / steps
        v = [h[f"rank{i}_samples"] / h[f"rank{i}_compute_s"] for i in range(replicas)]
        samples = sum(h[f"rank{i}_samples"] for i in range(replicas))
        per.append({"wall": wall, "compute": compute, "reduction": reduction, "wait other": wait - reduction,
                    "update": update, "loop": wall - compute - wait - update,
                    "ideal ratio": h["time_s"] / (samples / sum(v))})
    out = {k: ms([p[k] for p in per]) for k in ("wall", "compute", "reduction", "wait other", "update", "loop")}
    out["ideal ratio"] = statistics.median(p["ideal ratio"] for p in per)
    out["split"] = [history[-1][f"rank{i}_b"] for i in range(replicas)]
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:                  # one rank of a run (see `launch`)
        return instrumented_launch(argv[3:], argv[1])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="simplecnn", help="a model of the zoo")
    p.add_argument("--batch", type=int, default=256, help="the global batch B")
    p.add_argument("--steps", type=int, default=120, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=3, help="epochs per run; the first is warm-up")
    p.add_argument("--replicas", default="1,2", help="replica counts to run, e.g. 1,2")
    p.add_argument("--balance", default="static", help="2+ replicas: static (2 : 1 by the speeds) or dynamic")
    p.add_argument("--data", default=str(MNIST), help="the folder of MNIST's IDX files")
    p.add_argument("--out", default="out/bench_loop_cpu", help="folder for the histories and logs")
    p.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{args.model}, MNIST t10k, B = {args.batch}, {args.steps} steps x {args.epochs} epochs; rank 0's ms "
          f"per step, medians over epochs 2..{args.epochs}; {os.cpu_count()} cores")
    parts = ("wall", "compute", "reduction", "wait other", "update", "loop")
    print(f"{'replicas':>8} {'split':>12} " + " ".join(f"{k:>10}" for k in parts) + f" {'epoch/ideal':>12}")
    for replicas in [int(r) for r in args.replicas.split(",")]:
        s = summarize(*launch(args, replicas, out), replicas)
        ideal = f"{s['ideal ratio']:.3f}x" if replicas > 1 else "-"
        print(f"{replicas:>8} {str(s['split']):>12} " + " ".join(f"{s[k]:>10.3f}" for k in parts) + f" {ideal:>12}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
