"""The CPU backend's threaded paths of the sequence layers against plain NumPy references.

`backend.matmul` (FC, attention: GEMMs cut into parts for the backend's one thread pool, operands passed
as strided views) is checked in float64 against a product summed in exact-enough float64 by `np.einsum`
over the same views; each case runs with the pool forced to 2 parts and every size threaded
(`_parallel_min = 0`), so both the split and the single-part paths are exercised.
"""
from __future__ import annotations

import numpy as np
import pytest

from pydtnn.backends.cpu import matmul as kmm
from pydtnn.backends import get_backend


def _backend(dtype, threads):
    be = get_backend("cpu", dtype)
    be.num_threads, be._parallel_min = threads, 0
    return be


def _bound(a, b, dtype):
    """Entry-wise error bound of a computed product: k * eps * (|A| |B|) (Higham, Thm 3.5), times 2 for the
    reference's own rounding."""
    k = a.shape[-1]
    return 2 * k * np.finfo(dtype).eps * np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))


def _views(rng, dtype):
    """(name, a, b): the operand layouts FC and attention pass (plain, transposed, head slices, batches)."""
    r = lambda *s: rng.standard_normal(s).astype(dtype)
    qkv = r(3 * 7, 3 * 8)                                # (N T, 3 D), N=3, T=7, D=8, 2 heads of 4
    heads = lambda i: qkv[:, i * 8:(i + 1) * 8].reshape(3, 7, 2, 4).transpose(0, 2, 1, 3)
    x, w = r(64, 33), r(33, 17)
    return [("plain", x, w), ("a transposed", r(33, 64).T, w), ("b transposed", x, r(17, 33).T),
            ("both transposed", r(33, 64).T, r(17, 33).T), ("wide output", r(5, 33), r(33, 70)),
            ("one row", r(1, 33), w), ("heads q k^T", heads(0), heads(1).transpose(0, 1, 3, 2)),
            ("heads attn v", r(3, 2, 7, 7), heads(2)), ("broadcast batch", r(4, 5, 6), r(6, 3)),
            ("strided columns (copied)", r(64, 66)[:, ::2], r(33, 5))]


@pytest.mark.parametrize("threads", [1, 2])
def test_matmul_matches_numpy_on_every_layout(threads):
    rng = np.random.default_rng(0)
    be = _backend("float64", threads)
    for name, a, b in _views(rng, np.float64):
        got = be.matmul(a, b)
        ref = np.einsum("...ik,...kj->...ij", a, b)
        assert got.shape == ref.shape, name
        assert np.all(np.abs(got - ref) <= _bound(a, b, np.float64)), name


