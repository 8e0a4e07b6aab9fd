"""What each rank may have of its own, in real MPI jobs (MPICH, and Open MPI in CI's second environment): its
output flags (an MPMD launch, a per-node job script) never make some ranks enter a collective the others do
not, and its copy of the data must be the same dataset, which every rank agrees on before training.

Each job runs with PYDTNN_ERROR_SYNC_S=600 (as tests/parallel/test_rank_agreement.py): a rank left waiting in
a collective would outlive the job's timeout, so a job that ends shows there was no hang, with no timing
threshold.
"""
import os

import numpy as np
import pytest

from mpi_helpers import REPO_ROOT, describe, output_of_our_processes, run_mpi, run_mpmd  # noqa: E402

pytestmark = pytest.mark.mpi
LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"
QUICK = ["--synthetic_samples", "96", "--batch_size", "16", "--progress_bar", "false", "--lr_schedulers", "",
         "--parallel", "data", "--num_epochs", "2"]
NO_WAITING = {"PYDTNN_ERROR_SYNC_S": 600}


def one_line(r):
    assert r.returncode == 2, describe(r)
    lines = output_of_our_processes(r, r.stderr)       # under Open MPI, less prterun's own notice
    assert len(lines) == 1 and lines[0].startswith("pydtnn: error: "), describe(r)
    assert "Traceback" not in r.stderr and "MPI_ABORT" not in r.stderr, describe(r)
    return lines[0]


def mpmd(first, second, timeout=180):
    """Rank 0 with the flags ``first``, ranks 1-2 with ``second``."""
    return run_mpmd([(1, LAUNCHER, [*QUICK, *first]), (2, LAUNCHER, [*QUICK, *second])], timeout=timeout,
                    env=NO_WAITING)


# ----------------------------------------------------------------------------------------- per-rank outputs

def test_a_history_file_on_some_ranks_only_neither_hangs_nor_is_lost(tmp_path):
    h0, h1 = tmp_path / "h0.csv", tmp_path / "h1.csv"
    r = mpmd(["--history_file", h0], [])                      # rank 0 has it: written, every epoch
    assert r.returncode == 0, describe(r)
    assert len(h0.read_text().splitlines()) == 3               # header and two epochs
    r = mpmd([], ["--history_file", h1])                      # only ranks 1-2: rank 0 writes every output
    assert r.returncode == 0, describe(r)
    assert not h1.exists()
    assert f"note: rank 1's --history_file {h1} not used: rank 0 writes every output" in r.stdout, r.stdout


def test_final_weights_named_on_rank_0_only_are_written_and_the_job_ends(tmp_path):
    w = tmp_path / "w.npz"
    r = mpmd(["--save_weights_and_bias_filename", w], [])
    assert r.returncode == 0, describe(r)
    with np.load(w) as d:
        assert "conv2d/weights" in d.files


def test_every_output_named_on_other_ranks_only_still_ends(tmp_path):
    others = ["--history_file", tmp_path / "h.csv", "--save_weights_and_bias_filename", tmp_path / "w.npz",
              "--tracing", "true", "--tracer_output", tmp_path / "t.json", "--step_history_file", tmp_path / "s.csv",
              "--checkpoint_dir", tmp_path / "ck"]
    r = run_mpmd([(1, LAUNCHER, [*QUICK, "--tracing", "true", "--tracer_output", tmp_path / "mine.json"]),
                  (2, LAUNCHER, [*QUICK, *others])], timeout=180, env=NO_WAITING)
    assert r.returncode == 0, describe(r)
    assert sorted(os.listdir(tmp_path)) == ["mine.json"]        # rank 0's trace, nothing of the others'


# ------------------------------------------------------------------------------- every rank, the same data

DATA_FILE = '''
import numpy as np
from mpi4py import MPI

RANK = MPI.COMM_WORLD.Get_rank()


def create_dataset(seed):
    rng = np.random.default_rng(seed)
    n, side, classes = {kind!r}
    x = rng.random((n, 1, side, side), dtype=np.float32)
    return x, rng.integers(0, classes, n)
'''


@pytest.mark.parametrize("kind, needle", [
    ("samples", "training samples 64 on ranks 0,2 and 72 on rank 1"),
    ("shape", "input shape (1, 8, 8) on ranks 0,2 and (1, 9, 9) on rank 1"),
    ("classes", "classes 4 on ranks 0,2 and 5 on rank 1"),
])
def test_a_dataset_file_that_differs_between_ranks_is_one_line_before_training(tmp_path, kind, needle):
    n, side, classes = {"samples": ("64 + 8 * (RANK == 1)", "8", "4"), "shape": ("64", "8 + (RANK == 1)", "4"),
                        "classes": ("64", "8", "4 + (RANK == 1)")}[kind]
    path = tmp_path / "data.py"
    path.write_text(DATA_FILE.replace("{kind!r}", f"{n}, {side}, {classes}"))
    r = run_mpi(3, LAUNCHER, [*QUICK, "--dataset", path, "--model", "simplemlp"], timeout=180, env=NO_WAITING)
    line = one_line(r)
    assert line == (f"pydtnn: error: the ranks loaded different data from --dataset {path}: {needle} (every rank "
                    f"needs the same dataset: the same file and seed, or identical copies on every node)"), line
    assert "epoch 1" not in r.stdout and "model: simplemlp" not in r.stdout      # refused before the banner


def test_the_same_dataset_file_on_every_rank_trains(tmp_path):
    path = tmp_path / "data.py"
    path.write_text(DATA_FILE.replace("{kind!r}", "64, 8, 4"))
    r = run_mpi(3, LAUNCHER, [*QUICK, "--dataset", path, "--model", "simplemlp"], timeout=180, env=NO_WAITING)
    assert r.returncode == 0, describe(r)
    assert "epoch 2:" in r.stdout
