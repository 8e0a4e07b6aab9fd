"""Mistakes that not every rank sees, in real MPI jobs (MPICH, and Open MPI in CI's second environment).

Ranks started with different flags (an MPMD launch, a per-node job script), a device or a file that only
one rank has wrong: every rank stops with status 2 and one line, named by the rank that saw it. Each job
runs with PYDTNN_ERROR_SYNC_S=600: if the mistake were not agreed at a collective, the ranks that did not
see it would wait 10 minutes for the others and the job would outlive its timeout (a test failure), so
passing shows the agreement, with no timing threshold.
"""
import os
import sys

import numpy as np
import pytest

from mpi_helpers import REPO_ROOT, describe, output_of_our_processes, run_mpi, run_mpmd  # noqa: E402

pytestmark = pytest.mark.mpi
LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"
QUICK = ["--synthetic_samples", "96", "--batch_size", "16", "--progress_bar", "false", "--lr_schedulers", "",
         "--parallel", "data"]
NO_WAITING = {"PYDTNN_ERROR_SYNC_S": 600}


def one_line(r):
    assert r.returncode == 2, describe(r)
    lines = output_of_our_processes(r, r.stderr)       # under Open MPI, less prterun's own notice
    assert len(lines) == 1 and lines[0].startswith("pydtnn: error: "), describe(r)
    assert "Traceback" not in r.stderr and "MPI_ABORT" not in r.stderr and "Abort(" not in r.stderr, describe(r)
    return lines[0]


def mpmd(first, second, extra=(), timeout=120):
    """Ranks 0-1 with the flags ``first``, rank 2 with ``second``."""
    return run_mpmd([(2, LAUNCHER, [*QUICK, *extra, *first]), (1, LAUNCHER, [*QUICK, *extra, *second])],
                    timeout=timeout, env=NO_WAITING)


def test_mpmd_ranks_with_different_epochs_stop_with_the_first_differing_flag():
    line = one_line(mpmd(["--num_epochs", "2"], ["--num_epochs", "3"]))
    assert line.startswith("pydtnn: error: the ranks were started with different flags: --num_epochs is 2 on "
                           "ranks 0-1 and 3 on rank 2"), line


def test_mpmd_ranks_with_different_models_stop_before_building_them():
    line = one_line(mpmd(["--model", "simplecnn"], ["--model", "simplemlp"]))
    assert "--model is simplecnn on ranks 0-1 and simplemlp on rank 2" in line, line


def test_a_flag_only_one_rank_cannot_parse_is_its_line():
    line = one_line(mpmd([], ["--batchsize", "3"]))
    assert line == "pydtnn: error: rank 2: unrecognized arguments: --batchsize 3", line


def test_flags_that_may_differ_between_ranks_run():
    r = mpmd(["--threads_per_replica", "1"], ["--threads_per_replica", "2"], extra=["--num_epochs", "1"])
    assert r.returncode == 0, describe(r)
    assert "threads per replica: 1, 1, 2 (--threads_per_replica)" in r.stdout, r.stdout


def test_a_device_only_one_rank_lacks_stops_every_rank():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here: every rank could build a GPU backend")
    except ImportError:
        pass
    line = one_line(run_mpi(3, LAUNCHER, [*QUICK, "--devices", "cpu,cpu,gpu"], env=NO_WAITING))
    assert line.startswith("pydtnn: error: rank 2: the GPU backend needs CuPy"), line


def _shards(folder, bad=None, n=4):
    """ImageNet NPZ shards of 24 8x8 images; shard ``bad`` holds a label 0 (found when it is read)."""
    os.makedirs(folder)
    rng = np.random.default_rng(0)
    for i in range(n):
        y = rng.integers(1, 11, 24)
        if i == bad:
            y[5] = 0
        np.savez(os.path.join(folder, f"shard_{i}.npz"), x=rng.integers(0, 256, (24, 3, 8, 8), dtype=np.uint8), y=y)
    return folder


@pytest.mark.parametrize("when", ["training", "evaluation"])
def test_a_bad_shard_in_one_ranks_copy_of_the_data_stops_every_rank(tmp_path, when):
    """Node-local copies of ImageNet: rank 2's copy has a corrupt shard, which it reads lazily, in a training
    step (agreed in the step's stats reduction) or in an evaluation (agreed in its sums)."""
    good, bad = _shards(str(tmp_path / "good")), _shards(str(tmp_path / "bad"), bad=2)
    common = ["--dataset", "imagenet", "--model", "simplemlp", "--global_batch_size", "12", "--num_epochs", "1"]
    if when == "training":
        first, second = ["--dataset_train_path", good], ["--dataset_train_path", bad]
    else:
        first = ["--dataset_train_path", good, "--dataset_test_path", good, "--evaluate_only", "true"]
        second = ["--dataset_train_path", good, "--dataset_test_path", bad, "--evaluate_only", "true"]
    r = run_mpmd([(2, LAUNCHER, [*QUICK[:-2], "--parallel", "data", *common, *first]),
                  (1, LAUNCHER, [*QUICK[:-2], "--parallel", "data", *common, *second])], env=NO_WAITING)
    line = one_line(r)
    assert line == f"pydtnn: error: rank 2: {bad}/shard_2.npz: label 0 out of range 1..1000 (labels are 1-based)", line


def test_a_weights_file_of_strings_under_three_ranks_is_one_line(tmp_path):
    path = tmp_path / "w.npz"
    np.savez(path, **{"conv2d/weights": np.array(["a", "b"])})
    line = one_line(run_mpi(3, LAUNCHER, [*QUICK, "--weights_and_bias_filename", path], env=NO_WAITING))
    assert line == f"pydtnn: error: weights file {path}: array 'conv2d/weights' holds strings (<U1), not real numbers"


def test_ranks_resumed_from_checkpoints_of_different_runs_stop(tmp_path):
    """Each rank reads its own --resume path (a node's copy); the flags they bring must agree too."""
    import subprocess
    paths = []
    for epochs in (1, 2):
        folder = tmp_path / f"run{epochs}"
        r = subprocess.run([sys.executable, str(LAUNCHER), *QUICK[:-2], "--num_epochs", str(epochs), "--lr_schedulers",
                            "model_checkpoint", "--model_checkpoint_save_freq", "1", "--checkpoint_dir", str(folder)],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT)))
        assert r.returncode == 0, r.stderr
        paths.append(folder / "epoch_0001.npz")
    line = one_line(run_mpmd([(2, LAUNCHER, [*QUICK, "--resume", paths[0]]),
                              (1, LAUNCHER, [*QUICK, "--resume", paths[1]])], env=NO_WAITING))
    assert line.startswith("pydtnn: error: the ranks resumed from checkpoints of runs with different flags: "
                           "--num_epochs is 1 on ranks 0-1 and 2 on rank 2"), line
