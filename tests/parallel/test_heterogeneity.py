"""Heterogeneity end to end, through the launcher in real MPI jobs with emulated replica speeds.

`--emulate_speeds f_1,...,f_P` pads replica i's compute of b samples to b * t0 / f_i (t0 the full-speed
replicas' time per sample; pydtnn/parallel/emulation.py). The timing checks run in virtual time
(tests/mpi_scripts/virtual_time.py): a forward + backward of b samples takes exactly b x COST seconds on a
per-process virtual clock and a blocking allreduce ends when the last rank arrives, so every time the
framework measures is known exactly and no check depends on this machine's speed or load. That tests our
logic: the emulation's deadlines, the probe, the balancers, the per-replica statistics and the trace. How
faithful the emulation is in real time is measured, not asserted, by scripts/experiments/heterogeneity_experiment.py.

Virtual-time error: every clock reading costs one tick (1e-7 s); a step reads the clock at most ~100
times, against b x COST >= 10 ms of compute: times per step are exact to 1e-3 relative (REL below).
"""
import json

import numpy as np
import pytest

from mpi_helpers import REPO_ROOT, describe, printed_split, run_mpi  # noqa: E402


pytestmark = pytest.mark.mpi
LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"
BASE = ["--model", "simplecnn", "--dataset", "synthetic", "--parallel", "data", "--lr_schedulers", "",
        "--progress_bar", "false", "--threads_per_replica", "1", "--seed", "1"]
COST = 1e-3          # virtual seconds per sample of a full-speed replica's forward + backward
REL = 1e-3


def launch(nprocs, args, timeout=120, virtual=True):
    script = "virtual_time.py" if virtual else LAUNCHER
    r = run_mpi(nprocs, script, [*BASE, *map(str, args)], timeout=timeout, env={"VIRTUAL_COST_S": COST})
    assert r.returncode == 0, describe(r)
    return r


def test_emulated_half_speed_replica_takes_twice_as_long_per_sample(tmp_path):
    history = tmp_path / "h.json"
    launch(2, ["--balance", "none", "--emulate_speeds", "1,0.5", "--global_batch_size", 64,
               "--synthetic_samples", 64 * 5, "--num_epochs", 3, "--history_file", history])
    for row in json.loads(history.read_text()):
        speeds = [row[f"rank{r}_samples"] / row[f"rank{r}_compute_s"] for r in (0, 1)]
        assert speeds[0] == pytest.approx(1 / COST, rel=REL), row
        assert speeds[1] / speeds[0] == pytest.approx(0.5, rel=REL), row


@pytest.mark.parametrize("probe", [False, True])
def test_dynamic_balancing_converges_to_the_emulated_speed_ratio(tmp_path, probe):
    history = tmp_path / "h.json"
    # B = 200; 5 epochs of 10 steps, a re-split decision every 5 steps: 10 decisions.
    r = launch(2, ["--balance", "dynamic", "--rebalance_interval", 5, "--emulate_speeds", "1,0.5",
                   "--global_batch_size", 200, "--synthetic_samples", 2000, "--steps_per_epoch", 10,
                   "--num_epochs", 5, "--learning_rate", 0.01, "--history_file", history,
                   "--balance_options", f"probe={str(probe).lower()}"])
    # the speeds are exactly 1 : 0.5, so the splits that equalize compute times are 200 split 2 : 1 (133 : 67
    # and 134 : 66 finish together: 134 units of time); without its probe it starts from the equal split
    two_to_one = {(133, 67), (134, 66)}
    assert tuple(printed_split(r.stdout)) in (two_to_one if probe else {(100, 100)})
    rows = json.loads(history.read_text())
    assert len(rows) == 5 and all(h["rank0_b"] + h["rank1_b"] == 200 for h in rows)
    splits = [(h["rank0_b"], h["rank1_b"]) for h in rows]
    assert all(s in two_to_one for s in splits[-3:]) and len(set(splits[-3:])) == 1, splits
    last = rows[-1]                          # and the compute times per step are then equal
    assert last["rank0_compute_s"] == pytest.approx(last["rank1_compute_s"], rel=0.02), last


def test_static_balance_with_probed_speeds_splits_two_to_one():
    # the probe times local steps of B / P = 120 samples on each replica
    r = launch(2, ["--balance", "static", "--emulate_speeds", "1,0.5", "--global_batch_size", 240,
                   "--synthetic_samples", 240, "--num_epochs", 1])
    assert printed_split(r.stdout) == [160, 80]


