"""The per-replica cost model t_i(b) (pydtnn.parallel.balance.cost_model): the affine fit, the monotone piecewise
model it switches to, and the model as data (checkpoints, JSON)."""
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance.cost_model import RESIDUAL_LIMIT, CostModel, ReplicaCost


def test_affine_points_give_their_line_exactly():
    cost = ReplicaCost([(b, 0.040 + 1e-4 * b) for b in (32, 64, 128, 254)])
    assert cost.kind == "affine" and cost.residual < 1e-12
    assert cost.a == pytest.approx(0.040, rel=1e-12) and cost.c == pytest.approx(1e-4, rel=1e-12)
    assert cost.seconds(100) == pytest.approx(0.050, rel=1e-12)
    assert cost.seconds(0) == 0.0                           # a replica without samples computes nothing


def test_one_point_is_the_constant_model():
    cost = ReplicaCost([(50, 0.1)])
    assert (cost.a, cost.c) == (0.0, pytest.approx(0.002)) and cost.seconds(25) == pytest.approx(0.05)


def test_noise_that_would_make_a_part_negative_pins_it_at_zero():
    # proportional times with noise: least squares would give a < 0
    cost = ReplicaCost([(10, 0.0095), (20, 0.0200), (40, 0.0405)])
    assert cost.a == 0.0 and cost.c > 0
    flat = ReplicaCost([(10, 0.030), (20, 0.029)])          # decreasing: the per-sample part pinned at 0
    assert flat.c == 0.0 and flat.a == pytest.approx(0.0295)


def test_a_saturating_device_switches_to_the_monotone_piecewise_model():
    # a GPU whose time is flat, then grows: no line fits within 5%
    pts = [(8, 0.010), (16, 0.010), (32, 0.0101), (64, 0.012), (128, 0.024), (256, 0.048)]
    cost = ReplicaCost(pts)
    assert cost.residual > RESIDUAL_LIMIT and cost.kind == "piecewise"
    for b, t in pts:                                         # through every (non-decreasing) point
        assert cost.seconds(b) == pytest.approx(t, rel=1e-12)
    assert cost.seconds(96) == pytest.approx((0.012 + 0.024) / 2)
    assert cost.seconds(512) == pytest.approx(0.048 + 2 * 0.024, rel=1e-12)    # along the last segment
    assert "piecewise linear" in cost.describe()


def test_a_point_below_an_earlier_one_is_pooled():
    cost = ReplicaCost([(10, 0.010), (20, 0.030), (30, 0.020), (40, 0.060), (80, 0.090)])
    assert cost.kind == "piecewise"
    ts = cost.seconds(np.array([10, 20, 30, 40, 80]))
    assert np.all(np.diff(ts) >= 0) and ts[1] == ts[2] == pytest.approx(0.025)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 500), st.floats(1e-5, 10.0)), min_size=1, max_size=8))
def test_every_model_is_non_decreasing_and_zero_at_zero(points):
    cost = ReplicaCost(points)
    b = np.arange(0, 1200)
    t = cost.seconds(b)
    assert t[0] == 0.0 and np.all(np.isfinite(t)) and np.all(np.diff(t) >= -1e-15 * np.abs(t[1:]))
    assert np.all(t[1:] > 0)


def test_adding_and_scaling_points():
    cost = ReplicaCost([(10, 0.01), (20, 0.02)])
    cost.add(20, 0.03)                                      # a new point at the same b replaces the old
    assert cost.points == {10: 0.01, 20: 0.03}
    cost.scale(2.0)                                         # a device twice as slow: every point
    assert cost.points == {10: 0.02, 20: 0.06}
    with pytest.raises(ConfigError, match=r"b an integer in \[1, 10\^9\] and seconds a finite number"):
        cost.add(0, 1.0)
    with pytest.raises(ConfigError, match="finite number"):
        cost.add(5, float("nan"))


def test_the_model_is_plain_data(tmp_path):
    model = CostModel([ReplicaCost([(8, 0.04), (64, 0.05)], flagged=[(8, 0.9)]),
                       ReplicaCost([(8, 0.01), (64, 0.08)])], ["gpu", "cpu"])
    state = json.loads(json.dumps(model.state_dict()))       # JSON-able: what checkpoints hold
    again = CostModel.from_state(state)
    assert again.devices == ["gpu", "cpu"] and again.replicas[0].flagged == [(8, 0.9)]
    assert np.array_equal(again.seconds([100, 30]), model.seconds([100, 30]))
    model.save(tmp_path / "m.json")
    assert np.array_equal(CostModel.load(tmp_path / "m.json").seconds([7, 9]), model.seconds([7, 9]))
    assert model.makespan([100, 30]) == max(model.seconds([100, 30]))
    lines = model.describe()
    assert lines[0].startswith("replica 0 (gpu): points b:ms 8:40 64:50; affine") and "flagged" in lines[0]


