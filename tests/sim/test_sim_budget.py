"""pydtnn-simulate never grows to gigabytes without a word: a simulation that cannot fit in memory is one line
before anything of its size is allocated; any run says its first line at once, a long one its time and memory
before it starts, then its progress and the time left."""
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
    monkeypatch.setenv("PYDTNN_PROGRESS_INTERVAL_S", "0")           # a line at every step
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "256", "--replicas", "64", "--steps",
                 "30"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("simulating 64 replicas: step 1/30 (3%), ") and lines[0].endswith(" s left"), lines
    assert len(lines) == 29                   # every step but the last, which the summary follows


def test_a_short_simulation_says_nothing_more(capsys):
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "4"]) == 0
    assert capsys.readouterr().err == ""


def test_a_phase_without_steps_still_says_it_runs():
    """The heartbeat: a stage that counts nothing (a step model of 10^7 rows, the best partition) is said at
    least every interval, from a thread, while the main thread is busy."""
    import io
    import time
    from pydtnn.sim.talk import Talk
    err = io.StringIO()
    talk = Talk(out=io.StringIO(), err=err, interval=0.1)
    with talk.phase("the best partition"):
        end = time.monotonic() + 1.0
        while time.monotonic() < end:         # busy in Python, as the simulator is
            sum(range(1000))
    talk.close()
    lines = err.getvalue().splitlines()
    # 1.0 s at 0.1 s: about 9 lines; a loaded machine delays the thread, never to fewer than a few
    assert len(lines) >= 3 and all(line.startswith("the best partition: ") and line.endswith(" s so far")
                                   for line in lines), lines
    after = len(lines)
    time.sleep(0.3)                           # the phase is over: nothing more
    assert len(err.getvalue().splitlines()) == after


def test_a_run_of_many_replicas_says_how_long_before_it_starts(monkeypatch, capsys):
    """Timed at fewer replicas (a multiple of the ranks per node), scaled, said in one line, then the run."""
    monkeypatch.setattr(budget, "ESTIMATE_FROM", 1000)
    monkeypatch.setattr(budget, "ESTIMATE_AT", 250)
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "4000", "--replicas", "2000", "--steps", "3",
                 "--ranks_per_node", "8", "--sweep", "none"]) == 0
    out = capsys.readouterr().out.splitlines()
    told = [i for i, line in enumerate(out) if line.startswith("estimate for 2000 replicas (the run and its best "
                                                                "partition): about ")]
    assert len(told) == 1, out
    assert " of memory (the same run at 248 replicas took " in out[told[0]], out      # 31 nodes of 8 ranks
    assert told[0] < out.index("simulated 3 steps of 2000 replica(s), global batch 4000, policy equal, allreduce "
                               "auto")                                               # before the work


def test_the_first_line_of_ten_million_replicas_comes_within_2_s_to_a_file(tmp_path):
    """stdout to a file, as on a cluster: the first line is there (flushed) within 2 s of the start, and the
    estimate of time and memory follows before the work; the run itself (minutes) is stopped."""
    import subprocess
    import sys
    import time
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "pydtnn.sim", "run", "--model", "simplemlp",
                                 "--global_batch_size", "20000000", "--samples", "20000000", "--replicas", "10000000",
                                 "--steps", "100"], stdout=out, stderr=err)
        first = estimate = None
        try:
            while time.monotonic() - t0 < 120 and proc.poll() is None and estimate is None:
                text = out_path.read_text()
                if first is None and "\n" in text:
                    first = time.monotonic() - t0
                if "estimate for 10000000 replicas" in text:
                    estimate = time.monotonic() - t0
                time.sleep(0.02)
        finally:
            proc.kill()
            proc.wait()
    text = out_path.read_text()
    print(f"first line after {first} s, the estimate after {estimate} s")
    assert text.startswith("pydtnn-simulate: 10000000 replica(s) of simplemlp, global batch 20000000, 100 steps, "
                           "policy equal\n"), (text, err_path.read_text())
    assert first is not None and first < 2.0, first
    assert estimate is not None and "of memory (the same run at 10000 replicas took" in text, text
    assert "simulated 100 steps" not in text                  # the estimate came before the work


def test_no_estimate_below_its_threshold(monkeypatch):
    calls = []
    assert budget.say_how_long(budget.ESTIMATE_FROM - 1, calls.append, "x") is None and calls == []
