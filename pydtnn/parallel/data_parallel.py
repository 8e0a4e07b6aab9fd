"""DataParallel: heterogeneity-aware data parallelism for a researcher's own loop (and the Trainer's engine).

    dp = DataParallel(model, optimizer, global_batch=60, sizes=[10, 20, 30])   # under mpiexec -n 3
    for x, y in batches:                                  # every rank: the same global batch of 60 rows
        x_local, y_local = dp.local_slice(x, y)           # rank r: rows sum(sizes[:r]) .. sum(sizes[:r+1])
        loss = dp.train_step(x_local, y_local)            # the global batch's mean loss, on every rank

One step (`step`, the protocol `train_step` and the launcher's Trainer share):
1. forward + backward on this rank's b_i samples, the loss gradient scaled by w_i (`weighting`: proportional
   b_i/B by default, uniform 1/P), so that a SUM-allreduce of the flat gradient buffer gives sum_i w_i g_i
   (with sync_batchnorm every BatchNormalization layer sums its per-channel statistics over the replicas on
   the way: `pydtnn.parallel.sync_batchnorm`); with `accumulation_steps` K, as K micro-batches whose
   gradients add up to the same w_i g_i (`pydtnn.parallel.accumulation`);
2. the reduction (one blocking Allreduce, or reverse-order buckets overlapped with backward; in 16 bits with
   `grad_compression`: `pydtnn.parallel.comm.compression`);
3. optional clipping of the reduced gradient, then the optimizer's update (identical on every rank);
4. ONE SUM-allreduce of the step's record (`pydtnn.parallel.step_record`): the global batch's loss and
   metrics (weighted by b_i), every replica's compute seconds per sample and wait seconds, and the flags the
   ranks must agree on.
Time blocked in any of these collectives (2., 4., and the BatchNorm syncs inside 1.) is the step's wait, never
its compute (`pydtnn.observe.timing.StepTimer`). Then the policy's `after_step` with the step's report (every
replica's b_i, compute and wait seconds, the wall time, warm-up flags: `pydtnn.parallel.balance.step_report`), which may
change `sizes` (checked, agreed on by the ranks for a policy that is not a built-in, announced in one line). A
replica a policy gives 0 samples (`allow_zero`) computes nothing and adds a zero gradient.

What else touches only the engine's state lives here too, once: passes one rank runs alone that leave no
trace (`side_passes`: speed probes, the emulation's calibration), the emulated speed (`emulator`: each
forward + backward padded to its deadline), the replay of a step's CUDA graph (`graphs`), synchronized
BatchNorm and the running statistics.
"""
from __future__ import annotations

import contextlib

import numpy as np

from pydtnn.clipping import check_max_norm, clip_by_global_norm
from pydtnn.errors import PyDTNNError, ShapeError
from pydtnn.layers.batchnorm import BatchNormalization
from pydtnn.losses import get_loss
from pydtnn.observe.timing import StepTimer
from pydtnn.parallel import accumulation, balance
from pydtnn.parallel.balance import policy_calls, proportional
from pydtnn.parallel.comm import BucketedReducer, GradCompression, make_comm
from pydtnn.parallel.balance.policies import make_policy
from pydtnn.parallel.lagged_step import LaggedStep
from pydtnn.parallel.step_record import StepRecord
from pydtnn.parallel.balance.step_report import StepReport, StepReports
from pydtnn.parallel.sync_batchnorm import BatchNormSync
from pydtnn.parallel.weighting import make_weighting
from pydtnn.targets import as_targets


