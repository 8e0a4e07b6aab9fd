"""Each optimizer against its published update, written out here on plain floats (always run), and against
torch.optim in float64 over several steps with matched hyper-parameters (run only where torch is
installed: the test extra does not bring it; `pip install torch==2.13.0` to run them).

Tolerances: float64 updates of a few flops each, over 8 steps of a quadratic whose Hessian has norm below
2, accumulate a relative error of about 8 x 10 ulp (2e-15) of the weights; 1e-12 leaves a margin of 500.
"""
import math

import numpy as np
import pytest

from pydtnn.errors import ConfigError
from pydtnn.optimizers import SGD, Adam, AdamW, Nadam, RMSProp, get_optimizer

try:
    import torch
except ImportError:       # the reference tests below do not need it
    torch = None
needs_torch = pytest.mark.oracle         # skipped without torch (tests/conftest.py), failed where CI requires it

W0, G = 1.0, [0.5, -0.25, 0.125, 2.0, -1.5, 0.75, 0.3, -0.05]


def run(opt, grads=G, w0=W0, dtype=np.float64):
    w = np.array([w0], dtype=dtype)
    out = []
    for g in grads:
        opt.step(w, np.array([g], dtype=dtype))
        out.append(float(w[0]))
    return out


# --- the published updates on scalars: gradients given, weight decay applied to the current weight -------

def ref_sgd(lr, mu, nesterov, decay, grads, w=W0):
    """Polyak momentum / Nesterov momentum in Sutskever et al.'s (2013) form: v = mu v - lr g."""
    v, out = 0.0, []
    for g in grads:
        g = g + decay * w
        v = mu * v - lr * g
        w = w + (mu * v - lr * g if nesterov else v)
        out.append(w)
    return out


def ref_rmsprop(lr, rho, eps, decay, grads, w=W0):
    """Hinton's lecture 6e: a moving average of squared gradients divides the step."""
    c, out = 0.0, []
    for g in grads:
        g = g + decay * w
        c = rho * c + (1 - rho) * g * g
        w = w - lr * g / (math.sqrt(c) + eps)
        out.append(w)
    return out


def ref_adam(lr, b1, b2, eps, decay, grads, w=W0, decoupled=False):
    """Kingma & Ba (2015), Algorithm 1; decoupled: Loshchilov & Hutter (2019), Algorithm 2 (eta_t = lr)."""
    m = v = 0.0
    out = []
    for t, g in enumerate(grads, start=1):
        if not decoupled:
            g = g + decay * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        step = (m / (1 - b1 ** t)) / (math.sqrt(v / (1 - b2 ** t)) + eps)
        w = w - lr * (step + (decay * w if decoupled else 0.0))
        out.append(w)
    return out


def ref_nadam(lr, b1, b2, eps, decay, grads, psi=4e-3, w=W0):
    """Dozat (2016) with the momentum schedule mu_t = b1 (1 - 0.5 0.96^(t psi)), as PyTorch and Keras."""
    mu = lambda t: b1 * (1 - 0.5 * 0.96 ** (t * psi))
    m = v = 0.0
    prod, out = 1.0, []
    for t, g in enumerate(grads, start=1):
        g = g + decay * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        prod *= mu(t)
        m_bar = mu(t + 1) * m / (1 - prod * mu(t + 1)) + (1 - mu(t)) * g / (1 - prod)
        w = w - lr * m_bar / (math.sqrt(v / (1 - b2 ** t)) + eps)
        out.append(w)
    return out


@pytest.mark.parametrize("mu, nesterov, decay", [(0.0, False, 0.0), (0.9, False, 0.0), (0.9, True, 0.0),
                                                 (0.9, False, 0.1), (0.5, True, 0.05)])
def test_sgd_follows_its_equations(mu, nesterov, decay):
    got = run(SGD(learning_rate=0.1, momentum=mu, nesterov=nesterov, decay=decay))
    assert got == pytest.approx(ref_sgd(0.1, mu, nesterov, decay, G), rel=1e-12, abs=1e-14)


