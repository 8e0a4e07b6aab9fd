"""CPU backend kernels against plain references (NCHW, float64) and central finite differences.

Every convolution/pooling/batch-norm kernel is checked forward against a direct-loop reference written
here, backward against central finite differences of a random linear functional L = sum(y * r), and in
float32 against float64. Seeds are fixed.
"""
from __future__ import annotations

import numpy as np
import pytest

from pydtnn.backends import ConvSpec, PoolSpec, get_backend
from pydtnn.backends.cpu.backend import CPUBackend
from pydtnn.errors import ConfigError, ShapeError

# --- references (NCHW, float64, loops over the kernel taps) ----------------------------------------

def ref_conv(x, w, b, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    k, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dil
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    y = np.zeros((n, k, ho, wo))
    kg = k // groups
    for o in range(k):
        g = o // kg
        for ci in range(cg):
            for i in range(kh):
                for j in range(kw):
                    for a in range(ho):
                        for bb in range(wo):
                            y[:, o, a, bb] += xp[:, g * cg + ci, a * sh + i * dh, bb * sw + j * dw] * w[o, ci, i, j]
        if b is not None:
            y[:, o] += b[o]
    return y


def ref_pool(x, kind, pool, stride, pad):
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = pool, stride, pad
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    y = np.zeros((n, c, ho, wo))
    for a in range(ho):
        for b in range(wo):
            vals = []
            for i in range(kh):
                for j in range(kw):
                    hh, ww = a * sh - ph + i, b * sw - pw + j
                    inside = 0 <= hh < h and 0 <= ww < w
                    if kind == "max":
                        vals.append(x[:, :, hh, ww] if inside else np.full((n, c), -np.inf))
                    else:
                        vals.append(x[:, :, hh, ww] if inside else np.zeros((n, c)))
            vals = np.stack(vals)
            y[:, :, a, b] = vals.max(axis=0) if kind == "max" else vals.sum(axis=0) / (kh * kw)
    return y


def ref_maxpool_grad_first(x, dy, pool, stride, pad):
    """Gradient of max pooling with the 'first arg-max wins' rule (scan order: rows, then columns)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = pool, stride, pad
    _, _, ho, wo = dy.shape
    dx = np.zeros_like(x)
    for ni in range(n):
        for ci in range(c):
            for a in range(ho):
                for b in range(wo):
                    best, pos = -np.inf, None
                    for i in range(kh):
                        for j in range(kw):
                            hh, ww = a * sh - ph + i, b * sw - pw + j
                            if 0 <= hh < h and 0 <= ww < w and (pos is None or x[ni, ci, hh, ww] > best):
                                best, pos = x[ni, ci, hh, ww], (hh, ww)
                    dx[ni, ci, pos[0], pos[1]] += dy[ni, ci, a, b]
    return dx


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def fd_grad(f, x, idx_list, h):
    """Central finite differences of the scalar f at the flat indices idx_list of x (x is modified back)."""
    flat = x.reshape(-1)
    out = []
    for q in idx_list:
        v = flat[q]
        flat[q] = v + h
        fp = f()
        flat[q] = v - h
        fm = f()
        flat[q] = v
        out.append((fp - fm) / (2 * h))
    return np.array(out)


def some_indices(size, rng, k=24):
    return np.arange(size) if size <= k else rng.choice(size, k, replace=False)


@pytest.fixture(scope="module")
def be64():
    be = CPUBackend("float64", seed=0)
    be.num_threads = 2
    be._parallel_min = 0          # the small test arrays still go through the multi-threaded paths
    return be


@pytest.fixture(scope="module")
def be32():
    be = CPUBackend("float32", seed=0)
    be.num_threads = 2
    be._parallel_min = 0
    return be


# --- backend object --------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["float16", "int32", "banana", np.int64, None])
def test_bad_dtype_raises_config_error(bad):
    with pytest.raises(ConfigError, match="dtype"):
        CPUBackend(bad)
    with pytest.raises(ConfigError):
        get_backend("cpu", dtype=bad)


def test_backend_basics():
    be = get_backend("cpu", dtype=np.float32, seed=3)
    assert isinstance(be, CPUBackend) and be.name == "cpu" and be.layout == "NHWC"
    assert be.xp is np and be.dtype == np.float32 and be.channel_axis == 3
    assert CPUBackend("float64").dtype == np.float64
    assert be.internal_shape(5, (3, 7, 9)) == (5, 7, 9, 3)
    a = be.asarray(np.arange(12.0).reshape(3, 4).T)
    assert a.dtype == np.float32 and a.flags.c_contiguous and a.shape == (4, 3)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    xi = be.to_internal(x)
    assert xi.shape == (2, 4, 5, 3) and xi.dtype == np.float32
    np.testing.assert_allclose(be.to_user(xi), x, rtol=1e-6)
    assert isinstance(be.to_numpy(xi), np.ndarray)
    r1 = be.rng.standard_normal(4)
    be.seed(3)
    np.testing.assert_array_equal(be.rng.standard_normal(4), r1)
    be.synchronize()


# --- convolution -----------------------------------------------------------------------------------

# (N, C, H, W, K, kernel, stride, padding, dilation, groups, bias)
CONV_CASES = [
    (2, 3, 7, 9, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),        # odd, non-square
    (2, 4, 8, 8, 6, (3, 3), (2, 2), (1, 1), (1, 1), 1, True),        # stride 2
    (1, 5, 9, 7, 3, (3, 3), (1, 1), (0, 0), (1, 1), 1, False),       # padding 0, batch 1
    (2, 3, 6, 7, 5, (3, 3), (1, 1), (2, 2), (1, 1), 1, True),        # padding 2
    (2, 4, 9, 9, 4, (3, 3), (1, 1), (2, 2), (2, 2), 1, True),        # dilation 2
    (3, 6, 5, 5, 7, (1, 1), (1, 1), (0, 0), (1, 1), 1, True),        # 1x1 (no packing)
    (2, 6, 8, 7, 4, (1, 1), (2, 2), (0, 0), (1, 1), 1, False),       # 1x1 stride 2
    (2, 5, 10, 11, 6, (5, 3), (2, 1), (2, 1), (1, 2), 1, True),      # mixed, rectangular kernel
    (1, 3, 5, 5, 2, (3, 3), (1, 1), (3, 3), (1, 1), 1, True),        # padding > kernel - 1
    (2, 24, 9, 8, 5, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),       # more channels
    (1, 24, 12, 11, 8, (3, 3), (2, 2), (1, 1), (1, 1), 1, False),    # stride 2 (row-tap phases)
    (2, 24, 11, 9, 5, (3, 3), (2, 2), (2, 2), (2, 2), 1, True),      # stride 2, dilation 2
    (2, 22, 9, 9, 3, (5, 5), (3, 3), (1, 2), (1, 1), 1, True),       # 5x5 stride 3
    (2, 24, 26, 25, 4, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),     # several row blocks per image
    (2, 8, 24, 23, 4, (3, 3), (2, 2), (1, 1), (1, 1), 1, True),      # several row blocks, scattered dx
    (3, 8, 4, 4, 32, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),       # small image, many filters: im2col blocks
    (2, 8, 7, 7, 8, (3, 3), (1, 1), (1, 1), (1, 1), 8, True),        # depthwise
    (2, 8, 9, 8, 8, (3, 3), (2, 2), (1, 1), (1, 1), 8, False),       # depthwise stride 2
    (1, 5, 9, 10, 5, (3, 3), (1, 1), (2, 2), (2, 2), 5, True),       # depthwise dilation 2
    # at most 4 output pixels: one GEMM per (pixel, tap inside the image), `cpu.pixels` (9 filters: not
    # the planes kernels)
    (3, 6, 2, 2, 20, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),       # VGG's 2x2 images
    (2, 5, 3, 3, 4, (3, 3), (2, 2), (1, 1), (1, 1), 1, False),       # stride 2 -> 2x2
    (2, 4, 1, 1, 9, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),        # 1x1 image: the centre tap only
    (2, 3, 5, 4, 9, (3, 3), (2, 2), (1, 1), (2, 2), 1, True),        # dilation 2 -> 2x1
    (2, 3, 2, 2, 9, (1, 1), (2, 2), (1, 1), (1, 1), 1, True),        # a pixel with no tap inside: bias only
]


def _conv_setup(case, dtype="float64", seed=0):
    n, c, h, w, k, ks, st, pd, dl, g, bias = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w))
    wt = rng.standard_normal((k, c // g, *ks))
    b = rng.standard_normal(k) if bias else None
    spec = ConvSpec(c, k, ks, st, pd, dl, g)
    return spec, x, wt, b, rng


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(c[:10]) for c in CONV_CASES])
def test_conv_forward_matches_reference(case, be64):
    spec, x, w, b, _ = _conv_setup(case)
    y, _ = be64.conv2d_forward(be64.to_internal(x), w, b, spec)
    ref = ref_conv(x, w, b, spec.stride, spec.padding, spec.dilation, spec.groups)
    assert y.shape == be64.internal_shape(x.shape[0], ref.shape[1:])
    assert rel_err(be64.to_user(y), ref) < 1e-12


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(c[:10]) for c in CONV_CASES])
def test_conv_backward_vs_finite_differences(case, be64):
    spec, x, w, b, rng = _conv_setup(case, seed=1)
    xi = be64.to_internal(x)
    y, ctx = be64.conv2d_forward(xi, w, b, spec)
    r = rng.standard_normal(y.shape)

    def loss():
        return float(np.sum(be64.conv2d_forward(xi, w, b, spec)[0] * r))

    dx = be64.conv2d_backward_data(r, w, ctx, spec)
    dw, db = be64.conv2d_backward_weights(r, ctx, spec, with_bias=b is not None)
    assert dx.shape == xi.shape and dw.shape == w.shape
    # L is linear in x, w and b, so central differences are exact up to rounding
    ix = some_indices(xi.size, rng)
    np.testing.assert_allclose(dx.reshape(-1)[ix], fd_grad(loss, xi, ix, 0.5), rtol=1e-9, atol=1e-9)
    iw = some_indices(w.size, rng, 40)
    np.testing.assert_allclose(dw.reshape(-1)[iw], fd_grad(loss, w, iw, 0.5), rtol=1e-9, atol=1e-9)
    if b is not None:
        np.testing.assert_allclose(db, fd_grad(loss, b, np.arange(b.size), 0.5), rtol=1e-9, atol=1e-9)
    else:
        assert db is None
    # adjoint identity over every element: <conv(v), r> == <v, dx(r)>
    v = rng.standard_normal(xi.shape)
    yv = be64.conv2d_forward(v, w, None, spec)[0]
    assert abs(np.sum(yv * r) - np.sum(v * dx)) < 1e-9 * np.abs(yv * r).sum()


@pytest.mark.parametrize("case", [CONV_CASES[i] for i in (0, 1, 4, 7, 9, 11, 14, 15, 16, 17, 19, 22)],
                         ids=lambda c: str(c[:10]))
def test_conv_float32_matches_float64(case, be32, be64):
    spec, x, w, b, rng = _conv_setup(case, seed=2)
    y64, c64 = be64.conv2d_forward(be64.to_internal(x), w, b, spec)
    y32, c32 = be32.conv2d_forward(be32.to_internal(x), be32.asarray(w), None if b is None else be32.asarray(b), spec)
    assert y32.dtype == np.float32
    assert rel_err(y32, y64) < 2e-6
    r = rng.standard_normal(y64.shape)
    dx64 = be64.conv2d_backward_data(r, w, c64, spec)
    dx32 = be32.conv2d_backward_data(be32.asarray(r), be32.asarray(w), c32, spec)
    dw64, db64 = be64.conv2d_backward_weights(r, c64, spec, True)
    dw32, db32 = be32.conv2d_backward_weights(be32.asarray(r), c32, spec, True)
    assert dx32.dtype == dw32.dtype == db32.dtype == np.float32
    assert rel_err(dx32, dx64) < 2e-6 and rel_err(dw32, dw64) < 1e-5 and rel_err(db32, db64) < 1e-5


@pytest.mark.parametrize("case", [CONV_CASES[i] for i in (0, 1, 4, 7, 9, 11, 13, 14, 15, 19, 20, 23)],
                         ids=lambda c: str(c[:10]))
def test_conv_other_paths_agree(case):
    """The plain-NumPy fallback (no BLAS callable from numba), the im2col ("fold") packing, 1 thread and
    3 threads all agree with the reference and with the default path."""
    spec, x, w, b, rng = _conv_setup(case, seed=3)
    ref = ref_conv(x, w, b, spec.stride, spec.padding, spec.dilation, spec.groups)
    fb = CPUBackend("float64")
    fb.use_blas_kernels = False
    fold = CPUBackend("float64")
    fold._force_fold = True
    one = CPUBackend("float64")
    one.num_threads = 1
    three = CPUBackend("float64")
    three.num_threads = 3
    three._parallel_min = 0
    full = CPUBackend("float64")
    r = rng.standard_normal(full.internal_shape(ref.shape[0], ref.shape[1:]))
    results = []
    for be in (fb, fold, one, three, full):
        y, ctx = be.conv2d_forward(be.to_internal(x), w, b, spec)
        assert rel_err(be.to_user(y), ref) < 1e-12
        results.append((be.conv2d_backward_data(r, w, ctx, spec), *be.conv2d_backward_weights(r, ctx, spec, True)))
    for got in results[:-1]:
        for a, e in zip(got, results[-1]):
            assert rel_err(a, e) < 1e-12


def test_conv_float32_large_resnet_shape(be32):
    """A realistic shape (several row blocks, both threads) in float32 against float64 NumPy."""
    rng = np.random.default_rng(4)
    spec = ConvSpec(16, 16, (3, 3), (1, 1), (1, 1))
    x = rng.standard_normal((4, 32, 32, 16))
    w = rng.standard_normal((16, 16, 3, 3)) * 0.1
    ref = CPUBackend("float64")
    ref.use_blas_kernels = False
    y64, c64 = ref.conv2d_forward(x, w, None, spec)
    y32, c32 = be32.conv2d_forward(be32.asarray(x), be32.asarray(w), None, spec)
    assert rel_err(y32, y64) < 2e-6
    dy = rng.standard_normal(y64.shape)
    assert rel_err(be32.conv2d_backward_data(be32.asarray(dy), be32.asarray(w), c32, spec),
                   ref.conv2d_backward_data(dy, w, c64, spec)) < 2e-6
    assert rel_err(be32.conv2d_backward_weights(be32.asarray(dy), c32, spec, False)[0],
                   ref.conv2d_backward_weights(dy, c64, spec, False)[0]) < 1e-5


@pytest.mark.parametrize("shape", [(512, 40, 3, 3), (7, 5, 3, 3), (33, 130, 1, 1), (13, 17, 5, 5)], ids=str)
@pytest.mark.parametrize("nt", [1, 3])
def test_filter_layout_changes_are_the_transposes(shape, nt):
    """(K, C, kh, kw) <-> (kh, kw, C, K), the direct kernels' layout, in parts: exact copies."""
    be = CPUBackend("float32")
    be.num_threads, be._parallel_min = nt, 0
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    k, c, kh, kw = shape
    a = be._swap_outer(w, k, c, kh * kw)
    assert np.array_equal(a, w.transpose(2, 3, 1, 0).reshape(-1))
    assert np.array_equal(be._swap_outer(a, kh * kw, c, k), w.reshape(-1))


def test_thread_pool_runs_every_part_and_reports_errors():
    from pydtnn.backends.cpu.runtime.threads import POOL
    seen = []
    POOL.run(lambda t, nt, tag: seen.append((t, nt, tag)), 3, "x")
    assert sorted(seen) == [(0, 3, "x"), (1, 3, "x"), (2, 3, "x")]

    def boom(t, nt):
        if t == 1:
            raise ValueError("part 1 failed")

    with pytest.raises(ValueError, match="part 1 failed"):
        POOL.run(boom, 2)
    POOL.run(lambda t, nt: None, 2)          # the pool still works afterwards


def test_two_backends_used_from_two_threads_at_once():
    """Two models may run in two Python threads: the kernels serialize safely and give the same results."""
    import threading
    rng = np.random.default_rng(11)
    spec = ConvSpec(16, 8, (3, 3), (1, 1), (1, 1))
    data = [(rng.standard_normal((4, 12, 12, 16)), rng.standard_normal((8, 16, 3, 3))) for _ in range(2)]
    backends = [CPUBackend("float32"), CPUBackend("float32")]
    for be in backends:
        be.num_threads, be._parallel_min = 2, 0      # both threads go through the worker pool

    def work(be, x, w):
        y, ctx = be.conv2d_forward(be.asarray(x), be.asarray(w), None, spec)
        p, pctx = be.pool2d_forward(y, PoolSpec("max", (2, 2), (2, 2)))
        dx = be.conv2d_backward_data(be.pool2d_backward(p, pctx, PoolSpec("max", (2, 2), (2, 2))), w, ctx, spec)
        return y, dx

    expected = [work(be, x, w) for be, (x, w) in zip(backends, data)]
    got = [[None] * 2 for _ in range(10)]

    def loop(i):
        for r in range(10):
            got[r][i] = work(backends[i], *data[i])

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in range(10):
        for i in range(2):
            for a, e in zip(got[r][i], expected[i]):
                np.testing.assert_array_equal(a, e)


def test_conv_errors(be32):
    x = be32.asarray(np.zeros((1, 4, 4, 3)))
    with pytest.raises(ConfigError, match="groups"):
        be32.conv2d_forward(x, np.zeros((6, 1, 3, 3)), None, ConvSpec(3, 6, (3, 3), groups=3))
    with pytest.raises(ShapeError, match="too small"):
        be32.conv2d_forward(x, np.zeros((2, 3, 5, 5)), None, ConvSpec(3, 2, (5, 5)))
    with pytest.raises(ShapeError, match="channels"):
        be32.conv2d_forward(x, np.zeros((2, 4, 3, 3)), None, ConvSpec(4, 2, (3, 3)))


# --- pooling ---------------------------------------------------------------------------------------

def test_pool_hand_computed(be64):
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    y, _ = be64.pool2d_forward(be64.to_internal(x), PoolSpec("max", (2, 2), (2, 2)))
    np.testing.assert_array_equal(be64.to_user(y)[0, 0], [[5, 7], [13, 15]])
    y, _ = be64.pool2d_forward(be64.to_internal(x), PoolSpec("avg", (2, 2), (2, 2)))
    np.testing.assert_array_equal(be64.to_user(y)[0, 0], [[2.5, 4.5], [10.5, 12.5]])
    # average pooling counts the padded zeros (divisor kh*kw)
    y, _ = be64.pool2d_forward(be64.to_internal(np.ones((1, 1, 3, 3))), PoolSpec("avg", (3, 3), (1, 1), (1, 1)))
    np.testing.assert_allclose(be64.to_user(y)[0, 0], np.array([[4, 6, 4], [6, 9, 6], [4, 6, 4]]) / 9)
    # max pooling padding acts as -inf, not 0
    y, _ = be64.pool2d_forward(be64.to_internal(-np.ones((1, 2, 3, 3))), PoolSpec("max", (3, 3), (2, 2), (1, 1)))
    np.testing.assert_array_equal(be64.to_user(y), -np.ones((1, 2, 2, 2)))


# (N, C, H, W, kind, pool, stride, padding)
POOL_CASES = [
    (2, 3, 6, 6, "max", (2, 2), (2, 2), (0, 0)),
    (2, 3, 7, 9, "max", (3, 3), (2, 2), (1, 1)),
    (1, 4, 8, 5, "max", (3, 2), (1, 2), (1, 0)),
    (2, 3, 6, 6, "avg", (2, 2), (2, 2), (0, 0)),
    (2, 3, 7, 9, "avg", (3, 3), (2, 2), (1, 1)),
    (1, 4, 8, 5, "avg", (2, 3), (3, 1), (1, 1)),
    (3, 5, 4, 6, "max", (4, 6), (1, 1), (0, 0)),     # global (pool == (H, W))
    (3, 5, 4, 6, "avg", (4, 6), (4, 6), (0, 0)),     # global
]


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(c) for c in POOL_CASES])
def test_pool_forward_and_backward(case, be64):
    n, c, h, w, kind, pool, stride, pad = case
    rng = np.random.default_rng(5)
    x = rng.permutation(n * c * h * w).reshape(n, c, h, w) * 0.01    # distinct values: no ties
    spec = PoolSpec(kind, pool, stride, pad)
    xi = be64.to_internal(x)
    y, ctx = be64.pool2d_forward(xi, spec)
    ref = ref_pool(x, kind, pool, stride, pad)
    np.testing.assert_allclose(be64.to_user(y), ref, rtol=1e-13, atol=1e-13)
    r = rng.standard_normal(y.shape)
    dx = be64.pool2d_backward(r, ctx, spec)
    loss = lambda: float(np.sum(be64.pool2d_forward(xi, spec)[0] * r))  # noqa: E731
    ix = np.arange(xi.size) if xi.size <= 200 else rng.choice(xi.size, 200, replace=False)
    np.testing.assert_allclose(dx.reshape(-1)[ix], fd_grad(loss, xi, ix, 1e-4), rtol=1e-7, atol=1e-8)
    if pool == (h, w):   # global pooling: a plain reduction
        red = x.max(axis=(2, 3)) if kind == "max" else x.mean(axis=(2, 3))
        np.testing.assert_allclose(be64.to_user(y)[:, :, 0, 0], red, rtol=1e-13)


