"""Learning-rate schedulers and training callbacks, with upstream PyDTNN's names and flags.

A scheduler is a callback (`pydtnn.callbacks.Callback`) that uses `on_batch_begin(trainer, global_step)` and
`on_epoch_end(trainer, epoch, logs)`; it may change `trainer.optimizer.learning_rate`, set
`trainer.stop_training`, or ask `trainer.save_checkpoint(path)`. Every rank runs the same schedulers on
the same (reduced) logs, so they take the same decisions. Nothing writes files unless asked:
model_checkpoint only runs when named in --lr_schedulers.
"""
from __future__ import annotations

import math
import os

from pydtnn.callbacks import Callback
from pydtnn.errors import ConfigError
from pydtnn.losses import LOSSES

LOSS_NAMES = tuple(LOSSES)


def _maximize(metric: str) -> bool:
    return "accuracy" in metric


class Scheduler(Callback):
    """A callback (pydtnn.callbacks) with a name (its --lr_schedulers entry) and a state saved in checkpoints."""
    name = None

    # Only these attributes are state; everything else is configuration and comes from the command line.
    STATE = ()
    def state_dict(self) -> dict:
        state = {k: getattr(self, k) for k in self.STATE}
        if hasattr(self, "metric"):
            state["metric"] = self.metric            # identifies what `best` measured; never restored
        return state

    def load_state_dict(self, state: dict):
        """Restore the STATE fields; a `best` of another metric than the command line's is dropped."""
        if not isinstance(state, dict):
            raise ConfigError(f"{self.name}: saved state must be an object, got {state!r}")
        if "metric" in state and state["metric"] != getattr(self, "metric", None):
            return
        for k in self.STATE:
            if k in state:
                v = state[k]
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                    raise ConfigError(f"{self.name}: saved state {k} must be a number, got {v!r}")
                setattr(self, k, v)

    def logged_metric(self, metric: str) -> str:
        """The logs key a metric name refers to (upstream names the loss by its function)."""
        for loss_name in LOSS_NAMES:
            if metric.endswith(loss_name):
                return metric[:-len(loss_name)] + "loss"
        return metric

    def _value(self, logs, metric):
        if metric not in logs:
            metric = self.logged_metric(metric)
        if metric not in logs:
            raise ConfigError(f"{self.name}: metric {metric!r} is not computed; available: {', '.join(sorted(logs))}"
                              + ("" if any(k.startswith("val_") for k in logs) else
                                 " (val_* metrics need --validation_split or --test_as_validation)"))
        return float(logs[metric])


class _Monitor(Scheduler):
    """Tracks the best value of a metric and how many epochs passed without improving it."""

    def _has(self, logs):
        try:
            self._value(logs, self.metric)
            return True
        except ConfigError:
            return False

    STATE = ("best", "wait")

    def __init__(self, metric, patience):
        _check_range(self.name, "patience", patience, 0, None)
        self.metric, self.patience = metric, int(patience)
        self.best = -math.inf if _maximize(metric) else math.inf
        self.wait = 0

    def _improved(self, logs) -> bool:
        value = self._value(logs, self.metric)
        better = value > self.best if _maximize(self.metric) else value < self.best
        if better:
            self.best, self.wait = value, 0
        else:
            self.wait += 1
        return better


class WarmUp(Scheduler):
    """Linear learning-rate ramp from base/steps to base over the first warm_up_epochs (per batch)."""
    name = "warm_up"

    STATE = ("base_lr",)

    def __init__(self, warm_up_epochs=5):
        _check_range(self.name, "warm_up_epochs", warm_up_epochs, 0, None)
        self.warm_up_epochs = int(warm_up_epochs)
        self.base_lr = None

    def on_batch_begin(self, trainer, global_step):
        if self.base_lr is None:
            self.base_lr = trainer.optimizer.learning_rate
        total = self.warm_up_epochs * trainer.steps_per_epoch
        if global_step < total:
            trainer.optimizer.learning_rate = self.base_lr * (global_step + 1) / total
        elif global_step == total:
            trainer.optimizer.learning_rate = self.base_lr


