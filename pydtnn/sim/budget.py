"""What a simulation costs: refused in one line before it starts when it cannot fit in memory, and, when it
is long, its time and memory said before it starts (10^7 replicas grew to gigabytes with no output; its
progress while it runs: `pydtnn.sim.talk`).

Memory: about 1.42 KB per replica at the peak (tracemalloc, P = 2e4 and 1e5, the dynamic policy, the best
partition and the JSON document: the per-replica rows and the (P,) arrays; CPython's object sizes are the
same on every 64-bit machine), counted as BYTES_PER_REPLICA with a third more for the allocator's slack;
a step's timeline holds one column per point of the step (the end, and each sync-BN barrier or bucket),
POINT_BYTES per replica each beyond the first (its row and the row times the step's factors).
Time: a step is a few (P,)-array passes, a re-split or a point of the best partition's cost model rebuilds
the step model; how long depends on this machine and on the policy. So a run of many replicas is first timed
at ESTIMATE_AT replicas, the same scenario, and the full run's time said before it starts (every pass is
linear in P).
"""
from __future__ import annotations

import sys
import time

from pydtnn.launch.limits import gib, check_fits

BYTES_PER_REPLICA = 2048
POINT_BYTES = 16
BASE_BYTES = 200 * 2**20              # the interpreter, NumPy and the profiles
ESTIMATE_FROM = 10**5                 # replicas: from here a run takes more than a few seconds (10^6: 26 s)
ESTIMATE_AT = 10**4


def needed_bytes(replicas: int, points: int = 1) -> float:
    """The memory a simulation of `replicas` takes at its peak, with `points` points in a step's timeline."""
    return BASE_BYTES + (BYTES_PER_REPLICA + POINT_BYTES * max(0, points - 1)) * float(replicas)


def check_memory(replicas: int, points: int = 1) -> None:
    """One line, before anything is allocated, when a simulation of `replicas` cannot fit in memory."""
    check_fits(needed_bytes(replicas, points), f"simulating {replicas} replicas",
               "simulate fewer replicas (every replica's results are kept)")


def say_how_long(replicas: int, run_at, what: str, say=None, points: int = 1) -> float | None:
    """Before a run of `replicas` >= ESTIMATE_FROM: time `run_at(ESTIMATE_AT)` (the same simulation at about
    that many replicas; it returns how many it ran), scale it to `replicas` and say it in one line (`say`, else
    stderr); returns the estimate in seconds (None for a small run, or where no smaller run could be laid out)."""
    if replicas < ESTIMATE_FROM:
        return None
    t0 = time.perf_counter()
    ran = run_at(ESTIMATE_AT)               # the replicas it ran (a multiple of the ranks per node)
    if not ran:                             # no layout of that many replicas: no estimate
        return None
    small = time.perf_counter() - t0
    seconds = small * replicas / ran
    text = (f"{what}: about {_duration(seconds)} and {gib(needed_bytes(replicas, points))} of memory (the same run "
            f"at {ran} replicas took {small:.2f} s on this machine)")
    (say or (lambda line: print(line, file=sys.stderr, flush=True)))(text)
    return seconds


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
