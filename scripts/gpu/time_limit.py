"""A benchmark's time limit (`--max_seconds`), so that it ends by itself before whoever runs it stops it
(scripts/gpu_check.sh gives each stage a limit): a piece of work (a row, a timed round, a profile) starts only
if the longest piece of its kind so far still fits in what is left, and what was left undone is said in one
`STOPPED: ...` line at the end, which the check reports as "stopped at its limit", not as a failure."""
from __future__ import annotations

import contextlib
import math
import time


class TimeLimit:
    def __init__(self, seconds: float | None = None):
        self.seconds = math.inf if seconds is None else float(seconds)
        self.end = time.perf_counter() + self.seconds
        self.longest: dict[str, float] = {}             # the longest piece of work of each kind so far
        self.not_done: list[str] = []

    def left(self) -> float:
        return self.end - time.perf_counter()

    def estimate(self, kind: str, like: str | None = None) -> float:
        """The longest piece of this kind so far; with none yet, the longest of the kinds whose names start
        with `like` (0 if none either: a first piece always starts)."""
        if kind in self.longest:
            return self.longest[kind]
        return max((t for k, t in self.longest.items() if like is not None and k.startswith(like)), default=0.0)

    def fits(self, kind: str, like: str | None = None, at_least: float = 0.0) -> bool:
        """Whether a piece of this kind, `at_least` seconds long, would end before the limit."""
        return max(self.estimate(kind, like), at_least) < self.left()

    @contextlib.contextmanager
    def timing(self, kind: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - t0
            self.longest[kind] = max(took, self.longest.get(kind, 0.0))

    def skip(self, what: str) -> None:
        self.not_done.append(what)

    def stopped_line(self) -> str | None:
        """The one line a stopped run ends with (None if everything ran)."""
        if not self.not_done:
            return None
        return f"STOPPED: at its {self.seconds:g} s limit (--max_seconds), not run: " + "; ".join(self.not_done)
