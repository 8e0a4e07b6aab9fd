"""A profile from the launcher's Chrome trace (``--tracing true --tracer_output trace.json``).

Two trace formats are read:
- per-layer (pydtnn/profiling, issue 22): every top-level layer's forward and backward is an event named
  after the layer, category "forward" / "backward", with ``args`` step and b_i. Each layer's time is its
  median over the traced steps of rank ``rank``, at that rank's b_i (``--trace_sizes`` not needed).
- per-step (older traces): one "compute" event (forward + backward) per step; given the split in force
  (``sizes``), rank ``rank``'s median compute becomes the device's time at its local batch, shared among
  the layers in proportion to their roofline times (forward 1/3, backward 2/3 of each).

Network: the last rank to arrive waits least, so the per-step minimum over ranks of the "allreduce"
durations, its median, is the transfer; it fixes beta with alpha = gamma = 0: a one-point fit, honest
only for this model's message size. Update: the median "update" event.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.sim.collectives import coefficients
from pydtnn.sim.profile import Network, Profile, read_json
from pydtnn.sim.roofline import roofline_profile

__all__ = ["trace_profile", "read_trace", "step_periods"]


def read_trace(path):
    data = read_json(path, "--trace")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ConfigError(f"--trace {path}: no traceEvents list (a Chrome trace from --tracer_output)")
    return sorted((e for e in events if isinstance(e, dict) and e.get("ph") == "X"), key=lambda e: e.get("ts", 0))


def _step(e):
    args = e.get("args") or {}
    return args.get("step")


def step_periods(events, rank=0):
    """Per traced step of ``rank`` (in order): (start s, compute s, b_i); compute = its forward and
    backward layer events, or its "compute" event in an older trace."""
    mine = [e for e in events if int(e.get("pid", 0)) == rank]
    layered = [e for e in mine if e.get("cat") in ("forward", "backward") and _step(e) is not None]
    out = []
    if layered:
        by = defaultdict(list)
        for e in mine:
            if _step(e) is not None:
                by[int(_step(e))].append(e)
        for step in sorted(by):
            evs = by[step]
            comp = sum(float(e["dur"]) for e in evs if e.get("cat") in ("forward", "backward")) * 1e-6
            b = int((evs[0].get("args") or {}).get("b_i", 0))
            out.append((min(float(e["ts"]) for e in evs) * 1e-6, comp, b))
    else:
        for e in mine:
            if e.get("name") == "compute":
                out.append((float(e["ts"]) * 1e-6, float(e["dur"]) * 1e-6, 0))
    return out


def trace_profile(path, model_name, sizes=None, rank=0, dtype="float32") -> Profile:
    events = read_trace(path)
    ranks = sorted({int(e.get("pid", 0)) for e in events})
    steps = step_periods(events, rank)
    if not steps:
        raise ConfigError(f"--trace {path}: rank {rank} has no forward/backward or \"compute\" events")
    base = roofline_profile(model_name, dtype=dtype)
    mine = [e for e in events if int(e.get("pid", 0)) == rank]
    per_layer = any(e.get("cat") == "forward" for e in mine)
    if per_layer:
        b = int(np.median([s[2] for s in steps]))
        times = defaultdict(list)
        for e in mine:
            if e.get("cat") in ("forward", "backward"):
                times[(str(e["name"]), e["cat"])].append(float(e["dur"]) * 1e-6)
        missing = [n for n in base.layer_names if (n, "forward") not in times]
        if missing:
            raise ConfigError(f"--trace {path}: no events of layer(s) {', '.join(missing[:3])} of model "
                              f"{model_name} (a trace of another model?)")
        fwd = np.array([[np.median(times[(n, "forward")])] for n in base.layer_names])
        bwd = np.array([[np.median(times.get((n, "backward"), [0.0]))] for n in base.layer_names])
    else:
        if not sizes or len(sizes) != len(ranks):
            raise ConfigError(f"--trace {path} has per-step events only: give --trace_sizes, one local batch per "
                              f"rank ({len(ranks)})")
        b = int(sizes[rank])
        t = float(np.median([s[1] for s in steps]))
        share = (base.forward_s[:, 0] + base.backward_s[:, 0]) / (base.forward_s + base.backward_s).sum()
        fwd, bwd = (t * share / 3.0)[:, None], (2.0 * t * share / 3.0)[:, None]
    network = Network(0.0, 0.0, 0.0)
    P = len(ranks)
    waits = [[float(e["dur"]) * 1e-6 for e in events if int(e.get("pid", 0)) == r and e.get("name") == "allreduce"]
             for r in ranks]
    n = min(len(w) for w in waits)
    if P > 1 and n:
        transfer = float(np.median(np.min([w[:n] for w in waits], axis=0)))
        _, bcoef, _ = coefficients("auto", base.gradient_bytes, P)
        network = Network(0.0, transfer / bcoef if bcoef else 0.0, 0.0)
    update = [float(e["dur"]) * 1e-6 for e in mine if e.get("name") == "update"]
    return Profile(model=model_name, batch_points=[b], layer_names=base.layer_names, layer_types=base.layer_types,
                   param_bytes=base.param_bytes, bn_channels=base.bn_channels, forward_s=fwd, backward_s=bwd,
                   network=network, update_s=float(np.median(update)) if update else 0.0,
                   dtype_bytes=base.dtype_bytes, source="trace", device=f"rank {rank} of trace {path}")
