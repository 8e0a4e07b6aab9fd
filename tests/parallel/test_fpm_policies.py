"""The FPM policies without MPI: the probe's model building (pydtnn.parallel.balance.fpm_probe) on a probe of known
costs, the fpm policy, the dynamic policy's refits (convergence, noise, stragglers, checkpoints), and the
GPU memory cap's arithmetic (pydtnn.parallel.balance.probe)."""
import json

import numpy as np
import pytest

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance.cost_model import CostModel
from pydtnn.parallel.balance.fpm_partition import equal_finish
from pydtnn.parallel.balance.fpm_probe import MAX_WARMED, build_model, grown_buckets, probe_sizes
from pydtnn.parallel.balance.policies import DynamicPolicy, make_policy
from pydtnn.parallel.balance.step_report import StepReport
from pydtnn.parallel.balance.probe import memory_cap

GPU_LIKE = CostModel.affine([0.040, 0.0, 0.0], [1e-4, 1.5e-3, 1.5e-3], ["gpu", "cpu", "cpu"])


class KnownProbe:
    """A probe whose replicas take exactly `truth`'s seconds (times `noise`, a lognormal factor)."""

    def __init__(self, truth, global_batch, caps=None, noise=0.0, seed=0, spike=None):
        self.truth, self.global_batch, self.caps = truth, global_batch, caps
        self.devices = truth.devices
        self.rng = np.random.default_rng(seed)
        self.noise, self.spike = noise, spike
        self.measured, self.warmed = [], []

    def measure(self, sizes):
        self.measured.append(list(sizes))
        t = self.truth.seconds(sizes) * np.exp(self.noise * self.rng.standard_normal(len(sizes)))
        flagged = [[5.0] if self.spike == (i, b) else [] for i, b in enumerate(sizes)]
        return t, flagged

    def warm(self, sizes_per_replica):
        self.warmed.append(sizes_per_replica)


def test_probe_sizes_are_geometric_up_to_the_top():
    assert probe_sizes(254) == [31, 63, 127, 254]
    assert probe_sizes(254, bucket=8) == [24, 56, 120, 248]
    assert probe_sizes(3) == [1, 3]
    assert grown_buckets(256, None, [1, 1, 1], [8, 1, 1]) == [8, 1, 1]
    assert grown_buckets(4096, None, [1, 1], [8, 1])[0] * MAX_WARMED >= 4095


def test_build_model_finds_known_affine_costs_and_their_optimal_split():
    probe = KnownProbe(GPU_LIKE, 256)
    model, split, lines = build_model(probe, [1, 1, 1], [1, 1, 1])
    assert all(len(r.points) >= 4 for r in model.replicas)              # at least 4 points per replica
    for r, a, c in zip(model.replicas, [0.040, 0, 0], [1e-4, 1.5e-3, 1.5e-3]):
        assert r.kind == "affine" and r.a == pytest.approx(a, abs=1e-12) and r.c == pytest.approx(c, rel=1e-9)
    assert split == equal_finish(256, GPU_LIKE) == [180, 38, 38]
    assert probe.measured[:4] == [[31, 31, 31], [63, 63, 63], [127, 127, 127], [254, 254, 254]]
    assert probe.measured[4] == [180, 38, 38] and len(probe.measured) == 5     # balanced at once: one round
    assert "max/min 1.018" in lines[0] and "makespan 58 ms" in lines[-1]


def test_refinement_stops_after_its_rounds_on_a_model_it_cannot_learn():
    class Drifting(KnownProbe):              # every measurement 20% slower than the last on replica 0
        def measure(self, sizes):
            t, f = super().measure(sizes)
            t[0] *= 1.2 ** len(self.measured)
            return t, f
    probe = Drifting(GPU_LIKE, 256)
    _, _, lines = build_model(probe, [1, 1, 1], [1, 1, 1], rounds=3)
    assert len(probe.measured) == 4 + 3 and sum("probe round" in line for line in lines) == 3


def test_gpu_shapes_are_warmed_and_the_split_holds_a_bucket():
    probe = KnownProbe(GPU_LIKE, 256)
    model, split, lines = build_model(probe, [1, 1, 1], [8, 1, 1])
    assert probe.warmed == [[list(range(8, 249, 8)), [], []]] and "warmed GPU shapes" in lines[0]
    assert split[0] % 8 == 0 and all(b % 8 == 0 for b in model.replicas[0].points)


