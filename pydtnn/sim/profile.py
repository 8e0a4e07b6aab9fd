"""The device and network profile: what the simulator knows about a machine, as editable JSON.

    {"format": "pydtnn-sim-profile/1", "model": "simplecnn", "source": "measured", "device": "...",
     "dtype_bytes": 4, "batch_points": [1, 8, 32, 128],
     "layers": [{"name": "conv2d_1", "type": "Conv2D", "param_bytes": 160, "batchnorm_channels": 0,
                 "forward_s": [...], "backward_s": [...]}, ...],      # one time per batch point
     "update_s": 0.0004,                                              # optimizer step, once per step
     "step_overhead_s": [o0, o1],                                     # launcher's other work: o0 + o1 * b
     "network": {"alpha": 2e-6, "beta": 1e-10, "gamma": 2e-10},       # s, s/byte, s/byte
     "network_inter": {...}}                                          # optional: between nodes

A layer's time is a function of the local batch b (FuPerMod's functional performance model: the speed
depends on b), here piecewise linear through the measured points, extended along the last (first)
segment beyond them and never below zero. Layers are in forward order; "param_bytes" places each
layer's gradients in the flat buffer, which the bucketed reduction cuts from the end.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from pydtnn.errors import ConfigError

__all__ = ["Profile", "Network", "FORMAT", "load_profile", "read_json", "piecewise_linear"]

FORMAT = "pydtnn-sim-profile/1"


@dataclass
class Network:
    alpha: float
    beta: float
    gamma: float

    def as_tuple(self) -> tuple[float, float, float]:
        return self.alpha, self.beta, self.gamma

    @classmethod
    def from_dict(cls, d, where: str) -> "Network":
        try:
            vals = [float(d[k]) for k in ("alpha", "beta", "gamma")]
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{where}: needs numbers alpha, beta and gamma") from None
        if not all(math.isfinite(v) and v >= 0 for v in vals):
            raise ConfigError(f"{where}: alpha, beta and gamma must be finite and >= 0, got {vals}")
        return cls(*vals)


@dataclass
class Profile:
    model: str
    batch_points: list
    layer_names: list
    layer_types: list
    param_bytes: np.ndarray            # (L,) bytes of gradients per layer
    bn_channels: np.ndarray            # (L,) channels of a BatchNormalization layer, else 0
    forward_s: np.ndarray              # (L, K) seconds at each batch point
    backward_s: np.ndarray             # (L, K)
    network: Network
    update_s: float = 0.0
    step_overhead_s: tuple = (0.0, 0.0)
    network_inter: Network | None = None
    dtype_bytes: int = 4
    source: str = "hand"
    device: str = ""
    extra: dict = field(default_factory=dict)

    # --- the functional model ----------------------------------------------------------------------
    def layer_seconds(self, batch) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward seconds of every layer at local batch sizes ``batch`` (shape (P,)):
        two arrays (P, L)."""
        b = np.asarray(batch, dtype=np.float64).reshape(-1)
        fwd = piecewise_linear(self.batch_points, self.forward_s, b)
        bwd = piecewise_linear(self.batch_points, self.backward_s, b)
        return fwd, bwd

    def compute_seconds(self, batch) -> np.ndarray:
        fwd, bwd = self.layer_seconds(batch)
        return fwd.sum(axis=1) + bwd.sum(axis=1)

    @property
    def gradient_bytes(self) -> int:
        return int(self.param_bytes.sum())

    # --- JSON --------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"format": FORMAT, "model": self.model, "source": self.source, "device": self.device,
             "dtype_bytes": self.dtype_bytes, "batch_points": [int(b) for b in self.batch_points],
             "layers": [{"name": n, "type": t, "param_bytes": int(pb), "batchnorm_channels": int(c),
                         "forward_s": [float(x) for x in f], "backward_s": [float(x) for x in bk]}
                        for n, t, pb, c, f, bk in zip(self.layer_names, self.layer_types, self.param_bytes,
                                                      self.bn_channels, self.forward_s, self.backward_s)],
             "update_s": float(self.update_s), "step_overhead_s": [float(x) for x in self.step_overhead_s],
             "network": vars(self.network).copy()}
        if self.network_inter is not None:
            d["network_inter"] = vars(self.network_inter).copy()
        d.update(self.extra)
        return d

    def save(self, path: str) -> None:
        from pydtnn.outputs import atomic_write
        text = json.dumps(self.to_dict(), indent=1)
        atomic_write(path, lambda f: f.write(text.encode()))

    @classmethod
    def from_dict(cls, d: dict, where: str = "profile") -> "Profile":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ConfigError(f"{where}: not a simulator profile (needs \"format\": \"{FORMAT}\")")
        try:
            points = [int(b) for b in d["batch_points"]]
            layers = list(d["layers"])
            fwd = np.array([[float(x) for x in l["forward_s"]] for l in layers], dtype=np.float64)
            bwd = np.array([[float(x) for x in l["backward_s"]] for l in layers], dtype=np.float64)
            names = [str(l["name"]) for l in layers]
            types = [str(l.get("type", "")) for l in layers]
            pbytes = np.array([int(l.get("param_bytes", 0)) for l in layers], dtype=np.int64)
            bn = np.array([int(l.get("batchnorm_channels", 0)) for l in layers], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{where}: malformed layer table ({type(e).__name__}: {e})") from None
        if not points or points != sorted(set(points)) or points[0] < 1:
            raise ConfigError(f"{where}: batch_points must be increasing integers >= 1, got {points}")
        if not layers:
            raise ConfigError(f"{where}: no layers")
        if fwd.shape != (len(layers), len(points)) or bwd.shape != fwd.shape:
            raise ConfigError(f"{where}: every layer needs one forward_s and one backward_s per batch point "
                              f"({len(points)})")
        if not (np.all(np.isfinite(fwd)) and np.all(np.isfinite(bwd))) or fwd.min() < 0 or bwd.min() < 0:
            raise ConfigError(f"{where}: layer times must be finite and >= 0")
        inter = d.get("network_inter")
        overhead = d.get("step_overhead_s", [0.0, 0.0])
        try:
            overhead = tuple(float(x) for x in overhead)
        except (TypeError, ValueError):
            overhead = ()
        if len(overhead) != 2 or min(overhead) < 0:
            raise ConfigError(f"{where}: step_overhead_s must be two numbers >= 0 (o0, o1: o0 + o1 * b seconds)")
        known = {"format", "model", "source", "device", "dtype_bytes", "batch_points", "layers", "update_s",
                 "step_overhead_s",
                 "network", "network_inter"}
        return cls(model=str(d.get("model", "")), batch_points=points, layer_names=names, layer_types=types,
                   param_bytes=pbytes, bn_channels=bn, forward_s=fwd, backward_s=bwd,
                   network=Network.from_dict(d.get("network"), f"{where}: network"),
                   update_s=float(d.get("update_s", 0.0)), step_overhead_s=overhead,
                   network_inter=None if inter is None else Network.from_dict(inter, f"{where}: network_inter"),
                   dtype_bytes=int(d.get("dtype_bytes", 4)), source=str(d.get("source", "hand")),
                   device=str(d.get("device", "")), extra={k: v for k, v in d.items() if k not in known})


def read_json(path: str, flag: str):
    """A JSON file named by a flag; a missing or malformed one is a one-line ConfigError."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{flag} {path}: not JSON ({e.msg}, line {e.lineno})") from None


def load_profile(path: str) -> Profile:
    return Profile.from_dict(read_json(path, "--profile"), f"--profile {path}")


def piecewise_linear(xs, ys, x) -> np.ndarray:
    """ys (L, K) sampled at xs (K,), evaluated at x (P,): (P, L). Linear between points, along the end
    segments beyond them, clipped at 0. One point: proportional to x (time per sample constant)."""
    xs = np.asarray(xs, dtype=np.float64)
    ys = np.asarray(ys, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if xs.size == 1:
        return np.clip(np.outer(x / xs[0], ys[:, 0]), 0.0, None)
    k = np.clip(np.searchsorted(xs, x, side="right") - 1, 0, xs.size - 2)      # segment of each x
    x0, x1 = xs[k], xs[k + 1]
    t = (x - x0) / (x1 - x0)                                                    # (P,)
    out = ys[:, k] * (1.0 - t) + ys[:, k + 1] * t                               # (L, P)
    return np.clip(out.T, 0.0, None)
