"""A GPU in the simulator (issue 46): each device's t_i(b) from a cost model file (documented, one shipped) or a
run's checkpoint; --devices KIND:COUNT counts; a cost model of another model, a file that is not one and a
global batch larger than the dataset are refused in one line."""
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
import pytest

from mpi_helpers import run_mpi
from paths import REPO
from pydtnn.errors import ConfigError
from pydtnn.sim.__main__ import main
from pydtnn.sim.devices import parse_devices

EXAMPLE = REPO / "docs" / "examples" / "gpu_cpu_cost_model.json"
GRAD = 2678824                                   # simplemlp: 669,706 float32 parameters


def _write(tmp_path, doc, name="m.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def _affine_file(tmp_path, devices=("gpu", "cpu", "cpu"), model="simplemlp", grad=GRAD):
    """A hand-written file: the GPU 40 ms + 0.1 ms/sample, each CPU 1.5 ms/sample (two exact points each)."""
    fixed, per = {"gpu": 0.040, "cpu": 0.0}, {"gpu": 1e-4, "cpu": 1.5e-3}
    return _write(tmp_path, {"format": "pydtnn-cost-model/1", "model": model, "gradient_bytes": grad,
                             "devices": list(devices),
                             "replicas": [{"points": [[b, fixed[d] + per[d] * b] for b in (10, 100)]}
                                          for d in devices]})


def _run_json(capsys, argv):
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------------------------------------ --devices

def test_devices_count_and_repeat():
    spec = parse_devices("gpu:16,cpu:48", 1024)
    kinds = spec.kinds(1024)
    assert len(kinds) == 1024 and kinds.count("gpu") == 256 and kinds[:16] == ["gpu"] * 16 and kinds[16] == "cpu"
    assert kinds[64:80] == ["gpu"] * 16                                   # the next node's 16 GPUs
    assert spec.describe(1024) == "256 gpu, 768 cpu (--devices gpu:16,cpu:48, repeated 16 times)"
    assert parse_devices("GPU", 8).kinds(8) == ["gpu"] * 8
    assert parse_devices("gpu,cpu,cpu,cpu", 4).kinds(4) == ["gpu", "cpu", "cpu", "cpu"]
    assert parse_devices("gpu:1,cpu:3", 4).describe(4) == "1 gpu, 3 cpu (--devices gpu:1,cpu:3)"


@pytest.mark.parametrize("text, message", [
    ("tpu:4", "'tpu:4' is not a device kind"), ("gpu:0", "must be a whole number >= 1"),
    ("gpu:x", "must be a whole number >= 1"), ("gpu:16,cpu:47", "gives 63 devices, which neither is nor divides"),
    ("gpu:2000", "counts more replicas than --replicas 1024"), ("gpu,,cpu", "'' is not a device kind"),
])
def test_a_bad_devices_flag_is_one_line(text, message, capsys):
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "4096", "--replicas", "1024",
                 "--devices", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pydtnn: error: --devices {text}") and message in err[0], err


# ------------------------------------------------------------------------------------------- --cost_model

def test_each_kind_takes_the_files_replicas_of_its_kind(tmp_path, capsys):
    """Replica i's compute is its kind's t(b_i): the GPU 40 ms + 0.1 ms/b, a CPU 1.5 ms/b; fpm's split has
    equal finish times (40 + 0.1 b0 = 1.5 b1; b0 + 3 b1 = 256 -> [176, 26, 27, 27] within a sample)."""
    path = _affine_file(tmp_path)
    doc = _run_json(capsys, ["run", "--model", "simplemlp", "--global_batch_size", "256", "--replicas", "4",
                             "--devices", "gpu:1,cpu:3", "--cost_model", path, "--balance", "fpm",
                             "--balance_options", "bucket=1", "--steps", "2"])
    sizes = np.array(doc["sizes"])
    truth = np.where(np.arange(4) == 0, 0.040 + 1e-4 * sizes, 1.5e-3 * sizes)
    computed = np.array([r["compute_s"] for r in doc["per_replica"]])
    assert computed == pytest.approx(truth, rel=1e-9)
    assert doc["devices"] == {"cpu": 3, "gpu": 1} and doc["cost_model"]["model"] == "simplemlp"
    assert sizes.sum() == 256 and truth.max() - truth.min() <= 1.5e-3 + 1e-12     # one CPU sample apart at most
    assert doc["rebalances"] == 0 and doc["first_split"] == "probe"              # fpm's probe split, no re-split


def test_a_gpu_cpu_cluster_of_1024_replicas_from_the_shipped_file(capsys):
    """docs/simulation.md's example: 16 GPUs and 48 CPUs per node, 16 nodes, the shipped t_i(b) file, fpm.
    Timed in CPU seconds of the process (the issue's 10 s; a loaded machine stretches wall time, not CPU time)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pydtnn.sim", "run", "--model", "simplemlp", "--cost_model",
                          str(EXAMPLE), "--devices", "gpu:16,cpu:48", "--replicas", "1024", "--ranks_per_node", "64",
                          "--global_batch_size", "81920", "--dataset", "imagenet", "--balance", "fpm",
                          "--balance_options", "bucket=1", "--steps", "100", "--json"],
                         capture_output=True, text=True, timeout=300, cwd=str(REPO))
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"1,024 replicas (256 gpu, 768 cpu), 100 steps, fpm: {cpu:.2f} CPU s, {wall:.2f} s wall")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["devices"] == {"cpu": 768, "gpu": 256} and doc["replicas"] == 1024 and doc["nodes"] == 16
    sizes = np.array(doc["sizes"]).reshape(16, 64)
    gpu, cpu_b = sizes[:, :16], sizes[:, 16:]                                   # each node: 16 GPUs, then 48 CPUs
    assert sizes.sum() == 81920 and np.ptp(gpu) <= 1 and np.ptp(cpu_b) <= 1   # every node split alike
    assert gpu.min() > 4 * cpu_b.max()          # 40 ms fixed + 0.1 ms/sample against 1.5 ms/sample: ~200 vs ~40
    compute = np.array([r["compute_s"] for r in doc["per_replica"]])
    assert compute.max() / compute.min() < 1.05                                 # equal finish times
    assert cpu < 10.0, f"{cpu:.1f} CPU s"


def test_a_cost_model_of_another_model_is_refused(tmp_path, capsys):
    path = _affine_file(tmp_path)
    assert main(["run", "--model", "simplecnn", "--global_batch_size", "64", "--replicas", "3",
                 "--cost_model", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"pydtnn: error: --cost_model {path} was measured on model simplemlp, not simplecnn (the model "
                   f"simulated): its t_i(b) times another network's steps"], err
    other = _affine_file(tmp_path, grad=GRAD * 2)                     # the same name, float64's gradient
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "3",
                 "--cost_model", other]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"says simplemlp has {2 * GRAD} gradient bytes; the simulated simplemlp has {GRAD}" \
        in err[0], err


def test_devices_without_a_file_replica_of_their_kind_are_refused(tmp_path, capsys):
    path = _affine_file(tmp_path, devices=("cpu", "cpu"))
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "4", "--devices",
                 "gpu:1,cpu:3", "--cost_model", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "asks for gpu replicas; --cost_model" in err[0] and "has none" in err[0], err


GOOD = {"format": "pydtnn-cost-model/1", "model": "simplemlp", "gradient_bytes": GRAD, "devices": ["gpu"],
        "replicas": [{"points": [[8, 0.01], [64, 0.02]]}]}


def _bad(**change):
    doc = dict(GOOD)
    doc.update(change)
    return json.dumps(doc)


@pytest.mark.parametrize("text, message", [
    (_bad(devices="gpu"), '"devices" must be a list'),
    (_bad(devices=["tpu"]), "\"devices\" holds 'tpu'"),
    (_bad(replicas=[], devices=[]), '"replicas" must be a non-empty list'),
    (_bad(replicas=None), '"replicas" must be a non-empty list'),
    (_bad(devices=["gpu", "cpu"]), "1 replicas but 2 devices"),
    (_bad(replicas=[{"points": []}]), 'replica 0 needs "points"'),
    (_bad(replicas=["x"]), 'replica 0 needs "points"'),
    (_bad(model=None), '"model" must name the model'),
    (_bad(gradient_bytes=True), '"gradient_bytes" must be a whole number >= 1'),
    (_bad(gradient_bytes=0), '"gradient_bytes" must be a whole number >= 1'),
    (_bad(measured_on=7), '"measured_on" must be text'),
    (_bad(format="other"), "not a cost model"),
    ('{"format": "pydtnn-cost-model/1", "model": "simplemlp", "gradient_bytes": 2678824, "devices": ["gpu"], '
     '"replicas": [{"points": [[8, Infinity]]}]}', "Infinity is not a number a cost model can hold"),
    (_bad(replicas=[{"points": [[8, 0.01]]}]).replace("0.01", "1e999"), "1e999 is not a finite number"),
    (_bad().replace("0.01", "NaN"), "NaN is not a number"),
    (_bad().replace("[8, ", "[1" + "0" * 30 + ", "), "has more than 15 digits"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ("{not json", "not JSON"),
    ("[1, 2]", "not a cost model"),
])
def test_a_cost_model_file_that_is_not_one_is_one_line(tmp_path, text, message, capsys):
    path = _write(tmp_path, text)
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "2",
                 "--cost_model", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pydtnn: error: --cost_model {path}: ") and message in err[0], err


def test_the_points_are_the_cost_models_to_judge(tmp_path, capsys):
    """Points a JSON reader lets through (b = 0, negative seconds) meet CostModel.from_state's checks, in one line
    naming the file."""
    for points in ([[0, 0.01]], [[8, -0.01]]):
        path = _write(tmp_path, _bad(replicas=[{"points": points}]))
        assert main(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "2",
                     "--cost_model", path]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"pydtnn: error: --cost_model {path}: "), err


def test_an_endless_or_binary_file_is_refused_quickly(tmp_path, capsys):
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00" * 10)
    for path, message in (("/dev/zero", "larger than 64 MiB"), (str(tmp_path / "bin.json"), "not a text file"),
                          (str(tmp_path / "none.json"), "No such file")):
        t0 = time.monotonic()
        assert main(["run", "--model", "simplemlp", "--global_batch_size", "64", "--replicas", "2",
                     "--cost_model", path]) == 2
        assert time.monotonic() - t0 < 10                       # 64 MiB read, not the whole of /dev/zero
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


# ---------------------------------------------------------------------------------------- the global batch

def test_a_global_batch_larger_than_the_dataset_is_refused(capsys):
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "60000", "--replicas", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pydtnn: error: --global_batch_size 60000 is larger than the 50000 samples of CIFAR-10's "
                   "training set, the default without --dataset or --samples: an epoch would not hold one step "
                   "(give --samples, the dataset's size, or a smaller batch)"], err
    assert main(["run", "--model", "simplemlp", "--global_batch_size", "60000", "--replicas", "4", "--dataset",
                 "mnist", "--samples", "50000"]) == 2
    assert "the 50000 samples of --samples 50000" in capsys.readouterr().err
    doc = _run_json(capsys, ["run", "--model", "simplemlp", "--global_batch_size", "60000", "--replicas", "4",
                             "--dataset", "mnist", "--steps", "2"])
    assert doc["steps_per_epoch"] == 1                        # MNIST's 60,000: exactly one step


# ------------------------------------------------------------------------- the shipped file, as documented

@pytest.mark.mpi
def test_the_shipped_example_is_what_its_documented_command_writes(tmp_path, capsys):
    """docs/simulation.md: the example file was written from the checkpoint of a 3-rank fpm run emulating one
    GPU-like replica (40 ms + 0.1 ms per sample) and two CPU-like ones (1.5 ms per sample). The same command
    again, and `pydtnn-simulate cost_model`: the same model, bytes and devices, and every point, fresh and
    shipped, within 10% of the emulated cost (the emulator pads a step to its cost; what is over it is the
    timer's and the scheduler's delay, milliseconds on a loaded 2-core machine, against steps of 44-381 ms)."""
    r = run_mpi(3, REPO / "scripts" / "pydtnn_benchmark.py",
                ["--model", "simplemlp", "--parallel", "data", "--balance", "fpm", "--emulate_costs",
                 "40ms+0.1ms,0+1.5ms,0+1.5ms", "--synthetic_samples", "512", "--global_batch_size", "256",
                 "--num_epochs", "1", "--progress_bar", "false", "--lr_schedulers", "model_checkpoint",
                 "--model_checkpoint_metric", "loss", "--model_checkpoint_save_freq", "1", "--checkpoint_dir",
                 str(tmp_path / "run")], timeout=240, check=True)
    split = next(line for line in r.stdout.splitlines() if line.startswith("global batch 256 split as ["))
    assert 170 <= int(split.split("[")[1].split(",")[0]) <= 190, split        # the optimum: [180, 38, 38]
    fresh = tmp_path / "fresh.json"
    assert main(["cost_model", "--checkpoint", str(tmp_path / "run" / "epoch_0001.npz"), "--devices",
                 "gpu,cpu,cpu", "--out", str(fresh)]) == 0
    capsys.readouterr()
    shipped, new = json.loads(EXAMPLE.read_text()), json.loads(fresh.read_text())
    for key in ("format", "model", "gradient_bytes", "devices"):
        assert shipped[key] == new[key], key
    truth = [lambda b: 0.040 + 1e-4 * b, lambda b: 1.5e-3 * b, lambda b: 1.5e-3 * b]
    for doc in (shipped, new):
        for t, replica in zip(truth, doc["replicas"]):
            for b, seconds in replica["points"]:
                assert seconds == pytest.approx(t(b), rel=0.10), (doc is new, b, seconds)
    # and it reads back as the checkpoint does: the same split
    args = ["run", "--model", "simplemlp", "--global_batch_size", "256", "--replicas", "3", "--balance", "fpm",
            "--steps", "2"]
    via_file = _run_json(capsys, [*args, "--cost_model", str(fresh)])["sizes"]
    via_checkpoint = _run_json(capsys, [*args, "--cost_model", str(tmp_path / "run" / "epoch_0001.npz"),
                                        "--devices", "cpu:3"])["sizes"]
    assert via_file[0] > 150 and sum(via_file) == 256 and abs(via_file[0] - via_checkpoint[0]) <= 8  # a GPU bucket


def test_the_cost_model_subcommand_checks_its_output_first(tmp_path, capsys):
    assert main(["cost_model", "--checkpoint", str(tmp_path / "none.npz"), "--out",
                 str(tmp_path / "no" / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0], err
    with pytest.raises(ConfigError, match="neither is nor divides"):
        parse_devices("gpu:3", 4)
    assert os.path.exists(EXAMPLE)
