"""alpha, beta, gamma of an MPI from its ping-pong and Allreduce sweeps, by linear least squares.

Rows: a one-way ping-pong of n bytes costs alpha + n*beta; an Allreduce of n bytes on p processes costs
a*alpha + b*beta + c*gamma with (a, b, c) from the algorithm MPICH picks ("auto": recursive doubling up
to 2 KB, Rabenseifner above). Every row is divided by its measured time, so the fit minimizes relative
errors and the 4 KB latencies count as much as the 64 MB transfers. Parameters that come out negative
(noise, on a machine where one term is negligible) are fixed at 0 and the others refitted.
"""
from __future__ import annotations

import numpy as np

from pydtnn.errors import ConfigError
from pydtnn.sim.collectives import coefficients
from pydtnn.sim.profile import Network

__all__ = ["fit", "design_rows"]


def design_rows(sizes, processes: int, algorithm: str = "auto"):
    """(ping-pong rows, Allreduce rows): (len(sizes), 3) coefficient matrices of (alpha, beta, gamma)."""
    n = np.asarray(sizes, dtype=np.float64)
    pp = np.column_stack([np.ones_like(n), n, np.zeros_like(n)])
    ar = np.array([coefficients(algorithm, x, processes) for x in n])
    return pp, ar


def fit(sizes, pingpong_s, allreduce_s, processes: int, algorithm: str = "auto") -> Network:
    if int(processes) < 2:
        raise ConfigError("the network fit needs sweeps on at least 2 processes")
    pp, ar = design_rows(sizes, processes, algorithm)
    A = np.vstack([pp, ar])
    t = np.concatenate([np.asarray(pingpong_s, float), np.asarray(allreduce_s, float)])
    if t.shape[0] != A.shape[0] or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ConfigError("network sweeps must hold one positive time per size")
    W = A / t[:, None]
    rhs = np.ones_like(t)
    free = [0, 1, 2]
    x = np.zeros(3)
    while free:
        sol, *_ = np.linalg.lstsq(W[:, free], rhs, rcond=None)
        if np.all(sol >= 0):
            x[free] = sol
            break
        free = [f for f, s in zip(free, sol) if s > 0] if np.any(sol > 0) else []
    return Network(*map(float, x))
