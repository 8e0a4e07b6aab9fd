"""A tiny thread pool for the CPU backend's numba kernels: `POOL` runs the parts of every kernel.

`run(fn, nt, *args)` calls fn(t, nt, *args) for t = 0..nt-1, part 0 on the calling thread and the others
on persistent worker threads. (Numba's own `parallel=True` would cost several seconds of compilation per
kernel and dtype on a cold cache, and its OpenMP threads spin against BLAS's.)

The workers never take the GIL on the way to a kernel. Each one runs a numba loop (`_serve`) without the
GIL: it watches its job number, calls the kernel through a C function pointer (a `cfunc` made once per
kernel and argument types by `jobs`, the arguments packed in an int64 block), marks the job done and
watches again. A worker that took the GIL to start its part (the pool before this one) waited for the
calling thread to let go of it, and paid a sleeping thread's wake-up (~200 us on a virtual machine) each
time the two met at the GIL: on two threads a training step ran no faster than on one.

An idle worker spins for `_SPIN_US` (a training step launches its kernels well within a few milliseconds
of each other), then returns to Python and sleeps on a condition variable; waking it costs the ~200 us
above, once per idle spell. A Python callable (tests, odd argument types) is run by the worker's Python
side, the old way. A kernel error in a worker is raised again by running that part on the caller, which
gives the real exception and traceback.
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

from pydtnn.backends.cpu.runtime import jobs

# How long an idle worker (or a waiting caller) spins before sleeping, in microseconds. Waking a sleeping
# worker measured ~200 us on this project's (virtual) 2-core machines; kernels of a training step come
# well within a few milliseconds of each other. 0 disables spinning (e.g. on an oversubscribed node).
_SPIN_US = float(os.environ.get("PYDTNN_CPU_SPIN_US", "3000"))

# One 64-byte row of int64 words per worker (no false sharing between workers).
_SEQ, _DONE, _AWAKE, _STATUS = 0, 1, 2, 3
# The job's words (one row): the job's function pointer (0: a Python callable), its block's address, nt
_FN, _BLOCK, _NT = 0, 1, 2
_ROW = 8
_MAX_WORKERS = 1024
# _serve's return codes
_SLEEPY, _PYTHON_JOB = 0, 1


def _ptr(context, builder, signature, args):
    ary = context.make_array(signature.args[0])(context, builder, args[0])
    i = context.cast(builder, args[1], signature.args[1], types.intp)
    j = context.cast(builder, args[2], signature.args[2], types.intp)
    return cgutils.get_item_pointer(context, builder, signature.args[0], ary, [i, j])


def _is_ctrl(arr):
    return isinstance(arr, types.Array) and arr.dtype == types.int64 and arr.ndim == 2


@intrinsic
def _load(typingctx, arr, i, j):
    """arr[i, j], sequentially consistent (a load the compiler may not hoist out of a spin loop)."""
    if not _is_ctrl(arr):
        return None

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_ptr(context, builder, signature, args), "seq_cst", 8)

    return types.int64(arr, i, j), codegen


@intrinsic
def _store(typingctx, arr, i, j, value):
    """arr[i, j] = value, sequentially consistent."""
    if not _is_ctrl(arr):
        return None

    def codegen(context, builder, signature, args):
        v = context.cast(builder, args[3], signature.args[3], types.int64)
        builder.store_atomic(v, _ptr(context, builder, signature, args), "seq_cst", 8)
        return context.get_dummy_value()

    return types.none(arr, i, j, value), codegen


@intrinsic
def _increment(typingctx, arr, i, j):
    """arr[i, j] += 1 atomically (a full barrier); the new value."""
    if not _is_ctrl(arr):
        return None

    def codegen(context, builder, signature, args):
        one = ir.Constant(ir.IntType(64), 1)
        old = builder.atomic_rmw("add", _ptr(context, builder, signature, args), one, "seq_cst")
        return builder.add(old, one)

    return types.int64(arr, i, j), codegen


@intrinsic
def _call_int_fn(typingctx, fptr):
    """Call the C function `int f(void)` at address fptr (here: sched_yield)."""
    sig = types.int32(fptr)

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(32), [])
        addr = context.cast(builder, args[0], signature.args[0], types.int64)
        return builder.call(builder.inttoptr(addr, fnty.as_pointer()), [])

    return sig, codegen


@intrinsic
def _call_job(typingctx, fptr, t, nt, block):
    """Call the job `int64 f(int64 t, int64 nt, int64 *block)` at address fptr."""
    sig = types.int64(fptr, t, nt, block)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [i64, i64, i64.as_pointer()])
        f = builder.inttoptr(context.cast(builder, args[0], signature.args[0], types.int64), fnty.as_pointer())
        p = builder.inttoptr(context.cast(builder, args[3], signature.args[3], types.int64), i64.as_pointer())
        tt = context.cast(builder, args[1], signature.args[1], types.int64)
        nn = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.call(f, [tt, nn, p])

    return sig, codegen


def _sched_yield_address() -> int:
    try:
        return ctypes.cast(ctypes.CDLL(None).sched_yield, ctypes.c_void_p).value or 0
    except (OSError, AttributeError):
        return 0


_YIELD = _sched_yield_address()


@njit(nogil=True, cache=True)
def _spin_until_changed(ctrl, row, col, value, iters, yield_fp):
    """Spin (without the GIL) while ctrl[row, col] == value, at most `iters` rounds; True if it changed.
    Each round yields the core (sched_yield) so that a runnable thread, e.g. a BLAS worker, is not slowed
    down by a spinning one."""
    for _ in range(iters):
        for _ in range(32):
            if _load(ctrl, row, col) != value:
                return True
        if yield_fp != 0:
            _call_int_fn(yield_fp)
    return False


@njit(nogil=True, cache=True)
def _serve(ctrl, w, job, seen, iters, yield_fp):
    """Worker w's loop, without the GIL: run each new job (number ctrl[w, SEQ] > seen) through its
    function pointer, mark it done, and go on. Returns (the job number reached, why): _SLEEPY after
    `iters` idle spin rounds with no job, _PYTHON_JOB for a job that is a Python callable (pointer 0)."""
    _store(ctrl, w, _AWAKE, 1)
    while True:
        if not _spin_until_changed(ctrl, w, _SEQ, seen, iters, yield_fp):
            # Going to sleep: announce it, then look once more (the caller bumps SEQ, then reads AWAKE)
            _store(ctrl, w, _AWAKE, 0)
            if _load(ctrl, w, _SEQ) == seen:
                return seen, _SLEEPY
            _store(ctrl, w, _AWAKE, 1)
        seen = _load(ctrl, w, _SEQ)
        fn = _load(job, 0, _FN)
        if fn == 0:
            return seen, _PYTHON_JOB
        status = _call_job(fn, w + 1, _load(job, 0, _NT), _load(job, 0, _BLOCK))
        _store(ctrl, w, _STATUS, status)
        _store(ctrl, w, _DONE, seen)


@njit(nogil=True, cache=True)
def _publish(ctrl, workers):
    """Bump the job number of workers 0..workers-1; the number of those that were asleep (they need a
    notify). The atomic increments order the job's words before the new numbers."""
    asleep = 0
    for w in range(workers):
        _increment(ctrl, w, _SEQ)
        if _load(ctrl, w, _AWAKE) == 0:
            asleep += 1
    return asleep


