"""scripts/experiments/heterogeneity_experiment.py (pydtnn.experiments.heterogeneity): its run plan, and a --quick
smoke run of every part whose results.md must hold each section's table with numbers, and whose plots must be
written. No timing thresholds: the numbers only have to be there and be finite."""
import math
import re
import subprocess
import sys

import pytest

from paths import REPO  # noqa: E402
from pydtnn.experiments.heterogeneity.cli import parse_parts
from pydtnn.experiments.heterogeneity.runs import as_typed, plan_runs
SCRIPT = REPO / "scripts" / "experiments" / "heterogeneity_experiment.py"
NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]\d+)?"


def test_plan_runs_only_the_chosen_parts():
    assert parse_parts("c,a") == ["a", "c"]
    with pytest.raises(Exception):
        parse_parts("a,d")
    assert list(plan_runs(["b"], 3)) == ["static", "uniform"]
    assert sorted(plan_runs(["c"], 3)) == sorted(f"bn_{bn}_{w}" for bn in ("local", "sync")
                                                 for w in ("uniform", "proportional"))
    a = plan_runs(["a"], 3)
    assert list(a)[:3] == ["equal", "static", "dynamic"] and len(a) == 9
    assert sorted(a.values()) == sorted(["equal", "static", "dynamic"] * 3)


def table_rows(text, header_start):
    """The data rows of the markdown table whose header row begins with `header_start`."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("| " + header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip().strip("*") for c in line.strip("|").split("|")])
    return rows


def is_number(cell):
    return re.fullmatch(NUMBER, cell) is not None and math.isfinite(float(cell))


@pytest.mark.mpi
def test_quick_run_of_every_part_writes_tables_and_plots(tmp_path):
    out = tmp_path / "out"          # a relative --out is a folder of the current one, not of the repository
    r = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--parts", "a,b,c", "--out", "out"],
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    text = (out / "results.md").read_text()
    for title in ("## (a)", "## (b)", "## (c)"):
        assert title in text

    # (a): per round, then the median row; every time and ratio a number
    rounds = table_rows(text, "round | ideal (s)")
    assert [row[0] for row in rounds] == ["1", "median"]
    assert all(is_number(c) for row in rounds for c in row[1:]) and len(rounds[0]) == 8
    speeds = table_rows(text, "rank | emulated")
    assert [row[1] for row in speeds] == ["1.000", "0.500"] and all(is_number(c) for row in speeds for c in row)
    splits = table_rows(text, "split | b_i")
    assert [row[0] for row in splits] == ["equal", "static", "dynamic"]

    # (b): one row per epoch
    assert len(table_rows(text, "epoch | train loss uniform")) == 3

    # (c): the four runs, each with its accuracy, loss and time; one row per epoch
    bn = table_rows(text, "run | BatchNorm")
    assert sorted((row[1], row[2]) for row in bn) == sorted((b, w) for b in ("local", "sync")
                                                            for w in ("uniform", "proportional"))
    assert all(is_number(c) for row in bn for c in row[3:])
    per_epoch = table_rows(text, "epoch | acc:")
    assert len(per_epoch) == 2 and all(is_number(c) for row in per_epoch for c in row)
    assert text.count("time cost of synchronization") == 2

    for name in ("epoch_time", "weighting", "batchnorm"):
        png = (out / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG") and len(png) > 10_000, name

    # a log, not a terminal: progress as whole lines (the launcher's rule), no carriage-return redraws
    assert "\r" not in r.stderr and "\r" not in r.stdout
    # commands as a user types them in the repository: relative paths inside it, none with '..'
    commands = [l for l in text.split("## Commands", 1)[1].splitlines() if "pydtnn_benchmark.py" in l]
    assert commands and all(" scripts/pydtnn_benchmark.py " in c and ".." not in c and str(REPO) not in c
                            for c in commands), commands


def test_commands_are_written_as_typed():
    cmd = [str(REPO / ".venv" / "bin" / ".." / "bin" / "mpiexec"), "-n", "2", "/usr/bin/../bin/python", "-m",
           "mpi4py", str(REPO / "scripts" / "pydtnn_benchmark.py"), "--lr_schedulers", "", "--model", "a b"]
    assert as_typed(cmd) == (".venv/bin/mpiexec -n 2 /usr/bin/python -m mpi4py scripts/pydtnn_benchmark.py "
                             "--lr_schedulers '' --model 'a b'")
