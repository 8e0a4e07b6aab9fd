"""Heterogeneous data parallelism on one machine: the comparisons of Moreno-Alvarez et al., and BatchNorm.

    python scripts/experiments/heterogeneity_experiment.py                 # speeds 1,0.5 on 2 ranks, real MNIST
    python scripts/experiments/heterogeneity_experiment.py --quick         # a smoke run of every part (under a minute)
    python scripts/experiments/heterogeneity_experiment.py --parts c       # only the BatchNorm comparison
    python scripts/experiments/heterogeneity_experiment.py --speeds 1,0.5,0.25 --epochs 10

Every run is the real launcher (scripts/pydtnn_benchmark.py) under ``mpiexec -n P python -m mpi4py``
with ``--parallel data``. ``--emulate_speeds f_1,...`` is a deadline model (pydtnn/parallel/emulation.py):
replica i's compute of b samples is padded to b * t0 / (f_i / max f), t0 the time per sample of the full-speed
replicas (the mean of their last 16 steps less the slowest; before the first step, its own from 5
calibration passes), busy-waiting when the cores hold every rank's threads (as here with one BLAS thread per
replica); so the replicas' speeds are in the ratio of the factors. The per-epoch JSON histories of the runs give every number reported.

(a) Load balancing (J. Supercomputing 2020): the equal split (``--balance none``), the split proportional to
    the speeds (``--balance static --replica_speeds <speeds>``) and the split re-measured during training
    (``--balance dynamic``), all with proportional gradient weights, in --repeats interleaved rounds. Time
    per epoch = median over the epochs after the first. Ideal epoch time = S / (v_0 + ... + v_{P-1}), S the
    samples of an epoch (steps x B) and v_i the samples per compute-second of replica i measured in the
    round's equal-split run (compute = forward + backward, padded by the emulation).
(b) Gradient weighting (J. Supercomputing 2022): uniform weights w_i = 1/P against proportional weights
    w_i = b_i/B, both with the static split: training loss and held-out accuracy per epoch.
(c) BatchNorm under a skewed split (--bn_speeds, default 1:0.2 on 2 ranks, split statically): a small
    residual net with BatchNorm (scripts/experiments/heterogeneity_bn_model.py), local (each replica normalizes with
    its own b_i samples) against synchronized (``--sync_batchnorm true``: the global batch's statistics)
    BatchNorm, each with uniform and proportional weights: held-out accuracy and loss per epoch, and the
    time per epoch that synchronization costs. Without emulation by default (--bn_emulate): the split is
    fixed by --replica_speeds, so losses and accuracies are the same with it; but the compute it pads would
    hold synchronized BatchNorm's collectives and the waits inside them, so it would not time a slow device.

Writes ``results.md``, ``epoch_time.png``, ``weighting.png``, ``batchnorm.png`` (for the parts run), the
histories and the runs' logs into --out (a folder of the current one unless absolute).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from pydtnn.experiments.heterogeneity.history import balance_rounds
from pydtnn.experiments.heterogeneity.report import commands_section, introduction, section_a, section_b, section_c
from pydtnn.experiments.heterogeneity.runs import DEFAULT_DATA, PARTS, plan_runs, run_all, run_environment, run_kinds


def parse_speeds(text: str) -> list[float]:
    try:
        v = [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if len(v) < 2 or any(not (x > 0 and np.isfinite(x)) for x in v):
        raise argparse.ArgumentTypeError(f"expected at least two positive speeds, got {text!r}")
    return v


def parse_parts(text: str) -> list[str]:
    parts = [p.strip().lower() for p in text.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if not parts or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {','.join(PARTS)}, got {text!r}")
    return [p for p in PARTS if p in parts]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--parts", type=parse_parts, default=list(PARTS),
                    help="which comparisons to run: a (equal/static/dynamic split), b (weighting), c (BatchNorm)")
    ap.add_argument("--speeds", type=parse_speeds, default=parse_speeds("1,0.5"),
                    help="(a), (b): emulated relative speeds f_i, one per replica (P = their count)")
    ap.add_argument("--global_batch_size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=None, help="(a), (b): epochs per run (default 12; --quick: 3)")
    ap.add_argument("--model", default="simplecnn", help="(a), (b): the model")
    ap.add_argument("--rebalance_interval", type=int, default=None,
                    help="(a): --balance dynamic's steps between re-splits (default 20, the launcher's; --quick: 5)")
    ap.add_argument("--data", default=None,
                    help=f"MNIST folder (IDX gz files), or 'synthetic' (default: {DEFAULT_DATA}, the real MNIST "
                         f"test set; 8,000 train / 2,000 held out with --validation_split 0.2)")
    ap.add_argument("--validation_split", type=float, default=0.2)
    ap.add_argument("--learning_rate", type=float, default=0.02,
                    help="(a), (b): the launcher's --learning_rate (SGD; with --global_batch_size the launcher "
                         "trains at it, unscaled)")
    ap.add_argument("--bn_speeds", type=parse_speeds, default=parse_speeds("1,0.2"),
                    help="(c): relative speeds that set the static split (and the emulation with --bn_emulate)")
    ap.add_argument("--bn_epochs", type=int, default=None, help="(c): epochs per run (default 10; --quick: 2)")
    ap.add_argument("--bn_learning_rate", type=float, default=0.05, help="(c): the launcher's --learning_rate")
    ap.add_argument("--bn_emulate", action="store_true",
                    help="(c): emulate --bn_speeds too (same losses; the padded compute then holds sync BN's collectives)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads per replica")
    ap.add_argument("--out", default="out/heterogeneity", help="output folder (relative to the current folder)")
    ap.add_argument("--quick", action="store_true", help="smoke run of the chosen parts: 10 steps per epoch, "
                                                         "3 epochs ((c): 2), one round")
    ap.add_argument("--repeats", type=int, default=None,
                    help="(a): rounds of the three timed runs (default 3; --quick: 1)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed per run")
    args = ap.parse_args(argv)
    quick = args.quick
    for name, full, small in (("epochs", 12, 3), ("bn_epochs", 10, 2), ("repeats", 3, 1),
                              ("rebalance_interval", 20, 5)):
        if getattr(args, name) is None:
            setattr(args, name, small if quick else full)
    if args.repeats < 1 or args.rebalance_interval < 1:
        ap.error("--repeats and --rebalance_interval must be >= 1")
    if args.epochs < 2 or args.bn_epochs < 2:
        ap.error("--epochs and --bn_epochs must be >= 2 (the first epoch is left out of the timings)")
    args.steps_per_epoch = 10 if quick else 0
    if args.global_batch_size < max(len(args.speeds), len(args.bn_speeds)):
        ap.error(f"--global_batch_size {args.global_batch_size} is smaller than the number of replicas")
    return ap, args


def data_flags_for(ap, args, notes) -> list[str]:
    if args.data is None:
        args.data = str(DEFAULT_DATA.resolve())
        if not Path(args.data).is_dir():
            notes.append(f"the default MNIST folder {args.data} is missing: synthetic data used instead")
            args.data = "synthetic"
    split = ["--validation_split", f"{args.validation_split:g}"]
    if args.data == "synthetic":
        return ["--dataset", "synthetic", "--synthetic_samples", "2000" if args.quick else "10000", *split]
    if not Path(args.data).is_dir():
        ap.error(f"--data {args.data}: no such folder")
    return ["--dataset", "mnist", "--dataset_train_path", str(Path(args.data).resolve()), *split]


def main(argv=None):
    ap, args = parse_args(argv)
    notes = []
    data_flags = data_flags_for(ap, args, notes)
    out = Path(os.path.abspath(args.out))          # the runs start in the repository: their paths are absolute
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = run_environment(args.threads)

    kinds = run_kinds(args)
    runs = plan_runs(args.parts, args.repeats)
    t_all = time.monotonic()
    commands, histories, wall, loads = run_all(args, runs, kinds, data_flags, out, env)
    total_s = time.monotonic() - t_all

    L = introduction(args, loads, total_s, len(runs), notes)
    plots = []
    if "a" in args.parts:
        L += section_a(args, runs, histories, balance_rounds(histories, runs), out)
        plots.append("epoch_time")
    if "b" in args.parts:
        L += section_b(args, runs, histories, out)
        plots.append("weighting")
    if "c" in args.parts:
        L += section_c(args, histories, out)
        plots.append("batchnorm")
    L += ["## Plots", ""] + [f"![{p}]({p}.png)\n" for p in plots]
    L += commands_section(argv if argv is not None else sys.argv[1:], env, commands, kinds, runs, wall)
    (out / "results.md").write_text("\n".join(L))
    print(f"wrote {out / 'results.md'} and {', '.join(p + '.png' for p in plots)} in {total_s:.0f} s")
    return 0
