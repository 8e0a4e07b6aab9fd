#!/usr/bin/env python
"""The reliability sweep of issue 38: every case run as a user would (the launcher, the simulator, pytest),
sequential and under `mpiexec -n 2`, and the table docs/reliability.md shows: the case, the promise and what
happened. Not a test: it takes about ten minutes on two cores.

    python scripts/reliability/reliability_sweep.py --out sweep.md       # MPI: the one beside this Python
    .venv-openmpi/bin/python scripts/reliability/reliability_sweep.py --mpi_only --out sweep-openmpi.md

The cases are in `reliability_cases.py` beside this file (issue 38's classes) and `bounds_cases.py` (issue 46's:
bounds, nothing ignored, a policy state is data, signals while padding and probing, the probe's cost), and how
their commands run in `case_runs.py`. `--sections` runs some classes only, e.g. issue 46's:

    python scripts/reliability/reliability_sweep.py --sections issue46 --out sweep-46.md

Each runs in a fresh folder, under a time limit: a case that does not end in time is killed and reported as a hang.
The full-disk cases mount a small tmpfs (root only; elsewhere they are reported as not run).
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import bounds_cases                             # noqa: F401  (registers issue 46's cases in the catalogue)
import reliability_cases as catalogue          # beside this file, as case_runs is
from case_runs import REPO, Context

ISSUE_46 = (bounds_cases.EMU, bounds_cases.IGN, bounds_cases.STATE, bounds_cases.SIG, bounds_cases.COST)


def _cell(text: str, limit: int = 150) -> str:
    """One table cell: one line, pipes escaped, this machine's folders as the repository (.) and a case's (CASE)."""
    text = re.sub(r"\S*pydtnn-sweep-[^/\s]+/case\d+", "CASE", str(text)).replace(str(REPO), ".")
    text = "".join(c if c.isprintable() else " " for c in text)      # a NUL from a runtime's stderr
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="markdown table to write (default: print it)")
    ap.add_argument("--mpi_only", action="store_true", help="only the cases under mpiexec (a second MPI)")
    ap.add_argument("--only", default=None, help="run the cases whose title contains this text")
    ap.add_argument("--mpi_name", default=None, help="the MPI's name in the table (default: from mpiexec)")
    ap.add_argument("--sections", default=None, help="run these classes only: section names, comma-separated, "
                                                     "or issue46 for bounds_cases.py's")
    args = ap.parse_args(argv)
    from pydtnn.parallel.runtime import mpirun
    mpi_name = args.mpi_name or ("Open MPI" if mpirun.is_open_mpi(mpirun.find_mpiexec()) else "MPICH")
    rows, counts = [], {}
    base = Path(tempfile.mkdtemp(prefix="pydtnn-sweep-"))
    sections = None if not args.sections else {n for part in args.sections.split(",")
                                               for n in (ISSUE_46 if part.strip() == "issue46" else [part.strip()])}
    cases = [c for c in catalogue.CASES if (not args.mpi_only or c.mpi) and (not args.only or args.only in c.title)
             and (sections is None or c.section in sections)]
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
        how = f"mpiexec -n {case.ranks} ({mpi_name})" if case.mpi else case.how
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
