"""DataParallel: heterogeneity-aware data parallelism for a researcher's own loop (and the Trainer's engine).

    dp = DataParallel(model, optimizer, global_batch=60, sizes=[10, 20, 30])   # under mpiexec -n 3
    for x, y in batches:                                  # every rank: the same global batch of 60 rows
        x_local, y_local = dp.local_slice(x, y)           # rank r: rows sum(sizes[:r]) .. sum(sizes[:r+1])
        loss = dp.train_step(x_local, y_local)            # the global batch's mean loss, on every rank

One step (DESIGN.md, "Data-parallel step"): forward + backward on this rank's b_i samples with the loss
gradient scaled by w_i (`weighting`: proportional b_i/B by default), a SUM-allreduce of the flat gradient
buffer (one call, or reverse-order buckets overlapped with backward), optional clipping of the reduced
gradient, the optimizer's update (identical on every rank), then the policy's `after_step` with every
replica's compute seconds per sample, which may change `sizes` (checked before it is used).
"""
from __future__ import annotations


import numpy as np

from pydtnn.clipping import check_max_norm, clip_by_global_norm
from pydtnn.errors import ShapeError
from pydtnn.layers.batchnorm import BatchNormalization
from pydtnn.losses import get_loss
from pydtnn.model import as_targets
from pydtnn.parallel import balance
from pydtnn.parallel.comm import BucketedReducer, make_comm
from pydtnn.parallel.policies import make_policy
from pydtnn.parallel.sync_batchnorm import BatchNormSync
from pydtnn.parallel.weighting import make_weighting
from pydtnn.observe.timing import StepTimer


