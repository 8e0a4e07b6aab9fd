"""Batch partition, gradient weights and sharding (pure math, no MPI); the dynamic policy: test_fpm_policies.py."""
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydtnn.errors import ConfigError
from pydtnn.parallel import sharding
from pydtnn.parallel.balance import probe_speeds
from pydtnn.parallel.balance.proportional import checked_sizes, partition
from pydtnn.parallel.comm import SerialComm
from pydtnn.parallel.sharding import shard, step_sizes, steps_in_epoch
from pydtnn.parallel.weighting import make_weighting, proportional, uniform

speeds_st = st.lists(st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False),
                     min_size=1, max_size=12)


def quotas(batch, speeds):
    total = sum(Fraction(v) for v in speeds)
    return [batch * Fraction(v) / total for v in speeds]


# ------------------------------------------------------------------------------------------ partition

@settings(max_examples=300, deadline=None)
@given(speeds=speeds_st, extra=st.integers(min_value=0, max_value=5000))
def test_partition_invariants(speeds, extra):
    batch = len(speeds) + extra
    b = partition(batch, speeds)
    q = quotas(batch, speeds)
    assert len(b) == len(speeds) and sum(b) == batch and min(b) >= 1
    assert all(isinstance(x, int) for x in b)
    # never more than one sample above the exact proportional share
    assert all(bi < qi + 1 for bi, qi in zip(b, q))
    # faster replicas never get fewer samples; equal speeds differ by at most one
    for i in range(len(b)):
        for j in range(len(b)):
            if speeds[i] > speeds[j]:
                assert b[i] >= b[j]
            if speeds[i] == speeds[j]:
                assert abs(b[i] - b[j]) <= 1
    # when the b_i >= 1 floor does not bind, plain largest remainder: |b_i - q_i| < 1 and it is optimal
    if min(q) >= 1:
        assert all(abs(bi - qi) < 1 for bi, qi in zip(b, q))
        floors = [int(qi) for qi in q]
        rema = [qi - f for qi, f in zip(q, floors)]
        got_extra = [bi - f for bi, f in zip(b, floors)]
        assert set(got_extra) <= {0, 1}
        if 0 in got_extra and 1 in got_extra:   # every remainder rewarded >= every remainder not rewarded
            assert min(r for r, e in zip(rema, got_extra) if e) >= max(r for r, e in zip(rema, got_extra) if not e)


@settings(max_examples=100, deadline=None)
@given(speeds=speeds_st, extra=st.integers(min_value=0, max_value=300), scale=st.sampled_from([2.0, 0.5, 1024.0]))
def test_partition_is_scale_invariant(speeds, extra, scale):
    batch = len(speeds) + extra
    assert partition(batch, speeds) == partition(batch, [v * scale for v in speeds])


@pytest.mark.parametrize("batch,speeds,expected", [
    (64, [1, 1], [32, 32]),
    (64, [1, 3], [16, 48]),
    (10, [1, 1, 1], [4, 3, 3]),           # tie on remainders: lower rank first
    (11, [1, 1, 1], [4, 4, 3]),
    (7, [2, 1, 1], [3, 2, 2]),            # quotas 3.5, 1.75, 1.75: remainders .5 < .75 = .75 -> ranks 1 and 2
    (10, [0.1, 0.2, 0.3, 0.4], [1, 2, 3, 4]),
    (3, [1, 1, 1000], [1, 1, 1]),         # B == P: one each whatever the speeds
    (4, [1, 1000], [1, 3]),               # the slow replica still gets one sample
    (12, [1, 1, 1000], [1, 1, 10]),
    (100, [1, 2, 3, 4], [10, 20, 30, 40]),
    (5, [3], [5]),
    (20, [1.0, 1e-9 + 1.0], [10, 10]),
])
def test_partition_known_cases(batch, speeds, expected):
    assert partition(batch, speeds) == expected


# ------------------------------------------------------------------------------- partition with caps

caps_case = st.lists(st.tuples(st.floats(min_value=1e-2, max_value=1e3, allow_nan=False, allow_infinity=False),
                               st.integers(min_value=1, max_value=400)), min_size=1, max_size=10)


