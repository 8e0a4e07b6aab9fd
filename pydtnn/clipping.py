"""Gradient clipping by global norm, on the model's flat gradient buffer.

In data-parallel training the Trainer clips the REDUCED gradient (after the allreduce, before the
optimizer step): every replica holds the same buffer, so every replica computes the same norm and takes
the same decision, and P heterogeneous replicas still equal one process on the global batch.
"""
import math

from pydtnn.backends import array_module
from pydtnn.errors import ConfigError


def check_max_norm(max_norm) -> float:
    """0 turns clipping off; otherwise a finite positive threshold."""
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not (
            math.isfinite(max_norm) and max_norm >= 0):
        raise ConfigError(f"clip_grad_norm must be a finite number >= 0 (0 = off), got {max_norm} "
                          f"(--clip_grad_norm)")
    return float(max_norm)


def clip_by_global_norm(grads, max_norm: float) -> tuple[float, bool]:
    """Scale `grads` in place so that ||grads||_2 <= max_norm; returns (norm before, whether it clipped).

    The norm is accumulated in float64 whatever the buffer's dtype (a float32 sum of squares loses digits
    on large models). A non-finite norm is left alone: the loss check reports the divergence.
    """
    xp = array_module(grads)
    norm = math.sqrt(float(xp.dot(grads.astype(xp.float64, copy=False), grads.astype(xp.float64, copy=False))))
    if max_norm > 0 and math.isfinite(norm) and norm > max_norm:
        grads *= grads.dtype.type(max_norm / norm)
        return norm, True
    return norm, False
