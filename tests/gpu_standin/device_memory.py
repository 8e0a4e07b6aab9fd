"""The stand-in's device arrays: NumPy memory behind a type of its own that NumPy refuses, as CuPy's is.

`DeviceArray` is NOT a NumPy subclass. It holds its memory in a private NumPy array and, like
`cupy.ndarray`:
- has `.get()` / `.set()` and `.data.ptr`, and returns device arrays from everything it computes (a
  reduction gives a 0-d device array, not a NumPy scalar); `float()`, `int()`, `bool()`, `.item()` and
  `.tolist()` copy to the host;
- cannot become a NumPy array implicitly: `np.asarray(d)` raises TypeError (CuPy: "Implicit conversion to
  a NumPy array is not allowed"), it has no buffer protocol and no array interface (so mpi4py, numba and
  ctypes refuse it too), and NumPy ufuncs and functions that mix it with a host `numpy.ndarray` (0-d
  included) raise TypeError, as CuPy's `Unsupported type <class 'numpy.ndarray'>`;
- refuses assignment from a host array (`d[...] = host` is a ValueError in CuPy: it takes scalars and
  device arrays only); host integer arrays as INDICES are accepted, as CuPy converts them (not in a capture);
- registers every allocation, so a raw device pointer handed to the cuDNN, cuBLAS or NCCL stand-in can be
  turned back into the memory it points into, with bounds checked (`find`);
- holds its allocation as CuPy's arrays hold their memory: every array of one allocation (views included)
  keeps its `memory_pools.Block` held; when the last goes the block is freed to its pool, whoever else (a
  graph's node) still refers to the NumPy memory;
- copies to and from the host as `cupy.ndarray.get` / `set` do: `get(stream, out, blocking=True)` queues the
  copy on `stream` (None: the current one) and, when blocking, synchronizes that stream (a "sync"); a copy
  into pageable memory makes the host wait for it whatever `blocking` says (a "d2h", as CUDA returns from it
  only once done); each refused on a capturing stream by CuPy's guard (`graphs.refuse_transfer`).
Every operation that writes device memory goes through `graphs` (`launch` for in-place ones, `fresh` for
fresh results), which runs it now or records it into a stream capture; every allocation through
`memory_pools.allocated` (the pool that serves it); every wait through `graphs` as well.
"""
from __future__ import annotations

import functools
import operator
import weakref

import numpy as np

from . import counters, graphs, memory_pools

_ROOTS: dict[int, weakref.ref] = {}       # id -> a live NumPy array that owns a device allocation


class MemoryPointer:
    """What `cupy.ndarray.data` is: here only `.ptr`, the address of the first element (and, from
    `MemoryPool.malloc`, the memory it holds)."""

    def __init__(self, ptr: int):
        self.ptr = int(ptr)


def pointer_to_new(a: np.ndarray, pool) -> MemoryPointer:
    """`MemoryPool.malloc`'s result: a pointer to fresh memory `a` that holds it, as CuPy's does."""
    ptr = MemoryPointer(_address(a))
    ptr.mem, ptr.holder = a, _register(a, pool)
    return ptr


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _is_host(a) -> bool:
    return isinstance(a, np.ndarray)


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _register(a: np.ndarray, pool=memory_pools.UNTRACKED):
    """Device memory `a` (or a view of it) known to `find`; returns what holds its allocation (`pool`: the
    one that served it, for a fresh allocation)."""
    root = _root(a)
    key = id(root)
    entry = _ROOTS.get(key)
    if entry is None or entry[0]() is not root:
        gone = weakref.ref(root, lambda _r, key=key: _ROOTS.pop(key, None))
        entry = _ROOTS[key] = (gone, memory_pools.Block(pool, root))
    return entry[1].hold()


def block_of(a: np.ndarray):
    """The `memory_pools.Block` of the device allocation `a` is (or views); None: not device memory."""
    if not isinstance(a, np.ndarray):
        return None
    root = _root(a)
    entry = _ROOTS.get(id(root))
    return entry[1] if entry is not None and entry[0]() is root else None


def to_base(a):
    """A DeviceArray's memory as a plain ndarray (same memory); anything else unchanged."""
    return a._a if isinstance(a, DeviceArray) else a


def unwrap_nested(a):
    if isinstance(a, DeviceArray):
        return a._a
    if isinstance(a, (tuple, list)):
        return type(a)(unwrap_nested(v) for v in a)
    return a


