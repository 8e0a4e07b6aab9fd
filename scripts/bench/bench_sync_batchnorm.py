#!/usr/bin/env python
"""What --sync_batchnorm costs per step: the same data-parallel job with local and with synchronized BatchNorm.

    python scripts/bench/bench_sync_batchnorm.py                       # ResNet-20, 2 ranks x 1 thread, 64 samples each
    python scripts/bench/bench_sync_batchnorm.py --ranks 3 --speeds 1,2,3 --rounds 5

Each round runs the launcher under mpiexec twice, local then synchronized (alternating, so drift in the
machine's load hits both alike), on synthetic CIFAR-shaped data; a run's step time is the median epoch time
after the first epoch divided by its steps. Prints both medians over the rounds, the ratio synced / local,
and the per-round ratios (their spread is the noise of this machine).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
from pydtnn.parallel.runtime.mpirun import mpi_command  # noqa: E402


def step_time(args, sync: bool, history: Path) -> float:
    flags = ["--model", args.model, "--dataset", "synthetic", "--synthetic_samples", str(args.batch * args.ranks * 4),
             "--parallel", "data", "--global_batch_size", str(args.batch * args.ranks),
             "--steps_per_epoch", str(args.steps), "--num_epochs", str(args.epochs), "--lr_schedulers", "",
             "--progress_bar", "false", "--threads_per_replica", str(args.threads),
             "--sync_batchnorm", "true" if sync else "false", "--history_file", str(history)]
    if args.speeds:
        flags += ["--balance", "static", "--replica_speeds", args.speeds]
    env = dict(os.environ, **{v: str(args.threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    cmd = mpi_command(args.ranks, REPO / "scripts" / "pydtnn_benchmark.py", flags)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if proc.returncode != 0:
        sys.exit(f"bench_sync_batchnorm: a run failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    rows = json.loads(history.read_text())[1:]
    return float(np.median([r["time_s"] for r in rows])) / args.steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet20_cifar10")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--speeds", default=None, help="--replica_speeds for a static heterogeneous split")
    ap.add_argument("--batch", type=int, default=64, help="samples per rank (global batch = batch x ranks)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=6, help="steps per epoch")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is not timed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)
    local, synced = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            local.append(step_time(args, False, Path(tmp) / f"local{k}.json"))
            synced.append(step_time(args, True, Path(tmp) / f"sync{k}.json"))
            print(f"round {k + 1}: local {local[-1] * 1e3:.1f} ms/step, synced {synced[-1] * 1e3:.1f} ms/step "
                  f"({synced[-1] / local[-1]:.3f})", flush=True)
    ml, ms = float(np.median(local)), float(np.median(synced))
    print(f"{args.model}, {args.ranks} ranks x {args.threads} thread(s), {args.batch} samples per rank"
          + (f", speeds {args.speeds}" if args.speeds else "")
          + f": local BatchNorm {ml * 1e3:.1f} ms/step, synchronized {ms * 1e3:.1f} ms/step (median of "
          f"{args.rounds}); synced / local = {ms / ml:.3f} (+{(ms - ml) * 1e3:.1f} ms/step); per round: "
          + ", ".join(f"{s / l:.3f}" for s, l in zip(synced, local)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
