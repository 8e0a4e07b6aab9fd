"""CuPy's memory pools as the stand-in keeps them, and which memory a CUDA graph can still count on.

`MemoryPool` (`cupy.cuda.MemoryPool`) keeps the books of what it serves: a block freed by the last array that
held it stays cached in its pool (cupy/cuda/memory.pyx SingleDeviceMemoryPool: `free` -> `arena.insert_chunk`,
reused by the next `_malloc` of that size) until `free_all_blocks` gives it back to the device; a request no
cached block fits is a cudaMalloc (refused as "potentially unsafe" by a capture not in relaxed mode:
`graphs.unsafe`). `using_allocator` / `set_allocator` choose which pool serves this thread / the process
(None: raw cudaMalloc, no pool). `DEFAULT_POOL` is `cupy.get_default_memory_pool()`.

A `Block` is one allocation as CuPy sees it: held while an array (or the MemoryPointer `malloc` returned)
refers to it, freed when the last goes, whatever else (a graph's node) still refers to the NumPy memory. A
graph remembers the blocks its nodes use and asks each, at replay, whether it is `lost`: freed back to a pool
that serves any array (on a device that pool hands it to the next array of its size, which every replay then
overwrites), or to the device. A pool that served a capture serves captures only, so what is freed into it
stays its graphs' until `free_all_blocks`.
The stand-in's own checks (AssertionError, not CUDA refusals): an allocation during a capture must come from
a private pool (`cupy.cuda.using_allocator(cupy.cuda.MemoryPool().malloc)`), and such a pool may not serve
outside a capture afterwards.
"""
from __future__ import annotations

import contextlib
import itertools
import threading
import weakref

import numpy as np

from . import counters, graphs

_ROUND = 512        # CuPy's pools round sizes up to this
_STAMPS = itertools.count(1)        # orders frees and pool releases
UNTRACKED = object()                # memory whose allocator is unknown (a view of host-made memory)


