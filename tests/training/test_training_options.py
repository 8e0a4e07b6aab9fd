"""Part B of issue 12: adamw, the cosine schedule, clipping by global norm, label smoothing, fit callbacks.

Each is checked against a closed form written out here; adamw and label smoothing also against PyTorch
(those comparisons run only where torch is importable; the closed-form tests always run)."""
import math
import types

import numpy as np
import pytest

from pydtnn import Model
from pydtnn.clipping import clip_by_global_norm
from pydtnn.errors import ConfigError
from pydtnn.layers import FC, Input
from pydtnn.losses import BinaryCrossEntropy, CategoricalCrossEntropy, get_loss
from pydtnn.optimizers import Adam, AdamW, get_optimizer
from pydtnn.schedulers import CosineDecay, StopAtLoss, make_schedulers

try:
    import torch
except ImportError:       # the closed-form tests below do not need it
    torch = None
needs_torch = pytest.mark.oracle         # skipped without torch (tests/conftest.py), failed where CI requires it


# --- adamw ------------------------------------------------------------------------------------------------
def _adamw_reference(w0, grads, lr, b1, b2, eps, wd):
    """Scalar AdamW (Loshchilov & Hutter, PyTorch's form), written out by hand."""
    w, m, v, out = w0, 0.0, 0.0, []
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        w = w - lr * (m_hat / (math.sqrt(v_hat) + eps) + wd * w)
        out.append(w)
    return out


def test_adamw_closed_form():
    grads = [0.5, -0.25, 0.125, 2.0]
    opt = AdamW(learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-8, decay=0.1)
    w, got = np.array([1.5]), []
    for g in grads:
        opt.step(w, np.array([g]))
        got.append(float(w[0]))
    want = _adamw_reference(1.5, grads, 0.01, 0.9, 0.999, 1e-8, 0.1)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-15
    # first step by hand: m_hat/sqrt(v_hat) = sign(g) = 1, so w1 = 1.5 - 0.01 (1 + 0.1 x 1.5)
    assert got[0] == pytest.approx(1.5 - 0.01 * (1 + 0.15), abs=1e-9)


def test_adamw_decay_is_decoupled_not_l2():
    """Adam's decay enters the moments (L2); adamw's does not: same gradients, different weights."""
    g = np.array([0.5, -0.25])
    w_adam, w_adamw, w_plain = np.ones(2), np.ones(2), np.ones(2)
    adam = Adam(learning_rate=0.01, beta1=0.9, decay=0.1)
    adamw = AdamW(learning_rate=0.01, beta1=0.9, decay=0.1)
    plain = AdamW(learning_rate=0.01, beta1=0.9, decay=0.0)
    for _ in range(3):
        adam.step(w_adam, g)
        adamw.step(w_adamw, g)
        plain.step(w_plain, g)
    assert np.abs(w_adam - w_adamw).max() > 1e-4
    # decay 0 is exactly Adam without decay
    ref = Adam(learning_rate=0.01, beta1=0.9)
    w_ref = np.ones(2)
    for _ in range(3):
        ref.step(w_ref, g)
    assert np.array_equal(w_ref, w_plain)


@needs_torch
def test_adamw_matches_torch():
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(50)
    grads = [rng.standard_normal(50) for _ in range(20)]
    lr, b1, b2, eps, wd = 3e-3, 0.9, 0.99, 1e-8, 0.05
    ours = AdamW(learning_rate=lr, beta1=b1, beta2=b2, epsilon=eps, decay=wd)
    w = w0.copy()
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    theirs = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    worst = 0.0
    for g in grads:
        ours.step(w, g)
        p.grad = torch.tensor(g, dtype=torch.float64)
        theirs.step()
        worst = max(worst, float(np.abs(w - p.detach().numpy()).max()))
    assert worst < 1e-13, worst
    assert np.abs(w - w0).max() > 1e-2         # it really moved


def test_adamw_bad_values():
    with pytest.raises(ConfigError, match=r"decay must be >= 0"):
        AdamW(decay=-0.1)
    with pytest.raises(ConfigError, match=r"learning_rate x decay must be in \[0, 1\)"):
        AdamW(learning_rate=0.5, decay=2.0)
    with pytest.raises(ConfigError, match=r"beta1 must be in \[0, 1\)"):
        get_optimizer("adamw", beta1=1.0)


# --- cosine -----------------------------------------------------------------------------------------------
def _fake_trainer(lr, steps_per_epoch):
    return types.SimpleNamespace(optimizer=types.SimpleNamespace(learning_rate=lr), steps_per_epoch=steps_per_epoch)


def _cosine_rates(sched, lr, spe, nsteps):
    t, out = _fake_trainer(lr, spe), []
    for s in range(nsteps):
        sched.on_batch_begin(t, s)
        out.append(t.optimizer.learning_rate)
    return out