class DataParallel:
    def __init__(self, model, optimizer, *, global_batch, comm=None, sizes=None, policy=None,
                 weighting="proportional", loss="categorical_cross_entropy", caps=None, non_blocking=False,
                 sync_batchnorm=False, clip_grad_norm=0.0, timer=None, devices=None, log=None, emulator=None,
                 emulate_reference=(), graphs=None, accumulation_steps=1, grad_compression="none"):
        """`comm`: a pydtnn communicator (default: MPI's world when started by mpiexec with several
        processes, else one process); `sizes` or `policy` (a BalancePolicy or a --balance name) give the
        split (a policy that already holds its agreed first split, `policy.sizes`, is not asked again);
        `weighting`: "proportional", "uniform" or a function weights(sizes) -> list of w_i; `caps`: the most
        samples each replica holds in one pass (--max_local_batch): a share above it runs as micro-batches of at
        most that many, it never bounds the split (`pydtnn.parallel.accumulation`); `timer`: a
        pydtnn.observe.timing.StepTimer that counts the synchronized BatchNorm's reductions as wait (default: one
        of its own, which `train_step` reads, so the seconds it hands the policy are compute without those
        waits); `emulator`: a pydtnn.parallel.emulation.SpeedEmulator (each forward + backward padded to its
        deadline) and `emulate_reference` the full-speed ranks it follows; `graphs`: a
        pydtnn.parallel.step_graphs.StepGraphs that replays forward + backward as a CUDA graph;
        `accumulation_steps` K: each replica runs its local batch as K micro-batches, one reduction and one
        update per global step (`pydtnn.parallel.accumulation`);
        `grad_compression`: "none", "fp16" or "bf16", the format the weighted gradient crosses the network in
        (`pydtnn.parallel.comm.compression`; one replica communicates nothing and compresses nothing)."""
        self.model, self.optimizer = model, optimizer
        self.comm = comm if comm is not None else make_comm("auto")
        self.rank, self.nreplicas = self.comm.rank, self.comm.size
        self.loss = get_loss(loss)
        self.global_batch = int(global_batch)
        self.caps = proportional.caps_for(caps, self.nreplicas)
        self.accumulation_steps = accumulation.check_steps(accumulation_steps)
        self.accumulated = accumulation.AccumulatedGradients()
        # `log`: where a re-split is announced (default: printed by rank 0)
        self.log = log or (lambda msg: print(msg, flush=True) if self.rank == 0 else None)
        self.policy = make_policy("none" if policy is None else policy)
        if self.policy.sizes is None:        # asked once in a run: the launcher's policy comes with its split
            proposed, error = None, None
            try:
                proposed = policy_calls.initial_split(self.policy, self.global_batch, self.nreplicas, None,
                                                      self.rank, devices)
            except PyDTNNError as e:
                error = e
            proposed = self.agreed(proposed, error, "for the initial split")
        else:
            proposed = self.policy.sizes
        self.adopt(proposed if sizes is None else
                   balance.check_split(sizes, self.global_batch, self.nreplicas, None, "local batch sizes",
                                       self.policy.allow_zero))
        self.weights = make_weighting(weighting)      # weights(sizes) -> every replica's w_i
        self.weights(self.sizes)                      # a user's function that fails, fails before any step
        self.reports = StepReports(self.nreplicas)    # what after_step tells the policy
        self.emulator = emulator                      # pydtnn.parallel.emulation.SpeedEmulator, or None
        self.emulate_reference = list(emulate_reference)
        self.graphs = graphs
        self.clip_grad_norm = check_max_norm(clip_grad_norm)
        self.clipped_steps = 0         # steps whose reduced gradient was clipped (same count on every rank)
        self.compression = GradCompression(grad_compression)
        self.reducer = (BucketedReducer(self.comm, model.grads, compression=self.compression)
                        if non_blocking and self.nreplicas > 1 else None)
        # sync_batchnorm: BatchNorm layers use the global batch's statistics (one process: nothing to sync)
        self.sync_batchnorm = bool(sync_batchnorm) and self.nreplicas > 1
        self.timer = timer if timer is not None else StepTimer()
        self._bn_sync = BatchNormSync(self.comm, timer=self.timer) if self.sync_batchnorm else None
        self.micro_batch_counts(self.sizes)          # a split too small for the micro-batches: refused now
        self.sync_batchnorm_layers(True)
        self._side_depth = 0
        self.plan_guard = None          # what guard_plans measured ({}: nothing to compare)
        self.steps = 0
        # replicas start from the same weights and running statistics (rank 0's)
        self.comm.bcast_(model.params, root=0)
        for arr in self.running_stats():
            self.comm.bcast_(arr, root=0)

    # --- the split -------------------------------------------------------------------------------------
    def checked(self, sizes):
        """A split the policy returned (its micro-batches possible: `micro_batch_counts`), or a one-line
        ConfigError naming the policy."""
        sizes = balance.check_split(sizes, self.global_batch, self.nreplicas, None,
                                    f"balance policy {self.policy.name}", self.policy.allow_zero)
        self.micro_batch_counts(sizes)
        return sizes

    def agreed(self, split, error, when):
        """The policy's split (or None) once every rank agrees on it (`pydtnn.parallel.balance.policy_calls`)."""
        if policy_calls.needs_agreement(self.policy, self.comm):
            return policy_calls.agree(self.comm, self.policy, split, error, when)
        if error is not None:
            raise error
        return split

    def adopt(self, sizes):
        """The split in force from now on (the policy sees it as `policy.sizes`)."""
        self.sizes = list(sizes)
        self.policy.sizes = list(sizes)

    def after_step(self, step, record, step_sizes=None):
        """The policy's decision after global step `step` (0-based, as the policy's `after_step` is given it) of
        `step_sizes` (default the split in force), told as a StepReport (from the step's agreed `record`, or a
        list of seconds per sample); a new split is checked, agreed on, announced in one line, then in force.
        A policy that does not read the steps (`BalancePolicy.listens`: equal, static, fpm) is not called.
        What a user reads counts steps from 1, as the step history and --trace_steps do: "after step
        {step + 1}"; a failure names the call as the policy received it, "in after_step(step={step})"."""
        if not self.policy.listens:
            return
        sizes = list(self.sizes if step_sizes is None else step_sizes)
        report = (self.reports.report(record, sizes) if isinstance(record, StepRecord)
                  else StepReport.of(record, sizes))
        new, error = None, None
        try:
            new = policy_calls.call(self.policy, "after_step", step, report)
            new = None if new is None else self.checked(new)
        except PyDTNNError as e:
            error = e
        new = self.agreed(new, error, f"in after_step(step={step}), after step {step + 1}")
        if new is not None and new != self.sizes:
            reason = getattr(self.policy, "reason", None)
            self.log(f"re-split after step {step + 1}: {self.sizes} -> {new}" + (f" ({reason})" if reason else ""))
            self.adopt(new)

    def local_slice(self, x, y):
        """This rank's contiguous rows of the global batch (x, y): rows sum(sizes[:r]) .. sum(sizes[:r+1])."""
        if len(x) != self.global_batch or len(y) != self.global_batch:
            raise ShapeError(f"local_slice takes the global batch of {self.global_batch} rows, got {len(x)} inputs "
                             f"and {len(y)} targets")
        lo = sum(self.sizes[:self.rank])
        hi = lo + self.sizes[self.rank]
        return x[lo:hi], y[lo:hi]

    # --- the pieces of a step (`step` times each) ---------------------------------------------------------
    def weight(self, step_sizes):
        """This replica's factor w_i on its mean gradient for a step of `step_sizes`."""
        return self.weights(step_sizes)[self.rank]

    def forward_backward(self, x, y, weight, overlap=True, sync=True, accumulated=None):
        """Forward + backward on this rank's samples, gradients scaled by `weight`; with non_blocking the
        reduction's buckets start while backward runs (`overlap=False`: a pass that must not communicate).
        Nothing waits for the device inside; `sync` waits for it at the end (the step's compute time is
        measured so); the loss returned is a scalar of the backend (`Backend.read_scalars` reads it).
        `accumulated` (the last micro-batch of several): the earlier ones' gradients are added in, each part
        of the buffer before its bucket starts."""
        hook = None
        if self.reducer is not None and overlap:
            self.reducer.start_step()
            hook = self.reducer.ready
        if accumulated is not None:
            hook = accumulated.ready(hook)
        value, y_pred = self.model.compute_gradients(x, y, self.loss, loss_scale=weight, on_grads_ready=hook)
        if accumulated is not None:
            accumulated.finish()
        if sync:        # the step's compute time is the device's: wait for it (after backward, not inside)
            self.model.backend.synchronize()
        return value, y_pred

    def micro_batch_counts(self, step_sizes):
        """Every replica's number of micro-batches in a step of `step_sizes` (`pydtnn.parallel.accumulation`;
        with synchronized BatchNorm the same on all, or a ConfigError line)."""
        return accumulation.micro_batch_counts(step_sizes, self.accumulation_steps, self.caps,
                                               common=self.sync_batchnorm)

    def own_micro_batches(self, b):
        """How many micro-batches this replica runs on b rows on its own (K, more above its memory cap)."""
        return accumulation.micro_batch_count(b, self.accumulation_steps, self.caps[self.rank] if self.caps else None)

    def first_micro_batch(self, x, y):
        """The rows of (x, y) a step's first micro-batch takes (all of them without accumulation)."""
        n = self.own_micro_batches(len(x))
        if n <= 1:
            return x, y
        lo, hi = accumulation.micro_batch_bounds(len(x), n)[0]
        return x[lo:hi], y[lo:hi]

    def local_gradients(self, x, y, weight, overlap=True, sync=True, micro_batches=None):
        """`forward_backward` as a step runs it, on `micro_batches` micro-batches of the rows (default: this
        replica's count for len(x) rows; `pydtnn.parallel.accumulation`) whose gradients add up to the
        `weight`-scaled mean gradient of them all; the loss is theirs, weighted by their sizes, and the
        predictions all of theirs. Each micro-batch replays a CUDA graph (`graphs`) where one serves and is
        padded to the emulated device's deadline for its own rows (`emulator`: a device pays its fixed cost
        per micro-batch; the waits inside, synchronized BatchNorm's, are no emulated compute)."""
        b = len(x)
        n = self.own_micro_batches(b) if micro_batches is None else micro_batches
        if n <= 1:
            return self._micro_batch(x, y, weight, overlap, sync)
        acc = self.accumulated
        acc.start(self.model.grads)
        if self.graphs is not None:
            self.graphs.micro_batches = True
        total, preds = None, []
        for j, (lo, hi) in enumerate(accumulation.micro_batch_bounds(b, n)):
            last = j == n - 1
            value, y_pred = self._micro_batch(x[lo:hi], y[lo:hi], weight * ((hi - lo) / b), overlap and last,
                                              sync and last, acc if last else None)
            if not last:
                acc.add()
                y_pred = y_pred.copy()          # the next micro-batch's forward reuses the layers' buffers
            value = value * ((hi - lo) / b)
            total = value if total is None else total + value
            preds.append(y_pred)
        acc.finish()                            # (a replayed graph calls no hook: the sum is added here)
        return total, self.model.xp.concatenate(preds)

    def _micro_batch(self, x, y, weight, overlap, sync, accumulated=None):
        emulating = self.emulator is not None and self.emulator.active
        start = self.emulator.clock() if emulating else None
        waited = self.timer.step_wait_s

        def eager():
            return self.forward_backward(x, y, weight, overlap, sync, accumulated)
        value, y_pred = eager() if self.graphs is None else self.graphs.gradients(x, y, weight, eager, sync=sync)
        if emulating:
            with self.timer.phase("emulated slowdown", category="backward"):
                self.emulator.pad(start + (self.timer.step_wait_s - waited), len(x))
        return value, y_pred

    def calibrate_emulation(self, x, y, weight):
        """The emulated speed's unit, this replica's own time per sample, timed on passes that leave no trace
        before its first step (`SpeedEmulator.calibrate`; without it, a loop of your own, the emulator takes
        the median of its first real steps); nothing once calibrated or at full speed."""
        emulator = self.emulator
        if emulator is None or not emulator.active or emulator.calibrated or not len(x):   # 0: sitting out
            return
        x, y = self.first_micro_batch(x, y)          # what a pass runs at once (and memory holds)

        def once():
            self.model.compute_gradients(x, y, self.loss, loss_scale=weight)
            self.model.backend.synchronize()
        with self.side_passes():
            emulator.calibrate(once, len(x))

    def no_samples(self, x, y, weight):
        """A step this replica sits out (a policy's split gave it 0 samples, where --balance_options allow_zero
        lets it): a zero gradient in the reduction, no compute."""
        self.model.grads[...] = 0
        if self.reducer is not None:
            self.reducer.start_step()
        return 0.0, None

    def reduce(self):
        """The SUM-allreduce of the weighted gradients: every rank then holds sum_i w_i g_i (sent in 16 bits with
        `grad_compression`)."""
        if self.reducer is not None:
            self.reducer.finish()
        elif self.nreplicas > 1:
            self.compression.allreduce_sum_(self.comm, self.model.grads)

    def update(self):
        if self.clip_grad_norm:    # on the reduced gradient: every replica clips the same buffer alike
            self.clipped_steps += clip_by_global_norm(self.model.grads, self.clip_grad_norm)[1]
        self.optimizer.step(self.model.params, self.model.grads)

    # --- the step protocol -----------------------------------------------------------------------------
    def step(self, x, y, weight, share, *, metric_fns=(), data_error=False, flags=None,
             lagged=False, step_sizes=None) -> StepRecord:
        """One step on this rank's b_i samples (x, and y on the device), 1. to 4. of the module's protocol;
        returns the record every rank agrees on. `weight`: this replica's w_i; `share`: b_i / the step's
        samples (the loss and `metric_fns` are reported b_i-weighted whatever the gradient weighting);
        `data_error` and the flags `flags()` returns (read after the update: a signal during the step counts
        in it) are agreed on with the record. `lagged` (one replica): nothing waits for the device; returns a
        `LaggedStep`, its flags known, its record read by `settled()`. With an emulator that follows
        full-speed replicas (`emulate_reference`), their compute per sample is its clock after each step.
        `step_sizes`: every replica's b_i in this step, which decide the micro-batches every replica runs with
        synchronized BatchNorm (default: this replica's own count, `pydtnn.parallel.accumulation`)."""
        b_i = len(x)
        micro = None if step_sizes is None else self.micro_batch_counts(step_sizes)[self.rank]
        if lagged and self.nreplicas > 1:
            raise ValueError("a lagged step needs one replica: several reduce their records every step")
        backend = self.model.backend
        self.timer.start_step(b_i)
        start = backend.mark() if lagged else None
        with self.timer.compute(None):       # the layers' own events show it when tracing
            value, y_pred = (self.local_gradients(x, y, weight, sync=not lagged, micro_batches=micro) if b_i
                             else self.no_samples(x, y, weight))
        end = backend.mark() if lagged else None
        sent = 0 if self.nreplicas == 1 else self.compression.wire_nbytes(self.model.grads)   # bytes on the wire
        with self.timer.wait("allreduce", bytes=sent):
            self.reduce()
        with self.timer.phase("update", category="update"):
            self.update()
        # the loss and metrics stayed on the device through the step: one read of them all, at its end
        values = [value] + ([f(y_pred, y) for f in metric_fns] if b_i else [0.0] * len(metric_fns))
        flags = dict(data_error=data_error, **(flags() if flags is not None else {}))
        if lagged:
            return LaggedStep(self, backend.read_scalars_later(values), share, b_i, start, end,
                              self.timer.step_wait_s, flags)
        weighted = backend.read_scalars(values) * share
        mine = StepRecord.of_replica(self.rank, self.nreplicas, weighted,
                                     self.timer.step_compute_s / b_i if b_i else float("nan"),
                                     self.timer.step_wait_s,      # not the wait of this record's own reduction
                                     **flags)
        packed = mine.pack()
        with self.timer.wait("stats allreduce", bytes=int(packed.nbytes)):
            self.comm.allreduce_sum_(packed)
        self.timer.end_step()
        record = StepRecord.unpack(packed, len(metric_fns), self.nreplicas)
        if self.emulate_reference and self.emulator is not None and self.emulator.active:
            self.emulator.follow(float(np.mean(record.compute_s_per_sample[self.emulate_reference])))
        return record

    # --- a whole step, for a researcher's loop -------------------------------------------------------------
    def train_step(self, x_local, y_local) -> float:
        """One data-parallel step on this rank's rows; returns the global batch's mean loss (every rank)."""
        b_i = self.sizes[self.rank]
        if len(x_local) != b_i or len(y_local) != b_i:
            raise ShapeError(f"rank {self.rank} holds {b_i} samples of the split {self.sizes}, got {len(x_local)} "
                             f"inputs and {len(y_local)} targets (use dp.local_slice)")
        y = self.model.backend.asarray(as_targets(y_local, self.model.output_shape[-1], self.model.dtype))
        if self.emulator is not None:
            self.emulator.step = self.steps
        record = self.step(x_local, y, self.weight(self.sizes), b_i / self.global_batch, step_sizes=self.sizes)
        self.after_step(self.steps, record)
        self.steps += 1
        return record.loss

    # --- BatchNorm ---------------------------------------------------------------------------------------
    def average_running_stats(self):
        """BatchNorm running statistics: the b_i-weighted mean over replicas (upstream never synced them);
        synchronized BatchNorm keeps them identical, from the global batch, so there is nothing to do."""
        if self.nreplicas == 1 or self.sync_batchnorm:
            return
        share = self.sizes[self.rank] / self.global_batch
        backend = self.model.backend
        for arr in self.running_stats():
            host = backend.to_numpy(arr).astype(np.float64) * share
            self.comm.allreduce_sum_(host)
            arr[...] = backend.asarray(host)

    def running_stats(self):
        return [a for layer in self.model.all_layers() for a in layer.state_arrays().values()]

    def sync_batchnorm_layers(self, on):
        """Synchronized BatchNorm on (when asked for) or off (passes one rank runs alone)."""
        sync = self._bn_sync if on else None
        for layer in self.model.all_layers():
            if isinstance(layer, BatchNormalization):
                layer.sync = sync

    def guard_plans(self, x, y, weight):
        """Once, after a step (its convolutions built and, with autotuning, tuned): time whole passes with the
        tuned plans and with the heuristic's and keep the faster set (`ConvRunner.guard`), in passes that leave
        no trace. Tuned plans that won alone could lose in a step (VGG-16's did on the H200). The launcher's
        loop calls it after its first step; nothing on a backend without cuDNN's plans."""
        conv = getattr(self.model.backend, "conv", None)
        if self.plan_guard is not None or conv is None:
            return
        x, y = self.first_micro_batch(x, y)          # the plans of the passes a step runs
        with self.side_passes():
            self.plan_guard = conv.guard(lambda: self.forward_backward(x, y, weight, overlap=False))

    # --- passes that leave no trace ---------------------------------------------------------------------
    @contextlib.contextmanager
    def side_passes(self):
        """Passes one rank runs on its own that must leave no trace (speed probes, emulation calibration):
        no BatchNorm collectives; running statistics, the dropout RNG and the gradients restored after."""
        saved = [a.copy() for a in self.running_stats()]
        rng = self.model.backend.rng
        rng_state = rng.bit_generator.state if hasattr(rng, "bit_generator") else None
        grads = self.model.grads.copy()
        self._side_depth += 1                 # nested (a probe's first pass calibrates the emulation)
        self.sync_batchnorm_layers(False)
        try:
            yield
        finally:
            self._side_depth -= 1
            if not self._side_depth:
                self.sync_batchnorm_layers(True)
            for a, s in zip(self.running_stats(), saved):
                a[...] = s
            if rng_state is not None:
                rng.bit_generator.state = rng_state
            self.model.grads[...] = grads
