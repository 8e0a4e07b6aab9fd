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
- registers every allocation, so a raw device pointer handed to the cuDNN or NCCL stand-in can be turned
  back into the memory it points into, with bounds checked (`find`).
Every operation that writes device memory goes through `graphs` (`launch` for in-place ones, `fresh` for
fresh results), which runs it now or records it into a stream capture; every allocation through
`graphs.allocated` (the pool that serves it); every wait or blocking copy through `graphs.forbid`.
"""
from __future__ import annotations

import operator
import weakref

import numpy as np

from . import counters, graphs

_ROOTS: dict[int, weakref.ref] = {}       # id -> a live NumPy array that owns a device allocation


class MemoryPointer:
    """What `cupy.ndarray.data` is: here only `.ptr`, the address of the first element."""

    def __init__(self, ptr: int):
        self.ptr = int(ptr)


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _is_host(a) -> bool:
    return isinstance(a, np.ndarray)


def _register(a: np.ndarray) -> None:
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    key = id(root)
    ref = _ROOTS.get(key)
    if ref is None or ref() is not root:
        _ROOTS[key] = weakref.ref(root, lambda _r, key=key: _ROOTS.pop(key, None))


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


def _index(key, reads=False):
    """Indices: device arrays unwrapped; host index arrays accepted (CuPy copies them to the device: a
    pageable copy, refused by a capture). `reads`: a boolean mask selects a count known only on the device."""
    if isinstance(key, tuple):
        return tuple(_index(k, reads) for k in key)
    if isinstance(key, DeviceArray):
        if reads and key.dtype == np.bool_:
            graphs.forbid("boolean-mask indexing: a result shaped by device values (read back to the host)")
        return key._a
    if isinstance(key, (np.ndarray, list)):
        graphs.forbid("a host index array (copied to the device: a pageable host-to-device copy)")
    return key


# the ndarray methods a device array offers (results are device arrays)
_METHODS = ("astype", "reshape", "ravel", "flatten", "transpose", "swapaxes", "copy", "view", "sum", "mean", "max",
            "min", "argmax", "argmin", "prod", "std", "var", "any", "all", "cumsum", "clip", "dot", "squeeze", "take",
            "repeat", "nonzero", "sort", "argsort", "round", "conj", "diagonal", "trace", "cumprod", "ptp", "put")
_HOST_METHODS = ("item", "tolist")      # copy to the host, as in CuPy
_PROPERTIES = ("shape", "dtype", "ndim", "size", "nbytes", "itemsize", "strides", "flags")


class DeviceArray:
    """A stand-in `cupy.ndarray` (see the module docstring)."""

    __slots__ = ("_a", "__weakref__")
    __hash__ = None

    @classmethod
    def _from_device_memory(cls, a: np.ndarray) -> "DeviceArray":
        """Wrap memory that is device memory already (a fresh copy, or a view of device memory)."""
        self = object.__new__(cls)
        self._a = a
        _register(a)
        if a.base is None:
            graphs.allocated(a)
            counters.record("alloc")
        return self

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        self._a = np.empty(shape, dtype=dtype, order=order)
        _register(self._a)
        graphs.allocated(self._a)
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
        kind = "cublas" if ufunc.__name__ == "matmul" else "launch"
        compute = lambda: getattr(ufunc, method)(*inputs, **kwargs)      # noqa: E731
        if out or method == "at":                   # writes memory it is given
            graphs.launch(kind, ufunc.__name__, compute)
            return (out[0] if len(out) == 1 else out) if out else None
        return wrap(graphs.fresh(kind, ufunc.__name__, compute, (inputs, kwargs)))

    def __array_function__(self, func, types, args, kwargs):
        refuse_host(f"numpy.{func.__name__}", args + tuple(kwargs.values()))
        return device_call(func.__name__, func, args, kwargs)

    # --- CuPy's host transfers ---------------------------------------------------------------------
    def get(self, stream=None, order="C", out=None):
        src = self._a
        if stream is not None and out is not None and counters.is_pinned(out):    # asynchronous on `stream`
            graphs.launch("d2h_async", "get", lambda: _copy_into(out, src, order), stream, strict=False)
            return out
        graphs.forbid("a blocking device-to-host copy (get)", stream)
        counters.record("d2h")
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
        if stream is not None and counters.is_pinned(arr):      # asynchronous on `stream`: reads `arr` then
            graphs.launch("h2d_pinned", "set", lambda: _copy_into(dst, arr), stream, strict=False)
            return
        count_h2d(arr, stream)
        dst[...] = arr

    @property
    def data(self):
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
        graphs.launch("launch", "fill", lambda: a.fill(value))

    def __getattr__(self, name):
        if name in _PROPERTIES:
            return getattr(self._a, name)
        if name in _HOST_METHODS:
            graphs.forbid(f"a copy to the host (cupy.ndarray.{name})")
            counters.record("d2h")
            return getattr(self._a, name)
        if name in _METHODS:
            method = getattr(self._a, name)

            def device_method(*args, **kwargs):
                refuse_host(f"cupy.ndarray.{name}", args + tuple(kwargs.values()))
                return device_call(name, method, args, kwargs, this=self._a)
            device_method.__name__ = name
            return device_method
        raise AttributeError(f"'cupy.ndarray' (stand-in) has no attribute {name!r}")

    # --- indexing ----------------------------------------------------------------------------------
    def __getitem__(self, key):
        a, k = self._a, _index(key, reads=True)
        # basic indexing is a view; advanced indexing gathers into fresh memory (a kernel when captured)
        return wrap(graphs.fresh("launch", "getitem", lambda: a[k], (a, k), launches=lambda r: False))

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray) and value.ndim:
            raise ValueError(f"non-scalar numpy.ndarray cannot be used for fill (assigning a host array "
                             f"{value.shape} to device memory: CuPy refuses it, use cupy.asarray first)")
        if isinstance(value, (list, tuple)):
            raise TypeError("assigning a Python sequence to device memory: CuPy refuses it, use cupy.asarray first")
        a, k, v = self._a, _index(key), to_base(value)
        graphs.launch("launch", "setitem", lambda: a.__setitem__(k, v))

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # --- conversions to host scalars (a synchronization in CuPy) -----------------------------------
    def _to_host(self, what):
        graphs.forbid(f"a copy to the host ({what})")
        counters.record("d2h")
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
        graphs.forbid("a copy to the host (repr)")
        return repr(self._a)

    def __str__(self):
        graphs.forbid("a copy to the host (str)")
        return str(self._a)

    def __format__(self, spec):
        graphs.forbid("a copy to the host (format)")
        return format(self._a, spec)

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
        return wrap(graphs.fresh("cublas" if "matmul" in name else "launch", name, compute, (a, other)))
    method.__name__ = name
    return method


def _inplace(op, name):
    def method(self, other):
        a, other = self._a, _operand(f"cupy.ndarray.{name}", other)
        graphs.launch("cublas" if "matmul" in name else "launch", name, lambda: op(a, other))
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


def device_call(name, fn, args, kwargs, this=None):
    """A NumPy function or ndarray method `fn` on device arrays (host arrays refused by the caller), run or
    captured through `graphs`; results as device arrays. `this`: the array a method is bound to."""
    out = kwargs.get("out")
    in_place = name in (_IN_PLACE_FUNCTIONS if this is None else _IN_PLACE_METHODS)
    a, kw = unwrap_nested(args), {k: unwrap_nested(v) for k, v in kwargs.items()}
    if name in _DATA_DEPENDENT or (name == "where" and len(args) + len(kwargs) == 1):
        graphs.forbid(f"cupy.{name}: a result shaped by device values (read back to the host)")
    compute = lambda: fn(*a, **kw)      # noqa: E731
    kind = "cublas" if name in _CUBLAS else "launch"
    if name in _NO_KERNEL:
        return wrap(compute())
    if out is not None or in_place:             # writes memory it is given
        result = graphs.launch(kind, name, compute, count=out is not None)
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
    """A blocking host-to-device copy from ordinary (pageable) memory (`set` queues pinned copies itself)."""
    graphs.forbid("a pageable host-to-device copy", stream)
    counters.record("h2d_pageable")
    if counters.on_main_thread():
        counters.record("h2d_pageable_main")


def _copy_into(dst, src, order="K"):
    dst[...] = np.array(src, copy=True, order=order)
    return dst


def live_roots():
    for ref in list(_ROOTS.values()):
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