def test_matmul_runs_on_the_pool_and_fills_out(monkeypatch):
    """A single product runs as `linear_parts` (no bias), a batch as `gemm_parts`, both on 2 parts."""
    calls = []
    for name in ("gemm_parts", "linear_parts"):
        inner = getattr(kmm, name)

        def counted(*args, _inner=inner, _name=name):
            calls.append((_name, args[1]))
            return _inner(*args)
        monkeypatch.setattr(kmm, name, counted)
    rng = np.random.default_rng(1)
    be = _backend("float32", 2)
    x, dy = rng.standard_normal((64, 40)).astype(np.float32), rng.standard_normal((64, 9)).astype(np.float32)
    out = np.full((40, 9), np.nan, np.float32)
    assert be.matmul(x.T, dy, out=out) is out
    assert set(calls) == {("linear_parts", 2)}       # each part of 2 (the pool calls a Python callable per part)
    assert np.all(np.abs(out - x.T.astype(np.float64) @ dy) <= _bound(x.T, dy, np.float32))
    calls.clear()
    batch = rng.standard_normal((3, 64, 40)).astype(np.float32)
    got = be.matmul(batch, x.T)
    assert set(calls) == {("gemm_parts", 2)}
    assert np.all(np.abs(got - batch.astype(np.float64) @ x.T) <= _bound(batch, x.T, np.float32))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_linear_adds_the_bias_in_the_product(threads):
    """x @ w + b on every 2-D layout FC and attention pass (w transposed, wide outputs split by columns),
    with and without a bias, within the product's error bound (the bias enters exactly, before the sum)."""
    rng = np.random.default_rng(3)
    be = _backend("float64", threads)
    for name, a, w in _views(rng, np.float64):
        if a.ndim != 2 or w.ndim != 2:
            continue
        b = rng.standard_normal(w.shape[1])
        for bias in (b, None):
            got = be.linear(a, w, bias)
            ref = np.einsum("ik,kj->ij", a, w) + (0 if bias is None else bias)
            assert got.shape == ref.shape and got.flags.c_contiguous, name
            assert np.all(np.abs(got - ref) <= _bound(a, w, np.float64) + 4 * np.finfo(np.float64).eps * np.abs(ref)), name


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_linear_weight_grads_in_both_weight_layouts(threads):
    """dw = x^T dy (in, out) or dy^T x (out, in), and db = dy summed over rows (float64 sums), against
    einsum; wide and tall weight matrices (the GEMM split by columns or by rows), with and without bias."""
    rng = np.random.default_rng(5)
    be = _backend("float32", threads)
    for rows, fi, fo in ((70, 9, 33), (70, 33, 9), (1, 4, 4)):
        x, dy = rng.standard_normal((rows, fi)).astype(np.float32), rng.standard_normal((rows, fo)).astype(np.float32)
        want = np.einsum("ri,ro->io", x.astype(np.float64), dy)
        bound = _bound(x.T, dy, np.float32)
        for out_in in (False, True):
            dw = np.full((fo, fi) if out_in else (fi, fo), np.nan, np.float32)
            db = np.full(fo, np.nan, np.float32)
            be.linear_weight_grads(x, dy, dw, db, out_in=out_in)
            got = dw.T if out_in else dw
            assert np.all(np.abs(got - want) <= bound), (rows, fi, fo, out_in)
            sums = dy.astype(np.float64).sum(axis=0)      # float64 sum (rows eps64 of sum |dy|), rounded once
            assert np.all(np.abs(db - sums) <= 2.0 ** -24 * np.abs(sums) + rows * 2.0 ** -52 * np.abs(dy).sum(axis=0))
            be.linear_weight_grads(x, dy, dw, None, out_in=out_in)
            assert np.all(np.abs((dw.T if out_in else dw) - want) <= bound)


def test_matmul_float32_float64_and_odd_cases_fall_back():
    rng = np.random.default_rng(2)
    be = _backend("float32", 2)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((4, 3))          # float64 into a float32 backend
    np.testing.assert_array_equal(be.matmul(a, b), a @ b)
    v = rng.standard_normal(4).astype(np.float32)                            # a vector: NumPy's rules
    np.testing.assert_array_equal(be.matmul(a.astype(np.float32), v), a.astype(np.float32) @ v)
    empty = np.zeros((0, 4), np.float32)
    assert be.matmul(empty, b.astype(np.float32)).shape == (0, 3)


# --- fused attention (`cpu.attention`): a (sample, head) pair's products and softmax in one part ---------

