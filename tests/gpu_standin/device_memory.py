"""The stand-in's device arrays: NumPy memory with CuPy's spelling, kept apart from host arrays.

`DeviceArray` is a NumPy subclass (so NumPy does the arithmetic) that
- has `.get()` and `.data.ptr` as a CuPy array does;
- refuses, as CuPy does, to mix with host `numpy.ndarray` operands in ufuncs (a TypeError), so glue code
  that forgets a host-to-device copy fails here too;
- registers every allocation, so a raw device pointer handed to the cuDNN or NCCL stand-in can be turned
  back into the memory it points into, with bounds checked (`find`).
"""
from __future__ import annotations

import weakref

import numpy as np

_ROOTS: dict[int, weakref.ref] = {}       # id -> a live array that owns a device allocation


class MemoryPointer:
    """What `cupy.ndarray.data` is: here only `.ptr`, the address of the first element."""

    def __init__(self, ptr: int):
        self.ptr = int(ptr)


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _is_host(a) -> bool:
    return isinstance(a, np.ndarray) and not isinstance(a, DeviceArray) and a.ndim > 0


def to_base(a):
    """A DeviceArray as a plain ndarray view (same memory); anything else unchanged."""
    return a.view(np.ndarray) if isinstance(a, DeviceArray) else a


def wrap(result):
    """NumPy results back as DeviceArrays (scalars stay scalars, tuples are wrapped element-wise)."""
    if isinstance(result, np.ndarray) and not isinstance(result, DeviceArray):
        return result.view(DeviceArray)
    if isinstance(result, tuple):
        return tuple(wrap(r) for r in result)
    if isinstance(result, list):
        return [wrap(r) for r in result]
    return result


def refuse_host(what, values):
    for v in values:
        if _is_host(v):
            raise TypeError(f"{what}: a host numpy.ndarray {v.shape} mixed with device arrays (CuPy refuses "
                            "implicit host-to-device conversion: use cupy.asarray)")
        if isinstance(v, (tuple, list)):
            refuse_host(what, v)


class DeviceArray(np.ndarray):
    """A stand-in `cupy.ndarray`."""

    def __array_finalize__(self, obj):
        if not isinstance(getattr(self, "base", None), DeviceArray):
            _ROOTS[id(self)] = weakref.ref(self, lambda _r, key=id(self): _ROOTS.pop(key, None))

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        refuse_host(f"numpy ufunc {ufunc.__name__}", inputs + tuple(kwargs.get("out", ())))
        inputs = tuple(to_base(a) for a in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(to_base(a) for a in kwargs["out"])
        return wrap(getattr(ufunc, method)(*inputs, **kwargs))

    def __array_function__(self, func, types, args, kwargs):
        refuse_host(f"numpy.{func.__name__}", args)
        args = tuple(_unwrap_nested(a) for a in args)
        kwargs = {k: _unwrap_nested(v) for k, v in kwargs.items()}
        return wrap(func(*args, **kwargs))

    @property
    def data(self):
        return MemoryPointer(_address(self))

    def get(self, stream=None, out=None):
        host = np.array(self.view(np.ndarray), copy=True)
        if out is not None:
            out[...] = host
            return out
        return host

    def set(self, host):
        self[...] = np.asarray(host)


def _unwrap_nested(a):
    if isinstance(a, (tuple, list)):
        return type(a)(_unwrap_nested(v) for v in a)
    return to_base(a)


def live_roots():
    for ref in list(_ROOTS.values()):
        a = ref()
        if a is not None:
            yield a


def find(ptr: int, nbytes: int, what: str) -> np.ndarray:
    """The device allocation holding [ptr, ptr + nbytes), as a flat uint8 view from ptr; raises when the
    pointer is not device memory or the range runs past its allocation."""
    ptr = int(ptr)
    for root in live_roots():
        base = root.view(np.ndarray)
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
    """The dtype of the live device array whose memory starts at or contains `ptr` (None if unknown)."""
    for root in live_roots():
        base = root.view(np.ndarray)
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