def test_memory_caps_bound_a_pass_not_the_static_and_dynamic_splits(tmp_path):
    """--max_local_batch below a replica's share: it trains its share as micro-batches of at most its cap, and
    the split is the policy's without the cap (caps used to bound the split: [20, 40], then (70, 50))."""
    r = launch(2, ["--balance", "static", "--replica_speeds", "1,1", "--max_local_batch", "20,100",
                   "--global_batch_size", 60, "--synthetic_samples", 120, "--num_epochs", 1], virtual=False)
    assert printed_split(r.stdout) == [30, 30]
    assert "memory caps 20,100 samples a pass, one reduction and one update per step; micro-batches 30 = 2 x 15; " \
           "30 = 1 x 30" in r.stdout, r.stdout
    history = tmp_path / "h.json"
    # rank 0 is twice as fast and takes 2/3 of B = 120 (80), in 2 micro-batches of 40 under its cap of 70
    launch(2, ["--balance", "dynamic", "--rebalance_interval", 4, "--emulate_speeds", "1,0.5",
               "--max_local_batch", "70", "--global_batch_size", 120, "--synthetic_samples", 1200,
               "--steps_per_epoch", 8, "--num_epochs", 3, "--learning_rate", 0.01, "--history_file", history])
    rows = json.loads(history.read_text())
    splits = [(h["rank0_b"], h["rank1_b"]) for h in rows]
    assert splits[-1] == (80, 40), splits


def test_fpm_split_is_the_same_with_a_memory_cap_below_a_share(tmp_path):
    """In virtual time a pass of b rows costs b x COST, so a share run as micro-batches costs what it costs at
    once: the fpm probe times rank 0's points above its cap of 40 as micro-batches and finds the same split."""
    splits = {}
    for caps in ([], ["--max_local_batch", "40,120"]):
        r = launch(2, ["--balance", "fpm", "--emulate_speeds", "1,0.5", "--global_batch_size", 120,
                       "--synthetic_samples", 240, "--num_epochs", 1, *caps])
        splits[bool(caps)] = printed_split(r.stdout)
    assert splits[True] == splits[False] == [80, 40], splits
    assert "micro-batches 80 = 2 x 40; 40 = 1 x 40" in r.stdout, r.stdout


def test_equal_split_makes_the_fast_replica_wait(tmp_path):
    history = tmp_path / "h.json"
    r = launch(2, ["--balance", "none", "--emulate_speeds", "1,0.5", "--global_batch_size", 64,
                   "--synthetic_samples", 1280, "--num_epochs", 2, "--history_file", history])
    assert printed_split(r.stdout) == [32, 32]
    last = json.loads(history.read_text())[-1]
    assert last["rank0_b"] == last["rank1_b"] == 32
    # rank 1 computes twice as long as rank 0, which waits in the allreduce for the difference
    steps = 1280 // 64
    assert last["rank0_compute_s"] == pytest.approx(steps * 32 * COST, rel=REL), last
    assert last["rank1_compute_s"] == pytest.approx(steps * 64 * COST, rel=REL), last
    assert last["rank0_wait_s"] == pytest.approx(steps * 32 * COST, rel=0.01), last
    assert last["rank1_wait_s"] < 0.01 * last["rank0_wait_s"], last


def test_non_blocking_reduction_gives_the_blocking_weights(tmp_path):
    # simplemlp in float64 is ~5.3 MB of gradients: several 1 MiB buckets, started during backward
    common = ["--model", "simplemlp", "--dtype", "float64", "--balance", "static", "--replica_speeds", "1,2,3",
              "--emulate_speeds", "1,0.5,0.75", "--global_batch_size", 60, "--synthetic_samples", 240,
              "--num_epochs", 2]
    blocking, overlapped = tmp_path / "blocking.npz", tmp_path / "non_blocking.npz"
    r = launch(3, [*common, "--non_blocking_mpi", "false", "--save_weights_and_bias_filename", blocking],
               virtual=False)
    assert printed_split(r.stdout) == [10, 20, 30]
    launch(3, [*common, "--non_blocking_mpi", "true", "--save_weights_and_bias_filename", overlapped],
           virtual=False)
    a, b = np.load(blocking), np.load(overlapped)
    assert sorted(a.files) == sorted(b.files) and len(a.files) >= 6
    for k in a.files:
        assert a[k].dtype == np.float64 and a[k].shape == b[k].shape, k
        diff = np.max(np.abs(a[k] - b[k])) / max(np.max(np.abs(a[k])), 1e-300)
        assert diff < 1e-10, (k, diff)
