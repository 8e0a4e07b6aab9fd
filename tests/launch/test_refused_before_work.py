"""Runs that would do nothing, or not what was asked, are one line before the banner, status 2: --num_epochs 0,
a --resume whose run already trained --num_epochs, --evaluate_only without a test split (or with an empty
one), and an empty path that would silently turn a flag off (--tensorboard_dir '', --resume '', ...)."""
import subprocess
import sys
import textwrap

import pytest

from mpi_helpers import describe, output_of_our_processes, run_mpi  # noqa: E402
from paths import REPO_DIR as REPO  # noqa: E402

LAUNCHER = f"{REPO}/scripts/pydtnn_benchmark.py"
FAST = ["--model", "simplemlp", "--synthetic_samples", "64", "--batch_size", "16", "--steps_per_epoch", "2",
        "--progress_bar", "false", "--lr_schedulers", ""]
EMPTY_TEST = """
    import numpy as np
    from pydtnn.datasets import ArraySplit, Dataset
    def create_dataset(seed):
        x, y = np.zeros((32, 1, 28, 28), np.float32), np.arange(32) % 10
        return Dataset(name="mine", input_shape=(1, 28, 28), nclasses=10, train=ArraySplit(x, y, 0, 32, nclasses=10),
                       val=None, test=ArraySplit(x, y, 0, 0, nclasses=10, name="test"))
"""


def _launch(tmp_path, *args):
    return subprocess.run([sys.executable, LAUNCHER, *FAST, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path))


CASES = {
    "no epochs": (["--num_epochs", "0"], "--num_epochs 0 trains nothing"),
    "empty tensorboard folder": (["--tensorboard_dir", ""], "--tensorboard_dir: empty folder name"),
    "empty plots folder": (["--plots_dir", ""], "--plots_dir: empty folder name"),
    "empty step history": (["--step_history_file", ""], "--step_history_file: empty file name"),
    "empty resume": (["--resume", ""], "--resume: empty path"),
    "empty weights": (["--weights_and_bias_filename", ""], "--weights_and_bias_filename: empty path"),
    "empty train path": (["--dataset", "mnist", "--dataset_train_path", ""], "--dataset_train_path: empty path"),
    "evaluate bytes": (["--model", "bytelm_small", "--dataset", "bytes", "--evaluate_only", "true"],
                       "no test split to evaluate on"),
    "evaluate the t10k pool": (["--dataset", "mnist", "--dataset_train_path", f"{REPO}/tests/data/mnist-t10k",
                                "--evaluate_only", "true"], "no test split to evaluate on"),
    "evaluate an empty test split": (["--dataset", "empty_test.py", "--evaluate_only", "true"],
                                     "no test split to evaluate on"),
    # issue 46: accepted and ignored, or without a bound
    "tf32 on a CPU-only run": (["--precision", "tf32"], "--precision tf32 sets a GPU's float32 math"),
    "fpm without --parallel data": (["--balance", "fpm"], "it needs --parallel data"),
    "an emulated fixed cost of a year": (["--emulate_costs", "31536000s+1.0"], "at most 60 s"),
    "an infinite emulated schedule factor": (["--emulate_schedule", "0:1e999@0-2"], "1 <= FACTOR <= 1000"),
    # issue 47: gradient accumulation
    "no accumulation steps": (["--accumulation_steps", "0"], "--accumulation_steps: must be a positive integer, got 0"),
    "a fraction of an accumulation step": (["--accumulation_steps", "1.5"], "--accumulation_steps: invalid"),
    # issue 47: compressed reductions
    "compression without --parallel data": (["--grad_compression", "fp16"],
                                            "--grad_compression fp16 compresses the gradients replicas exchange: it "
                                            "needs --parallel data"),
    "an unknown compression": (["--grad_compression", "fp8"], "--grad_compression: invalid choice: 'fp8'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_in_one_line_before_the_banner(tmp_path, case):
    (tmp_path / "empty_test.py").write_text(textwrap.dedent(EMPTY_TEST))
    args, needle = CASES[case]
    r = _launch(tmp_path, *args)
    assert r.returncode == 2 and r.stdout == "", (r.stdout[-2000:], r.stderr[-2000:])
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("pydtnn: error: ") and needle in r.stderr, r.stderr


def test_no_epochs_may_evaluate_or_save_the_initial_weights_and_a_resume_needs_epochs_left(tmp_path):
    r = _launch(tmp_path, "--num_epochs", "0", "--evaluate_only", "true")
    assert r.returncode == 0 and "evaluation: loss=" in r.stdout, r.stderr[-2000:]
    r = _launch(tmp_path, "--num_epochs", "0", "--save_weights_and_bias_filename", tmp_path / "init.npz")
    assert r.returncode == 0 and (tmp_path / "init.npz").is_file(), r.stderr[-2000:]      # the initial weights
    r = _launch(tmp_path, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "ck", "--lr_schedulers",
                "model_checkpoint", "--model_checkpoint_save_freq", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    for extra in ([], ["--num_epochs", "2"], ["--num_epochs", "1"]):
        r = _launch(tmp_path, "--resume", tmp_path / "ck" / "epoch_0002.npz", *extra)
        assert r.returncode == 2 and r.stdout == "", r.stderr[-2000:]
        assert "its run trained 2 epoch(s)" in r.stderr and "give --num_epochs above 2" in r.stderr, r.stderr
    r = _launch(tmp_path, "--resume", tmp_path / "ck" / "epoch_0002.npz", "--num_epochs", "3")
    assert r.returncode == 0 and "epoch 3: loss=" in r.stdout, r.stderr[-2000:]


@pytest.mark.mpi
def test_under_mpiexec_no_epochs_is_one_line_on_every_rank():
    r = run_mpi(2, LAUNCHER, [*FAST, "--parallel", "data", "--num_epochs", "0"], timeout=120)
    lines = output_of_our_processes(r)
    assert r.returncode == 2 and len(lines) == 1 and "--num_epochs 0 trains nothing" in lines[0], describe(r)


@pytest.mark.mpi
@pytest.mark.parametrize("args, needle", [
    (["--precision", "tf32"], "--precision tf32 sets a GPU's float32 math, and no replica of this run is on a GPU"),
    (["--emulate_costs", "1e400ms+1.0,0+1.0"], "--emulate_costs '1e400ms+1.0': 1e400ms is not a finite number"),
    (["--emulate_costs", "0+1.0,0+1e6"], "a factor per sample must be in [1, 1000]"),
])
def test_under_mpiexec_ignored_or_unbounded_values_are_one_line_on_every_rank(args, needle):
    r = run_mpi(2, LAUNCHER, [*FAST, "--parallel", "data", *args], timeout=120)
    lines = output_of_our_processes(r)
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("pydtnn: error: ") and needle in lines[0], \
        describe(r)


def test_a_resume_alone_takes_an_empty_flag_of_its_run_as_empty(tmp_path):
    """`--resume CK` alone: the run's --lr_schedulers "" comes back empty (it came back as the text '""', an
    unknown scheduler)."""
    r = _launch(tmp_path, "--num_epochs", "1", "--model_checkpoint_save_steps", "1", "--checkpoint_dir", tmp_path / "ck")
    assert r.returncode == 0, r.stderr[-2000:]
    saved = sorted((tmp_path / "ck").glob("*.npz"))
    r = subprocess.run([sys.executable, LAUNCHER, "--resume", str(saved[-1]), "--num_epochs", "2"],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0 and "epoch 2: loss=" in r.stdout, r.stderr[-2000:]
