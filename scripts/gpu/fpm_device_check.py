#!/usr/bin/env python
"""The FPM balancing check on a GPU node (issue 37's "on a device"): one GPU replica beside CPU replicas.

    python scripts/gpu/fpm_device_check.py                      # --devices gpu,cpu,cpu, ResNet-20, B = 256
    python scripts/gpu/fpm_device_check.py --policies fpm --steps 10

For each policy (fpm, the constant model `probe`, dynamic) one run of the launcher under mpiexec, synthetic
CIFAR-10, `--steps` steps per epoch, 2 epochs; it prints, from epoch 2 (nothing compiles there): the split, each
replica's compute per step, max/min compute, and the epoch against `--steps` x the makespan the cost model
predicted (the probe's last line). Targets for fpm: max/min <= 1.10 (2.83 with the constant model on an H200),
the epoch within 1.10x of the predicted makespan; a FAIL line says which was missed (exit status 1).

Then, in one GPU process, the cost of a re-split to a local batch that was not warmed: a step at b = 200 after
warm-up, then the first and the second step at b = 203 (a shape with no cuDNN plan yet); the first one's extra
time is what a re-split costs when shapes are not warmed (the FPM policies warm every bucket while probing).
Everything goes to stdout; each run's output also under --out. With --max_seconds it ends by itself within that
time (runs not started, or stopped, are said in a closing `STOPPED: ...` line; they are not failures).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from time_limit import TimeLimit  # noqa: E402 - beside this script

LAUNCHER = REPO / "scripts" / "pydtnn_benchmark.py"
TARGET = 1.10


def run_within(a, limit, what, command):
    """subprocess.run of `command` under --timeout, cut short at --max_seconds; None (and `what` noted as not
    run) if it did not start because the longest earlier run does not fit, or the limit stopped it."""
    if not limit.fits("run"):
        limit.skip(f"{what}: not started")
        return None
    cut = limit.left() < a.timeout
    try:
        with limit.timing("run"):
            return subprocess.run(command, capture_output=True, text=True, timeout=min(a.timeout, limit.left()))
    except subprocess.TimeoutExpired:
        if not cut:
            raise                                       # its own --timeout: a hang
        limit.skip(f"{what}: stopped at the limit")
        return None


def run_policy(a, limit, policy, out):
    from pydtnn.parallel.runtime.mpirun import mpi_command
    history = out / f"{policy}.json"
    args = ["--model", a.model, "--dataset", "cifar10", "--use_synthetic_data", "true", "--parallel", "data",
            "--devices", a.devices, "--global_batch_size", a.global_batch_size, "--synthetic_samples",
            a.global_batch_size * a.steps, "--steps_per_epoch", a.steps, "--num_epochs", 2, "--balance", policy,
            "--rebalance_interval", max(2, a.steps // 4), "--lr_schedulers", "", "--progress_bar", "false",
            "--history_file", history]
    nprocs = len(a.devices.split(","))
    t0 = time.perf_counter()
    r = run_within(a, limit, policy, mpi_command(nprocs, LAUNCHER, [str(v) for v in args]))
    if r is None:
        return True                                     # stopped at the limit: not a failure
    (out / f"{policy}.log").write_text(r.stdout + r.stderr)
    if r.returncode:
        print(f"{policy}: FAIL, the run exited with {r.returncode}:\n{r.stderr[-3000:]}")
        return False
    row = json.loads(history.read_text())[-1]
    compute = [row[f"rank{i}_compute_s"] / a.steps for i in range(nprocs)]
    split = [row[f"rank{i}_b"] for i in range(nprocs)]
    predicted = re.findall(r"\(makespan ([0-9.e+-]+) ms\)", r.stdout)
    ratio = max(compute) / min(compute)
    print(f"{policy}: split {split}, compute per step {', '.join(f'{c * 1e3:.1f}' for c in compute)} ms, "
          f"max/min {ratio:.2f}, epoch {row['time_s']:.3f} s ({time.perf_counter() - t0:.0f} s with start-up)")
    for line in r.stdout.splitlines():
        if re.match(r"  replica \d|probe|predicted|re-split|constant model", line):
            print(f"  {line.strip()}")
    if policy != "fpm":
        return True
    ok = ratio <= TARGET
    if predicted:
        makespan = float(predicted[-1]) * 1e-3 * a.steps
        over = row["time_s"] / makespan
        print(f"  epoch / ({a.steps} x predicted makespan {float(predicted[-1]):.1f} ms) = {over:.2f}")
        ok = ok and over <= TARGET
    print(f"  {'PASS' if ok else 'FAIL'}: max/min <= {TARGET} and the epoch within {TARGET}x of the prediction")
    return ok


def unwarmed_resplit(a):
    """Seconds of a warmed step at b = 200 and of the first and second steps at b = 203, on the GPU."""
    import numpy as np
    from pydtnn import Model
    from pydtnn.losses import get_loss
    from pydtnn.models import build_model
    model = Model(backend="gpu", dtype="float32", seed=0)
    build_model(a.model, model)
    loss = get_loss("categorical_cross_entropy")
    rng = np.random.default_rng(0)

    def step(b):
        x = rng.standard_normal((b,) + tuple(model.input_shape)).astype(np.float32)
        y = model.backend.asarray(np.eye(model.output_shape[-1], dtype=np.float32)[rng.integers(0, 10, b)])
        t0 = time.perf_counter()
        model.compute_gradients(x, y, loss)
        model.backend.synchronize()
        return time.perf_counter() - t0
    for _ in range(3):
        step(200)
    warm = min(step(200) for _ in range(5))
    first, second = step(203), step(203)
    return warm, first, second


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", default="gpu,cpu,cpu")
    p.add_argument("--model", default="resnet20_cifar10")
    p.add_argument("--global_batch_size", type=int, default=256)
    p.add_argument("--steps", type=int, default=20, help="steps per epoch")
    p.add_argument("--policies", default="fpm,probe,dynamic")
    p.add_argument("--timeout", type=int, default=400, help="seconds per run (a run past it has hung: a failure)")
    p.add_argument("--max_seconds", type=float, default=None,
                   help="end within this many seconds: a run starts only if the longest earlier one fits, and one "
                        "still going at the limit is stopped; what was not run is one 'STOPPED:' line at the end "
                        "(default: no limit)")
    p.add_argument("--out", default="out/fpm_device")
    p.add_argument("--unwarmed", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.unwarmed:                                  # the child process of the re-split measurement
        print(json.dumps(unwarmed_resplit(a)))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    limit = TimeLimit(a.max_seconds)
    ok = all([run_policy(a, limit, policy, out) for policy in a.policies.split(",")])
    r = run_within(a, limit, "unwarmed re-split", [sys.executable, __file__, "--unwarmed", "--model", a.model])
    if r is None:
        pass
    elif r.returncode == 0:
        warm, first, second = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"unwarmed re-split: a step at b = 200 (warmed) {warm * 1e3:.1f} ms; the first at b = 203 "
              f"{first * 1e3:.1f} ms, the second {second * 1e3:.1f} ms: {(first - second) * 1e3:.1f} ms extra")
    else:
        print(f"unwarmed re-split: not measured ({r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode})")
    if limit.stopped_line():
        print(limit.stopped_line())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