def test_sgd_momentum_by_hand():
    # v1 = -0.05, w1 = 0.95; v2 = 0.9*-0.05 + 0.025 = -0.02, w2 = 0.93; v3 = -0.018 - 0.0125 = -0.0305
    assert run(SGD(learning_rate=0.1, momentum=0.9), G[:3]) == pytest.approx([0.95, 0.93, 0.8995])
    # Nesterov: w += mu*v - lr*g: step 1: v = -0.05, w = 1 - 0.045 - 0.05 = 0.905
    assert run(SGD(learning_rate=0.1, momentum=0.9, nesterov=True), G[:1]) == pytest.approx([0.905])


@pytest.mark.parametrize("decay", [0.0, 0.1])
def test_rmsprop_follows_its_equations(decay):
    got = run(RMSProp(learning_rate=0.01, rho=0.9, epsilon=1e-7, decay=decay))
    assert got == pytest.approx(ref_rmsprop(0.01, 0.9, 1e-7, decay, G), rel=1e-12)


def test_adam_first_step_is_lr_times_sign():
    # after one step m_hat/sqrt(v_hat) = g/|g|: the classic Adam property
    assert run(Adam(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-12), G[:1]) == pytest.approx([0.99])


@pytest.mark.parametrize("b1, decay", [(0.9, 0.0), (0.99, 0.0), (0.9, 0.1)])
def test_adam_follows_its_equations(b1, decay):
    got = run(Adam(learning_rate=0.01, beta1=b1, beta2=0.999, epsilon=1e-7, decay=decay))
    assert got == pytest.approx(ref_adam(0.01, b1, 0.999, 1e-7, decay, G), rel=1e-12)


@pytest.mark.parametrize("decay", [0.0, 0.1])
def test_adamw_follows_its_equations(decay):
    got = run(AdamW(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8, decay=decay))
    assert got == pytest.approx(ref_adam(0.01, 0.9, 0.999, 1e-8, decay, G, decoupled=True), rel=1e-12)


@pytest.mark.parametrize("b1, decay, psi", [(0.9, 0.0, 4e-3), (0.99, 0.0, 4e-3), (0.9, 0.1, 4e-3), (0.9, 0.0, 0.0)])
def test_nadam_follows_dozat(b1, decay, psi):
    got = run(Nadam(learning_rate=0.01, beta1=b1, beta2=0.999, epsilon=1e-7, decay=decay, momentum_decay=psi))
    assert got == pytest.approx(ref_nadam(0.01, b1, 0.999, 1e-7, decay, G, psi), rel=1e-12)


def test_nadam_is_not_the_old_formula():
    """The old update used m / (1 - beta1^t) for the momentum term; Dozat's is mu_{t+1} m / (1 - prod mu):
    after 8 steps they are measurably apart (the issue measured 4.9e-2 in the parameters)."""
    def old(lr, b1, b2, eps, grads, w=W0):
        m = v = 0.0
        for t, g in enumerate(grads, start=1):
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            m_hat = b1 * m / (1 - b1 ** t) + (1 - b1) * g / (1 - b1 ** t)
            w -= lr * m_hat / (math.sqrt(v / (1 - b2 ** t)) + eps)
        return w
    got = run(Nadam(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8))[-1]
    assert abs(got - old(0.01, 0.9, 0.999, 1e-8, G)) > 1e-3


def test_nadam_state_roundtrip_continues_exactly():
    a = Nadam(learning_rate=0.01, beta1=0.9)
    w = np.array([W0])
    for g in G[:5]:
        a.step(w, np.array([g]))
    state = lambda: {k: np.array(v) if hasattr(v, "shape") else v for k, v in a.state_dict().items()}
    b, c = Nadam(learning_rate=0.5, beta1=0.9), Nadam(learning_rate=0.5, beta1=0.9)
    b.load_state_dict(state(), np)
    c.load_state_dict({k: v for k, v in state().items() if k != "mu_product"}, np)   # an older checkpoint
    wa, wb, wc = w.copy(), w.copy(), w.copy()
    for g in G[5:]:
        a.step(wa, np.array([g]))
        b.step(wb, np.array([g]))
        c.step(wc, np.array([g]))
    assert wa[0] == wb[0] and wc[0] == pytest.approx(wa[0], rel=1e-14)
    with pytest.raises(ConfigError, match="mu_product"):
        Nadam().load_state_dict(dict(state(), mu_product="x"), np)


