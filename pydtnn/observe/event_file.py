"""TensorBoard event files written in the loop's own thread (tensorboardX's record format, no TensorFlow).

tensorboardX's SummaryWriter hands events to a writer thread through a bounded queue: when that thread dies
(a full disk: "No space left on device"), the queue fills and the loop blocks forever in `add_scalar`. Here
each event is written where it is made, and the file is flushed (and fsynced) every `flush_seconds` and on
`flush`/`close`, so a full disk or a read-only folder is an OutputError at the write that meets it.
"""
from __future__ import annotations

import os
import time

from pydtnn.errors import OutputError

__all__ = ["EventFile"]


class EventFile:
    """One event file in `folder` (created if missing): `scalar(tag, value, step)`, `flush()`, `close()`."""

    def __init__(self, folder, flush_seconds: float = 30.0, clock=time.monotonic):
        from tensorboardX.event_file_writer import EventsWriter
        self.folder, self.flush_seconds, self.clock = os.fspath(folder), float(flush_seconds), clock
        self._writer = None
        self._guard(lambda: os.makedirs(self.folder, exist_ok=True))
        self._writer = self._guard(lambda: EventsWriter(os.path.join(self.folder, "events")))
        self._last_flush = clock()

    def _guard(self, work):
        try:
            return work()
        except OSError as e:
            raise OutputError(f"cannot write TensorBoard events into {self.folder}: {e.strerror or e}") from None

    def scalar(self, tag: str, value, step: int) -> None:
        from tensorboardX.proto import event_pb2
        from tensorboardX.summary import scalar
        event = event_pb2.Event(summary=scalar(tag, float(value)), wall_time=time.time(), step=int(step))
        self._guard(lambda: self._writer.write_event(event))
        if self.clock() - self._last_flush >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        self._guard(self._writer.flush)
        self._last_flush = self.clock()

    def close(self) -> None:
        """Flush and close; the file is closed even when the flush fails (the error is raised after)."""
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        try:
            self._guard(writer.flush)
        finally:
            try:
                writer.close()
            except OSError:
                pass                     # the flush's error (raised above) is the one that says why