class MemoryPool:
    """`cupy.cuda.MemoryPool`: bookkeeping of the memory it serves (which pool serves an allocation is
    `using_allocator`'s); a freed block stays cached until `free_all_blocks`."""

    def __init__(self, allocator=None):
        self._used, self._free = 0, []          # bytes held by live arrays; sizes of cached free blocks
        self._lock = threading.Lock()
        self.served_capture = False             # memory of a graph: never to serve outside a capture
        self.released = 0                       # when free_all_blocks last gave cached blocks back

    def malloc(self, size):
        """Device memory of `size` bytes from this pool (a MemoryPointer that keeps it alive)."""
        from . import device_memory             # (it imports this module)
        a = np.empty(max(int(size), 1), np.uint8)
        _serve(self, a)
        counters.record("alloc")
        return device_memory.pointer_to_new(a, self)

    def _take(self, a: np.ndarray) -> None:
        size = -(-max(a.nbytes, 1) // _ROUND) * _ROUND
        with self._lock:
            hit = size in self._free
        if not hit:
            graphs.unsafe("cudaMalloc (a memory pool miss)")
        with self._lock:
            if size in self._free:
                self._free.remove(size)
            self._used += size
        weakref.finalize(a, self._give_back, size)

    def _give_back(self, size):
        with self._lock:
            self._used -= size
            self._free.append(size)

    def used_bytes(self) -> int:
        return self._used

    def free_bytes(self) -> int:
        return sum(self._free)

    def total_bytes(self) -> int:
        return self._used + sum(self._free)

    def n_free_blocks(self) -> int:
        return len(self._free)

    def free_all_blocks(self, stream=None) -> None:
        graphs.wait_device("MemoryPool.free_all_blocks (cudaFree waits for the device)")
        with self._lock:
            self._free.clear()
            self.released = next(_STAMPS)


DEFAULT_POOL = MemoryPool()     # what cupy.get_default_memory_pool() returns
_RAW = object()                 # using_allocator(None): cudaMalloc itself, no pool
_PROCESS = [DEFAULT_POOL.malloc]        # set_allocator's
_TLS = threading.local()                # .allocator: using_allocator's, for this thread


class Block:
    """One device allocation as CuPy sees it: held while an array (or a MemoryPointer) refers to it; when the
    last one goes it is freed: back to its pool (`pool`: a weakref), or to the device (None: no pool)."""
    __slots__ = ("pool", "nbytes", "address", "holder", "freed")

    def __init__(self, pool, a: np.ndarray):
        self.pool = pool if pool is UNTRACKED or pool is None else weakref.ref(pool)
        self.nbytes, self.address = a.nbytes, int(a.__array_interface__["data"][0])
        self.holder, self.freed = None, None

    def hold(self) -> "_Holder":
        """What an array keeps to hold this memory (one object for all of them)."""
        holder = None if self.holder is None else self.holder()
        if holder is None:
            holder = _Holder()
            self.holder = weakref.ref(holder, self._let_go)
            self.freed = None
        return holder

    def _let_go(self, _ref) -> None:
        self.freed = next(_STAMPS)

    def lost(self):
        """How a graph lost this memory (None: it has it still)."""
        if self.freed is None or self.pool is UNTRACKED:
            return None
        if self.pool is None:
            return "freed (cudaFree: given back to the device)"
        pool = self.pool()
        if pool is None:
            return "freed, and its memory pool destroyed"
        if not pool.served_capture:
            where = "CuPy's default memory pool" if pool is DEFAULT_POOL else "a memory pool that serves any array"
            return f"freed back to {where}"
        if pool.released > self.freed:
            return "freed, and given back to the device by its capture pool's free_all_blocks"
        return None                     # cached by a pool that serves captures only: still the graphs'


class _Holder:
    __slots__ = ("__weakref__",)


@contextlib.contextmanager
def using_allocator(allocator=None):
    """`cupy.cuda.using_allocator`: this thread allocates with `allocator` inside the block (None: raw
    cudaMalloc, no pool)."""
    saved = getattr(_TLS, "allocator", None)
    _TLS.allocator = _RAW if allocator is None else allocator
    try:
        yield
    finally:
        _TLS.allocator = saved


def set_allocator(allocator=None) -> None:
    _PROCESS[0] = _RAW if allocator is None else allocator


def get_allocator():
    allocator = getattr(_TLS, "allocator", None) or _PROCESS[0]
    return None if allocator is _RAW else allocator


def allocated(a: np.ndarray):
    """A DeviceArray's fresh memory `a`: served by this thread's allocator (checked against captures); returns
    its pool (None: raw cudaMalloc; UNTRACKED: an allocator that is no MemoryPool's)."""
    allocator = get_allocator()
    pool = getattr(allocator, "__self__", None)
    pool = pool if isinstance(pool, MemoryPool) else None
    _serve(pool, a)
    return pool if pool is not None or allocator is None else UNTRACKED


def _serve(pool, a) -> None:
    mine = graphs.thread_capture()
    if mine is not None:
        if pool is None or pool is DEFAULT_POOL:
            raise mine.fail(AssertionError(
                "stand-in: allocation during capture from the default pool (or not from a MemoryPool): after "
                "the capture the pool could hand the graph's memory to other arrays (allocate inside "
                "`cupy.cuda.using_allocator(cupy.cuda.MemoryPool().malloc)`)"))
        pool.served_capture = True
    elif pool is not None and pool.served_capture:
        raise AssertionError("stand-in: a MemoryPool that served a capture allocates outside any capture: it "
                             "could hand the graph's memory to other arrays")
    if pool is not None:
        pool._take(a)
    else:
        graphs.unsafe("cudaMalloc")


def reset() -> None:
    """This thread's and the process's allocator back to the default pool."""
    _TLS.__dict__.clear()
    _PROCESS[0] = DEFAULT_POOL.malloc