@pytest.mark.parametrize("pool,stride,pad", [((2, 2), (2, 2), (0, 0)), ((3, 3), (1, 1), (1, 1)),
                                             ((3, 3), (2, 2), (1, 1)), ((4, 4), (4, 4), (0, 0))])
def test_maxpool_ties_go_to_one_element(pool, stride, pad, be64):
    rng = np.random.default_rng(6)
    x = rng.integers(0, 2, (2, 3, 4, 4)).astype(np.float64)        # many ties
    spec = PoolSpec("max", pool, stride, pad)
    y, ctx = be64.pool2d_forward(be64.to_internal(x), spec)
    dy = rng.standard_normal(y.shape)
    dx = be64.to_user(be64.pool2d_backward(dy, ctx, spec))
    expect = ref_maxpool_grad_first(x, be64.to_user(dy), pool, stride, pad)
    np.testing.assert_allclose(dx, expect, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(dx.sum(), dy.sum(), rtol=1e-12)
    # constant input: every window's gradient lands on its first element only
    x = np.ones((1, 1, 4, 4))
    y, ctx = be64.pool2d_forward(be64.to_internal(x), spec)
    dx = be64.to_user(be64.pool2d_backward(np.ones(y.shape), ctx, spec))
    assert np.count_nonzero(dx) <= y.size and dx.sum() == y.size


@pytest.mark.parametrize("case", [POOL_CASES[i] for i in (1, 4, 6, 7)], ids=lambda c: str(c))
def test_pool_float32_matches_float64(case, be32, be64):
    n, c, h, w, kind, pool, stride, pad = case
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c, h, w))
    spec = PoolSpec(kind, pool, stride, pad)
    y64, c64 = be64.pool2d_forward(be64.to_internal(x), spec)
    y32, c32 = be32.pool2d_forward(be32.to_internal(x), spec)
    assert y32.dtype == np.float32 and rel_err(y32, y64) < 1e-6
    dy = rng.standard_normal(y64.shape)
    dx32 = be32.pool2d_backward(be32.asarray(dy), c32, spec)
    assert dx32.dtype == np.float32 and rel_err(dx32, be64.pool2d_backward(dy, c64, spec)) < 1e-6


