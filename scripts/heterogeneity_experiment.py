#!/usr/bin/env python
"""Heterogeneous data parallelism on one machine: the comparisons of Moreno-Alvarez et al., and BatchNorm.

    python scripts/heterogeneity_experiment.py                 # speeds 1,0.5 on 2 ranks, real MNIST
    python scripts/heterogeneity_experiment.py --quick         # a smoke run of every part (under a minute)
    python scripts/heterogeneity_experiment.py --parts c       # only the BatchNorm comparison
    python scripts/heterogeneity_experiment.py --speeds 1,0.5,0.25 --epochs 10

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
    residual net with BatchNorm (scripts/heterogeneity_bn_model.py), local (each replica normalizes with
    its own b_i samples) against synchronized (``--sync_batchnorm true``: the global batch's statistics)
    BatchNorm, each with uniform and proportional weights: held-out accuracy and loss per epoch, and the
    time per epoch that synchronization costs. Without emulation by default (--bn_emulate): the split is
    fixed by --replica_speeds, so losses and accuracies are the same with it; but the compute it pads would
    hold synchronized BatchNorm's collectives and the waits inside them, so it would not time a slow device.

Writes ``results.md``, ``epoch_time.png``, ``weighting.png``, ``batchnorm.png`` (for the parts run), the
histories and the runs' logs into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = REPO / "scripts" / "pydtnn_benchmark.py"
BN_MODEL = REPO / "scripts" / "heterogeneity_bn_model.py"
DEFAULT_DATA = REPO / "tests" / "data" / "mnist-t10k"
PARTS = ("a", "b", "c")
BN_MODES, WEIGHTINGS = ("local", "sync"), ("uniform", "proportional")


# ------------------------------------------------------------------------------------------------ MPI

def mpiexec_prefix(nprocs: int) -> list[str]:
    """`mpiexec [...] -n P python -m mpi4py` (the launcher's path is appended by the caller)."""
    from pydtnn.errors import ConfigError
    from pydtnn.parallel.runtime.mpirun import mpi_command
    try:
        return mpi_command(nprocs, "")[:-1]
    except ConfigError as e:
        sys.exit(f"heterogeneity_experiment: {e}")


# ------------------------------------------------------------------------------------------- the runs

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


def fmt_list(values) -> str:
    return ",".join(f"{v:g}" for v in values)


@dataclass
class Spec:
    """One kind of run: what the launcher is given beyond the flags every run shares."""
    what: str
    model: str
    speeds: list
    epochs: int
    learning_rate: float
    flags: list
    emulate: bool = True


def run_kinds(args) -> dict[str, Spec]:
    speeds, bn_speeds = fmt_list(args.speeds), fmt_list(args.bn_speeds)
    static = ["--balance", "static", "--replica_speeds", speeds]
    common = dict(model=args.model, speeds=args.speeds, epochs=args.epochs, learning_rate=args.learning_rate)
    kinds = {
        "equal": Spec("equal split, proportional weights", flags=["--balance", "none"], **common),
        "static": Spec("static split proportional to the speeds, proportional weights", flags=static, **common),
        "dynamic": Spec(f"dynamic split (re-measured every {args.rebalance_interval} steps), proportional weights",
                        flags=["--balance", "dynamic", "--rebalance_interval", str(args.rebalance_interval)],
                        **common),
        "uniform": Spec("static split, uniform weights", flags=static + ["--gradient_weighting", "uniform"], **common),
    }
    for bn in BN_MODES:
        for w in WEIGHTINGS:
            kinds[bn_kind(bn, w)] = Spec(
                f"{bn} BatchNorm, {w} weights, static split {bn_speeds}", model=str(BN_MODEL),
                speeds=args.bn_speeds, epochs=args.bn_epochs, learning_rate=args.bn_learning_rate,
                emulate=args.bn_emulate,
                flags=["--balance", "static", "--replica_speeds", bn_speeds, "--gradient_weighting", w,
                       "--sync_batchnorm", "true" if bn == "sync" else "false"])
    return kinds


def bn_kind(bn, weighting) -> str:
    return f"bn_{bn}_{weighting}"


def plan_runs(parts, repeats) -> dict[str, str]:
    """Run name -> kind, in the order they run. The timed runs of (a) are interleaved by round, so that drift
    in the machine's load hits all three alike; (b)'s uniform run sits after the first round."""
    runs = {}
    rounds = [{f"{k}{r if r > 1 else ''}": k for k in ("equal", "static", "dynamic")} for r in range(1, repeats + 1)]
    if "a" in parts:
        runs.update(rounds[0])
    if "b" in parts:
        runs.setdefault("static", "static")
        runs["uniform"] = "uniform"
    if "a" in parts:
        for r in rounds[1:]:
            runs.update(r)
    if "c" in parts:        # sync next to local of the same weighting: their time difference is the point
        for w in reversed(WEIGHTINGS):
            for bn in BN_MODES:
                runs[bn_kind(bn, w)] = bn_kind(bn, w)
    return runs


def launcher_command(args, data_flags, history, spec: Spec) -> list[str]:
    cmd = mpiexec_prefix(len(spec.speeds)) + [str(LAUNCHER)]
    cmd += ["--model", spec.model, *data_flags, "--parallel", "data",
            "--global_batch_size", str(args.global_batch_size), "--num_epochs", str(spec.epochs),
            "--threads_per_replica", str(args.threads), "--learning_rate", f"{spec.learning_rate:g}",
            "--seed", str(args.seed), "--lr_schedulers", "", "--progress_bar", "false",
            "--history_file", str(history)]
    if spec.emulate:
        cmd += ["--emulate_speeds", fmt_list(spec.speeds)]
    if args.steps_per_epoch:
        cmd += ["--steps_per_epoch", str(args.steps_per_epoch)]
    return cmd + spec.flags


def as_typed(cmd) -> str:
    """A command as a user would type it in the repository (where the runs start): paths inside it relative
    to it, every path normalized (no `..`)."""
    out = []
    for arg in map(str, cmd):
        if os.path.isabs(arg):
            arg = os.path.normpath(arg)
            if Path(arg).is_relative_to(REPO):
                arg = os.path.relpath(arg, REPO)
        out.append(arg)
    return shlex.join(out)


def run_one(cmd, log_path, env, timeout) -> float:
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + as_typed(cmd) + "\n\n")
        log.flush()
        try:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(REPO),
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            sys.exit(f"heterogeneity_experiment: a run timed out after {timeout} s; see {log_path}")
    if proc.returncode != 0:
        tail = "".join(open(log_path).readlines()[-15:])
        sys.exit(f"heterogeneity_experiment: a run failed with status {proc.returncode} (log {log_path}):\n{tail}")
    return time.monotonic() - t0


