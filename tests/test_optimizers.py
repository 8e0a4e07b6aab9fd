"""Each optimizer's first steps against the closed-form update, computed by hand on scalars."""
import math

import numpy as np
import pytest

from pydtnn.errors import ConfigError
from pydtnn.optimizers import SGD, Adam, Nadam, RMSProp, get_optimizer

W0, G = 1.0, [0.5, -0.25, 0.125]


def run(opt, grads=G, w0=W0, dtype=np.float64):
    w = np.array([w0], dtype=dtype)
    out = []
    for g in grads:
        opt.step(w, np.array([g], dtype=dtype))
        out.append(float(w[0]))
    return out


def test_sgd_plain():
    assert run(SGD(learning_rate=0.1, momentum=0.0)) == pytest.approx([0.95, 0.975, 0.9625])


def test_sgd_momentum():
    # v1 = -0.05, w1 = 0.95; v2 = 0.9*-0.05 + 0.025 = -0.02, w2 = 0.93; v3 = -0.018 - 0.0125 = -0.0305
    assert run(SGD(learning_rate=0.1, momentum=0.9)) == pytest.approx([0.95, 0.93, 0.8995])


def test_sgd_nesterov():
    # w += mu*v - lr*g: step1: v=-0.05, w = 1 - 0.045 - 0.05 = 0.905; step2: v = -0.02, w = 0.905 - 0.018 + 0.025
    assert run(SGD(learning_rate=0.1, momentum=0.9, nesterov=True), G[:2]) == pytest.approx([0.905, 0.912])


def test_sgd_decay():
    # g' = g + decay*w = 0.5 + 0.1 = 0.6 -> w = 1 - 0.06
    assert run(SGD(learning_rate=0.1, momentum=0.0, decay=0.1), G[:1]) == pytest.approx([0.94])


def test_rmsprop():
    lr, rho, eps = 0.01, 0.9, 1e-7
    c1 = 0.1 * 0.25
    w1 = 1 - lr * 0.5 / (math.sqrt(c1) + eps)
    c2 = 0.9 * c1 + 0.1 * 0.0625
    w2 = w1 + lr * 0.25 / (math.sqrt(c2) + eps)
    assert run(RMSProp(learning_rate=lr, rho=rho, epsilon=eps), G[:2]) == pytest.approx([w1, w2], rel=1e-12)


def _adam_reference(lr, b1, b2, eps, grads, nadam=False):
    w, m, v, out = W0, 0.0, 0.0, []
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        if nadam:
            m_hat = b1 * m_hat + (1 - b1) * g / (1 - b1 ** t)
        w -= lr * m_hat / (math.sqrt(v_hat) + eps)
        out.append(w)
    return out


def test_adam_first_step_is_lr_times_sign():
    # after one step m_hat/sqrt(v_hat) = g/|g|: the classic Adam property
    assert run(Adam(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-12), G[:1]) == pytest.approx([0.99])


@pytest.mark.parametrize("b1", [0.9, 0.99])
def test_adam(b1):
    got = run(Adam(learning_rate=0.01, beta1=b1, beta2=0.999, epsilon=1e-7))
    assert got == pytest.approx(_adam_reference(0.01, b1, 0.999, 1e-7, G), rel=1e-12)


def test_nadam():
    got = run(Nadam(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7))
    assert got == pytest.approx(_adam_reference(0.01, 0.9, 0.999, 1e-7, G, nadam=True), rel=1e-12)
    assert got != pytest.approx(_adam_reference(0.01, 0.9, 0.999, 1e-7, G), rel=1e-9)


@pytest.mark.parametrize("name", ["sgd", "rmsprop", "adam", "nadam", "adamw"])
def test_float32_buffers_stay_float32(name):
    opt = get_optimizer(name, learning_rate=0.01, momentum=0.9, beta1=0.9, rho=0.9, unused_flag=3)
    w = np.ones(10, dtype=np.float32)
    opt.step(w, np.full(10, 0.5, dtype=np.float32))
    assert w.dtype == np.float32 and all(v.dtype == np.float32 for v in opt.state.values())
    assert np.all(w < 1)


def test_state_roundtrip():
    a, b = Adam(learning_rate=0.01), Adam(learning_rate=0.5)
    run(a)
    b.load_state_dict({k: np.array(v) if hasattr(v, "shape") else v for k, v in a.state_dict().items()}, np)
    assert b.learning_rate == 0.01 and b.iterations == 3
    # from the same weights, the restored optimizer takes exactly the step the original takes
    assert run(a, [0.3], w0=0.7) == run(b, [0.3], w0=0.7)
    assert run(Adam(learning_rate=0.01), [0.3], w0=0.7) != run(a, [0.3], w0=0.7)


def test_bad_hyperparameters():
    with pytest.raises(ConfigError, match="learning_rate"):
        SGD(learning_rate=-1)
    with pytest.raises(ConfigError, match="momentum"):
        SGD(momentum=1.5)
    with pytest.raises(ConfigError, match="unknown optimizer"):
        get_optimizer("adagrad")
