"""Weight initializers. Each takes (shape, fan_in, fan_out, rng) and returns a float64 NumPy array.

Initial values are always drawn on the host with NumPy from the model's seed, so that the same seed gives
the same initial weights on every backend.
"""
import numpy as np

from pydtnn.errors import ConfigError


def _uniform(scale):
    return lambda shape, fan_in, fan_out, rng: rng.uniform(-1.0, 1.0, size=shape) * np.sqrt(scale(fan_in, fan_out))


def _normal(scale):
    # Truncation-free normal with the variance that keeps activations stable.
    return lambda shape, fan_in, fan_out, rng: rng.standard_normal(size=shape) * np.sqrt(scale(fan_in, fan_out))


# variance factors: uniform(-a, a) has variance a^2/3, so a^2 = 3 * target variance
INITIALIZERS = {
    "he_uniform": _uniform(lambda i, o: 6.0 / i),
    "he_normal": _normal(lambda i, o: 2.0 / i),
    "glorot_uniform": _uniform(lambda i, o: 6.0 / (i + o)),
    "glorot_normal": _normal(lambda i, o: 2.0 / (i + o)),
    "lecun_uniform": _uniform(lambda i, o: 3.0 / i),
    "lecun_normal": _normal(lambda i, o: 1.0 / i),
    "standard_normal": lambda shape, fan_in, fan_out, rng: rng.standard_normal(size=shape),   # torch Embedding
    "small_normal": lambda shape, fan_in, fan_out, rng: 0.02 * rng.standard_normal(size=shape),  # ViT, GPT-2
    "zeros": lambda shape, fan_in, fan_out, rng: np.zeros(shape),
    "ones": lambda shape, fan_in, fan_out, rng: np.ones(shape),
}


def get_initializer(name_or_fn):
    """A name from INITIALIZERS, or any callable (shape, fan_in, fan_out, rng) -> array."""
    if callable(name_or_fn):
        return name_or_fn
    try:
        return INITIALIZERS[name_or_fn]
    except KeyError:
        raise ConfigError(f"unknown initializer {name_or_fn!r}: choose one of {', '.join(INITIALIZERS)}") from None