# --- batch normalization ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (7, 5), (1, 2, 3, 3)])
def test_batchnorm_forward_matches_formula(shape, be64):
    rng = np.random.default_rng(8)
    xu = rng.standard_normal(shape) * 2 + 3
    x = be64.to_internal(xu) if len(shape) == 4 else xu
    c = shape[1]
    gamma, beta = rng.standard_normal(c), rng.standard_normal(c)
    eps = 1e-5
    y, mean, var, _ = be64.batchnorm_forward_train(x, gamma, beta, eps)
    axes = tuple(range(x.ndim - 1))
    m, v = x.mean(axis=axes), x.var(axis=axes)
    np.testing.assert_allclose(mean, m, rtol=1e-12)
    np.testing.assert_allclose(var, v, rtol=1e-10)
    np.testing.assert_allclose(y, (x - m) / np.sqrt(v + eps) * gamma + beta, rtol=1e-10, atol=1e-12)
    rm, rv = rng.standard_normal(c), rng.random(c) + 0.5
    yi = be64.batchnorm_forward_infer(x, gamma, beta, rm, rv, eps)
    np.testing.assert_allclose(yi, (x - rm) / np.sqrt(rv + eps) * gamma + beta, rtol=1e-12, atol=1e-12)
    assert y.shape == yi.shape == x.shape


