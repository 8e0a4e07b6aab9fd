"""One synchronous data-parallel step of P replicas, vectorized over the replicas.

A step is forward (layers 0..L-1), backward (L-1..0), the gradient allreduce, then the optimizer update.
Times are those of the profile's functional model at each replica's local batch b_i, times the step's
variability factor of that replica (noise, stragglers, its speed factor).

- Blocking reduction: one allreduce of the whole gradient buffer once the slowest replica is done.
- Non-blocking (the trainer's `BucketedReducer`): the buffer is cut from its end into buckets of
  ``bucket_bytes``; bucket k can start once every replica has finished the backward of the lowest layer
  it covers; buckets go one after the other on the network: c_k = max(c_{k-1}, ready_k) + T(bucket_k).
  That is across nodes. Within one node MPI moves the buckets through shared memory with the ranks' own
  cores, inside their MPI calls, so a bucket cannot move while its rank computes: on one node the
  buckets follow the slowest backward one after the other (measured: overlap gains nothing here, see
  docs/simulation.md).
- ``--sync_batchnorm``: every BatchNormalization layer reduces its statistics across replicas in forward
  (2C + 1 numbers) and in backward (2C): each is a barrier (the slowest replica sets the pace between
  two of them) plus a small, latency-bound allreduce.
- ``--speed_factors`` with the launcher's ``--emulate_speeds`` meaning: a replica of factor f computes as
  always, then waits until b_i * t_ref / (f / max f), t_ref the per-sample compute time of the full-speed
  replicas (the emulator's deadline).

- ``--grad_compression fp16|bf16``: the gradient crosses the network in 2 bytes an element instead of the
  profile's ``dtype_bytes`` (every reduction and bucket sends that fraction of its bytes; the buckets cut the
  buffer where they would without it, as the trainer's do). The casts, before the reduction and back after,
  are passes over the buffer that only move memory: reading d and writing 2 bytes an element, then reading 2 and
  writing d, 2 (d + 2) bytes against the 5 d of the profile's update (calibrate's and the roofline's are SGD with
  momentum: read the weight, the gradient and the velocity, write the weight and the velocity), so they cost
  update_s x 2 (d + 2) / (5 d), the profile's update as the yardstick of this device's memory speed; they
  follow the reduction (the trainer times them inside it).
- ``contention``: each replica's slowdown from the other ranks on its node (the profile's contention
  factor at that node's rank count), on all of its local work: compute, the per-step overhead, the update.

The launcher's other per-step work (taking the batch, targets, metrics: the profile's step_overhead_s,
o0 + o1 * b_i) delays each replica's arrival at the reduction; the trainer's per-step stats allreduce
(P + 8 float64) follows the update.

What each replica measures, as the trainer's `StepTimer` does: compute_s = from the start of its forward to
the end of its backward (sync-BN waits included), wait_s = from there to the reduced gradient.
"""
from __future__ import annotations

import numpy as np

from pydtnn.sim.collectives import allreduce_seconds
from pydtnn.sim.kinds import row_kinds

__all__ = ["StepModel", "Collective", "profile_groups"]


class Collective:
    """Allreduce seconds of n bytes among the P replicas under the chosen algorithm and node layout."""

    def __init__(self, algorithm, P, network, network_inter=None, nodes=1):
        self.algorithm, self.P, self.nodes = algorithm, int(P), int(nodes)
        self.intra = network.as_tuple()
        self.inter = (network_inter or network).as_tuple()
        self.overlaps_compute = self.nodes > 1          # shared-memory transfers need the ranks' cores

    def __call__(self, nbytes):
        if self.algorithm == "hierarchical":
            return allreduce_seconds("hierarchical", nbytes, self.P, *self.intra, nodes=self.nodes, inter=self.inter)
        params = self.inter if self.nodes > 1 else self.intra       # a flat collective across nodes: the slow links
        return allreduce_seconds(self.algorithm, nbytes, self.P, *params)


def profile_groups(profiles):
    """(distinct profiles, index (P,)): replica i has profile ``distinct[index[i]]`` (the same object may repeat:
    10^7 replicas of one profile are one group, found in linear time)."""
    ids = np.fromiter(map(id, profiles), dtype=np.int64, count=len(profiles))
    index, first = row_kinds(ids)
    return [profiles[i] for i in first.tolist()], index