class DataParallel:
    def __init__(self, model, optimizer, *, global_batch, comm=None, sizes=None, policy=None,
                 weighting="proportional", loss="categorical_cross_entropy", caps=None, non_blocking=False,
                 sync_batchnorm=False, clip_grad_norm=0.0, timer=None):
        """`comm`: a pydtnn communicator (default: MPI's world when started by mpiexec with several
        processes, else one process); `sizes` or `policy` (a BalancePolicy or a --balance name) give the
        split; `weighting`: "proportional", "uniform" or a function weights(sizes) -> list of w_i; `caps`:
        the most samples each replica may hold (--max_local_batch); `timer`: a pydtnn.observe.timing.StepTimer that counts
        the synchronized BatchNorm's reductions as wait (default: one of its own, which `train_step` reads,
        so the seconds it hands the policy are compute without those waits)."""
        self.model, self.optimizer = model, optimizer
        self.comm = comm if comm is not None else make_comm("auto")
        self.rank, self.nreplicas = self.comm.rank, self.comm.size
        self.loss = get_loss(loss)
        self.global_batch = int(global_batch)
        self.caps = balance.caps_for(caps, self.nreplicas)
        self.policy = make_policy("none" if policy is None else policy)
        if sizes is None or self.policy.sizes is None:
            proposed = self.checked(self.policy.initial_sizes(self.global_batch, self.nreplicas, self.caps))
        self.adopt(proposed if sizes is None else
                   balance.check_split(sizes, self.global_batch, self.nreplicas, self.caps, "local batch sizes"))
        self.weights = make_weighting(weighting)      # weights(sizes) -> every replica's w_i
        self.clip_grad_norm = check_max_norm(clip_grad_norm)
        self.clipped_steps = 0         # steps whose reduced gradient was clipped (same count on every rank)
        self.reducer = BucketedReducer(self.comm, model.grads) if non_blocking and self.nreplicas > 1 else None
        # sync_batchnorm: BatchNorm layers use the global batch's statistics (one process: nothing to sync)
        self.sync_batchnorm = bool(sync_batchnorm) and self.nreplicas > 1
        self.timer = timer if timer is not None else StepTimer()
        self._bn_sync = BatchNormSync(self.comm, timer=self.timer) if self.sync_batchnorm else None
        self.sync_batchnorm_layers(True)
        self.steps = 0
        # replicas start from the same weights and running statistics (rank 0's)
        self.comm.bcast_(model.params, root=0)
        for arr in self.running_stats():
            self.comm.bcast_(arr, root=0)

    # --- the split -------------------------------------------------------------------------------------
    def checked(self, sizes):
        """A split the policy returned, or a one-line ConfigError naming the policy."""
        return balance.check_split(sizes, self.global_batch, self.nreplicas, self.caps,
                                   f"balance policy {self.policy.name}")

    def adopt(self, sizes):
        """The split in force from now on (the policy sees it as `policy.sizes`)."""
        self.sizes = list(sizes)
        self.policy.sizes = list(sizes)

    def after_step(self, step, seconds_per_sample):
        """The policy's decision after global step `step`; a new split is checked, then in force."""
        new = self.policy.after_step(step, [float(t) for t in seconds_per_sample])
        if new is not None:
            self.adopt(self.checked(new))

    def local_slice(self, x, y):
        """This rank's contiguous rows of the global batch (x, y): rows sum(sizes[:r]) .. sum(sizes[:r+1])."""
        if len(x) != self.global_batch or len(y) != self.global_batch:
            raise ShapeError(f"local_slice takes the global batch of {self.global_batch} rows, got {len(x)} inputs "
                             f"and {len(y)} targets")
        lo = sum(self.sizes[:self.rank])
        hi = lo + self.sizes[self.rank]
        return x[lo:hi], y[lo:hi]

    # --- the pieces of a step (the Trainer times each) ---------------------------------------------------
    def weight(self, step_sizes):
        """This replica's factor w_i on its mean gradient for a step of `step_sizes`."""
        return self.weights(step_sizes)[self.rank]

    def local_gradients(self, x, y, weight, overlap=True):
        """Forward + backward on this rank's samples, gradients scaled by `weight`; with non_blocking the
        reduction's buckets start while backward runs (`overlap=False`: a pass that must not communicate)."""
        hook = None
        if self.reducer is not None and overlap:
            self.reducer.start_step()
            hook = self.reducer.ready
        value, y_pred = self.model.compute_gradients(x, y, self.loss, loss_scale=weight, on_grads_ready=hook)
        self.model.backend.synchronize()
        return value, y_pred

    def reduce(self):
        """The SUM-allreduce of the weighted gradients: every rank then holds sum_i w_i g_i."""
        if self.reducer is not None:
            self.reducer.finish()
        elif self.nreplicas > 1:
            self.comm.allreduce_sum_(self.model.grads)

    def update(self):
        if self.clip_grad_norm:    # on the reduced gradient: every replica clips the same buffer alike
            self.clipped_steps += clip_by_global_norm(self.model.grads, self.clip_grad_norm)[1]
        self.optimizer.step(self.model.params, self.model.grads)

    # --- a whole step, for a researcher's loop -------------------------------------------------------------
    def train_step(self, x_local, y_local) -> float:
        """One data-parallel step on this rank's rows; returns the global batch's mean loss (every rank)."""
        b_i = self.sizes[self.rank]
        if len(x_local) != b_i or len(y_local) != b_i:
            raise ShapeError(f"rank {self.rank} holds {b_i} samples of the split {self.sizes}, got {len(x_local)} "
                             f"inputs and {len(y_local)} targets (use dp.local_slice)")
        y = self.model.backend.asarray(as_targets(y_local, self.model.output_shape[-1], self.model.dtype))
        self.timer.start_step(b_i)
        with self.timer.compute(None):               # its sync-BN reductions count as wait, not compute
            value, _ = self.local_gradients(x_local, y, self.weight(self.sizes))
        seconds = self.timer.step_compute_s
        with self.timer.wait():
            self.reduce()
        self.update()
        stats = np.zeros(1 + self.nreplicas)     # the b_i-weighted loss and every replica's seconds per sample
        stats[0] = float(value) * b_i / self.global_batch
        stats[1 + self.rank] = seconds / b_i
        self.comm.allreduce_sum_(stats)
        self.timer.end_step()                    # dp.timer.stats: this replica's compute and wait so far
        self.after_step(self.steps, stats[1:])
        self.steps += 1
        return float(stats[0])

    # --- BatchNorm ---------------------------------------------------------------------------------------
    def running_stats(self):
        return [a for layer in self.model.all_layers() for a in layer.state_arrays().values()]

    def sync_batchnorm_layers(self, on):
        """Synchronized BatchNorm on (when asked for) or off (passes one rank runs alone)."""
        sync = self._bn_sync if on else None
        for layer in self.model.all_layers():
            if isinstance(layer, BatchNormalization):
                layer.sync = sync
