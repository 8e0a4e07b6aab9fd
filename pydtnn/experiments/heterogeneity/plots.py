"""The report's plots (PNG, matplotlib's Agg backend): epoch time per split, gradient weighting, BatchNorm."""
from __future__ import annotations

import numpy as np

from pydtnn.experiments.heterogeneity.runs import fmt_list

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
