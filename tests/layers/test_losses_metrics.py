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


# --- per-position cross entropy and the regression losses (issue 21) ---------------------------------

def test_cce_per_position_is_the_mean_over_tokens():
    """(N, T, K) logits: the same value and gradient as the (N*T, K) flattening, as torch's cross_entropy
    on (N*T, K) with mean reduction."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((2, 3, 5))
    labels = rng.integers(0, 5, (2, 3))
    from pydtnn.targets import one_hot
    y = one_hot(labels, 5, np.float64)
    assert y.shape == (2, 3, 5) and (y.argmax(-1) == labels).all()
    value, p, dz = CategoricalCrossEntropy().from_logits(z, y)
    flat_value, flat_p, flat_dz = CategoricalCrossEntropy().from_logits(z.reshape(6, 5), y.reshape(6, 5))
    assert value == pytest.approx(flat_value, rel=1e-14)
    np.testing.assert_allclose(dz.reshape(6, 5), flat_dz, rtol=1e-14)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    assert value == pytest.approx(-np.take_along_axis(log_p, labels[..., None], -1).mean(), rel=1e-13)
    assert metrics.categorical_accuracy(p, y) == pytest.approx((z.argmax(-1) == labels).mean())


@pytest.mark.parametrize("name", ["mean_squared_error", "mean_absolute_error"])
def test_regression_losses_are_means_over_all_elements(name):
    rng = np.random.default_rng(1)
    pred, target = rng.standard_normal((3, 2, 4, 5)), rng.standard_normal((3, 2, 4, 5))
    value, grad = get_loss(name)(pred, target)
    diff = pred - target
    if name == "mean_squared_error":
        assert value == pytest.approx((diff ** 2).mean(), rel=1e-14)
        np.testing.assert_allclose(grad, 2 * diff / diff.size, rtol=1e-14)
    else:
        assert value == pytest.approx(np.abs(diff).mean(), rel=1e-14)
        np.testing.assert_allclose(grad, np.sign(diff) / diff.size, rtol=1e-14)
    assert metrics.get_metric(name)(pred, target) == pytest.approx(value, rel=1e-14)   # the matching metric
    eps = 1e-6
    for idx in [(0, 0, 0, 0), (2, 1, 3, 4)]:
        up, down = pred.copy(), pred.copy()
        up[idx] += eps
        down[idx] -= eps
        numeric = (get_loss(name)(up, target)[0] - get_loss(name)(down, target)[0]) / (2 * eps)
        assert grad[idx] == pytest.approx(numeric, rel=1e-6)


@pytest.mark.oracle
@pytest.mark.parametrize("name,torch_name", [("mean_squared_error", "MSELoss"), ("mean_absolute_error", "L1Loss")])
def test_regression_losses_match_torch(name, torch_name):
    torch = pytest.importorskip("torch", reason="PyTorch oracle: pip install torch==2.13.0")
    rng = np.random.default_rng(2)
    pred, target = rng.standard_normal((4, 3, 2)), rng.standard_normal((4, 3, 2))
    tp = torch.tensor(pred, requires_grad=True)
    tv = getattr(torch.nn, torch_name)()(tp, torch.tensor(target))
    tv.backward()
    value, grad = get_loss(name)(pred, target)
    assert value == pytest.approx(tv.item(), rel=1e-14)
    np.testing.assert_allclose(grad, tp.grad.numpy(), rtol=1e-14)


@pytest.mark.oracle
def test_cce_per_token_matches_torch():
    torch = pytest.importorskip("torch", reason="PyTorch oracle: pip install torch==2.13.0")
    rng = np.random.default_rng(3)
    z, labels = rng.standard_normal((2, 4, 6)), rng.integers(0, 6, (2, 4))
    from pydtnn.targets import one_hot
    value, _, dz = CategoricalCrossEntropy().from_logits(z, one_hot(labels, 6, np.float64))
    tz = torch.tensor(z, requires_grad=True)
    tv = torch.nn.functional.cross_entropy(tz.reshape(-1, 6), torch.tensor(labels).reshape(-1))
    tv.backward()
    assert value == pytest.approx(tv.item(), rel=1e-13)
    np.testing.assert_allclose(dz, tz.grad.numpy(), rtol=1e-12, atol=1e-15)
