"""Heterogeneity end to end, through the launcher in real MPI jobs with emulated replica speeds.

`--emulate_speeds f_1,...,f_P` pads replica i's compute of b samples to b * t0 / f_i (t0 its own time per
sample; pydtnn/parallel/emulation.py), so its speed is f_i / max f of its own: the emulation's measured
ratio is checked first, then that the balancers find the emulated ratios, that the equal split makes the
fast replica wait, and that the launcher's other data-parallel paths (non-blocking reduction, tracing)
keep working under it.

Timing is real, on a machine that may be shared: a timing check that fails is run once more before it
fails the test.
"""
import json
import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpi_helpers import REPO_ROOT, describe, run_mpi  # noqa: E402

pytestmark = pytest.mark.mpi
LAUNCHER = REPO_ROOT / "scripts" / "pydtnn_benchmark.py"
BASE = ["--model", "simplecnn", "--dataset", "synthetic", "--parallel", "data", "--lr_schedulers", "",
        "--progress_bar", "false", "--threads_per_replica", "1", "--seed", "1"]


def launch(nprocs, args, timeout=120):
    r = run_mpi(nprocs, LAUNCHER, [*BASE, *map(str, args)], timeout=timeout)
    assert r.returncode == 0, describe(r)
    return r


def twice(check):
    """Run a timing check; if it fails, run it once more (noise from other processes on a shared machine)."""
    try:
        return check()
    except AssertionError as first:
        print(f"timing check failed once, retrying: {first}")
        return check()


def printed_split(stdout):
    m = re.search(r"split as \[([0-9, ]+)\]", stdout)
    assert m, stdout
    return [int(v) for v in m.group(1).split(",")]


def measured_ratio(history, first_epoch=2):
    """Replica 1's speed over replica 0's (samples per compute second): the median over the epochs from
    `first_epoch` (the first one pays for compilation) of each epoch's ratio. A median, because only the
    fast replica feels a pause of the machine (the emulated one absorbs it in its deadline)."""
    rows = json.loads(history.read_text())[first_epoch - 1:]
    return float(np.median([(r["rank1_samples"] / r["rank1_compute_s"]) / (r["rank0_samples"] / r["rank0_compute_s"])
                            for r in rows]))


@pytest.mark.parametrize("threads", ["1", "default"])
def test_emulated_speed_ratio_is_within_five_percent(tmp_path, threads):
    history = tmp_path / "h.json"
    args = [*BASE, "--balance", "none", "--emulate_speeds", "1,0.5", "--global_batch_size", 512,
            "--synthetic_samples", 512 * 15, "--num_epochs", 5, "--learning_rate", 0.01, "--history_file", history]
    unset = ()
    if threads == "default":            # the launcher's default: the node's cores shared among its ranks
        i = args.index("--threads_per_replica")
        del args[i:i + 2]
        unset = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

    def check():
        r = run_mpi(2, LAUNCHER, list(map(str, args)), timeout=120, unset=unset)
        assert r.returncode == 0, describe(r)
        if threads == "default":
            assert "(default:" in r.stdout, r.stdout
        ratio = measured_ratio(history)
        assert abs(ratio / 0.5 - 1) <= 0.05, ratio
        return ratio

    print("measured speed ratio:", twice(check))


def test_dynamic_balancing_converges_to_the_emulated_speed_ratio(tmp_path):
    history = tmp_path / "h.json"

    def check():
        # B = 200; 5 epochs of 10 steps, a re-split decision every 5 steps: 10 decisions.
        r = launch(2, ["--balance", "dynamic", "--rebalance_interval", 5, "--emulate_speeds", "1,0.5",
                       "--global_batch_size", 200, "--synthetic_samples", 2000, "--steps_per_epoch", 10,
                       "--num_epochs", 5, "--learning_rate", 0.01, "--history_file", history])
        assert printed_split(r.stdout) == [100, 100]                # it starts from the equal split
        rows = json.loads(history.read_text())
        assert len(rows) == 5 and all(h["rank0_b"] + h["rank1_b"] == 200 for h in rows)
        splits = [(h["rank0_b"], h["rank1_b"]) for h in rows]
        b0, b1 = splits[-1]
        # the emulated ratio is 2 ([133, 67]); simplecnn's per-step cost that does not scale with b moves
        # the split that equalizes compute times a little (measured [132, 68])
        assert 1.7 <= b0 / b1 <= 2.4, splits
        # ... and the balancer's aim reached: equal compute times per step (1 : 2 at the equal split)
        last = rows[-2:]
        ratio = np.median([max(h["rank0_compute_s"], h["rank1_compute_s"])
                           / min(h["rank0_compute_s"], h["rank1_compute_s"]) for h in last])
        assert ratio < 1.2, (ratio, splits, [(h["rank0_compute_s"], h["rank1_compute_s"]) for h in rows])
        # and it stays there: a few samples of drift at most in the last epochs (hysteresis), not the
        # oscillation of an unsmoothed balancer
        assert max(a for a, _ in splits[-3:]) - min(a for a, _ in splits[-3:]) <= 8, splits
        return splits

    print("splits per epoch:", twice(check))


def test_static_balance_with_probed_speeds_splits_about_two_to_one():
    def check():
        # the probe times >= 0.3 s of local steps of B / P = 120 samples on each replica
        r = launch(2, ["--balance", "static", "--emulate_speeds", "1,0.5", "--global_batch_size", 240,
                       "--synthetic_samples", 240, "--num_epochs", 1])
        a, b = printed_split(r.stdout)
        assert a + b == 240
        assert 1.7 <= a / b <= 2.4, (a, b)          # emulated 2:1 -> [160, 80] (measured [161, 79])
        return a, b

    print("probed split:", twice(check))