def _attention_reference(qkv, n, t, heads, causal, mask):
    """context and attention weights in float64 by einsum (no BLAS), and dL/dqkv of sum(context * g)."""
    d = qkv.shape[1] // 3
    hd = d // heads
    q, k, v = (qkv[:, i * d:(i + 1) * d].reshape(n, t, heads, hd).transpose(0, 2, 1, 3) for i in range(3))
    s = np.einsum("nhid,nhjd->nhij", q, k) / np.sqrt(hd)
    if causal:
        s = np.where(np.tril(np.ones((t, t))) > 0, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    w = p if mask is None else p * mask
    ctx = np.einsum("nhij,nhjd->nhid", w, v)
    return ctx.transpose(0, 2, 1, 3).reshape(n * t, d), p


def _attention_cases(rng):
    """(n, t, heads, hd, causal, mask): the ViT's shape, odd sizes, one position, dropout masks."""
    def mask(n, h, t):
        return (rng.random((n, h, t, t)) < 0.7) / 0.7
    return [(64, 16, 4, 16, False, None), (3, 7, 3, 5, True, mask(3, 3, 7)), (2, 1, 1, 3, True, None),
            (5, 9, 2, 8, False, mask(5, 2, 9))]


@pytest.mark.parametrize("threads", [1, 2])
def test_fused_attention_matches_an_einsum_reference(monkeypatch, threads):
    """float64: sums of at most 16 products of O(1) numbers carry ~16 eps64 (4e-15); 1e-12 leaves room for
    exp and the division. The backward against finite differences of sum(context * g) (central, h = 1e-6:
    truncation ~h^2, rounding ~eps64 / h ~ 1e-10)."""
    from pydtnn.backends.cpu import attention as katt
    from pydtnn.backends.cpu.runtime.threads import POOL
    ran, real = [], POOL.run
    monkeypatch.setattr(POOL, "run", lambda fn, nt, *a: (ran.append(fn), real(fn, nt, *a))[1])
    rng = np.random.default_rng(6)
    be = _backend("float64", threads)
    for n, t, h, hd, causal, mask in _attention_cases(rng):
        qkv = rng.standard_normal((n * t, 3 * h * hd))
        ctx, attn = be.attention_forward(qkv, n, t, h, causal, mask)
        ref_ctx, ref_p = _attention_reference(qkv, n, t, h, causal, mask)
        np.testing.assert_allclose(attn, ref_p, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ctx, ref_ctx, rtol=1e-12, atol=1e-12)
        g = rng.standard_normal(ctx.shape)
        dqkv = be.attention_backward(g, qkv, attn, mask, n, t, h)
        for q in rng.choice(qkv.size, 12, replace=False):
            e = np.zeros(qkv.size)
            e[q] = 1e-6
            e = e.reshape(qkv.shape)
            fd = ((_attention_reference(qkv + e, n, t, h, causal, mask)[0] * g).sum()
                  - (_attention_reference(qkv - e, n, t, h, causal, mask)[0] * g).sum()) / 2e-6
            assert abs(dqkv.reshape(-1)[q] - fd) <= 1e-7 * max(1.0, abs(fd))
    assert katt.attention_fwd in ran and katt.attention_bwd in ran


def test_fused_attention_float32_against_float64():
    """float32 against the float64 reference, inputs of scale 0.5: a score's error ~ hd eps32 |q||k| /
    sqrt(hd) (~1e-6), the weights' a few eps32 more, the context's ~ t eps32 |w||v|: within 1e-5. The
    gradient goes through three products in a row (dweights: hd terms, the softmax's g - sum(g y): t terms
    that cancel, dq and dk: t terms), ~(hd + 2 t) eps32 of the sums of absolute values (~3e-6), which
    cancellation can make 10-30x an entry: 1e-4 relative, 1e-5 absolute."""
    rng = np.random.default_rng(7)
    be = _backend("float32", 2)
    for n, t, h, hd, causal, mask in _attention_cases(rng):
        qkv = 0.5 * rng.standard_normal((n * t, 3 * h * hd))
        m32 = None if mask is None else mask.astype(np.float32)
        ctx, attn = be.attention_forward(qkv.astype(np.float32), n, t, h, causal, m32)
        ref_ctx, ref_p = _attention_reference(qkv.astype(np.float32).astype(np.float64), n, t, h, causal, mask)
        np.testing.assert_allclose(attn, ref_p, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ctx, ref_ctx, rtol=1e-5, atol=1e-5)
        g = rng.standard_normal(ctx.shape)
        d32 = be.attention_backward(g.astype(np.float32), qkv.astype(np.float32), attn, m32, n, t, h)
        d64 = _backend("float64", 2).attention_backward(g, qkv.astype(np.float32).astype(np.float64), ref_p,
                                                        mask, n, t, h)
        np.testing.assert_allclose(d32, d64, rtol=1e-4, atol=1e-5)


def test_float32_exp_within_two_ulps():
    """`exp_neg32` (the float32 softmax's exp) against exp in float64 on 2,000,001 points of [0, 87]: the
    Horner steps' roundings (the last two ~0.5 ulp each, the earlier ones damped by |r| <= 0.35) and r's
    rounding bound it by ~1.7 ulp. NaN stays NaN."""
    from numba import njit

    from pydtnn.backends.cpu.special import exp_neg32

    @njit
    def each(u, out):
        for i in range(u.size):
            out[i] = exp_neg32(u[i])
    u = np.linspace(0, 87, 2_000_001).astype(np.float32)
    got = np.empty_like(u)
    each(u, got)
    ref = np.exp(-u.astype(np.float64))
    ulps = np.abs(got - ref) / np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 2.0
    each(np.array([np.nan, 0.0], np.float32), got[:2])
    assert np.isnan(got[0]) and got[1] == 1.0


@pytest.mark.parametrize("length", [16, 1000, 4097])
def test_float32_softmax_on_long_rows(length):
    """Rows longer than the float32 sum's block (64): exp within 2 ulps, u = m - s rounded once (eps32 u / 2
    relative), the blocks' sums (<= 11 eps32 relative), the scaling: <= 2e-6 relative; the weights far below
    the row's largest carry their u's rounding, under 1e-9 absolute."""
    be = _backend("float32", 2)
    s = np.random.default_rng(8).standard_normal((3, length)) * 3
    ref = np.exp(s - s.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    got = be.softmax(s.astype(np.float32))
    np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_rows_keep_nan_and_minus_inf(dtype):
    """A NaN score makes its row NaN (a diverged run must show); -inf weighs 0; the other rows are exact
    softmaxes (the row maximum skips its NaN-free fast loop only for the NaN row)."""
    be = _backend(dtype, 2)
    s = np.array([[1, np.nan, 2], [0, -np.inf, 3], [0, 0, 1], [-1, -np.inf, -np.inf]], dtype)
    got = be.softmax(s.copy())
    assert np.all(np.isnan(got[0]))
    want = np.exp(s[1:] - s[1:].max(-1, keepdims=True))
    np.testing.assert_allclose(got[1:], want / want.sum(-1, keepdims=True), rtol=4 * np.finfo(dtype).eps * 8)
    assert got[1, 1] == 0 and got[3, 0] == 1


def test_softmax_backward_float32_against_float64():
    """g <- y (g - <g, y>) in float32: the dot product in float32 blocks of 64 (8 lanes: <= 11 eps32 of
    sum |g y|), then two roundings; against float64, relative to |y| (|g| + sum |g y|)."""
    be32, be64 = _backend("float32", 2), _backend("float64", 2)
    rng = np.random.default_rng(9)
    for length in (17, 200):
        y = be64.softmax(rng.standard_normal((40, length)) * 3)
        g = rng.standard_normal((40, length))
        want = be64.softmax_backward(y, g.copy())
        got = be32.softmax_backward(y.astype(np.float32), g.astype(np.float32))
        scale = np.abs(y) * (np.abs(g) + (np.abs(g) * y).sum(-1, keepdims=True))
        assert np.all(np.abs(got - want) <= 16 * 2.0 ** -24 * scale + 1e-30)


# --- GELU and last-axis LayerNorm kernels (`cpu.rows`), every size split over 3 parts ------------------

def test_gelu_kernels_match_the_formula_and_finite_differences():
    import math
    from pydtnn.activations import GELU
    from pydtnn.testing import check_gradients
    be = _backend("float64", 3)
    x = np.concatenate([np.linspace(-12, 12, 97), [-40.0, 40.0, 0.0]]).reshape(4, 25)
    y, ctx = be.gelu_forward(x)
    phi = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x.ravel()]).reshape(x.shape)
    # erfc's exp(-x^2/2) carries ~|x^2/2| ulps of its argument (72 at x = -12): relative 1e-13
    np.testing.assert_allclose(y, x * phi, rtol=1e-13, atol=1e-300)
    dy = np.random.default_rng(3).standard_normal(x.shape)
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    np.testing.assert_allclose(be.gelu_backward(dy, ctx), dy * (phi + x * pdf), rtol=1e-13, atol=1e-300)
    errors = check_gradients(GELU(), (3, 7), backend=be, batch_size=3)
    assert errors and max(errors.values()) <= 1e-6