class CosineDecay(Scheduler):
    """Linear warm-up over warm_up_epochs, then a half cosine from the base rate down to min_lr over
    decay_epochs, then min_lr. Set per step (on_batch_begin), so the rate moves smoothly inside epochs:
    with W warm-up and D decay steps, step s gets base (s + 1) / W for s < W, else
    min_lr + (base - min_lr) (1 + cos(pi min(s - W, D) / D)) / 2. A pure function of the step and the base
    rate, so a resumed run (base_lr restored) continues bit-exactly."""
    name = "cosine"

    STATE = ("base_lr",)

    def __init__(self, decay_epochs, min_lr=0.0, warm_up_epochs=0):
        _check_range(self.name, "decay_epochs", decay_epochs, 1, None)
        _check_range(self.name, "min_lr", min_lr, 0, None)
        _check_range(self.name, "warm_up_epochs", warm_up_epochs, 0, None)
        self.decay_epochs, self.min_lr, self.warm_up_epochs = int(decay_epochs), float(min_lr), int(warm_up_epochs)
        self.base_lr = None

    def learning_rate(self, global_step, steps_per_epoch):
        warm, decay = self.warm_up_epochs * steps_per_epoch, self.decay_epochs * steps_per_epoch
        if global_step < warm:
            return self.base_lr * (global_step + 1) / warm
        t = min(global_step - warm, decay) / decay
        return self.min_lr + (self.base_lr - self.min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))

    def on_batch_begin(self, trainer, global_step):
        if self.base_lr is None:
            self.base_lr = trainer.optimizer.learning_rate
            if self.min_lr > self.base_lr:
                raise ConfigError(f"cosine: min_lr must be in [0, {self.base_lr:g}] (the learning rate), got "
                                  f"{self.min_lr:g} (--cosine_min_lr)")
        trainer.optimizer.learning_rate = self.learning_rate(global_step, trainer.steps_per_epoch)


class EarlyStopping(_Monitor):
    """Stop when the metric has not improved for `patience` epochs."""
    name = "early_stopping"

    def on_epoch_end(self, trainer, epoch, logs):
        if not self._improved(logs) and self.wait >= self.patience:
            trainer.stop_training = True
            trainer.log(f"early_stopping: {self.metric} did not improve for {self.patience} epochs; stopping")


class ReduceLROnPlateau(_Monitor):
    name = "reduce_lr_on_plateau"

    def __init__(self, metric, factor=0.1, patience=5, min_lr=0.0):
        super().__init__(metric, patience)
        _check_factor(self.name, factor)
        _check_range(self.name, "min_lr", min_lr, 0, None)
        self.factor, self.min_lr = float(factor), float(min_lr)

    def on_epoch_end(self, trainer, epoch, logs):
        if not self._improved(logs) and self.wait >= self.patience:
            opt = trainer.optimizer
            opt.learning_rate = max(opt.learning_rate * self.factor, self.min_lr)
            self.wait = 0
            trainer.log(f"reduce_lr_on_plateau: learning rate -> {opt.learning_rate:g}")


class ReduceLREveryNEpochs(Scheduler):
    name = "reduce_lr_every_nepochs"

    def __init__(self, factor=0.1, nepochs=5, min_lr=0.0):
        _check_factor(self.name, factor)
        _check_range(self.name, "nepochs", nepochs, 1, None)
        _check_range(self.name, "min_lr", min_lr, 0, None)
        self.factor, self.nepochs, self.min_lr = float(factor), int(nepochs), float(min_lr)

    def on_epoch_end(self, trainer, epoch, logs):
        if (epoch + 1) % self.nepochs == 0:
            opt = trainer.optimizer
            opt.learning_rate = max(opt.learning_rate * self.factor, self.min_lr)


class StopAtLoss(Scheduler):
    """Stop once the metric reaches the threshold (>= for accuracies, <= for losses and errors)."""
    name = "stop_at_loss"

    def __init__(self, metric="val_categorical_accuracy", threshold=0.0):
        self.metric, self.threshold = metric, float(threshold)
        if _maximize(metric) and not 0 < self.threshold <= 1:
            raise ConfigError(f"stop_at_loss: threshold {threshold} for {metric} (an accuracy in [0, 1]) must be in "
                              f"(0, 1]: {'<= 0 is reached after the first epoch' if self.threshold <= 0 else 'above 1 is never reached'} "
                              f"(--stop_at_loss_threshold)")
        if not _maximize(metric) and self.threshold < 0:
            raise ConfigError(f"stop_at_loss: threshold {threshold} for {metric} (a loss, >= 0) must be >= 0: "
                              f"a negative one is never reached (--stop_at_loss_threshold)")

    def on_epoch_end(self, trainer, epoch, logs):
        value = self._value(logs, self.metric)
        if (value >= self.threshold) if _maximize(self.metric) else (value <= self.threshold):
            trainer.stop_training = True
            trainer.log(f"stop_at_loss: {self.metric}={value:.4f} reached {self.threshold}; stopping")