@pytest.mark.parametrize("shape", [(3, 4, 3, 5), (6, 4)])
def test_batchnorm_backward_vs_finite_differences(shape, be64):
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape) * 1.5 + 0.5
    c = shape[-1]
    gamma, beta = rng.standard_normal(c), rng.standard_normal(c)
    eps = 1e-5
    y, _, _, ctx = be64.batchnorm_forward_train(x, gamma, beta, eps)
    r = rng.standard_normal(y.shape)
    dx, dgamma, dbeta = be64.batchnorm_backward(r, ctx)
    loss = lambda: float(np.sum(be64.batchnorm_forward_train(x, gamma, beta, eps)[0] * r))  # noqa: E731
    ix = some_indices(x.size, rng, 30)
    np.testing.assert_allclose(dx.reshape(-1)[ix], fd_grad(loss, x, ix, 1e-6), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dgamma, fd_grad(loss, gamma, range(c), 1e-6), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dbeta, fd_grad(loss, beta, range(c), 1e-6), rtol=1e-6, atol=1e-7)


def test_batchnorm_float32_matches_float64(be32, be64):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((8, 6, 6, 5)) * 0.5 + 100.0      # large mean: the statistics must stay accurate
    gamma, beta = rng.standard_normal(5), rng.standard_normal(5)
    y64, m64, v64, c64 = be64.batchnorm_forward_train(x, gamma, beta, 1e-5)
    y32, m32, v32, c32 = be32.batchnorm_forward_train(be32.asarray(x), be32.asarray(gamma), be32.asarray(beta), 1e-5)
    assert y32.dtype == m32.dtype == v32.dtype == np.float32
    assert rel_err(m32, m64) < 1e-6 and rel_err(v32, v64) < 1e-4 and rel_err(y32, y64) < 1e-4
    dy = rng.standard_normal(x.shape)
    g64 = be64.batchnorm_backward(dy, c64)
    g32 = be32.batchnorm_backward(be32.asarray(dy), c32)
    for a, e in zip(g32, g64):
        assert a.dtype == np.float32 and rel_err(a, e) < 1e-4
    yi = be32.batchnorm_forward_infer(be32.asarray(x), be32.asarray(gamma), be32.asarray(beta), m32, v32, 1e-5)
    assert yi.dtype == np.float32 and rel_err(yi, y64) < 1e-4


