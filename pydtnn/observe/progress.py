"""Progress on stderr: a tqdm bar on a terminal, a plain line every few seconds anywhere else.

A log file or a batch system's output has no use for carriage-return redraws (tqdm writes hundreds of
them per epoch), so when stderr is not a terminal the bar becomes a whole line now and then:

    epoch 2/10: 120/500 steps (24%), loss=0.4123 acc=0.8812 1534 samples/s, 37 s left
"""
from __future__ import annotations

import os
import sys
import time

INTERVAL_VAR = "PYDTNN_PROGRESS_INTERVAL_S"     # seconds between plain lines (default 10)


def plain_interval() -> float:
    try:
        return max(0.0, float(os.environ.get(INTERVAL_VAR, "10")))
    except ValueError:
        return 10.0


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class PlainProgress:
    """The subset of tqdm's interface the project uses, written as occasional whole lines."""

    def __init__(self, total=None, desc="", unit="it", initial=0, stream=None, interval=None,
                 unit_scale=False, estimate=True, **_ignored):
        """``estimate=False``: no "s left" of its own (the caller's postfix says it, measured its way)."""
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.estimate = estimate
        self.stream = stream or sys.stderr
        self.interval = plain_interval() if interval is None else interval
        self.unit_scale = unit_scale
        self.postfix = ""
        self.start = self.last = time.monotonic()

    def set_postfix_str(self, text, refresh=False):
        self.postfix = text

    def _amount(self, n):
        if not self.unit_scale:
            return str(int(n))
        for scale, prefix in ((1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")):
            if n >= scale:
                return f"{n / scale:.1f} {prefix}{self.unit}"
        return f"{int(n)} {self.unit}"

    def line(self) -> str:
        """``epoch 2/10: step 120/500 (24%), <postfix>, 37 s left`` (bytes: ``1.2 MiB/4.4 MiB (27%)``)."""
        done = self._amount(self.n) + (f"/{self._amount(self.total)}" if self.total else "")
        if not self.unit_scale:
            done = f"{self.unit} {done}"
        if self.total:
            done += f" ({100 * self.n / self.total:.0f}%)"
        text = f"{self.desc}: {done}" + (f", {self.postfix}" if self.postfix else "")
        elapsed = time.monotonic() - self.start
        if self.estimate and self.total and 0 < self.n < self.total and elapsed > 0:
            text += f", {elapsed * (self.total - self.n) / self.n:.0f} s left"
        return text

    def update(self, n=1):
        self.n += n
        now = time.monotonic()
        if now - self.last >= self.interval and (not self.total or self.n < self.total):
            self.last = now
            print(self.line(), file=self.stream, flush=True)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# tqdm's bar without its own rate and time left: a caller that passes estimate=False says them in its postfix
_OWN_ESTIMATE_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


def progress(total=None, desc="", unit="it", *, enabled=True, stream=None, estimate=True, **tqdm_kwargs):
    """A tqdm bar on a terminal, a `PlainProgress` elsewhere, or None when not ``enabled``. ``estimate=False``:
    neither shows a rate or a time left of its own (the caller's postfix does)."""
    if not enabled:
        return None
    stream = stream or sys.stderr
    if _is_terminal(stream):
        from tqdm import tqdm
        if not estimate:
            tqdm_kwargs.setdefault("bar_format", _OWN_ESTIMATE_FORMAT)
        return tqdm(total=total, desc=desc, unit=unit, file=stream, dynamic_ncols=True, **tqdm_kwargs)
    return PlainProgress(total=total, desc=desc, unit=unit, stream=stream, estimate=estimate, **tqdm_kwargs)
