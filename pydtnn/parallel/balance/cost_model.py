"""Each replica's compute seconds as a function of its local batch, t_i(b): a functional performance model
(FuPerMod's FPM), fitted to measured points.

    cost = ReplicaCost([(32, 0.0412), (64, 0.0431), (128, 0.0465), (254, 0.0530)])
    cost.seconds(96)            # predicted compute seconds of a step of 96 samples
    cost.kind                   # "affine" or "piecewise"
    model = CostModel([cost, ...], devices=["gpu", "cpu", "cpu"])
    model.makespan([197, 29, 30])

The fit: least squares t = a + c b (Pollux's affine compute model), with a >= 0 and c >= 0 (a negative
part is measurement noise: it is pinned at 0 and the other refitted). When the affine fit misses any point
by more than `RESIDUAL_LIMIT` of its time (a GPU that saturates, a CPU whose cache runs out), the model is
the monotone piecewise-linear function through the points instead (FuPerMod's piecewise FPM): the times are
made non-decreasing in b (a point below an earlier one is pooled with it), joined by straight segments,
continued past the last point along the affine slope (never flatter: a flat end would make samples look
free), and from the affine intercept at b = 0 to the first point. t(0) = 0: a replica without samples
computes nothing. Either way t is non-decreasing, which the equal-finish partition
(`pydtnn.parallel.balance.fpm_partition`) needs to be optimal.

A point is the median compute seconds of several timed steps at one b (`pydtnn.parallel.balance.fpm_probe`, or an
interval of training steps for the dynamic policy); a point at a b already held replaces it. Everything
here is plain arithmetic on its arguments: every rank that holds the same points holds the same model.

A stored model (a checkpoint's policy state, a `--cost_model` file) is data, checked before use
(`state_problem`): an object of format FORMAT, `devices` a list of "cpu" / "gpu", one per replica, at least
one replica, each with at least one point [b, seconds], b an integer in [1, `MAX_B`] (10^9) and seconds a
finite number in (0, `MAX_SECONDS`] (a day); a file is read up to `MAX_FILE_BYTES` (64 MiB). A problem is one
line naming the file and the field.

`doubts`: points that fall as b grows (by more than RESIDUAL_LIMIT) or an affine fit that misses a point by
more than `DOUBT_RESIDUAL` (25%): noisy times, said with one line of advice where the model is printed.
"""
from __future__ import annotations

import json
import math

import numpy as np

from pydtnn.errors import ConfigError

__all__ = ["ReplicaCost", "CostModel", "vectorized", "state_problem", "RESIDUAL_LIMIT", "DOUBT_RESIDUAL", "FORMAT",
           "MAX_B", "MAX_SECONDS", "DEVICES"]

RESIDUAL_LIMIT = 0.05
DOUBT_RESIDUAL = 0.25
FORMAT = "pydtnn-cost-model/1"
MAX_B = 10 ** 9                  # a point's local batch
MAX_SECONDS = 86400.0            # a point's compute seconds: a day per step
MAX_FILE_BYTES = 64 * 2 ** 20
DEVICES = ("cpu", "gpu")


