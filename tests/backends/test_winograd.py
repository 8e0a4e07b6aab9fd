"""Winograd F(4x4, 3x3) convolutions of the CPU backend against the direct path, a plain reference and
central finite differences (float64), their float32 error against float64, the auto rule, the backend
options and the launcher's flags."""
from __future__ import annotations

import numpy as np
import pytest

from pydtnn.backends import ConvSpec, get_backend
from pydtnn.backends.cpu import conv as kc
from pydtnn.backends.cpu import winograd as wino
from pydtnn.backends.cpu import winograd_transforms as transforms
from pydtnn.backends.cpu.backend import CPUBackend
from pydtnn.errors import ConfigError
from test_cpu_kernels import fd_grad, ref_conv, rel_err, some_indices


def _backend(dtype, algorithm="winograd"):
    be = CPUBackend(dtype, conv_algorithm=algorithm)
    be.num_threads = 2
    be._parallel_min = 0          # small test arrays still run the multi-threaded paths
    return be


@pytest.mark.parametrize("m", [2, 4])
def test_transform_matrices_compute_a_correlation(m):
    """1-D F(m, 3): A^T [(G g) * (B^T d)] == the valid correlation of d (m + 2 values) with g (3 taps)."""
    bt, g, at = transforms.MATRICES[m]
    rng = np.random.default_rng(m)
    for _ in range(5):
        d, w = rng.standard_normal(m + 2), rng.standard_normal(3)
        want = np.array([d[i:i + 3] @ w for i in range(m)])
        np.testing.assert_allclose(at @ ((g @ w) * (bt @ d)), want, rtol=1e-13, atol=1e-13)


# (N, C, H, W, K, padding, bias): odd sizes, paddings 0..3, 1-3 input channels, batch 1, several chunks
CASES = [
    (1, 1, 5, 5, 1, 0, False),
    (2, 2, 7, 9, 3, 1, True),
    (1, 3, 6, 5, 2, 2, True),
    (3, 3, 9, 11, 4, 1, False),
    (1, 2, 4, 7, 2, 3, True),        # padding 3: backward data runs with padding -1 (a crop)
    (2, 5, 13, 10, 6, 1, True),
    (5, 4, 11, 13, 3, 0, True),      # more tiles than one 64-tile chunk
]


def _setup(case, seed):
    n, c, h, w, k, p, bias = case
    rng = np.random.default_rng(seed)
    spec = ConvSpec(c, k, (3, 3), (1, 1), (p, p))
    return spec, rng.standard_normal((n, c, h, w)), rng.standard_normal((k, c, 3, 3)), \
        (rng.standard_normal(k) if bias else None), rng


@pytest.mark.parametrize("case", CASES, ids=str)
def test_winograd_matches_reference_and_direct(case):
    spec, x, w, b, rng = _setup(case, 0)
    wb, db = _backend("float64"), _backend("float64", "direct")
    assert wb._winograd(spec, x.shape[2], x.shape[3]) and not db._winograd(spec, x.shape[2], x.shape[3])
    xi = wb.to_internal(x)
    y, ctx = wb.conv2d_forward(xi, w, b, spec)
    yd, ctxd = db.conv2d_forward(xi, w, b, spec)
    assert rel_err(wb.to_user(y), ref_conv(x, w, b, (1, 1), spec.padding, (1, 1), 1)) < 1e-12
    r = rng.standard_normal(y.shape)
    assert rel_err(wb.conv2d_backward_data(r, w, ctx, spec), db.conv2d_backward_data(r, w, ctxd, spec)) < 1e-12
    for got, want in zip(wb.conv2d_backward_weights(r, ctx, spec, b is not None),
                         db.conv2d_backward_weights(r, ctxd, spec, b is not None)):
        assert (got is None and want is None) or rel_err(got, want) < 1e-12


@pytest.mark.parametrize("case", CASES, ids=str)
def test_winograd_backward_vs_finite_differences(case):
    spec, x, w, b, rng = _setup(case, 1)
    be = _backend("float64")
    xi = be.to_internal(x)
    y, ctx = be.conv2d_forward(xi, w, b, spec)
    r = rng.standard_normal(y.shape)

    def loss():
        return float(np.sum(be.conv2d_forward(xi, w, b, spec)[0] * r))

    dx = be.conv2d_backward_data(r, w, ctx, spec)
    dw, dbias = be.conv2d_backward_weights(r, ctx, spec, with_bias=b is not None)
    # the loss is linear in x, w and b: central differences are exact up to rounding
    ix = some_indices(xi.size, rng)
    np.testing.assert_allclose(dx.reshape(-1)[ix], fd_grad(loss, xi, ix, 0.5), rtol=1e-9, atol=1e-9)
    iw = some_indices(w.size, rng, 30)
    np.testing.assert_allclose(dw.reshape(-1)[iw], fd_grad(loss, w, iw, 0.5), rtol=1e-9, atol=1e-9)
    if b is not None:
        np.testing.assert_allclose(dbias, fd_grad(loss, b, np.arange(b.size), 0.5), rtol=1e-9, atol=1e-9)
    else:
        assert dbias is None