def wrap(result):
    """NumPy results of device computations back as DeviceArrays (NumPy scalars as 0-d arrays)."""
    if isinstance(result, np.ndarray):
        return DeviceArray._from_device_memory(result)
    if isinstance(result, np.generic):
        return DeviceArray._from_device_memory(np.asarray(result))
    if isinstance(result, tuple):
        return tuple(wrap(r) for r in result)
    if isinstance(result, list):
        return [wrap(r) for r in result]
    return result


def refuse_host(what, values):
    for v in values:
        if _is_host(v):
            raise TypeError(f"{what}: Unsupported type <class 'numpy.ndarray'> (a host array {v.shape} mixed with "
                            "device arrays; CuPy refuses implicit host-to-device conversion: use cupy.asarray)")
        if isinstance(v, (tuple, list)):
            refuse_host(what, v)


def _operand(what, v):
    refuse_host(what, (v,))
    return unwrap_nested(v)


def _wrapped(a, key):
    """Integer index arrays taken modulo their axis: CuPy wraps out-of-bounds indices where NumPy raises
    IndexError (CuPy's documentation, "Differences between CuPy and NumPy: Out-of-bounds indices";
    cupy/_core/_routines_indexing.pyx), so a missing bounds check gives wrong numbers, as on a device."""
    keys = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis or k is None for k in keys):
        return key
    out = tuple(k % a.shape[i] if isinstance(k, np.ndarray) and k.ndim and k.dtype.kind in "iu" and i < a.ndim
                else k for i, k in enumerate(keys))
    return out if isinstance(key, tuple) else out[0]


def _index(key, reads=False):
    """Indices: device arrays unwrapped; host index arrays accepted (CuPy copies them to the device with
    `cupy.array`: refused on a capturing stream). `reads`: a boolean mask selects a count read back from the
    device."""
    if isinstance(key, tuple):
        return tuple(_index(k, reads) for k in key)
    if isinstance(key, DeviceArray):
        if reads and key.dtype == np.bool_:
            read_back("boolean-mask indexing: a result shaped by device values")
        return key._a
    if isinstance(key, (np.ndarray, list)) and np.ndim(key):
        graphs.refuse_transfer("H2D")
    return key


def read_back(what, stream=None) -> None:
    """A blocking read of device memory by the host (`get()` with CuPy's default blocking=True): refused on a
    capturing stream, else a copy the host waits for and a synchronization of `stream` (None: the current)."""
    graphs.refuse_transfer("D2H", stream)
    counters.record("d2h")
    _synchronize(stream)


def _synchronize(stream) -> None:
    from .fake_cupy import get_current_stream   # (fake_cupy imports this module)
    (stream or get_current_stream()).synchronize()


# the ndarray methods a device array offers (results are device arrays)
_METHODS = ("astype", "reshape", "ravel", "flatten", "transpose", "swapaxes", "copy", "view", "sum", "mean", "max",
            "min", "argmax", "argmin", "prod", "std", "var", "any", "all", "cumsum", "clip", "dot", "squeeze", "take",
            "repeat", "nonzero", "sort", "argsort", "round", "conj", "diagonal", "trace", "cumprod", "ptp", "put")
_HOST_METHODS = ("item", "tolist")      # copy to the host, as in CuPy
_PROPERTIES = ("shape", "dtype", "ndim", "size", "nbytes", "itemsize", "strides", "flags")


