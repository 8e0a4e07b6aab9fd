"""Full checkpoints between epochs' steps: on a preemption signal, every N steps, every M minutes (and the
one that saves the trained state when an output failed).

SIGTERM, SIGUSR1 and SIGINT (Ctrl-C, a researcher's usual way to stop a run) only set a flag; the flag rides
in the step's record reduction (`pydtnn.parallel.step_record`), so every rank sees the same OR of it after the
same step, writes one full checkpoint together (the step inside the epoch and the epoch's partial sums
included), and the loop raises `Preempted`. A second Ctrl-C stops at once (KeyboardInterrupt), for a step
that never ends. The timed cadence follows rank 0's clock, agreed on the same way; the step cadence counts
global steps. Only the newest cadence checkpoint is kept: long runs would otherwise fill the disk.

The handlers are in force from the probe before training on (`Trainer.probe_split`): a signal there stops
every rank together before any training step (`StoppedBeforeTraining`: nothing was trained, so nothing is
written; the exit status is a preemption's), and an emulated step's padding returns early on it
(`pydtnn.parallel.emulation`), so even a step emulated as very slow ends within a second of a signal.

Open MPI's launcher, when it is sent SIGTERM or SIGINT, gives the ranks SIGCONT, SIGTERM a quarter of a
second later and SIGKILL after another quarter (`pydtnn.parallel.runtime.shutdown`), and forwards nothing
they print: a stop signal that follows a SIGCONT within a second is that launcher ending the job, and rank 0
at once tells its user, through the launcher's own stderr, where the checkpoint goes and where the latest
one is (the checkpoint of the current step may not be written in time).
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from pydtnn.errors import ConfigError, OutputError
from pydtnn.outputs import rescue_folders

PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
LAUNCHER_KILL_WINDOW_S = 1.0     # a stop signal this soon after a SIGCONT: Open MPI's launcher ending the job


class Preempted(Exception):
    """Training stopped on a signal after a full checkpoint was written (not an error: resume from `path`)."""

    def __init__(self, signum, path, epoch, step, steps_per_epoch, launcher_ending=False):
        self.signum, self.path, self.epoch, self.step, self.steps_per_epoch = signum, path, epoch, step, steps_per_epoch
        self.launcher_ending = launcher_ending     # Open MPI's launcher is ending the job (it drops our output)
        super().__init__(f"{signal.Signals(signum).name} received: checkpoint written to {path} "
                         f"(after epoch {epoch}, step {step} of {steps_per_epoch}); continue with --resume {path}")


class StoppedBeforeTraining(Preempted):
    """A signal during the probe before training: every rank stopped together, nothing trained, nothing written."""

    def __init__(self, signum, latest=None, launcher_ending=False):
        self.signum, self.path, self.epoch, self.step, self.steps_per_epoch = signum, latest, 0, 0, 0
        self.launcher_ending = launcher_ending
        again = (f"continue with --resume {latest} (its latest checkpoint)" if latest else
                 "run the same command again")
        Exception.__init__(self, f"{signal.Signals(signum).name} received during the balance probe, before "
                                 f"training: nothing was trained and no checkpoint was written; {again}")


class StepCheckpoints:
    """When the loop writes a checkpoint between steps, where, and whether it stops after it (the ranks agree)."""

    def __init__(self, checkpoint_dir, save_steps, save_minutes, handle_signals, clock):
        """`clock`: rank 0's minutes (--model_checkpoint_save_minutes) are measured on it."""
        self.checkpoint_dir = checkpoint_dir
        self.save_steps, self.save_minutes = int(save_steps), float(save_minutes)
        if self.save_steps < 0 or not self.save_minutes >= 0:
            raise ConfigError("checkpoint cadence must be >= 0 (--model_checkpoint_save_steps, "
                              "--model_checkpoint_save_minutes)")
        self.handle_signals = handle_signals
        self.clock = clock
        self._last_save_t = clock()
        self._last_step_file = None
        self.signum = None             # set by the handler; acted on when the ranks agree
        self.rank = 0                  # the Trainer's: rank 0 tells the launcher
        self.latest = None             # the newest checkpoint this run wrote or resumed from
        self.launcher_ending = False
        self._continued_t = -float("inf")
        self.stop_requested = self.save_requested = False     # what the ranks agreed on after the last step

    @contextlib.contextmanager
    def signal_handlers(self):
        """SIGTERM/SIGUSR1/SIGINT only set a flag (acted on after the current step); restored afterwards."""
        self.stop_requested = self.save_requested = False
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self._on_signal) for s in PREEMPT_SIGNALS + (signal.SIGCONT,)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, signum, frame):
        if signum == signal.SIGCONT:
            self._continued_t = time.monotonic()
            return
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt          # Ctrl-C twice: now, without the checkpoint
        first = self.signum is None
        self.signum = signum
        if first and time.monotonic() - self._continued_t <= LAUNCHER_KILL_WINDOW_S:
            self.launcher_ending = True
            if self.rank == 0:
                from pydtnn.parallel.runtime.shutdown import tell_launcher
                tell_launcher(f"pydtnn: {signal.Signals(signum).name} from Open MPI's launcher, which ends the ranks "
                              f"within a second: the checkpoint of this step goes into {self.checkpoint_dir} if "
                              f"there is time; the latest written is {self.latest or 'none'} (to stop with a "
                              f"checkpoint under Open MPI, send SIGUSR1 to mpirun)")

    def pending(self) -> int:
        """The number of a signal this rank received and has not acted on yet, or 0."""
        return int(self.signum or 0)

    def local_flags(self, rank):
        """This rank's flags for the step's record: a signal arrived here; (rank 0) a timed checkpoint is due."""
        return {"signal": self.signum is not None, "checkpoint_due": rank == 0 and self._due_by_time()}

    def agree(self, record):
        """What every rank decided after a step (its StepRecord)."""
        self.stop_requested, self.save_requested = record.signal, record.checkpoint_due

    def _due_by_time(self):
        return self.save_minutes > 0 and self.clock() - self._last_save_t >= 60.0 * self.save_minutes

    def due(self, epoch, step, steps_per_epoch):
        """A checkpoint after step `step` (0-based) of epoch `epoch`: agreed on, or the step cadence's."""
        return self.stop_requested or self.save_requested or (
            self.save_steps > 0 and (epoch * steps_per_epoch + step + 1) % self.save_steps == 0)

    def write(self, save_checkpoint, comm, epoch, step, steps_per_epoch, partial=None):
        """A full checkpoint `epoch` epochs and `step` steps in (`save_checkpoint`: the Trainer's, a
        collective); on a signal, then raise Preempted."""
        path = os.path.join(self.checkpoint_dir, f"epoch_{epoch:04d}_step_{step:06d}.npz")
        save_checkpoint(path, epoch, step=step, partial=partial)
        self._last_save_t = self.clock()
        stop = self.stop_requested
        self.stop_requested = self.save_requested = False
        if stop:
            signum = comm.allgather(float(self.signum or 0)).max()
            raise Preempted(int(signum) or signal.SIGTERM, path, epoch, step, steps_per_epoch, self.launcher_ending)
        if comm.rank == 0 and self._last_step_file and self._last_step_file != path:
            with contextlib.suppress(OSError):
                os.unlink(self._last_step_file)
        self._last_step_file = path

    def rescue(self, save_checkpoint, epoch, step, partial, num_epochs, steps_per_epoch):
        """The full checkpoint of the point `epoch` epochs and `step` steps in (`partial`: that epoch's sums)
        when an output failed (a collective), in --checkpoint_dir or else a temporary folder; what to tell."""
        where = (f"after epoch {epoch} of {num_epochs}" if not step else
                 f"in epoch {epoch + 1} of {num_epochs}, after step {step} of {steps_per_epoch}")
        failures = []
        for folder in rescue_folders(self.checkpoint_dir):
            path = os.path.join(folder, f"epoch_{epoch:04d}_step_{step:06d}.npz")
            try:
                save_checkpoint(path, epoch, step=step, partial=partial)
            except OutputError as e:
                failures.append(str(e))
                continue
            if epoch == num_epochs and not step:
                return f"all {num_epochs} epochs were trained: their checkpoint was written to {path}"
            return f"training stopped {where}: its checkpoint was written to {path} (continue with --resume {path})"
        return f"training stopped {where}, and its checkpoint failed too ({'; '.join(failures)})"
