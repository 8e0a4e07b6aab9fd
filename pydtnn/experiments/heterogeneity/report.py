"""results.md: the machine the runs had, a section of tables (and a plot) per part, and the commands."""
from __future__ import annotations

import os
import platform
import shlex
import time

import numpy as np

from pydtnn.experiments.heterogeneity.history import (best_epoch_time, bn_summary, epoch_samples, epoch_time,
                                                      nranks_of, per_rank, speeds_of)
from pydtnn.experiments.heterogeneity.plots import plot_batchnorm, plot_epoch_time, plot_weighting
from pydtnn.experiments.heterogeneity.runs import (BN_MODEL, BN_MODES, REPO, WEIGHTINGS, as_typed, bn_kind,
                                                   fmt_list)


def introduction(args, loads, total_s, nruns, notes) -> list[str]:
    """The title, what was run on which data, the speed emulation, the machine and any notes."""
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
    L += machine_lines(args, loads, total_s, nruns)
    return L + [f"- note: {n}" for n in notes] + ([""] if notes else [])


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
    ones = [load[0] for load in loads if load is not None]
    return ["Machine, as measured during these runs:",
            f"- {time.strftime('%Y-%m-%d %H:%M %Z')}; cores: {os.cpu_count()} ({usable} usable by this process); "
            f"BLAS threads per replica: {args.threads} (`--threads_per_replica {args.threads}`, "
            f"OMP/OPENBLAS/MKL_NUM_THREADS={args.threads})",
            f"- {platform.platform()}, Python {platform.python_version()}, NumPy {np.__version__}, {mpi}",
            "- 1-minute load average at the start of each run: "
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
            "replica's compute plus the collectives; `scripts/bench/bench_sync_batchnorm.py` times synchronization "
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


def commands_section(argv, env, commands, kinds, runs, wall) -> list[str]:
    """The experiment's own command line, then each run's launcher command as typed in the repository."""
    L = ["## Commands", "", "Environment of every run: " +
         " ".join(f"{k}={env[k]}" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")) +
         f"; working directory `{REPO}`. Logs in `logs/`, histories in `history_*.json`.", "",
         "```", "python " + shlex.join(["scripts/experiments/heterogeneity_experiment.py", *argv]), "```", ""]
    for name, cmd in commands.items():
        L += [f"{name} ({kinds[runs[name]].what}, {wall[name]:.0f} s):", "", "```", as_typed(cmd), "```", ""]
    return L