@pytest.mark.parametrize("name", ["sgd", "rmsprop", "adam", "nadam", "adamw"])
def test_float32_buffers_stay_float32(name):
    opt = get_optimizer(name, learning_rate=0.01, momentum=0.9, beta1=0.9, rho=0.9, unused_flag=3)
    w = np.ones(10, dtype=np.float32)
    opt.step(w, np.full(10, 0.5, dtype=np.float32))
    assert w.dtype == np.float32 and all(v.dtype == np.float32 for v in opt.state.values())
    assert np.all(w < 1)


def test_state_roundtrip():
    a, b = Adam(learning_rate=0.01), Adam(learning_rate=0.5)
    run(a, G[:3])
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
    with pytest.raises(ConfigError, match="momentum_decay"):
        Nadam(momentum_decay=-1)
    with pytest.raises(ConfigError, match="unknown optimizer"):
        get_optimizer("adagrad")


# --- against torch.optim ----------------------------------------------------------------------------------

def _torch_pairs():
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.99, 1e-8, 0.05
    return {
        "sgd": (lambda: SGD(learning_rate=0.1, momentum=0.0, decay=wd),
                lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.0, weight_decay=wd)),
        "sgd momentum": (lambda: SGD(learning_rate=0.1, momentum=0.9, decay=wd),
                         lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=wd)),
        "sgd nesterov": (lambda: SGD(learning_rate=0.1, momentum=0.9, nesterov=True),
                         lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)),
        "rmsprop": (lambda: RMSProp(learning_rate=lr, rho=0.9, epsilon=eps, decay=wd),
                    lambda p: torch.optim.RMSprop(p, lr=lr, alpha=0.9, eps=eps, weight_decay=wd)),
        "adam": (lambda: Adam(learning_rate=lr, beta1=b1, beta2=b2, epsilon=eps, decay=wd),
                 lambda p: torch.optim.Adam(p, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)),
        "adamw": (lambda: AdamW(learning_rate=lr, beta1=b1, beta2=b2, epsilon=eps, decay=wd),
                  lambda p: torch.optim.AdamW(p, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)),
        "nadam": (lambda: Nadam(learning_rate=lr, beta1=b1, beta2=b2, epsilon=eps, decay=wd),
                  lambda p: torch.optim.NAdam(p, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd,
                                              momentum_decay=4e-3)),
        "nadam upstream betas": (lambda: Nadam(learning_rate=lr, beta1=0.99, beta2=0.999, epsilon=1e-7),
                                 lambda p: torch.optim.NAdam(p, lr=lr, betas=(0.99, 0.999), eps=1e-7)),
    }


CASES = ["sgd", "sgd momentum", "sgd nesterov", "rmsprop", "adam", "adamw", "nadam", "nadam upstream betas"]


@needs_torch
@pytest.mark.parametrize("case", CASES)
def test_matches_torch_in_float64(case):
    """8 steps on the quadratic 0.5 w'Aw - b'w (gradients from each side's own weights)."""
    ours_factory, theirs_factory = _torch_pairs()[case]
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 6))
    a = q @ q.T / 6 + 0.1 * np.eye(6)
    a /= np.linalg.norm(a, 2)                       # Hessian norm 1
    b, w0 = rng.standard_normal(6), rng.standard_normal(6)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)          # NAdam's mu product and step counters in float64 too
    try:
        p = torch.nn.Parameter(torch.tensor(w0))
        theirs, ours, w = theirs_factory([p]), ours_factory(), w0.copy()
        for _ in range(8):
            ours.step(w, a @ w - b)
            p.grad = torch.tensor(a @ p.detach().numpy() - b)
            theirs.step()
    finally:
        torch.set_default_dtype(previous)
    got = p.detach().numpy()
    assert np.abs(w - w0).max() > 1e-3                   # it really moved
    assert np.abs(w - got).max() <= 1e-12 * np.abs(got).max(), (w, got)


