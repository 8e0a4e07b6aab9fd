"""A tiny thread pool for the CPU backend's numba kernels (private helper).

`run(fn, nt, *args)` calls fn(t, nt, *args) for t = 0..nt-1, part 0 on the calling thread and the others
on persistent worker threads; the kernels are numba functions compiled with `nogil=True`, so the parts
run truly in parallel. Workers are woken by a lock handoff (a few microseconds) and sleep otherwise: no
spinning threads competing with BLAS or with the next kernel. (Numba's own `parallel=True` would cost
several seconds of compilation per kernel and dtype on a cold cache.)
"""
from __future__ import annotations

import _thread
import os
import threading


class _Worker:
    def __init__(self):
        self._go = _thread.allocate_lock()
        self._go.acquire()
        self._done = _thread.allocate_lock()
        self._done.acquire()
        self._job = None
        self._error = None
        threading.Thread(target=self._loop, name="pydtnn-cpu-worker", daemon=True).start()

    def _loop(self):
        while True:
            self._go.acquire()
            fn, args = self._job
            self._job = None
            try:
                fn(*args)
            except BaseException as e:  # handed to the caller in wait()
                self._error = e
            finally:
                self._done.release()

    def start(self, fn, args):
        self._job = (fn, args)
        self._go.release()

    def wait(self):
        self._done.acquire()
        err, self._error = self._error, None
        return err


class ThreadPool:
    def __init__(self):
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()       # one parallel kernel at a time per process

    def _reset_after_fork(self):
        self._workers = []
        self._lock = threading.Lock()

    def run(self, fn, nt, *args):
        if nt <= 1:
            fn(0, 1, *args)
            return
        with self._lock:
            while len(self._workers) < nt - 1:
                self._workers.append(_Worker())
            started = []
            try:
                for t in range(1, nt):
                    self._workers[t - 1].start(fn, (t, nt) + args)
                    started.append(self._workers[t - 1])
                fn(0, nt, *args)
            finally:
                errors = [w.wait() for w in started]
            for e in errors:
                if e is not None:
                    raise e


POOL = ThreadPool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POOL._reset_after_fork)