@settings(max_examples=400, deadline=None)
@given(case=caps_case, frac=st.floats(min_value=0.0, max_value=1.0))
def test_partition_with_caps_invariants(case, frac):
    speeds, caps = [v for v, _ in case], [c for _, c in case]
    batch = len(caps) + int(frac * (sum(caps) - len(caps)))      # P <= B <= sum(caps)
    b = partition(batch, speeds, caps)
    assert sum(b) == batch and all(1 <= bi <= ci for bi, ci in zip(b, caps)), (b, caps)
    # with lam the water level (q_i = clamp(lam v_i, 1, cap_i)): a replica under its cap has b_i > lam v_i - 1,
    # one above the floor b_j < lam v_j + 1, and one at its cap b_i - 1 < lam v_i; so, pairwise:
    for i in range(len(b)):
        for j in range(len(b)):
            if b[j] > 1 and b[j] < caps[j]:
                if b[i] < caps[i]:      # nobody under its cap is starved next to another replica
                    assert Fraction(b[i] + 1) / Fraction(speeds[i]) > Fraction(b[j] - 1) / Fraction(speeds[j])
                else:                   # a replica at its cap is not served beyond its share
                    assert Fraction(b[i] - 1) / Fraction(speeds[i]) < Fraction(b[j] + 1) / Fraction(speeds[j])


@settings(max_examples=200, deadline=None)
@given(speeds=speeds_st, extra=st.integers(min_value=0, max_value=2000))
def test_partition_caps_that_do_not_bind_change_nothing(speeds, extra):
    batch = len(speeds) + extra
    plain = partition(batch, speeds)
    assert partition(batch, speeds, [x + 1 for x in plain]) == plain
    assert partition(batch, speeds, plain) == plain       # a cap equal to the share does not bind either


def test_partition_caps_known_cases_and_errors():
    assert partition(256, [1, 0.5], [120, 200]) == [120, 136]       # the fast replica's memory is full
    assert partition(256, [1, 0.5], 128) == [128, 128]              # one cap for all
    assert partition(90, [1, 1, 1], [10, 100, 100]) == [10, 40, 40]
    assert partition(4, [100, 1, 1], [3, 9, 9]) == [2, 1, 1]        # b_i >= 1 still holds
    assert partition(10, [100, 5, 5], [4, 9, 9]) == [4, 3, 3]
    with pytest.raises(ConfigError, match=r"caps \[10, 10\] .* hold 20 samples, fewer than the global batch 21"):
        partition(21, [1, 1], [10, 10])
    with pytest.raises(ConfigError, match="3 values for 2 replicas"):
        partition(20, [1, 1], [10, 10, 10])
    with pytest.raises(ConfigError, match=">= 1"):
        partition(20, [1, 1], [0, 30])


def test_partition_ties_are_deterministic():
    assert partition(5, [1, 1, 1, 1]) == [2, 1, 1, 1]
    assert partition(6, [1, 1, 1, 1]) == [2, 2, 1, 1]
    assert partition(7, [1, 1, 1, 1]) == [2, 2, 2, 1]
    assert partition(5, np.array([1.0, 1.0, 1.0, 1.0])) == [2, 1, 1, 1]


@pytest.mark.parametrize("batch,speeds,match", [
    (1, [1, 1], "smaller than the number of replicas"),
    (0, [1], ">= 1"),
    (8, [1, 0], "finite and > 0"),
    (8, [1, -2], "finite and > 0"),
    (8, [1, float("nan")], "finite and > 0"),
    (8, [1, float("inf")], "finite and > 0"),
    (8, [], "non-empty"),
    (8.5, [1], "integer"),
    (8, ["fast", 1], "numbers"),
])
def test_partition_errors(batch, speeds, match):
    with pytest.raises(ConfigError, match=match) as info:
        partition(batch, speeds)
    assert "\n" not in str(info.value)


# -------------------------------------------------------------------------------------------- weights

