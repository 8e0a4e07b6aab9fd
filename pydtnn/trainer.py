"""The training loop: sequential or data-parallel with heterogeneity-aware batches and gradient weights.

One global step s (DESIGN.md, "Data-parallel step"):
1. every rank takes its b_i samples of the epoch's shared order (`balance.shard`);
2. forward + backward on them, the loss gradient scaled by w_i (proportional: b_i/B, uniform: 1/P), so
   that a SUM-allreduce of the flat gradient buffer gives sum_i w_i g_i;
3. the reduction (one blocking Allreduce, or reverse-order buckets overlapped with backward);
4. the optimizer step, identical on every rank;
5. a tiny SUM-allreduce of [b_i * loss, b_i * metrics, compute time per sample] so that every rank sees
   the same global loss (a NaN stops all ranks together) and the same speeds (dynamic balancing).
Every rank runs the same number of steps whatever the split and the dataset size, so collectives match.
"""
from __future__ import annotations

import csv
import json
import math
import os
import resource
import time

import numpy as np

from pydtnn.checkpoint import load_checkpoint, save_checkpoint
from pydtnn.errors import ConfigError, NumericalError
from pydtnn.losses import get_loss
from pydtnn.metrics import get_metric
from pydtnn.model import one_hot
from pydtnn.parallel import balance
from pydtnn.parallel.comm import BucketedReducer, SerialComm
from pydtnn.progress import progress
from pydtnn.trace import ReplicaStats, StepTimer, Timeline, epoch_summary, write_chrome_trace


