"""The probe before training: every replica timed at local batches of the policy's choosing, all replicas at
once, step by step, on passes that leave no trace (`DataParallel.side_passes`).

    probe = LockStepProbe(dp, dataset.train, seed, caps, devices, reports)
    seconds, flagged = probe.measure([128, 64, 64])    # every replica's median compute seconds at its size
    probe.warm([[8, 16, ..., 240], [], []])            # untimed passes (GPU shapes: plans, autotuning)
    probe.speeds()                                     # samples/s at the equal split (the constant model)

Lock step: every timed pass starts after a barrier, so every replica is timed while the others compute
too, as in training (a replica timed while another waits would find the machine's shared cores, memory
bandwidth or PCIe idle and look faster: identical replicas probed one after the other were split [73, 23]).
Each point is the median of k timed passes after one untimed warm-up pass at that size (allocations,
compilation, a cuDNN plan, unpadded where the device is emulated); k (3 to 15, about `TARGET_S` = 0.2 s of
the slowest replica, `--balance_options probe_s=` for fpm and dynamic) is agreed by all ranks. A timed pass
more than twice the median of the others is flagged (printed with the model, not fitted; the median already
leaves it out).

What it costs is shown and bounded: the policy's plan is printed first, then a line per point (its b_i, every
replica's median, its passes and seconds), and the run's report counts the probe's seconds beside training's.
A point's timed passes stop after `POINT_CAP_S` (2 s, or probe_s if longer) of the slowest replica's passes,
at least one: a replica 1000 times slower once kept a silent probe going for 7 minutes. The probe runs under
the Trainer's signal handlers: before each timed pass the ranks agree on a pending signal (`stop`), and one
stops every rank together (`ProbeStopped`), before any training step.

`agree_on_emulated_base`: --emulate_costs' factor form, the base time per sample every factor multiplies,
measured once before the probe by every replica on the same samples, all at once, and agreed
(`pydtnn.parallel.emulation`).

A GPU replica's memory cap, where the device says how much memory it holds: measured from the memory its
passes held at two local batches, m(b) = m0 + m1 b, as the largest b whose m(b) fits 90% of the device.
"""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np

from pydtnn.errors import PyDTNNError
from pydtnn.parallel.balance import policy_calls
from pydtnn.parallel.balance.proportional import partition
from pydtnn.parallel.comm import raise_together
from pydtnn.targets import as_targets

MIN_PASSES, MAX_PASSES, TARGET_S = 3, 15, 0.2
POINT_CAP_S = 2.0            # a point's timed passes, of the slowest replica, stop after this (at least one)


class ProbeStopped(BaseException):
    """A signal arrived during the probe: every rank raises it together, before any training step. Not an
    Exception, as KeyboardInterrupt is not: it passes through a policy's code (`policy_calls.call`) untouched."""

    def __init__(self, signum):
        self.signum = int(signum)
        super().__init__(f"signal {self.signum} during the probe")


