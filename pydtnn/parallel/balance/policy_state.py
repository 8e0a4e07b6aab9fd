"""The built-in policies' state in a checkpoint (fpm's and dynamic's), checked as data before it is used.

    problem = state_problem(state)        # (field, expected, value) of the first problem, or None

A checkpoint's policy state is read back by `load_state_dict`; a crafted or damaged one (a list or a string
where an object is due, an infinite or 10^300 batch in a point, a device "tpu") once gave tracebacks or was
taken silently. `pydtnn.training.checkpointing.validate_meta` names the first problem as the checkpoint's
field before any work; `load_state_dict` refuses it the same way in a loop of your own. The ranges are the
cost model's (`pydtnn.parallel.balance.cost_model.state_problem`): b an integer in [1, 10^9], seconds a
finite number in (0, 86400], devices cpu or gpu.
"""
from __future__ import annotations

import math

from pydtnn.errors import ConfigError
from pydtnn.parallel.balance import cost_model

__all__ = ["state_problem", "check_state"]

_WINDOW_POINT = (f"[b, seconds]: b a whole number in [1, 10^9] and seconds a finite number in "
                 f"(0, {cost_model.MAX_SECONDS:g}]")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _window_point(p) -> bool:
    """A window's step: [b, seconds], b stored as a float (a whole number)."""
    return (isinstance(p, list) and len(p) == 2 and all(_number(v) for v in p) and float(p[0]).is_integer()
            and 1 <= p[0] <= cost_model.MAX_B and 0 < p[1] <= cost_model.MAX_SECONDS)


def state_problem(state, nreplicas=None):
    """(field, expected, value) of the first problem of an fpm or dynamic policy's stored state, or None. The
    fields are named as in the state (`model.replicas[0].points[1]`); `nreplicas`: the checkpoint's, where
    known (the lists per replica must have that many)."""
    if not isinstance(state, dict):
        return "(top level)", "an object", state
    model = state.get("model")
    if model is not None:
        problem = cost_model.state_problem(model)
        if problem:
            field = "model" if problem[0] == "(top level)" else f"model.{problem[0]}"
            return field, problem[1], problem[2]
    per_replica = f"a list of {nreplicas} " if nreplicas else "a list of "
    window = state.get("window", [])
    if not isinstance(window, list) or (window and nreplicas and len(window) != nreplicas):
        return "window", per_replica + "lists of " + _WINDOW_POINT, window
    for i, steps in enumerate(window):
        if not isinstance(steps, list):
            return f"window[{i}]", "a list of " + _WINDOW_POINT, steps
        for k, p in enumerate(steps):
            if not _window_point(p):
                return f"window[{i}][{k}]", _WINDOW_POINT, p
    noise = state.get("noise", [])
    if not (isinstance(noise, list) and all(v is None or (_number(v) and v >= 0) for v in noise)):
        return "noise", per_replica + "null or finite numbers >= 0", noise
    suspect = state.get("suspect", [])
    if not (isinstance(suspect, list) and all(isinstance(v, int) and not isinstance(v, bool) and v in (-1, 0, 1)
                                              for v in suspect)):
        return "suspect", per_replica + "-1, 0 or 1", suspect
    n = state.get("n_rebalances", 0)
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 0):
        return "n_rebalances", "an integer >= 0", n
    return None


def check_state(state, nreplicas=None) -> None:
    """`state_problem` as one ConfigError line (what `load_state_dict` raises)."""
    problem = state_problem(state, nreplicas)
    if problem:
        field, expected, value = problem
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ConfigError(f"field {field!r} must be {expected}, got {shown}")