def test_flagged_outliers_are_kept_for_the_printout_not_fitted():
    probe = KnownProbe(GPU_LIKE, 256, spike=(1, 63))
    model, _, _ = build_model(probe, [1, 1, 1], [1, 1, 1])
    assert model.replicas[1].flagged == [(63, 5.0)] and model.replicas[1].residual < 1e-9
    assert "flagged, not fitted: 63:5000" in model.describe()[1]


def test_the_fpm_policy_probes_solves_describes_and_saves():
    policy = make_policy("fpm", options={"bucket": 8})
    policy.bind(0, 3, ["gpu", "cpu", "cpu"])
    assert policy.initial_sizes(256, 3, None) == [86, 85, 85]
    split = policy.probe_costs(KnownProbe(GPU_LIKE, 256))
    assert split[0] % 8 == 0 and policy.describe()[0].startswith("cost model (fpm")
    again = make_policy("fpm")
    again.bind(0, 3, ["gpu", "cpu", "cpu"])
    again.load_state_dict(json.loads(json.dumps(policy.state_dict())))
    assert again.initial_sizes(256, 3, None) == policy.solve()          # a restored model solves at once
    with pytest.raises(ConfigError, match="cost model has 3 replicas, this run 2"):
        wrong = make_policy("fpm")
        wrong.bind(0, 2)
        wrong.load_state_dict(policy.state_dict())


def test_allow_zero_is_checked():
    policy = make_policy("fpm", options={"allow_zero": "0:2"})
    policy.bind(0, 3)
    assert policy.allow_zero == (0, 2) and policy.minimum() == [0, 1, 0]
    with pytest.raises(ConfigError, match="replicas are 0..2"):
        make_policy("fpm", options={"allow_zero": 5}).bind(0, 3)


# --------------------------------------------------------------------------------------- dynamic refits

def run_dynamic(truth_at, steps, B=120, P=3, interval=5, noise=0.0, seed=0, probe=False, warmup=None, **options):
    """Drive a dynamic policy as DataParallel does: (with `probe`, its probe first, as noisy) then every step
    a report of the true costs (truth_at(step): a CostModel) at the split in force, times lognormal noise;
    returns (policy, [(step, new split)])."""
    rng = np.random.default_rng(seed)
    policy = DynamicPolicy(interval=interval, probe=probe, **options)
    policy.bind(0, P)
    policy.sizes = policy.initial_sizes(B, P, None)
    if probe:
        policy.sizes = policy.probe_costs(KnownProbe(truth_at(0), B, noise=noise / np.sqrt(5), seed=seed + 100))
    changes = []
    for s in range(steps):
        sizes = list(policy.sizes)
        t = truth_at(s).seconds(sizes) * np.exp(noise * rng.standard_normal(P))
        warm = warmup(s) if warmup else (False,) * P
        report = StepReport(tuple(sizes), tuple(t), (0.0,) * P, float(t.max()), tuple(warm))
        new = policy.after_step(s, report)
        if new is not None:
            policy.sizes = list(new)
            changes.append((s, list(new)))
    return policy, changes


AFFINE3 = CostModel.affine([0.030, 0.0, 0.0], [2e-4, 1e-3, 2e-3])


def test_dynamic_refits_reach_the_optimal_split_without_a_probe():
    policy, changes = run_dynamic(lambda s: AFFINE3, 60)
    best = AFFINE3.makespan(equal_finish(120, AFFINE3))
    # within the hysteresis of the optimum, after at most a few re-splits, the first at the first interval
    assert AFFINE3.makespan(policy.sizes) <= 1.05 * best < 0.8 * AFFINE3.makespan([40, 40, 40])
    assert changes[0][0] == 4 and len(changes) <= 4, changes


@pytest.mark.parametrize("seed", range(5))
def test_dynamic_does_not_flap_under_noise(seed):
    # 10% lognormal noise per step (the probe's points, medians of 5 steps, 4.5%), 200 decisions: a handful
    # of corrections of a few samples (of 120) at most, and the split stays near the optimum
    best = AFFINE3.makespan(equal_finish(120, AFFINE3))
    policy, changes = run_dynamic(lambda s: AFFINE3, 1000, noise=0.10, seed=seed, probe=True)
    assert len(changes) <= 6, changes
    assert all(max(abs(a - b) for a, b in zip(x, y)) <= 4 for (_, x), (_, y) in zip(changes, changes[1:]))
    assert AFFINE3.makespan(policy.sizes) <= 1.05 * best


