"""Communicators: the serial one in process, the MPI one in real `mpiexec -n K` jobs."""
import json
import os
import sys

import numpy as np
import pytest

from mpi_helpers import SCRIPTS, describe, mpi_command, processes_with, run_mpi  # noqa: E402

from pydtnn.errors import ConfigError  # noqa: E402
from pydtnn.parallel.comm import BucketedReducer, SerialComm, make_comm  # noqa: E402
from pydtnn.observe.timeline import Timeline, chrome_trace, write_chrome_trace  # noqa: E402
from pydtnn.observe.timing import ReplicaStats, StepTimer, epoch_summary  # noqa: E402


# ----------------------------------------------------------------------------------------- serial

def test_serial_comm_is_identity():
    c = SerialComm()
    assert (c.rank, c.size, c.is_root) == (0, 1, True)
    a = np.arange(5.0)
    assert c.bcast_(a) is a and c.allreduce_sum_(a) is a
    assert np.array_equal(a, np.arange(5.0))
    g = c.allgather(2.5)
    assert g.shape == (1,) and g[0] == 2.5
    g = c.allgather(np.array([1, 2, 3]))
    assert g.shape == (1, 3) and np.array_equal(g[0], [1, 2, 3])
    assert np.array_equal(c.weighted_mean(np.array([1.0, 2.0]), 7), [1.0, 2.0])
    assert c.weighted_mean(3.0, 2) == 3.0
    assert c.any_true(True) is True and c.any_true(0) is False
    assert c.gather_object({"x": 1}) == [{"x": 1}]
    c.barrier()
    c.iallreduce_sum_(a).wait()


def test_serial_bucketed_reducer_leaves_buffer():
    buf = np.arange(100, dtype=np.float32)
    red = BucketedReducer(SerialComm(), buf, bucket_bytes=40)
    assert red.nbuckets == 10
    assert red.bounds[0] == (90, 100) and red.bounds[-1] == (0, 10)
    red.start_step()
    red.ready(95)
    assert red.started == 0
    red.ready(50)
    assert red.started == 5
    assert red.finish() is buf and red.started == 10
    assert np.array_equal(buf, np.arange(100, dtype=np.float32))


def test_bucketed_reducer_rejects_bad_buffers():
    with pytest.raises(TypeError):
        BucketedReducer(SerialComm(), np.zeros((4, 4)))
    with pytest.raises(TypeError):
        BucketedReducer(SerialComm(), [0.0, 1.0])
    with pytest.raises(ConfigError):
        BucketedReducer(SerialComm(), np.zeros(4), bucket_bytes=0)


def test_make_comm_kinds(monkeypatch):
    for var in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE",
                "MPI_LOCALNRANKS", "HYDI_CONTROL_FD"):
        monkeypatch.delenv(var, raising=False)
    assert isinstance(make_comm("serial"), SerialComm)
    if "mpi4py.MPI" not in sys.modules:
        assert isinstance(make_comm("auto"), SerialComm)
    from pydtnn.backends import available_backends
    if "gpu" not in available_backends():
        with pytest.raises(ConfigError, match="NCCL communicator needs the GPU backend"):
            make_comm("nccl")
    with pytest.raises(ConfigError, match="communicator must be one of"):
        make_comm("gloo")


