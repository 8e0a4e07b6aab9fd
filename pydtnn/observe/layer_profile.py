"""--profile_layers true: mean forward / backward milliseconds per layer, its share of the step, and the
GFLOP/s of convolutions and FC layers against the machine's peak (a GEMM measured at the end).

    profile = LayerProfile()
    ... LayerTimer(..., profile=profile) calls profile.add(layer, phase, seconds, batch) per layer ...
    profile.add_step(step_seconds)           # a step's wall time, waits included
    print(profile.table(measure_peak_flops(backend)))

The first step of a run is left out by the caller (allocations, compiled kernels). The layers inside a block
(or a Composite) get rows of their own, indented under the block's row (their parent), as in
`Model.summary()`; the block's row includes them, and the total counts the top-level rows only. FLOPs count a
multiply-add as 2: a Conv2D's forward is 2 * N * (output elements per sample) * (weights per filter), an
FC's 2 * N * (outputs per sample) * in_features; a backward is twice its forward (input and weight
gradients), once when the layer needs no input gradient (the first layer).
"""
from __future__ import annotations

import time

import numpy as np

__all__ = ["LayerProfile", "layer_flops", "measure_peak_flops"]


def layer_flops(layer, batch: int, phase: str) -> float | None:
    """Floating-point operations of ``layer``'s ``phase`` on ``batch`` samples; None for other layer types."""
    if layer.type_name not in ("Conv2D", "FC"):
        return None
    w = layer.get_param("weights")
    outputs = int(np.prod(layer.shape))
    per_output = w.size // (w.shape[0] if layer.type_name == "Conv2D" else w.shape[-1])
    forward = 2.0 * batch * outputs * per_output
    if phase == "forward":
        return forward
    return forward * (2.0 if getattr(layer, "input_grad_needed", True) else 1.0)


def measure_peak_flops(backend, n: int = 1024, repeats: int = 5) -> float:
    """The best of ``repeats`` n x n GEMMs in the backend's dtype: the peak a dense layer can reach here."""
    xp = backend.xp
    a = xp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype=backend.dtype)
    best = float("inf")
    a @ a
    for _ in range(repeats):
        backend.synchronize()
        t0 = time.perf_counter()
        a @ a
        backend.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


class LayerProfile:
    def __init__(self):
        self.rows: dict[str, dict] = {}        # layer name -> totals, in first-seen (forward) order
        self.steps = 0
        self.step_s = 0.0

    def enter(self, layer, parent=None) -> None:
        """The row of ``layer`` (a sublayer of ``parent``: one level deeper), created in the order layers start."""
        if layer.name not in self.rows:
            depth = 0 if parent is None else self.rows.get(parent.name, {"depth": -1})["depth"] + 1
            self.rows[layer.name] = {"type": layer.type_name, "forward": [0, 0.0, 0.0], "backward": [0, 0.0, 0.0],
                                     "flops": False, "depth": depth}

    def add(self, layer, phase: str, seconds: float, batch: int) -> None:
        self.enter(layer)
        row = self.rows[layer.name]
        calls = row[phase]
        calls[0] += 1
        calls[1] += seconds
        flops = layer_flops(layer, batch, phase)
        if flops is not None:
            calls[2] += flops
            row["flops"] = True

    def add_step(self, seconds: float) -> None:
        self.steps += 1
        self.step_s += seconds

    def table(self, peak_flops: float | None = None, title: str = "") -> str:
        step_ms = 1e3 * self.step_s / self.steps if self.steps else float("nan")
        width = max([18] + [len(name) + 2 * row["depth"] for name, row in self.rows.items()])
        head = (f"{'layer':<{width}} {'type':<20} {'fwd ms':>8} {'bwd ms':>8} {'% step':>7} {'GFLOP/s':>8}"
                + (f" {'% peak':>7}" if peak_flops else ""))
        lines = [title] if title else []
        lines += [head, "-" * len(head)]
        total = 0.0
        for name, row in self.rows.items():
            (nf, tf, ff), (nb, tb, fb) = row["forward"], row["backward"]
            fwd, bwd = (1e3 * tf / nf if nf else 0.0), (1e3 * tb / nb if nb else 0.0)
            total += fwd + bwd if row["depth"] == 0 else 0.0          # a sublayer's time is in its block's
            label = "  " * row["depth"] + name
            line = f"{label:<{width}} {row['type']:<20} {fwd:>8.3f} {bwd:>8.3f} {100 * (fwd + bwd) / step_ms:>7.1f}"
            if row["flops"] and tf + tb > 0:
                rate = (ff + fb) / (tf + tb)
                line += f" {rate / 1e9:>8.2f}" + (f" {100 * rate / peak_flops:>7.1f}" if peak_flops else "")
            lines.append(line)
        lines.append("-" * len(head))
        lines.append(f"layers {total:.3f} ms of a {step_ms:.3f} ms step (mean of {self.steps} steps; the rest: "
                     f"loss, collectives' waits, update, data)")
        if peak_flops:
            lines.append(f"peak: {peak_flops / 1e9:.1f} GFLOP/s (the best 1024 x 1024 GEMM, measured on this replica)")
        return "\n".join(lines)
