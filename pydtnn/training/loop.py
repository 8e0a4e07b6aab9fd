"""The training loop (`Trainer`): epochs of global steps, the callbacks in their fixed order, evaluation.

The Trainer composes the run's parts and inherits none: the engine (`pydtnn.parallel.DataParallel`: split,
weighting, reduction, update, the emulated speed, the CUDA graph's replay), the loop's side of a step
(`pydtnn.training.step.TrainerStep`: the prefetched batch, the metrics), one epoch (`pydtnn.training.epoch.
EpochLoop`: its steps, each settled once its numbers are read, its history row), the checkpoints between
steps (`pydtnn.training.preemption`), the outputs' rescue (`pydtnn.training.output_rescue`) and the callbacks.
Nothing trained is lost when an output fails: the writers never raise into the loop nor enter a collective of
their own; the ranks agree on a failure after the step (a flag in its record) or at the epoch's end, and every
rank stops there together and writes the full checkpoint of that point.
Its options: `pydtnn.training.options`; its state in a checkpoint: `pydtnn.training.trainer_state`; the
speed probe: `pydtnn.parallel.balance.probe`; its own callbacks: `pydtnn.training.loop_callbacks`.
"""
from __future__ import annotations

import contextlib
import resource
import time

from pydtnn.callbacks import call
from pydtnn.errors import ConfigError, OutputError
from pydtnn.losses import get_loss
from pydtnn.metrics import get_metric
from pydtnn.observe.timeline import Timeline, write_chrome_trace
from pydtnn.observe.timing import ReplicaStats, StepTimer
from pydtnn.parallel import sharding, step_graphs
from pydtnn.parallel.balance.policies import make_policy
from pydtnn.parallel.balance.probe import ProbeStopped, agree_on_emulated_base, probe_split
from pydtnn.parallel.comm import SerialComm, raise_together
from pydtnn.parallel.data_parallel import DataParallel
from pydtnn.parallel.emulation import SpeedEmulator
from pydtnn.training import trainer_state
from pydtnn.training.epoch import EpochLoop
from pydtnn.training.evaluation import evaluate_split
from pydtnn.training.loop_callbacks import HistoryWriter, ProgressBar
from pydtnn.training.options import grouped
from pydtnn.training.output_rescue import OutputRescue
from pydtnn.training.preemption import Preempted, StepCheckpoints, StoppedBeforeTraining
from pydtnn.training.step import TrainerStep
from pydtnn.training.step_insight import StepInsight
from pydtnn.training.tokens import tokens_per_sample

__all__ = ["Trainer", "Preempted"]