class DeviceArray:
    """A stand-in `cupy.ndarray` (see the module docstring)."""

    __slots__ = ("_a", "_holds", "__weakref__")
    __hash__ = None

    @classmethod
    def _from_device_memory(cls, a: np.ndarray) -> "DeviceArray":
        """Wrap memory that is device memory already (a fresh copy, or a view of device memory)."""
        self = object.__new__(cls)
        self._a = a
        if a.base is None:
            self._holds = _register(a, memory_pools.allocated(a))
            counters.record("alloc")
        else:
            self._holds = _register(a)
        return self

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        self._a = np.empty(shape, dtype=dtype, order=order)
        self._holds = _register(self._a, memory_pools.allocated(self._a))
        counters.record("alloc")

    # --- what NumPy must not do implicitly ---------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
                        "NumPy array explicitly. (CuPy stand-in)")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        what = f"numpy ufunc {ufunc.__name__}"
        out = kwargs.get("out")
        refuse_host(what, inputs + (tuple(out) if out else ()))
        inputs = tuple(unwrap_nested(a) for a in inputs)
        if out:
            kwargs["out"] = tuple(unwrap_nested(a) for a in out)
        kind = _cublas(ufunc.__name__, inputs) if ufunc.__name__ == "matmul" else "launch"
        compute = lambda: getattr(ufunc, method)(*inputs, **kwargs)      # noqa: E731
        if out or method == "at":                   # writes memory it is given
            graphs.launch(kind, ufunc.__name__, compute, uses=_leaves_of((inputs, kwargs)))
            return (out[0] if len(out) == 1 else out) if out else None
        return wrap(graphs.fresh(kind, ufunc.__name__, compute, (inputs, kwargs)))

    def __array_function__(self, func, types, args, kwargs):
        refuse_host(f"numpy.{func.__name__}", args + tuple(kwargs.values()))
        return device_call(func.__name__, func, args, kwargs)

    # --- CuPy's host transfers ---------------------------------------------------------------------
    def get(self, stream=None, order="C", out=None, blocking=True):
        """`cupy.ndarray.get`: a copy queued on `stream` (None: the current one); the host waits for it when
        `blocking` (CuPy then synchronizes the stream) or when `out` is pageable (CUDA returns only once a copy
        into pageable memory is done)."""
        src = self._a
        if out is not None and out.dtype != src.dtype:
            raise TypeError(f"{out.dtype} array cannot be obtained from {src.dtype} array")
        if out is not None and out.shape != src.shape:
            raise ValueError(f"Shape mismatch. Expected shape: {src.shape}, actual shape: {out.shape}")
        graphs.refuse_transfer("D2H", stream)
        if out is not None and counters.is_pinned(out) and not blocking:     # truly asynchronous on `stream`
            graphs.launch("d2h_async", "get", lambda: _copy_into(out, src), stream, strict=False, uses=(src,))
            return out
        counters.record("d2h")
        if blocking:
            _synchronize(stream)
        host = np.array(src, copy=True, order=order)
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, arr, stream=None):
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, got {type(arr).__name__}")
        if arr.shape != self._a.shape or arr.dtype != self._a.dtype:
            raise ValueError(f"set: shape/dtype mismatch {arr.shape} {arr.dtype} vs {self._a.shape} {self._a.dtype}")
        dst = self._a
        graphs.refuse_transfer("H2D", stream)
        if stream is not None and counters.is_pinned(arr):      # asynchronous on `stream`: reads `arr` then
            graphs.launch("h2d_pinned", "set", lambda: _copy_into(dst, arr), stream, strict=False, uses=(dst,))
            return
        count_h2d(arr, stream)
        dst[...] = arr

    @property
    def data(self):
        graphs.note_uses((self._a,), "a device pointer (cupy.ndarray.data)")
        return MemoryPointer(_address(self._a))

    @property
    def T(self):
        return wrap(self._a.T)

    @property
    def base(self):
        return None if self._a.base is None else wrap(self._a.base)

    def fill(self, value):
        if isinstance(value, np.ndarray) and value.ndim:
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        a, value = self._a, to_base(value)
        graphs.launch("launch", "fill", lambda: a.fill(value), uses=(a, value))

    def __getattr__(self, name):
        if name in _PROPERTIES:
            return getattr(self._a, name)
        if name in _HOST_METHODS:
            read_back(f"a copy to the host (cupy.ndarray.{name})")
            return getattr(self._a, name)
        if name in _METHODS:
            method = getattr(self._a, name)
            if name == "take":              # CuPy's take wraps out-of-bounds indices, as its indexing does
                method = functools.partial(method, mode="wrap")

            def device_method(*args, **kwargs):
                refuse_host(f"cupy.ndarray.{name}", args + tuple(kwargs.values()))
                return device_call(name, method, args, kwargs, this=self._a)
            device_method.__name__ = name
            return device_method
        raise AttributeError(f"'cupy.ndarray' (stand-in) has no attribute {name!r}")

    # --- indexing ----------------------------------------------------------------------------------
    def __getitem__(self, key):
        a, k = self._a, _index(key, reads=True)
        # basic indexing is a view; advanced indexing gathers into fresh memory (a kernel when captured), its
        # indices read (and wrapped) from device memory when it runs
        return wrap(graphs.fresh("launch", "getitem", lambda: a[_wrapped(a, k)], (a, k), launches=lambda r: False))

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray) and value.ndim:
            raise ValueError(f"non-scalar numpy.ndarray cannot be used for fill (assigning a host array "
                             f"{value.shape} to device memory: CuPy refuses it, use cupy.asarray first)")
        if isinstance(value, (list, tuple)):
            raise TypeError("assigning a Python sequence to device memory: CuPy refuses it, use cupy.asarray first")
        a, k, v = self._a, _index(key), to_base(value)
        graphs.launch("launch", "setitem", lambda: a.__setitem__(k, v), uses=(a, v, *_leaves_of(k)))

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # --- conversions to host scalars (a synchronization in CuPy) -----------------------------------
    def _to_host(self, what):
        read_back(f"a copy to the host ({what})")
        return self._a

    def __float__(self):
        return float(self._to_host("float()"))

    def __int__(self):
        return int(self._to_host("int()"))

    def __complex__(self):
        return complex(self._to_host("complex()"))

    def __bool__(self):
        return bool(self._to_host("bool()"))

    def __repr__(self):
        return repr(self._to_host("repr"))

    def __str__(self):
        return str(self._to_host("str"))

    def __format__(self, spec):
        return format(self._to_host("format"), spec)

    def __neg__(self):
        return _unary(self, "neg", lambda a: -a)

    def __pos__(self):
        return _unary(self, "pos", lambda a: +a)

    def __abs__(self):
        return _unary(self, "abs", abs)

    def __invert__(self):
        return _unary(self, "invert", lambda a: ~a)