@pytest.mark.parametrize("kparts", [1, 2, 4])
@pytest.mark.parametrize("case", [(5, 3, 13, 13, 40, 1, True),     # 80 tiles: two chunks, 4 parts
                                  (2, 4, 6, 7, 21, 0, True),       # one chunk; 21 channels: uneven ranges
                                  (9, 2, 16, 16, 12, 1, False)],   # 144 tiles: three chunks
                         ids=str)
def test_every_split_of_the_parts_gives_the_same_convolution(case, kparts):
    """The parts of a pass take ranges of chunks (kparts 1), of output channels (kparts = parts), or both
    (kparts 2 of 4 parts); forced here at 4 parts, in the direct path's backward weights too. All agree with
    the direct path on one part, in all three passes."""
    spec, x, w, b, rng = _setup(case, 3)
    be, db = _backend("float64"), _backend("float64", "direct")
    be.num_threads = 4
    be._force_kparts = kparts
    split = _backend("float64", "direct")
    split.num_threads, split._force_kparts = 4, kparts
    db.num_threads = 1
    xi = be.to_internal(x)
    y, ctx = be.conv2d_forward(xi, w, b, spec)
    yd, ctxd = db.conv2d_forward(xi, w, b, spec)
    assert rel_err(y, yd) < 1e-12
    r = rng.standard_normal(y.shape)
    assert rel_err(be.conv2d_backward_data(r, w, ctx, spec), db.conv2d_backward_data(r, w, ctxd, spec)) < 1e-12
    for backend in (be, split):
        for got, want in zip(backend.conv2d_backward_weights(r, ctx, spec, b is not None),
                             db.conv2d_backward_weights(r, ctxd, spec, b is not None)):
            assert (got is None and want is None) or rel_err(got, want) < 1e-12


def test_the_split_rule():
    """Channel ranges where chunks cannot be balanced (fewer than two a part) and, for the weights'
    gradient, where the per-range accumulators outweigh the tiles (4 K >= tiles); ranges of chunks
    otherwise, and always on one thread."""
    assert wino.kparts(64, 64, 512, 512, 2, False) == 2            # VGG's 4x4 images: one chunk
    assert wino.kparts(256, 64, 256, 256, 2, False) == 1           # 8x8: four chunks, two a part
    assert wino.kparts(256, 64, 256, 256, 2, True) == 2            # ... but 36 x 256 x 256 accumulators
    assert wino.kparts(1024, 64, 32, 32, 2, True) == 1             # ResNet's 16x16, 32 channels
    assert wino.kparts(64, 64, 512, 512, 1, True) == 1
    assert kc.weight_kparts(256, 4608, 512, 2) == 2                 # direct: VGG's 2x2 images, 256 rows
    assert kc.weight_kparts(65536, 144, 16, 2) == 1 and kc.weight_kparts(256, 4608, 512, 1) == 1


@pytest.mark.parametrize("m", [2, 4])
def test_filter_and_gradient_transforms_match_the_matrices(m):
    """U = G g G^T (and the flipped filters' U) and dw = G^T dU G, summed over the parts' dU, against the
    matrices of MATRICES, for more filters than one block (the transforms are hand-coded per tile size)."""
    g = transforms.MATRICES[m][1]
    a = m + 2
    rng = np.random.default_rng(m)
    k, c = 3, 131
    w = rng.standard_normal((k, c, 3, 3))
    want = np.einsum("ir,kcrs,js->ijck", g, w, g).reshape(a * a, c, k)
    np.testing.assert_allclose(transforms.filter_transform(w, m, np.float64, nt=2), want, rtol=1e-13, atol=1e-13)
    flipped = np.einsum("ir,kcrs,js->ijkc", g, w[:, :, ::-1, ::-1], g).reshape(a * a, k, c)
    np.testing.assert_allclose(transforms.filter_transform(w, m, np.float64, nt=3, flipped=True), flipped,
                               rtol=1e-13, atol=1e-13)
    du = rng.standard_normal((2, a * a, c, k))
    dwant = np.einsum("ir,ijck,js->kcrs", g, du.sum(axis=0).reshape(a, a, c, k), g)
    np.testing.assert_allclose(transforms.weight_grad_transform(du, m, k, c, np.float64, nt=2), dwant,
                               rtol=1e-13, atol=1e-13)


