"""GradCompression (``--grad_compression none|fp16|bf16``): the weighted gradient sent through the
SUM-allreduce in 16 bits, and cast back to the model's dtype after (Horovod's ``Compression.fp16``, DDP's
``fp16_compress_hook`` / ``bf16_compress_hook``). Half the bytes on the wire; "none" is the reduction of the
model's dtype, untouched.

The error against the exact sum g = sum_i x_i of the replicas' weighted gradients x_i = w_i g_i (elementwise,
P replicas, no overflow): each x_i is rounded once to the 16-bit format, the reduction adds the P rounded
values with P - 1 additions (in whatever tree the communicator uses), each rounded once more, and the cast
back is exact (every 16-bit value is one of float32's and float64's). With u' the relative error of one
rounding and eta half the format's smallest subnormal (an underflowing cast; an underflowing sum is exact),

    |g_hat - g| <= (u' + (1 + u') gamma_{P-1}) sum_i |x_i| + P eta (1 + gamma_{P-1}),
    gamma_k = k u' / (1 - k u'),

that is (P u + O(u^2)) sum_i |w_i g_i|, with u = 2^-11 for fp16 and 2^-8 for bf16. u' = u + 2^-24 + u 2^-24
covers a rounding that goes through float32 first (MPI's 16-bit addition sums in float32, `half_sum`; a
float64 model's cast may too). An element whose weighted gradient, or partial sum, exceeds the format's
largest value (65504 for fp16; bf16 has float32's range) becomes +-inf: the next step's loss is then
non-finite and the loop stops, as for any diverging run.
"""
from __future__ import annotations

import numpy as np

from pydtnn.errors import ConfigError

__all__ = ["GRAD_COMPRESSIONS", "GradCompression"]

GRAD_COMPRESSIONS = ("none", "fp16", "bf16")

# unit roundoff u (half an ulp of 1) and half the smallest subnormal, per format
_ROUNDING = {"fp16": (2.0 ** -11, 2.0 ** -25), "bf16": (2.0 ** -8, 2.0 ** -134)}


def wire_dtype(name: str):
    """The NumPy dtype of a 16-bit format (bf16: ml_dtypes', which CuPy 14 uses too)."""
    if name == "fp16":
        return np.dtype(np.float16)
    try:
        import ml_dtypes
    except ImportError:
        raise ConfigError("--grad_compression bf16 needs the ml_dtypes package: pip install ml_dtypes") from None
    return np.dtype(ml_dtypes.bfloat16)


class GradCompression:
    """The format a gradient crosses the network in: ``pack`` before the SUM-allreduce, ``unpack`` after."""

    def __init__(self, name: str = "none"):
        if name not in GRAD_COMPRESSIONS:
            raise ConfigError(f"--grad_compression must be one of {', '.join(GRAD_COMPRESSIONS)}, got {name!r}")
        self.name = name
        self.dtype = None if name == "none" else wire_dtype(name)

    @property
    def active(self) -> bool:
        return self.dtype is not None

    def wire_nbytes(self, array) -> int:
        """The bytes of ``array`` as they cross the network."""
        return int(array.size) * (self.dtype.itemsize if self.active else array.itemsize)

    def pack(self, array):
        """What goes into the reduction: ``array`` itself ("none"), or a 16-bit copy of it (NumPy or CuPy)."""
        return array.astype(self.dtype) if self.active else array

    @staticmethod
    def unpack(wire, array):
        """The reduced ``wire`` written back into ``array`` (an exact cast); nothing when they are one."""
        if wire is not array:
            array[...] = wire
        return array

    def allreduce_sum_(self, comm, array):
        """``comm.allreduce_sum_(array)`` through this format; returns ``array``."""
        wire = self.pack(array)
        comm.allreduce_sum_(wire)
        return self.unpack(wire, array)

    def iallreduce_sum_(self, comm, array):
        """(request, wire): the reduction started; ``unpack(wire, array)`` after the request completes."""
        wire = self.pack(array)
        return comm.iallreduce_sum_(wire), wire

    def error_bound(self, abs_sum, nreplicas: int):
        """The module's bound on |g_hat - g| for ``abs_sum`` = sum_i |x_i| over ``nreplicas`` replicas (zero for
        "none" or one replica, where nothing is compressed)."""
        abs_sum = np.asarray(abs_sum, dtype=np.float64)
        if not self.active or nreplicas < 2:
            return np.zeros_like(abs_sum)
        u, eta = _ROUNDING[self.name]
        u1 = u + 2.0 ** -24 + u * 2.0 ** -24
        k = nreplicas - 1
        gamma = k * u1 / (1 - k * u1)
        return (u1 + (1 + u1) * gamma) * abs_sum + nreplicas * eta * (1 + gamma)

    def __repr__(self):
        return f"GradCompression({self.name!r})"