@njit(nogil=True, cache=True)
def _wait_done(ctrl, workers, iters, yield_fp):
    """Spin (without the GIL) until workers 0..workers-1 are done with their current job, at most about
    `iters` rounds; True if they are."""
    for w in range(workers):
        target = _load(ctrl, w, _SEQ)
        while _load(ctrl, w, _DONE) != target:
            if not _spin_until_changed(ctrl, w, _DONE, _load(ctrl, w, _DONE), iters, yield_fp):
                return False
    return True


def _calibrate() -> float:
    """Spin rounds per microsecond on this machine."""
    flag = np.zeros((1, _ROW), np.int64)
    _spin_until_changed(flag, 0, 0, 0, 10, _YIELD)
    n = 20_000
    t0 = time.perf_counter()
    _spin_until_changed(flag, 0, 0, 0, n, _YIELD)
    dt = max(time.perf_counter() - t0, 1e-6)
    return n / (dt * 1e6)


class ThreadPool:
    def __init__(self):
        self._lock = threading.Lock()       # one parallel kernel at a time per process
        self._spin = None
        self._start()

    def _start(self):
        self._ctrl = np.zeros((_MAX_WORKERS, _ROW), np.int64)
        self._job = np.zeros((1, _ROW), np.int64)
        self._block = np.zeros(jobs.BLOCK_WORDS, np.int64)  # the job's arguments
        self._job[0, _BLOCK] = self._block.ctypes.data
        self._cv = threading.Condition()
        self._workers = 0
        self._python_job = None
        self._errors: list = [None] * _MAX_WORKERS

    def _reset_after_fork(self):
        self._lock = threading.Lock()
        self._start()

    def _loop(self, w):
        seen = 0
        ctrl = self._ctrl
        while True:
            seen, why = _serve(ctrl, w, self._job, seen, self._spin, _YIELD)
            if why == _PYTHON_JOB:
                fn, args = self._python_job
                try:
                    fn(w + 1, *args)
                except BaseException as e:  # noqa: BLE001 -- raised again by the caller in run()
                    self._errors[w] = e
                finally:
                    ctrl[w, _DONE] = seen
                continue
            with self._cv:
                while int(ctrl[w, _SEQ]) == seen:
                    self._cv.wait()

    def _grow(self, workers):
        if workers > _MAX_WORKERS:
            raise ValueError(f"the CPU thread pool runs at most {_MAX_WORKERS + 1} threads, asked for {workers + 1}")
        if self._spin is None:
            self._spin = max(1, int(_SPIN_US * _calibrate())) if _SPIN_US > 0 else 0
        while self._workers < workers:
            threading.Thread(target=self._loop, args=(self._workers,), name="pydtnn-cpu-worker",
                             daemon=True).start()
            self._workers += 1

    def run(self, fn, nt, *args):
        if nt <= 1:
            fn(0, 1, *args)
            return
        with self._lock:
            self._grow(nt - 1)
            address = jobs.native_job(fn, args, self._block)   # None: a Python callable, or odd arguments
            if address is None:
                self._python_job = (fn, (nt,) + args)
                self._job[0, _FN] = 0
            else:
                self._job[0, _FN] = address
            self._job[0, _NT] = nt
            try:
                if _publish(self._ctrl, nt - 1):
                    with self._cv:
                        self._cv.notify_all()
                fn(0, nt, *args)
            finally:
                self._wait(nt - 1)
                self._python_job = None
            self._raise_worker_errors(fn, nt, args, address is not None)

    def _wait(self, workers):
        if _wait_done(self._ctrl, workers, self._spin, _YIELD):
            return
        for w in range(workers):
            while int(self._ctrl[w, _DONE]) != int(self._ctrl[w, _SEQ]):
                time.sleep(0.0002)

    def _raise_worker_errors(self, fn, nt, args, native):
        for w in range(nt - 1):
            err, self._errors[w] = self._errors[w], None
            if err is not None:
                raise err
            if native and self._ctrl[w, _STATUS] != 0:
                self._ctrl[w, _STATUS] = 0
                fn(w + 1, nt, *args)             # raises the kernel's own exception, here
                raise RuntimeError(f"pydtnn cpu kernel {getattr(fn, '__name__', fn)} failed in a worker thread "
                                   f"(part {w + 1} of {nt}) but not when run again on the calling thread")


POOL = ThreadPool()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POOL._reset_after_fork)
