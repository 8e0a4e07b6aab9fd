"""What a step does on the device, counted by the stand-in: proxies of a GPU step's cost that need no GPU.

A GPU step's time beyond its kernels is host work and waiting: every kernel launch costs microseconds of
Python and driver time, every allocation a trip through CuPy's memory pool, every synchronization stalls the
host until the device drains, and a pageable host-to-device copy blocks the thread that makes it. These
counts are deterministic (they do not depend on the values computed), so tests can pin them.

Kinds counted (`Counts.n`):
- "launch": a kernel of ours, one launch each: a RawModule kernel, or a CuPy array operation that writes
  device memory (a ufunc, a reduction, a copy, a fill, an indexed assignment...; a view is free);
- "cudnn", "cublas": a call into NVIDIA's libraries (a convolution; a matrix product), each launching kernels
  of its own that the stand-in does not see (one call may be several kernels on a device); "library" counts
  them together (`LIBRARY_KINDS`), so a step's launches read "ours" ("launch") and "library" apart;
- "alloc": a device allocation (an array with fresh memory; views are free);
- "sync": a synchronization that drains the device or a stream (device, stream, an event with nothing queued
  after it, and every blocking read: CuPy's `get(blocking=True)`, its default, ends with
  `stream.synchronize()`); "sync_queued": a wait for an event that later kernels are queued behind (the device
  keeps working through it: the lagged read of a step's numbers, `pydtnn.parallel.lagged_step`);
- "d2h": a device-to-host read the host waits for (`get()`, `float()`, `int()`, `bool()`, `item()`, repr...,
  and a copy into pageable memory even with blocking=False); "d2h_async": `get(stream=..., out=pinned,
  blocking=False)`, queued on the stream, the host going on;
- "h2d_pageable" (and "h2d_pageable_main" when on the main thread): a copy from ordinary host memory, which
  blocks the thread; "h2d_pinned": `set(pinned, stream=...)`, asynchronous on that stream.
- "captured": work recorded into a CUDA graph during a stream capture instead of running (name
  "kind:name", e.g. "launch:add", "cudnn:fprop"; it counts neither as its kind nor in `Counts.kernels`);
  "graph_launch": one `Graph.launch` (a kernel kind: its replayed nodes are not counted again);
`Counts.kernels` lists "kind:name" of every launch in order (steps of one static shape should repeat it;
a graph launch is "graph_launch:graph").
"sync_main", "sync_queued_main" and "d2h_main" count those of the main thread alone (the prefetch thread may
wait for its own copies without stalling the steps). `phase(name)` counts what the thread that entered it does inside it
separately (`Counts.phases[name]`).
"""
from __future__ import annotations

import contextlib
import threading
from collections import Counter

KERNEL_KINDS = ("launch", "cudnn", "cublas", "graph_launch")
LIBRARY_KINDS = ("cudnn", "cublas")     # calls into NVIDIA's libraries (each also counted as "library")
# execute=False: kernels and cuDNN calls are checked and counted but not computed (their outputs keep
# whatever memory held), so counting a large model's step costs no compute; CuPy operations still compute.
# A graph's replay follows the setting at replay time, node by node, the same way.
SETTINGS = {"execute": True}


class Counts:
    def __init__(self):
        self.n = Counter()
        self.kernels: list[str] = []
        self.phases: dict[str, Counter] = {}
        self._phase = None
        self._phase_thread = None

    def record(self, kind: str, name: str = "") -> None:
        kinds = (kind, "library") if kind in LIBRARY_KINDS else (kind,)
        self.n.update(kinds)
        main = on_main_thread()
        if kind in ("sync", "sync_queued", "d2h") and main:
            self.n[kind + "_main"] += 1
        if kind in KERNEL_KINDS:
            self.kernels.append(f"{kind}:{name}")
        if self._phase is not None and threading.get_ident() == self._phase_thread:
            self.phases[self._phase].update(kinds)


ACTIVE = Counts()


LAUNCHED = [0]                  # kernels launched by the process so far (an event's place in the queue)


def record(kind: str, name: str = "") -> None:
    if kind in KERNEL_KINDS:
        LAUNCHED[0] += 1
    ACTIVE.record(kind, name)


def on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def counting():
    """Fresh counts for the block: `with counting() as c: ...; c.n["launch"]`."""
    global ACTIVE
    saved, ACTIVE = ACTIVE, Counts()
    try:
        yield ACTIVE
    finally:
        ACTIVE = saved


@contextlib.contextmanager
def dry():
    """Kernels and cuDNN calls counted, not computed, for the block (counts do not depend on values)."""
    saved, SETTINGS["execute"] = SETTINGS["execute"], False
    try:
        yield
    finally:
        SETTINGS["execute"] = saved


@contextlib.contextmanager
def phase(name: str):
    """Count what happens inside the block under `name` as well."""
    counts = ACTIVE
    counts.phases.setdefault(name, Counter())
    outer = counts._phase, counts._phase_thread
    counts._phase, counts._phase_thread = name, threading.get_ident()
    try:
        yield counts.phases[name]
    finally:
        counts._phase, counts._phase_thread = outer


# ------------------------------------------------------------------------------------- pinned host memory

_PINNED: dict[int, tuple[int, object]] = {}     # start address -> (nbytes, the array: kept alive)


def empty_pinned(shape, dtype=float, order="C"):
    """`cupyx.empty_pinned`: a NumPy array in page-locked memory (here: registered as such)."""
    import numpy as np
    a = np.empty(shape, dtype=dtype, order=order)
    _PINNED[a.__array_interface__["data"][0]] = (a.nbytes, a)
    return a


def is_pinned(a) -> bool:
    """Whether host array `a` lies inside memory from `empty_pinned`."""
    import numpy as np
    if not isinstance(a, np.ndarray):
        return False
    ptr = a.__array_interface__["data"][0]
    return any(start <= ptr and ptr + a.nbytes <= start + nbytes for start, (nbytes, _) in _PINNED.items())
