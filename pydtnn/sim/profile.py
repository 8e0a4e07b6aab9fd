"""The device and network profile: what the simulator knows about a machine, as editable JSON.

    {"format": "pydtnn-sim-profile/1", "model": "simplecnn", "source": "measured", "device": "...",
     "dtype_bytes": 4, "batch_points": [1, 8, 32, 128],
     "layers": [{"name": "conv2d_1", "type": "Conv2D", "param_bytes": 160, "batchnorm_channels": 0,
                 "forward_s": [...], "backward_s": [...]}, ...],      # one time per batch point
     "update_s": 0.0004,                                              # optimizer step, once per step
     "step_overhead_s": [o0, o1],                                     # launcher's other work: o0 + o1 * b
     "network": {"alpha": 2e-6, "beta": 1e-10, "gamma": 2e-10},       # s, s/byte, s/byte
     "network_source": "measured: ...",                               # optional: where the network came from
     "network_inter": {...},                                          # optional: between nodes
     "network_inter_source": "given: ...",                            # optional: where that one came from
     "cores": 2, "threads_per_replica": 1,                            # optional: cores of one node, of a replica
     "contention": {"1": 1.0, "2": 1.1, "3": 2.5},                    # optional: k processes on a node
     "network_oversubscribed": {...}}                                 # optional: more ranks than cores

A layer's time is a function of the local batch b (FuPerMod's functional performance model: the speed
depends on b), here piecewise linear through the measured points, extended along the last (first)
segment beyond them and never below zero. Layers are in forward order; "param_bytes" places each
layer's gradients in the flat buffer, which the bucketed reduction cuts from the end.

"contention" says how much k busy processes on one node slow each one's compute (shared caches and memory
bandwidth up to the cores; time-slicing beyond them): a factor on every replica's local work when k ranks
share its node. "network_oversubscribed" is alpha, beta, gamma measured with more processes than cores,
used when ranks outnumber a node's cores. Both are measured by `calibrate`; a hand-written profile may
leave them out (no contention, one network).
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
    cores: int = 0                     # cores of one node; 0: unknown
    threads_per_replica: int = 1       # threads each replica ran with when the times were measured
    contention: dict = field(default_factory=dict)      # {k processes on a node: compute slowdown}
    network_oversubscribed: Network | None = None
    network_source: str = ""           # where `network` came from (printed by every run)
    network_inter_source: str = ""     # where `network_inter` came from
    extra: dict = field(default_factory=dict)

    def contention_factor(self, k: int) -> float:
        """Slowdown of one replica's local work when k ranks share its node: the measured factors,
        linear between measured k; beyond the largest measured k, constant while k fits the cores and
        growing as k / k_max once they are outnumbered (time-slicing shares them out). 1 when unmeasured."""
        if not self.contention:
            return 1.0
        ks = np.array(sorted(self.contention), dtype=np.float64)
        fs = np.array([self.contention[int(x)] for x in ks])
        if k <= ks[-1]:
            return float(np.interp(k, ks, fs))
        slots = self.replica_slots
        if slots and k > slots:
            return float(fs[-1] * k / max(ks[-1], slots))
        return float(fs[-1])

    @property
    def replica_slots(self) -> int:
        """Replicas one node holds before they outnumber its cores (0: unknown)."""
        return self.cores // max(1, self.threads_per_replica)

    def network_for(self, ranks_per_node: int) -> Network:
        """The network of a node holding ranks_per_node ranks: the oversubscribed one when they outnumber
        its cores and it was measured."""
        if self.network_oversubscribed is not None and self.cores and ranks_per_node > self.replica_slots:
            return self.network_oversubscribed
        return self.network

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
        if self.network_source:
            d["network_source"] = self.network_source
        if self.network_inter is not None:
            d["network_inter"] = vars(self.network_inter).copy()
            if self.network_inter_source:
                d["network_inter_source"] = self.network_inter_source
        if self.cores:
            d["cores"] = int(self.cores)
        d["threads_per_replica"] = int(self.threads_per_replica)
        if self.contention:
            d["contention"] = {str(k): float(v) for k, v in sorted(self.contention.items())}
        if self.network_oversubscribed is not None:
            d["network_oversubscribed"] = vars(self.network_oversubscribed).copy()
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
        contention = d.get("contention", {})
        try:
            contention = {int(k): float(v) for k, v in contention.items()}
            cores = int(d.get("cores", 0))
            threads = int(d.get("threads_per_replica", 1))
        except (AttributeError, TypeError, ValueError):
            raise ConfigError(f"{where}: contention must map process counts to factors, cores a number") from None
        if any(k < 1 or not (math.isfinite(v) and v > 0) for k, v in contention.items()) or cores < 0 or threads < 1:
            raise ConfigError(f"{where}: contention factors must be > 0 for process counts >= 1, cores >= 0, "
                              f"threads_per_replica >= 1")
        over = d.get("network_oversubscribed")
        sources = {k: d.get(k, "") for k in ("network_source", "network_inter_source")}
        if not all(isinstance(v, str) and len(v) <= 1000 for v in sources.values()):
            raise ConfigError(f"{where}: network_source and network_inter_source must be text (at most 1000 "
                              f"characters)")
        known = {"format", "model", "source", "device", "dtype_bytes", "batch_points", "layers", "update_s",
                 "step_overhead_s", "network", "network_inter", "cores", "threads_per_replica", "contention",
                 "network_oversubscribed", "network_source", "network_inter_source"}
        return cls(model=str(d.get("model", "")), batch_points=points, layer_names=names, layer_types=types,
                   param_bytes=pbytes, bn_channels=bn, forward_s=fwd, backward_s=bwd,
                   network=Network.from_dict(d.get("network"), f"{where}: network"),
                   update_s=float(d.get("update_s", 0.0)), step_overhead_s=overhead,
                   network_inter=None if inter is None else Network.from_dict(inter, f"{where}: network_inter"),
                   dtype_bytes=int(d.get("dtype_bytes", 4)), source=str(d.get("source", "hand")),
                   device=str(d.get("device", "")), cores=cores, threads_per_replica=threads, contention=contention,
                   network_oversubscribed=None if over is None else Network.from_dict(
                       over, f"{where}: network_oversubscribed"), **sources,
                   extra={k: v for k, v in d.items() if k not in known})


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
