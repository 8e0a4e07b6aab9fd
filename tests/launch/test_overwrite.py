"""Outputs come from the command line of the run that writes them, and an output that would replace a file
this run did not create is refused before any work, in one line, unless --overwrite true. A resumed run
continues its checkpoint's run: it may write again what that run wrote up to the checkpoint, never what it
wrote after it (an experiment resumed from an early checkpoint once overwrote the final weights, the
history and the later epoch checkpoints of the original run)."""
import csv
import os
import subprocess
import sys

import pytest

from paths import REPO_DIR as REPO  # noqa: E402
LAUNCHER = os.path.join(REPO, "scripts", "pydtnn_benchmark.py")
WRAPPER = os.path.join(REPO, "tests", "mpi_scripts", "signal_at_step.py")
# 192 training samples, 6 steps of 32, a validation split, a checkpoint after every epoch
RUN = ["--model", "simplecnn", "--synthetic_samples", "256", "--validation_split", "0.25", "--batch_size", "32",
       "--progress_bar", "false", "--seed", "3", "--lr_schedulers", "model_checkpoint",
       "--model_checkpoint_save_freq", "1"]


def launch(cwd, *args, script=LAUNCHER, **extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONPATH=REPO,
               **{k: str(v) for k, v in extra.items()})
    return subprocess.run([sys.executable, script, *map(str, args)], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def refused(r):
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pydtnn: error: ") and "epoch 1:" not in r.stdout, r.stderr
    return lines[0][len("pydtnn: error: "):]


def snapshot(folder):
    return {os.path.join(d, n): open(os.path.join(d, n), "rb").read()
            for d, _, names in os.walk(folder) for n in names}


def epochs_in(path):
    with open(path) as f:
        return [int(r["epoch"]) for r in csv.DictReader(f)]


OUTPUTS = {
    "--history_file": ("h.csv", []),
    "--save_weights_and_bias_filename": ("w.npz", []),
    "--step_history_file": ("s.csv", []),
    "--tracer_output": ("t.json", ["--tracing", "true"]),
    "--plots_dir": ("plots", []),
}


@pytest.mark.parametrize("flag", list(OUTPUTS))
def test_a_new_run_never_replaces_an_existing_output_unless_told(tmp_path, flag):
    name, extra = OUTPUTS[flag]
    target = tmp_path / (os.path.join(name, "replicas.png") if flag == "--plots_dir" else name)
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(b"an earlier run's")
    args = [*RUN, "--lr_schedulers", "", "--num_epochs", "1", flag, name, *extra]
    assert refused(launch(tmp_path, *args)) == (f"{flag} {target.relative_to(tmp_path)} exists and this run did "
                                                f"not create it: give another name, or --overwrite true to replace it")
    assert target.read_bytes() == b"an earlier run's"
    r = launch(tmp_path, *args, "--overwrite", "true")
    assert r.returncode == 0, r.stderr
    assert target.read_bytes() != b"an earlier run's"


def test_a_new_run_never_writes_over_another_runs_checkpoints(tmp_path):
    assert launch(tmp_path, *RUN, "--num_epochs", "2", "--checkpoint_dir", "ck").returncode == 0
    before = snapshot(tmp_path / "ck")
    line = refused(launch(tmp_path, *RUN, "--num_epochs", "2", "--checkpoint_dir", "ck"))
    assert line == ("--checkpoint_dir ck holds checkpoints of a later point than this run starts from (epoch 0), "
                    "which it could write again: best.npz, epoch_0001.npz, epoch_0002.npz; give another "
                    "--checkpoint_dir, resume from the latest one, or --overwrite true to replace them"), line
    assert snapshot(tmp_path / "ck") == before


def test_resuming_from_an_early_checkpoint_never_destroys_the_later_run(tmp_path):
    """The issue's experiment: 3 epochs with every output, then a resume from epoch 1 with the same command."""
    outputs = ["--checkpoint_dir", "ck", "--history_file", "h.csv", "--save_weights_and_bias_filename", "w.npz"]
    assert launch(tmp_path, *RUN, "--num_epochs", "3", *outputs).returncode == 0
    before = snapshot(tmp_path)
    resume = ["--resume", "ck/epoch_0001.npz", "--num_epochs", "3"]
    line = refused(launch(tmp_path, *RUN, *outputs, *resume))
    assert line == ("--save_weights_and_bias_filename w.npz exists and this run did not create it: give another "
                    "name, or --overwrite true to replace it"), line
    line = refused(launch(tmp_path, *RUN, "--checkpoint_dir", "ck", "--history_file", "h.csv", *resume))
    assert line == ("--history_file h.csv is not the history of checkpoint ck/epoch_0001.npz up to its epoch 1: "
                    "give another name, or --overwrite true to replace it"), line
    line = refused(launch(tmp_path, *RUN, "--checkpoint_dir", "ck", *resume))
    assert line.startswith("--checkpoint_dir ck holds checkpoints of a later point than this run starts from (epoch "
                           "1), which it could write again: best.npz, epoch_0002.npz, epoch_0003.npz;"), line
    assert snapshot(tmp_path) == before
    # new outputs of its own: the experiment runs and the original run stays whole
    r = launch(tmp_path, *RUN, "--checkpoint_dir", "ck2", "--history_file", "h2.csv", *resume)
    assert r.returncode == 0, r.stderr
    assert {k: v for k, v in snapshot(tmp_path).items() if k in before} == before
    assert epochs_in(tmp_path / "h2.csv") == [1, 2, 3]


def test_the_same_command_resumed_after_a_preemption_continues_its_own_outputs(tmp_path):
    """SIGTERM in epoch 2, then the same command with --resume: the history, the step history and the
    checkpoint folder are that run's up to its checkpoint, so they continue without --overwrite."""
    outputs = ["--checkpoint_dir", "ck", "--history_file", "h.csv", "--step_history_file", "s.csv",
               "--num_epochs", "3"]
    r = launch(tmp_path, *RUN, *outputs, script=WRAPPER, SIGNAL_AT_STEP=9)
    assert r.returncode == 3, r.stderr
    r = launch(tmp_path, *RUN, *outputs, "--resume", "ck/epoch_0001_step_000003.npz")
    assert r.returncode == 0, r.stderr
    assert epochs_in(tmp_path / "h.csv") == [1, 2, 3]
    with open(tmp_path / "s.csv") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == list(range(1, 19))       # every step, once
