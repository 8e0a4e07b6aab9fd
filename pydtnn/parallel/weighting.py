"""Gradient weighting as a plug-in: `weights(sizes) -> list[float]`, replica i's factor w_i on its mean
gradient g_i in the reduced gradient sum_i w_i g_i.

    --gradient_weighting proportional     w_i = b_i / B: the exact gradient of the global batch's mean loss
    --gradient_weighting uniform          w_i = 1 / P: the naive average (the baseline)
    --gradient_weighting FILE.py:FUNCTION a user's function (or module:FUNCTION)

A user's function is called once on the initial split before any work (`pydtnn.launch.split`, `DataParallel`)
and then at every step: what it returns must be a flat list (or 1-D array) of one finite real number per
replica; anything else (a wrong length, NaN, inf, None, text, a nested list) is one line naming it.
"""
from __future__ import annotations

import math
import numbers

from pydtnn import plugins
from pydtnn.errors import ConfigError

BUILT_IN = ("proportional", "uniform")


def proportional(sizes):
    total = sum(sizes)
    return [b / total for b in sizes]        # int / int: correctly rounded, the same on every rank


def uniform(sizes):
    return [1.0 / len(sizes)] * len(sizes)


def _numbers(values):
    """`values` as a list of finite floats, or None when it is not a flat sequence of real numbers (a string,
    None, a bool, a nested list, NaN or inf: nothing is converted that was not a number)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        return None
    try:
        items = list(values)
    except TypeError:
        return None
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in items):
        return None
    out = [float(v) for v in items]
    return out if all(math.isfinite(v) for v in out) else None


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
            out = fn(list(sizes))
        except ConfigError:
            raise
        except Exception as e:                 # noqa: BLE001  (a user's function: one line and its frames)
            raise plugins.user_error(f"gradient weighting {name} failed on sizes {list(sizes)}", e) from None
        w = _numbers(out)
        if w is None or len(w) != len(sizes):
            shown = repr(out) if len(repr(out)) <= 80 else repr(out)[:77] + "..."
            raise ConfigError(f"gradient weighting {name} returned {shown} for sizes {list(sizes)}: expected "
                              f"a list of {len(sizes)} finite numbers")
        return w
    checked.__name__ = name
    return checked
