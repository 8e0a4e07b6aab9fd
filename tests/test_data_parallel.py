"""Data parallelism end to end in real MPI jobs: the invariant, the launcher, speeds and failures."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from mpi_helpers import REPO_ROOT, mpi_command, processes_with, run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi
LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"


def _result(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = [l for l in proc.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)


@pytest.mark.parametrize("non_blocking", ["0", "1"])
def test_invariant_heterogeneous_proportional_equals_serial(non_blocking):
    r = _result(run_mpi(3, "invariant.py", ["proportional", "1,2,3", 60, 4, non_blocking], timeout=180))
    assert r["sizes"] == [10, 20, 30]
    assert r["rel_diff"] < 1e-10


@pytest.mark.parametrize("non_blocking", ["0", "1"])
def test_invariant_holds_with_clipping_of_the_reduced_gradient(non_blocking):
    # 2 epochs x 4 steps; a threshold below the gradient norms of the early steps, so clipping acts
    r = _result(run_mpi(3, "invariant.py", ["proportional", "1,2,3", 60, 4, non_blocking, 0.05], timeout=180))
    assert r["sizes"] == [10, 20, 30]
    assert r["clipped"] > 0 and r["clipped"] == r["clipped_serial"]
    assert r["rel_diff"] < 1e-10


def test_uniform_weighting_breaks_the_invariant():
    r = _result(run_mpi(3, "invariant.py", ["uniform", "1,2,3", 60, 4], timeout=180))
    assert r["sizes"] == [10, 20, 30]
    assert r["rel_diff"] > 1e-4


def test_invariant_two_ranks_odd_split():
    r = _result(run_mpi(2, "invariant.py", ["proportional", "1,3.7", 37, 3], timeout=180))
    assert sum(r["sizes"]) == 37 and r["sizes"][0] < r["sizes"][1]
    assert r["rel_diff"] < 1e-10


COMMON = ["--model", "simplecnn", "--dataset", "synthetic", "--synthetic_samples", "300", "--dtype", "float64",
          "--num_epochs", "2", "--seed", "3", "--learning_rate", "0.05", "--learning_rate_scaling", "false",
          "--lr_schedulers", "", "--progress_bar", "false"]


def test_launcher_sequential_equals_three_heterogeneous_replicas(tmp_path):
    seq, par = tmp_path / "seq.npz", tmp_path / "par.npz"
    r1 = run_mpi(1, LAUNCHER, COMMON + ["--batch_size", "60", "--save_weights_and_bias_filename", seq], timeout=300)
    assert r1.returncode == 0, r1.stdout + r1.stderr
    r3 = run_mpi(3, LAUNCHER, COMMON + ["--parallel", "data", "--global_batch_size", "60", "--balance", "static",
                                         "--replica_speeds", "1,2,3", "--save_weights_and_bias_filename", par],
                 timeout=300)
    assert r3.returncode == 0, r3.stdout + r3.stderr
    assert "split as [10, 20, 30]" in r3.stdout
    a, b = np.load(seq), np.load(par)
    assert sorted(a.files) == sorted(b.files) and len(a.files) >= 4
    for k in a.files:
        assert np.allclose(a[k], b[k], rtol=1e-10, atol=1e-12), k
    assert not np.array_equal(a[a.files[0]], np.zeros_like(a[a.files[0]]))


def test_rank_killed_mid_training_ends_the_job(tmp_path):
    token = f"killtoken{os.getpid()}"
    cmd = mpi_command(3, LAUNCHER, ["--parallel", "data", "--synthetic_samples", "768", "--num_epochs", "200",
                                    "--batch_size", "16", "--progress_bar", "false",
                                    "--history_file", str(tmp_path / f"{token}.csv")])
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / f"{token}.csv").exists() and time.monotonic() < deadline:
            time.sleep(0.2)                      # training is under way once epoch 1 is written
        ranks = [p for p in processes_with(token) if p != proc.pid and "mpiexec" not in
                 open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0].decode()]
        assert len(ranks) >= 3, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        t0 = time.monotonic()
        proc.wait(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert elapsed < 30, elapsed
