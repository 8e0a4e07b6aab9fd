"""Choosing a convolution's plan by measurement, so that the choice wins in a real step.

The first autotuner timed every plan once, hot, right after building it, and took the strict minimum: on
the H200 it picked VGG-16 TF32 plans that were slower in a real step than the heuristic's. Here:
- each candidate is timed as the median of `RUNS` single runs, each between two events, after `WARMUP`
  runs, with its inputs rotated among `ROTATIONS` copies (so no run finds its operands hot in L2 just
  because the previous run read them);
- the heuristic's first plan stays unless another is at least `MARGIN` (5%) faster;
- at most `MAX_CANDIDATES` plans are timed, in the heuristic's order (the list's tail is rarely fast, and
  every plan costs a build);
- choices are cached per process, keyed by the device, the cuDNN version and the convolution; with
  $PYDTNN_CUDNN_CACHE naming a JSON file, also on disk, so a later run on the same machine skips the
  measurement. `ConvRunner.guard` then checks the tuned plans against the heuristic ones on whole steps.
"""
from __future__ import annotations

import json
import os
import tempfile

RUNS = 10
WARMUP = 2
ROTATIONS = 3
MARGIN = 0.05
MAX_CANDIDATES = 8
CACHE_VAR = "PYDTNN_CUDNN_CACHE"

_MEMORY: dict[str, dict] = {}       # this process's choices, shared by every backend


def median(values):
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def time_ms(cupy, run, operands):
    """The median milliseconds of `run(operand set)` over RUNS event-timed single runs after WARMUP runs,
    the operand sets taken in turn."""
    for i in range(WARMUP):
        run(operands[i % len(operands)])
    starts = [cupy.cuda.Event() for _ in range(RUNS)]
    stops = [cupy.cuda.Event() for _ in range(RUNS)]
    for i in range(RUNS):
        starts[i].record()
        run(operands[i % len(operands)])
        stops[i].record()
    stops[-1].synchronize()
    return median([cupy.cuda.get_elapsed_time(a, b) for a, b in zip(starts, stops)])


def rotations(cupy, inputs):
    """ROTATIONS operand sets: the call's own arrays first, then copies (fresh memory, same values)."""
    return [tuple(inputs)] + [tuple(a.copy() for a in inputs) for _ in range(ROTATIONS - 1)]


def pick(timed, heuristic):
    """The key of the plan to keep from {plan: ms}: the heuristic's unless another is MARGIN faster."""
    best = min(timed, key=timed.get)
    if heuristic in timed and timed[best] > (1.0 - MARGIN) * timed[heuristic]:
        return heuristic
    return best


# ------------------------------------------------------------------------------------------- the cache

def _disk_path():
    return os.environ.get(CACHE_VAR) or None


def _read_disk(path):
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def lookup(key: str):
    """A cached choice ({"plan": ..., "ms": {...}}), or None."""
    if key in _MEMORY:
        return _MEMORY[key]
    path = _disk_path()
    if path:
        entry = _read_disk(path).get(key)
        if isinstance(entry, dict) and "plan" in entry:
            _MEMORY[key] = entry
            return entry
    return None


def store(key: str, entry: dict) -> None:
    """Remember a choice in this process and, with $PYDTNN_CUDNN_CACHE, in its file (merged with what other
    processes wrote, replaced atomically: a reader never sees half a file)."""
    _MEMORY[key] = entry
    path = _disk_path()
    if not path:
        return
    data = _read_disk(path)
    data[key] = entry
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-pydtnn-cudnn-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=0, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass            # an unwritable cache costs a re-measurement next run, never the training


def clear_memory() -> None:
    _MEMORY.clear()
