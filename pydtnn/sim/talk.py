"""What `pydtnn-simulate run` says while it works, at any size: its first line at once, then a progress line on
stderr at least every `PYDTNN_PROGRESS_INTERVAL_S` seconds (10) whatever it is doing.

A run of 10^7 replicas spends minutes in places no loop counts (a step model of 10^7 rows, the best
partition's cost model, the report), and printed nothing there: with stdout to a file, as on a cluster, it
looked hung. So every stage of a run is a `phase`, and a heartbeat thread says which one is running, how
long it has run and, where it counts steps, how far it is and the time left:

    talk = Talk(out=sys.stdout)
    talk.say("simulating 10000000 replicas ...")           # flushed: to a file or a pipe at once
    with talk.phase("simulating 10000000 replicas", total=100) as steps:
        for s in range(100):
            ...
            steps.update(1)      # "simulating 10000000 replicas: step 40/100 (40%), 21 s so far, 32 s left"
    talk.close()

A phase shorter than the interval prints nothing. Lines are whole lines (no carriage returns: a log file
has no use for a redrawn bar), each flushed.
"""
from __future__ import annotations

import sys
import threading
import time

from pydtnn.observe.progress import plain_interval

__all__ = ["Talk", "Phase"]


class Phase:
    """One stage of a run; `update(n)` counts its steps (when it has any)."""

    def __init__(self, talk: "Talk", what: str, total: int | None, unit: str):
        self.talk, self.what, self.total, self.unit = talk, what, total, unit
        self.n = 0
        self.doing = None
        self.start = time.monotonic()

    def stage(self, doing: str | None) -> None:
        """What the phase is doing before its first step (a policy's first split, its probe), or None."""
        self.doing = doing

    def line(self) -> str:
        elapsed = time.monotonic() - self.start
        text = self.what
        if self.doing and not self.n:
            text += f": {self.doing}, {elapsed:.0f} s so far"
        elif self.total:
            text += f": {self.unit} {self.n}/{self.total} ({100 * self.n / self.total:.0f}%), {elapsed:.0f} s so far"
            if 0 < self.n < self.total:
                text += f", {elapsed * (self.total - self.n) / self.n:.0f} s left"
        else:
            text += f": {elapsed:.0f} s so far"
        return text

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.total or self.n < self.total:
            self.talk._maybe(self)

    def close(self) -> None:
        self.talk._end(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Talk:
    """`say` writes a line to `out` (the result's stream: stdout, or stderr under --json) at once; phases
    report on `err` (stderr) at least every `interval` seconds, from a heartbeat thread between updates."""

    def __init__(self, out=None, err=None, interval: float | None = None):
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.interval = plain_interval() if interval is None else float(interval)
        self._lock = threading.Lock()
        self._phase: Phase | None = None
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def phase(self, what: str, total: int | None = None, unit: str = "step") -> Phase:
        """A stage of the run (a context manager); the heartbeat reports it while it lasts."""
        p = Phase(self, what, total, unit)
        with self._lock:
            self._phase = p
            self._last = time.monotonic()
        if self._thread is None and self.interval > 0:
            self._thread = threading.Thread(target=self._beat, name="pydtnn-simulate progress", daemon=True)
            self._thread.start()
        return p

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    # --- lines -----------------------------------------------------------------------------------------
    def _maybe(self, phase: Phase) -> None:
        with self._lock:
            now = time.monotonic()
            if phase is self._phase and now - self._last >= self.interval:
                self._last = now
                self._write(phase.line())

    def _end(self, phase: Phase) -> None:
        with self._lock:
            if self._phase is phase:
                self._phase = None

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.interval / 4)):
            with self._lock:
                phase = self._phase
                now = time.monotonic()
                if phase is not None and now - self._last >= self.interval:
                    self._last = now
                    self._write(phase.line())

    def _write(self, text: str) -> None:
        try:
            print(text, file=self.err, flush=True)
        except (OSError, ValueError):      # stderr gone (a closed pipe): progress is not worth failing the run
            pass
