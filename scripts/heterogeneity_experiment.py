#!/usr/bin/env python
"""Heterogeneous data parallelism on one machine: the two comparisons of Moreno-Alvarez et al.

    python scripts/heterogeneity_experiment.py                 # speeds 1,0.5 on 2 ranks, real MNIST
    python scripts/heterogeneity_experiment.py --quick         # a tiny smoke run (seconds)
    python scripts/heterogeneity_experiment.py --speeds 1,0.5,0.25 --epochs 10

Every run is the real launcher (scripts/pydtnn_benchmark.py) under ``mpiexec -n P python -m mpi4py``
with ``--parallel data --emulate_speeds <speeds>``: replica i sleeps after its compute for the time it
would lose running at f_i/max(f) of its speed, so with one BLAS thread per replica and no more replicas
than cores, the replicas' speeds are in the ratio of the factors. The per-epoch JSON histories of the
runs give every number reported.

(a) Static load balancing (J. Supercomputing 2020): the equal split (``--balance none``) against the split
    proportional to the speeds (``--balance static --replica_speeds <speeds>``), both with proportional
    gradient weights. Time per epoch = median over the epochs after the first. The ideal epoch time is
    N / sum_i v_i, with v_i the samples/s that replica i computes (b_i / compute time, measured in the
    equal-split run; compute time = forward + backward + the emulation's sleep).
(b) Gradient weighting (J. Supercomputing 2022): uniform weights w_i = 1/P against proportional weights
    w_i = b_i/B, both with the proportional split: training loss and held-out accuracy per epoch.

Writes ``results.md``, ``epoch_time.png``, ``weighting.png``, the histories and the runs' logs into --out.
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
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = REPO / "scripts" / "pydtnn_benchmark.py"
DEFAULT_DATA = REPO / "tests" / "data" / "mnist-t10k"


# ------------------------------------------------------------------------------------------------ MPI

def mpiexec_prefix(nprocs: int) -> list[str]:
    """`mpiexec [...] -n P python -m mpi4py` (the launcher's path is appended by the caller)."""
    from pydtnn.errors import ConfigError
    from pydtnn.parallel.mpirun import mpi_command
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


def fmt_list(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def launcher_command(args, data_flags, history, extra) -> list[str]:
    cmd = mpiexec_prefix(len(args.speeds)) + [str(LAUNCHER)]
    cmd += ["--model", args.model, *data_flags, "--parallel", "data",
            "--global_batch_size", str(args.global_batch_size), "--num_epochs", str(args.epochs),
            "--emulate_speeds", fmt_list(args.speeds), "--threads_per_replica", str(args.threads),
            "--learning_rate", f"{args.learning_rate:g}", "--seed", str(args.seed),
            "--lr_schedulers", "", "--progress_bar", "false", "--history_file", str(history)]
    if args.steps_per_epoch:
        cmd += ["--steps_per_epoch", str(args.steps_per_epoch)]
    return cmd + extra


def run_one(cmd, log_path, env, timeout) -> float:
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n\n")
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
    """The epochs after the first (the first pays for warm-up) of every repeat, pooled."""
    return [r for rows in runs for r in (rows[1:] if len(rows) > 1 else rows)]


def per_rank(runs, nranks):
    """Median over the steady epochs of each rank's b_i, samples, compute and wait seconds per epoch."""
    out = []
    for i in range(nranks):
        b = int(runs[0][-1][f"rank{i}_b"])
        comp = float(np.median([r[f"rank{i}_compute_s"] for r in steady(runs)]))
        wait = float(np.median([r[f"rank{i}_wait_s"] for r in steady(runs)]))
        out.append({"b": b, "compute_s": comp, "wait_s": wait})
    n = epoch_samples(runs[0])
    total_b = sum(r["b"] for r in out)
    for r in out:
        r["samples"] = n * r["b"] / total_b      # the split holds for every step of a full epoch
        r["speed"] = r["samples"] / r["compute_s"] if r["compute_s"] > 0 else float("nan")
    return out


def epoch_samples(rows) -> int:
    r = rows[-1]
    return int(round(r["samples_per_s"] * r["time_s"]))


def epoch_time(runs) -> float:
    return float(np.median([r["time_s"] for r in steady(runs)]))


def best_epoch_time(runs) -> float:
    """The fastest steady epoch: other processes on the machine can only add time, so the minimum is the
    estimate least disturbed by them."""
    return float(np.min([r["time_s"] for r in steady(runs)]))


# ---------------------------------------------------------------------------------------------- plots

def plot_epoch_time(path, equal, prop, ideal_s, ranks_equal, ranks_prop, speeds):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.4]})
    names = ["equal split", "proportional split", "ideal\nN / sum(v_i)"]
    values = [equal, prop, ideal_s]
    bars = ax1.bar(names, values, color=["tab:red", "tab:green", "tab:gray"])
    for bar, v in zip(bars, values):
        ax1.text(bar.get_x() + bar.get_width() / 2, v, f"{v:.2f} s\n({v / ideal_s:.2f}x ideal)",
                 ha="center", va="bottom", fontsize=8)
    ax1.set_ylabel("time per epoch (s, median after epoch 1)")
    ax1.set_ylim(0, max(values) * 1.3)
    ax1.set_title(f"epoch time, speeds {fmt_list(speeds)}")

    P = len(ranks_equal)
    width = 0.35
    xs = np.arange(P)
    for k, (label, ranks, color) in enumerate((("equal", ranks_equal, "tab:red"),
                                              ("proportional", ranks_prop, "tab:green"))):
        x = xs + (k - 0.5) * width
        comp = [r["compute_s"] for r in ranks]
        wait = [r["wait_s"] for r in ranks]
        ax2.bar(x, comp, width, color=color, label=f"{label}: compute")
        ax2.bar(x, wait, width, bottom=comp, color=color, alpha=0.35, hatch="//", label=f"{label}: wait")
        for xi, r in zip(x, ranks):
            ax2.text(xi, r["compute_s"] + r["wait_s"], f"b={r['b']}", ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(xs, [f"rank {i}\n(speed {s:g})" for i, s in enumerate(speeds)])
    ax2.set_ylabel("seconds per epoch (median)")
    ax2.set_title("per replica: compute (solid) and wait in allreduce (hatched)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_weighting(path, uni, prop, speeds, sizes):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for rows, label, color in ((uni, "uniform w_i = 1/P", "tab:orange"),
                               (prop, "proportional w_i = b_i/B", "tab:blue")):
        ep = [r["epoch"] for r in rows]
        ax1.plot(ep, [r["loss"] for r in rows], "-o", color=color, ms=3, label=f"{label}: training")
        if "val_loss" in rows[0]:
            ax1.plot(ep, [r["val_loss"] for r in rows], "--s", color=color, ms=3, label=f"{label}: held out")
        key = "val_categorical_accuracy" if "val_categorical_accuracy" in rows[0] else "categorical_accuracy"
        ax2.plot(ep, [r[key] for r in rows], "-o", color=color, ms=3, label=label)
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("categorical cross-entropy")
    ax1.set_yscale("log")
    ax1.set_title(f"loss, split {sizes} (speeds {fmt_list(speeds)})")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("held-out accuracy" if "val_categorical_accuracy" in prop[0] else "training accuracy")
    ax2.set_title("accuracy")
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    from matplotlib.ticker import MaxNLocator
    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -------------------------------------------------------------------------------------------- report

def machine_lines(args):
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        from mpi4py import MPI
        mpi = MPI.Get_library_version().splitlines()[0].strip()
    except Exception:  # noqa: BLE001 - informative only
        mpi = "unknown"
    return [f"- cores: {os.cpu_count()} ({usable} usable by this process); replicas: {len(args.speeds)}; "
            f"BLAS threads per replica: {args.threads} (`--threads_per_replica {args.threads}`, "
            f"OMP/OPENBLAS/MKL_NUM_THREADS={args.threads})",
            f"- {platform.platform()}, Python {platform.python_version()}, NumPy {np.__version__}, {mpi}"]


def markdown_table(header, rows) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--speeds", type=parse_speeds, default=parse_speeds("1,0.5"),
                    help="emulated relative speeds f_i, one per replica (P = their count)")
    ap.add_argument("--global_batch_size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=None, help="epochs per run (default 12; --quick: 3)")
    ap.add_argument("--model", default="simplecnn")
    ap.add_argument("--data", default=None,
                    help=f"MNIST folder (IDX gz files), or 'synthetic' (default: {DEFAULT_DATA}, the real MNIST "
                         f"test set; 8,000 train / 2,000 held out with --validation_split 0.2)")
    ap.add_argument("--validation_split", type=float, default=0.2)
    ap.add_argument("--learning_rate", type=float, default=0.01,
                    help="the launcher's --learning_rate (SGD, scaled by P as upstream)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads per replica")
    ap.add_argument("--out", default="out/heterogeneity", help="output folder (relative to the repository)")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run: 3 epochs of 10 steps")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs of each of the two timed configurations (default 3; --quick: 1)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds allowed per run")
    args = ap.parse_args(argv)
    if args.epochs is None:
        args.epochs = 3 if args.quick else 12
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.epochs < 2:
        ap.error("--epochs must be >= 2 (the first epoch is left out of the timings)")
    args.steps_per_epoch = 10 if args.quick else 0
    P = len(args.speeds)
    if args.global_batch_size < P:
        ap.error(f"--global_batch_size {args.global_batch_size} is smaller than the {P} replicas")

    notes = []
    if args.data is None:
        args.data = str(DEFAULT_DATA.resolve())
        if not Path(args.data).is_dir():
            notes.append(f"the default MNIST folder {args.data} is missing: synthetic data used instead")
            args.data = "synthetic"
    if args.data == "synthetic":
        data_flags = ["--dataset", "synthetic", "--synthetic_samples", "2000" if args.quick else "10000",
                      "--validation_split", f"{args.validation_split:g}"]
    else:
        if not Path(args.data).is_dir():
            ap.error(f"--data {args.data}: no such folder")
        data_flags = ["--dataset", "mnist", "--dataset_train_path", str(Path(args.data).resolve()),
                      "--validation_split", f"{args.validation_split:g}"]

    out = Path(args.out)
    if not out.is_absolute():
        out = REPO / out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(args.threads)
    env["PYTHONUNBUFFERED"] = "1"

    speeds = fmt_list(args.speeds)
    kinds = {  # kind: (description, launcher flags)
        "equal": ("equal split, proportional weights", ["--balance", "none"]),
        "proportional": ("proportional split, proportional weights",
                         ["--balance", "static", "--replica_speeds", speeds]),
        "uniform": ("proportional split, uniform weights",
                    ["--balance", "static", "--replica_speeds", speeds, "--gradient_weighting", "uniform"]),
    }
    # the timing pair is repeated (interleaved, so that drift in the machine's load hits both alike);
    # the uniform run sits between the repeats
    runs = {"equal": "equal", "proportional": "proportional", "uniform": "uniform"}
    for k in range(2, args.repeats + 1):
        runs[f"equal{k}"], runs[f"proportional{k}"] = "equal", "proportional"
    from tqdm import tqdm

    commands, histories, wall = {}, {}, {}
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    t_all = time.monotonic()
    with tqdm(total=len(runs), desc="runs", unit="run", file=sys.stderr) as bar:
        for name, kind in runs.items():
            what, extra = kinds[kind]
            bar.set_postfix_str(f"{name}: {what}")
            history = out / f"history_{name}.json"
            if history.exists():
                history.unlink()
            cmd = launcher_command(args, data_flags, history, extra)
            commands[name] = cmd
            wall[name] = run_one(cmd, out / "logs" / f"{name}.log", env, args.timeout)
            histories[name] = load_history(history)
            bar.update(1)
    total_s = time.monotonic() - t_all
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None

    # (a) load balancing
    eq_runs = [histories[n] for n, k in runs.items() if k == "equal"]
    pr_runs = [histories[n] for n, k in runs.items() if k == "proportional"]
    eq_rows, pr_rows, un_rows = eq_runs[0], pr_runs[0], histories["uniform"]
    t_eq, t_pr = epoch_time(eq_runs), epoch_time(pr_runs)
    r_eq, r_pr = per_rank(eq_runs, P), per_rank(pr_runs, P)
    per_repeat = [epoch_time([p]) / epoch_time([e]) for e, p in zip(eq_runs, pr_runs)]
    N = epoch_samples(eq_rows)
    B = args.global_batch_size
    v = np.array([r["speed"] for r in r_eq])               # measured samples/s of each replica (equal run)
    ideal_s = N / v.sum()
    fastest = int(np.argmax(args.speeds))
    v_emul = v[fastest] * np.asarray(args.speeds) / max(args.speeds)
    ideal_emul_s = N / v_emul.sum()
    pred_eq = max(r["samples"] / vi for r, vi in zip(r_eq, v))
    pred_pr = max(r["samples"] / vi for r, vi in zip(r_pr, v))
    ratio = t_pr / t_eq
    best_eq, best_pr = best_epoch_time(eq_runs), best_epoch_time(pr_runs)
    overhead_s = max(0.0, t_eq - pred_eq)   # per-epoch time that is not the slowest replica's compute
    # equal split: step compute = (B/P) / v_min; ideal: B / sum(v)  ->  ratio = P v_min / sum(v)
    theory_ratio = P * min(args.speeds) / sum(args.speeds)

    plot_epoch_time(out / "epoch_time.png", t_eq, t_pr, ideal_s, r_eq, r_pr, args.speeds)
    sizes_pr = [r["b"] for r in r_pr]
    plot_weighting(out / "weighting.png", un_rows, pr_rows, args.speeds, sizes_pr)

    # results.md
    L = ["# Heterogeneous data parallelism: load balancing and gradient weighting", ""]
    L += [f"Emulated replica speeds {speeds} (`--emulate_speeds {speeds}`) on {P} MPI ranks, model `{args.model}`, "
          f"global batch B = {B}, {args.epochs} epochs of {N} training samples"
          + (f" (real MNIST test set `{args.data}`, validation split {args.validation_split:g})"
             if args.data != "synthetic" else " (synthetic data)")
          + f", SGD learning rate {args.learning_rate:g} x {P} (the launcher's scaling), seed {args.seed}."
          + (" **Quick smoke run** (10 steps per epoch): the numbers mean little." if args.quick else ""), ""]
    L += ["Machine:", *machine_lines(args),
          f"- load average before/after: {fmt_load(load_before)} / {fmt_load(load_after)} "
          "(anything above the number of replicas means other processes competed for the cores)",
          f"- total wall time of the {len(runs)} runs: {total_s:.0f} s", ""]
    L += [f"- note: {n}" for n in notes] + ([""] if notes else [])

    L += ["## (a) Static load balancing (Moreno-Alvarez et al. 2020)", "",
          f"Time per epoch is the median of the epochs after the first (training only, no evaluation), pooled "
          f"over {args.repeats} interleaved repeat(s) of each run. "
          "Compute = forward + backward (+ the emulation's sleep); wait = time in the gradient allreduce, "
          "mostly waiting for the slowest replica. Speeds v_i = samples / compute seconds of replica i, "
          "measured in the equal-split run; ideal epoch time = N / sum(v_i) (every replica busy all the time, "
          "zero communication and update cost).", ""]
    rows = []
    for label, t, best, ranks in (("equal (`--balance none`)", t_eq, best_eq, r_eq),
                                  ("proportional (`--balance static`)", t_pr, best_pr, r_pr)):
        rows.append([label, str([r["b"] for r in ranks]), f"{t:.3f}", f"{t / ideal_s:.2f}", f"{best:.3f}",
                     " / ".join(f"{r['compute_s']:.2f}" for r in ranks),
                     " / ".join(f"{r['wait_s']:.2f}" for r in ranks),
                     f"{N / t:.0f}"])
    rows.append(["ideal N / sum(v_i)", "-", f"{ideal_s:.3f}", "1.00", "-", "-", "-", f"{N / ideal_s:.0f}"])
    L += markdown_table(["split", "b_i", "time/epoch, median (s)", "median / ideal", "best epoch (s)",
                         "compute s per rank", "wait s per rank", "samples/s"], rows)
    L += ["", f"- **epoch time proportional / equal = {ratio:.3f}**"
              + (f" (per repeat: {', '.join(f'{x:.3f}' for x in per_repeat)})" if len(per_repeat) > 1 else "")
              + f"; with the best epochs {best_pr / best_eq:.3f}; ideal / equal = {ideal_s / t_eq:.3f} measured, "
              f"{theory_ratio:.3f} in theory "
              f"(P * min(f) / sum(f), when compute is all there is)",
          f"- measured replica speeds v_i (samples/s, equal run): {', '.join(f'{x:.0f}' for x in v)} "
          f"(ratio to the fastest {', '.join(f'{x / v.max():.2f}' for x in v)}; emulated {speeds}); "
          f"ideal from the emulated factors (v_fastest x f_i / max f): {ideal_emul_s:.3f} s",
          f"- predicted compute-only epoch time, max_i(samples_i / v_i): equal {pred_eq:.3f} s, "
          f"proportional {pred_pr:.3f} s; the rest of the measured time is the allreduce itself, the optimizer "
          f"update and the per-step bookkeeping",
          f"- the equal run spends {overhead_s:.3f} s per epoch outside the slowest replica's compute; that cost "
          f"does not shrink with a better split, so a realistic bound is ideal + {overhead_s:.3f} s = "
          f"{ideal_s + overhead_s:.3f} s, i.e. proportional / equal >= {(ideal_s + overhead_s) / t_eq:.3f} "
          f"(measured {ratio:.3f})", ""]

    L += ["## (b) Gradient weighting (Moreno-Alvarez et al. 2022)", "",
          f"Both runs use the proportional split {sizes_pr}. Uniform weights w_i = 1/P give each sample of "
          f"replica i the weight 1/(P b_i), so the slow replica's samples count "
          f"{max(sizes_pr) / min(sizes_pr):.1f}x more than the fast one's; proportional weights w_i = b_i/B give "
          f"the exact gradient of the mean loss over the global batch (the same weights as the equal-split run: "
          f"its losses equal these to rounding).", ""]
    has_val = "val_loss" in pr_rows[0]
    header = ["epoch", "train loss uniform", "train loss proportional"]
    if has_val:
        header += ["held-out loss uniform", "held-out loss proportional", "held-out acc uniform",
                   "held-out acc proportional"]
    rows = []
    for u, p in zip(un_rows, pr_rows):
        row = [u["epoch"], f"{u['loss']:.4f}", f"{p['loss']:.4f}"]
        if has_val:
            row += [f"{u['val_loss']:.4f}", f"{p['val_loss']:.4f}", f"{u['val_categorical_accuracy']:.4f}",
                    f"{p['val_categorical_accuracy']:.4f}"]
        rows.append(row)
    L += markdown_table(header, rows)
    if has_val:
        best_u = max(r["val_categorical_accuracy"] for r in un_rows)
        best_p = max(r["val_categorical_accuracy"] for r in pr_rows)
        L += ["", f"- final held-out accuracy: uniform {un_rows[-1]['val_categorical_accuracy']:.4f}, proportional "
                  f"{pr_rows[-1]['val_categorical_accuracy']:.4f} (best: {best_u:.4f} / {best_p:.4f}); final training "
                  f"loss: uniform {un_rows[-1]['loss']:.4f}, proportional {pr_rows[-1]['loss']:.4f}"]
    same = max(abs(a["loss"] - b["loss"]) for a, b in zip(eq_rows, pr_rows))
    L += [f"- check: largest |training loss difference| between the equal-split and proportional-split runs "
          f"(both proportional weights, same global batches): {same:.2e}", ""]
    if len(pr_runs) > 1:
        again = max(abs(a["loss"] - b["loss"]) for rows in pr_runs[1:] for a, b in zip(pr_rows, rows))
        L[-1:-1] = [f"- check: largest |training loss difference| between repeats of the proportional run: "
                    f"{again:.2e}"]

    L += ["## Plots", "", "![epoch time](epoch_time.png)", "", "![weighting](weighting.png)", ""]
    L += ["## Commands", "", "Environment of every run: " +
          " ".join(f"{k}={env[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")) +
          f"; working directory `{REPO}`. Logs in `logs/`, histories in `history_*.json`.", "",
          "```", "python " + shlex.join(["scripts/heterogeneity_experiment.py", *(argv or sys.argv[1:])]), "```", ""]
    for name, cmd in commands.items():
        L += [f"{name} ({kinds[runs[name]][0]}, {wall[name]:.0f} s):", "", "```", shlex.join(cmd), "```", ""]
    (out / "results.md").write_text("\n".join(L))
    print("\n".join(L[:2]))
    print(f"proportional/equal epoch time: {ratio:.3f} (equal {t_eq:.3f} s, proportional {t_pr:.3f} s, "
          f"ideal {ideal_s:.3f} s; best epochs: {best_pr / best_eq:.3f})")
    if has_val:
        print("held-out accuracy per epoch, uniform:      "
              + " ".join(f"{r['val_categorical_accuracy']:.4f}" for r in un_rows))
        print("held-out accuracy per epoch, proportional: "
              + " ".join(f"{r['val_categorical_accuracy']:.4f}" for r in pr_rows))
    print(f"wrote {out / 'results.md'}, {out / 'epoch_time.png'}, {out / 'weighting.png'} in {total_s:.0f} s")
    return 0


def fmt_load(load):
    return "n/a" if load is None else ", ".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":
    sys.exit(main())