def test_cosine_closed_form():
    base, low, spe, warm, decay = 0.1, 0.001, 4, 2, 3
    got = _cosine_rates(CosineDecay(decay_epochs=decay, min_lr=low, warm_up_epochs=warm), base, spe, 24)
    W, D = warm * spe, decay * spe
    for s, lr in enumerate(got):
        if s < W:
            want = base * (s + 1) / W
        elif s < W + D:
            want = low + (base - low) * (1 + math.cos(math.pi * (s - W) / D)) / 2
        else:
            want = low
        assert abs(lr - want) < 1e-15, (s, lr, want)
    assert got[0] == pytest.approx(base / 8) and got[W] == base and got[-1] == low
    assert got[W + D // 2] == pytest.approx((base + low) / 2, abs=1e-15)     # the half-way point
    assert all(a >= b for a, b in zip(got[W:], got[W + 1:]))                  # decays monotonically


def test_cosine_resumes_from_its_state():
    full = _cosine_rates(CosineDecay(3, 0.0, 1), 0.2, 5, 20)
    first = CosineDecay(3, 0.0, 1)
    _cosine_rates(first, 0.2, 5, 7)
    second = CosineDecay(3, 0.0, 1)
    second.load_state_dict(first.state_dict())
    t = _fake_trainer(0.0123, 5)                 # the optimizer's rate at the checkpoint is not the base
    rest = []
    for s in range(7, 20):
        second.on_batch_begin(t, s)
        rest.append(t.optimizer.learning_rate)
    assert rest == full[7:]


def test_cosine_flags_and_errors():
    p = types.SimpleNamespace(cosine_decay_epochs=0, cosine_min_lr=0.0, cosine_warm_up_epochs=2, num_epochs=10)
    (s,) = make_schedulers("cosine", p)
    assert s.decay_epochs == 8 and s.warm_up_epochs == 2
    with pytest.raises(ConfigError, match="warm_up and cosine"):
        make_schedulers("warm_up,cosine", types.SimpleNamespace(warm_up_epochs=1, **vars(p)))
    with pytest.raises(ConfigError, match=r"decay_epochs must be >= 1"):
        CosineDecay(0)
    with pytest.raises(ConfigError, match=r"min_lr must be >= 0"):
        CosineDecay(2, min_lr=-1.0)
    with pytest.raises(ConfigError, match=r"min_lr must be in \[0, 0.1\]"):
        _cosine_rates(CosineDecay(2, min_lr=0.5), 0.1, 3, 1)


# --- clipping ---------------------------------------------------------------------------------------------
def test_clip_by_global_norm_closed_form():
    g = np.array([3.0, -4.0, 0.0, 12.0])             # norm 13
    norm, clipped = clip_by_global_norm(g, 6.5)
    assert norm == 13.0 and clipped and np.array_equal(g, np.array([1.5, -2.0, 0.0, 6.0]))
    norm, clipped = clip_by_global_norm(g, 6.5)      # now exactly at the threshold: untouched
    assert norm == pytest.approx(6.5) and not clipped
    small = np.array([0.1, 0.2], dtype=np.float32)
    before = small.copy()
    assert clip_by_global_norm(small, 1.0)[1] is False and np.array_equal(small, before)
    with pytest.raises(ConfigError, match=r">= 0 \(0 = off\)"):
        Model(backend="cpu").fit(np.zeros((2, 1)), np.zeros(2, int), clip_grad_norm=-1.0)


# --- label smoothing --------------------------------------------------------------------------------------
def _smoothed_reference(z, labels, e):
    """-mean_n sum_k y'_nk log softmax(z_n)_k with y' = (1 - e) onehot + e/K, and its gradient p - y'."""
    n, k = z.shape
    y = np.full((n, k), e / k)
    y[np.arange(n), labels] += 1 - e
    log_p = z - z.max(axis=1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    return -(y * log_p).sum() / n, (np.exp(log_p) - y) / n, y


def _case(seed=0, n=6, k=5):
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, k)) * 3
    labels = rng.integers(0, k, n)
    onehot = np.eye(k)[labels]
    return z, labels, onehot


@pytest.mark.parametrize("e", [0.0, 0.1, 0.5])
def test_label_smoothing_closed_form(e):
    z, labels, onehot = _case()
    loss = CategoricalCrossEntropy(label_smoothing=e)
    value, p, dz = loss.from_logits(z, onehot)
    ref_value, ref_dz, y_smooth = _smoothed_reference(z, labels, e)
    assert abs(value - ref_value) < 1e-14 and np.abs(dz - ref_dz).max() < 1e-15
    # the unfused path (on probabilities) gives the same value, and its chain rule through softmax the same dz
    v2, dp = loss(p, onehot)
    assert abs(v2 - value) < 1e-12
    dz_chain = p * (dp - (dp * p).sum(axis=1, keepdims=True))
    assert np.abs(dz_chain - dz).max() < 1e-12
    # central differences of the value
    h, fd = 1e-6, np.zeros_like(z)
    for idx in np.ndindex(*z.shape):
        zp, zm = z.copy(), z.copy()
        zp[idx] += h
        zm[idx] -= h
        fd[idx] = (loss.from_logits(zp, onehot)[0] - loss.from_logits(zm, onehot)[0]) / (2 * h)
    assert np.abs(fd - dz).max() < 1e-8


