"""The equal-finish integer partition (pydtnn.parallel.balance.fpm_partition): optimal against brute force, within
caps, with replicas allowed 0, and GPU shape buckets."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance.proportional import partition
from pydtnn.parallel.balance.cost_model import CostModel, ReplicaCost
from pydtnn.parallel.balance.fpm_partition import equal_finish


def brute_force(B, model, lo, hi, allowed=None):
    """The smallest makespan over every split (each b_i in [lo_i, hi_i], and in allowed_i when given)."""
    ranges = [[v for v in range(l, h + 1) if allowed is None or allowed[i](v)] for i, (l, h) in enumerate(zip(lo, hi))]
    return min(model.makespan(s) for s in itertools.product(*ranges) if sum(s) == B)


cost_st = st.one_of(
    st.tuples(st.floats(0.0, 0.1), st.floats(1e-4, 1e-2)).map(lambda ac: ReplicaCost([(1, ac[0] + ac[1]),
                                                                                     (8, ac[0] + 8 * ac[1])])),
    st.lists(st.tuples(st.integers(1, 30), st.floats(1e-3, 1.0)), min_size=3, max_size=5).map(ReplicaCost))


@settings(max_examples=150, deadline=None)
@given(costs=st.lists(cost_st, min_size=1, max_size=3), extra=st.integers(0, 14), data=st.data())
def test_the_greedy_split_is_optimal(costs, extra, data):
    P = len(costs)
    B = P + extra
    model = CostModel(costs)
    caps = data.draw(st.one_of(st.none(), st.lists(st.integers(1, B), min_size=P, max_size=P)))
    if caps is not None and sum(caps) < B:
        caps = None
    zero = data.draw(st.lists(st.booleans(), min_size=P, max_size=P))
    minimum = [0 if z and P > 1 else 1 for z in zero]
    sizes = equal_finish(B, model, caps, minimum)
    hi = caps or [B] * P
    assert sum(sizes) == B and all(m <= b <= h for b, m, h in zip(sizes, minimum, hi))
    best = brute_force(B, model, minimum, hi)
    assert model.makespan(sizes) <= best * (1 + 1e-12)


def test_the_constant_model_splits_in_proportion():
    # one point each: t = b / v; equal finish times are b_i proportional to v_i (up to rounding)
    speeds = [1.0, 2.0, 4.0, 1.5]
    model = CostModel([ReplicaCost([(10, 10 / v)]) for v in speeds])
    sizes = equal_finish(170, model)
    assert sum(sizes) == 170 and max(abs(b - q) for b, q in zip(sizes, partition(170, speeds))) <= 1


def test_a_fixed_cost_moves_samples_to_the_replica_that_pays_it():
    # the case: a GPU with a large fixed part and little per sample, two CPUs
    model = CostModel.affine([0.040, 0.0, 0.0], [1e-4, 1.5e-3, 1.5e-3], ["gpu", "cpu", "cpu"])
    sizes = equal_finish(256, model)
    assert sizes == [180, 38, 38]                  # 40 + 0.1 b0 = 1.5 b1, b0 + 2 b1 = 256
    assert model.makespan(sizes) == pytest.approx(0.058, rel=1e-9)
    # a split proportional to the speeds measured at B / P (the constant model) is 1.43x slower here
    at = 256 // 3
    speeds = [at / float(model.replicas[i].seconds(at)) for i in range(3)]
    assert model.makespan(partition(256, speeds)) / model.makespan(sizes) > 1.4


def test_a_replica_allowed_zero_gets_none_when_it_only_slows_the_step():
    model = CostModel.affine([2.0, 0.0, 0.0], [1e-4, 1e-3, 1e-3])
    assert equal_finish(100, model, minimum=[0, 1, 1]) == [0, 50, 50]
    assert equal_finish(100, model) == [1, 50, 49]                 # without the allowance it keeps one


def test_caps_bind_and_the_others_share_the_rest():
    model = CostModel.affine([0.0, 0.0], [1e-3, 4e-3])
    assert equal_finish(100, model) == [80, 20]
    assert equal_finish(100, model, caps=[60, 100]) == [60, 40]


def test_gpu_buckets_are_multiples_and_the_best_multiple():
    model = CostModel.affine([0.040, 0.0, 0.0], [1e-4, 1.5e-3, 1.5e-3], ["gpu", "cpu", "cpu"])
    sizes = equal_finish(256, model, buckets=[8, 1, 1])
    assert sizes[0] % 8 == 0 and sum(sizes) == 256
    mult8 = lambda v: v % 8 == 0                                      # noqa: E731
    best = brute_force(256, model, [8, 1, 1], [248, 248, 248], [mult8, lambda v: True, lambda v: True])
    assert model.makespan(sizes) == pytest.approx(best, rel=1e-12)
    # every replica bucketed: the largest holds the remainder
    two = equal_finish(100, CostModel.affine([0.0, 0.0], [1e-3, 1e-3]), buckets=[8, 8])
    assert sum(two) == 100 and sorted(v % 8 for v in two) == [0, 4]


@pytest.mark.parametrize("kw, needle", [
    (dict(B=2, minimum=[1, 1, 1]), "smaller than the number of replicas"),
    (dict(B=30, caps=[5, 5, 5]), "hold 15 samples, fewer than the global batch 30"),
])
def test_infeasible_splits_are_one_line(kw, needle):
    model = CostModel.affine([0.0] * 3, [1e-3] * 3)
    with pytest.raises(ConfigError, match=needle):
        equal_finish(kw.pop("B"), model, **kw)


def test_many_replicas_at_once():
    rng = np.random.default_rng(0)
    model = CostModel.affine(rng.uniform(0, 0.01, 2048).tolist(), rng.uniform(1e-4, 1e-3, 2048).tolist())
    sizes = equal_finish(1 << 16, model)
    t = model.seconds(sizes)
    # equal finish: no replica could take one more sample and still finish before the slowest
    nxt = np.array([model.replicas[i].seconds(b + 1) for i, b in enumerate(sizes)])
    assert sum(sizes) == 1 << 16 and nxt.min() >= t.max() * (1 - 1e-12)