def test_layernorm_kernels_match_numpy_and_finite_differences():
    from pydtnn.layers import LayerNorm
    from pydtnn.testing import check_gradients
    rng = np.random.default_rng(4)
    be = _backend("float64", 3)
    x, g, b = rng.standard_normal((5, 7, 24)) * 3 + 2, rng.standard_normal(24), rng.standard_normal(24)
    y, ctx = be.layernorm_forward(x, g, b, 1e-5)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    xhat = (x - mu) / np.sqrt(var + 1e-5)
    # a row's sums of 24 terms in float64: error ~ 24 eps * |x| / std, far below 1e-12
    np.testing.assert_allclose(y, xhat * g + b, rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(x.shape)
    dx, dgamma, dbeta = be.layernorm_backward(dy, ctx, g)
    gx = dy * g
    ref = (gx - gx.mean(-1, keepdims=True) - xhat * (gx * xhat).mean(-1, keepdims=True)) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(dx, ref, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(dgamma, (dy * xhat).sum((0, 1)), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dbeta, dy.sum((0, 1)), rtol=1e-12, atol=1e-12)
    errors = check_gradients(LayerNorm(), (4, 6), backend=be, batch_size=3)
    assert errors and max(errors.values()) <= 1e-6


def test_float32_kernels_agree_with_float64():
    """float32 against float64 on the same data: GELU ~ a few eps32 relative; LayerNorm's x_hat ~ eps32 *
    (|x - mean| / std + d eps-sized terms from the float64 sums), bounded here by 1e-5 absolute."""
    rng = np.random.default_rng(5)
    x64 = rng.standard_normal((64, 96)) * 2
    be32, be64 = _backend("float32", 2), _backend("float64", 2)
    y32, _ = be32.gelu_forward(x64.astype(np.float32))
    y64, _ = be64.gelu_forward(x64)
    np.testing.assert_allclose(y32, y64, rtol=1e-6, atol=1e-6)
    g, b = rng.standard_normal(96), rng.standard_normal(96)
    l32, _ = be32.layernorm_forward(x64.astype(np.float32), g.astype(np.float32), b.astype(np.float32), 1e-5)
    l64, _ = be64.layernorm_forward(x64, g, b, 1e-5)
    np.testing.assert_allclose(l32, l64, rtol=1e-5, atol=1e-5)


# --- 1x1 convolutions on small images: one whole-batch GEMM (`CPUBackend._pointwise`) -------------------

@pytest.mark.parametrize("hw", [(2, 2), (3, 5), (4, 4)])
def test_pointwise_convolution_on_small_images(hw):
    from pydtnn.backends import ConvSpec
    from pydtnn.layers import Conv2D
    from pydtnn.testing import check_gradients
    rng = np.random.default_rng(6)
    be = _backend("float64", 2)
    c, k = 6, 5
    spec = ConvSpec(c, k, (1, 1), (1, 1), (0, 0), (1, 1))
    assert be._pointwise(spec, *hw)
    x, w, b = rng.standard_normal((3,) + hw + (c,)), rng.standard_normal((k, c, 1, 1)), rng.standard_normal(k)
    y, ctx = be.conv2d_forward(x, w, b, spec)
    # sums of c = 6 products in float64: errors ~ 6 eps |x| |w|, far below 1e-12
    np.testing.assert_allclose(y, np.einsum("nhwc,kc->nhwk", x, w[:, :, 0, 0]) + b, rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    np.testing.assert_allclose(be.conv2d_backward_data(dy, w, ctx, spec), np.einsum("nhwk,kc->nhwc", dy, w[:, :, 0, 0]),
                               rtol=1e-12, atol=1e-12)
    dw, db = be.conv2d_backward_weights(dy, ctx, spec, True)
    np.testing.assert_allclose(dw[:, :, 0, 0], np.einsum("nhwk,nhwc->kc", dy, x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(db, dy.sum((0, 1, 2)), rtol=1e-12, atol=1e-12)
    errors = check_gradients(Conv2D(k, 1), (c,) + hw, backend=be, batch_size=3)
    assert errors and max(errors.values()) <= 1e-6


# --- float32 GELU without libm (`cpu.special.ndtr32`): vectorizable, error bound from its fit ------

def _float32_sample():
    """Every 4099th float32 bit pattern of the finite range up to |x| = 16 (both signs: tails, the
    subnormal Phi near x = -14, x = +-0), plus the ends of the fit (|x| = 15)."""
    bits = np.arange(0, 0x41800000, 4099, dtype=np.uint32)               # 0 .. 16.0
    pos = bits.view(np.float32)
    return np.concatenate([pos, -pos, np.float32([15, -15, 14.9, -14.9])])


def test_gelu_float32_kernel_within_one_ulp_of_libm():
    """The fit's relative error (8.4e-10) and exp's (~1e-15) stay far below half an ulp (6e-8) before the
    one rounding to float32, so Phi is within 1 ulp (|err| <= 2^-23 |Phi|, or half the smallest subnormal),
    y = x Phi within 2 (Phi's, then the product's rounding), and the derivative Phi + x phi the forward keeps
    for the backward, from the float32 Phi, within 2 eps32 * (Phi + |x phi|) (its terms cancel near
    x = -0.75); the backward multiplies dy = 1 by it exactly."""
    import math
    from numba import njit
    from pydtnn.backends.cpu.special import ndtr32

    @njit
    def phi_of(x, out):
        for i in range(x.size):
            out[i] = ndtr32(x[i])
    x = _float32_sample()
    be = _backend("float32", 3)
    y, dfac = be.gelu_forward(x.reshape(1, -1))
    cdf = np.empty_like(x)
    phi_of(x, cdf)
    xd = x.astype(np.float64)
    phi_ref = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in xd])
    tiny = 2.0 ** -149
    eps = 2.0 ** -23
    assert np.all(np.abs(cdf - phi_ref) <= eps * phi_ref + tiny / 2)
    assert np.all(np.abs(y[0] - xd * phi_ref) <= 2 * eps * np.abs(xd * phi_ref) + 16 * tiny)
    dx = be.gelu_backward(np.ones_like(y), dfac)
    pdf = np.exp(-0.5 * xd * xd) / math.sqrt(2 * math.pi)
    assert np.all(np.abs(dx[0] - (phi_ref + xd * pdf)) <= 2 * eps * (phi_ref + np.abs(xd * pdf)) + tiny)
    np.testing.assert_array_equal(dx, dfac)


def test_gelu_float32_kernel_special_values():
    """NaN propagates forward and backward; +inf passes; -inf gives -inf * 0 = NaN, as NumPy's formula."""
    be = _backend("float32", 1)
    x = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 30.0, -30.0]).reshape(1, -1)
    y, ctx = be.gelu_forward(x)
    assert np.isnan(y[0, 0]) and y[0, 1] == np.inf and np.isnan(y[0, 2])
    np.testing.assert_array_equal(y[0, 3:], [0.0, 0.0, 30.0, 0.0])
    np.testing.assert_array_equal(ctx[0, 3:], [0.5, 0.5, 1.0, 0.0])       # the derivative kept for backward
    dx = be.gelu_backward(np.ones_like(x), ctx)
    assert np.isnan(dx[0, 0])
    np.testing.assert_array_equal(dx[0, 3:], [0.5, 0.5, 1.0, 0.0])


def test_gelu_of_another_dtype_falls_back_consistently():
    """float64 input to a float32 backend: the device-independent formula forward (its erfc is the
    backend's, float32: ~1e-7 relative), and the derivative from that Phi kept for backward."""
    import math
    be = _backend("float32", 2)
    x = np.linspace(-5, 5, 11)
    y, ctx = be.gelu_forward(x)
    phi = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
    np.testing.assert_allclose(y, x * phi, rtol=1e-6)
    dy = np.linspace(1, 2, 11)
    np.testing.assert_allclose(be.gelu_backward(dy, ctx), dy * (phi + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)),
                               rtol=1e-6, atol=1e-7)


# --- glibc's heap kept for reuse (`cpu.runtime.heap`) ---------------------------------------------

def test_keep_heap_raises_glibc_thresholds_and_can_be_turned_off():
    import platform
    import subprocess
    import sys
    from pydtnn.backends.cpu.runtime import heap as _cpu_heap
    get_backend("cpu", "float32")                 # a CPU backend applies it
    assert _cpu_heap._applied == [platform.libc_ver()[0] == "glibc"]
    code = "from pydtnn.backends.cpu.runtime import heap; print(heap.keep_heap())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYDTNN_CPU_KEEP_HEAP": "0"})
    assert out.stdout.strip() == "False", out.stderr