def test_without_hysteresis_it_would_flap():
    # the same runs with hysteresis 0 re-split several times as often: the test above is meaningful
    def count(**kw):
        return sum(len(run_dynamic(lambda s: AFFINE3, 1000, noise=0.10, seed=seed, probe=True, **kw)[1])
                   for seed in range(5))
    assert count(hysteresis=0.0) >= 3 * max(count(), 1)


def test_dynamic_follows_a_straggler_within_three_intervals_and_back():
    slow = CostModel.affine([0.030, 0.0, 0.0], [2e-4, 3e-3, 2e-3])           # replica 1 three times slower
    truth = lambda s: slow if 100 <= s < 200 else AFFINE3                     # noqa: E731
    policy, changes = run_dynamic(truth, 300, noise=0.02, seed=3)
    after = [c for c in changes if c[0] >= 100]
    assert after and after[0][0] <= 100 + 3 * 5, changes                     # recovered within 3 intervals
    during = [c for c in after if c[0] < 200][-1][1]
    assert slow.makespan(during) <= 1.05 * slow.makespan(equal_finish(120, slow))
    back = [c for c in changes if c[0] >= 200]
    assert back and back[0][0] <= 200 + 3 * 5
    assert AFFINE3.makespan(policy.sizes) <= 1.05 * AFFINE3.makespan(equal_finish(120, AFFINE3))


def test_warm_up_steps_are_left_out():
    # three steps of every interval take 50x (compiling, a cuDNN plan): flagged as warm-ups, the model never
    # sees them and decides as on clean steps; unflagged, they are the interval's median and mislead it
    spiked = CostModel.affine([1.5, 0.0, 0.0], [1e-2, 1e-3, 2e-3])
    truth = lambda s: spiked if s % 5 < 3 else AFFINE3                       # noqa: E731
    clean, clean_changes = run_dynamic(lambda s: AFFINE3, 60)
    flagged, flagged_changes = run_dynamic(truth, 60, warmup=lambda s: (s % 5 < 3,) * 3)
    assert flagged_changes == clean_changes and flagged.sizes == clean.sizes
    misled, _ = run_dynamic(truth, 60)
    assert misled.sizes != clean.sizes


def test_dynamic_is_deterministic_and_checkpointable():
    a, ca = run_dynamic(lambda s: AFFINE3, 200, noise=0.2, seed=9)
    b, cb = run_dynamic(lambda s: AFFINE3, 200, noise=0.2, seed=9)
    assert ca == cb and a.sizes == b.sizes
    c = DynamicPolicy(interval=5, probe=False)
    c.bind(0, 3)
    c.initial_sizes(120, 3, None)
    c.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert c.n_rebalances == a.n_rebalances and c.solve() == a.solve()


def test_a_constant_model_balancers_checkpoint_still_loads():
    old = {"sizes": [40, 80], "ema": [400.0, 1600.0], "window": [], "n_observed": 10, "n_rebalances": 1}
    policy = DynamicPolicy(interval=5)
    policy.bind(0, 2)
    policy.initial_sizes(120, 2, None)
    policy.load_state_dict(old)
    assert policy.model.replicas[0].seconds(40) == pytest.approx(0.1) and policy.solve() == [24, 96]


def test_plain_lists_of_seconds_per_sample_still_work():
    policy = DynamicPolicy(interval=1, probe=False)
    policy.bind(0, 2)
    policy.sizes = policy.initial_sizes(30, 2, None)
    assert policy.after_step(0, [0.002, 0.001]) == [10, 20]


# ------------------------------------------------------------------------------------- GPU memory caps

def test_the_memory_cap_is_the_largest_batch_that_fits():
    held = {}

    def run(b):
        held["now"] = 1e9 + 2e6 * b                     # 1 GB fixed, 2 MB per sample (a pool keeps its peak)

    def memory():
        return held["now"], 30e9 - held["now"]          # a 30 GB device
    cap = memory_cap(memory, run, 16, 64)
    assert cap == int((0.9 * 30e9 - 1e9) // 2e6)
    assert memory_cap(lambda: (1e9, 1e9), lambda b: None, 8, 64) == 0        # no growth: no cap
