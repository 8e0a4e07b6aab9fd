"""Keras-style callbacks: objects the training loop calls at fixed points.

    from pydtnn.callbacks import Callback

    class LossLog(Callback):
        def on_batch_end(self, trainer, step, logs):
            print(step, logs["loss"], logs["learning_rate"])

Every hook is optional: the base class makes each one a no-op, and the loop also accepts an object of any
class that defines only some of them (`call`). `trainer` is the `pydtnn.training.loop.Trainer` running the loop
(`model`, `optimizer`, `steps_per_epoch`, `history`, `log`; set `trainer.stop_training = True` to stop after
the current epoch). Every rank runs the same callbacks on the same (reduced) logs.

- `on_train_begin(trainer)`, `on_train_end(trainer)`;
- `on_epoch_begin(trainer, epoch)`, `on_epoch_end(trainer, epoch, logs)` (epoch 0-based; logs: the epoch's
  history row: loss, metrics, val_*, learning_rate, time_s, ...);
- `on_batch_begin(trainer, step)`, `on_batch_end(trainer, step, logs)` (step: the global step, 0-based,
  counted over epochs; logs: the global batch's mean `loss`, its metrics, the `learning_rate` the step used
  and `batch_size`). On a GPU with one replica the loop reads a step's numbers a step late, so the host never
  waits for the device (`pydtnn.parallel.lagged_step`): `on_batch_end` of step k then comes after
  `on_batch_begin` of step k + 1 (whose work is queued by then; a change made in `on_batch_end` acts from step
  k + 2), except at an epoch's last step and before a checkpoint. `Trainer(lagged_reads=False)` reads each
  step at its end, as on the CPU.

A callback that keeps state across steps (a counter, a best value, an early-stopping patience) saves it in
the training checkpoints and gets it back on `--resume` / `Trainer.resume` (Lightning's
`Callback.state_dict`): `state_dict()` returns plain JSON values (a checkpoint is data, never code), and
`load_state_dict(state)` takes them back. A checkpoint keeps each callback's state under its `state_key`
(default: the class name; the second callback of a class `Name#2`, and so on); a callback whose key the
checkpoint lacks starts fresh.

The learning-rate schedulers and `model_checkpoint` (`pydtnn.schedulers`) are callbacks too, and so are the
loop's own history file and progress bar (`pydtnn.training.loop_callbacks`). The order is fixed: every hook runs the
schedulers, then the user's callbacks (in the order given), then the loop's own (history file, progress
bar). `on_epoch_end` runs in two passes: first every callback that does not save files; then the epoch's
row is appended to `trainer.history`; then the history file is written, then the callbacks that save files
(`saves_files = True`: `model_checkpoint`, a user's), so a checkpoint after epoch N holds its row. The
progress bar counts a step after every callback's `on_batch_end` of it.
"""
from __future__ import annotations

HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_batch_begin", "on_batch_end")


class Callback:
    """Base class: every hook does nothing; override the ones you need."""

    # A callback that writes files runs after the epoch's history row is recorded (a checkpoint then holds it).
    saves_files = False

    def on_train_begin(self, trainer):
        pass

    def on_train_end(self, trainer):
        pass

    def on_epoch_begin(self, trainer, epoch):
        pass

    def on_epoch_end(self, trainer, epoch, logs):
        pass

    def on_batch_begin(self, trainer, step):
        pass

    def on_batch_end(self, trainer, step, logs):
        pass

    def state_dict(self) -> dict:
        """What this callback needs to go on after a resume, as plain JSON values ({}: nothing)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Take back what `state_dict` returned, from a checkpoint."""


def state_keys(callbacks) -> list[str]:
    """Each callback's key in a checkpoint: its `state_key` (default its class name), `#2`, `#3`... added to a
    key seen before, so that two callbacks of one class keep their own states."""
    keys, seen = [], {}
    for cb in callbacks:
        key = str(getattr(cb, "state_key", None) or type(cb).__qualname__)
        seen[key] = seen.get(key, 0) + 1
        keys.append(key if seen[key] == 1 else f"{key}#{seen[key]}")
    return keys


def call(callbacks, hook, *args):
    """Call `hook` on every callback that has it, in order (a Keras-like object may define only some)."""
    for cb in callbacks:
        method = getattr(cb, hook, None)
        if method is not None:
            method(*args)