class StepModel:
    """Built once per split (sizes); `step(factors)` simulates one step for per-replica factors (P,).

    Replicas alike (profile, local batch, contention, scale: `kinds.row_kinds`) share their per-layer timeline,
    computed once per kind: memory and time grow with P only through (P,)- and (P, points)-arrays."""

    def __init__(self, profiles, sizes, collective: Collective, *, non_blocking=False, sync_bn=False,
                 bucket_bytes=1 << 20, emulate=None, update_s=None, contention=None, scale=None, groups=None,
                 compression="none"):
        self.sizes = np.asarray(sizes, dtype=np.float64)
        P = self.sizes.size
        slow = np.ones(P) if contention is None else np.asarray(contention, dtype=np.float64)
        distinct, which = profile_groups(profiles) if groups is None else groups
        self.kind, rep = row_kinds(which, self.sizes, slow, None if scale is None else scale)
        K = rep.size
        first = profiles[0]
        L = len(first.layer_names)
        fwd, bwd = np.zeros((K, L)), np.zeros((K, L))
        pre = np.zeros(K)
        rep_group, rep_b, rep_slow = which[rep], self.sizes[rep], slow[rep]
        for g, prof in enumerate(distinct):
            rows = np.flatnonzero(rep_group == g)
            if rows.size:
                fwd[rows], bwd[rows] = prof.layer_seconds(rep_b[rows])
                o0, o1 = prof.step_overhead_s
                # the launcher's per-step work besides compute and reduction (batch, targets, metrics)
                pre[rows] = (o0 + o1 * rep_b[rows]) * rep_slow[rows]
        fwd *= rep_slow[:, None]
        bwd *= rep_slow[:, None]
        if scale is not None:              # a run's cost model: each replica's compute scaled to its t_i(b_i)
            rep_scale = np.asarray(scale, dtype=np.float64)[rep]
            fwd *= rep_scale[:, None]
            bwd *= rep_scale[:, None]
        self.update_s = (first.update_s if update_s is None else update_s) * float(slow.max())
        self.pre = pre[self.kind]
        # execution units: forward 0..L-1, then backward L-1..0; cumulative seconds at the end of each
        units = np.concatenate([fwd, bwd[:, ::-1]], axis=1)                    # (K, 2L)
        cum = np.cumsum(units, axis=1)
        unit_of_bwd = lambda j: 2 * L - 1 - j                                   # noqa: E731
        points = []                                                             # (unit, kind, payload)
        if sync_bn and P > 1:
            for j in np.nonzero(first.bn_channels)[0]:
                c = int(first.bn_channels[j])
                points.append((int(j), "sync", (2 * c + 1) * 8))                # forward: sums, squares, count
                points.append((unit_of_bwd(j), "sync", 2 * c * 8))              # backward: two sums
        buckets = []
        if non_blocking and P > 1:
            starts = np.concatenate([[0], np.cumsum(first.param_bytes)[:-1]])  # byte offset of each layer
            total = int(first.param_bytes.sum())
            hi = total
            while hi > 0:
                lo = max(0, hi - int(bucket_bytes))
                owner = int(np.searchsorted(starts, lo, side="right") - 1)      # layer holding byte lo
                while owner > 0 and first.param_bytes[owner] == 0:
                    owner -= 1
                buckets.append(hi - lo)
                points.append((unit_of_bwd(owner), "bucket", len(buckets) - 1))
                hi = lo
        points.append((2 * L - 1, "end", None))
        points.sort(key=lambda p: (p[0], p[1] != "sync"))                     # a barrier first at the same unit
        seg_start = -1
        within = np.zeros((K, len(points)))
        for k, (u, kind, _) in enumerate(points):
            within[:, k] = cum[:, u] - (cum[:, seg_start] if seg_start >= 0 else 0.0)
            if kind == "sync":
                seg_start = u
        self.points, self.within_kind = points, within                         # (K, points): per kind
        self.collective = collective
        self.sync_s = {k: collective(p[2]) for k, p in enumerate(points) if p[1] == "sync"}
        d = float(first.dtype_bytes)
        wire = 2.0 / d if compression != "none" else 1.0                      # bytes sent per byte of gradient
        self.bucket_s = collective(np.asarray(buckets, dtype=np.float64) * wire) if buckets else np.zeros(0)
        self.full_s = float(collective(float(first.param_bytes.sum()) * wire)) if P > 1 else 0.0
        self.cast_s = self.update_s * 2 * (d + 2) / (5 * d) if compression != "none" and P > 1 else 0.0
        # the trainer's per-step stats reduction: loss, metrics, P compute times, 3 flags (float64)
        self.stats_s = float(collective(8.0 * (P + 8))) if P > 1 else 0.0
        self.non_blocking = bool(buckets)
        self.compute_alone = cum[:, -1][self.kind]                             # no noise, no barriers
        self.emulate = None
        if emulate is not None:            # (ratio_i = max f / f_i, per-sample time of the reference replicas)
            ratio = np.asarray(emulate, dtype=np.float64)
            ref = ratio == ratio.min()
            t_ref = float(np.mean(self.compute_alone[ref] / self.sizes[ref]))
            self.emulate = self.sizes * t_ref * ratio

    @property
    def within(self) -> np.ndarray:
        """(P, points): each replica's seconds from the previous barrier to each point, before its factor."""
        return self.within_kind[self.kind]

    def step(self, factors):
        """(step seconds, compute_s (P,), wait_s (P,)) for this step's per-replica factors."""
        f = np.asarray(factors, dtype=np.float64)
        scaled = (self.within_kind[0][None, :] if self.within_kind.shape[0] == 1 else self.within) * f[:, None]
        peak = scaled.max(axis=0)
        g = 0.0
        ready = []
        end = None
        for k, (_, kind, _) in enumerate(self.points):
            if kind == "sync":
                g += peak[k] + self.sync_s[k]
            elif kind == "bucket":
                ready.append(g + peak[k])
            else:
                end = g + scaled[:, k]
        if self.emulate is not None:
            end = np.maximum(end, self.emulate * f)
        busy = end + self.pre
        last = float(busy.max())
        if self.non_blocking and not self.collective.overlaps_compute:
            reduced = last + float(self.bucket_s.sum())
        elif self.non_blocking:
            c = 0.0
            for r, t in zip(ready, self.bucket_s):
                c = max(c, r) + t
            reduced = max(c, last)
        else:
            reduced = last + self.full_s
        reduced += self.cast_s
        return reduced + self.update_s + self.stats_s, end, reduced - busy
