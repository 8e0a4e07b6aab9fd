"""Nothing lost when an output fails, and no hang: a full or read-only --tensorboard_dir, --step_history_file,
--history_file, --tracer_output or --plots_dir, from the start or mid-run, stops training with one line that
names the failure and where the rescue went (the full checkpoint of the last step or epoch, the weights), and
training resumed from that checkpoint is the uninterrupted run, bit for bit. Ctrl-C (SIGINT) writes the
checkpoint as SIGTERM does.

The full disk is tests/mpi_scripts/full_disk.py: ENOSPC at the fsync of the named outputs' temporary files
(the write itself reached the page cache, as on a real full disk), and a TensorBoard event file whose writes
and flushes fail once it has been flushed N times. No tmpfs, no privileges.
"""
import csv
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from mpi_helpers import SCRIPTS, describe, is_open_mpi, mpi_command, output_of_our_processes, run_mpi, _kill_job

from paths import REPO_DIR as REPO  # noqa: E402
LAUNCHER = os.path.join(REPO, "scripts", "pydtnn_benchmark.py")
FULL_DISK = str(SCRIPTS / "full_disk.py")
AT_STEP = str(SCRIPTS / "signal_at_step.py")
# 256 samples in 8 steps of 32 per epoch, no validation; the same numbers under 2 ranks (global batch 32)
BASE = ["--model", "simplecnn", "--synthetic_samples", "256", "--progress_bar", "false", "--seed", "3",
        "--lr_schedulers", "", "--num_epochs", "3"]
SEQ = [*BASE, "--batch_size", "32"]
MPI = [*BASE, "--parallel", "data", "--global_batch_size", "32"]


def env(tmp_path, **extra):
    # TMPDIR: where a rescue that finds no other place goes, inside the test's folder
    (tmp_path / "systmp").mkdir(exist_ok=True)
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=REPO,
                TMPDIR=str(tmp_path / "systmp"), **{k: str(v) for k, v in extra.items()})


def launch(tmp_path, *args, script=LAUNCHER, timeout=300, **extra):
    return subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path, env=env(tmp_path, **extra))


def one_line(r, status=2):
    lines = output_of_our_processes(r, r.stderr)
    assert r.returncode == status, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and len(lines) == 1 and lines[0].startswith("pydtnn: "), r.stderr
    return lines[0]


def same_weights(a, b):
    with np.load(a) as x, np.load(b) as y:
        weights = [k for k in x.files if "/" in k and not k.startswith("optimizer/")]
        assert weights and all(np.array_equal(x[k], y[k]) for k in weights)


def point_of(path):
    import json
    with np.load(path) as d:
        meta = json.loads(d["__meta__"].tobytes())
    return meta["epoch"], meta["step"]


