"""A profile from the launcher's Chrome trace (``--tracer_output trace.json``, pydtnn/trace.py).

The trace holds, per rank (pid), one "compute" event (forward + backward), one "allreduce" event (the
wait: idle + transfer) and one "update" event per step. Given the split that was in force (``sizes``),
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

__all__ = ["trace_profile"]


def _events(path):
    data = read_json(path, "--trace")
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ConfigError(f"--trace {path}: no traceEvents list (a Chrome trace from --tracer_output)")
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def trace_profile(path, model_name, sizes, rank=0, dtype="float32") -> Profile:
    events = _events(path)
    by = defaultdict(list)                               # (pid, name) -> durations in s, in time order
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        by[(int(e.get("pid", 0)), str(e.get("name")))].append(float(e.get("dur", 0)) * 1e-6)
    ranks = sorted({pid for pid, _ in by})
    if len(sizes) != len(ranks):
        raise ConfigError(f"--trace_sizes has {len(sizes)} values but the trace has {len(ranks)} rank(s)")
    compute = by.get((rank, "compute"))
    if not compute:
        raise ConfigError(f"--trace {path}: rank {rank} has no \"compute\" events")
    model = model_table.build(model_name, dtype=dtype)
    base = roofline_profile(model_name, model=model)
    t = float(np.median(compute))
    b = int(sizes[rank])
    layer_f = [by.get((rank, n)) for n in base.layer_names]
    cats = {(int(e.get("pid", 0)), str(e.get("name"))): e.get("cat") for e in events}
    per_layer = all(v for v in layer_f) and all(cats.get((rank, n)) == "forward" for n in base.layer_names)
    if per_layer:
        fwd = np.array([[np.median(v)] for v in layer_f])
        bwd = np.array([[np.median(by.get((rank, n + "/backward"), [0.0]))] for n in base.layer_names])
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