def test_gradient_weights():
    w = np.asarray(make_weighting("proportional")([16, 48]))
    assert w.dtype == np.float64 and np.allclose(w, [0.25, 0.75]) and w.sum() == 1.0
    assert np.allclose(make_weighting("uniform")([16, 48]), [0.5, 0.5])
    assert np.allclose(make_weighting()([1, 2, 7]), [0.1, 0.2, 0.7])
    with pytest.raises(ConfigError, match="proportional, uniform"):
        make_weighting("median")
    with pytest.raises(ConfigError):
        checked_sizes([0, 2])          # a replica without samples: its split never reaches the weights


def test_proportional_weights_give_the_global_mean_gradient():
    rng = np.random.default_rng(0)
    per_sample = rng.standard_normal((37, 5))
    sizes = partition(37, [1.0, 2.5, 7.0])
    offs = np.cumsum([0] + sizes)
    local_means = [per_sample[offs[i]:offs[i + 1]].mean(axis=0) for i in range(3)]
    w = proportional(sizes)
    assert np.allclose(sum(wi * g for wi, g in zip(w, local_means)), per_sample.mean(axis=0), rtol=1e-12)
    u = uniform(sizes)
    assert not np.allclose(sum(wi * g for wi, g in zip(u, local_means)), per_sample.mean(axis=0))


# ------------------------------------------------------------------------------------------- sharding

def epoch_indices(n, batch, sizes, steps_per_epoch=0, seed=3):
    """{rank: [indices per step]} for one epoch, computed independently per rank."""
    order = sharding.epoch_permutation(n, seed, 0)
    steps = steps_in_epoch(n, batch, steps_per_epoch)
    return order, steps, {r: [shard(order, s, batch, sizes, r, n, steps_per_epoch) for s in range(steps)]
                          for r in range(len(sizes))}


@settings(max_examples=200, deadline=None)
@given(speeds=st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=1, max_size=6),
       extra=st.integers(min_value=0, max_value=40), n=st.integers(min_value=1, max_value=400))