# ----------------------------------------------------------------------------------------- the numbers

def load_history(path) -> list[dict]:
    rows = json.loads(Path(path).read_text())
    if not rows:
        sys.exit(f"heterogeneity_experiment: empty history {path}")
    return rows


def steady(runs) -> list[dict]:
    """The epochs after the first (the first pays for warm-up and calibration) of every run, pooled."""
    return [r for rows in runs for r in (rows[1:] if len(rows) > 1 else rows)]


def median_of(runs, key) -> float:
    return float(np.median([r[key] for r in steady(runs)]))


def epoch_time(runs) -> float:
    return median_of(runs, "time_s")


def best_epoch_time(runs) -> float:
    """The fastest steady epoch: other processes on the machine can only add time, so the minimum is the
    estimate least disturbed by them."""
    return float(np.min([r["time_s"] for r in steady(runs)]))


def nranks_of(rows) -> int:
    return sum(1 for k in rows[0] if k.startswith("rank") and k.endswith("_b"))


def epoch_samples(runs) -> float:
    """S: the training samples of one epoch (steps x B, less a short last step)."""
    P = nranks_of(runs[0])
    return float(np.median([sum(r[f"rank{i}_samples"] for i in range(P)) for r in steady(runs)]))


def speeds_of(runs) -> np.ndarray:
    """v_i: samples per compute-second of each replica, the median over the steady epochs."""
    P = nranks_of(runs[0])
    return np.array([np.median([r[f"rank{i}_samples"] / r[f"rank{i}_compute_s"] for r in steady(runs)
                                if r[f"rank{i}_compute_s"] > 0]) for i in range(P)])


