"""The next step's local batch, taken in a background thread while this step computes and reduces.

Taking a batch (gather, augmentation, normalization, one-hot labels) is host work on the critical path of
every step; in a data-parallel step the slowest replica pays it before its compute. One worker thread
takes batch s + 1 as soon as batch s is handed out, so that it is ready when step s + 1 starts. The
batch is keyed by its sample indices: when the split changed meanwhile (dynamic balancing) the
prefetched batch is dropped and the right one taken on the spot, so what a step trains on never depends
on the timing. Taking a batch must not depend on the order of calls (`Split.take` depends only on its
indices and the epoch).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["BatchPrefetcher"]


class BatchPrefetcher:
    def __init__(self, fetch):
        """``fetch(indices, epoch)`` -> a batch; called from one background thread (or this one)."""
        self.fetch = fetch
        self._pool = None
        self._pending = None           # (indices, epoch, future)
        self.hits = self.misses = 0

    def get(self, indices, epoch, next_indices=None):
        """The batch of ``indices``; then starts taking ``next_indices`` (same epoch) in the background."""
        batch = None
        if self._pending is not None:
            idx, ep, future = self._pending
            self._pending = None
            if ep == epoch and np.array_equal(idx, indices):
                batch = future.result()         # an exception in the worker is raised here, in order
                self.hits += 1
            else:
                if not future.cancel():         # already running: let it finish before we take another
                    future.exception()
        if batch is None:
            self.misses += 1
            batch = self.fetch(indices, epoch)
        if next_indices is not None:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pydtnn-prefetch")
            nxt = np.array(next_indices, copy=True)
            self._pending = (nxt, epoch, self._pool.submit(self.fetch, nxt, epoch))
        return batch

    def close(self):
        if self._pending is not None:
            self._pending[2].cancel()
            self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