class LockStepProbe:
    def __init__(self, dp, samples, seed, caps, devices, reports=None, memory=None, stop=None, log=None):
        """`dp`: the engine (its model, communicator, global batch; its passes that leave no trace);
        `samples`: the training split (`epoch_order`, `take`); `reports`: the engine's StepReports (the sizes
        this probe ran are no warm-up in training); `memory()`: (bytes the device's pool holds, bytes free on
        the device) or None (default: `device_memory` of the model's backend); `stop()`: the number of a
        signal pending on this rank, or 0 (the Trainer's handlers); `log`: rank 0's lines (the plan, a line per
        point)."""
        self.dp, self.samples, self.comm, self.seed = dp, samples, dp.comm, seed
        self.stop = stop or (lambda: 0)
        self.log = log or getattr(dp, "log", None) or (lambda line: None)
        self.target_s = TARGET_S                          # fpm's probe_s option sets it
        self.points = 0                                   # measured so far (the lines' numbers)
        self.global_batch, self.user_caps, self._measured = int(dp.global_batch), caps, False
        self.memory = memory or (lambda: device_memory(dp.model.backend))
        self.devices = list(devices) if devices else ["cpu"] * self.comm.size
        self.reports = reports
        self.passes = None
        self.ran: set[int] = set()
        self._batch = None

    @property
    def caps(self):
        """The bounds the split keeps: none. A replica's memory cap (--max_local_batch, lowered by a GPU
        replica's cap measured here) bounds the rows of one pass, not its share: on first use (a collective:
        every rank reads it at the same point) the caps are measured and handed to the engine (`dp.caps`), so
        that a point above a replica's cap runs as micro-batches, as training will, and its time is theirs
        (`pydtnn.parallel.accumulation`)."""
        if not self._measured:
            top = self.global_batch - (self.comm.size - 1)
            if self.user_caps is not None:
                top = min(top, self.user_caps[self.comm.rank])
            mine = -1.0
            if self.devices[self.comm.rank] == "gpu" and self.memory() is not None:
                with self.dp.side_passes():
                    mine = float(memory_cap(self.memory, self._pass, max(1, top // 4), top))
            every = [int(c) for c in self.comm.allgather(mine)]
            user = self.user_caps or [self.global_batch] * self.comm.size
            caps = [min(u, c) if c > 0 else u for u, c in zip(user, every)]
            self.dp.caps = None if self.user_caps is None and all(c <= 0 for c in every) else caps
            self._measured = True
        return None

    # --- the data ---------------------------------------------------------------------------------------
    def _data(self, b):
        """The first b samples of epoch 0's order (one read of the global batch, shared by all: a point may give
        a replica up to all but one sample per other replica, above its memory cap as micro-batches)."""
        top = self.global_batch
        if self._batch is None:
            model = self.dp.model
            idx = self.samples.epoch_order(self.seed, 0)[:top]
            x, labels = raise_together(self.comm, lambda: self.samples.take(idx),
                                       "another rank could not read the probe's samples")
            self._batch = (x, as_targets(labels, model.output_shape[-1], model.dtype))
        x, y = self._batch
        return x[:b], y[:b]

    def _pass(self, b, warm_up=False):
        if b <= 0:
            return
        x, y = self._data(b)
        y = self.dp.model.backend.asarray(y)
        emulator = getattr(self.dp, "emulator", None)
        if emulator is None or not emulator.agrees_on_base:     # (a base being agreed is no replica's own)
            self.dp.calibrate_emulation(x, y, 1.0)        # the emulated speed's unit, on the probe's first pass
        # a warm-up pass warms this machine's kernels: padding it to an emulated device's time would only wait
        with emulator.unpadded() if warm_up and emulator is not None else contextlib.nullcontext():
            self.dp.local_gradients(x, y, 1.0, overlap=False)

    # --- the probe's calls ---------------------------------------------------------------------------------
    def warm(self, sizes_per_replica):
        """Untimed passes at each of this replica's sizes (every rank calls it; no collectives inside)."""
        with self.dp.side_passes():
            for b in sizes_per_replica[self.comm.rank]:
                self._pass(b, warm_up=True)
                self.ran.add(int(b))
        if self.reports is not None:
            self.reports.warmed(self.comm.rank, sizes_per_replica[self.comm.rank])
        self.comm.barrier()

    def measure(self, sizes):
        """(every replica's median compute seconds at sizes[i], per replica the flagged passes' seconds)."""
        b = int(sizes[self.comm.rank])
        self.points += 1
        began = time.perf_counter()
        with self.dp.side_passes():
            if b not in self.ran:
                self._pass(b, warm_up=True)               # warm-up: not timed
                self.ran.add(b)
            times = [self._timed(b)]
            slowest = float(np.max(self.comm.allgather(times[0])))
            if self.passes is None:                       # k from the slowest replica's first pass
                self.passes = min(MAX_PASSES, max(MIN_PASSES, math.ceil(self.target_s / max(slowest, 1e-9))))
            # the point's cap: at most POINT_CAP_S (or probe_s) of the slowest replica's passes, the first included
            more = min(self.passes, math.floor(max(POINT_CAP_S, self.target_s) / max(slowest, 1e-9))) - 1
            for _ in range(max(0, more)):
                times.append(self._timed(b))
        if self.reports is not None:
            self.reports.warmed(self.comm.rank, [b])
        median = float(np.median(times)) if b > 0 else 0.0
        flagged = [t for t in times if b > 0 and t > 2 * np.median([u for u in times if u is not t] or [t])]
        gathered = np.asarray(self.comm.allgather(np.array([median, max(flagged, default=0.0), len(flagged)])))
        gathered = gathered.reshape(self.comm.size, 3)
        out_flagged = [[float(g[1])] * int(g[2]) if g[2] else [] for g in gathered]   # the worst, as often
        self.log(f"probe point {self.points}: b = {list(map(int, sizes))}, median compute "
                 f"{_ms(gathered[:, 0])} ms ({len(times)} timed pass{'es' if len(times) > 1 else ''} each"
                 f"{', capped' if more + 1 < self.passes else ''}; {time.perf_counter() - began:.2f} s)")
        return gathered[:, 0], out_flagged

    def _timed(self, b):
        self.agree_on_stop()                              # every replica starts the pass together
        t0 = time.perf_counter()
        self._pass(b)
        return time.perf_counter() - t0

    def agree_on_stop(self):
        """A collective (a barrier as well): every rank's pending signal; one stops every rank together."""
        pending = np.zeros(self.comm.size)
        pending[self.comm.rank] = float(self.stop() or 0)
        self.comm.allreduce_sum_(pending)
        if pending.any():
            raise ProbeStopped(int(pending.max()))

    def speeds(self):
        """Every replica's samples/s at the equal split (the constant model's one point)."""
        sizes = partition(self.global_batch, [1.0] * self.comm.size)
        seconds, _ = self.measure(sizes)
        return [b / max(t, 1e-9) for b, t in zip(sizes, seconds)]


# ------------------------------------------------------------------------------------- device memory

MEMORY_FRACTION = 0.9


def device_memory(backend):
    """(bytes the device's memory pool holds, bytes free on the device) for a CuPy backend, else None."""
    xp = getattr(backend, "xp", None)
    if getattr(xp, "__name__", "") != "cupy":
        return None
    try:
        free, _ = xp.cuda.runtime.memGetInfo()
        return float(xp.get_default_memory_pool().total_bytes()), float(free)
    except Exception:                   # noqa: BLE001  (a stand-in or a driver without it: no measured cap)
        return None


def memory_cap(memory, run, b_lo, b_hi):
    """The largest local batch whose memory fits MEMORY_FRACTION of the device, from the pool held after
    passes at b_lo and b_hi (m(b) = m0 + m1 b; a pool keeps its peak); 0 when it does not grow with b."""
    run(b_lo)
    held_lo, _ = memory()
    run(b_hi)
    held_hi, free = memory()
    per_sample = (held_hi - held_lo) / max(b_hi - b_lo, 1)
    if per_sample <= 0:
        return 0
    return int(b_hi + (MEMORY_FRACTION * (free + held_hi) - held_hi) // per_sample)


def probe_split(dp, samples, seed, stop=None) -> bool:
    """A policy that asks for it gets its probe before training: the FPM's points at several local batches
    (fpm, dynamic, static without --replica_speeds), or the speeds at the equal split (probe); its split is
    checked, agreed on and adopted by the engine `dp`. `samples`: the training split the probe reads; `stop`:
    as `LockStepProbe`'s (a signal raises ProbeStopped on every rank). Whether a probe ran."""
    policy = dp.policy
    if not (policy.wants_probe or policy.wants_costs):
        return False
    probe = LockStepProbe(dp, samples, seed, dp.caps, policy.devices, dp.reports, stop=stop)
    what = ("each replica's compute timed at several local batches, then refined at the proposed split"
            if policy.wants_costs else "each replica's speed timed at the equal split")
    probe.log(f"probe before training ({policy.name}): {what}; a line per point, each a warm-up pass and "
              f"{MIN_PASSES} to {MAX_PASSES} timed passes, at most {POINT_CAP_S:g} s of them (at least one)")
    new, error = None, None
    try:
        if policy.wants_costs:
            new = policy_calls.call(policy, "probe_costs", probe)
        else:
            new = policy_calls.call(policy, "probed", dp.global_batch, probe.speeds(), None)   # caps bound passes
        new = None if new is None else dp.checked(new)
    except PyDTNNError as e:
        error = e
    new = dp.agreed(new, error, "after the probe")
    if new is not None:
        dp.adopt(new)
    return True


def agree_on_emulated_base(dp, samples, seed, stop=None):
    """--emulate_costs' factor form (`SpeedEmulator.agrees_on_base`, alike on every rank): every replica times
    `CALIBRATION_PASSES` unpadded passes on the same B/P samples, all at once, and every rank takes the median
    of the replicas' times per sample as the base every factor multiplies (a collective; once). Returns the
    line that says so, or None where there is nothing to agree on."""
    from pydtnn.parallel.emulation import CALIBRATION_PASSES
    emulator = getattr(dp, "emulator", None)
    if emulator is None or not emulator.agrees_on_base:
        return None
    b = max(1, dp.global_batch // dp.comm.size)
    probe = LockStepProbe(dp, samples, seed, dp.caps, None, stop=stop)
    with dp.side_passes(), emulator.unpadded():
        probe._pass(b, warm_up=True)
        times = [probe._timed(b) for _ in range(CALIBRATION_PASSES)]
    every = dp.comm.allgather(float(np.median(times)) / b)
    return emulator.agree_on_base(np.asarray(every).reshape(-1), b, CALIBRATION_PASSES)


def _ms(seconds) -> str:
    return ", ".join(f"{t * 1e3:.4g}" for t in seconds)