# (outputs' flags, what fails, after how many good writes, the checkpoint the rescue writes, the line's tail)
CASES = {
    "tensorboard inside an epoch": (["--tensorboard_dir", "tb"], "tensorboard", 1, (1, 2),
                                    "training stopped in epoch 2 of 3, after step 2 of 8"),
    "step history at an epoch's end": (["--step_history_file", "s.csv"], ".csv", 1, (2, 0),
                                       "training stopped after epoch 2 of 3"),
    "history from the start": (["--history_file", "h.csv"], ".csv", 0, (1, 0), "training stopped after epoch 1 of 3"),
    "history read-only mid-run": (["--history_file", "h.csv"], ".csv", 1, (2, 0), "training stopped after epoch 2 of 3"),
    "trace at the end": (["--tracing", "true", "--tracer_output", "t.json"], ".json", 0, (3, 0),
                         "all 3 epochs were trained"),
    "plot at the end": (["--plots_dir", "plots"], ".png", 0, (3, 0), "all 3 epochs were trained"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_failing_output_keeps_the_full_state_and_the_weights(tmp_path, case):
    flags, kind, after, point, where = CASES[case]
    errno_name = "EROFS" if "read-only" in case else "ENOSPC"
    r = launch(tmp_path, *SEQ, *flags, "--checkpoint_dir", "ck", "--save_weights_and_bias_filename", "w.npz",
               script=FULL_DISK, FULL_DISK=kind, FULL_DISK_AFTER=after, FULL_DISK_ERRNO=errno_name)
    line = one_line(r)
    ckpt = f"ck/epoch_{point[0]:04d}_step_{point[1]:06d}.npz"
    cause = "Read-only file system" if errno_name == "EROFS" else "No space left on device"
    assert line.startswith("pydtnn: error: cannot write ") and cause in line, line
    assert f"{where}: " in line and f"checkpoint was written to {ckpt}" in line, line
    assert line.endswith("; the trained weights were saved to w.npz"), line
    assert point_of(tmp_path / ckpt) == point
    same_weights(tmp_path / "w.npz", tmp_path / ckpt)


def test_training_resumed_from_the_rescue_is_the_uninterrupted_run(tmp_path):
    """Stopped inside epoch 2 by a full TensorBoard disk; resumed from the rescue with the same outputs: the
    final weights are bit-exact, and the step history holds every step once."""
    full = launch(tmp_path, *SEQ, "--save_weights_and_bias_filename", "full.npz", "--checkpoint_dir", "a")
    assert full.returncode == 0, full.stderr
    outputs = ["--tensorboard_dir", "tb", "--step_history_file", "s.csv", "--checkpoint_dir", "b"]
    r = launch(tmp_path, *SEQ, *outputs, script=FULL_DISK, FULL_DISK="tensorboard", FULL_DISK_AFTER=1)
    assert "checkpoint was written to b/epoch_0001_step_000002.npz" in one_line(r)
    r = launch(tmp_path, *SEQ, *outputs, "--resume", "b/epoch_0001_step_000002.npz",
               "--save_weights_and_bias_filename", "resumed.npz")
    assert r.returncode == 0, r.stderr
    same_weights(tmp_path / "full.npz", tmp_path / "resumed.npz")
    with open(tmp_path / "s.csv") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == list(range(1, 25))


def test_a_full_disk_at_start_up_is_refused_before_the_first_step(tmp_path):
    r = launch(tmp_path, *SEQ, "--tensorboard_dir", "tb", "--checkpoint_dir", "ck", script=FULL_DISK,
               FULL_DISK="tensorboard", FULL_DISK_AFTER=0)
    line = one_line(r)
    assert line == ("pydtnn: error: cannot write TensorBoard events into tb: No space left on device; no training "
                    "step had run: nothing to save"), line
    assert "epoch 1:" not in r.stdout and not (tmp_path / "ck").exists()


def test_with_the_checkpoint_folder_full_too_the_rescue_goes_to_the_temporary_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = launch(tmp_path, *SEQ, "--history_file", out / "h.csv", "--checkpoint_dir", out / "ck",
               "--save_weights_and_bias_filename", out / "w.npz", script=FULL_DISK, FULL_DISK=".csv,.npz",
               FULL_DISK_ONLY_IN=out)
    line = one_line(r)
    (rescue,) = os.listdir(tmp_path / "systmp")            # pydtnn-rescue-<host>-<pid>
    ckpt, weights = tmp_path / "systmp" / rescue / "epoch_0001_step_000000.npz", tmp_path / "systmp" / rescue / "final_weights.npz"
    assert f"its checkpoint was written to {ckpt}" in line and f"saved to {weights} instead" in line, line
    same_weights(weights, ckpt)
    assert [n for n in os.listdir(out / "ck") if not n.startswith(".tmp")] == []


def test_ctrl_c_writes_the_checkpoint_and_resumes_bit_exactly(tmp_path):
    full = launch(tmp_path, *SEQ, "--save_weights_and_bias_filename", "full.npz", "--checkpoint_dir", "a")
    assert full.returncode == 0, full.stderr
    r = launch(tmp_path, *SEQ, "--checkpoint_dir", "b", script=AT_STEP, SIGNAL_AT_STEP=10, SIGNAL_NAME="SIGINT")
    ckpt = "b/epoch_0001_step_000002.npz"
    assert one_line(r, status=130) == (f"pydtnn: SIGINT received: checkpoint written to {ckpt} (after epoch 1, step "
                                       f"2 of 8); continue with --resume {ckpt}")
    r = launch(tmp_path, *SEQ, "--checkpoint_dir", "b", "--resume", ckpt, "--save_weights_and_bias_filename",
               "resumed.npz")
    assert r.returncode == 0, r.stderr
    same_weights(tmp_path / "full.npz", tmp_path / "resumed.npz")


# ------------------------------------------------------------------------------------ under MPI (both MPIs)

@pytest.mark.parametrize("kind, flags, point", [
    ("tensorboard", ["--tensorboard_dir", "tb"], (1, 2)),
    (".csv", ["--history_file", "h.csv", "--step_history_file", "s.csv"], (1, 0)),   # s.csv, then h.csv fails
])
def test_a_failing_output_under_mpi_is_one_line_with_the_rescue(tmp_path, kind, flags, point):
    ck = tmp_path / "ck"
    flags = [f if f in ("--tensorboard_dir", "--history_file", "--step_history_file") else tmp_path / f for f in flags]
    r = run_mpi(2, FULL_DISK, [*MPI, *flags, "--checkpoint_dir", ck, "--save_weights_and_bias_filename",
                               tmp_path / "w.npz"], timeout=240,
                env={"FULL_DISK": kind, "FULL_DISK_AFTER": 1, "PYDTNN_ERROR_SYNC_S": 600})
    line = one_line(r)
    ckpt = ck / f"epoch_{point[0]:04d}_step_{point[1]:06d}.npz"
    assert "No space left on device" in line and f"checkpoint was written to {ckpt}" in line, line
    assert point_of(ckpt) == point
    same_weights(tmp_path / "w.npz", ckpt)


def test_ctrl_c_on_one_rank_stops_every_rank_with_the_checkpoint(tmp_path):
    r = run_mpi(2, AT_STEP, [*MPI, "--checkpoint_dir", tmp_path], timeout=240,
                env={"SIGNAL_AT_STEP": 10, "SIGNAL_RANK": 1, "SIGNAL_NAME": "SIGINT", "PYDTNN_ERROR_SYNC_S": 600})
    ckpt = tmp_path / "epoch_0001_step_000002.npz"
    assert one_line(r, status=130).startswith(f"pydtnn: SIGINT received: checkpoint written to {ckpt}"), describe(r)
    assert point_of(ckpt) == (1, 2)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_mpi_launcher_says_where_the_checkpoint_is(tmp_path, signum):
    """Ctrl-C or a scheduler's SIGTERM to mpiexec. MPICH's forwards it and waits: the ranks write the
    checkpoint and end with its status. Open MPI's ends the ranks itself within half a second and forwards
    nothing they print: rank 0 tells the launcher's own stderr where the checkpoint goes (and, if it was
    written in time, where it is)."""
    cmd = mpi_command(2, LAUNCHER, [*MPI, "--num_epochs", "100000", "--checkpoint_dir", tmp_path])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(tmp_path),
                            start_new_session=True)
    try:
        for line in proc.stdout:               # training is under way once an epoch is reported
            if line.startswith("epoch 1:"):
                proc.send_signal(signum)
                break
        err = proc.stderr.read()
        status = proc.wait(timeout=120)
    finally:
        _kill_job(proc)
    written = [f for f in os.listdir(tmp_path) if f.endswith(".npz")]
    assert "Traceback" not in err
    if is_open_mpi(cmd[0]):
        assert status == 1, (status, err)      # prterun's own status for a job it ended
        assert (f"pydtnn: SIGTERM from Open MPI's launcher, which ends the ranks within a second: the checkpoint of "
                f"this step goes into {tmp_path} if there is time; the latest written is none") in err, err
        if written:                            # it was written in time: the line says which
            assert f"pydtnn: SIGTERM received: checkpoint written to {tmp_path / written[0]}" in err, err
    else:
        name = signal.Signals(signum).name
        assert status == (130 if signum == signal.SIGINT else 3), (status, err)
        (ckpt,) = written
        assert f"pydtnn: {name} received: checkpoint written to {tmp_path / ckpt}" in err, err
