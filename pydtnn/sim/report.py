"""What `pydtnn-simulate run` prints and writes: the summary, the per-replica table, the sweep of time
against P per policy (a table and a plot), and the JSON document."""
from __future__ import annotations

import numpy as np

__all__ = ["summary_text", "sweep_table", "plot_sweep", "to_json", "scaling_efficiency"]


def scaling_efficiency(result) -> float:
    """Ideal step / simulated step. Ideal: the global batch at the sum of the replicas' compute speeds
    (b_i / compute alone, noise-free, at the final split) with no communication, barrier or update."""
    sc = result.scenario
    v = np.asarray(result.sizes, float) / np.maximum(result.extra["compute_alone"], 1e-300)
    return float(sc.global_batch / v.sum() / result.step_seconds)


def summary_text(result, best=None, max_rows=16) -> str:
    sc = result.scenario
    eff = scaling_efficiency(result)
    lines = [f"simulated {sc.steps} steps of {sc.replicas} replica(s), global batch {sc.global_batch}, "
             f"policy {sc.policy}, allreduce {sc.algorithm}{' (overlapped)' if sc.non_blocking else ''}"
             + (f", gradients sent in {sc.grad_compression} (2 bytes an element, plus the casts)"
                if sc.grad_compression != "none" else ""),
             f"step time   {result.step_seconds * 1e3:.3f} ms  (median {np.median(result.step_times) * 1e3:.3f}, "
             f"p95 {np.percentile(result.step_times, 95) * 1e3:.3f})",
             f"epoch time  {result.epoch_seconds:.3f} s  ({result.steps_per_epoch} steps)",
             f"scaling efficiency {100 * eff:.1f} %   rebalances {result.rebalances} (re-splits during training"
             + ("; the first split was the policy's probe)" if result.extra.get("first_split") == "probe" else ")")]
    if best is not None:
        sizes, t = best
        shown = sizes if len(sizes) <= 16 else f"{sizes[:8]} ... (min {min(sizes)}, max {max(sizes)})"
        lines.append(f"best partition {shown}: {t * 1e3:.3f} ms per step without noise")
    lines.append(f"{'replica':>7} {'b_i':>6} {'compute ms':>11} {'wait ms':>9} {'wait %':>7}")
    P = len(result.sizes)
    shown = list(range(P)) if P <= max_rows else [*range(max_rows // 2), *range(P - max_rows // 2, P)]
    for i, k in enumerate(shown):                  # the rows shown only: 10^7 replicas are not 10^7 dicts here
        r = {"replica": k, "b_i": int(result.sizes[k]), "compute_s": float(result.compute_s[k]),
             "wait_s": float(result.wait_s[k])}
        if P > max_rows and i == max_rows // 2:
            lines.append(f"{'...':>7}")
        busy = r["compute_s"] + r["wait_s"]
        lines.append(f"{r['replica']:>7} {r['b_i']:>6} {r['compute_s'] * 1e3:>11.3f} {r['wait_s'] * 1e3:>9.3f} "
                     f"{100 * r['wait_s'] / busy if busy else 0:>7.1f}")
    return "\n".join(lines)


def sweep_table(sweep) -> str:
    """``sweep``: {policy: [(P, step_s, epoch_s, efficiency, nodes), ...]}."""
    lines = [f"{'policy':>8} {'P':>6} {'nodes':>6} {'step ms':>10} {'epoch s':>10} {'efficiency %':>13}"]
    for policy, rows in sweep.items():
        for P, step, epoch, eff, nodes in rows:
            lines.append(f"{policy:>8} {P:>6} {nodes:>6} {step * 1e3:>10.3f} {epoch:>10.3f} {100 * eff:>13.1f}")
    return "\n".join(lines)


def plot_sweep(sweep, path, title="") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for policy, rows in sweep.items():
        ax.plot([r[0] for r in rows], [r[2] for r in rows], marker="o", label=policy)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("replicas P")
    ax.set_ylabel("epoch time (s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    from pydtnn.outputs import atomic_write
    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))     # an OutputError: one line
    finally:
        plt.close(fig)


def to_json(result, best=None, sweep=None) -> dict:
    sc = result.scenario
    doc = {"step_seconds": result.step_seconds, "epoch_seconds": result.epoch_seconds,
           "steps_per_epoch": result.steps_per_epoch, "steps_simulated": sc.steps,
           "step_seconds_median": float(np.median(result.step_times)),
           "step_seconds_p95": float(np.percentile(result.step_times, 95)),
           "scaling_efficiency": scaling_efficiency(result), "replicas": sc.replicas,
           "global_batch_size": sc.global_batch, "policy": sc.policy, "network_alg": sc.algorithm,
           "non_blocking_mpi": sc.non_blocking, "grad_compression": sc.grad_compression,
           "rebalances": result.rebalances,
           "first_split": result.extra.get("first_split", "initial_sizes"), "sizes": list(result.sizes),
           "per_replica": result.per_replica}
    if best is not None:
        doc["best_partition"] = {"sizes": best[0], "step_seconds": best[1]}
    if sweep is not None:
        doc["sweep"] = {p: [{"replicas": P, "nodes": n, "step_seconds": s, "epoch_seconds": e, "scaling_efficiency": f}
                            for P, s, e, f, n in rows] for p, rows in sweep.items()}
    return doc
