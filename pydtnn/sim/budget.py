"""What a simulation costs: refused in one line before it starts when it cannot fit in memory, and, when it
is long, its progress and the time left on stderr while it runs (10^7 replicas grew to gigabytes with no
output).

Memory: about 1.42 KB per replica at the peak (tracemalloc, P = 2e4 and 1e5, the dynamic policy, the best
partition and the JSON document: the per-replica rows and the (P,) arrays; CPython's object sizes are the
same on every 64-bit machine), counted as BYTES_PER_REPLICA with a third more for the allocator's slack.
Time: a step is a few (P,)-array passes, a re-split rebuilds the step model; how long depends on this
machine and on the policy, so the time left is measured on the steps done (`pydtnn.training.progress`: a bar
on a terminal, a plain line every 10 s elsewhere), not guessed before.
"""
from __future__ import annotations

from pydtnn.launch.limits import check_fits

BYTES_PER_REPLICA = 2048
BASE_BYTES = 200 * 2**20              # the interpreter, NumPy and the profiles
SHOW_PROGRESS_FROM = 10**7            # replica-steps: about 2 s on the machine these numbers come from


def check_memory(replicas: int) -> None:
    """One line, before anything is allocated, when a simulation of `replicas` cannot fit in memory."""
    check_fits(BASE_BYTES + BYTES_PER_REPLICA * float(replicas), f"simulating {replicas} replicas",
               "simulate fewer replicas (every replica's results are kept)")


def progress_for(replicas: int, steps: int, what: str):
    """A progress bar over the steps of a long simulation (None for a short one)."""
    if replicas * steps < SHOW_PROGRESS_FROM:
        return None
    from pydtnn.training.progress import progress
    return progress(total=steps, desc=what, unit="step")
