"""What a user sees when the launcher runs under mpiexec: one line per mistake, threads, a readable log.

These start real `mpiexec` jobs; `.ci/run` runs them under MPICH and again under Open MPI.
"""
import os
import re
import subprocess
import sys

import pytest

from mpi_helpers import (REPO_ROOT, describe, is_open_mpi, mpi_command, output_of_our_processes,  # noqa: E402
                         run_mpi)

pytestmark = pytest.mark.mpi
LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"
QUICK = ["--synthetic_samples", "192", "--batch_size", "16", "--progress_bar", "false", "--lr_schedulers", ""]

MISTAKES = {   # found before MPI starts (argparse) and after (files, shapes, training)
    "unknown flag": (["--batchsize", "3"], "unrecognized arguments: --batchsize"),
    "bad value": (["--batch_size", "-1"], "--batch_size"),
    "zero speed": (["--parallel", "data", "--balance", "static", "--replica_speeds", "1,0,2"], "1,0,2"),
    "missing dataset folder": (["--parallel", "data", "--dataset", "mnist", "--dataset_train_path",
                                "/nonexistent/mnist"], "/nonexistent/mnist"),
    "unwritable history file": (["--parallel", "data", "--history_file", "/nonexistent/dir/h.csv"],
                                "/nonexistent/dir/h.csv"),
    "unknown model": (["--parallel", "data", "--model", "nosuch"], "unknown model"),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_mistake_under_mpiexec_is_one_line_and_status_2(case):
    args, needle = MISTAKES[case]
    r = run_mpi(3, LAUNCHER, QUICK + args, timeout=120)
    assert r.returncode == 2, describe(r)
    lines = output_of_our_processes(r)
    assert len(lines) == 1, describe(r)
    assert lines[0].startswith("pydtnn: error: ") and needle in lines[0], describe(r)


def test_divergence_mid_training_is_one_error_line_and_status_2():
    r = run_mpi(3, LAUNCHER, QUICK + ["--parallel", "data", "--learning_rate", "1e30", "--num_epochs", "3"],
                timeout=120)
    assert r.returncode == 2, describe(r)
    errors = [l for l in output_of_our_processes(r) if "error" in l.lower() or "Traceback" in l]
    assert len(errors) == 1 and errors[0].startswith("pydtnn: error: ") and "loss became" in errors[0], describe(r)
    assert "model: simplecnn" in r.stdout          # the log up to the failure is kept


def test_mpi4py_on_another_mpi_than_the_launcher_is_an_error_not_n_sequential_runs():
    # A process that the launcher's environment calls rank 0 of 3 while its own MPI sees a world of 1:
    # what a launcher of one MPI starting a Python whose mpi4py loads another looks like. The variables
    # are those of the MPI that mpi4py does NOT load, so that its singleton start ignores them.
    fake = ({"PMI_RANK": "0", "PMI_SIZE": "3"} if is_open_mpi(mpi_command(1, "x")[0])
            else {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3"})
    r = subprocess.run([sys.executable, str(LAUNCHER), *QUICK, "--parallel", "data"], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1", **fake))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    assert len(lines) == 1 and "sees a world of 1" in lines[0] and "3 processes" in lines[0], lines


def _threads_line(stdout):
    m = re.search(r"^threads per replica: ([\d, ]+) \((.*)\)$", stdout, re.M)
    assert m, stdout
    return [int(t) for t in m.group(1).split(",")], m.group(2)


def test_default_threads_share_the_node_cores_among_its_ranks():
    cores = len(os.sched_getaffinity(0))
    r = run_mpi(2, LAUNCHER, QUICK + ["--parallel", "data"], timeout=120,
                unset=("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"))
    assert r.returncode == 0, describe(r)
    counts, why = _threads_line(r.stdout)
    # each rank gets its share of the cores it may use: half of this machine's, or the one core a
    # launcher bound it to (Open MPI binds 2 ranks to a core each)
    assert len(counts) == 2 and all(c == max(1, cores // 2) or ("default" in why and c == 1) for c in counts), \
        (cores, counts, why)
    assert "rank(s) on this node" in why


def test_thread_flag_and_variable_win_over_the_default():
    r = run_mpi(2, LAUNCHER, QUICK + ["--parallel", "data", "--threads_per_replica", "3"], timeout=120)
    assert r.returncode == 0, describe(r)
    assert _threads_line(r.stdout) == ([3, 3], "--threads_per_replica")
    r = run_mpi(2, LAUNCHER, QUICK + ["--parallel", "data"], timeout=120, env={"OMP_NUM_THREADS": 1})
    assert r.returncode == 0, describe(r)
    assert _threads_line(r.stdout) == ([1, 1], "OMP_NUM_THREADS=1")


def test_the_log_is_one_stream_in_order_and_progress_is_plain_lines(tmp_path):
    log = tmp_path / "out.log"
    cmd = mpi_command(2, LAUNCHER, ["--synthetic_samples", "192", "--batch_size", "16", "--lr_schedulers", "",
                                    "--parallel", "data", "--num_epochs", "2", "--validation_split", "0.25"])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYDTNN_PROGRESS_INTERVAL_S="0")
    with open(log, "w") as out, open(tmp_path / "err.log", "w") as err:
        r = subprocess.run(cmd, stdout=out, stderr=err, env=env, timeout=180, cwd=tmp_path)
    text, errors = log.read_text(), (tmp_path / "err.log").read_text()
    assert r.returncode == 0, text + errors
    order = ["model: simplecnn", "global batch 32 split as", "threads per replica:", "epoch 1:", "rank    b_i",
             "epoch 2:", "training time:", "throughput:"]
    positions = [text.find(marker) for marker in order]
    assert -1 not in positions and positions == sorted(positions), (positions, text)
    assert "\r" not in errors and "\r" not in text
    progress = [l for l in errors.splitlines() if l.strip()]
    assert progress and all(re.match(r"epoch [12]/2: step \d+/\d+ \(\d+%\), loss=", l) for l in progress), errors