class ReplicaCost:
    """One replica's t(b) from its points [(b, seconds), ...] (b >= 1, seconds > 0)."""

    def __init__(self, points=(), flagged=()):
        self.points: dict[int, float] = {}
        self.flagged = [(int(b), float(t)) for b, t in flagged]     # outliers seen, not fitted (printed)
        for b, t in points:
            self._put(b, t)
        self.refit()

    def _put(self, b, t):
        if not _is_point([b, t]):
            raise ConfigError(f"a cost model point needs {_POINT}, got ({b}, {t})")
        self.points[int(b)] = float(t)

    def add(self, b, seconds) -> None:
        """A measured point (replacing the one at the same b), then the fit again."""
        self._put(b, seconds)
        self.refit()

    def scale(self, factor: float) -> None:
        """Every point times `factor`: the device changed speed (a straggler), its shape did not."""
        self.points = {b: t * float(factor) for b, t in self.points.items()}
        self.refit()

    # --- the fit ------------------------------------------------------------------------------------
    def refit(self) -> None:
        # plain Python on a few points: a dynamic policy refits every replica every interval
        bs = sorted(self.points)
        ts = [self.points[b] for b in bs]
        self.a, self.c = a, c = _affine(bs, ts)
        self.residual = 0.0
        for b, t in zip(bs, ts):
            r = abs(a + c * b - t) / t
            if r > self.residual:
                self.residual = r
        self.kind = "affine" if self.residual <= RESIDUAL_LIMIT or len(ts) < 3 else "piecewise"
        if self.kind == "piecewise":
            bs, ts = np.array(bs), np.array(ts)
            self._b, self._mono = bs, _non_decreasing(ts)
            tail = (self._mono[-1] - self._mono[-2]) / (bs[-1] - bs[-2])
            self._tail = max(tail, self.c, self._mono[-1] / bs[-1] * 1e-3)
            self._head = min(self.a, self._mono[0])

    def seconds(self, b):
        """Predicted compute seconds at local batch(es) b (0 for b = 0)."""
        b = np.asarray(b, dtype=np.float64)
        if not self.points:
            raise ConfigError("a cost model without points cannot predict")
        if self.kind == "affine":
            t = self.a + self.c * b
        else:
            xs = np.concatenate(([0.0], self._b))
            ys = np.concatenate(([self._head], self._mono))
            t = np.interp(b, xs, ys)
            t = np.where(b > xs[-1], ys[-1] + self._tail * (b - xs[-1]), t)
        return np.where(b <= 0, 0.0, t)

    def doubts(self) -> list[str]:
        """What makes this model doubtful: points whose time falls as b grows (by more than RESIDUAL_LIMIT),
        an affine fit that misses a point by more than DOUBT_RESIDUAL."""
        out = []
        ordered = sorted(self.points.items())
        falls = [(b0, t0, b1, t1) for (b0, t0), (b1, t1) in zip(ordered, ordered[1:]) if t1 < t0 * (1 - RESIDUAL_LIMIT)]
        if falls:
            b0, t0, b1, t1 = falls[0]
            out.append(f"its time falls as b grows (b={b0}: {t0 * 1e3:.4g} ms, b={b1}: {t1 * 1e3:.4g} ms)")
        if self.residual > DOUBT_RESIDUAL:
            out.append(f"its affine fit misses a point by {self.residual:.0%}")
        return out

    def describe(self) -> str:
        pts = " ".join(f"{b}:{t * 1e3:.4g}" for b, t in sorted(self.points.items()))
        fit = f"affine {self.a * 1e3:.4g} ms + {self.c * 1e3:.4g} ms/sample"
        text = f"points b:ms {pts}; {fit}, residual {self.residual:.1%}"
        if self.kind == "piecewise":
            text += f" > {RESIDUAL_LIMIT:.0%}: piecewise linear through the points"
        if self.flagged:
            worst = {}
            for b, t in self.flagged:
                n, top = worst.get(b, (0, 0.0))
                worst[b] = (n + 1, max(top, t))
            text += "; flagged, not fitted: " + " ".join(
                f"{b}:{t * 1e3:.4g}" + (f" (x{n})" if n > 1 else "") for b, (n, t) in sorted(worst.items()))
        return text

    # --- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"points": [[b, t] for b, t in sorted(self.points.items())],
                "flagged": [list(p) for p in self.flagged]}

    @classmethod
    def from_state(cls, state) -> "ReplicaCost":
        problem = _replica_problem(state)
        if problem:
            raise ConfigError(_problem_text(*problem))
        return cls([(b, t) for b, t in state["points"]], [(b, t) for b, t in state.get("flagged", [])])


# --- a stored model, checked -----------------------------------------------------------------------------
_POINT = f"[b, seconds]: b an integer in [1, 10^9] and seconds a finite number in (0, {MAX_SECONDS:g}]"


def _is_point(p) -> bool:
    if not isinstance(p, (list, tuple)) or len(p) != 2:
        return False
    b, t = p
    integer = isinstance(b, (int, np.integer)) and not isinstance(b, bool)
    number = isinstance(t, (int, float, np.floating, np.integer)) and not isinstance(t, bool)
    return integer and 1 <= b <= MAX_B and number and math.isfinite(t) and 0 < t <= MAX_SECONDS


def _replica_problem(state, field=""):
    """(field, expected, value) of the first problem of one replica's stored state, or None."""
    if not isinstance(state, dict):
        return field.rstrip(".") or "(replica)", "an object with its points", state
    points = state.get("points")
    if not isinstance(points, list) or not points:
        return f"{field}points", "a non-empty list of points " + _POINT, points
    for k, p in enumerate(points):
        if not _is_point(p):
            return f"{field}points[{k}]", _POINT, p
    flagged = state.get("flagged", [])
    if not isinstance(flagged, list):
        return f"{field}flagged", "a list of points " + _POINT, flagged
    for k, p in enumerate(flagged):
        if not _is_point(p):
            return f"{field}flagged[{k}]", _POINT, p
    return None


def state_problem(state):
    """(field, expected, value) of the first problem of a stored CostModel state (format, devices, every
    replica's points), or None when it is sound. The fields are named as in the JSON document."""
    if not isinstance(state, dict):
        return "(top level)", f"an object of format {FORMAT}", state
    if state.get("format") != FORMAT:
        return "format", repr(FORMAT), state.get("format")
    replicas = state.get("replicas")
    if not isinstance(replicas, list) or not replicas:
        return "replicas", "a non-empty list, one object per replica", replicas
    devices = state.get("devices", ["cpu"] * len(replicas))
    if not (isinstance(devices, list) and len(devices) == len(replicas) and all(d in DEVICES for d in devices)):
        return "devices", f"a list of {len(replicas)} of {' / '.join(DEVICES)}, one per replica", devices
    for i, replica in enumerate(replicas):
        problem = _replica_problem(replica, f"replicas[{i}].")
        if problem:
            return problem
    return None