# F(4x4, 3x3) rounds worse than direct convolution (its transforms have entries up to 8 and 1/24): measured
# relative errors (max |error| / max |value|) up to ~3e-6 here, against ~3e-7 for the direct path.
F32_BOUND = 1e-5


@pytest.mark.parametrize("shape", [(2, 3, 9, 11, 4, 1), (4, 64, 8, 8, 64, 1), (2, 32, 16, 16, 32, 1)], ids=str)
def test_winograd_float32_error_is_bounded(shape):
    n, c, h, wd, k, p = shape
    rng = np.random.default_rng(2)
    spec = ConvSpec(c, k, (3, 3), (1, 1), (p, p))
    x = rng.standard_normal((n, h, wd, c))
    w = rng.standard_normal((k, c, 3, 3)) * 0.1
    ref = _backend("float64", "direct")
    y64, c64 = ref.conv2d_forward(x, w, None, spec)
    dy = rng.standard_normal(y64.shape)
    w32 = _backend("float32")
    y32, c32 = w32.conv2d_forward(w32.asarray(x), w32.asarray(w), None, spec)
    assert y32.dtype == np.float32 and rel_err(y32, y64) < F32_BOUND
    dx32 = w32.conv2d_backward_data(w32.asarray(dy), w32.asarray(w), c32, spec)
    assert rel_err(dx32, ref.conv2d_backward_data(dy, w, c64, spec)) < F32_BOUND
    dw32, db32 = w32.conv2d_backward_weights(w32.asarray(dy), c32, spec, True)
    dw64, db64 = ref.conv2d_backward_weights(dy, c64, spec, True)
    assert dw32.dtype == np.float32 and rel_err(dw32, dw64) < F32_BOUND and rel_err(db32, db64) < 1e-5


def test_auto_rule_and_fallbacks():
    auto, forced, direct = CPUBackend("float32"), CPUBackend("float32", conv_algorithm="winograd"), \
        CPUBackend("float32", conv_algorithm="direct")
    assert auto.conv_algorithm == "auto"
    wide, narrow = ConvSpec(32, 32, (3, 3), padding=(1, 1)), ConvSpec(16, 32, (3, 3), padding=(1, 1))
    assert auto._winograd(wide, 16, 16) and not auto._winograd(narrow, 16, 16)
    assert not auto._winograd(ConvSpec(16, 16, (3, 3), padding=(1, 1)), 32, 32)
    assert forced._winograd(narrow, 16, 16) and not direct._winograd(wide, 16, 16)
    for other in (ConvSpec(32, 32, (3, 3), (2, 2), (1, 1)), ConvSpec(32, 32, (5, 5)),
                  ConvSpec(32, 32, (3, 3), dilation=(2, 2)), ConvSpec(32, 32, (3, 3), groups=32),
                  ConvSpec(32, 32, (1, 1))):
        assert not forced._winograd(other, 16, 16), other      # these stay direct even when forced


def test_backend_options_are_checked():
    assert get_backend("cpu", conv_algorithm="winograd").conv_algorithm == "winograd"
    with pytest.raises(ConfigError, match="conv_algorithm"):
        get_backend("cpu", conv_algorithm="anything")
    with pytest.raises(ConfigError, match="unknown cpu backend option precision"):
        get_backend("cpu", precision="tf32")
    with pytest.raises(ConfigError, match="unknown gpu backend option conv_algorithm"):
        get_backend("gpu", conv_algorithm="winograd")
    with pytest.raises(ConfigError, match="unknown backend"):
        get_backend("tpu")


