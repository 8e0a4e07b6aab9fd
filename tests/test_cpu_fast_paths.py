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
