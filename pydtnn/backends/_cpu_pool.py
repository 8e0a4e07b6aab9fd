"""A tiny thread pool for the CPU backend's numba kernels (private helper).

`run(fn, nt, *args)` calls fn(t, nt, *args) for t = 0..nt-1, part 0 on the calling thread and the others
on persistent worker threads; the kernels are numba functions compiled with `nogil=True`, so the parts
run truly in parallel. (Numba's own `parallel=True` would cost several seconds of compilation per kernel
and dtype on a cold cache, and its OpenMP threads spin against BLAS's.)

Hand-off: the caller bumps a sequence number that an idle worker watches for a short while in a GIL-free
numba spin loop (`_SPIN_US`), then the worker sleeps on a condition variable. Waking a sleeping thread
costs ~200 us on a virtual machine (an idle vCPU must be interrupted), more than many kernels take,
while a training step launches its kernels well within a few milliseconds of each other. The caller
waits for the parts the same way (spin, then poll with a timed wait). A hand-off still costs ~15 us
(the worker takes the GIL to enter the kernel), hence `_PARALLEL_MIN` in `cpu.py`.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# How long an idle worker (or a waiting caller) spins before sleeping, in microseconds. Waking a sleeping
# worker measured ~200 us on this project's (virtual) 2-core machines; kernels of a training step come
# well within a few milliseconds of each other. 0 disables spinning (e.g. on an oversubscribed node).
_SPIN_US = float(os.environ.get("PYDTNN_CPU_SPIN_US", "3000"))


@intrinsic
def _load_acquire(typingctx, arr, idx):
    """arr[idx] read with acquire ordering (a load the compiler may not hoist out of a spin loop)."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 1):
        return None
    sig = types.int64(arr, idx)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = cgutils.get_item_pointer(context, builder, signature.args[0], ary, [i])
        return builder.load_atomic(ptr, "acquire", 8)

    return sig, codegen


@intrinsic
def _call_int_fn(typingctx, fptr):
    """Call the C function `int f(void)` at address fptr (here: sched_yield)."""
    sig = types.int32(fptr)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        addr = context.cast(builder, args[0], signature.args[0], types.int64)
        return builder.call(builder.inttoptr(addr, fnty.as_pointer()), [])

    return sig, codegen


def _sched_yield_address() -> int:
    try:
        return ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value or 0
    except (OSError, AttributeError):
        return 0


_YIELD = _sched_yield_address()


@njit(nogil=True, cache=True)
def _spin_while_eq(flag, value, iters, yield_fp):
    """Spin (without the GIL) while flag[0] == value, at most `iters` rounds; True if it changed. Each
    round yields the core (sched_yield) so that a runnable thread, e.g. a BLAS worker, is not slowed
    down by a spinning one."""
    for _ in range(iters):
        for _ in range(32):
            if _load_acquire(flag, 0) != value:
                return True
        if yield_fp != 0:
            _call_int_fn(yield_fp)
    return False


def _calibrate() -> float:
    """Spin rounds per microsecond on this machine."""
    flag = np.zeros(1, np.int64)
    _spin_while_eq(flag, 0, 10, _YIELD)
    n = 20_000
    t0 = time.perf_counter()
    _spin_while_eq(flag, 0, n, _YIELD)
    dt = max(time.perf_counter() - t0, 1e-6)
    return n / (dt * 1e6)


class _Worker:
    def __init__(self, spin_iters: int):
        self._spin = spin_iters
        self._seq = np.zeros(1, np.int64)      # job number, bumped by the caller
        self._done = np.zeros(1, np.int64)     # last job number finished
        self._cv = threading.Condition()
        self._job = None
        self._error = None
        threading.Thread(target=self._loop, name="pydtnn-cpu-worker", daemon=True).start()

    def _loop(self):
        seen = 0
        while True:
            if not _spin_while_eq(self._seq, seen, self._spin, _YIELD):
                with self._cv:
                    while int(self._seq[0]) == seen:
                        self._cv.wait()
            seen = int(self._seq[0])
            fn, args = self._job
            self._job = None
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 -- handed to the caller in wait()
                self._error = e
            finally:
                self._done[0] = seen

    def start(self, fn, args):
        self._job = (fn, args)
        with self._cv:
            self._seq[0] += 1
            self._cv.notify()

    def wait(self):
        seq = int(self._seq[0])
        if not _spin_while_eq(self._done, seq - 1, self._spin, _YIELD) and int(self._done[0]) != seq:
            with self._cv:
                while int(self._done[0]) != seq:
                    self._cv.wait(0.0002)
        err, self._error = self._error, None
        return err


class ThreadPool:
    def __init__(self):
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()       # one parallel kernel at a time per process
        self._spin = None

    def _reset_after_fork(self):
        self._workers = []
        self._lock = threading.Lock()

    def run(self, fn, nt, *args):
        if nt <= 1:
            fn(0, 1, *args)
            return
        with self._lock:
            if len(self._workers) < nt - 1:
                if self._spin is None:
                    self._spin = max(1, int(_SPIN_US * _calibrate())) if _SPIN_US > 0 else 0
                while len(self._workers) < nt - 1:
                    self._workers.append(_Worker(self._spin))
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