@needs_torch
@pytest.mark.parametrize("e", [0.1, 0.3])
def test_label_smoothing_matches_torch(e):
    z, labels, onehot = _case(seed=3, n=8, k=7)
    value, _, dz = CategoricalCrossEntropy(label_smoothing=e).from_logits(z, onehot)
    tz = torch.tensor(z, requires_grad=True)
    tv = torch.nn.functional.cross_entropy(tz, torch.tensor(labels), label_smoothing=e)
    tv.backward()
    assert abs(value - tv.item()) < 1e-14
    assert np.abs(dz - tz.grad.numpy()).max() < 1e-15
    assert abs(value - CategoricalCrossEntropy().from_logits(z, onehot)[0]) > 1e-3   # smoothing did something


def test_label_smoothing_api_and_errors():
    assert get_loss("categorical_cross_entropy", label_smoothing=0.2).label_smoothing == 0.2
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ConfigError, match=r"label_smoothing must be in \[0, 1\)"):
            get_loss("categorical_cross_entropy", label_smoothing=bad)
    with pytest.raises(ConfigError, match="categorical_cross_entropy only"):
        get_loss("binary_cross_entropy", label_smoothing=0.1)
    assert isinstance(get_loss("binary_cross_entropy"), BinaryCrossEntropy)


# --- callbacks in Model.fit -------------------------------------------------------------------------------
def _tiny_model(seed=1):
    m = Model(backend="cpu", dtype="float64", seed=seed)
    m.add(Input(shape=(4,)))
    m.add(FC(shape=(3,), activation="softmax"))
    return m


def _data():
    rng = np.random.default_rng(2)
    return rng.standard_normal((20, 4)), rng.integers(0, 3, 20)


class Recorder:
    def __init__(self):
        self.calls = []

    def on_batch_begin(self, trainer, global_step):
        self.calls.append(("batch", global_step, trainer.optimizer.learning_rate))

    def on_epoch_end(self, trainer, epoch, logs):
        self.calls.append(("epoch", epoch, round(logs["loss"], 12)))
        if epoch == 1:
            trainer.stop_training = True


def test_fit_calls_callbacks_and_stops():
    x, y = _data()
    rec = Recorder()
    history = _tiny_model().fit(x, y, epochs=5, batch_size=8, callbacks=[rec])
    assert len(history["loss"]) == 2                                 # stopped after epoch 2
    assert [c[:2] for c in rec.calls] == [("batch", 0), ("batch", 1), ("batch", 2), ("epoch", 0),
                                          ("batch", 3), ("batch", 4), ("batch", 5), ("epoch", 1)]
    assert rec.calls[3][2] == round(history["loss"][0], 12)


def test_fit_runs_a_scheduler_as_callback():
    x, y = _data()
    rec = Recorder()
    cos = CosineDecay(decay_epochs=2, min_lr=0.0, warm_up_epochs=1)
    from pydtnn.optimizers import SGD
    _tiny_model().fit(x, y, epochs=2, batch_size=8, optimizer=SGD(learning_rate=0.3), callbacks=[cos, rec])
    rates = [c[2] for c in rec.calls if c[0] == "batch"]             # the rate each step trained with
    # 3 steps an epoch: warm-up over steps 0-2, then the decay's first three of its 6 steps
    assert rates == pytest.approx([0.1, 0.2, 0.3, 0.3, 0.3 * (1 + math.cos(math.pi / 6)) / 2,
                                   0.3 * (1 + math.cos(math.pi / 3)) / 2], abs=1e-15)
    # stop_at_loss reads the fit logs by upstream's metric names (val_ ones come from validation_data)
    stop = StopAtLoss("val_categorical_cross_entropy", threshold=10.0)
    history = _tiny_model().fit(x, y, epochs=6, batch_size=8, validation_data=(x, y), callbacks=[stop])
    assert len(history["loss"]) == 1 and history["val_loss"][0] < 10.0


def test_fit_clipping_equals_manual_clipping():
    """Model.fit(clip_grad_norm=c) takes the same steps as scaling each batch gradient to norm c by hand."""
    x, y = _data()
    from pydtnn.optimizers import SGD
    a = _tiny_model()
    a.fit(x, y, epochs=1, batch_size=20, optimizer=SGD(learning_rate=0.5, momentum=0.0), clip_grad_norm=1e-3,
          shuffle=False)
    b = _tiny_model()
    p0 = b.params.copy()
    b.compute_gradients(x, b.backend.asarray(np.eye(3)[y]), get_loss("categorical_cross_entropy"))
    g = b.grads.copy()
    assert np.linalg.norm(g) > 1e-3                                     # clipping really triggered
    assert np.abs(a.params - (p0 - 0.5 * g * (1e-3 / np.linalg.norm(g)))).max() < 1e-15
