"""Gradient weighting as a plug-in: `weights(sizes) -> list[float]`, replica i's factor w_i on its mean
gradient g_i in the reduced gradient sum_i w_i g_i.

    --gradient_weighting proportional     w_i = b_i / B: the exact gradient of the global batch's mean loss
    --gradient_weighting uniform          w_i = 1 / P: the naive average (the baseline)
    --gradient_weighting FILE.py:FUNCTION a user's function (or module:FUNCTION)
"""
from __future__ import annotations

import math

from pydtnn import plugins
from pydtnn.errors import ConfigError

BUILT_IN = ("proportional", "uniform")


def proportional(sizes):
    total = sum(sizes)
    return [b / total for b in sizes]        # int / int: correctly rounded, the same on every rank


def uniform(sizes):
    return [1.0 / len(sizes)] * len(sizes)


def make_weighting(spec="proportional"):
    """The weights function a --gradient_weighting value names, or `spec` itself when it is callable."""
    if callable(spec):
        fn, name = spec, getattr(spec, "__name__", "gradient weighting")
    elif spec in BUILT_IN:
        return {"proportional": proportional, "uniform": uniform}[spec]
    elif plugins.is_spec(spec):
        fn, name = plugins.load(spec, "--gradient_weighting"), spec
        if not callable(fn):
            raise ConfigError(f"--gradient_weighting {spec}: {type(fn).__name__} is not a function")
    else:
        raise ConfigError(f"--gradient_weighting must be one of {', '.join(BUILT_IN)}, FILE.py:FUNCTION or "
                          f"module:FUNCTION, got {spec!r}")

    def checked(sizes):
        try:
            w = [float(v) for v in fn(list(sizes))]
        except ConfigError:
            raise
        except Exception as e:                 # noqa: BLE001  (a user's function: one line)
            raise ConfigError(f"gradient weighting {name} failed on sizes {list(sizes)}: {type(e).__name__}: "
                              f"{plugins.one_line(e)}") from None
        if len(w) != len(sizes) or not all(math.isfinite(v) for v in w):
            raise ConfigError(f"gradient weighting {name} returned {w!r} for sizes {list(sizes)}: expected "
                              f"{len(sizes)} finite numbers")
        return w
    checked.__name__ = name
    return checked