def _problem_text(field, expected, value) -> str:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"field {field!r} must be {expected}, got {shown}"


def _affine(b, t):
    """Least squares a + c b with a, c >= 0 (one point: through the origin, the constant model)."""
    n = len(b)
    if n == 0:
        return 0.0, 0.0
    if n == 1:
        return 0.0, t[0] / b[0]
    mb, mt = sum(b) / n, sum(t) / n
    sbb = sbt = bb = bt = 0.0
    for x, y in zip(b, t):
        sbb += (x - mb) * (x - mb)
        sbt += (x - mb) * (y - mt)
        bb += x * x
        bt += x * y
    if sbb == 0:                                   # every point at one b: the constant model
        return 0.0, sum(y / x for x, y in zip(b, t)) / n
    c = sbt / sbb
    a = mt - c * mb
    if a < 0:
        a, c = 0.0, bt / bb
    if c < 0:
        a, c = mt, 0.0
    return float(a), float(c)


def _non_decreasing(t):
    """The least-squares non-decreasing sequence (pool adjacent violators)."""
    blocks = []                                   # [sum, count]
    for v in t:
        blocks.append([float(v), 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
    return np.concatenate([[s / n] * n for s, n in blocks])


def vectorized(costs):
    """t(b) of every ReplicaCost in `costs` at once (b: one per replica): the affine ones as arrays, the same
    arithmetic as `ReplicaCost.seconds`. Its attributes (affine, a, c, others, costs) serve the partition."""
    affine = np.array([c.kind == "affine" for c in costs], dtype=bool)
    a = np.array([c.a for c in costs], dtype=np.float64)
    c_ = np.array([c.c for c in costs], dtype=np.float64)
    others = np.flatnonzero(~affine)

    def seconds(b):
        b = np.asarray(b, dtype=np.float64)
        t = a + c_ * b
        for k in others:
            t[k] = costs[k].seconds(b[k])
        return np.where(b <= 0, 0.0, t)
    seconds.affine, seconds.a, seconds.c, seconds.others, seconds.costs = affine, a, c_, others, costs
    return seconds


class CostModel:
    """Every replica's ReplicaCost (the same object on every rank); what the FPM policies solve with."""

    def __init__(self, replicas, devices=None):
        self.replicas = list(replicas)
        self.devices = list(devices) if devices is not None else ["cpu"] * len(self.replicas)
        if len(self.devices) != len(self.replicas):
            raise ConfigError(f"a cost model of {len(self.replicas)} replicas with {len(self.devices)} devices")

    def __len__(self):
        return len(self.replicas)

    def seconds(self, sizes) -> np.ndarray:
        """Every replica's predicted compute seconds at its local batch (sizes: one per replica)."""
        return vectorized(self.replicas)(sizes)

    def makespan(self, sizes) -> float:
        """The predicted compute time of a step: the slowest replica's."""
        return float(np.max(self.seconds(sizes)))

    def describe(self) -> list[str]:
        return [f"replica {i} ({d}): {r.describe()}" for i, (r, d) in enumerate(zip(self.replicas, self.devices))]

    # --- state and files ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"format": FORMAT, "devices": list(self.devices), "replicas": [r.state_dict() for r in self.replicas]}

    @classmethod
    def from_state(cls, state, where: str = "cost model") -> "CostModel":
        """The model a stored state describes, checked first (`state_problem`): one ConfigError line naming
        `where` and the field otherwise."""
        problem = state_problem(state)
        if problem:
            raise ConfigError(f"{where}: {_problem_text(*problem)}")
        return cls([ReplicaCost.from_state(r) for r in state["replicas"]], state.get("devices"))

    def doubts(self) -> list[str]:
        """Each doubtful replica's doubts, as 'replica i: ...'."""
        return [f"replica {i}: {'; '.join(d)}" for i, d in enumerate(r.doubts() for r in self.replicas) if d]

    def save(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.state_dict(), f, indent=1)

    @classmethod
    def load(cls, path) -> "CostModel":
        try:
            with open(path, "rb") as f:
                text = f.read(MAX_FILE_BYTES + 1)         # a size limit: /dev/zero is a path too
            if len(text) > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES // 2 ** 20} MiB")
            state = json.loads(text)
        except (OSError, ValueError, RecursionError) as e:
            raise ConfigError(f"cannot read the cost model {path}: {e}") from None
        return cls.from_state(state, f"cost model {path}")

    @classmethod
    def affine(cls, fixed_s, per_sample_s, devices=None, points=(1, 2)) -> "CostModel":
        """The model of known affine costs a_i + c_i b (emulated devices, tests), from two exact points."""
        reps = [ReplicaCost([(b, a + c * b) for b in points]) for a, c in zip(fixed_s, per_sample_s)]
        return cls(reps, devices)
