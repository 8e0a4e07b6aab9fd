"""The numbers of the report, read from the runs' per-epoch JSON histories: times per epoch, samples,
each replica's measured speed, compute and wait, and the BatchNorm runs' summaries."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


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
