"""A profile from upstream PyDTNN's five performance-model flags, when nothing can be measured.

Upstream's meaning: ``--cpu_speed`` FLOP/s (4e12), ``--memory_bw`` B/s (50e9), ``--network_bw`` bits/s
(1e9), ``--network_lat`` s (0.5e-6), ``--network_alg`` vdg | bta (van de Geijn's scatter + allgather,
here MPICH's Rabenseifner; a binomial tree). A layer's forward time per sample is the roofline
max(FLOPs / cpu_speed, bytes / memory_bw); backward costs twice the forward (the input and the weight
gradients); times are proportional to the local batch. Network: alpha = network_lat,
beta = 8 / network_bw (s per byte), gamma = 3 / memory_bw (a sum reads two bytes and writes one).
"""
from __future__ import annotations

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.sim import model_table
from pydtnn.sim.profile import Network, Profile

__all__ = ["UPSTREAM_DEFAULTS", "roofline_profile"]

UPSTREAM_DEFAULTS = {"cpu_speed": 4e12, "memory_bw": 50e9, "network_bw": 1e9, "network_lat": 0.5e-6,
                     "network_alg": "vdg"}


def roofline_profile(model_name, cpu_speed=4e12, memory_bw=50e9, network_bw=1e9, network_lat=0.5e-6,
                     dtype="float32", model=None, network_words=None) -> Profile:
    """``network_words``: where the network flags came from (printed by every run); the network is the whole
    cluster's, upstream's meaning: inside a node and between nodes alike."""
    for name, v in (("--cpu_speed", cpu_speed), ("--memory_bw", memory_bw), ("--network_bw", network_bw)):
        if not v > 0:
            raise ConfigError(f"{name} must be > 0, got {v}")
    if not network_lat >= 0:
        raise ConfigError(f"--network_lat must be >= 0, got {network_lat}")
    model = model if model is not None else model_table.build(model_name, dtype=dtype)
    info = model_table.describe(model)
    fwd = np.array([[max(r.flops / cpu_speed, r.bytes / memory_bw)] for r in info])
    network = Network(float(network_lat), 8.0 / network_bw, 3.0 / memory_bw)
    words = network_words or f"roofline: --network_bw {network_bw:g}, --network_lat {network_lat:g}"
    return Profile(model=model_name, batch_points=[1], layer_names=[r.name for r in info],
                   layer_types=[r.type for r in info], param_bytes=np.array([r.param_bytes for r in info]),
                   bn_channels=np.array([r.bn_channels for r in info]), forward_s=fwd, backward_s=2.0 * fwd,
                   network=network, network_inter=network, network_source=words, network_inter_source=words,
                   update_s=5.0 * sum(r.param_bytes for r in info) / memory_bw,   # SGD momentum: read p, g, v; write p, v
                   dtype_bytes=model.dtype.itemsize, source="roofline",
                   device=f"roofline cpu_speed={cpu_speed:g} memory_bw={memory_bw:g}",
                   extra={"roofline": {"cpu_speed": cpu_speed, "memory_bw": memory_bw, "network_bw": network_bw,
                                       "network_lat": network_lat}})
