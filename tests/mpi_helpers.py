"""Launch real MPI jobs from pytest: ``mpiexec -n K python -m mpi4py script args``.

``python -m mpi4py`` makes an uncaught exception on any rank call MPI_Abort, so a failing rank ends the
whole job instead of leaving the others hanging in a collective.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pydtnn.errors import ConfigError
from pydtnn.parallel.runtime import mpirun

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"


def find_mpiexec() -> str:
    try:
        return mpirun.find_mpiexec()
    except ConfigError as e:
        pytest.fail(str(e))


is_open_mpi = mpirun.is_open_mpi


def mpi_command(nprocs: int, script_path, args=()) -> list[str]:
    find_mpiexec()
    return mpirun.mpi_command(nprocs, script_path, args)


def run_mpi(nprocs: int, script_path, args=(), timeout: float = 120, env: dict | None = None,
            check: bool = False, unset=()) -> subprocess.CompletedProcess:
    """Run ``script_path`` on ``nprocs`` MPI processes; returns the CompletedProcess (text stdout/stderr).

    Children get OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS = 1 unless ``env`` says
    otherwise (``unset`` removes variables), and the repository on PYTHONPATH. On timeout the whole process group is killed and the
    test fails with the captured output; with ``check=True`` a non-zero exit status fails it too.
    """
    child_env = _child_env(env, unset)
    return _run(mpi_command(nprocs, _script(script_path), args), timeout, child_env, check)


def run_mpmd(programs, timeout: float = 120, env: dict | None = None, check: bool = False):
    """One MPMD job: ``programs`` is ``[(nprocs, script_path, args), ...]`` (ranks numbered in that order);
    otherwise as `run_mpi`."""
    programs = [(n, _script(s), a) for n, s, a in programs]
    return _run(mpirun.mpmd_command(programs), timeout, _child_env(env, ()), check)


def _script(script_path):
    script_path = Path(script_path)
    if not script_path.is_absolute() and not script_path.exists():
        script_path = SCRIPTS / script_path
    return script_path


def _child_env(env, unset):
    child_env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        child_env[var] = "1"
    child_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT)] + ([child_env["PYTHONPATH"]] if child_env.get("PYTHONPATH") else []))
    child_env["PYTHONUNBUFFERED"] = "1"
    if env:
        child_env.update({k: str(v) for k, v in env.items()})
    for var in unset:
        child_env.pop(var, None)
    return child_env


def _run(cmd, timeout, child_env, check):
    find_mpiexec()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env,
                            cwd=str(REPO_ROOT), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_job(proc)
        out, err = proc.communicate()
        pytest.fail(f"MPI job timed out after {timeout:.0f} s: {' '.join(cmd)}\n"
                    f"--- stdout ---\n{out}\n--- stderr ---\n{err}", pytrace=False)
    finally:
        _kill_job(proc)   # stray processes (a rank that outlived mpiexec) never survive the test
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    result.elapsed = time.monotonic() - t0
    if check and result.returncode != 0:
        pytest.fail(describe(result), pytrace=False)
    return result


def printed_split(stdout: str) -> list[int]:
    """The split the launcher's banner prints ("global batch B split as [b_0, ...]")."""
    m = re.search(r"split as \[([0-9, ]+)\]", stdout)
    assert m, stdout
    return [int(v) for v in m.group(1).split(",")]


def describe(result: subprocess.CompletedProcess) -> str:
    return (f"MPI job exited with status {result.returncode}: {' '.join(map(str, result.args))}\n"
            f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}")


def _descendants(root: int) -> list[tuple[int, str]]:
    """(pid, start time) of every live descendant of ``root`` (Linux /proc; empty elsewhere).

    Hydra's proxy and the ranks each call setsid(), so killing mpiexec's process group is not enough.
    """
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    try:
        entries = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in entries:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(pid)
        starts[pid] = fields[19]
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append((child, starts[child]))
            todo.append(child)
    return found


def _same_process(pid: int, start: str) -> bool:
    """``pid`` is still the process that started at ``start`` and has not exited (zombies count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] != "Z" and fields[19] == start
    except (OSError, IndexError):
        return False


def _kill_job(proc: subprocess.Popen) -> None:
    """Stop mpiexec and everything it started: SIGTERM first (Hydra and Open MPI then clean up their
    ranks), SIGKILL for whatever is left after a few seconds."""
    family = _descendants(proc.pid)
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    deadline = time.monotonic() + 5
    for pid, start in family:
        while _same_process(pid, start) and time.monotonic() < deadline:
            time.sleep(0.05)          # give the launcher's own cleanup a moment
        if _same_process(pid, start):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def processes_with(token: str) -> list[int]:
    """PIDs of the processes whose command line contains ``token`` (Linux /proc)."""
    found = []
    for pid in (os.listdir("/proc") if os.path.isdir("/proc") else []):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


# prterun (Open MPI 5) adds this notice whenever a process exits with a non-zero status; no process can
# turn it off (the launcher's state_base_error_non_zero_exit=0 would also make the job's status 0). Its
# lines are matched one by one: prterun writes them apart from our processes' forwarded lines, which may
# arrive before, after or between them.
PRTERUN_NONZERO_EXIT = [re.compile(p) for p in (
    r"-{20,}", r"prterun detected that one or more processes exited with non-zero status,",
    r"thus causing the job to be terminated\. The first process to do so was:",
    r" +Process name: \[[^\]]+\]", r" +Exit code: +\d+", r"-{20,}")]


def output_of_our_processes(result: subprocess.CompletedProcess, text: str | None = None) -> list[str]:
    """The non-empty lines of a job's stdout and stderr (or of ``text``, part of its output), less Open
    MPI's fixed non-zero-exit notice (each of its lines removed once, and only under Open MPI when the
    notice is there at all); any other launcher output, an abort banner say, stays."""
    text = result.stdout + result.stderr if text is None else text
    lines = [line for line in text.splitlines() if line.strip()]
    if is_open_mpi(result.args[0]) and any(PRTERUN_NONZERO_EXIT[1].fullmatch(l) for l in lines):
        for pattern in PRTERUN_NONZERO_EXIT:
            hit = next((i for i, l in enumerate(lines) if pattern.fullmatch(l)), None)
            assert hit is not None, f"prterun's notice changed: no line matches {pattern.pattern!r}"
            del lines[hit]
    return lines