def per_rank(runs) -> list[dict]:
    """Each rank's final b_i and the medians over the steady epochs of its compute and wait seconds."""
    P = nranks_of(runs[0])
    return [{"b": int(runs[0][-1][f"rank{i}_b"]), "compute_s": median_of(runs, f"rank{i}_compute_s"),
             "wait_s": median_of(runs, f"rank{i}_wait_s"), "samples": median_of(runs, f"rank{i}_samples")}
            for i in range(P)]


def balance_rounds(histories, runs) -> list[dict]:
    """Per round of (a): the ideal from its equal run's speeds, and each split's time per epoch."""
    out = []
    names = [n for n, k in runs.items() if k == "equal"]
    for name in names:
        suffix = name[len("equal"):]
        eq = [histories[name]]
        v = speeds_of(eq)
        rnd = {"v": v, "ideal": epoch_samples(eq) / v.sum()}
        for kind in ("equal", "static", "dynamic"):
            rnd[kind] = epoch_time([histories[kind + suffix]])
        out.append(rnd)
    return out


def bn_summary(rows, acc_key, loss_key, last=3) -> dict:
    """Final, best and last-`last`-epochs mean accuracy (one epoch's held-out number moves by a few points
    with the last steps' running statistics), final losses, median and best steady epoch times."""
    acc = [r[acc_key] for r in rows]
    return {"acc": acc[-1], "best_acc": max(acc), "last_acc": float(np.mean(acc[-last:])), "last": min(last, len(acc)),
            "val_loss": rows[-1][loss_key], "loss": rows[-1]["loss"],
            "time_s": epoch_time([rows]), "best_s": best_epoch_time([rows])}


# ---------------------------------------------------------------------------------------------- plots

SPLIT_COLORS = {"equal": "tab:red", "static": "tab:green", "dynamic": "tab:blue"}


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def integer_epochs(*axes):
    from matplotlib.ticker import MaxNLocator
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")