GOOD = {"format": "pydtnn-cost-model/1", "devices": ["cpu", "gpu"],
        "replicas": [{"points": [[8, 0.01], [16, 0.02]]}, {"points": [[8, 0.04]], "flagged": [[8, 0.5]]}]}


def _bad(**change):
    state = json.loads(json.dumps(GOOD))
    for where, value in change.items():
        target, *path = where.split("__")
        node = state if target == "top" else state["replicas"][int(target[1:])]
        for key in path[:-1]:
            node = node[int(key) if key.isdigit() else key]
        last = path[-1]
        node[int(last) if last.isdigit() else last] = value
    return state


@pytest.mark.parametrize("state, needle", [
    ({"format": "other"}, "field 'format' must be 'pydtnn-cost-model/1', got 'other'"),
    ([GOOD], "field '(top level)' must be an object"),
    ("pydtnn-cost-model/1", "field '(top level)' must be an object"),
    (_bad(top__replicas=[]), "field 'replicas' must be a non-empty list"),
    (_bad(top__replicas={"0": {}}), "field 'replicas' must be a non-empty list"),
    (_bad(top__devices="cpugpu"), "field 'devices' must be a list of 2 of cpu / gpu"),     # not letter by letter
    (_bad(top__devices=["cpu", "tpu"]), "field 'devices' must be a list of 2 of cpu / gpu"),
    (_bad(top__devices=["cpu"]), "field 'devices' must be a list of 2"),
    (_bad(top__replicas=[["points"], {"points": [[1, 1.0]]}]), "field 'replicas[0]' must be an object"),
    (_bad(r1__points="x"), "field 'replicas[1].points' must be a non-empty list"),
    (_bad(r1__points=[]), "field 'replicas[1].points' must be a non-empty list"),
    (_bad(r0__points__0=[1e300, 0.01]), "field 'replicas[0].points[0]' must be [b, seconds]"),
    (_bad(r0__points__0=[10 ** 300, 0.01]), "field 'replicas[0].points[0]'"),
    (_bad(r0__points__0=[8.5, 0.01]), "field 'replicas[0].points[0]'"),
    (_bad(r0__points__0=[True, 0.01]), "field 'replicas[0].points[0]'"),
    (_bad(r0__points__1=[16, float("inf")]), "field 'replicas[0].points[1]'"),
    (_bad(r0__points__1=[16, 1e300]), "field 'replicas[0].points[1]'"),
    (_bad(r0__points__1=[16, -1.0]), "field 'replicas[0].points[1]'"),
    (_bad(r0__points__1=[16, "0.02"]), "field 'replicas[0].points[1]'"),
    (_bad(r0__points__1=[16]), "field 'replicas[0].points[1]'"),
    (_bad(r1__flagged="x"), "field 'replicas[1].flagged' must be a list"),
    (_bad(r1__flagged__0=[8, float("nan")]), "field 'replicas[1].flagged[0]'"),
])
def test_a_bad_model_is_one_line_naming_the_field(state, needle):
    with pytest.raises(ConfigError) as e:
        CostModel.from_state(state, "checkpoint c.npz")
    assert str(e.value).startswith("checkpoint c.npz: " + needle) and "\n" not in str(e.value), str(e.value)


def test_the_documented_ranges_are_accepted_at_their_ends():
    state = _bad(r0__points=[[1, 1e-300], [10 ** 9, 86400.0]])
    assert CostModel.from_state(state).replicas[0].points == {1: 1e-300, 10 ** 9: 86400.0}


def test_a_file_is_read_up_to_its_limit():
    with pytest.raises(ConfigError, match="cannot read the cost model /dev/zero: larger than 64 MiB"):
        CostModel.load("/dev/zero")


def test_noisy_points_are_doubted():
    steady = ReplicaCost([(8, 0.010), (16, 0.018), (32, 0.034), (64, 0.066)])
    assert steady.doubts() == []
    falling = ReplicaCost([(8, 0.150), (23, 0.212), (32, 0.180), (64, 0.400)])    # b=23 above b=32: noise
    assert falling.doubts()[0] == "its time falls as b grows (b=23: 212 ms, b=32: 180 ms)"
    scattered = ReplicaCost([(8, 0.100), (16, 0.020), (32, 0.200), (64, 0.050)])
    assert any("affine fit misses a point by" in d for d in scattered.doubts()) and scattered.residual > 0.25
    model = CostModel([steady, falling])
    assert model.doubts() == ["replica 1: " + "; ".join(falling.doubts())]


def test_an_unreadable_file_is_one_line(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="cannot read the cost model"):
        CostModel.load(tmp_path / "bad.json")
