"""Timeline events of one rank and their Chrome / Perfetto trace (--tracing true).

    timeline = Timeline(rank, steps=(2, 5))      # record steps 2..5 (1-based, inclusive); None: every step
    timeline.start(comm)                         # every rank's origin at the same barrier: clocks aligned
    timeline.set_step(step, b_i)                 # events recorded now carry args step and b_i
    with timeline.span("conv2d", "forward"):
        ...
    write_chrome_trace("trace.json", timeline, comm)    # a collective: rank 0 writes every rank's events

Each event has a `cat` of `CATEGORIES` and lies on one of `TRACKS` of its rank (pid = rank): the main
thread, the gradient buckets in flight (they overlap the backward pass under --non_blocking_mpi) and
the prefetch thread. Outside the traced steps only the events recorded with ``always=True`` are kept
(evaluation, checkpoint writes: a few per epoch), so the file's size is bounded by the window.
Open it in https://ui.perfetto.dev or chrome://tracing.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["Event", "Timeline", "CATEGORIES", "TRACKS", "chrome_trace", "write_chrome_trace", "parse_steps"]

CATEGORIES = ("forward", "backward", "allreduce", "bn_sync", "update", "data", "eval", "checkpoint")
TRACKS = {0: "main", 1: "gradient buckets", 2: "prefetch"}
MAIN, BUCKETS, PREFETCH = 0, 1, 2


@dataclass
class Event:
    name: str
    rank: int
    t_start: float   # seconds since the timeline's origin
    t_end: float
    category: str = ""
    tid: int = MAIN
    args: dict | None = None

    def as_dict(self) -> dict:
        return {"name": self.name, "rank": self.rank, "t_start": self.t_start, "t_end": self.t_end,
                "category": self.category, "tid": self.tid, "args": self.args or {}}


def parse_steps(text: str) -> tuple[int, int]:
    """'FIRST:LAST' (1-based global steps, inclusive) -> (first, last); ValueError when malformed."""
    first, sep, last = str(text).partition(":")
    if not sep:
        raise ValueError(f"expected FIRST:LAST, got {text!r}")
    first, last = int(first), int(last)
    if first < 1 or last < first:
        raise ValueError(f"expected 1 <= FIRST <= LAST, got {text!r}")
    return first, last


class Timeline:
    """Events of one rank. ``start(comm)`` aligns the origin of every rank at a barrier."""

    def __init__(self, rank: int = 0, enabled: bool = True, steps: tuple[int, int] | None = None):
        self.rank = int(rank)
        self.enabled = bool(enabled)
        self.steps = steps
        self.events: list[Event] = []
        self.t0 = time.perf_counter()
        self.step, self.b_i = 0, 0
        self.active = self.enabled and steps is None

    def start(self, comm=None) -> None:
        if comm is not None:
            comm.barrier()
        self.t0 = time.perf_counter()

    def set_step(self, step: int, b_i: int) -> None:
        """The 1-based global step about to run and this rank's local batch."""
        self.step, self.b_i = int(step), int(b_i)
        self.active = self.enabled and (self.steps is None or self.steps[0] <= step <= self.steps[1])

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def add(self, name: str, t_start: float, t_end: float, category: str = "", tid: int = MAIN,
            always: bool = False, **args) -> None:
        if self.active or (always and self.enabled):
            self.events.append(Event(name, self.rank, float(t_start), float(t_end), category, tid,
                                     {"step": self.step, "b_i": self.b_i, **args}))

    @contextmanager
    def span(self, name: str, category: str = "", tid: int = MAIN, always: bool = False, **args):
        t = self.now()
        try:
            yield
        finally:
            self.add(name, t, self.now(), category, tid, always, **args)


def chrome_trace(events) -> dict:
    """Chrome trace-event JSON (a dict) from events of any ranks: one pid per rank, times in us."""
    out = []
    dicts = [e.as_dict() if isinstance(e, Event) else e for e in events]
    for rank in sorted({d["rank"] for d in dicts}):
        out.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for tid in sorted({d.get("tid", MAIN) for d in dicts if d["rank"] == rank}):
            out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                        "args": {"name": TRACKS.get(tid, f"track {tid}")}})
    for d in dicts:
        out.append({"name": d["name"], "cat": d.get("category") or "pydtnn", "ph": "X", "pid": d["rank"],
                    "tid": d.get("tid", MAIN), "ts": d["t_start"] * 1e6,
                    "dur": max(0.0, d["t_end"] - d["t_start"]) * 1e6, "args": d.get("args") or {}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(path: str, timeline: Timeline, comm=None) -> str | None:
    """Gather every rank's events to rank 0 and write them there as one Chrome trace (a collective
    when ``comm`` is given). Returns the path on the writing rank, None elsewhere."""
    mine = [e.as_dict() for e in timeline.events]
    gathered = [mine] if comm is None else comm.gather_object(mine, root=0)
    if comm is not None and comm.rank != 0:
        return None
    events = [e for per_rank in gathered for e in per_rank]
    from pydtnn.outputs import atomic_write
    text = json.dumps(chrome_trace(events))
    atomic_write(path, lambda f: f.write(text.encode()))
    return path
