#!/usr/bin/env python
"""The reliability sweep of issue 38: every case run as a user would (the launcher, the simulator, pytest),
sequential and under `mpiexec -n 2`, and the table docs/reliability.md shows: the case, the promise and what
happened. Not a test: it takes about ten minutes on two cores.

    python scripts/reliability_sweep.py --out sweep.md                  # MPI: the one beside this Python
    .venv-openmpi/bin/python scripts/reliability_sweep.py --mpi_only --out sweep-openmpi.md

The cases are in `reliability_cases.py` beside this file. Each runs in a fresh folder, under a time limit: a
case that does not end in time is killed and reported as a hang. The full-disk cases mount a small tmpfs
(root only; elsewhere they are reported as not run).
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
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
    out = []
    try:
        if signal_after:
            needle, delay, signum = signal_after
            for line in proc.stdout:
                out.append(line)
                if needle in line:
                    time.sleep(delay)
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
    return Result(rc, "".join(out) + rest_out, err, time.monotonic() - t0, Path(folder), how)


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


def _cell(text: str, limit: int = 150) -> str:
    """One table cell: one line, pipes escaped, this machine's folders as the repository (.) and a case's (CASE)."""
    text = re.sub(r"\S*pydtnn-sweep-[^/\s]+/case\d+", "CASE", str(text)).replace(str(REPO), ".")
    text = "".join(c if c.isprintable() else " " for c in text)      # a NUL from a runtime's stderr
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def main(argv=None) -> int:
    import reliability_cases as catalogue
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="markdown table to write (default: print it)")
    ap.add_argument("--mpi_only", action="store_true", help="only the cases under mpiexec (a second MPI)")
    ap.add_argument("--only", default=None, help="run the cases whose title contains this text")
    ap.add_argument("--mpi_name", default=None, help="the MPI's name in the table (default: from mpiexec)")
    args = ap.parse_args(argv)
    from pydtnn.parallel.runtime import mpirun
    mpi_name = args.mpi_name or ("Open MPI" if mpirun.is_open_mpi(mpirun.find_mpiexec()) else "MPICH")
    rows, counts = [], {}
    base = Path(tempfile.mkdtemp(prefix="pydtnn-sweep-"))
    cases = [c for c in catalogue.CASES if (not args.mpi_only or c.mpi) and (not args.only or args.only in c.title)]
    for i, case in enumerate(cases, 1):
        folder = base / f"case{i:03d}"
        folder.mkdir()
        ctx = Context(folder, case.mpi)
        try:
            ok, what = case.check(ctx)
        except catalogue.NotRun as e:
            ok, what = None, f"not run: {e}"
        except Exception as e:                      # noqa: BLE001  (the sweep goes on, and says so)
            ok, what = False, f"the sweep's own check failed: {type(e).__name__}: {e}"
        verdict = {True: "holds", False: "BROKEN", None: "not run"}[ok]
        counts[verdict] = counts.get(verdict, 0) + 1
        how = f"mpiexec -n 2 ({mpi_name})" if case.mpi else case.how
        rows.append(f"| {len(rows) + 1} | {_cell(case.section, 40)} | {_cell(case.title, 90)} | {how} | "
                    f"{_cell(case.promise, 120)} | {verdict}: {_cell(what, 200)} |")
        print(f"[{i}/{len(cases)}] {verdict:>8}  {case.title} ({how}): {_cell(what, 160)}", flush=True)
    table = "\n".join(["| # | section | case | how | promise | what happened |", "|---|---|---|---|---|---|", *rows])
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    text = f"{table}\n\n{len(rows)} cases: {summary}.\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        print(text)
    print(f"sweep: {len(rows)} cases: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