class Trainer:
    def __init__(self, model, dataset, optimizer, *, loss="categorical_cross_entropy",
                 metrics=("categorical_accuracy",), comm=None, global_batch=64, sizes=None,
                 gradient_weighting="proportional", balance_mode="none", rebalance_interval=20,
                 emulate_speed=1.0, non_blocking=False, steps_per_epoch=0, seed=0, schedulers=(),
                 history_file=None, progress=True, eval_batch_size=None, tracer_output=None, log=None,
                 flags=None):
        self.model, self.dataset, self.optimizer = model, dataset, optimizer
        self.loss = get_loss(loss)
        self.metric_names = list(metrics)
        self.metric_fns = [get_metric(m) for m in self.metric_names]
        self.comm = comm or SerialComm()
        self.rank, self.nreplicas = self.comm.rank, self.comm.size
        self.global_batch = int(global_batch)
        self.sizes = list(sizes) if sizes is not None else balance.partition(self.global_batch, [1] * self.nreplicas)
        if gradient_weighting not in balance.WEIGHTING_MODES:
            raise ConfigError(f"--gradient_weighting must be one of {', '.join(balance.WEIGHTING_MODES)}, "
                              f"got {gradient_weighting!r}")
        self.gradient_weighting = gradient_weighting
        self.balancer = None
        if balance_mode == "dynamic":
            self.balancer = balance.DynamicBalancer(self.global_batch, self.nreplicas, interval=rebalance_interval,
                                                    initial_sizes=self.sizes)
        self.emulate_speed = float(emulate_speed)
        self.steps_per_epoch_arg = int(steps_per_epoch)
        self.steps_per_epoch = balance.steps_in_epoch(len(dataset.train), self.global_batch, self.steps_per_epoch_arg)
        self.seed = int(seed)
        self.schedulers = list(schedulers)
        self.history_file = history_file
        self.progress = progress and self.rank == 0
        self.eval_batch_size = eval_batch_size or max(self.sizes)
        # what a person reads (epoch lines, per-replica tables) goes to stdout, in order with the rest
        self.log = log or (lambda msg: print(msg, flush=True) if self.rank == 0 else None)
        self.flags = flags or {}
        self.nclasses = model.output_shape[0]
        self.stop_training = False
        self.history: list[dict] = []
        self.start_epoch = 0
        self.stats = ReplicaStats()
        self.timeline = Timeline(self.rank, enabled=bool(tracer_output))
        self.tracer_output = tracer_output
        self.timer = StepTimer(self.stats, self.timeline if tracer_output else None)
        self.reducer = BucketedReducer(self.comm, model.grads) if non_blocking and self.nreplicas > 1 else None
        # replicas start from the same weights (upstream trusted equal seeds)
        self.comm.bcast_(model.params, root=0)
        for arr in self._running_stats():
            self.comm.bcast_(arr, root=0)

    # --- one step ---------------------------------------------------------------------------------------
    def _running_stats(self):
        return [a for layer in self.model.all_layers() for a in layer.state_arrays().values()]

    def _emulated_slowdown(self, compute_s):
        """--emulate_speeds: sleep for the time a replica running at that fraction of its speed would lose."""
        if self.emulate_speed < 1.0:
            time.sleep(compute_s * (1.0 / self.emulate_speed - 1.0))

    def _local_gradients(self, x, y, weight, overlap=True):
        t0 = time.perf_counter()
        hook = None
        if self.reducer is not None and overlap:
            self.reducer.start_step()
            hook = self.reducer.ready
        value, y_pred = self.model.compute_gradients(x, y, self.loss, loss_scale=weight, on_grads_ready=hook)
        self.model.backend.synchronize()
        self._emulated_slowdown(time.perf_counter() - t0)
        return value, y_pred

    def train_step(self, indices, epoch, step_sizes):
        b_i = len(indices)
        x, labels = self.dataset.train.take(indices, epoch=epoch)
        y = self.model.backend.asarray(one_hot(labels, self.nclasses, self.model.dtype))   # one copy to the device
        step_total = sum(step_sizes)
        weight = b_i / step_total if self.gradient_weighting == "proportional" else 1.0 / self.nreplicas
        self.timer.start_step(b_i)
        with self.timer.compute():
            value, y_pred = self._local_gradients(x, y, weight)
        with self.timer.wait():
            if self.reducer is not None:
                self.reducer.finish()
            elif self.nreplicas > 1:
                self.comm.allreduce_sum_(self.model.grads)
        with self.timer.phase("update"):
            self.optimizer.step(self.model.params, self.model.grads)
        self.timer.end_step()
        # reported loss and metrics are weighted by b_i whatever the gradient weighting
        local = [value] + [f(y_pred, y) for f in self.metric_fns]
        stats = np.zeros(len(local) + self.nreplicas)
        stats[:len(local)] = np.asarray(local) * (b_i / step_total)
        stats[len(local) + self.rank] = self.timer.step_compute_s / b_i
        self.comm.allreduce_sum_(stats)
        return stats[:len(local)], stats[len(local):]

    # --- epochs -----------------------------------------------------------------------------------------
    def fit(self, num_epochs):
        """Train from self.start_epoch up to num_epochs; returns the history (a list of per-epoch dicts)."""
        t_start = time.perf_counter()
        epochs_run = 0
        if self.tracer_output:
            self.timeline.start(self.comm)
        for epoch in range(self.start_epoch, num_epochs):
            logs = self.train_epoch(epoch, num_epochs)
            epochs_run += 1
            for s in self.schedulers:
                s.on_epoch_end(self, epoch, logs)
            logs["learning_rate_next"] = self.optimizer.learning_rate
            self.history.append(logs)
            self._write_history()
            if self.stop_training:
                break
        self.elapsed = time.perf_counter() - t_start
        self.epochs_run = epochs_run
        if self.tracer_output:
            write_chrome_trace(self.tracer_output, self.timeline, self.comm if self.nreplicas > 1 else None)
        return self.history

    def train_epoch(self, epoch, num_epochs):
        split = self.dataset.train
        n = len(split)
        order = split.epoch_order(self.seed, epoch)
        self.stats.reset()
        sums = np.zeros(1 + len(self.metric_fns))
        samples = 0
        t0 = time.perf_counter()
        bar = progress(total=self.steps_per_epoch, desc=f"epoch {epoch + 1}/{num_epochs}", unit="step",
                       enabled=self.progress, leave=True)
        for step in range(self.steps_per_epoch):
            global_step = epoch * self.steps_per_epoch + step
            for s in self.schedulers:
                s.on_batch_begin(self, global_step)
            sizes = balance.step_sizes(step, self.global_batch, self.sizes, n, self.steps_per_epoch_arg)
            idx = balance.shard(order, step, self.global_batch, self.sizes, self.rank, n, self.steps_per_epoch_arg)
            means, times = self.train_step(idx, epoch, sizes)
            if not math.isfinite(means[0]):
                if bar is not None:
                    bar.close()
                raise NumericalError(f"the loss became {means[0]} at epoch {epoch + 1}, step {step + 1}: "
                                     f"training diverged (try a lower --learning_rate)")
            step_total = sum(sizes)
            sums += means * step_total
            samples += step_total
            if self.balancer is not None and self.balancer.observe(times):
                new = self.balancer.maybe_rebalance(global_step)
                if new is not None:
                    self.sizes = new
            if bar is not None:
                elapsed = time.perf_counter() - t0
                bar.set_postfix_str(f"loss={sums[0] / samples:.4f} "
                                    + " ".join(f"{self._short(m)}={v / samples:.4f}"
                                               for m, v in zip(self.metric_names, sums[1:]))
                                    + f" {samples / elapsed:.0f} samples/s", refresh=False)
                bar.update(1)
        if bar is not None:
            bar.close()
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

    @staticmethod
    def _short(name):
        return {"categorical_accuracy": "acc"}.get(name, name)

    def _sync_running_stats(self):
        """BatchNorm running statistics: the b_i-weighted mean over replicas (upstream never synced them)."""
        if self.nreplicas == 1:
            return
        share = self.sizes[self.rank] / self.global_batch
        for arr in self._running_stats():
            host = self.model.backend.to_numpy(arr).astype(np.float64) * share
            self.comm.allreduce_sum_(host)
            arr[...] = self.model.backend.asarray(host)

    # --- evaluation -------------------------------------------------------------------------------------
    def evaluate(self, split):
        """Loss and metrics over a whole split (inference mode), shared among replicas, weighted by samples."""
        n = len(split)
        mine = np.array_split(np.arange(n), self.nreplicas)[self.rank]
        sums = np.zeros(2 + len(self.metric_fns))
        for start in range(0, len(mine), self.eval_batch_size):
            idx = mine[start:start + self.eval_batch_size]
            x, labels = split.take(idx)
            y = self.model.backend.asarray(one_hot(labels, self.nclasses, self.model.dtype))
            y_pred = self.model.forward(x, training=False)
            values = [self.loss(y_pred, y)[0]] + [f(y_pred, y) for f in self.metric_fns]
            sums[:-1] += np.asarray(values) * len(idx)
            sums[-1] += len(idx)
        self.comm.allreduce_sum_(sums)
        return {name: v / max(sums[-1], 1) for name, v in zip(["loss", *self.metric_names], sums[:-1])}

    # --- history, checkpoints ---------------------------------------------------------------------------
    def _write_history(self):
        if not self.history_file or self.rank != 0:
            return
        tmp = f"{self.history_file}.tmp"
        with open(tmp, "w", newline="") as f:
            if self.history_file.endswith(".json"):
                json.dump(self.history, f, indent=1)
            else:
                keys = list(dict.fromkeys(k for row in self.history for k in row))
                writer = csv.DictWriter(f, fieldnames=keys)
                writer.writeheader()
                writer.writerows(self.history)
        os.replace(tmp, self.history_file)

    def _rng_state(self):
        rng = self.model.backend.rng
        state = rng.bit_generator.state if hasattr(rng, "bit_generator") else None
        return json.loads(json.dumps(state, default=int))

    def save_checkpoint(self, path, epoch):
        """Full state after `epoch` epochs (a collective: every rank calls it; rank 0 writes)."""
        rng_states = self.comm.gather_object(self._rng_state(), root=0)
        if self.rank != 0:
            return
        meta = {"epoch": int(epoch), "step": 0, "nreplicas": self.nreplicas, "sizes": list(map(int, self.sizes)),
                "rng_states": rng_states, "seed": self.seed, "history": self.history,
                "schedulers": [[s.name, s.state_dict()] for s in self.schedulers],
                "balancer": None if self.balancer is None else
                {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in self.balancer.state_dict().items()},
                "flags": self.flags}
        save_checkpoint(path, self.model, self.optimizer, json.loads(json.dumps(meta, default=_jsonable)))

    def resume(self, path):
        meta = load_checkpoint(path, self.model, self.optimizer)
        self.start_epoch = int(meta["epoch"])
        self.history = list(meta.get("history", []))
        if meta.get("nreplicas") == self.nreplicas:
            self.sizes = list(meta["sizes"])
            state = meta["rng_states"][self.rank]
            if state is not None and hasattr(self.model.backend.rng, "bit_generator"):
                self.model.backend.rng.bit_generator.state = state
        saved = dict((name, st) for name, st in meta.get("schedulers", []))
        for s in self.schedulers:
            if s.name in saved:
                s.load_state_dict(saved[s.name])
        if self.balancer is not None and meta.get("balancer"):
            self.balancer.load_state_dict({k: np.asarray(v) if isinstance(v, list) else v
                                           for k, v in meta["balancer"].items()})
            self.sizes = list(self.balancer.sizes)
        return meta

    def report(self):
        """The final report's lines: time, time per epoch, throughput, peak memory."""
        samples = sum(h["samples_per_s"] * h["time_s"] for h in self.history[-self.epochs_run:]) if self.epochs_run else 0
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        lines = [f"training time: {self.elapsed:.2f} s over {self.epochs_run} epoch(s)",
                 f"time per epoch: {self.elapsed / max(self.epochs_run, 1):.2f} s",
                 f"throughput: {samples / max(self.elapsed, 1e-9):.1f} samples/s (all replicas)",
                 f"peak host memory (rank 0): {peak_mib:.0f} MiB"]
        return lines


def _jsonable(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)