def _unary(self, name, op):
    a = self._a
    return wrap(graphs.fresh("launch", name, lambda: op(a), (a,)))


def _binary(op, name, reflected=False):
    def method(self, other):
        a, other = self._a, _operand(f"cupy.ndarray.{name}", other)
        compute = (lambda: op(other, a)) if reflected else (lambda: op(a, other))
        kind = _cublas(name, (a, other)) if "matmul" in name else "launch"
        return wrap(graphs.fresh(kind, name, compute, (a, other)))
    method.__name__ = name
    return method


def _inplace(op, name):
    def method(self, other):
        a, other = self._a, _operand(f"cupy.ndarray.{name}", other)
        graphs.launch(_cublas(name, (a, other)) if "matmul" in name else "launch", name, lambda: op(a, other),
                      uses=(a, other))
        return self
    method.__name__ = name
    return method


for _name, _op in (("add", operator.add), ("sub", operator.sub), ("mul", operator.mul),
                   ("truediv", operator.truediv), ("floordiv", operator.floordiv), ("mod", operator.mod),
                   ("pow", operator.pow), ("matmul", operator.matmul), ("and", operator.and_),
                   ("or", operator.or_), ("xor", operator.xor), ("lshift", operator.lshift),
                   ("rshift", operator.rshift)):
    setattr(DeviceArray, f"__{_name}__", _binary(_op, f"__{_name}__"))
    setattr(DeviceArray, f"__r{_name}__", _binary(_op, f"__r{_name}__", reflected=True))
    setattr(DeviceArray, f"__i{_name}__", _inplace(getattr(operator, f"i{_name}"), f"__i{_name}__"))
for _name, _op in (("lt", operator.lt), ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge),
                   ("eq", operator.eq), ("ne", operator.ne)):
    setattr(DeviceArray, f"__{_name}__", _binary(_op, f"__{_name}__"))


_NO_KERNEL = {"empty", "empty_like"}        # allocation only
_CUBLAS = {"matmul", "dot", "tensordot", "inner", "vdot", "einsum"}
# write into an argument without `out=` (eagerly counted as nothing, as before; recorded when captured)
_IN_PLACE_FUNCTIONS = {"copyto", "put", "place", "putmask", "fill_diagonal", "put_along_axis"}
_IN_PLACE_METHODS = {"put", "sort"}
# results whose shape depends on device values: CuPy reads a count back to the host (a synchronization)
_DATA_DEPENDENT = {"nonzero", "argwhere", "flatnonzero", "unique", "compress", "extract"}


def _cublas(name, operands) -> str:
    """The kind of a CuPy product: "cublas" where CuPy calls cuBLAS (refused in a capture, as CuPy does),
    "launch" where it runs a kernel of its own (`fake_cupy.cublas_product`)."""
    from .fake_cupy import cublas_product     # (fake_cupy imports this module)
    return "cublas" if cublas_product(name, operands) else "launch"


