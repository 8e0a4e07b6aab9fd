"""Allreduce cost formulas of MPICH's algorithms (Thakur, Rabenseifner and Gropp, IJHPCA 2005).

Every formula is linear in the three machine parameters: ``cost = a*alpha + b*beta + c*gamma`` with
alpha the latency of one message (s), beta the transfer time per byte (s/B), gamma the reduction time
per byte (s/B); n is the message size in bytes, p the number of processes. `coefficients` returns
(a, b, c), which is what the network fit needs (least squares in alpha, beta, gamma); `allreduce_seconds`
the time. The formulas are written out in docs/simulation.md.

Non-powers of two (MPICH's recursive doubling and Rabenseifner): the p - p' extra processes, p' the
largest power of two <= p, first send their data to a partner (alpha + n*beta + n*gamma) and get the
result back at the end (alpha + n*beta); the p' others run the power-of-two algorithm.
"""
from __future__ import annotations

import math

import numpy as np

from pydtnn.errors import ConfigError

__all__ = ["ALGORITHMS", "UPSTREAM_ALIASES", "coefficients", "allreduce_seconds", "resolve_algorithm",
           "MPICH_SHORT_MSG_BYTES"]

ALGORITHMS = ("auto", "ring", "rabenseifner", "recursive_doubling", "binomial", "hierarchical")
# upstream's --network_alg names, by the algorithms they name: van de Geijn's reduce-scatter + allgather
# (the bandwidth-optimal one, MPICH's Rabenseifner) and a binomial tree (reduce, then broadcast)
UPSTREAM_ALIASES = {"vdg": "rabenseifner", "bta": "binomial"}
MPICH_SHORT_MSG_BYTES = 2048     # MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE: "auto" picks recursive doubling up to it


def resolve_algorithm(name: str) -> str:
    name = UPSTREAM_ALIASES.get(name, name)
    if name not in ALGORITHMS:
        raise ConfigError(f"--network_alg must be one of {', '.join(ALGORITHMS + tuple(UPSTREAM_ALIASES))}, "
                          f"got {name!r}")
    return name


def _pof2(p: int) -> int:
    return 1 << (int(p).bit_length() - 1)


def _extra(p: int, n: float) -> tuple[float, float, float]:
    """MPICH's fold-in / fold-out of the processes beyond the largest power of two."""
    return (0.0, 0.0, 0.0) if _pof2(p) == p else (2.0, 2.0 * n, n)


def coefficients(algorithm: str, n: float, p: int) -> tuple[float, float, float]:
    """(a, b, c) with allreduce time = a*alpha + b*beta + c*gamma, for n bytes on p processes (flat)."""
    p = int(p)
    n = float(n)
    if p <= 1 or n <= 0:
        return 0.0, 0.0, 0.0
    algorithm = resolve_algorithm(algorithm)
    if algorithm == "auto":
        algorithm = "recursive_doubling" if n <= MPICH_SHORT_MSG_BYTES else "rabenseifner"
    if algorithm == "ring":                       # reduce-scatter ring + allgather ring
        return 2.0 * (p - 1), 2.0 * (p - 1) / p * n, (p - 1) / p * n
    if algorithm == "binomial":                   # binomial reduce to rank 0, binomial broadcast
        lg = math.ceil(math.log2(p))
        return 2.0 * lg, 2.0 * lg * n, lg * n
    q = _pof2(p)
    ea, eb, ec = _extra(p, n)
    lg = math.log2(q)
    if algorithm == "recursive_doubling":         # log p exchanges of the whole vector
        return lg + ea, lg * n + eb, lg * n + ec
    if algorithm == "rabenseifner":               # recursive-halving reduce-scatter + recursive-doubling allgather
        return 2.0 * lg + ea, 2.0 * (q - 1) / q * n + eb, (q - 1) / q * n + ec
    raise ConfigError("hierarchical needs the node layout: use allreduce_seconds(..., nodes=N)")


def allreduce_seconds(algorithm: str, n, p: int, alpha: float, beta: float, gamma: float, *,
                      nodes: int = 1, inter: tuple[float, float, float] | None = None,
                      inter_algorithm: str = "auto") -> np.ndarray | float:
    """Seconds of one allreduce of n bytes (a number or an array) on p processes.

    ``hierarchical``: p = nodes * q processes, q per node. Binomial reduce inside each node (alpha, beta,
    gamma of the node), an allreduce of the node leaders under ``inter_algorithm`` with ``inter`` =
    (alpha, beta, gamma) between nodes (default: the same), and a binomial broadcast inside each node.
    """
    p, nodes = int(p), max(1, int(nodes))
    name = resolve_algorithm(algorithm)
    if name == "hierarchical":
        if p % nodes:
            raise ConfigError(f"--replicas {p} is not a multiple of --nodes {nodes}")
        q = p // nodes
        ia, ib, ig = inter if inter is not None else (alpha, beta, gamma)
        lg = math.ceil(math.log2(q)) if q > 1 else 0
        intra = lg * (2.0 * alpha + 2.0 * np.asarray(n, float) * beta + np.asarray(n, float) * gamma)
        return intra + allreduce_seconds(inter_algorithm, n, nodes, ia, ib, ig)
    if np.ndim(n):
        rows = np.array([coefficients(name, x, p) for x in np.asarray(n, float).ravel()])
        return (rows @ np.array([alpha, beta, gamma])).reshape(np.shape(n))
    a, b, c = coefficients(name, n, p)
    return a * alpha + b * beta + c * gamma
