"""A signal stops a run wherever it waits (issue 46): inside a step padded to an emulated device's time (the pad
looks for a pending stop every quarter second, and the step's record carries it to every rank), and during the
balance probe before training (the probe runs under the signal handlers: every rank stops together, nothing
trained, nothing written, the exit status of a preemption). Real signals, real MPI, real time."""
import os
import re
import subprocess
import sys
import time

import pytest

from mpi_helpers import REPO_ROOT, describe, mpi_command, output_of_our_processes  # noqa: E402

LAUNCHER = str(REPO_ROOT / "scripts" / "pydtnn_benchmark.py")
FAST = ["--model", "simplemlp", "--dataset", "synthetic", "--synthetic_samples", "128", "--batch_size", "16",
        "--num_epochs", "1", "--steps_per_epoch", "4", "--progress_bar", "false", "--lr_schedulers", "",
        "--threads_per_replica", "1"]

# the signal, sent by a timer SIGNAL_AFTER_S into the first training step (on every rank, as a scheduler does)
IN_STEP = '''
import os, signal, sys, threading, time
from pydtnn import cli
from pydtnn.training.loop import Trainer

original = Trainer.train_step


def fire():
    # one write per line: print() writes the text and its newline apart, and two ranks' lines then interleave
    sys.stdout.write(f"signal sent at {time.time():.3f}\\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGUSR1)


def train_step(self, *args, **kwargs):
    if not getattr(Trainer, "armed", False):
        Trainer.armed = True
        threading.Timer(float(os.environ["SIGNAL_AFTER_S"]), fire).start()
    return original(self, *args, **kwargs)


Trainer.train_step = train_step
sys.exit(cli.main(sys.argv[1:]))
'''

# the signal, raised on rank SIGNAL_RANK as the probe starts its point SIGNAL_AT_POINT
IN_PROBE = '''
import os, signal, sys
from pydtnn import cli
from pydtnn.parallel.balance.probe import LockStepProbe

original = LockStepProbe.measure


def measure(self, sizes):
    if self.points + 1 == int(os.environ["SIGNAL_AT_POINT"]) and self.comm.rank == int(os.environ["SIGNAL_RANK"]):
        os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL_NAME"]))
    return original(self, sizes)


LockStepProbe.measure = measure
sys.exit(cli.main(sys.argv[1:]))
'''


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(REPO_ROOT), **{k: str(v) for k, v in extra.items()})
    return env


def _run(cmd, tmp_path, timeout=120, **env):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=_env(**env))


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.mpi)])
def test_a_signal_ends_a_step_padded_to_30_seconds_within_seconds(tmp_path, ranks):
    """Each rank's step is padded to 30 s (--emulate_costs 30s+...); SIGUSR1 1 s into it: the pads return, the
    step's record carries the signal, every rank writes the checkpoint together and ends with status 3."""
    script = tmp_path / "in_step.py"
    script.write_text(IN_STEP)
    args = [*FAST, "--emulate_costs", ",".join(["30s+0.1ms"] * ranks), "--checkpoint_dir", "ck"]
    if ranks > 1:
        cmd = mpi_command(ranks, script, [*args, "--parallel", "data"])
    else:
        cmd = [sys.executable, script, *args]
    r = _run(cmd, tmp_path, SIGNAL_AFTER_S=1.0)
    ended = time.time()
    sent = [float(t) for t in re.findall(r"signal sent at (\d+\.\d{3})", r.stdout)]
    assert r.returncode == 3 and len(sent) == ranks, describe(r)
    assert "pydtnn: SIGUSR1 received: checkpoint written to ck/epoch_0000_step_000001.npz" in r.stderr, describe(r)
    assert (tmp_path / "ck" / "epoch_0000_step_000001.npz").is_file()
    assert ended - max(sent) < 10.0, f"{ended - max(sent):.1f} s from the signal to the end"   # not the 29 s left


@pytest.mark.mpi
@pytest.mark.parametrize("signal_name, status", [("SIGUSR1", 3), ("SIGTERM", 3), ("SIGINT", 130)])
def test_a_signal_during_the_probe_stops_every_rank_before_training(tmp_path, signal_name, status):
    """The probe once ran before the handlers: SIGUSR1 there was swallowed under MPICH (the run trained to the
    end, exit 0, no checkpoint). Now a signal on rank 1 alone, at the probe's second point, stops both ranks
    before any training step: one line, a preemption's status, nothing written."""
    script = tmp_path / "in_probe.py"
    script.write_text(IN_PROBE)
    cmd = mpi_command(2, script, [*FAST, "--parallel", "data", "--balance", "fpm", "--global_batch_size", "32",
                                  "--checkpoint_dir", "ck"])
    r = _run(cmd, tmp_path, SIGNAL_AT_POINT=2, SIGNAL_RANK=1, SIGNAL_NAME=signal_name)
    lines = output_of_our_processes(r, r.stderr)
    assert r.returncode == status, describe(r)
    assert lines == [f"pydtnn: {signal_name} received during the balance probe, before training: nothing was "
                     f"trained and no checkpoint was written; run the same command again"], describe(r)
    assert "probe point 1: b = [3, 3]" in r.stdout and "probe point 2" not in r.stdout, r.stdout   # stopped in 2
    assert "epoch 1:" not in r.stdout and not (tmp_path / "ck").exists()


def test_the_probe_prints_its_plan_first_then_a_line_per_point(tmp_path):
    script = tmp_path / "in_probe.py"
    script.write_text(IN_PROBE)
    r = _run([sys.executable, script, *FAST, "--parallel", "data", "--balance", "fpm", "--global_batch_size", "32"],
             tmp_path, SIGNAL_AT_POINT=0, SIGNAL_RANK=0, SIGNAL_NAME="SIGUSR1")
    assert r.returncode == 0, describe(r)
    out = r.stdout.splitlines()
    first = next(i for i, line in enumerate(out) if line.startswith("probe before training (fpm): "))
    assert out[first + 1] == "probe plan: 4 points at b = 4, 8, 16, 32 (replica 0), then up to 3 round(s) at the " \
                             "proposed split", r.stdout
    points = [line for line in out if line.startswith("probe point ")]
    assert [p.split(":")[0] for p in points] == [f"probe point {k}" for k in range(1, len(points) + 1)]
    assert points[0].startswith("probe point 1: b = [4], median compute ") and len(points) >= 4
    assert first < min(i for i, line in enumerate(out) if "split as [" in line)      # before the split is shown
