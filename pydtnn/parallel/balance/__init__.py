"""Balancing, the project's reason to exist: how the global batch is split among replicas of different speeds,
and when it is re-split. This package is its one wing:

    __init__.py        `BalancePolicy` (the plug-in interface, `--balance FILE.py:CLASS`), `check_split` (every
                       split a policy returns), `probe_speeds` (every replica's speed from a few timed calls)
    proportional.py    the global batch split in proportion to speeds, within memory caps
    policies.py        the built-in policies, registered once (`BUILTINS`: the names, their options, the
                       factory `make_policy` and `--balance`'s help all come from it)
    cost_model.py      each replica's t_i(b): the functional performance model (FuPerMod's FPM)
    fpm_probe.py       the FPM built from timed points; fpm_partition.py: the split with equal finish times
    probe.py           the lock-step probe before training (`LockStepProbe`, `probe_split`), GPU memory caps
    policy_calls.py    a policy's calls: its failures as one line, its splits agreed on by the ranks
    policy_state.py    the fpm and dynamic policies' checkpointed state, checked as data
    step_report.py     what `after_step` is told after each step

Every rank owns its own instances and feeds them the same numbers, so every rank takes the same decision
without further communication; only the probes gather. Which samples a replica takes at a step is
`pydtnn.parallel.sharding`, not balancing.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance.proportional import checked_int, partition

__all__ = ["BalancePolicy", "check_split", "probe_speeds", "median_call_seconds"]


# ------------------------------------------------------------------------------------ policies

class BalancePolicy:
    """How the global batch is split among the replicas: the plug-in interface (`--balance FILE.py:CLASS`).

    The built-ins (`pydtnn.parallel.balance.policies`) are written on it. Every rank owns one instance and calls it
    with the same arguments; every split it returns is checked (`check_split`: sum B, each >= 1 or 0 where
    allowed, within the caps) and, for a policy that is not a built-in, agreed on across the ranks
    (`pydtnn.parallel.balance.policy_calls`) before it is used. A user's class is constructed with the
    ``--balance_options`` as keyword arguments; an exception in its code is one line plus its own frames.

    What a policy may read, set by the framework:

    - ``rank``, ``nreplicas``: this replica's rank and the number of replicas P;
    - ``devices``: one of "cpu" / "gpu" per replica;
    - ``options``: the ``--balance_options`` dict (also the constructor's keyword arguments);
    - ``sizes``: the split in force (P ints summing to the global batch): set after ``initial_sizes``, after
      every re-split (before the next ``after_step``) and on resume;
    - ``listens``: whether the class defines ``after_step`` (one that does not is never told the steps).

    ``rank``, ``nreplicas``, ``devices`` and ``options`` are set (`bind`) before ``initial_sizes``. What a policy
    may set: ``reason`` (a string printed with each re-split: set it when returning one) and, on the class,
    ``measured`` (True: its split is restored on resume; False: one fixed by its options, recomputed, as equal
    and static are), ``wants_probe`` / ``wants_costs`` (the probes below), ``allow_zero`` (the replicas that may
    get 0 samples), ``checkpoint_key`` (where checkpoints keep its state); ``deterministic`` is the built-ins'
    (a pure function of what every rank is given alike: its splits are not agreed on).

    - ``initial_sizes(global_batch, nreplicas, caps)``: the split to start with (caps: bounds on the shares a
      caller may give, None or one int per replica; None from the launcher, `DataParallel` and the simulator,
      whose memory caps, --max_local_batch, bound a pass, not a share: `pydtnn.parallel.accumulation`);
    - ``after_step(step, report)``: after global step ``step``, a
      `pydtnn.parallel.balance.step_report.StepReport` (every replica's actual b_i, compute and wait seconds, the
      step's wall time, warm-up flags; it also reads as the list of seconds per sample); a new split, or
      None to keep the current one. ``step`` is 0-based and counts over epochs (a resume continues it); what
      a user reads counts from 1, as the step history and --trace_steps do: a split returned from
      ``after_step(9, ...)`` is announced "re-split after step 10", a failure there ends "in
      after_step(step=9), after step 10";
    - ``state_dict()`` / ``load_state_dict(state)``: plain JSON-able values saved in checkpoints;
    - ``describe()``: lines printed at the start (the model it balances by).

    Probes before training: ``wants_probe = True``: ``probed(global_batch, speeds, caps)`` with every
    replica's speed (samples/s) timed at the equal split (the constant model); ``wants_costs = True``:
    ``probe_costs(probe)`` with a probe that times every replica at any split (``probe.measure(sizes)``, the
    FPM's points).
    """

    name = "custom"
    measured = True
    wants_probe = False
    wants_costs = False
    deterministic = False       # a built-in: a pure function of what every rank is given alike
    sizes: list | None = None
    rank, nreplicas, devices, options = 0, 1, (), {}
    allow_zero: tuple = ()      # replicas that may get 0 samples (they then only join the reduction)
    reason: str | None = None
    # where checkpoints keep the state (the dynamic policy keeps the key older checkpoints used)
    checkpoint_key = "balance_policy_state"

    @property
    def listens(self) -> bool:
        """Whether this policy reads the steps (its class defines `after_step`): one that does not is told
        nothing, so the loop builds no report for it."""
        return type(self).after_step is not BalancePolicy.after_step

    def bind(self, rank, nreplicas, devices=None, options=None) -> None:
        self.rank, self.nreplicas = int(rank), int(nreplicas)
        self.devices = list(devices) if devices is not None else ["cpu"] * self.nreplicas
        self.options = dict(options or {})

    def initial_sizes(self, global_batch, nreplicas, caps):
        return partition(global_batch, [1.0] * int(nreplicas), caps)

    def after_step(self, step, report):
        return None

    def probed(self, global_batch, speeds, caps):
        return None

    def probe_costs(self, probe):
        return None

    def describe(self) -> list[str]:
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:
        pass


def check_split(sizes, global_batch: int, nreplicas: int, caps=None, who: str = "balance policy",
                zero_ok=()) -> list[int]:
    """A split a policy returned, or a one-line ConfigError naming the policy: P integers >= 1 (>= 0 for
    the replicas in ``zero_ok``) summing to B, each within its cap."""
    try:
        vals = [int(s) for s in sizes]
        exact = all(int(s) == s and not isinstance(s, bool) for s in sizes)
    except (TypeError, ValueError):
        raise ConfigError(f"{who} returned {sizes!r}, not a list of {nreplicas} integers") from None
    why = None
    if not exact or len(vals) != nreplicas:
        why = f"not a list of {nreplicas} integers"
    elif any(b < (0 if i in zero_ok else 1) for i, b in enumerate(vals)):
        why = "every replica needs at least one sample" + (f" (0 only for replicas {sorted(zero_ok)})"
                                                           if zero_ok else "")
    elif sum(vals) != global_batch:
        why = f"it sums to {sum(vals)}, not to the global batch {global_batch}"
    elif caps and any(b > c for b, c in zip(vals, caps)):
        why = f"it exceeds the local batch caps {list(caps)} (--max_local_batch)"
    if why:
        raise ConfigError(f"{who} returned the split {list(sizes)!r}: {why}")
    return vals


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
