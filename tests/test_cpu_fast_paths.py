"""The CPU backend's threaded paths of the sequence layers against plain NumPy references.

`backend.matmul` (FC, attention: GEMMs cut into parts for the backend's one thread pool, operands passed
as strided views) is checked in float64 against a product summed in exact-enough float64 by `np.einsum`
over the same views; each case runs with the pool forced to 2 parts and every size threaded
(`_parallel_min = 0`), so both the split and the single-part paths are exercised.
"""
from __future__ import annotations

import numpy as np
import pytest

from pydtnn.backends import _cpu_matmul as kmm
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
    calls = []
    inner = kmm.gemm_parts

    def counted(*args):
        calls.append(args[1])
        return inner(*args)
    monkeypatch.setattr(kmm, "gemm_parts", counted)
    rng = np.random.default_rng(1)
    be = _backend("float32", 2)
    x, dy = rng.standard_normal((64, 40)).astype(np.float32), rng.standard_normal((64, 9)).astype(np.float32)
    out = np.full((40, 9), np.nan, np.float32)
    assert be.matmul(x.T, dy, out=out) is out
    assert calls and all(nt == 2 for nt in calls)
    assert np.all(np.abs(out - x.T.astype(np.float64) @ dy) <= _bound(x.T, dy, np.float32))


def test_matmul_float32_float64_and_odd_cases_fall_back():
    rng = np.random.default_rng(2)
    be = _backend("float32", 2)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((4, 3))          # float64 into a float32 backend
    np.testing.assert_array_equal(be.matmul(a, b), a @ b)
    v = rng.standard_normal(4).astype(np.float32)                            # a vector: NumPy's rules
    np.testing.assert_array_equal(be.matmul(a.astype(np.float32), v), a.astype(np.float32) @ v)
    empty = np.zeros((0, 4), np.float32)
    assert be.matmul(empty, b.astype(np.float32)).shape == (0, 3)


# --- GELU and last-axis LayerNorm kernels (`_cpu_rows`), every size split over 3 parts ------------------

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


# --- float32 GELU without libm (`_cpu_special.ndtr32`): vectorizable, error bound from its fit ------

def _float32_sample():
    """Every 4099th float32 bit pattern of the finite range up to |x| = 16 (both signs: tails, the
    subnormal Phi near x = -14, x = +-0), plus the ends of the fit (|x| = 15)."""
    bits = np.arange(0, 0x41800000, 4099, dtype=np.uint32)               # 0 .. 16.0
    pos = bits.view(np.float32)
    return np.concatenate([pos, -pos, np.float32([15, -15, 14.9, -14.9])])


def test_gelu_float32_kernel_within_one_ulp_of_libm():
    """The fit's relative error (8.4e-10) and exp's (~1e-15) stay far below half an ulp (6e-8) before the
    one rounding to float32, so Phi is within 1 ulp (|err| <= 2^-23 |Phi|, or half the smallest subnormal),
    y = x Phi within 2 (Phi's, then the product's rounding), and the backward factor Phi + x phi, which
    uses the stored float32 Phi, within 2 eps32 * (Phi + |x phi|) (its terms cancel near x = -0.75)."""
    import math
    x = _float32_sample()
    be = _backend("float32", 3)
    y, (x_kept, cdf) = be.gelu_forward(x.reshape(1, -1))
    xd = x.astype(np.float64)
    phi_ref = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in xd])
    tiny = 2.0 ** -149
    eps = 2.0 ** -23
    assert np.all(np.abs(cdf[0] - phi_ref) <= eps * phi_ref + tiny / 2)
    assert np.all(np.abs(y[0] - xd * phi_ref) <= 2 * eps * np.abs(xd * phi_ref) + 16 * tiny)
    dy = np.ones_like(y)
    dx = be.gelu_backward(dy, (x_kept, cdf))
    pdf = np.exp(-0.5 * xd * xd) / math.sqrt(2 * math.pi)
    assert np.all(np.abs(dx[0] - (phi_ref + xd * pdf)) <= 2 * eps * (phi_ref + np.abs(xd * pdf)) + tiny)


def test_gelu_float32_kernel_special_values():
    """NaN propagates forward and backward; +inf passes; -inf gives -inf * 0 = NaN, as NumPy's formula."""
    be = _backend("float32", 1)
    x = np.float32([np.nan, np.inf, -np.inf, 0.0, -0.0, 30.0, -30.0]).reshape(1, -1)
    y, ctx = be.gelu_forward(x)
    assert np.isnan(y[0, 0]) and y[0, 1] == np.inf and np.isnan(y[0, 2])
    np.testing.assert_array_equal(y[0, 3:], [0.0, 0.0, 30.0, 0.0])
    np.testing.assert_array_equal(ctx[1][0, 3:], [0.5, 0.5, 1.0, 0.0])
    dx = be.gelu_backward(np.ones_like(x), ctx)
    assert np.isnan(dx[0, 0])
    np.testing.assert_array_equal(dx[0, 3:], [0.5, 0.5, 1.0, 0.0])


# --- glibc's heap kept for reuse (`_cpu_heap`) ---------------------------------------------------------

def test_keep_heap_raises_glibc_thresholds_and_can_be_turned_off():
    import platform
    import subprocess
    import sys
    from pydtnn.backends import _cpu_heap
    get_backend("cpu", "float32")                 # a CPU backend applies it
    assert _cpu_heap._applied == [platform.libc_ver()[0] == "glibc"]
    code = "from pydtnn.backends import _cpu_heap; print(_cpu_heap.keep_heap())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYDTNN_CPU_KEEP_HEAP": "0"})
    assert out.stdout.strip() == "False", out.stderr
