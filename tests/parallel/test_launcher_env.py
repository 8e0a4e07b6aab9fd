"""The pieces behind a sane launch, without MPI: the launcher's environment, the thread default, progress."""
import io

import pytest

from pydtnn.parallel.runtime import environment as launcher
from pydtnn.parallel.runtime import threads
from pydtnn.observe.progress import PlainProgress, progress

LAUNCH_VARS = launcher.RANK_VARS + launcher.SIZE_VARS + launcher.OTHER_MARKERS + (
    "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")


@pytest.fixture
def clean_env(monkeypatch):
    for var in LAUNCH_VARS + threads.THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize("env,rank,size", [
    ({}, None, None),
    ({"PMI_RANK": "2", "PMI_SIZE": "3"}, 2, 3),                               # Hydra (MPICH)
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, 1, 4),      # Open MPI
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8"}, 5, 8),   # srun
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, None, None),               # an sbatch script, not a launch
    ({"SLURM_STEP_ID": str(0xFFFFFFFE), "SLURM_PROCID": "0", "SLURM_NTASKS": "8"}, None, None),  # batch step
])
def test_rank_and_size_from_the_launchers_environment(clean_env, env, rank, size):
    for k, v in env.items():
        clean_env.setenv(k, v)
    assert launcher.launcher_rank() == rank and launcher.launcher_size() == size
    assert launcher.launched_with_many_processes() == ((size or 1) > 1)
    assert launcher.launched_by_mpi() == bool(rank is not None or size is not None)


@pytest.mark.parametrize("sets,mine,expected", [
    ([{0, 1}, {0, 1}], {0, 1}, 1),                          # two unbound ranks on a 2-core node
    ([set(range(16))] * 4, set(range(16)), 4),              # four unbound ranks on 16 cores
    ([set(range(16))] * 3, set(range(16)), 5),              # 16 // 3
    ([{0, 1, 2, 3}, {4, 5, 6, 7}], {0, 1, 2, 3}, 4),        # bound to 4 cores each: keep them
    ([{0}, {0}, {0}], {0}, 1),                              # oversubscribed: at least 1
    ([set(range(8))], set(range(8)), 8),                    # alone on the node
])
def test_default_threads_split_the_shared_cores(sets, mine, expected):
    assert threads.default_threads(sets, mine) == expected


def test_thread_choice_order(clean_env):
    from pydtnn.parallel.comm import SerialComm
    assert threads.choose_threads(3, SerialComm()) == (3, "--threads_per_replica")
    clean_env.setenv("OMP_NUM_THREADS", "2")
    assert threads.choose_threads(None, SerialComm()) == (None, "OMP_NUM_THREADS=2")
    assert threads.choose_threads(5, SerialComm())[0] == 5
    clean_env.delenv("OMP_NUM_THREADS")
    n, why = threads.choose_threads(None, SerialComm())
    assert n == len(threads.usable_cores()) and "1 rank(s) on this node" in why


def test_progress_is_plain_lines_when_not_a_terminal():
    out = io.StringIO()
    bar = progress(total=4, desc="epoch 1/2", unit="step", stream=out, interval=0)
    assert isinstance(bar, PlainProgress)
    for _ in range(4):
        bar.set_postfix_str("loss=0.5000")
        bar.update()
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines == [f"epoch 1/2: step {i}/4 ({25 * i}%), loss=0.5000, {lines[i - 1].rsplit(', ', 1)[1]}"
                     for i in (1, 2, 3)]
    assert all(l.endswith(" s left") for l in lines) and "\r" not in out.getvalue()
    assert progress(total=4, enabled=False) is None


def test_plain_progress_waits_for_its_interval():
    out = io.StringIO()
    bar = PlainProgress(total=1000, desc="x", stream=out, interval=3600)
    for _ in range(999):
        bar.update()
    assert out.getvalue() == ""


def test_progress_is_tqdm_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    bar = progress(total=3, desc="d", stream=Terminal())
    assert type(bar).__module__.startswith("tqdm")
    bar.close()
