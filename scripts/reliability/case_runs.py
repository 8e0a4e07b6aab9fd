"""How the reliability sweep runs a case's commands, shared by `reliability_sweep.py` (which runs the cases)
and `reliability_cases.py` (the cases): the repository and its launcher, `run` (a command in a folder under a
time limit, its whole process group killed at the end), its `Result`, and the `Context` a case's steps use."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
LAUNCHER = REPO / "scripts" / "pydtnn_benchmark.py"


@dataclass
class Result:
    rc: int | None                  # None: killed at the time limit
    out: str
    err: str
    seconds: float
    folder: Path
    how: str
    extra: dict = field(default_factory=dict)

    @property
    def lines(self):
        """stderr's non-empty lines, less Open MPI's fixed non-zero-exit notice."""
        lines = [line for line in self.err.splitlines() if line.strip()]
        if self.how.startswith("mpiexec") and any("prterun detected" in l for l in lines):
            notice = ("prterun detected", "thus causing the job", "Process name:", "Exit code:")
            lines = [l for l in lines if not l.strip().startswith(notice) and not set(l.strip()) == {"-"}]
        return lines


def _env(extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH")
                                                         else [])))
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def run(cmd, folder, how, timeout, env=None, signal_after=None) -> Result:
    """Run ``cmd`` in ``folder``; kill its whole process group at ``timeout``. ``signal_after``: (a line of
    stdout to wait for, seconds after it, signal): sent to the group, as a terminal's Ctrl-C is."""
    t0 = time.monotonic()
    proc = subprocess.Popen([str(c) for c in cmd], cwd=folder, env=_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, stamps = [], []
    try:
        if signal_after:
            needle, delay, signum = signal_after
            for line in proc.stdout:
                out.append(line)
                stamps.append((time.monotonic() - t0, line.rstrip("\n")))    # when each line came
                if needle in line:
                    time.sleep(delay)
                    stamps.append((time.monotonic() - t0, f"(the sweep sent signal {int(signum)})"))
                    os.killpg(proc.pid, signum)
                    break
        rest_out, err = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rest_out, err = proc.communicate()
        rc = None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return Result(rc, "".join(out) + rest_out, err, time.monotonic() - t0, Path(folder), how,
                  {"stamps": stamps})


class Context:
    """What a case's steps use: its folder, the launcher and simulator commands, sequential or MPI."""

    def __init__(self, folder: Path, mpi: bool):
        self.folder, self.mpi = folder, mpi

    def write(self, name, text):
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def launcher(self, args, nprocs=2):
        from pydtnn.parallel.runtime import mpirun
        if self.mpi:
            return mpirun.mpi_command(nprocs, LAUNCHER, [str(a) for a in args]), f"mpiexec -n {nprocs}"
        return [sys.executable, LAUNCHER, *args], "sequential"

    def mpmd(self, programs):
        from pydtnn.parallel.runtime import mpirun
        return mpirun.mpmd_command([(n, LAUNCHER, [str(a) for a in args]) for n, args in programs]), "mpiexec MPMD"

    def launch(self, args, timeout=120, env=None, signal_after=None, nprocs=2):
        cmd, how = self.launcher(args, nprocs)
        return run(cmd, self.folder, how, timeout, env, signal_after)

    def simulate(self, args, timeout=120):
        return run([sys.executable, "-m", "pydtnn.sim", *args], self.folder, "pydtnn-simulate", timeout)