@pytest.mark.parametrize("pool,stride,pad", [((2, 2), (2, 2), (0, 0)), ((3, 2), (1, 2), (0, 0)),
                                             ((3, 3), (2, 2), (1, 1))])
def test_maxpool_nan_and_minus_inf_follow_the_documented_rule(pool, stride, pad):
    """Both forward loops (windows inside the image, and padded) keep the FIRST strict arg-max, never pick
    a NaN, and give tap -1 (no gradient) to a window with nothing above -inf."""
    from pydtnn.backends.cpu import pool as kp
    rng = np.random.default_rng(9)
    n, h, w, c = 2, 6, 7, 3
    x = rng.integers(0, 3, (n, h, w, c)).astype(np.float32)
    x[rng.random(x.shape) < 0.2] = np.nan
    x[rng.random(x.shape) < 0.2] = -np.inf
    x[0, :3, :3, 0] = -np.inf                                   # windows with nothing above -inf
    (kh, kw), (sh, sw), (ph, pw) = pool, stride, pad
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    y = np.empty((n, ho, wo, c), np.float32)
    idx = np.empty((n, ho, wo, c), np.int32)
    kp.maxpool_fwd(0, 1, x.reshape(-1), y.reshape(-1), idx.reshape(-1), n, h, w, c, ho, wo, kh, kw, sh, sw, ph, pw)
    for b in range(n):
        for i in range(ho):
            for j in range(wo):
                for ch in range(c):
                    best, tap = -np.inf, -1
                    for di in range(kh):
                        for dj in range(kw):
                            r, q = i * sh - ph + di, j * sw - pw + dj
                            if 0 <= r < h and 0 <= q < w and x[b, r, q, ch] > best:
                                best, tap = x[b, r, q, ch], di * kw + dj
                    assert (y[b, i, j, ch], idx[b, i, j, ch]) == (best, tap)
    assert (idx == -1).any() and not np.isnan(y).any()
