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
    with pytest.raises(ConfigError, match="b >= 1 and finite seconds > 0"):
        cost.add(0, 1.0)
    with pytest.raises(ConfigError, match="finite seconds"):
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


@pytest.mark.parametrize("state, needle", [
    ({"format": "other"}, "not a cost model"),
    ({"format": "pydtnn-cost-model/1", "replicas": [{"points": [[1, -1.0]]}]}, "finite seconds > 0"),
    ({"format": "pydtnn-cost-model/1", "replicas": [{"points": "x"}]}, "not a cost model of a replica"),
    ({"format": "pydtnn-cost-model/1", "replicas": [{"points": [[1, 1.0]]}], "devices": ["cpu", "gpu"]},
     "1 replicas with 2 devices"),
])
def test_a_bad_model_is_one_line(state, needle):
    with pytest.raises(ConfigError) as e:
        CostModel.from_state(state, "checkpoint c.npz")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_an_unreadable_file_is_one_line(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="cannot read the cost model"):
        CostModel.load(tmp_path / "bad.json")