class ModelCheckpoint(_Monitor):
    """Every save_freq epochs, write a full checkpoint (and keep `best.npz` for the best metric).

    It runs after the epoch's history row is recorded, and updates `best` before saving, so a checkpoint
    written after epoch N holds all of epoch N.
    """
    name = "model_checkpoint"
    saves_files = True

    def __init__(self, metric, save_freq=2, checkpoint_dir="checkpoints"):
        super().__init__(metric, patience=0)
        _check_range(self.name, "save_freq", save_freq, 1, None)
        self.save_freq, self.checkpoint_dir = int(save_freq), str(checkpoint_dir)

    def on_epoch_end(self, trainer, epoch, logs):
        improved = self._has(logs) and self._improved(logs)
        if (epoch + 1) % self.save_freq == 0:
            trainer.save_checkpoint(os.path.join(self.checkpoint_dir, f"epoch_{epoch + 1:04d}.npz"), epoch + 1)
        if improved:
            trainer.save_checkpoint(os.path.join(self.checkpoint_dir, "best.npz"), epoch + 1)


def _check_range(name, what, value, low, high):
    """`value` is a number in [low, high] (either bound None = open-ended)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        flag = what if what.startswith(name) else f"{name}_{what}"
        raise ConfigError(f"{name}: {what} must be {bounds}, got {value} (--{flag})")


def _check_factor(name, factor):
    if not (isinstance(factor, (int, float)) and 0 < factor < 1):
        raise ConfigError(f"{name}: factor must be in (0, 1), got {factor} (--{name}_factor)")


def check_metrics(schedulers, logged: set, has_val: bool) -> None:
    """Every metric a scheduler names is one the trainer logs (a typo would otherwise never act)."""
    for s in schedulers:
        metric = getattr(s, "metric", None)
        if metric is None:
            continue
        key = s.logged_metric(metric)
        base = key[len("val_"):] if key.startswith("val_") else key
        if base not in logged:
            choices = sorted(logged | {f"val_{k}" for k in logged})
            raise ConfigError(f"{s.name}: metric {metric!r} is not logged; choose from {', '.join(choices)} "
                              f"(--{s.name}_metric)")


SCHEDULERS = {cls.name: cls for cls in (WarmUp, CosineDecay, EarlyStopping, ReduceLROnPlateau, ReduceLREveryNEpochs,
                                        StopAtLoss, ModelCheckpoint)}


def make_schedulers(names, p) -> list:
    """Schedulers from a comma list of names and an object with the upstream flag attributes."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    # both set the learning rate every step: the later one would silently undo the other
    if "warm_up" in names and "cosine" in names:
        raise ConfigError("--lr_schedulers: warm_up and cosine both set the learning rate each step; cosine has "
                          "its own warm-up (--cosine_warm_up_epochs)")
    out = []
    for name in names:
        if name == "warm_up":
            out.append(WarmUp(p.warm_up_epochs))
        elif name == "cosine":
            # 0 = decay over the epochs after the warm-up, up to --num_epochs
            decay = p.cosine_decay_epochs or max(p.num_epochs - p.cosine_warm_up_epochs, 1)
            out.append(CosineDecay(decay, p.cosine_min_lr, p.cosine_warm_up_epochs))
        elif name == "early_stopping":
            out.append(EarlyStopping(p.early_stopping_metric, p.early_stopping_patience))
        elif name == "reduce_lr_on_plateau":
            out.append(ReduceLROnPlateau(p.reduce_lr_on_plateau_metric, p.reduce_lr_on_plateau_factor,
                                         p.reduce_lr_on_plateau_patience, p.reduce_lr_on_plateau_min_lr))
        elif name == "reduce_lr_every_nepochs":
            out.append(ReduceLREveryNEpochs(p.reduce_lr_every_nepochs_factor, p.reduce_lr_every_nepochs_nepochs,
                                            p.reduce_lr_every_nepochs_min_lr))
        elif name == "stop_at_loss":
            out.append(StopAtLoss(p.stop_at_loss_metric, p.stop_at_loss_threshold))
        elif name == "model_checkpoint":
            out.append(ModelCheckpoint(p.model_checkpoint_metric, p.model_checkpoint_save_freq, p.checkpoint_dir))
        else:
            raise ConfigError(f"unknown LR scheduler {name!r} in --lr_schedulers: choose from {', '.join(SCHEDULERS)}")
    return out