def test_memory_caps_bound_the_static_and_dynamic_splits(tmp_path):
    r = launch(2, ["--balance", "static", "--replica_speeds", "1,1", "--max_local_batch", "20,100",
                   "--global_batch_size", 60, "--synthetic_samples", 120, "--num_epochs", 1])
    assert printed_split(r.stdout) == [20, 40]
    history = tmp_path / "h.json"

    def check():
        # rank 0 is twice as fast and would take 2/3 of B = 120 (80), but holds at most 70
        launch(2, ["--balance", "dynamic", "--rebalance_interval", 4, "--emulate_speeds", "1,0.5",
                   "--max_local_batch", "70", "--global_batch_size", 120, "--synthetic_samples", 1200,
                   "--steps_per_epoch", 8, "--num_epochs", 3, "--learning_rate", 0.01, "--history_file", history])
        rows = json.loads(history.read_text())
        splits = [(h["rank0_b"], h["rank1_b"]) for h in rows]
        assert all(a <= 70 and b <= 70 and a + b == 120 for a, b in splits), splits    # never over a cap
        # the measured speeds push rank 0 up to (or, by the balancer's 5% hysteresis, next to) its cap
        assert splits[-1][0] >= 66, splits
        return splits

    print("dynamic splits under a cap of 70:", twice(check))


def test_equal_split_makes_the_fast_replica_wait(tmp_path):
    history = tmp_path / "h.json"

    def check():
        r = launch(2, ["--balance", "none", "--emulate_speeds", "1,0.5", "--global_batch_size", 64,
                       "--synthetic_samples", 1280, "--num_epochs", 2, "--history_file", history])
        assert printed_split(r.stdout) == [32, 32]
        last = json.loads(history.read_text())[-1]
        assert last["rank0_b"] == last["rank1_b"] == 32
        # rank 1 computes about twice as long as rank 0, which waits in the allreduce for the difference.
        # Only the direction is checked: under Open MPI each rank is bound to one core, and other load on
        # that core shows up as waiting on the other rank (measured 0.36 s vs 0.34 s on a loaded 2-core VM).
        assert last["rank1_compute_s"] > 1.5 * last["rank0_compute_s"], last
        assert last["rank0_wait_s"] > last["rank1_wait_s"], last
        return {k: round(v, 3) for k, v in last.items() if k.startswith("rank")}

    print("last epoch:", twice(check))


def test_non_blocking_reduction_gives_the_blocking_weights(tmp_path):
    # simplemlp in float64 is ~5.3 MB of gradients: several 1 MiB buckets, started during backward
    common = ["--model", "simplemlp", "--dtype", "float64", "--balance", "static", "--replica_speeds", "1,2,3",
              "--emulate_speeds", "1,0.5,0.75", "--global_batch_size", 60, "--synthetic_samples", 240,
              "--num_epochs", 2]
    blocking, overlapped = tmp_path / "blocking.npz", tmp_path / "non_blocking.npz"
    r = launch(3, [*common, "--non_blocking_mpi", "false", "--save_weights_and_bias_filename", blocking])
    assert printed_split(r.stdout) == [10, 20, 30]
    launch(3, [*common, "--non_blocking_mpi", "true", "--save_weights_and_bias_filename", overlapped])
    a, b = np.load(blocking), np.load(overlapped)
    assert sorted(a.files) == sorted(b.files) and len(a.files) >= 6
    for k in a.files:
        assert a[k].dtype == np.float64 and a[k].shape == b[k].shape, k
        diff = np.max(np.abs(a[k] - b[k])) / max(np.max(np.abs(a[k])), 1e-300)
        assert diff < 1e-10, (k, diff)


def test_tracing_writes_a_chrome_trace_with_one_pid_per_rank(tmp_path):
    twice(lambda: _tracing(tmp_path))


def _tracing(tmp_path):
    trace = tmp_path / "trace.json"
    steps = 4
    launch(2, ["--balance", "static", "--replica_speeds", "2,1", "--emulate_speeds", "1,0.5",
               "--global_batch_size", 30, "--synthetic_samples", 30 * steps, "--num_epochs", 1,
               "--tracing", "true", "--tracer_output", trace])
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    for pid in (0, 1):
        mine = [e for e in spans if e["pid"] == pid]
        compute = [e for e in mine if e["name"] == "compute"]
        reduce_ = [e for e in mine if e["name"] == "allreduce"]
        assert len(compute) == steps and len(reduce_) == steps, (pid, sorted({e["name"] for e in mine}))
        assert all(e["dur"] > 0 and e["ts"] >= 0 for e in compute + reduce_)
        # within a step the reduction follows the compute
        for c, w in zip(sorted(compute, key=lambda e: e["ts"]), sorted(reduce_, key=lambda e: e["ts"])):
            assert w["ts"] >= c["ts"] + c["dur"] - 1.0          # microseconds; 1 us of rounding
    # the slow replica (emulated half speed) spends longer in compute than the fast one per sample, after
    # the first step (which compiles kernels on rank 0; rank 1 compiled them in its emulation's calibration)
    per_sample = [sum(e["dur"] for e in sorted((e for e in spans if e["pid"] == pid and e["name"] == "compute"),
                                               key=lambda e: e["ts"])[1:]) / b
                  for pid, b in ((0, 20), (1, 10))]
    assert per_sample[1] > 1.3 * per_sample[0], per_sample
