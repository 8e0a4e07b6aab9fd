"""Backends: one kernel library per device (`cpu/`: NumPy, BLAS and numba; `gpu/`: CuPy and cuDNN), chosen
per model by `get_backend`. The contract they all implement (`Backend`, `ConvSpec`, `PoolSpec`, the
kernels' conventions and optional keywords) is `pydtnn.backends.contract`, re-exported here.
"""
from __future__ import annotations

from pydtnn.backends.contract import Backend, ConvSpec, PoolSpec, parse_dtype
from pydtnn.errors import ConfigError

__all__ = ["BACKEND_OPTIONS", "Backend", "ConvSpec", "PoolSpec", "array_module", "available_backends",
           "get_backend", "parse_dtype"]

# The options each backend takes (anything else is a ConfigError, not silently ignored).
BACKEND_OPTIONS = {"cpu": ("conv_algorithm",),
                   "gpu": ("precision", "auto_conv_alg", "device", "conv_impl", "deterministic")}


def get_backend(name: str = "cpu", dtype="float32", seed: int = 0, **options) -> Backend:
    """A fresh backend object; two models may hold two different backends in one process.

    CPU options: conv_algorithm="auto"|"direct"|"winograd". GPU options: precision="fp32"|"tf32",
    auto_conv_alg=bool, device=int, conv_impl, deterministic=bool. An option the backend does not know is a ConfigError.
    """
    if name not in BACKEND_OPTIONS:
        raise ConfigError(f"unknown backend {name!r}: choose 'cpu' or 'gpu'")
    unknown = sorted(set(options) - set(BACKEND_OPTIONS[name]))
    if unknown:
        raise ConfigError(f"unknown {name} backend option{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)}: the {name} backend takes {', '.join(BACKEND_OPTIONS[name])}")
    if name == "cpu":
        from pydtnn.backends.cpu.backend import CPUBackend
        return CPUBackend(dtype=dtype, seed=seed, **options)
    from pydtnn.backends.gpu.backend import GPUBackend
    return GPUBackend(dtype=dtype, seed=seed, **options)


def array_module(a):
    """numpy for NumPy arrays (and scalars), cupy for CuPy arrays, without importing CuPy needlessly: where
    CuPy was never imported no array can be a CuPy array. Plain ndarrays are answered here; subclasses ask
    the imported CuPy (the tests' CuPy stand-in's device arrays are ndarray subclasses)."""
    import sys

    import numpy
    if type(a) is numpy.ndarray or isinstance(a, (numpy.generic, float, int)):
        return numpy
    cupy = sys.modules.get("cupy")
    return numpy if cupy is None else cupy.get_array_module(a)


def available_backends() -> list[str]:
    """Backends usable on this machine ("gpu" only where CuPy sees a device)."""
    names = ["cpu"]
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            names.append("gpu")
    except Exception:  # no CuPy, no driver, or no device: the GPU backend is simply unavailable
        pass
    return names
