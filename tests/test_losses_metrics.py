"""Losses and metrics against known values, extreme logits included (no NaN or Inf)."""
import math

import numpy as np
import pytest

from pydtnn import metrics
from pydtnn.losses import BinaryCrossEntropy, CategoricalCrossEntropy, get_loss
from pydtnn.errors import ConfigError

Y = np.array([[1.0, 0, 0], [0, 0, 1.0]])


def test_cce_known_value():
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
    value, dy = CategoricalCrossEntropy()(p, Y)
    assert value == pytest.approx(-(math.log(0.7) + math.log(0.6)) / 2)
    assert dy[0, 0] == pytest.approx(-1 / 0.7 / 2) and dy[0, 1] == 0


def test_cce_from_logits_matches_softmax_and_gradient():
    z = np.array([[2.0, 1.0, -1.0], [0.5, 0.0, 3.0]])
    value, p, dz = CategoricalCrossEntropy().from_logits(z, Y)
    e = np.exp(z)
    ref = e / e.sum(axis=1, keepdims=True)
    assert np.allclose(p, ref)
    assert value == pytest.approx(-np.log(ref[Y == 1]).mean())
    assert np.allclose(dz, (ref - Y) / 2)
    # finite differences of the value
    eps = 1e-6
    for i, j in [(0, 0), (1, 2), (1, 1)]:
        zp, zm = z.copy(), z.copy()
        zp[i, j] += eps
        zm[i, j] -= eps
        num = (CategoricalCrossEntropy().from_logits(zp, Y)[0] - CategoricalCrossEntropy().from_logits(zm, Y)[0]) / 2e-6
        assert dz[i, j] == pytest.approx(num, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cce_extreme_logits(dtype):
    z = np.array([[1e4, -1e4, 0.0], [-1e4, 0.0, 1e4]], dtype=dtype)
    value, p, dz = CategoricalCrossEntropy().from_logits(z, Y.astype(dtype))
    assert np.isfinite(value) and np.all(np.isfinite(p)) and np.all(np.isfinite(dz))
    assert value == pytest.approx(0.0, abs=1e-6)
    wrong = np.array([[-1e4, 1e4, 0.0]], dtype=dtype)
    value, p, dz = CategoricalCrossEntropy().from_logits(wrong, Y[:1].astype(dtype))
    assert value == pytest.approx(2e4, rel=1e-6) and np.all(np.isfinite(dz))
    # the unfused form clips probabilities instead of taking log(0)
    value, dy = CategoricalCrossEntropy()(np.array([[0.0, 1.0, 0.0]]), Y[:1])
    assert np.isfinite(value) and np.all(np.isfinite(dy))


def test_bce_known_value_and_logits():
    yt = np.array([[1.0, 0.0], [0.0, 1.0]])
    p = np.array([[0.9, 0.2], [0.4, 0.7]])
    value, dy = BinaryCrossEntropy()(p, yt)
    ref = -np.mean(yt * np.log(p) + (1 - yt) * np.log(1 - p))
    assert value == pytest.approx(ref)
    assert value == pytest.approx(-(math.log(0.9) + math.log(0.8) + math.log(0.6) + math.log(0.7)) / 4)
    z = np.log(p / (1 - p))
    v2, p2, dz = BinaryCrossEntropy().from_logits(z, yt)
    assert v2 == pytest.approx(ref) and np.allclose(p2, p)
    assert np.allclose(dz, (p - yt) / 4)
    assert np.allclose(dy * p * (1 - p), dz)          # chain rule through the sigmoid


def test_bce_extreme_logits():
    z = np.array([[800.0, -800.0]])
    value, p, dz = BinaryCrossEntropy().from_logits(z, np.array([[1.0, 0.0]]))
    assert value == pytest.approx(0.0, abs=1e-12) and np.all(np.isfinite(dz))
    value, p, dz = BinaryCrossEntropy().from_logits(z, np.array([[0.0, 1.0]]))
    assert value == pytest.approx(800.0) and np.all(np.isfinite(dz))


def test_metrics_known_values():
    p = np.array([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2]])
    assert metrics.categorical_accuracy(p, Y) == 0.5
    # hinge: sample 0: max(0, 0.2 - 0.7 + 1) = 0.5; sample 1: max(0, 0.5 - 0.2 + 1) = 1.3
    assert metrics.categorical_hinge(p, Y) == pytest.approx(0.9)
    assert metrics.categorical_mse(p, Y) == pytest.approx((0.3 ** 2 + 0.8 ** 2) / 2)
    assert metrics.categorical_mae(p, Y) == pytest.approx((0.3 + 0.8) / 2)
    assert metrics.regression_mse(p, Y) == pytest.approx(np.mean((p - Y) ** 2))
    assert metrics.regression_mae(np.array([[1.0], [3.0]]), np.array([[2.0], [1.0]])) == pytest.approx(1.5)


def test_unknown_names():
    with pytest.raises(ConfigError, match="unknown loss"):
        get_loss("hinge")
    with pytest.raises(ConfigError, match="unknown metric"):
        metrics.get_metric("f1")
