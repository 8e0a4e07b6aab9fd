"""What the probe before training costs is shown (issue 46: FPM's 5-8 s of probing were left out of "training
time", so short comparisons favoured it): the report prints the probe's seconds and the probe plus training,
and a cost model whose points are noisy comes with one line of advice. In virtual time
(tests/mpi_scripts/virtual_time.py), so every second is known whatever the machine's load."""
import re

import pytest

from mpi_helpers import describe, run_mpi  # noqa: E402

from pydtnn.parallel.balance.cost_model import CostModel, ReplicaCost
from pydtnn.parallel.balance.policies import FPMPolicy

BASE = ["--model", "simplemlp", "--dataset", "synthetic", "--parallel", "data", "--lr_schedulers", "",
        "--progress_bar", "false", "--threads_per_replica", "1", "--global_batch_size", 96, "--synthetic_samples",
        384, "--num_epochs", 1, "--emulate_costs", "40ms+0.1ms,0+1.5ms"]
REPORT = r"training time: ([0-9.]+) s over 1 epoch\(s\)\nprobe before training: ([0-9.]+) s \(fpm\); " \
         r"probe \+ training: ([0-9.]+) s\n"


@pytest.mark.mpi
def test_the_report_counts_the_probe_beside_training():
    r = run_mpi(2, "virtual_time.py", [*BASE, "--balance", "fpm"], timeout=180, env={"VIRTUAL_COST_S": 1e-4})
    assert r.returncode == 0, describe(r)
    m = re.search(REPORT, r.stdout)
    assert m, r.stdout
    training, probe, both = map(float, m.groups())
    # the probe timed 4 points and at least one round: at least one timed pass of each point's slowest replica,
    # 1.5 ms x b on replica 1 (b = 11, 23, 47, 94): more than 0.26 s of virtual time
    assert probe >= 0.26 and both == pytest.approx(training + probe, abs=0.011)
    r = run_mpi(2, "virtual_time.py", [*BASE, "--balance", "none"], timeout=180, env={"VIRTUAL_COST_S": 1e-4})
    assert r.returncode == 0 and "training time:" in r.stdout and "probe before training" not in r.stdout, describe(r)


def test_noisy_points_come_with_one_line_of_advice():
    policy = FPMPolicy(points=4, probe_s=0.2)
    policy.bind(0, 2)
    policy.model = CostModel([ReplicaCost([(8, 0.010), (16, 0.018), (32, 0.034), (64, 0.066)]),
                              ReplicaCost([(8, 0.150), (23, 0.212), (32, 0.180), (64, 0.400)])])
    advice = [line for line in policy.describe() if line.startswith("advice:")]
    assert advice == ["advice: replica 1: its time falls as b grows (b=23: 212 ms, b=32: 180 ms); its affine fit "
                      "misses a point by 31%: the probe's times are noisy (a loaded machine?); more points "
                      "(--balance_options points=8), longer probes (probe_s=1) or a quieter machine give a firmer "
                      "model"]
    policy.model = CostModel([ReplicaCost([(8, 0.010), (16, 0.018), (32, 0.034), (64, 0.066)])] * 2)
    assert not any(line.startswith("advice:") for line in policy.describe())


@pytest.mark.parametrize("value, needle", [("0", "must be in [0.01, 60.0]"), ("61", "must be in [0.01, 60.0]"),
                                           ("inf", "must be in [0.01, 60.0]"), ("x", "must be a number")])
def test_longer_probes_are_an_option_within_its_range(value, needle):
    from pydtnn.errors import ConfigError
    assert FPMPolicy(probe_s="1.5").probe_s == 1.5
    with pytest.raises(ConfigError, match=re.escape(f"--balance_options probe_s={value}: {needle}")):
        FPMPolicy(probe_s=value)


POINT = re.compile(r"probe point (\d+): b = \[([0-9, ]+)\], median compute ([0-9., ]+) ms \((\d+) timed pass(?:es)? "
                   r"each(, capped)?; ([0-9.]+) s\)")


@pytest.mark.mpi
def test_a_slow_replicas_points_are_capped_at_two_seconds_of_passes():
    """A replica 500 times slower (50 ms per sample against 0.1 ms): a point takes one timed pass of it once a pass
    is over 1 s (and a warm-up at this machine's speed, unpadded), not 3 to 15: the probe stays near the cost of
    its passes (a replica 1000 times slower once kept the probe silent for 7 minutes)."""
    args = [*BASE[:-2], "--emulate_costs", "0+0.1ms,0+50ms", "--balance", "fpm"]
    r = run_mpi(2, "virtual_time.py", args, timeout=180, env={"VIRTUAL_COST_S": 1e-4})
    assert r.returncode == 0, describe(r)
    points = POINT.findall(r.stdout)
    assert len(points) >= 4, r.stdout
    for _, sizes, medians, passes, capped, seconds in points:
        slowest = max(float(v) for v in medians.split(",")) / 1e3
        b = max(int(v) for v in sizes.split(","))
        if slowest > 1.0:                                   # 2 s hold one pass: capped
            assert passes == "1" and capped and float(seconds) <= slowest + b * 1e-4 + 0.01, (sizes, r.stdout)
        else:                                               # otherwise at least 2 s worth, at most 3 passes here
            assert int(passes) * slowest <= 2.0 + 1e-6 and int(passes) >= 1
    assert any(capped for *_, capped, _ in points)
