"""pydtnn-simulate's command line: one-line errors with exit status 2, the --json document, calibrate's
roofline and measured profiles."""
import json
import subprocess
import sys

import pytest

from pydtnn.sim.__main__ import main


@pytest.fixture(scope="module")
def roofline_profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("sim") / "roof.json"
    assert main(["calibrate", "--model", "simplemlp", "--roofline", "--out", str(path)]) == 0
    return str(path)


@pytest.mark.parametrize("argv, message", [
    (["run", "--global_batch_size", "4", "--replicas", "8", "--model", "simplemlp"], "smaller than --replicas"),
    (["run", "--global_batch_size", "64", "--replicas", "4", "--model", "simplemlp", "--stragglers", "2x"],
     "--stragglers must be K:FACTOR"),
    (["run", "--global_batch_size", "64", "--replicas", "4", "--model", "simplemlp", "--speed_factors", "1,2"],
     "--speed_factors has 2 values for 4 replicas"),
    (["run", "--global_batch_size", "64", "--replicas", "4", "--model", "simplemlp", "--network_alg", "tree"],
     "--network_alg must be one of"),
    (["run", "--global_batch_size", "64", "--replicas", "4", "--model", "simplemlp", "--noise", "-1"], "--noise"),
    (["run", "--global_batch_size", "64", "--replicas", "4", "--profile", "/nonexistent/p.json"], "--profile"),
    (["run", "--global_batch_size", "64", "--replicas", "6", "--nodes", "4", "--model", "simplemlp"], "multiple of"),
    (["calibrate", "--model", "simplemlp", "--trace", "/nonexistent/t.json", "--out", "x.json"], "--trace /nonexistent"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pydtnn: error: ") and message in err[0], err


def test_a_profile_that_is_not_one(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text('{"format": "other"}')
    assert main(["run", "--profile", str(bad), "--global_batch_size", "8", "--replicas", "2"]) == 2
    assert "not a simulator profile" in capsys.readouterr().err


def test_json_document(roofline_profile, capsys):
    argv = ["run", "--profile", roofline_profile, "--model", "simplemlp", "--global_batch_size", "256",
            "--replicas", "8", "--balance", "dynamic", "--noise", "0.05", "--stragglers", "2:2.0:30",
            "--speed_factors", "1,1,1,1,2,2,2,2", "--steps", "120", "--sweep", "2,8", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"step_seconds", "epoch_seconds", "per_replica", "best_partition", "sweep", "scaling_efficiency"} <= set(doc)
    assert len(doc["per_replica"]) == 8 and set(doc["per_replica"][0]) >= {"b_i", "compute_s", "wait_s"}
    assert sum(r["b_i"] for r in doc["per_replica"]) == 256
    assert doc["epoch_seconds"] == pytest.approx(doc["step_seconds"] * doc["steps_per_epoch"], rel=1e-12)
    assert set(doc["sweep"]) == {"equal", "static", "dynamic"}
    # with 4 replicas twice as fast, the best split gives each of them twice the samples
    assert doc["best_partition"]["sizes"] == [21] * 4 + [43] * 4


def test_text_output_and_console_module(roofline_profile, tmp_path):
    out = subprocess.run([sys.executable, "-m", "pydtnn.sim", "run", "--profile", roofline_profile,
                          "--global_batch_size", "64", "--replicas", "4", "--steps", "20", "--sweep", "auto",
                          "--non_blocking_mpi", "true", "--sync_batchnorm", "true", "--network_alg", "ring",
                          "--plot", str(tmp_path / "s.png")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for word in ("step time", "epoch time", "scaling efficiency", "best partition", "wait ms", "efficiency %"):
        assert word in out.stdout
    assert (tmp_path / "s.png").stat().st_size > 0


@pytest.mark.mpi
def test_calibrate_measures_this_machine(tmp_path):
    """A short real calibration: layers at two batch sizes, ping-pong and Allreduce on 2 processes, the
    contention probe at 1 .. cores + 1 processes (and the network again with cores + 1)."""
    from pydtnn.parallel.runtime.threads import usable_cores
    from pydtnn.sim.calibrate import contention_points
    path = tmp_path / "m.json"
    assert main(["calibrate", "--model", "simplemlp", "--batch_points", "1,16", "--seconds", "3",
                 "--out", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["source"] == "measured" and len(doc["network_sweep"]["sizes"]) == 8
    assert doc["network"]["alpha"] > 0 and doc["network"]["beta"] > 0
    assert all(sum(l["forward_s"]) > 0 for l in doc["layers"] if l["param_bytes"])
    assert len(doc["step_overhead_s"]) == 2 and min(doc["step_overhead_s"]) >= 0   # from two traced launcher runs
    cores = len(usable_cores())
    assert doc["cores"] == cores and doc["threads_per_replica"] == 1
    assert sorted(map(int, doc["contention"])) == contention_points(cores)
    assert doc["contention"]["1"] == 1.0 and all(v > 0 for v in doc["contention"].values())
    assert doc["network_sweep_oversubscribed"]["processes"] == cores + 1


def test_a_reader_that_goes_away_is_no_traceback():
    """`pydtnn-simulate run ... | head -1`: the pipe closes before the output is written."""
    proc = subprocess.Popen([sys.executable, "-m", "pydtnn.sim", "run", "--model", "simplemlp", "--global_batch_size",
                             "64", "--replicas", "4", "--steps", "5", "--sweep", "auto"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                                 # no reader left: the first flush fails with EPIPE
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
