"""Balancing: how the global batch is split among replicas of different speeds, and when it is re-split.

    BalancePolicy      the plug-in interface of the policies (`--balance`); the built-ins are in
                       `pydtnn.parallel.policies`; `check_split` checks every split a policy returns
    DynamicBalancer    re-splits during training from measured speeds (``--balance dynamic``)
    probe_speeds       every replica's speed, measured by a few timed local steps (``--balance probe``)

Every rank owns its own instances and feeds them the same numbers, so every rank takes the same decision
without further communication; only `probe_speeds` allgathers. The arithmetic they build on lives in
`pydtnn.parallel.partition` (the split) and `pydtnn.parallel.sharding` (which samples a replica takes at a
step); its names are re-exported here, where the training loop, the simulator and user code import them.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel.partition import caps_for, checked_int, checked_sizes, partition, predicted_step_time
from pydtnn.parallel.sharding import epoch_permutation, shard, step_sizes, step_span, steps_in_epoch

__all__ = [
    "partition", "caps_for", "predicted_step_time", "steps_in_epoch", "step_span", "step_sizes",
    "shard", "epoch_permutation", "DynamicBalancer", "probe_speeds", "median_call_seconds",
    "BalancePolicy", "check_split",
]


# ------------------------------------------------------------------------------------ policies

class BalancePolicy:
    """How the global batch is split among the replicas: the plug-in interface (`--balance FILE.py:CLASS`).

    The built-ins (`pydtnn.parallel.policies`: equal, static, probe, dynamic) are written on it. Every rank
    owns one instance and calls it with the same arguments, so every rank takes the same decision; every
    split it returns is checked (`check_split`: sum B, each >= 1, within the caps) before it is used.

    - ``initial_sizes(global_batch, nreplicas, caps)``: the split to start with (caps: None or one int per
      replica, from --max_local_batch);
    - ``after_step(step, seconds_per_sample)``: after global step ``step`` (0-based, over epochs), every
      replica's compute seconds per sample of that step (the same list on every rank); a new split, or
      None to keep the current one;
    - ``state_dict()`` / ``load_state_dict(state)``: plain JSON-able values saved in checkpoints.

    ``self.sizes`` holds the split in force: the training loop sets it (at the start, after a resume, after
    a re-split). A policy whose split is measured (``measured = True``) has its split restored on resume; one
    fixed by flags (equal, static) is recomputed from them. A policy with ``wants_probe = True`` gets
    ``probed(global_batch, speeds, caps)`` once before training, with every replica's speed (samples/s)
    measured by a few timed local steps.
    """

    name = "custom"
    measured = True
    wants_probe = False
    sizes: list | None = None
    # where checkpoints keep the state (the dynamic policy keeps the key older checkpoints used)
    checkpoint_key = "balance_policy_state"

    def initial_sizes(self, global_batch, nreplicas, caps):
        return partition(global_batch, [1.0] * int(nreplicas), caps)

    def after_step(self, step, seconds_per_sample):
        return None

    def probed(self, global_batch, speeds, caps):
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:
        pass


def check_split(sizes, global_batch: int, nreplicas: int, caps=None, who: str = "balance policy") -> list[int]:
    """A split a policy returned, or a one-line ConfigError naming the policy: P integers >= 1 summing to B,
    each within its cap."""
    try:
        vals = [int(s) for s in sizes]
        exact = all(int(s) == s and not isinstance(s, bool) for s in sizes)
    except (TypeError, ValueError):
        raise ConfigError(f"{who} returned {sizes!r}, not a list of {nreplicas} integers") from None
    why = None
    if not exact or len(vals) != nreplicas:
        why = f"not a list of {nreplicas} integers"
    elif min(vals) < 1:
        why = "every replica needs at least one sample"
    elif sum(vals) != global_batch:
        why = f"it sums to {sum(vals)}, not to the global batch {global_batch}"
    elif caps and any(b > c for b, c in zip(vals, caps)):
        why = f"it exceeds the local batch caps {list(caps)} (--max_local_batch)"
    if why:
        raise ConfigError(f"{who} returned the split {list(sizes)!r}: {why}")
    return vals


# ------------------------------------------------------------------------------------ dynamic balance

class DynamicBalancer:
    """Re-splits the global batch during training from measured replica speeds.

    Every rank owns one instance and feeds it the same allgathered numbers, so every rank takes the
    same decision without further communication.

    - ``observe(t)``: ``t`` holds P compute seconds per sample (replica i's forward+backward time of the
      last step divided by its b_i). The current window of ``interval`` steps is summarized by each
      replica's median (a first step that compiles kernels, or a pause, would drag a mean for several
      windows). An observation with a non-finite or non-positive entry is ignored (returns False).
    - ``maybe_rebalance(step)``: ``step`` is the 0-based index of the global step that has just been
      observed. Every ``interval`` steps (when ``(step + 1) % interval == 0``) the window's speeds
      v = 1 / median(t) update an exponential moving average,
      ``ema = smoothing * v + (1 - smoothing) * ema`` (the first window sets it; ``smoothing=1`` keeps
      only the last window). The candidate split ``partition(B, ema, caps)`` is then adopted, and returned,
      only if its predicted step time (max_i b_i / v_i) beats the current split's by more than the
      fraction ``hysteresis``; otherwise None. ``sizes`` always holds the split in force.

    Averaging a window, then smoothing across windows, divides the per-step timing noise by about
    sqrt(interval); ``hysteresis`` should exceed the noise that is left (a few percent), else the split
    flaps by a sample or two at each decision.
    """

    def __init__(self, global_batch: int, nreplicas: int, interval: int = 50, smoothing: float = 0.3,
                 hysteresis: float = 0.05, initial_sizes: Sequence[int] | None = None,
                 caps: Sequence[int] | None = None):
        self.global_batch = checked_int(global_batch, "global batch size", 1)
        self.nreplicas = checked_int(nreplicas, "number of replicas", 1)
        if self.global_batch < self.nreplicas:
            raise ConfigError(f"global batch size {self.global_batch} is smaller than the number of "
                              f"replicas {self.nreplicas}: every replica needs at least one sample")
        self.interval = checked_int(interval, "rebalance interval", 1)
        smoothing = float(smoothing)
        if not 0.0 < smoothing <= 1.0:
            raise ConfigError(f"rebalance smoothing must be in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        hysteresis = float(hysteresis)
        if not 0.0 <= hysteresis < 1.0:
            raise ConfigError(f"rebalance hysteresis must be in [0, 1), got {hysteresis}")
        self.hysteresis = hysteresis
        self.caps = caps_for(caps, self.nreplicas, "local batch caps")
        if initial_sizes is None:
            self.sizes = partition(self.global_batch, [1.0] * self.nreplicas, self.caps)
        else:
            self.sizes = checked_sizes(initial_sizes, self.global_batch)
            if len(self.sizes) != self.nreplicas:
                raise ConfigError(f"{len(self.sizes)} initial local batch sizes for {self.nreplicas} replicas")
        self._ema: np.ndarray | None = None
        self._window: list[np.ndarray] = []
        self.n_observed = 0
        self.n_rebalances = 0

    @property
    def speeds(self) -> np.ndarray | None:
        """Smoothed speeds (samples/s) or None before the first window was folded in."""
        return None if self._ema is None else self._ema.copy()

    def observe(self, compute_times_per_sample) -> bool:
        t = np.asarray(compute_times_per_sample, dtype=np.float64).reshape(-1)
        if t.size != self.nreplicas:
            raise ValueError(f"expected {self.nreplicas} compute times, got {t.size}")
        if not np.all(np.isfinite(t)) or np.any(t <= 0):
            return False
        self._window.append(t)
        self.n_observed += 1
        return True

    def maybe_rebalance(self, step: int) -> list[int] | None:
        if (int(step) + 1) % self.interval != 0:
            return None
        if self._window:
            v = 1.0 / np.median(np.asarray(self._window), axis=0)
            self._ema = v if self._ema is None else self.smoothing * v + (1.0 - self.smoothing) * self._ema
            self._window = []
        if self._ema is None:
            return None
        speeds = self._ema.tolist()
        candidate = partition(self.global_batch, speeds, self.caps)
        if candidate == self.sizes:
            return None
        now = predicted_step_time(self.sizes, speeds)
        new = predicted_step_time(candidate, speeds)
        if new < now * (1.0 - self.hysteresis):
            self.sizes = candidate
            self.n_rebalances += 1
            return list(candidate)
        return None

    def state_dict(self) -> dict:
        """Plain numbers/arrays for a checkpoint (no pickle needed)."""
        return {"sizes": np.asarray(self.sizes, dtype=np.int64),
                "ema": np.zeros(0) if self._ema is None else self._ema.copy(),
                "window": np.asarray(self._window, dtype=np.float64).reshape(-1, self.nreplicas),
                "n_observed": self.n_observed, "n_rebalances": self.n_rebalances}

    def load_state_dict(self, state: dict) -> None:
        self.sizes = checked_sizes(np.asarray(state["sizes"]).tolist(), self.global_batch)
        ema = np.asarray(state["ema"], dtype=np.float64)
        self._ema = ema.copy() if ema.size else None
        if "window" in state:
            window = np.asarray(state["window"], dtype=np.float64).reshape(-1, self.nreplicas)
        else:       # a checkpoint of a version that kept the window's sum: its mean, as often as it was seen
            n = int(state["window_n"])
            window = np.tile(np.asarray(state["window_sum"], dtype=np.float64) / max(n, 1), (n, 1))
        self._window = [row.copy() for row in window]
        self.n_observed = int(state["n_observed"])
        self.n_rebalances = int(state["n_rebalances"])


# ------------------------------------------------------------------------------------------ the probe

def probe_speeds(step_fn: Callable[[], object], comm, k: int = 5, samples_per_call: int = 1,
                 warmup: int = 1) -> np.ndarray:
    """Measure every replica's speed (samples/s); every rank returns the same P-vector.

    Each rank calls ``step_fn()`` ``warmup`` times untimed, then ``k`` times timed; ``step_fn`` runs one
    local forward+backward on ``samples_per_call`` samples (the caller's choice, typically the local
    batch it would train with) and must not communicate. This replica's speed is
    ``samples_per_call / median(times)``; the speeds are then allgathered through ``comm``.
    """
    k = checked_int(k, "probe steps", 1)
    samples = checked_int(samples_per_call, "probe samples per call", 1)
    median = max(median_call_seconds(step_fn, k, checked_int(warmup, "probe warm-up steps", 0)), 1e-9)
    return np.asarray(comm.allgather(samples / median), dtype=np.float64).reshape(-1)


def median_call_seconds(fn: Callable[[], object], k: int, warmup: int = 1, clock=time.perf_counter) -> float:
    """Call ``fn()`` ``warmup`` times untimed (allocations, compilation), then ``k`` times: the median
    seconds of those k calls (what the probe and the speed emulation's calibration measure)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(k):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return float(np.median(times))