def _train(algorithm, dtype, steps=3):
    """3 SGD steps of a small residual network; float32 uses tanh where float64 uses ReLU (below)."""
    from pydtnn import Model
    from pydtnn.activations import Relu, Tanh
    from pydtnn.layers import FC, AdditionBlock, AveragePool2D, BatchNormalization, Conv2D, Flatten, Input
    from pydtnn.optimizers import SGD
    act, act_name = (Relu, "relu") if dtype == "float64" else (Tanh, "tanh")
    model = Model(backend=get_backend("cpu", dtype, 0, conv_algorithm=algorithm), seed=0)
    model.add(Input(shape=(3, 10, 9)))
    model.add(Conv2D(nfilters=32, filter_shape=(3, 3), padding=1, use_bias=False))
    model.add(BatchNormalization())
    model.add(act())
    model.add(AdditionBlock([Conv2D(nfilters=32, filter_shape=(3, 3), padding=1), act(),
                             Conv2D(nfilters=32, filter_shape=(3, 3), padding=2, activation=act_name),
                             AveragePool2D(pool_shape=(3, 3), stride=1)], []))
    model.add(Flatten())
    model.add(FC(shape=(5,), activation="softmax"))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3, 10, 9)).astype(dtype)
    y = np.eye(5, dtype=dtype)[rng.integers(0, 5, 8)]
    opt = SGD(learning_rate=0.05, momentum=0.9)
    for _ in range(steps):
        model.compute_gradients(x, y, "categorical_cross_entropy")
        opt.step(model.params, model.grads)
    return model.backend, model.params.copy()


# Tolerances, from an error analysis rather than one machine. Every Winograd pass (forward, backward-data,
# backward-weights) of the 3 convolutions is within F32_BOUND of exact (test above); the other layers are
# smooth and normalize (tanh, BatchNorm, average pooling, softmax), so to first order a gradient carries at
# most one such error per pass it went through (6), and 3 steps of momentum SGD with lr 0.05 add up less
# than 3 of those gradients into the weights: 3 x 6 x F32_BOUND bounds the weights' relative difference.
# Only smooth layers: with ReLU (or max pooling) an activation within Winograd's 4e-6 rounding of zero flips
# its mask, which moves a whole gradient entry (measured 1.2e-3 apart on an AMD Zen 5 with ReLU here).
# float64: the same bound scaled by the ratio of the unit roundoffs (2^-53 / 2^-24), 3.4e-13; ReLU masks
# there flip only for activations within ~1e-15 of zero (odds ~1e-10 for these 23,040 activations).
# Measured: 1.9e-7 (float32) and 5e-16 (float64) for forced Winograd.
F32_TRAINING_BOUND = 3 * 6 * F32_BOUND
F64_TRAINING_BOUND = F32_TRAINING_BOUND * 2.0 ** -29


@pytest.mark.parametrize("dtype, tol", [("float64", F64_TRAINING_BOUND), ("float32", F32_TRAINING_BOUND)])
def test_auto_and_forced_choices_train_the_same_weights(dtype, tol):
    runs = {a: _train(a, dtype) for a in ("auto", "direct", "winograd")}
    be = runs["auto"][0]
    assert be._winograd(ConvSpec(32, 32, (3, 3), padding=(1, 1)), 10, 9)     # auto did run Winograd here
    ref = runs["direct"][1]
    assert rel_err(runs["winograd"][1], ref) > 0         # the paths really differ (rounding)
    for algorithm in ("auto", "winograd"):
        assert rel_err(runs[algorithm][1], ref) < tol, algorithm


def test_model_gradients_with_winograd():
    from gradcheck import assert_gradients
    from pydtnn import Model
    from pydtnn.layers import Conv2D, Flatten, FC, Input
    model = Model(backend=get_backend("cpu", "float64", 0, conv_algorithm="winograd"), seed=0)
    model.add(Input(shape=(2, 7, 6)))
    model.add(Conv2D(nfilters=3, filter_shape=(3, 3), padding=1, activation="tanh"))
    model.add(Conv2D(nfilters=2, filter_shape=(3, 3), padding=0))
    model.add(Flatten())
    model.add(FC(shape=(3,)))
    x = np.random.default_rng(0).standard_normal((2, 2, 7, 6))
    assert_gradients(model, x, tol=1e-6)


def test_launcher_flags(tmp_path):
    from paths import sibling
    cli_tests = sibling("launch", "test_cli")
    FAST, launch = cli_tests.FAST, cli_tests.launch
    r = launch(*FAST, "--num_epochs", "1", "--steps_per_epoch", "2", "--enable_conv_winograd", "true",
               "--enable_conv_gemm", "true", "--enable_memory_cache", "true", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "CPU convolutions: winograd" in r.stdout
    assert "note: --enable_conv_gemm is accepted" in r.stdout and "note: --enable_memory_cache is accepted" in r.stdout
    r = launch(*FAST, "--num_epochs", "0", "--evaluate_only", "true", cwd=tmp_path)      # the banner only
    assert r.returncode == 0 and "CPU convolutions: auto" in r.stdout and "note: --enable" not in r.stdout