def plot_epoch_time(path, rounds, ranks, speeds, dynamic_rows, static_b):
    plt = pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.4), gridspec_kw={"width_ratios": [1.1, 1.4, 1]})
    kinds = ("equal", "static", "dynamic")
    ideal = float(np.median([r["ideal"] for r in rounds]))
    values = [float(np.median([r[k] for r in rounds])) for k in kinds] + [ideal]
    over = [float(np.median([r[k] / r["ideal"] for r in rounds])) for k in kinds] + [1.0]
    names = ["equal", "static", "dynamic", "ideal\nS / sum(v_i)"]
    bars = ax1.bar(names, values, color=[SPLIT_COLORS[k] for k in kinds] + ["tab:gray"])
    for x, k in enumerate(kinds):      # each round's epoch time, so the spread is visible
        ax1.plot([x] * len(rounds), [r[k] for r in rounds], "k.", ms=4)
    for bar, v, q in zip(bars, values, over):
        ax1.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.2f} s\n{q:.2f}x ideal", ha="center", va="bottom",
                 fontsize=8)
    ax1.set_ylabel("time per epoch (s, median after epoch 1)")
    ax1.set_ylim(0, max(values) * 1.3)
    ax1.set_title(f"epoch time, speeds {fmt_list(speeds)}\n(bars: median of {len(rounds)} round(s); dots: rounds)",
                  fontsize=10)

    P = len(speeds)
    width = 0.8 / len(kinds)
    xs = np.arange(P)
    for k, kind in enumerate(kinds):
        x = xs + (k - (len(kinds) - 1) / 2) * width
        comp = [r["compute_s"] for r in ranks[kind]]
        wait = [r["wait_s"] for r in ranks[kind]]
        ax2.bar(x, comp, width, color=SPLIT_COLORS[kind], label=f"{kind}: compute")
        ax2.bar(x, wait, width, bottom=comp, color=SPLIT_COLORS[kind], alpha=0.35, hatch="//", label=f"{kind}: wait")
        for xi, r in zip(x, ranks[kind]):
            ax2.text(xi, r["compute_s"] + r["wait_s"], f"b={r['b']}", ha="center", va="bottom", fontsize=7)
    ratios = np.median([r["v"] / r["v"].max() for r in rounds], axis=0)
    ax2.set_xticks(xs, [f"rank {i}\nf/max f = {s / max(speeds):.2f}\nmeasured v/v_max = {q:.2f}"
                        for i, (s, q) in enumerate(zip(speeds, ratios))], fontsize=8)
    ax2.set_ylabel("seconds per epoch (median)")
    ax2.set_title("per replica: compute (solid) and wait in allreduce (hatched)", fontsize=10)
    ax2.legend(fontsize=7)

    for i in range(P):
        line, = ax3.plot([r["epoch"] for r in dynamic_rows], [r[f"rank{i}_b"] for r in dynamic_rows], "-o", ms=3,
                         label=f"rank {i}: dynamic")
        ax3.axhline(static_b[i], color=line.get_color(), ls="--", lw=1, label=f"rank {i}: static")
    shown = [r[f"rank{i}_b"] for r in dynamic_rows for i in range(P)] + list(static_b)
    ax3.set_ylim(min(shown) - 2, max(shown) + 2)       # axhline alone does not widen the limits
    ax3.set_ylabel("b_i in force at the end of the epoch")
    ax3.set_title("dynamic split (first round)", fontsize=10)
    ax3.legend(fontsize=7)
    integer_epochs(ax3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_weighting(path, uni, prop, speeds, sizes):
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for rows, label, color in ((uni, "uniform w_i = 1/P", "tab:orange"),
                               (prop, "proportional w_i = b_i/B", "tab:blue")):
        ep = [r["epoch"] for r in rows]
        ax1.plot(ep, [r["loss"] for r in rows], "-o", color=color, ms=3, label=f"{label}: training")
        if "val_loss" in rows[0]:
            ax1.plot(ep, [r["val_loss"] for r in rows], "--s", color=color, ms=3, label=f"{label}: held out")
        key = "val_categorical_accuracy" if "val_categorical_accuracy" in rows[0] else "categorical_accuracy"
        ax2.plot(ep, [r[key] for r in rows], "-o", color=color, ms=3, label=label)
    ax1.set_ylabel("categorical cross-entropy")
    ax1.set_yscale("log")
    ax1.set_title(f"loss, split {sizes} (speeds {fmt_list(speeds)})")
    ax1.legend(fontsize=8)
    ax2.set_ylabel("held-out accuracy" if "val_categorical_accuracy" in prop[0] else "training accuracy")
    ax2.set_title("accuracy")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    integer_epochs(ax1, ax2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_batchnorm(path, bn_rows, sizes):
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    acc = "val_categorical_accuracy" if "val_categorical_accuracy" in next(iter(bn_rows.values()))[0] else None
    colors, styles = {"local": "tab:red", "sync": "tab:blue"}, {"uniform": "--s", "proportional": "-o"}
    for (bn, w), rows in bn_rows.items():
        ep = [r["epoch"] for r in rows]
        label = f"{bn} BN, {w} weights"
        ax1.plot(ep, [r[acc or "categorical_accuracy"] for r in rows], styles[w], color=colors[bn], ms=3, label=label)
        ax2.plot(ep, [r["val_loss" if acc else "loss"] for r in rows], styles[w], color=colors[bn], ms=3, label=label)
    ax1.set_ylabel("held-out accuracy" if acc else "training accuracy")
    ax1.set_title(f"BatchNorm, split {sizes}: accuracy")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.set_ylabel("held-out loss" if acc else "training loss")
    ax2.set_yscale("log")
    ax2.set_title("loss")
    ax2.legend(fontsize=8)
    integer_epochs(ax1, ax2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -------------------------------------------------------------------------------------------- report

def machine_lines(args, loads, total_s, nruns):
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        from mpi4py import MPI
        mpi = MPI.Get_library_version().splitlines()[0].strip()
    except Exception:  # noqa: BLE001 - informative only
        mpi = "unknown"
    ones = [l[0] for l in loads if l is not None]
    return ["Machine, as measured during these runs:",
            f"- {time.strftime('%Y-%m-%d %H:%M %Z')}; cores: {os.cpu_count()} ({usable} usable by this process); "
            f"BLAS threads per replica: {args.threads} (`--threads_per_replica {args.threads}`, "
            f"OMP/OPENBLAS/MKL_NUM_THREADS={args.threads})",
            f"- {platform.platform()}, Python {platform.python_version()}, NumPy {np.__version__}, {mpi}",
            f"- 1-minute load average at the start of each run: "
            + (f"{min(ones):.2f} to {max(ones):.2f}" if ones else "n/a")
            + f" (after the last: {fmt_load(loads[-1])}); anything near or above the cores means other processes "
              "competed with the replicas",
            f"- total wall time of the {nruns} runs: {total_s:.0f} s", ""]


def markdown_table(header, rows) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def fmt_load(load):
    return "n/a" if load is None else ", ".join(f"{x:.2f}" for x in load)


def section_a(args, runs, histories, rounds, out):
    kinds = ("equal", "static", "dynamic")
    of_kind = {k: [histories[n] for n, kk in runs.items() if kk == k] for k in kinds}
    ranks = {k: per_rank(of_kind[k]) for k in kinds}
    plot_epoch_time(out / "epoch_time.png", rounds, ranks, args.speeds, of_kind["dynamic"][0],
                    [r["b"] for r in ranks["static"]])
    P, R = len(args.speeds), len(rounds)
    S = epoch_samples(of_kind["equal"])
    L = ["## (a) Load balancing: equal, static and dynamic split (Moreno-Alvarez et al. 2020)", "",
         f"{R} round(s), each an equal (`--balance none`), a static (`--balance static --replica_speeds "
         f"{fmt_list(args.speeds)}`) and a dynamic (`--balance dynamic --rebalance_interval {args.rebalance_interval}`,"
         f" starting from the equal split) run, interleaved. Time per epoch: the median of the epochs after the "
         f"first (training only, no evaluation). **Ideal epoch time = S / (v_0 + ... + v_{{P-1}})** (P = {P}), S = {S:.0f} "
         f"samples per epoch (steps x B) and v_i = samples per compute-second of replica i measured in the same "
         f"round's equal-split run (compute = forward + backward, padded by the emulation to b t0 / f_i): every "
         f"replica busy all the time, zero communication and update cost. Medians are over the rounds.", ""]
    rows = []
    for i, r in enumerate(rounds):
        rows.append([str(i + 1), f"{r['ideal']:.3f}"] + [c for k in kinds for c in (f"{r[k]:.3f}", f"{r[k] / r['ideal']:.3f}")])
    med = lambda f: float(np.median([f(r) for r in rounds]))   # noqa: E731
    rows.append(["**median**", f"{med(lambda r: r['ideal']):.3f}"]
                + [c for k in kinds for c in (f"{med(lambda r: r[k]):.3f}", f"**{med(lambda r: r[k] / r['ideal']):.3f}**")])
    L += markdown_table(["round", "ideal (s)", "equal (s)", "equal / ideal", "static (s)", "static / ideal",
                         "dynamic (s)", "dynamic / ideal"], rows)

    L += ["", "Measured speed ratios v_i / v_fastest (equal-split runs) next to the emulated f_i / max f:", ""]
    ratios = [r["v"] / r["v"].max() for r in rounds]
    rows = [[str(i), f"{f / max(args.speeds):.3f}"] + [f"{q[i]:.3f}" for q in ratios]
            + [f"**{np.median([q[i] for q in ratios]):.3f}**", f"{np.median([r['v'][i] for r in rounds]):.0f}"]
            for i, f in enumerate(args.speeds)]
    L += markdown_table(["rank", "emulated f_i / max f", *(f"measured, round {k + 1}" for k in range(R)),
                         "measured, median", "v_i (samples/s), median"], rows)

    L += ["", "Per split, pooled over the rounds (b_i: the split in force at the end of the run; medians over "
              "the steady epochs; wait = time in the gradient allreduce, mostly waiting for the slowest replica):", ""]
    v_all = speeds_of(of_kind["equal"])
    # what the epoch would take if the slowest replica's compute were all there is
    pred = {k: max(r["samples"] / vi for r, vi in zip(ranks[k], v_all)) for k in kinds}
    rows = []
    for k in kinds:
        rows.append([k, str([r["b"] for r in ranks[k]]), " / ".join(f"{r['compute_s']:.2f}" for r in ranks[k]),
                     " / ".join(f"{r['wait_s']:.2f}" for r in ranks[k]), f"{pred[k]:.3f}",
                     f"{best_epoch_time(of_kind[k]):.3f}", f"{S / epoch_time(of_kind[k]):.0f}"])
    L += markdown_table(["split", "b_i", "compute s per rank", "wait s per rank",
                         "compute-only prediction max_i(S_i / v_i) (s)", "best epoch (s)", "samples/s"], rows)
    L += ["", f"- epoch time / equal, median over rounds: static {med(lambda r: r['static'] / r['equal']):.3f}, "
              f"dynamic {med(lambda r: r['dynamic'] / r['equal']):.3f}; ideal / equal "
              f"{med(lambda r: r['ideal'] / r['equal']):.3f} measured, {P * min(args.speeds) / sum(args.speeds):.3f} "
              f"in theory (P min(f) / sum(f), when compute is all there is)",
          f"- the equal split spends {max(0.0, epoch_time(of_kind['equal']) - pred['equal']):.3f} s per epoch outside the slowest "
            f"replica's compute (allreduce, update, bookkeeping), a cost a better split does not remove",
          f"- dynamic: first epoch (which starts from the equal split) "
          f"{np.median([h[0]['time_s'] for h in of_kind['dynamic']]):.3f} s against static's "
          f"{np.median([h[0]['time_s'] for h in of_kind['static']]):.3f} s (medians over rounds)", ""]
    return L


def section_b(args, runs, histories, out):
    un_rows, st_rows = histories["uniform"], histories["static"]
    sizes = [int(st_rows[-1][f"rank{i}_b"]) for i in range(nranks_of(st_rows))]
    plot_weighting(out / "weighting.png", un_rows, st_rows, args.speeds, sizes)
    L = ["## (b) Gradient weighting (Moreno-Alvarez et al. 2022)", "",
         f"Both runs use the static split {sizes}. Uniform weights w_i = 1/P give each sample of replica i the "
         f"weight 1/(P b_i), so the slow replica's samples count {max(sizes) / min(sizes):.1f}x more than the fast "
         f"one's; proportional weights w_i = b_i/B give the exact gradient of the mean loss over the global batch "
         f"(the same weights as the equal-split run: its losses equal these to rounding).", ""]
    has_val = "val_loss" in st_rows[0]
    header = ["epoch", "train loss uniform", "train loss proportional"]
    if has_val:
        header += ["held-out loss uniform", "held-out loss proportional", "held-out acc uniform",
                   "held-out acc proportional"]
    rows = []
    for u, p in zip(un_rows, st_rows):
        row = [u["epoch"], f"{u['loss']:.4f}", f"{p['loss']:.4f}"]
        if has_val:
            row += [f"{u['val_loss']:.4f}", f"{p['val_loss']:.4f}", f"{u['val_categorical_accuracy']:.4f}",
                    f"{p['val_categorical_accuracy']:.4f}"]
        rows.append(row)
    L += markdown_table(header, rows) + [""]
    if has_val:
        best_u = max(r["val_categorical_accuracy"] for r in un_rows)
        best_p = max(r["val_categorical_accuracy"] for r in st_rows)
        L += [f"- final held-out accuracy: uniform {un_rows[-1]['val_categorical_accuracy']:.4f}, proportional "
              f"{st_rows[-1]['val_categorical_accuracy']:.4f} (best: {best_u:.4f} / {best_p:.4f}); final training "
              f"loss: uniform {un_rows[-1]['loss']:.4f}, proportional {st_rows[-1]['loss']:.4f}"]
    if "equal" in histories:
        same = max(abs(a["loss"] - b["loss"]) for a, b in zip(histories["equal"], st_rows))
        L += [f"- check: largest |training loss difference| between the equal-split and static-split runs "
              f"(both proportional weights, same global batches): {same:.2e}"]
    repeats = [histories[n] for n, k in runs.items() if k == "static" and n != "static"]
    if repeats:
        again = max(abs(a["loss"] - b["loss"]) for rows in repeats for a, b in zip(st_rows, rows))
        L += [f"- check: largest |training loss difference| between rounds of the static run: {again:.2e}"]
    return L + [""]


def section_c(args, histories, out):
    bn_rows = {(bn, w): histories[bn_kind(bn, w)] for bn in BN_MODES for w in WEIGHTINGS}
    first = bn_rows[("sync", "proportional")]
    sizes = [int(first[-1][f"rank{i}_b"]) for i in range(nranks_of(first))]
    plot_batchnorm(out / "batchnorm.png", bn_rows, sizes)
    has_val = "val_loss" in first[0]
    L = ["## (c) BatchNorm under a skewed split", "",
         f"Model `{BN_MODEL.relative_to(REPO)}` (a small residual net: conv-BN-ReLU, two residual blocks with BN "
         f"inside, global average pool, FC), static split {sizes} from `--replica_speeds {fmt_list(args.bn_speeds)}`, "
         f"{args.bn_epochs} epochs, SGD learning rate {args.bn_learning_rate:g} x {len(sizes)}. **Local** BatchNorm: "
         f"each replica normalizes with its own b_i samples' statistics (running statistics averaged with weights "
         f"b_i/B after each epoch); **synced** (`--sync_batchnorm true`): the global batch's statistics, summed "
         f"over the replicas with their counts b_i. "
         + ("Speeds emulated (`--emulate_speeds`): the compute that the deadline pads holds synchronized "
            "BatchNorm's collectives and the waits inside them, so the times are not a slow device's."
            if args.bn_emulate else
            "Without `--emulate_speeds`: the split is fixed by `--replica_speeds`, so losses and accuracies are "
            "the same with it, but the compute that it pads would hold synchronized BatchNorm's collectives and "
            "the waits inside them. Both replicas run at this machine's speed, so an epoch takes the larger "
            "replica's compute plus the collectives; `scripts/bench_sync_batchnorm.py` times synchronization "
            "more carefully.")
         + " One run of each.", ""]
    order = [(bn, w) for bn in BN_MODES for w in WEIGHTINGS]
    acc_key = "val_categorical_accuracy" if has_val else "categorical_accuracy"
    loss_key = "val_loss" if has_val else "loss"
    where = "held-out" if has_val else "training"
    header = ["epoch"] + [f"{what}: {bn}, {w}" for what in ("acc", "loss") for bn, w in order]
    rows = [[e + 1] + [f"{bn_rows[k][e][acc_key]:.4f}" for k in order] + [f"{bn_rows[k][e][loss_key]:.4f}" for k in order]
            for e in range(min(len(r) for r in bn_rows.values()))]
    L += [f"{where.capitalize()} accuracy and loss per epoch (BatchNorm local or sync, weights uniform or "
          f"proportional):", ""] + markdown_table(header, rows) + [""]
    rows = []
    summary = {k: bn_summary(bn_rows[k], acc_key, loss_key) for k in order}
    for (bn, w), s in summary.items():
        rows.append([bn_kind(bn, w), bn, w, f"{s['acc']:.4f}", f"{s['last_acc']:.4f}", f"{s['best_acc']:.4f}",
                     f"{s['val_loss']:.4f}", f"{s['loss']:.4f}", f"{s['time_s']:.3f}", f"{s['best_s']:.3f}"])
    last = summary[order[0]]["last"]
    L += markdown_table(["run", "BatchNorm", "weights", f"final {where} acc", f"mean {where} acc, last {last} epochs",
                         f"best {where} acc", f"final {where} loss", "final training loss",
                         "time/epoch, median after epoch 1 (s)", "best epoch (s)"], rows)
    means = [x["last_acc"] for x in summary.values()]
    moves = [abs(b[acc_key] - a[acc_key]) for rows in bn_rows.values() for a, b in zip(rows[2:], rows[3:])]
    L += ["", f"- the four runs' mean {where} accuracy over the last {last} epochs spans {max(means) - min(means):.4f}"
              + (f"; within one run, consecutive epochs after the third differ by up to {max(moves):.4f} (median "
                 f"{np.median(moves):.4f}): differences between runs of about that size are this noise" if moves else "")]
    for w in WEIGHTINGS:
        local, sync = (summary[(bn, w)] for bn in BN_MODES)
        L += [f"- time cost of synchronization, {w} weights: {sync['time_s'] - local['time_s']:+.3f} s per epoch "
              f"({sync['time_s'] / local['time_s']:.3f}x local) by the medians, {sync['best_s'] - local['best_s']:+.3f} s "
              f"({sync['best_s'] / local['best_s']:.3f}x) by the best epochs, the least disturbed by other processes; "
              f"one run each"]
    return L + [""]


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
    ap.add_argument("--out", default="out/heterogeneity", help="output folder (relative to the repository)")
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


def run_all(args, runs, kinds, data_flags, out, env):
    """Every planned run; returns the commands, histories, wall seconds and load averages at each start.
    Progress as the launcher shows it: a tqdm bar on a terminal, a plain line now and then in a log."""
    from pydtnn.training.progress import progress
    commands, histories, wall, loads = {}, {}, {}, []
    with progress(total=len(runs), desc="runs", unit="run") as bar:
        for name, kind in runs.items():
            bar.set_postfix_str(f"{name}: {kinds[kind].what}")
            history = out / f"history_{name}.json"
            if history.exists():
                history.unlink()
            commands[name] = launcher_command(args, data_flags, history, kinds[kind])
            loads.append(os.getloadavg() if hasattr(os, "getloadavg") else None)
            wall[name] = run_one(commands[name], out / "logs" / f"{name}.log", env, args.timeout)
            histories[name] = load_history(history)
            bar.update(1)
    loads.append(os.getloadavg() if hasattr(os, "getloadavg") else None)
    return commands, histories, wall, loads


def main(argv=None):
    ap, args = parse_args(argv)
    notes = []
    data_flags = data_flags_for(ap, args, notes)
    out = Path(args.out)
    if not out.is_absolute():
        out = REPO / out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    env["PYTHONUNBUFFERED"] = "1"

    kinds = run_kinds(args)
    runs = plan_runs(args.parts, args.repeats)
    t_all = time.monotonic()
    commands, histories, wall, loads = run_all(args, runs, kinds, data_flags, out, env)
    total_s = time.monotonic() - t_all

    B = args.global_batch_size
    L = ["# Heterogeneous data parallelism: load balancing, gradient weighting and BatchNorm", ""]
    L += [f"Parts run: {', '.join(f'({p})' for p in args.parts)}. Global batch B = {B}, "
          + (f"real MNIST test set `{args.data}` (validation split {args.validation_split:g})"
             if args.data != "synthetic" else "synthetic data")
          + f", seed {args.seed}; the global batch is fixed (`--global_batch_size`), so the launcher trains at the "
            f"given learning rate, unscaled."
          + (f" (a)/(b): emulated speeds {fmt_list(args.speeds)} (`--emulate_speeds`) on {len(args.speeds)} MPI "
             f"ranks, model `{args.model}`, {args.epochs} epochs, SGD learning rate {args.learning_rate:g}."
             if {"a", "b"} & set(args.parts) else "")
          + (" **Quick smoke run** (10 steps per epoch): the numbers mean little." if args.quick else ""), ""]
    L += ["Speed emulation (`--emulate_speeds`, a deadline model, `pydtnn/parallel/emulation.py`): replica i's "
          "compute of b samples is padded to b t0 / f_i (f_i relative to the fastest), t0 the time per sample of "
          "the full-speed replicas (the mean of their last 16 steps less the slowest; before the first step, its own from 5 "
          "calibration passes), busy-waiting where the cores hold every rank's threads. It models compute only: "
          "memory and communication are this machine's.",
          ""]
    L += machine_lines(args, loads, total_s, len(runs))
    L += [f"- note: {n}" for n in notes] + ([""] if notes else [])
    plots = []
    if "a" in args.parts:
        rounds = balance_rounds(histories, runs)
        L += section_a(args, runs, histories, rounds, out)
        plots.append("epoch_time")
    if "b" in args.parts:
        L += section_b(args, runs, histories, out)
        plots.append("weighting")
    if "c" in args.parts:
        L += section_c(args, histories, out)
        plots.append("batchnorm")
    L += ["## Plots", ""] + [f"![{p}]({p}.png)\n" for p in plots]
    L += ["## Commands", "", "Environment of every run: " +
          " ".join(f"{k}={env[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")) +
          f"; working directory `{REPO}`. Logs in `logs/`, histories in `history_*.json`.", "",
          "```", "python " + shlex.join(["scripts/heterogeneity_experiment.py", *(argv if argv is not None
                                                                                  else sys.argv[1:])]), "```", ""]
    for name, cmd in commands.items():
        L += [f"{name} ({kinds[runs[name]].what}, {wall[name]:.0f} s):", "", "```", as_typed(cmd), "```", ""]
    (out / "results.md").write_text("\n".join(L))
    print(f"wrote {out / 'results.md'} and {', '.join(p + '.png' for p in plots)} in {total_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