@needs_torch
def test_upstream_adam_defaults_are_not_torchs():
    """What the docstrings warn about: Adam's defaults (beta1 0.99, epsilon 1e-7) are not PyTorch's."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        w, p = np.ones(3), torch.nn.Parameter(torch.ones(3))
        ours, theirs = Adam(learning_rate=1e-3), torch.optim.Adam([p], lr=1e-3)
        for g in G:
            ours.step(w, np.full(3, g))
            p.grad = torch.full((3,), g)
            theirs.step()
    finally:
        torch.set_default_dtype(previous)
    assert np.abs(w - p.detach().numpy()).max() > 1e-5


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("size", [1, 15, 16, 17, 1000, 40_003])
def test_fused_sgd_parts_give_the_same_bits(size, nesterov):
    """The CPU backend's fused SGD update in 1, 2, 3 and 7 parts (the pool's threads): each element's
    arithmetic does not depend on the part computing it, so the results are equal bit for bit; and they
    are NumPy's formula to within one rounding per operation (float32: 3 operations, 4 ulp allowed)."""
    from pydtnn.backends.cpu import optim as _cpu_optim
    rng = np.random.default_rng(size)
    w0, v0, g = (rng.standard_normal(size).astype(np.float32) for _ in range(3))
    lr, mu = np.float32(0.1), np.float32(0.9)
    results = []
    for nt in (1, 2, 3, 7):
        w, v = w0.copy(), v0.copy()
        _cpu_optim.sgd_momentum(w, v, g, lr, mu, nesterov, nt=nt)
        results.append((w, v))
    for w, v in results[1:]:
        np.testing.assert_array_equal(w, results[0][0])
        np.testing.assert_array_equal(v, results[0][1])
    v_ref = mu * v0 - lr * g
    w_ref = w0 + (mu * v_ref - lr * g if nesterov else v_ref)
    scale = np.abs(w0) + np.abs(v_ref) + np.abs(lr * g)       # the terms' size bounds each rounding
    eps = np.finfo(np.float32).eps
    assert np.all(np.abs(results[0][1] - v_ref) <= 4 * eps * (np.abs(mu * v0) + np.abs(lr * g)))
    assert np.all(np.abs(results[0][0] - w_ref) <= 4 * eps * scale)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name, hyper", [
    ("rmsprop", {}), ("rmsprop", {"decay": 0.01}), ("adam", {}), ("adam", {"decay": 0.01}),
    ("adam", {"beta1": 0.9, "epsilon": 1e-8}), ("nadam", {}), ("nadam", {"decay": 0.01}),
    ("adamw", {}), ("adamw", {"decay": 0.05})])
def test_fused_adaptive_updates_are_numpys_bits(name, hyper, dtype, monkeypatch):
    """The CPU backend's one-pass RMSProp, Adam, NAdam and AdamW do NumPy's operations in NumPy's order,
    each rounded once in the parameters' dtype, with the scalars cast as NumPy casts them: five steps
    (bias corrections and NAdam's schedule moving) give NumPy's path's weights and state bit for bit,
    in 1, 2 and 3 parts. Gradients span magnitudes 1e-4..1e1 and some are zero."""
    from pydtnn import optimizers
    rng = np.random.default_rng(len(name) + len(hyper))
    size = 1037
    w0 = rng.standard_normal(size).astype(dtype)
    grads = [(rng.standard_normal(size) * 10.0 ** rng.integers(-4, 2, size) * (rng.random(size) > 0.05))
             .astype(dtype) for _ in range(5)]

    from pydtnn.backends.cpu import parts as cpu_parts
    real_threads, parts = cpu_parts.default_threads, []

    def threads(work, *args, **kw):             # the fused path asks for its part count: count the steps
        parts.append(work)
        return nt_forced or real_threads(work, *args, **kw)

    def run(fused):
        w, opt = w0.copy(), get_optimizer(name, learning_rate=0.01, **hyper)
        with monkeypatch.context() as patch:
            patch.setattr(cpu_parts, "default_threads", threads)
            if not fused:
                patch.setattr(optimizers, "_fusable", lambda *arrays: False)
            for g in grads:
                opt.step(w, g)
        return w, opt.state
    nt_forced = None
    want_w, want_state = run(fused=False)
    assert not np.array_equal(want_w, w0) and not parts
    for nt_forced in (None, 1, 2, 3):
        parts.clear()
        got_w, got_state = run(fused=True)
        assert len(parts) == len(grads)
        np.testing.assert_array_equal(got_w, want_w)
        for slot in want_state:
            np.testing.assert_array_equal(got_state[slot], want_state[slot])