def device_call(name, fn, args, kwargs, this=None):
    """A NumPy function or ndarray method `fn` on device arrays (host arrays refused by the caller), run or
    captured through `graphs`; results as device arrays. `this`: the array a method is bound to."""
    out = kwargs.get("out")
    in_place = name in (_IN_PLACE_FUNCTIONS if this is None else _IN_PLACE_METHODS)
    a, kw = unwrap_nested(args), {k: unwrap_nested(v) for k, v in kwargs.items()}
    if name in _DATA_DEPENDENT or (name == "where" and len(args) + len(kwargs) == 1):
        read_back(f"cupy.{name}: a result shaped by device values")
    compute = lambda: fn(*a, **kw)      # noqa: E731
    kind = _cublas(name, (this, *a)) if name in _CUBLAS else "launch"
    if name in _NO_KERNEL:
        return wrap(compute())
    if out is not None or in_place:             # writes memory it is given
        result = graphs.launch(kind, name, compute, count=out is not None, uses=_leaves_of((this, a, kw)))
        return out if isinstance(out, DeviceArray) else wrap(result)
    return wrap(graphs.fresh(kind, name, compute, (this, a, kw), launches=lambda r: launches(name, r)))


def launches(name, result) -> bool:
    """Whether an eager CuPy operation launched a kernel: it wrote a fresh result (a view, such as reshape or
    transpose, writes nothing)."""
    if name in _NO_KERNEL:
        return False
    results = result if isinstance(result, (tuple, list)) else (result,)
    return any(isinstance(r, np.ndarray) and r.base is None or isinstance(r, np.generic) for r in results)


def count_h2d(host, stream=None) -> None:
    """A host-to-device copy from ordinary (pageable) memory, which blocks the thread (`set` queues pinned
    copies itself); refused on a capturing stream."""
    graphs.refuse_transfer("H2D", stream)
    counters.record("h2d_pageable")
    if counters.on_main_thread():
        counters.record("h2d_pageable_main")


def _copy_into(dst, src):
    dst[...] = src
    return dst


def _leaves_of(x) -> list:
    """The NumPy arrays in x (nested in tuples, lists and dicts)."""
    if isinstance(x, np.ndarray):
        return [x]
    if isinstance(x, (tuple, list)):
        return [leaf for v in x for leaf in _leaves_of(v)]
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves_of(v)]
    return []


def live_roots():
    for ref, _block in list(_ROOTS.values()):
        a = ref()
        if a is not None:
            yield a


def find(ptr: int, nbytes: int, what: str) -> np.ndarray:
    """The device allocation holding [ptr, ptr + nbytes), as a flat uint8 view from ptr; raises when the
    pointer is not device memory or the range runs past its allocation."""
    ptr = int(ptr)
    for base in live_roots():
        start = _address(base)
        size = base.nbytes
        if start <= ptr < start + max(size, 1) and base.flags.c_contiguous:
            if ptr + nbytes > start + size:
                raise AssertionError(f"{what}: {nbytes} bytes from the pointer run {ptr + nbytes - start - size} "
                                     f"bytes past its device allocation of {size} bytes")
            graphs.note_uses((base,), what)
            flat = base.reshape(-1).view(np.uint8)
            return flat[ptr - start:ptr - start + nbytes]
    raise AssertionError(f"{what}: pointer {ptr:#x} is not in any live device allocation of the stand-in")


def dtype_at(ptr: int):
    """The dtype of the live device allocation that contains `ptr` (None if unknown)."""
    for base in live_roots():
        start = _address(base)
        if start <= int(ptr) < start + max(base.nbytes, 1):
            return base.dtype
    return None


def view(ptr: int, shape, strides_elems, dtype, what: str) -> np.ndarray:
    """A NumPy view of device memory: `shape`, strides in ELEMENTS (as cuDNN takes them), `dtype`."""
    dtype = np.dtype(dtype)
    shape = [int(d) for d in shape]
    strides_elems = [int(s) for s in strides_elems]
    if len(shape) != len(strides_elems):
        raise AssertionError(f"{what}: {len(shape)} dims but {len(strides_elems)} strides")
    if any(s < 0 for s in strides_elems) or any(d <= 0 for d in shape):
        raise AssertionError(f"{what}: dims {shape} / strides {strides_elems} must be positive")
    span = (1 + sum((d - 1) * s for d, s in zip(shape, strides_elems))) * dtype.itemsize
    owner = dtype_at(ptr)
    if owner is not None and owner != dtype:
        raise AssertionError(f"{what}: declared {dtype} but the device array at that pointer is {owner}")
    raw = find(ptr, span, what)
    return np.lib.stride_tricks.as_strided(raw.view(dtype) if span % dtype.itemsize == 0 else raw, shape=shape,
                                           strides=[s * dtype.itemsize for s in strides_elems], writeable=True)