class Trainer:
    """The training loop. Callbacks (`pydtnn.callbacks`, where their order is fixed): the schedulers, the
    user's `callbacks`, then the loop's own history file and progress bar (`pydtnn.training.loop_callbacks`).
    The checkpoint cadence and preemption are no callbacks (`pydtnn.training.preemption`): they act on the
    flags the ranks agree on in each step's record, and a preemption ends the loop."""

    def __init__(self, model, dataset, optimizer, *, loss="categorical_cross_entropy",
                 metrics=("categorical_accuracy",), parallel=None, loop=None, checkpointing=None, outputs=None,
                 emulation=None, **options):
        """`parallel`, `loop`, `checkpointing`, `outputs`, `emulation`: the option groups of
        `pydtnn.training.options`; each of their fields may be given as a keyword of its own too."""
        groups = grouped(dict(parallel=parallel, loop=loop, checkpointing=checkpointing, outputs=outputs,
                              emulation=emulation), options)
        par, run, ckpt, out, emu = (groups[k] for k in ("parallel", "loop", "checkpointing", "outputs", "emulation"))
        self.model, self.dataset, self.optimizer = model, dataset, optimizer
        self.callbacks = list(run.callbacks)   # a user's (pydtnn.callbacks); the schedulers are callbacks too
        self.loss = get_loss(loss)
        self.metric_names = list(metrics)
        self.metric_fns = [get_metric(m) for m in self.metric_names]
        self.comm = par.comm or SerialComm()
        self.rank, self.nreplicas = self.comm.rank, self.comm.size
        self.global_batch = int(par.global_batch)
        self.gradient_weighting = par.gradient_weighting
        self.stats = ReplicaStats()
        emulator = SpeedEmulator(emu.emulate_speed, spin=emu.emulate_spin, cost=emu.emulate_cost,
                                 schedule=emu.emulate_schedule)
        self.lagged = (model.backend.asynchronous and self.nreplicas == 1 and not emulator.active
                       if run.lagged_reads is None else bool(run.lagged_reads))
        if self.lagged and self.nreplicas > 1:
            raise ConfigError("lagged_reads needs one replica (several reduce their step records every step)")
        # what a person reads (epoch lines, per-replica tables, re-splits) goes to stdout, in order with the rest
        self.log = out.log or (lambda msg: print(msg, flush=True) if self.rank == 0 else None)
        self.tracer_output = out.tracer_output
        self.timeline = Timeline(self.rank, enabled=bool(self.tracer_output), steps=out.trace_steps)
        self.timer = StepTimer(self.stats, self.timeline if self.tracer_output else None)
        # the step's engine: split (a BalancePolicy; `balance_mode` names a built-in one), weighting,
        # reduction, synchronized BatchNorm, clipping, update, the emulated speed, the CUDA graph's replay
        self.dp = DataParallel(model, optimizer, global_batch=self.global_batch, comm=self.comm, sizes=par.sizes,
                               policy=par.policy if par.policy is not None else
                               make_policy(par.balance_mode, interval=par.rebalance_interval),
                               weighting=par.gradient_weighting, loss=self.loss, caps=par.max_local_batch,
                               non_blocking=par.non_blocking, sync_batchnorm=par.sync_batchnorm,
                               clip_grad_norm=par.clip_grad_norm, timer=self.timer, devices=par.devices,
                               log=self.log, emulator=emulator, emulate_reference=emu.emulate_reference,
                               graphs=self._step_graphs(model, par, out) if run.cuda_graphs else None,
                               accumulation_steps=par.accumulation_steps, grad_compression=par.grad_compression)
        self.policy, self.reducer = self.dp.policy, self.dp.reducer
        if self.reducer is not None and self.tracer_output:
            self.reducer.timeline = self.timeline
        self.sync_batchnorm = self.dp.sync_batchnorm
        self.steps_per_epoch_arg = int(run.steps_per_epoch)
        self.steps_per_epoch = sharding.steps_in_epoch(len(dataset.train), self.global_batch, self.steps_per_epoch_arg)
        if int(run.seed) < 0:
            raise ConfigError(f"seed must be >= 0, got {run.seed} (--seed)")
        self.seed = int(run.seed)
        self.balance_mode = par.balance_mode
        self.schedulers = list(run.schedulers)
        self.history_file = out.history_file
        self.progress = out.progress and self.rank == 0
        # the loop's own callbacks (pydtnn.training.loop_callbacks), run after the schedulers and the user's
        self.history_writer = HistoryWriter(out.history_file) if out.history_file else None
        self.progress_bar = ProgressBar(self.metric_names) if self.progress else None
        # evaluation in batches of the largest pass of training (a local batch, or its largest micro-batch)
        self.eval_batch_size = run.eval_batch_size or max(-(-b // n) for b, n in
                                                          zip(self.sizes, self.dp.micro_batch_counts(self.sizes)) if n)
        self.flags = out.flags or {}
        self.stop_training = False
        self.history: list[dict] = []
        self.start_epoch = 0
        self.checkpoints = StepCheckpoints(ckpt.checkpoint_dir, ckpt.save_steps, ckpt.save_minutes,
                                           ckpt.handle_signals, ckpt.clock)
        self.checkpoints.rank = self.rank
        emulator.interrupted = lambda: self.checkpoints.signum is not None    # a padded step ends on a signal
        self.outputs = OutputRescue(self.comm, self.checkpoints, self.callback_order)
        self.start_step = 0            # steps already done inside start_epoch (a mid-epoch checkpoint)
        self.resumed_partial = None    # that epoch's partial sums
        self.restored_split = False    # the split came from a checkpoint (no probe needed)
        self.last_point = None         # (epochs, steps, sums, samples) this run last completed: a rescue's
        self.step_runner = TrainerStep(model, dataset, self.dp, self.metric_fns, self.span, lagged=self.lagged)
        self.epochs = EpochLoop(self)
        self.insight = StepInsight(model, self.timeline, bool(self.tracer_output), out.profile_layers,
                                   waited=lambda: self.timer.step_wait_s)
        self.layer_profile = self.insight.layer_profile      # --profile_layers: the per-layer time table
        self.tokens_per_sample = tokens_per_sample(dataset, self.loss)   # a language model's: tokens/s, perplexity
        self.run_first_step = None        # (seconds, samples) of this run's first step: it compiles, left out of rates
        self.probe_s = None               # seconds of the probe before training, where one ran (the report's)

    def _step_graphs(self, model, par, out):
        """--cuda_graphs: this replica's StepGraphs (None on a CPU replica of a mixed job); ConfigError where
        graphs cannot work (`step_graphs.refusal`)."""
        gpus = (sum(d == "gpu" for d in par.devices) if par.devices else
                self.nreplicas if model.backend.graphs else 0)
        why = step_graphs.refusal(self.nreplicas, gpus, par.non_blocking, par.sync_batchnorm, out.profile_layers)
        if why:
            raise ConfigError(why)
        prefix = "pydtnn: notice: " + (f"rank {self.rank}: " if self.nreplicas > 1 else "")
        notice = out.log or (lambda line: print(prefix + line, flush=True))
        return step_graphs.StepGraphs(model, self.loss, notice) if model.backend.graphs else None

    # the split in force and the clipping count live in the engine (self.dp); the checkpoint cadence and the
    # stop the ranks agreed on in self.checkpoints
    sizes = property(lambda self: self.dp.sizes, lambda self, sizes: self.dp.adopt(sizes))
    caps = property(lambda self: self.dp.caps)       # a pass's memory caps (a GPU's measured one after the probe)
    clipped_steps = property(lambda self: self.dp.clipped_steps)
    stop_requested = property(lambda self: self.checkpoints.stop_requested)
    checkpoint_dir = property(lambda self: self.checkpoints.checkpoint_dir)
    save_steps = property(lambda self: self.checkpoints.save_steps)
    save_minutes = property(lambda self: self.checkpoints.save_minutes)
    # the epoch under way, as the progress bar reads it
    first_step = property(lambda self: self.epochs.first_step)
    epoch_sums = property(lambda self: self.epochs.sums)
    epoch_samples = property(lambda self: self.epochs.samples)

    def span(self, name, category, always=False, **kwargs):
        """A timeline event when tracing (``always``: also outside --trace_steps), else nothing."""
        if not self.tracer_output:
            return contextlib.nullcontext()
        return self.timeline.span(name, category, always=always, **kwargs)

    # --- one step ---------------------------------------------------------------------------------------
    def train_step(self, indices, epoch, step_sizes, next_indices=None):
        """One global step on this rank's `indices` (`pydtnn.training.step`); returns the StepRecord every
        rank agreed on, whose flags then decide on a checkpoint."""
        record = self.step_runner.run(indices, epoch, step_sizes, next_indices, flags=self.outputs.local_flags)
        self.checkpoints.agree(record)
        return record

    def probe_split(self):
        """Before training, under the signal handlers: the emulated devices' base time (--emulate_costs'
        factors) and the balance policy's probe, where it asks for one (`pydtnn.parallel.balance.probe`;
        nothing when the split came from a checkpoint). Its seconds are in the report; a signal stops every
        rank here, nothing trained (`StoppedBeforeTraining`)."""
        began = time.perf_counter()
        with self.checkpoints.signal_handlers():
            self.agree_on_emulation()
            try:
                ran = not self.restored_split and probe_split(self.dp, self.dataset.train, self.seed,
                                                              stop=self.checkpoints.pending)
            except ProbeStopped as e:
                raise StoppedBeforeTraining(e.signum, self.checkpoints.latest,
                                            self.checkpoints.launcher_ending) from None
        if ran:
            self.probe_s = time.perf_counter() - began

    def agree_on_emulation(self):
        """--emulate_costs' factor form: every rank agrees on the base time per sample, once, and rank 0 says
        it (`pydtnn.parallel.balance.probe.agree_on_emulated_base`; a collective, nothing where no factor)."""
        try:
            line = agree_on_emulated_base(self.dp, self.dataset.train, self.seed, stop=self.checkpoints.pending)
        except ProbeStopped as e:
            raise StoppedBeforeTraining(e.signum, self.checkpoints.latest, self.checkpoints.launcher_ending) from None
        if line:
            self.log(line)

    # --- epochs -----------------------------------------------------------------------------------------
    def fit(self, num_epochs):
        """Train from self.start_epoch up to num_epochs; returns the history (a list of per-epoch dicts)."""
        t_start = time.perf_counter()
        self.epochs_run = 0
        if self.tracer_output:
            self.timeline.start(self.comm)
        self.num_epochs = num_epochs
        callbacks = self.callback_order()
        # what writes files runs after the epoch's history row: a checkpoint after epoch N holds its row
        writers = [c for c in callbacks if getattr(c, "saves_files", False)]
        writers.sort(key=lambda c: c is not self.history_writer)       # the history file first
        others = [c for c in callbacks if c not in writers]
        # the bar ends on any way out (a diverged loss, an error): before the error's line on stderr
        bar = contextlib.closing(self.progress_bar) if self.progress_bar is not None else contextlib.nullcontext()
        self.last_point = None
        try:
            with self.checkpoints.signal_handlers(), contextlib.closing(self.step_runner.prefetcher), bar:
                self.agree_on_emulation()        # where probe_split did not (a Trainer of your own)
                call(callbacks, "on_train_begin", self)
                self.agree_on_outputs()          # a full disk at start-up: refused before the first step
                for epoch in range(self.start_epoch, num_epochs):
                    first_step, self.start_step = self.start_step, 0
                    self.epochs.first_step = first_step
                    call(callbacks, "on_epoch_begin", self, epoch)
                    logs = self.epochs.run(epoch, first_step)
                    self.epochs_run += 1
                    call(others, "on_epoch_end", self, epoch, logs)
                    logs["learning_rate_next"] = self.optimizer.learning_rate
                    self.history.append(logs)
                    self.last_point = (epoch + 1, 0, None, 0)
                    call(writers, "on_epoch_end", self, epoch, logs)
                    self.agree_on_outputs()
                    if self.stop_training or epoch + 1 == num_epochs:
                        break
                    if self.checkpoints.due(epoch, self.steps_per_epoch - 1, self.steps_per_epoch):
                        self.step_checkpoint(epoch + 1, 0)
                call(callbacks, "on_train_end", self)
            self.elapsed = time.perf_counter() - t_start
            if self.dp.graphs is not None:                  # rank 0's, said by rank 0: did graphs serve?
                self.log(self.dp.graphs.summary())
            if self.tracer_output:
                # a collective (it gathers every rank's timeline); rank 0 writes
                raise_together(self.comm, lambda: write_chrome_trace(self.tracer_output, self.timeline,
                                                                     self.comm if self.nreplicas > 1 else None),
                               "rank 0 could not write the trace")
            self.agree_on_outputs()              # the end's writes (the plot, the last TensorBoard flush)
        except OutputError as e:
            # every rank is here together (each failure above was agreed on): nothing trained is lost
            raise OutputError(f"{e}; {self.outputs.rescue(self, num_epochs)}") from None
        except BaseException:
            self.outputs.flush(self)             # a preemption, a diverged loss: the files hold every step so far
            raise
        return self.history

    def agree_on_outputs(self):
        """A collective: if any rank's writer failed, every rank raises that OutputError (rank 0 its text)."""
        self.outputs.agree()

    def callback_order(self):
        """Every callback in the order each hook runs: the schedulers, the user's, then the loop's own
        (history file, progress bar); `fit` moves the ones that save files after the epoch's row."""
        return self.schedulers + self.callbacks + [c for c in (self.history_writer, self.progress_bar) if c is not None]

    # --- evaluation -------------------------------------------------------------------------------------
    def evaluate(self, split):
        """Loss and metrics over a whole split (inference mode), shared among replicas, weighted by samples."""
        with self.span("evaluate", "eval", always=True, samples=len(split)):
            return evaluate_split(self.model, split, self.comm, self.loss, self.metric_names, self.metric_fns,
                                  self.eval_batch_size)

    # --- checkpoints (pydtnn.training.trainer_state, pydtnn.training.preemption) --------------------------
    def save_checkpoint(self, path, epoch, step=0, partial=None):
        """Full state after `epoch` epochs and `step` more steps (a collective: every rank calls it; rank 0
        writes). An OutputError is raised on every rank; the previous file at `path` stays intact."""
        trainer_state.save(self, path, epoch, step=step, partial=partial)
        self.checkpoints.latest = path

    def resume(self, path, keep_split=True, learning_rate=None, restore_optimizer=True):
        """Restore the state of a checkpoint (configuration stays the command line's); what is kept and
        what the caller's choices override: `pydtnn.training.trainer_state.restore`."""
        meta = trainer_state.restore(self, path, keep_split=keep_split, learning_rate=learning_rate,
                                     restore_optimizer=restore_optimizer)
        self.checkpoints.latest = path
        return meta

    def step_checkpoint(self, epoch, step, partial=None):
        """A full checkpoint `epoch` epochs and `step` steps in; on a signal, then raise Preempted."""
        self.checkpoints.write(self.save_checkpoint, self.comm, epoch, step, self.steps_per_epoch, partial)

    # --- the end ----------------------------------------------------------------------------------------
    def report(self):
        """The final report's lines: time, time per epoch, throughput (the run's first step, which compiles,
        left out), peak memory."""
        samples = sum(h["samples_per_s"] * h["time_s"] for h in self.history[-self.epochs_run:]) if self.epochs_run else 0
        first_s, first_samples = self.run_first_step or (0.0, 0)
        if samples > first_samples and self.elapsed > first_s:
            rate, why = (samples - first_samples) / (self.elapsed - first_s), "the first step, which compiles, left out"
        else:
            rate, why = samples / max(self.elapsed, 1e-9), "one step: its compilation included"
        tokens = f" = {rate * self.tokens_per_sample:,.0f} tokens/s" if self.tokens_per_sample else ""
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        # the probe's seconds are the run's too: a comparison of policies on training time alone favours probing
        probe = ([f"probe before training: {self.probe_s:.2f} s ({self.policy.name}); probe + training: "
                  f"{self.probe_s + self.elapsed:.2f} s"] if self.probe_s is not None else [])
        return [f"training time: {self.elapsed:.2f} s over {self.epochs_run} epoch(s)", *probe,
                f"time per epoch: {self.elapsed / max(self.epochs_run, 1):.2f} s",
                f"throughput: {rate:.1f} samples/s{tokens} (all replicas; {why})",
                f"peak host memory (rank 0): {peak_mib:.0f} MiB"]