def test_timer_stats_and_chrome_trace(tmp_path):
    stats = ReplicaStats()
    tl = Timeline(rank=0)
    timer = StepTimer(stats, tl)
    for b in (8, 6):
        timer.start_step(b)
        with timer.compute():
            sum(range(1000))
        with timer.wait():
            pass
        with timer.phase("update"):
            pass
        timer.end_step()
    assert stats.steps == 2 and stats.samples == 14 and stats.last_batch == 6
    assert stats.compute_s > 0 and stats.wait_s >= 0
    assert stats.last_compute_per_sample == pytest.approx(stats.last_compute_s / 6)
    summary = epoch_summary(SerialComm(), stats)
    row = summary.rows[0]
    assert (row["rank"], row["b_i"], row["samples"], row["steps"]) == (0, 6, 14, 2)
    assert row["samples_per_s"] == pytest.approx(14 / stats.compute_s)
    text = summary.format()
    assert text.splitlines()[0].split()[:3] == ["rank", "b_i", "samples"] and len(text.splitlines()) == 2
    assert [e.name for e in tl.events] == ["compute", "allreduce", "update"] * 2
    assert all(e.t_end >= e.t_start >= 0 for e in tl.events)
    path = write_chrome_trace(str(tmp_path / "t.json"), tl, SerialComm())
    doc = json.load(open(path))
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 6 and all(e["pid"] == 0 and e["dur"] >= 0 for e in xs)
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    assert meta == [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "rank 0"}}]
    stats.reset()
    assert stats.steps == 0 and stats.samples == 0 and stats.compute_s == 0.0


def test_chrome_trace_one_pid_per_rank():
    events = [{"name": "compute", "rank": r, "t_start": 0.001 * r, "t_end": 0.002 * r + 0.001} for r in range(3)]
    doc = chrome_trace(events)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert [e["pid"] for e in xs] == [0, 1, 2]
    assert xs[1]["ts"] == pytest.approx(1000.0) and xs[1]["dur"] == pytest.approx(2000.0)


# ---------------------------------------------------------------------------------- launcher helper

@pytest.mark.mpi
def test_mpi_command_shape():
    cmd = mpi_command(3, "x.py", ["a", 1])
    assert os.path.basename(cmd[0]) in ("mpiexec", "mpirun")
    i = cmd.index("-n")
    assert cmd[i + 1] == "3" and cmd[i + 2:] == [sys.executable, "-m", "mpi4py", "x.py", "a", "1"]


@pytest.mark.mpi
def test_run_mpi_timeout_kills_the_job_and_fails():
    token = f"hang-token-{os.getpid()}"
    with pytest.raises(pytest.fail.Exception, match="timed out") as info:
        run_mpi(2, SCRIPTS / "hang.py", [token], timeout=4)
    assert "rank 0 started" in str(info.value)          # the captured output is in the failure
    assert processes_with(token) == []


# -------------------------------------------------------------------------------------- real MPI

@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_mpi_collectives(nprocs):
    res = run_mpi(nprocs, SCRIPTS / "comm_ops.py", timeout=120)
    assert res.returncode == 0, describe(res)
    for r in range(nprocs):
        assert f"OK rank {r} of {nprocs}" in res.stdout, describe(res)


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [2, 3])
def test_mpi_probe_sharding_and_trace(nprocs, tmp_path):
    path = tmp_path / "trace.json"
    res = run_mpi(nprocs, SCRIPTS / "balance_trace.py", [path], timeout=120)
    assert res.returncode == 0, describe(res)
    assert all(f"OK rank {r}" in res.stdout for r in range(nprocs)), describe(res)
    doc = json.loads(path.read_text())
    assert {e["pid"] for e in doc["traceEvents"]} == set(range(nprocs))


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs,mode", [(2, "exit"), (3, "sigkill"), (3, "raise")])
def test_dead_rank_ends_the_job(nprocs, mode):
    res = run_mpi(nprocs, SCRIPTS / "die_in_collective.py", [mode], timeout=60)
    assert res.returncode != 0, describe(res)
    assert res.elapsed < 30, f"took {res.elapsed:.1f} s\n" + describe(res)
    assert "was not stopped" not in res.stdout, describe(res)
    assert res.stdout.count("ready") == nprocs, describe(res)


@pytest.mark.mpi
def test_nan_on_one_rank_stops_all_ranks_together():
    res = run_mpi(3, SCRIPTS / "nan_stop.py", [1, 4], timeout=60)
    assert res.returncode == 2, describe(res)
    for r in range(3):
        assert f"rank {r} stopped at step 4" in res.stdout, describe(res)
    assert "never stopped" not in res.stdout