def test_epoch_covers_every_sample_once(speeds, extra, n):
    nrep = len(speeds)
    batch = nrep + extra
    sizes = partition(batch, speeds)
    order, steps, per_rank = epoch_indices(n, batch, sizes)
    assert steps == -(-n // batch)
    for s in range(steps):
        this = step_sizes(s, batch, sizes, n)
        assert min(this) >= 1 and all(len(per_rank[r][s]) == this[r] for r in range(nrep))
        if s < steps - 1:
            assert this == sizes
    flat = np.concatenate([per_rank[r][s] for s in range(steps) for r in range(nrep)])
    last = n - (steps - 1) * batch
    if last >= nrep:
        assert sorted(flat.tolist()) == list(range(n))       # an exact cover: no duplicate, no miss
    else:
        # documented wrap-around: the last step is padded to P samples from the start of the order
        assert len(flat) == (steps - 1) * batch + nrep
        assert set(flat.tolist()) == set(range(n))
        wrapped = np.concatenate([per_rank[r][-1] for r in range(nrep)])
        expected = order[np.arange((steps - 1) * batch, (steps - 1) * batch + nrep) % n]
        assert np.array_equal(wrapped, expected)
    # within a step, replica i's slice is the contiguous part after replicas < i
    s = steps - 1 if steps > 1 else 0
    joined = np.concatenate([per_rank[r][s] for r in range(nrep)])
    start = s * batch
    assert np.array_equal(joined, order[np.arange(start, start + len(joined)) % n])


@pytest.mark.parametrize("n,batch,speeds", [
    (101, 10, [1, 1, 1]),        # prime N
    (97, 64, [1, 1000]),         # very skewed speeds
    (7, 64, [1, 2, 3]),          # N < B
    (2, 64, [1, 2, 3]),          # N < P: one padded step
    (1, 3, [1, 1, 1]),
    (1009, 17, [1, 1000, 1, 1000, 3]),
    (65, 64, [5, 1]),            # last step holds one sample for two replicas: padded
])
def test_awkward_sizes_same_steps_everywhere(n, batch, speeds):
    sizes = partition(batch, speeds)
    order, steps, per_rank = epoch_indices(n, batch, sizes)
    assert steps == -(-n // batch)
    for r in range(len(sizes)):
        assert len(per_rank[r]) == steps                 # every rank runs the same number of steps
        assert all(len(ix) >= 1 for ix in per_rank[r])    # and never an empty local batch
    covered = set(np.concatenate([ix for r in per_rank for ix in per_rank[r]]).tolist())
    assert covered == set(range(n))


def test_short_last_step_is_repartitioned_proportionally():
    sizes = partition(64, [1, 3])                          # [16, 48]
    assert step_sizes(0, 64, sizes, 100) == [16, 48]
    assert step_sizes(1, 64, sizes, 100) == partition(36, sizes) == [9, 27]
    assert step_sizes(1, 64, sizes, 65) == [1, 1]          # one sample left, two replicas: padded
    assert np.allclose(proportional(step_sizes(1, 64, sizes, 100)), [0.25, 0.75])
    with pytest.raises(IndexError):
        step_sizes(2, 64, sizes, 100)


@pytest.mark.parametrize("n,batch,spe", [(100, 10, 3), (100, 10, 25), (7, 64, 4), (10, 4, 1)])
def test_steps_per_epoch_trims_or_tiles_full_steps(n, batch, spe):
    sizes = partition(batch, [1, 2])
    order, steps, per_rank = epoch_indices(n, batch, sizes, spe)
    assert steps == spe
    for s in range(spe):
        assert step_sizes(s, batch, sizes, n, spe) == sizes
        joined = np.concatenate([per_rank[r][s] for r in range(2)])
        assert np.array_equal(joined, order[np.arange(s * batch, (s + 1) * batch) % n])


def test_sharding_errors():
    with pytest.raises(ConfigError):
        steps_in_epoch(0, 10)
    with pytest.raises(ConfigError):
        steps_in_epoch(10, 0)
    with pytest.raises(ConfigError):
        steps_in_epoch(10, 4, -1)
    with pytest.raises(ConfigError, match="sum to"):
        step_sizes(0, 10, [3, 3], 100)
    with pytest.raises(ConfigError, match=">= 0"):
        step_sizes(0, 10, [-1, 11], 100)
    # a replica a policy lets sit out (allow_zero) holds 0, also in a short last step
    assert step_sizes(0, 10, [0, 10], 100) == [0, 10] and step_sizes(1, 10, [0, 4, 6], 15) == [0, 2, 3]
    with pytest.raises(ValueError):
        shard(np.arange(10), 0, 4, [2, 2], 2, 10)


def test_epoch_permutation_is_a_pure_function():
    a = sharding.epoch_permutation(50, 7, 2)
    assert np.array_equal(a, sharding.epoch_permutation(50, 7, 2))
    assert sorted(a.tolist()) == list(range(50))
    assert not np.array_equal(a, sharding.epoch_permutation(50, 7, 3))


# ------------------------------------------------------------------------------------------ the probe

def test_probe_speeds_serial_uses_the_median():
    durations = iter([5.0, 0.0, 0.0, 0.0])     # the warm-up is slow and must not count
    calls = []

    def fake_step():
        calls.append(1)
        d = next(durations)
        if d:
            import time
            time.sleep(0.05)

    v = probe_speeds(fake_step, SerialComm(), k=3, samples_per_call=32)
    assert len(calls) == 4
    assert v.shape == (1,) and v.dtype == np.float64 and v[0] > 32 / 0.05
    with pytest.raises(ConfigError):
        probe_speeds(fake_step, SerialComm(), k=0)


@settings(max_examples=300, deadline=None)
@given(speeds=st.one_of(speeds_st, st.lists(st.sampled_from([1.0, 0.5, 3.0, 1e-300, 7e300]), min_size=1, max_size=12)),
       extra=st.integers(min_value=0, max_value=5000))
def test_partition_integer_fast_path_equals_the_exact_water_level(speeds, extra):
    # caps that cannot bind send the same split through the fractions (the water level); without caps a
    # split whose quotas are all >= 1 is computed in integers: both must give the same sizes, ties included
    batch = len(speeds) + extra
    assert partition(batch, speeds) == partition(batch, speeds, caps=[batch] * len(speeds))
