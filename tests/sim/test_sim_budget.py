"""pydtnn-simulate never grows to gigabytes without a word: a simulation that cannot fit in memory is one line
before anything of its size is allocated, and a long one shows its progress and the time left."""
import tracemalloc

import pytest

from pydtnn.launch import limits
from pydtnn.sim import budget
from pydtnn.sim.__main__ import main


@pytest.mark.parametrize("extra", [[], ["--sweep", "10000000"]])
def test_ten_million_replicas_that_cannot_fit_are_one_line_before_allocating(monkeypatch, capsys, extra):
    monkeypatch.setattr(limits, "physical_memory", lambda: 16 * 2**30)          # a 16 GiB machine
    replicas = "4" if extra else "10000000"
    tracemalloc.start()
    try:
        status = main(["run", "--model", "simplemlp", "--global_batch_size", "40000000", "--replicas", replicas,
                       *extra])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert err[0].startswith("pydtnn: error: simulating 10000000 replicas needs about 19.3 GiB, more than this "
                             "machine's 16.0 GiB of memory"), err
    assert peak < 2**30                       # nothing of the simulation's size (19 GiB) was allocated


def test_what_fits_runs(monkeypatch, capsys):
    monkeypatch.setattr(limits, "physical_memory", lambda: 16 * 2**30)
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "4"]) == 0
    assert "simulated 100 steps of 4 replica(s)" in capsys.readouterr().out


def test_a_long_simulation_shows_its_progress_and_the_time_left(monkeypatch, capsys):
    monkeypatch.setattr(budget, "SHOW_PROGRESS_FROM", 1000)         # replica-steps: this small run counts as long
    monkeypatch.setenv("PYDTNN_PROGRESS_INTERVAL_S", "0")           # a line at every step
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "256", "--replicas", "64", "--steps",
                 "30"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("simulating 64 replicas: step 1/30 (3%), ") and lines[0].endswith(" s left"), lines
    assert len(lines) == 29                   # every step but the last, which the summary follows


def test_a_short_simulation_says_nothing_more(capsys):
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "4"]) == 0
    assert capsys.readouterr().err == ""


def test_a_run_of_many_replicas_says_how_long_before_it_starts(monkeypatch, capsys):
    """Timed at fewer replicas (a multiple of the ranks per node), scaled, said in one line, then the run."""
    monkeypatch.setattr(budget, "ESTIMATE_FROM", 1000)
    monkeypatch.setattr(budget, "ESTIMATE_AT", 250)
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "4000", "--replicas", "2000", "--steps", "3",
                 "--ranks_per_node", "8", "--sweep", "none"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("simulating 2000 replicas (the run and its best partition): about "), err
    assert " of memory (the same run at 248 replicas took " in err[0], err       # 31 nodes of 8 ranks


def test_no_estimate_below_its_threshold(monkeypatch):
    calls = []
    assert budget.say_how_long(budget.ESTIMATE_FROM - 1, calls.append, "x") is None and calls == []
