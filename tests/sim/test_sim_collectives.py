"""MPICH's allreduce cost formulas against their closed forms (Thakur, Rabenseifner, Gropp 2005), written
out by hand for a few (n, p). Values are exact binary fractions or small integers times n, so equality
holds to float64 rounding of a handful of operations (rel 1e-12 is ~1e4 eps)."""
import math

import pytest

from pydtnn.errors import ConfigError
from pydtnn.sim.collectives import allreduce_seconds, coefficients

A, B, G = 3e-6, 2e-10, 5e-11
N = 1 << 20


def close(x, y):
    return math.isclose(x, y, rel_tol=1e-12)


@pytest.mark.parametrize("p", [2, 4, 8, 16, 5, 6, 12])
def test_ring(p):
    # 2(p-1) alpha + 2 (p-1)/p n beta + (p-1)/p n gamma
    assert close(allreduce_seconds("ring", N, p, A, B, G), 2 * (p - 1) * A + 2 * (p - 1) / p * N * B + (p - 1) / p * N * G)


def test_rabenseifner_power_of_two():
    # p = 8: 2 log2 8 = 6 alpha + 2 * 7/8 n beta + 7/8 n gamma
    assert close(allreduce_seconds("rabenseifner", N, 8, A, B, G), 6 * A + 1.75 * N * B + 0.875 * N * G)


def test_rabenseifner_non_power_of_two_folds_in():
    # p = 6 -> p' = 4: (4 + 2) alpha + (2 * 3/4 n + 2n) beta + (3/4 n + n) gamma
    assert close(allreduce_seconds("rabenseifner", N, 6, A, B, G), 6 * A + 3.5 * N * B + 1.75 * N * G)


def test_recursive_doubling():
    # p = 16: log2 16 = 4 rounds of (alpha + n beta + n gamma); p = 3 -> p' = 2: 1 round + 2 fold steps
    assert close(allreduce_seconds("recursive_doubling", N, 16, A, B, G), 4 * (A + N * B + N * G))
    assert close(allreduce_seconds("recursive_doubling", N, 3, A, B, G), 3 * A + 3 * N * B + 2 * N * G)


def test_binomial_reduce_then_broadcast():
    # ceil(log2 5) = 3: reduce 3 (alpha + n beta + n gamma), broadcast 3 (alpha + n beta)
    assert close(allreduce_seconds("binomial", N, 5, A, B, G), 6 * A + 6 * N * B + 3 * N * G)
    assert close(allreduce_seconds("bta", N, 5, A, B, G), allreduce_seconds("binomial", N, 5, A, B, G))


def test_hierarchical():
    # 4 nodes x 8 per node: intra binomial reduce + bcast, log2 8 = 3: 3 (2 alpha + 2 n beta + n gamma);
    # leaders: Rabenseifner on 4 with the inter-node parameters: 4 a + 1.5 n b + 0.75 n g
    a2, b2, g2 = 1e-5, 1e-9, G
    want = 3 * (2 * A + 2 * N * B + N * G) + 4 * a2 + 1.5 * N * b2 + 0.75 * N * g2
    got = allreduce_seconds("hierarchical", N, 32, A, B, G, nodes=4, inter=(a2, b2, g2))
    assert close(got, want)
    with pytest.raises(ConfigError):
        allreduce_seconds("hierarchical", N, 30, A, B, G, nodes=4)


def test_auto_is_mpich_choice_and_one_process_is_free():
    assert coefficients("auto", 2048, 8) == coefficients("recursive_doubling", 2048, 8)
    assert coefficients("auto", 2049, 8) == coefficients("rabenseifner", 2049, 8)
    assert coefficients("vdg", N, 8) == coefficients("rabenseifner", N, 8)
    assert allreduce_seconds("ring", N, 1, A, B, G) == 0.0
    with pytest.raises(ConfigError, match="network_alg"):
        coefficients("butterfly", N, 4)


def test_array_sizes_match_scalars():
    import numpy as np
    sizes = np.array([4096.0, 1e6, 6.4e7])
    got = allreduce_seconds("ring", sizes, 12, A, B, G)
    assert [close(g, allreduce_seconds("ring", float(s), 12, A, B, G)) for g, s in zip(got, sizes)] == [True] * 3
