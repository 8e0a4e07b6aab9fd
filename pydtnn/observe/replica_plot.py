"""--plots_dir DIR: the per-replica picture of a run, written by the launcher at its end.

Three panels over the global steps, one line per replica: its local batch b_i, its compute and its wait
(milliseconds per step). The legend sits to the right of the panels, never over the data, and the axes
show plain numbers (no offsets, no scientific notation). A first step that dwarfs the others (compiled
kernels) is left off the scale, with its value written in the panel.
"""
from __future__ import annotations

__all__ = ["plot_replicas"]


def plot_replicas(path: str, rows: list[dict], nreplicas: int) -> str:
    """``rows``: per-step logs with step, rank{r}_b, rank{r}_compute_s, rank{r}_wait_s; writes a PNG at ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    steps = [row["step"] for row in rows]
    panels = [("b", "local batch b_i", 1.0), ("compute_s", "compute (ms)", 1e3), ("wait_s", "wait (ms)", 1e3)]
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(8, 6.5))
    for ax, (key, label, scale) in zip(axes, panels):
        series = [[row[f"rank{r}_{key}"] * scale for row in rows] for r in range(nreplicas)]
        for r, values in enumerate(series):
            ax.plot(steps, values, label=f"rank {r}", lw=1.2, marker="." if len(steps) <= 50 else None)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        # the first step (compilation, allocations) may dwarf the rest: keep the scale of the others
        rest = max((v for values in series for v in values[1:]), default=0.0)
        first = max(values[0] for values in series)
        if rest > 0 and first > 2 * rest:
            ax.set_ylim(0, 1.15 * rest)
            ax.text(1.0, 1.01, f"step {steps[0]}: {first:.0f}, off the scale", transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=8, color="0.3")      # above the panel, not on the data
        ax.grid(alpha=0.3)
        fmt = ScalarFormatter(useOffset=False)
        fmt.set_scientific(False)
        ax.yaxis.set_major_formatter(fmt)
    axes[-1].set_xlabel("global step")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_title("per-replica batch, compute and wait")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", frameon=False)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    from pydtnn.outputs import atomic_write
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
    return path
