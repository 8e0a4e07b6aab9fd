"""A profile from the launcher's Chrome trace (``--tracer_output trace.json``, pydtnn/observe/timeline.py).

The trace holds, per rank (pid) and traced step, every top-level layer's "forward" and "backward" events
(named as in model.summary(); a fused softmax is "<name> + loss"), synchronized BatchNorm's "bn_sync" waits
nested in them, one "allreduce" event (the wait: idle + transfer) and one "update" event. A step's compute
is its layer events less the waits nested in them (older traces: one "compute" event per step). Given the split that was in force (``sizes``),
rank ``rank``'s median compute per step becomes the device's time at its local batch, shared among the
layers in proportion to their roofline times (forward 1/3, backward 2/3 of each); per-layer events
(categories "forward" / "backward" named after the layers) are used instead when the trace has them.
Network: the fastest rank's wait is closest to the pure transfer, so the per-step minimum over ranks of
the "allreduce" durations, its median, fixes beta with alpha and gamma from the given network (default
0): a one-point fit, honest only for the message size of that model.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.sim import model_table
from pydtnn.sim.collectives import coefficients
from pydtnn.sim.profile import Network, Profile, read_json
from pydtnn.sim.roofline import roofline_profile

__all__ = ["trace_profile", "step_computes"]


def _events(path):
    data = read_json(path, "--trace")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ConfigError(f"--trace {path}: no traceEvents list (a Chrome trace from --tracer_output)")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def _layer_compute(events, rank):
    """Rank ``rank``'s per-step compute (its forward and backward events on the main track, less the
    bn_sync waits nested in them) as {step: [start s, compute s]}, and each layer's durations in seconds
    by (name, cat)."""
    # a layer inside a block (args.parent) is counted in its block's event already
    mine = [e for e in events if int(e.get("pid", 0)) == rank and int(e.get("tid", 0)) == 0
            and "parent" not in (e.get("args") or {})]
    waits = [e for e in mine if e.get("cat") == "bn_sync"]
    steps, layers = {}, defaultdict(list)
    for e in mine:
        if e.get("cat") not in ("forward", "backward"):
            continue
        t0, t1 = float(e.get("ts", 0)), float(e.get("ts", 0)) + float(e.get("dur", 0))
        nested = sum(float(w["dur"]) for w in waits if t0 <= float(w["ts"]) and float(w["ts"]) + float(w["dur"]) <= t1)
        seconds = (float(e.get("dur", 0)) - nested) * 1e-6
        step = steps.setdefault((e.get("args") or {}).get("step", 0), [t0 * 1e-6, 0.0])
        step[0] = min(step[0], t0 * 1e-6)
        step[1] += seconds
        layers[(str(e.get("name")), e.get("cat"))].append(seconds)
    return steps, layers


def step_computes(events, rank=0):
    """(start s, compute s) of each traced step of ``rank``, in step order: one "compute" event per step
    (older traces) or the step's layer events less their nested waits."""
    old = sorted((e for e in events if int(e.get("pid", 0)) == rank and e.get("name") == "compute"),
                 key=lambda e: e.get("ts", 0))
    if old:
        return [(float(e["ts"]) * 1e-6, float(e["dur"]) * 1e-6) for e in old]
    steps = _layer_compute(events, rank)[0]
    return [tuple(steps[s]) for s in sorted(steps)]


def _traced_batch(events, rank):
    """Rank ``rank``'s local batch from its layer events' ``args`` (b_i), the median over steps; None when
    the trace does not carry it (older traces)."""
    b = [int((e.get("args") or {})["b_i"]) for e in events if int(e.get("pid", 0)) == rank
         and e.get("cat") in ("forward", "backward") and (e.get("args") or {}).get("b_i")]
    return int(np.median(b)) if b else None


def trace_profile(path, model_name, sizes=None, rank=0, dtype="float32") -> Profile:
    """``sizes``: the split in force (one local batch per rank); optional when the trace's layer events
    carry b_i."""
    events = _events(path)
    by = defaultdict(list)                               # (pid, name) -> durations in s, in time order
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        by[(int(e.get("pid", 0)), str(e.get("name")))].append(float(e.get("dur", 0)) * 1e-6)
    ranks = sorted({pid for pid, _ in by})
    traced_b = _traced_batch(events, rank)
    if sizes is None and traced_b is None:
        raise ConfigError(f"--trace {path} does not say the local batch sizes: give --trace_sizes, one per rank "
                          f"({len(ranks)})")
    if sizes is not None and len(sizes) != len(ranks):
        raise ConfigError(f"--trace_sizes has {len(sizes)} values but the trace has {len(ranks)} rank(s)")
    if rank not in ranks:
        raise ConfigError(f"--trace_rank {rank}: the trace has ranks {ranks}")
    compute = [c for _, c in step_computes(events, rank)]
    if not compute:
        raise ConfigError(f"--trace {path}: rank {rank} has no \"compute\" events")
    model = model_table.build(model_name, dtype=dtype)
    base = roofline_profile(model_name, model=model)
    t = float(np.median(compute))
    b = int(sizes[rank]) if sizes is not None else traced_b
    layers = _layer_compute(events, rank)[1]            # (name, cat) -> seconds less nested waits
    layer_f = [layers.get((n, "forward")) or layers.get((n + " + loss", "forward")) for n in base.layer_names]
    per_layer = all(v for v in layer_f)
    if per_layer:
        fwd = np.array([[np.median(v)] for v in layer_f])
        bwd = np.array([[np.median(layers.get((n, "backward"), [0.0]))] for n in base.layer_names])
    else:
        share = (base.forward_s[:, 0] + base.backward_s[:, 0]) / (base.forward_s + base.backward_s).sum()
        fwd, bwd = (t * share / 3.0)[:, None], (2.0 * t * share / 3.0)[:, None]
    network = Network(0.0, 0.0, 0.0)
    P = len(ranks)
    waits = [by.get((r, "allreduce"), []) for r in ranks]
    n = min(len(w) for w in waits)
    if P > 1 and n:
        transfer = float(np.median(np.min([w[:n] for w in waits], axis=0)))
        _, bcoef, _ = coefficients("auto", base.gradient_bytes, P)
        network = Network(0.0, transfer / bcoef if bcoef else 0.0, 0.0)
    update = by.get((rank, "update"))
    return Profile(model=model_name, batch_points=[b], layer_names=base.layer_names, layer_types=base.layer_types,
                   param_bytes=base.param_bytes, bn_channels=base.bn_channels, forward_s=fwd, backward_s=bwd,
                   network=network, update_s=float(np.median(update)) if update else 0.0,
                   dtype_bytes=base.dtype_bytes, source="trace", device=f"rank {rank} of trace {path}")
