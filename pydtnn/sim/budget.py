"""What a simulation costs: refused in one line before it starts when it cannot fit in memory, and, when it
is long, its progress and the time left on stderr while it runs (10^7 replicas grew to gigabytes with no
output).

Memory: about 1.42 KB per replica at the peak (tracemalloc, P = 2e4 and 1e5, the dynamic policy, the best
partition and the JSON document: the per-replica rows and the (P,) arrays; CPython's object sizes are the
same on every 64-bit machine), counted as BYTES_PER_REPLICA with a third more for the allocator's slack.
Time: a step is a few (P,)-array passes, a re-split or a point of the best partition's cost model rebuilds
the step model; how long depends on this machine and on the policy. So a run of many replicas is first timed
at ESTIMATE_AT replicas, the same scenario, and the full run's time said before it starts (every pass is
linear in P); then the time left is measured on the steps done (`pydtnn.observe.progress`: a bar on a
terminal, a plain line every 10 s elsewhere).
"""
from __future__ import annotations

import sys
import time

from pydtnn.launch.limits import gib, check_fits

BYTES_PER_REPLICA = 2048
BASE_BYTES = 200 * 2**20              # the interpreter, NumPy and the profiles
SHOW_PROGRESS_FROM = 10**7            # replica-steps: about 2 s on the machine these numbers come from
ESTIMATE_FROM = 10**5                 # replicas: from here a run takes more than a few seconds (10^6: 26 s)
ESTIMATE_AT = 10**4


def needed_bytes(replicas: int) -> float:
    """The memory a simulation of `replicas` takes at its peak."""
    return BASE_BYTES + BYTES_PER_REPLICA * float(replicas)


def check_memory(replicas: int) -> None:
    """One line, before anything is allocated, when a simulation of `replicas` cannot fit in memory."""
    check_fits(needed_bytes(replicas), f"simulating {replicas} replicas",
               "simulate fewer replicas (every replica's results are kept)")


def progress_for(replicas: int, steps: int, what: str):
    """A progress bar over the steps of a long simulation (None for a short one)."""
    if replicas * steps < SHOW_PROGRESS_FROM:
        return None
    from pydtnn.observe.progress import progress
    return progress(total=steps, desc=what, unit="step")


def say_how_long(replicas: int, run_at, what: str, out=None) -> float | None:
    """Before a run of `replicas` >= ESTIMATE_FROM: time `run_at(ESTIMATE_AT)` (the same simulation at about
    that many replicas; it returns how many it ran), scale it to `replicas` and say it in one line on stderr;
    returns the estimate in seconds (None for a small run, or where no smaller run could be laid out)."""
    if replicas < ESTIMATE_FROM:
        return None
    t0 = time.perf_counter()
    ran = run_at(ESTIMATE_AT)               # the replicas it ran (a multiple of the ranks per node)
    if not ran:                             # no layout of that many replicas: no estimate
        return None
    small = time.perf_counter() - t0
    seconds = small * replicas / ran
    print(f"{what}: about {_duration(seconds)} and {gib(needed_bytes(replicas))} of "
          f"memory (the same run at {ran} replicas took {small:.2f} s on this machine)",
          file=out or sys.stderr, flush=True)
    return seconds


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
