"""The background batch prefetcher: the batch a step gets is the one of its indices, whatever the timing."""
import threading

import numpy as np
import pytest

from pydtnn.training.prefetch import BatchPrefetcher


def test_prefetched_batch_is_used_and_a_stale_one_dropped():
    calls = []

    def fetch(idx, epoch):
        calls.append((threading.current_thread().name, tuple(idx), epoch))
        return np.asarray(idx) * 10 + epoch

    p = BatchPrefetcher(fetch)
    a = p.get([0, 1], 0, next_indices=[2, 3])
    b = p.get([2, 3], 0, next_indices=[4, 5])           # prefetched: a hit
    c = p.get([4, 6], 0)                                 # the split changed: the prefetched [4, 5] is dropped
    p.close()
    assert a.tolist() == [0, 10] and b.tolist() == [20, 30] and c.tolist() == [40, 60]
    assert (p.hits, p.misses) == (1, 2)
    background = [c[1] for c in calls if c[0].startswith("pydtnn-prefetch")]
    assert background in ([(2, 3)], [(2, 3), (4, 5)])    # the stale one was cancelled or ran for nothing
    assert p.get([7], 1).tolist() == [71]                # another epoch, after close: taken on the spot


def test_indices_are_copied_and_errors_reach_the_step_that_needs_the_batch():
    def fetch(idx, epoch):
        if 99 in idx:
            raise IndexError("index 99 out of range")
        return np.asarray(idx).copy()

    p = BatchPrefetcher(fetch)
    nxt = np.array([1, 2])
    p.get([0], 0, next_indices=nxt)
    nxt[:] = 5                                           # the caller reuses its array: no effect
    assert p.get([1, 2], 0, next_indices=[99]).tolist() == [1, 2]
    with pytest.raises(IndexError, match="99"):
        p.get([99], 0)
    p.close()
