"""The training loop: sequential or data-parallel with heterogeneity-aware batches and gradient weights.

One global step s (DESIGN.md, "Data-parallel step"):
1. every rank takes its b_i samples of the epoch's shared order (`balance.shard`), prefetched in the
   background during the previous step (`pydtnn.training.prefetch`);
2. forward + backward on them, the loss gradient scaled by w_i (proportional: b_i/B, uniform: 1/P), so
   that a SUM-allreduce of the flat gradient buffer gives sum_i w_i g_i (with --sync_batchnorm every
   BatchNormalization layer sums its per-channel statistics over the replicas on the way:
   `pydtnn.parallel.sync_batchnorm`);
3. the reduction (one blocking Allreduce, or reverse-order buckets overlapped with backward);
4. the optimizer step, identical on every rank;
5. a tiny SUM-allreduce of [b_i * loss, b_i * metrics, compute time per sample, wait seconds] so that every
   rank sees the same global loss (a NaN stops all ranks together) and the same speeds (dynamic balancing).
Time blocked in any of these collectives (3., 5., and the BatchNorm syncs inside 2.) is the step's wait,
never its compute (`pydtnn.observe.timing.StepTimer`).
Every rank runs the same number of steps whatever the split and the dataset size, so collectives match.

Preemption (SIGTERM, SIGUSR1): the handler only sets a flag; the flag rides in the step's stats allreduce
(5.), so every rank sees the same OR of it after the same step, writes one full checkpoint together (the
step inside the epoch and the epoch's partial sums included), and `fit` raises `Preempted`.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import signal
import threading
import time

import numpy as np

from pydtnn.callbacks import call
from pydtnn.training.checkpointing import load_checkpoint, save_checkpoint
from pydtnn.errors import CheckpointError, ConfigError, NumericalError, OutputError, PyDTNNError
from pydtnn.losses import get_loss
from pydtnn.metrics import get_metric
from pydtnn.model import as_targets
from pydtnn.training.loop_callbacks import HistoryWriter, ProgressBar
from pydtnn.parallel import balance
from pydtnn.parallel.comm import SerialComm, agree_on_error, raise_together
from pydtnn.parallel.data_parallel import DataParallel
from pydtnn.parallel.emulation import SpeedEmulator
from pydtnn.parallel.policies import make_policy
from pydtnn.training.prefetch import BatchPrefetcher
from pydtnn.observe.layer_profile import LayerProfile
from pydtnn.observe.layer_timer import LayerTimer
from pydtnn.observe.timeline import PREFETCH
from pydtnn.observe.timing import ReplicaStats, StepTimer, Timeline, epoch_summary, write_chrome_trace
from pydtnn.training.options import grouped


PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """Training stopped on a signal after a full checkpoint was written (not an error: resume from `path`)."""

    def __init__(self, signum, path, epoch, step, steps_per_epoch):
        self.signum, self.path, self.epoch, self.step, self.steps_per_epoch = signum, path, epoch, step, steps_per_epoch
        super().__init__(f"{signal.Signals(signum).name} received: checkpoint written to {path} "
                         f"(after epoch {epoch}, step {step} of {steps_per_epoch}); continue with --resume {path}")


class Trainer:
    """The training loop. Callbacks (`pydtnn.callbacks`, where their order is fixed): the schedulers, the
    user's `callbacks`, then the loop's own history file and progress bar (`pydtnn.training.loop_callbacks`).
    The checkpoint cadence and preemption stay in the loop: they act on the flags the ranks agree on in each
    step's stats reduction, and a preemption ends the loop."""

    def __init__(self, model, dataset, optimizer, *, loss="categorical_cross_entropy",
                 metrics=("categorical_accuracy",), parallel=None, loop=None, checkpointing=None, outputs=None,
                 emulation=None, **options):
        """`parallel`, `loop`, `checkpointing`, `outputs`, `emulation`: the option groups of
        `pydtnn.training.options`; each of their fields may be given as a keyword of its own too."""
        groups = grouped(dict(parallel=parallel, loop=loop, checkpointing=checkpointing, outputs=outputs,
                              emulation=emulation), options)
        par, run, ckpt, out, emu = (groups[k] for k in ("parallel", "loop", "checkpointing", "outputs", "emulation"))
        comm, global_batch, sizes, policy = par.comm, par.global_batch, par.sizes, par.policy
        gradient_weighting, balance_mode, rebalance_interval = par.gradient_weighting, par.balance_mode, par.rebalance_interval
        non_blocking, sync_batchnorm, max_local_batch, clip_grad_norm = (par.non_blocking, par.sync_batchnorm,
                                                                         par.max_local_batch, par.clip_grad_norm)
        steps_per_epoch, seed, schedulers, callbacks, eval_batch_size = (run.steps_per_epoch, run.seed, run.schedulers,
                                                                        run.callbacks, run.eval_batch_size)
        checkpoint_dir, save_steps, save_minutes, handle_signals, clock = (
            ckpt.checkpoint_dir, ckpt.save_steps, ckpt.save_minutes, ckpt.handle_signals, ckpt.clock)
        history_file, progress, tracer_output, log, flags = (out.history_file, out.progress, out.tracer_output,
                                                             out.log, out.flags)
        trace_steps, profile_layers = out.trace_steps, out.profile_layers
        emulate_speed, emulate_spin, emulate_reference = emu.emulate_speed, emu.emulate_spin, emu.emulate_reference
        self.model, self.dataset, self.optimizer = model, dataset, optimizer
        self.callbacks = list(callbacks)   # a user's (pydtnn.callbacks); the schedulers are callbacks too
        self.loss = get_loss(loss)
        self.metric_names = list(metrics)
        self.metric_fns = [get_metric(m) for m in self.metric_names]
        self.comm = comm or SerialComm()
        self.rank, self.nreplicas = self.comm.rank, self.comm.size
        self.global_batch = int(global_batch)
        self.gradient_weighting = gradient_weighting
        self.stats = ReplicaStats()
        self.timeline = Timeline(self.rank, enabled=bool(tracer_output), steps=trace_steps)
        self.tracer_output = tracer_output
        self.timer = StepTimer(self.stats, self.timeline if tracer_output else None)
        # the step's engine: split (a BalancePolicy; `balance_mode` names a built-in one), weighting,
        # reduction, synchronized BatchNorm, clipping, update
        self.dp = DataParallel(model, optimizer, global_batch=self.global_batch, comm=self.comm, sizes=sizes,
                               policy=policy if policy is not None else
                               make_policy(balance_mode, interval=rebalance_interval),
                               weighting=gradient_weighting, loss=self.loss, caps=max_local_batch,
                               non_blocking=non_blocking, sync_batchnorm=sync_batchnorm, clip_grad_norm=clip_grad_norm,
                               timer=self.timer)
        self.caps, self.policy, self.reducer = self.dp.caps, self.dp.policy, self.dp.reducer
        if self.reducer is not None and tracer_output:
            self.reducer.timeline = self.timeline
        self.sync_batchnorm = self.dp.sync_batchnorm
        self.emulator = SpeedEmulator(emulate_speed, spin=emulate_spin)
        self.emulate_reference = list(emulate_reference)      # ranks at full speed: the emulation follows them
        self.steps_per_epoch_arg = int(steps_per_epoch)
        self.steps_per_epoch = balance.steps_in_epoch(len(dataset.train), self.global_batch, self.steps_per_epoch_arg)
        if int(seed) < 0:
            raise ConfigError(f"seed must be >= 0, got {seed} (--seed)")
        self.seed = int(seed)
        self.balance_mode = balance_mode
        self.schedulers = list(schedulers)
        self.history_file = history_file
        self.progress = progress and self.rank == 0
        # the loop's own callbacks (pydtnn.training.loop_callbacks), run after the schedulers and the user's
        self.history_writer = HistoryWriter(history_file) if history_file else None
        self.progress_bar = ProgressBar(self.metric_names) if self.progress else None
        self.eval_batch_size = eval_batch_size or max(self.sizes)
        # what a person reads (epoch lines, per-replica tables) goes to stdout, in order with the rest
        self.log = log or (lambda msg: print(msg, flush=True) if self.rank == 0 else None)
        self.flags = flags or {}
        self.nclasses = model.output_shape[-1]        # classes of (N, K) or per-position (N, T, K) outputs
        self.stop_training = False
        self.history: list[dict] = []
        self.start_epoch = 0
        # --- checkpoints inside epochs, preemption ---
        self.checkpoint_dir = checkpoint_dir
        self.save_steps, self.save_minutes = int(save_steps), float(save_minutes)
        if self.save_steps < 0 or not self.save_minutes >= 0:
            raise ConfigError("checkpoint cadence must be >= 0 (--model_checkpoint_save_steps, "
                              "--model_checkpoint_save_minutes)")
        self.handle_signals = handle_signals
        self.clock = clock
        self._last_save_t = clock()
        self._last_step_file = None
        self._signal = None            # set by the handler; acted on when the ranks agree
        self.start_step = 0            # steps already done inside start_epoch (a mid-epoch checkpoint)
        self._partial = None           # that epoch's partial sums
        self.restored_split = False    # the split came from a checkpoint (no probe needed)
        self.finished = False
        self.prefetcher = BatchPrefetcher(self._take)
        # --tracing / --profile_layers: a timer around each layer, set on the model only in the steps it times
        self.layer_profile = LayerProfile() if profile_layers else None
        self._layer_timer = (LayerTimer(model.backend, self.timeline if tracer_output else None, self.layer_profile,
                                        waited=lambda: self.timer.step_wait_s)
                             if tracer_output or profile_layers else None)
        self.step_waits = np.zeros(self.nreplicas)
        self._steps_run = 0                   # steps run by this fit (the first is no layer profile's)
        self._side_depth = 0

    # the split in force and the clipping count live in the engine (self.dp)
    sizes = property(lambda self: self.dp.sizes, lambda self, sizes: self.dp.adopt(sizes))
    clipped_steps = property(lambda self: self.dp.clipped_steps)

    # --- one step ---------------------------------------------------------------------------------------
    def _running_stats(self):
        return self.dp.running_stats()

    @contextlib.contextmanager
    def side_passes(self):
        """Passes one rank runs on its own that must leave no trace (speed probes, emulation calibration):
        no BatchNorm collectives; running statistics, the dropout RNG and the gradients restored after."""
        saved = [a.copy() for a in self._running_stats()]
        rng = self.model.backend.rng
        rng_state = rng.bit_generator.state if hasattr(rng, "bit_generator") else None
        grads = self.model.grads.copy()
        self._side_depth += 1                 # nested (a probe's first pass calibrates the emulation)
        self.dp.sync_batchnorm_layers(False)
        try:
            yield
        finally:
            self._side_depth -= 1
            if not self._side_depth:
                self.dp.sync_batchnorm_layers(True)
            for a, s in zip(self._running_stats(), saved):
                a[...] = s
            if rng_state is not None:
                rng.bit_generator.state = rng_state
            self.model.grads[...] = grads

    def _calibrate_emulation(self, x, y, weight):
        """--emulate_speeds: this replica's own time per sample, before its first step (pydtnn.parallel.emulation);
        nothing once calibrated or at full speed."""
        if not self.emulator.active or self.emulator.calibrated:
            return
        def once():
            self.model.compute_gradients(x, y, self.loss, loss_scale=weight)
            self.model.backend.synchronize()
        with self.side_passes():
            self.emulator.calibrate(once, len(x))

    def _local_gradients(self, x, y, weight, overlap=True):
        self._calibrate_emulation(x, y, weight)          # a speed probe's first pass
        start = self.emulator.clock()
        waited = self.timer.step_wait_s
        value, y_pred = self.dp.local_gradients(x, y, weight, overlap)
        if self.emulator.active:        # the emulated compute excludes the waits in it (synchronized BatchNorm)
            with self._span("emulated slowdown", "backward"):
                self.emulator.pad(start + (self.timer.step_wait_s - waited), len(x))
        return value, y_pred

    def _take(self, indices, epoch):
        background = threading.current_thread() is not threading.main_thread()
        with self._span("prefetch" if background else "take batch", "data", tid=PREFETCH if background else 0,
                        samples=len(indices)):
            x, labels = self.dataset.train.take(indices, epoch=epoch)
            return x, as_targets(labels, self.nclasses, self.model.dtype)

    def _span(self, name, category, always=False, **kwargs):
        """A timeline event when tracing (``always``: also outside --trace_steps), else nothing."""
        if not self.tracer_output:
            return contextlib.nullcontext()
        return self.timeline.span(name, category, always=always, **kwargs)

    def _begin_step(self, step, b_i):
        """Before the 1-based global ``step``: the timeline's step; the layer timer in the steps it times
        (the traced ones; with --profile_layers every step but the run's first)."""
        self.timeline.set_step(step, b_i)
        timed = self._layer_timer is not None and (
            (self.tracer_output and self.timeline.active) or (self.layer_profile is not None and self._steps_run > 0))
        self.model.layer_timer = self._layer_timer if timed else None

    def _batch(self, indices, epoch, next_indices):
        """This step's batch, or (when this rank cannot read it: a corrupt shard) zeros of its shape and
        the error, which the step's stats reduction then makes every rank's."""
        try:
            return self.prefetcher.get(indices, epoch, next_indices), None
        except PyDTNNError as e:
            n, first = len(indices), self.model.layers[0]
            x = np.zeros((n,) + tuple(self.model.input_shape), np.int64 if getattr(first, "ids", False) else np.float32)
            return (x, np.zeros((n,) + tuple(self.model.output_shape), self.model.dtype)), e

    def train_step(self, indices, epoch, step_sizes, next_indices=None):
        b_i = len(indices)
        with self.timer.phase("data", category="data"):
            (x, y_host), data_error = self._batch(indices, epoch, next_indices)
        y = self.model.backend.asarray(y_host)          # one copy to the device
        step_total = sum(step_sizes)
        weight = self.dp.weight(step_sizes)
        self._calibrate_emulation(x, y, weight)          # before the timer: not this step's compute
        self.timer.start_step(b_i)
        with self.timer.compute(None):       # the layers' own events show it when tracing
            value, y_pred = self._local_gradients(x, y, weight)
        with self.timer.wait("allreduce", bytes=0 if self.nreplicas == 1 else int(self.model.grads.nbytes)):
            self.dp.reduce()
        with self.timer.phase("update", category="update"):
            self.dp.update()
        # reported loss and metrics are weighted by b_i whatever the gradient weighting
        local = [value] + [f(y_pred, y) for f in self.metric_fns]
        P = self.nreplicas
        stats = np.zeros(len(local) + 2 * P + 3)
        stats[:len(local)] = np.asarray(local) * (b_i / step_total)
        stats[len(local) + self.rank] = self.timer.step_compute_s / b_i
        stats[len(local) + P + self.rank] = self.timer.step_wait_s     # this reduction's own wait comes after
        # flags summed with the stats, so every rank takes the same decision after this step: a rank could
        # not read its batch; a signal arrived on some rank; rank 0's clock says a timed checkpoint is due
        stats[-3] = 1.0 if data_error is not None else 0.0
        stats[-2] = 1.0 if self._signal is not None else 0.0
        stats[-1] = 1.0 if self.rank == 0 and self._checkpoint_due_by_time() else 0.0
        with self.timer.wait("stats allreduce", bytes=int(stats.nbytes)):
            self.comm.allreduce_sum_(stats)
        self.timer.end_step()
        if stats[-3] > 0:
            agree_on_error(self.comm, data_error, "another rank could not read its batch")
        times = stats[len(local):len(local) + P]
        self.step_waits = stats[len(local) + P:len(local) + 2 * P]
        if self.emulator.active and self.emulate_reference:
            self.emulator.follow(float(np.mean(times[self.emulate_reference])))
        self.stop_requested = bool(stats[-2] > 0)
        self.save_requested = bool(stats[-1] > 0)
        return stats[:len(local)], times

    def _step_timing(self, sizes, times, seconds):
        """The layer profile's step time; for the callbacks' logs (identical on every rank), the step's
        throughput (over this rank's wall time of it) and each replica's b_i, compute and wait seconds."""
        if self.layer_profile is not None and self._steps_run > 0:
            self.layer_profile.add_step(seconds)
        self._steps_run += 1
        out = {"samples_per_s": sum(sizes) / seconds}
        for r, b in enumerate(sizes):
            out[f"rank{r}_b"] = int(b)
            out[f"rank{r}_compute_s"] = float(times[r] * b)
            out[f"rank{r}_wait_s"] = float(self.step_waits[r])
        return out

    def probe_split(self):
        """A policy that asks for it (probe: --balance static without --replica_speeds) gets every replica's
        speed, timed on a few local steps, and splits by it; nothing when the split came from a checkpoint."""
        if not self.policy.wants_probe or self.restored_split:
            return
        new = self.policy.probed(self.global_batch, self._probe_speeds(), self.caps)
        if new is not None:
            self.dp.adopt(self.dp.checked(new))

    def _probe_speeds(self):
        """Samples/s of every replica (the same list on every rank), from local steps that leave no trace."""
        B, P, caps = self.global_batch, self.nreplicas, self.caps
        b = max(1, min(B // P, min(caps) if caps else B))
        idx = self.dataset.train.epoch_order(self.seed, 0)[:b]
        x, labels = raise_together(self.comm, lambda: self.dataset.train.take(idx),
                                   "another rank could not read the speed probe's samples")
        y = as_targets(labels, self.nclasses, self.model.dtype)
        step = lambda: self._local_gradients(x, y, 1.0, overlap=False)      # noqa: E731
        with self.side_passes():       # each rank times its own number of steps: no BatchNorm collectives
            step()                                    # first call: allocations, compilation
            t0 = time.perf_counter()
            step()
            once = max(time.perf_counter() - t0, 1e-6)
            k = max(5, min(100, math.ceil(0.3 / once)))   # at least ~0.3 s of timed steps: short probes are noisy
            return balance.probe_speeds(step, self.comm, k=k, samples_per_call=len(idx)).tolist()

    def _checkpoint_due_by_time(self):
        return self.save_minutes > 0 and self.clock() - self._last_save_t >= 60.0 * self.save_minutes

    # --- epochs -----------------------------------------------------------------------------------------
    def fit(self, num_epochs):
        """Train from self.start_epoch up to num_epochs; returns the history (a list of per-epoch dicts)."""
        t_start = time.perf_counter()
        self.epochs_run = 0
        self.finished = False
        if self.tracer_output:
            self.timeline.start(self.comm)
        self.num_epochs = num_epochs
        callbacks = self._callbacks()
        # what writes files runs after the epoch's history row: a checkpoint after epoch N holds its row
        writers = [c for c in callbacks if getattr(c, "saves_files", False)]
        writers.sort(key=lambda c: c is not self.history_writer)       # the history file first
        others = [c for c in callbacks if c not in writers]
        # the bar ends on any way out (a diverged loss, an error): before the error's line on stderr
        bar = contextlib.closing(self.progress_bar) if self.progress_bar is not None else contextlib.nullcontext()
        with self._signal_handlers(), contextlib.closing(self.prefetcher), bar:
            call(callbacks, "on_train_begin", self)
            for epoch in range(self.start_epoch, num_epochs):
                self.first_step, self.start_step = self.start_step, 0
                call(callbacks, "on_epoch_begin", self, epoch)
                logs = self.train_epoch(epoch, num_epochs, self.first_step)
                self.epochs_run += 1
                call(others, "on_epoch_end", self, epoch, logs)
                logs["learning_rate_next"] = self.optimizer.learning_rate
                self.history.append(logs)
                call(writers, "on_epoch_end", self, epoch, logs)
                if self.stop_training or epoch + 1 == num_epochs:
                    break
                if self.stop_requested or self.save_requested or self._cadence_due(epoch, self.steps_per_epoch - 1):
                    self._step_checkpoint(epoch + 1, 0)
            call(callbacks, "on_train_end", self)
        self.elapsed = time.perf_counter() - t_start
        self.finished = True
        if self.tracer_output:
            # a collective (it gathers every rank's timeline); rank 0 writes
            raise_together(self.comm, lambda: write_chrome_trace(self.tracer_output, self.timeline,
                                                                 self.comm if self.nreplicas > 1 else None),
                           "rank 0 could not write the trace")
        return self.history

    def _callbacks(self):
        """Every callback in the order each hook runs: the schedulers, the user's, then the loop's own
        (history file, progress bar); `fit` moves the ones that save files after the epoch's row."""
        return self.schedulers + self.callbacks + [c for c in (self.history_writer, self.progress_bar) if c is not None]

    def rescue_checkpoint(self, epochs):
        """A full checkpoint after `epochs` epochs when an output failed (a collective); what to tell."""
        num_epochs = self.num_epochs
        path = os.path.join(self.checkpoint_dir, f"epoch_{epochs:04d}_step_000000.npz")
        try:
            self.save_checkpoint(path, epochs)
        except OutputError as e:
            return f"training stopped after epoch {epochs} of {num_epochs}, and its checkpoint failed too ({e})"
        return (f"training stopped after epoch {epochs} of {num_epochs}: its checkpoint was written to {path} "
                f"(continue with --resume {path})")

    # --- preemption and checkpoints inside epochs --------------------------------------------------------
    @contextlib.contextmanager
    def _signal_handlers(self):
        """SIGTERM/SIGUSR1 only set a flag (acted on after the current step); restored afterwards."""
        self.stop_requested = self.save_requested = False
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._on_signal) for s in PREEMPT_SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, signum, frame):
        self._signal = signum

    def _cadence_due(self, epoch, step):
        return self.save_steps > 0 and (epoch * self.steps_per_epoch + step + 1) % self.save_steps == 0

    def _step_checkpoint(self, epoch, step, partial=None):
        """A full checkpoint `epoch` epochs and `step` steps in; on a signal, then raise Preempted."""
        path = os.path.join(self.checkpoint_dir, f"epoch_{epoch:04d}_step_{step:06d}.npz")
        self.save_checkpoint(path, epoch, step=step, partial=partial)
        self._last_save_t = self.clock()
        stop = self.stop_requested
        self.stop_requested = self.save_requested = False
        if stop:
            signum = self.comm.allgather(float(self._signal or 0)).max()
            raise Preempted(int(signum) or signal.SIGTERM, path, epoch, step, self.steps_per_epoch)
        # keep only the newest cadence checkpoint: long runs would otherwise fill the disk
        if self.rank == 0 and self._last_step_file and self._last_step_file != path:
            with contextlib.suppress(OSError):
                os.unlink(self._last_step_file)
        self._last_step_file = path

    def train_epoch(self, epoch, num_epochs, first_step=0):
        split = self.dataset.train
        n = len(split)
        order = split.epoch_order(self.seed, epoch)
        self.stats.reset()
        sums = np.zeros(1 + len(self.metric_fns))
        samples = 0
        if first_step:                 # resumed inside this epoch: its sums so far come from the checkpoint
            sums[:] = self._partial["sums"]
            samples = int(self._partial["samples"])
            stats = self._partial.get("stats")
            if (isinstance(stats, list) and len(stats) == self.nreplicas and isinstance(stats[self.rank], list)
                    and len(stats[self.rank]) == 4):       # same replica count: this rank's totals so far
                steps, done, compute_s, wait_s = stats[self.rank]
                self.stats.steps, self.stats.samples = int(steps), int(done)
                self.stats.compute_s, self.stats.wait_s = float(compute_s), float(wait_s)
        t0 = time.perf_counter()
        self.epoch_sums, self.epoch_samples = sums, samples        # the progress bar's running means
        callbacks = self._callbacks()
        for step in range(first_step, self.steps_per_epoch):
            global_step = epoch * self.steps_per_epoch + step
            call(callbacks, "on_batch_begin", self, global_step)
            rate = self.optimizer.learning_rate        # the rate this step trains with
            sizes = balance.step_sizes(step, self.global_batch, self.sizes, n, self.steps_per_epoch_arg)
            idx = balance.shard(order, step, self.global_batch, self.sizes, self.rank, n, self.steps_per_epoch_arg)
            nxt = (balance.shard(order, step + 1, self.global_batch, self.sizes, self.rank, n,
                                 self.steps_per_epoch_arg) if step + 1 < self.steps_per_epoch else None)
            self._begin_step(global_step + 1, len(idx))
            t_step = time.perf_counter()
            means, times = self.train_step(idx, epoch, sizes, nxt)
            t_step = time.perf_counter() - t_step
            self.model.layer_timer = None
            timing = self._step_timing(sizes, times, t_step)
            if not math.isfinite(means[0]):
                raise NumericalError(f"the loss became {means[0]} at epoch {epoch + 1}, step {step + 1}: "
                                     f"training diverged (try a lower --learning_rate)")
            step_total = sum(sizes)
            sums += means * step_total
            samples += step_total
            self.epoch_samples = samples
            call(callbacks, "on_batch_end", self, global_step,
                 {"loss": float(means[0]), **{m: float(v) for m, v in zip(self.metric_names, means[1:])},
                  "learning_rate": rate, "batch_size": step_total, **timing})
            self.dp.after_step(global_step, times)
            last = step + 1 == self.steps_per_epoch
            if not last and (self.stop_requested or self.save_requested or self._cadence_due(epoch, step)):
                self._step_checkpoint(epoch, step + 1, self._partial_state(sums, samples))
        self._sync_running_stats()
        elapsed = time.perf_counter() - t0
        logs = {"epoch": epoch + 1, "loss": sums[0] / samples,
                **{m: v / samples for m, v in zip(self.metric_names, sums[1:])},
                "time_s": elapsed, "samples_per_s": samples / elapsed, "learning_rate": self.optimizer.learning_rate}
        val = self.dataset.val
        if val is not None and len(val):
            logs.update({f"val_{k}": v for k, v in self.evaluate(val).items()})
        summary = epoch_summary(self.comm, self.stats)
        for r in summary.rows:
            r["b_i"] = self.sizes[r["rank"]]      # the split in force, not a short last step's
            logs[f"rank{r['rank']}_b"] = r["b_i"]
            logs[f"rank{r['rank']}_samples"] = r["samples"]
            logs[f"rank{r['rank']}_compute_s"] = r["compute_s"]
            logs[f"rank{r['rank']}_wait_s"] = r["wait_s"]
        if self.rank == 0:
            self.log(f"epoch {epoch + 1}: " + ", ".join(f"{k}={v:.4f}" for k, v in logs.items()
                                                       if k in ("loss", "val_loss") or k.startswith(("val_", *self.metric_names))
                                                       or k in self.metric_names) + f", {elapsed:.2f} s")
            if self.nreplicas > 1:
                self.log(summary.format())
        return logs

    def _partial_state(self, sums, samples):
        """What a checkpoint inside an epoch needs to finish that epoch's history row bit-exactly."""
        rows = self.comm.gather_object([self.stats.steps, self.stats.samples, self.stats.compute_s,
                                        self.stats.wait_s], root=0)
        return {"sums": [float(v) for v in sums], "samples": int(samples), "global_batch": self.global_batch,
                "steps_per_epoch": self.steps_per_epoch, "train_samples": len(self.dataset.train),
                "stats": rows if self.rank == 0 else None}

    def _sync_running_stats(self):
        """BatchNorm running statistics: the b_i-weighted mean over replicas (upstream never synced them);
        synchronized BatchNorm keeps them identical, from the global batch, so there is nothing to do."""
        if self.nreplicas == 1 or self.sync_batchnorm:
            return
        share = self.sizes[self.rank] / self.global_batch
        for arr in self._running_stats():
            host = self.model.backend.to_numpy(arr).astype(np.float64) * share
            self.comm.allreduce_sum_(host)
            arr[...] = self.model.backend.asarray(host)

    # --- evaluation -------------------------------------------------------------------------------------
    def evaluate(self, split):
        """Loss and metrics over a whole split (inference mode), shared among replicas, weighted by samples."""
        with self._span("evaluate", "eval", always=True, samples=len(split)):
            return self._evaluate(split)

    def _evaluate(self, split):
        n = len(split)
        mine = np.array_split(np.arange(n), self.nreplicas)[self.rank]
        sums = np.zeros(3 + len(self.metric_fns))       # loss, metrics, samples, and a flag: a read failed
        error = None
        for start in range(0, len(mine), self.eval_batch_size):
            idx = mine[start:start + self.eval_batch_size]
            try:
                x, labels = split.take(idx)
            except PyDTNNError as e:        # this rank's part of a lazily read split (a corrupt shard)
                error, sums[-1] = e, 1.0
                break
            y = self.model.backend.asarray(as_targets(labels, self.nclasses, self.model.dtype))
            y_pred = self.model.forward(x, training=False)
            values = [self.loss(y_pred, y)[0]] + [f(y_pred, y) for f in self.metric_fns]
            sums[:-2] += np.asarray(values) * len(idx)
            sums[-2] += len(idx)
        self.comm.allreduce_sum_(sums)
        if sums[-1] > 0:
            agree_on_error(self.comm, error, "another rank could not read its part of the evaluation data")
        return {name: v / max(sums[-2], 1) for name, v in zip(["loss", *self.metric_names], sums[:-2])}

    # --- history, checkpoints ---------------------------------------------------------------------------
    def _rng_state(self):
        rng = self.model.backend.rng
        state = rng.bit_generator.state if hasattr(rng, "bit_generator") else None
        return json.loads(json.dumps(state, default=int))

    def save_checkpoint(self, path, epoch, step=0, partial=None):
        """Full state after `epoch` epochs and `step` more steps (a collective: every rank calls it; rank 0
        writes). An OutputError is raised on every rank; the previous file at `path` stays intact."""
        rng_states = self.comm.gather_object(self._rng_state(), root=0)

        def write():
            meta = {"epoch": int(epoch), "step": int(step), "nreplicas": self.nreplicas,
                    "sizes": list(map(int, self.sizes)), "rng_states": rng_states, "seed": self.seed,
                    "history": self.history, "schedulers": [[s.name, s.state_dict()] for s in self.schedulers],
                    "balancer": None, "balance_policy": self.policy.name,
                    self.policy.checkpoint_key: self.policy.state_dict() or None,
                    "partial_epoch": partial, "flags": self.flags}
            folder = os.path.dirname(os.path.abspath(path))
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as e:
                raise OutputError(f"cannot create the checkpoint folder {folder}: {e.strerror}") from None
            save_checkpoint(path, self.model, self.optimizer, json.loads(json.dumps(meta, default=_jsonable)))
        with self._span("checkpoint write", "checkpoint", always=True, path=os.path.basename(path)):
            raise_together(self.comm, write, f"rank 0 could not write the checkpoint {path}", rank0_only=True)

    def resume(self, path, keep_split=True, learning_rate=None, restore_optimizer=True):
        """Restore the state of a checkpoint (configuration stays the command line's).

        Elastic: a checkpoint of P replicas resumes on Q. The split and a dynamic balancer's measurements
        are kept only when P == Q and the global batch is the same (and, for the split, `keep_split`: it
        was measured, not given by flags); otherwise the caller's split stands and is re-measured.
        What the caller chose anew wins over the checkpoint: `learning_rate` (the optimizer's rate and the
        schedulers' base rate), ``restore_optimizer=False`` (another optimizer: only the weights), and a
        seed other than the checkpoint's (a new data order, and a fresh dropout stream).
        """
        meta = load_checkpoint(path, self.model, self.optimizer, restore_optimizer=restore_optimizer)
        self.start_epoch, self.start_step = meta["epoch"], meta["step"]
        self.history = list(meta["history"])
        same_layout = meta["nreplicas"] == self.nreplicas and sum(meta["sizes"]) == self.global_batch
        if self.start_step:
            part = meta["partial_epoch"]
            mine = {"global_batch": self.global_batch, "steps_per_epoch": self.steps_per_epoch,
                    "train_samples": len(self.dataset.train)}
            for key, value in mine.items():
                if part[key] != value:
                    raise CheckpointError(f"checkpoint {path} was written inside an epoch (step {self.start_step}) "
                                          f"with {key} {part[key]}, this run has {value}: resume with the same "
                                          f"data and global batch (--global_batch_size), or from an epoch-end "
                                          f"checkpoint")
            if len(part["sums"]) != 1 + len(self.metric_fns):
                raise CheckpointError(f"checkpoint {path} was written inside an epoch with other --metrics")
            self._partial = part
        self._restore_rng(meta["rng_states"], path, meta["seed"])
        if keep_split and same_layout:
            self.sizes = self._within_caps(list(meta["sizes"]))
            self.restored_split = True
        saved = dict((name, st) for name, st in meta["schedulers"])
        for s in self.schedulers:
            if s.name in saved:
                try:
                    s.load_state_dict(saved[s.name])
                except ConfigError as e:
                    raise CheckpointError(f"checkpoint {path}: metadata field 'schedulers': {e}") from None
        key = self.policy.checkpoint_key
        state = meta.get(key)
        if state is not None and meta.get("balance_policy", self.policy.name) == self.policy.name:
            if same_layout:
                try:
                    self.policy.load_state_dict(state)
                except (ConfigError, ValueError, KeyError, TypeError) as e:
                    raise CheckpointError(f"checkpoint {path}: metadata field '{key}': {e}") from None
            else:
                self.log(f"resume: the {self.policy.name} policy's measurements of {meta['nreplicas']} replica(s) "
                         f"do not apply to {self.nreplicas}; starting from {self.sizes} and re-measuring")
        self.dp.adopt(self.sizes)
        if learning_rate is not None:
            self.optimizer.learning_rate = float(learning_rate)
            for s in self.schedulers:
                if getattr(s, "base_lr", None) is not None:
                    s.base_lr = float(learning_rate)
        return meta

    def _within_caps(self, sizes):
        """A restored split under this run's memory caps (re-split in proportion to it where it exceeds them)."""
        if self.caps and any(b > c for b, c in zip(sizes, self.caps)):
            return balance.partition(self.global_batch, sizes, self.caps)
        return sizes

    def _restore_rng(self, states, path, seed):
        """Every saved RNG state is checked (on every rank, so all fail together); this rank's is restored."""
        rng = self.model.backend.rng
        if not hasattr(rng, "bit_generator"):
            return
        for r, state in enumerate(states):
            if state is None:
                continue
            try:
                _check_rng_state(state)
            except (TypeError, ValueError, KeyError, AttributeError):
                raise CheckpointError(f"checkpoint {path}: metadata field 'rng_states[{r}]' is not a valid "
                                      f"random generator state") from None
        if self.rank < len(states) and states[self.rank] is not None:
            rng.bit_generator.state = states[self.rank]
        if len(states) != self.nreplicas or seed != self.seed:
            # another replica count (or seed): dropout streams cannot continue one to one; a fresh stream per rank
            # that depends on where training resumes (never a replay of epoch 1's masks)
            self.model.backend.seed(self.seed * 1000003 + self.rank + 7919 * (1 + self.start_epoch * 100003
                                                                               + self.start_step))

    def report(self):
        """The final report's lines: time, time per epoch, throughput, peak memory."""
        samples = sum(h["samples_per_s"] * h["time_s"] for h in self.history[-self.epochs_run:]) if self.epochs_run else 0
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        lines = [f"training time: {self.elapsed:.2f} s over {self.epochs_run} epoch(s)",
                 f"time per epoch: {self.elapsed / max(self.epochs_run, 1):.2f} s",
                 f"throughput: {samples / max(self.elapsed, 1e-9):.1f} samples/s (all replicas)",
                 f"peak host memory (rank 0): {peak_mib:.0f} MiB"]
        return lines


def _check_rng_state(state):
    """A saved generator state of any replica's kind (a mixed job has NumPy and GPU generators): every rank
    checks every state the same way, so all ranks accept or refuse a checkpoint together."""
    from pydtnn.backends.gpu import rng as _gpu_random
    kind = state.get("bit_generator") if isinstance(state, dict) else None
    if kind == _gpu_random.KIND:
        _gpu_random.check_state(state)
    elif kind in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"):
        getattr(np.random, kind)().state = state
    else:
        raise ValueError(f"unknown generator kind {kind!r}")


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
