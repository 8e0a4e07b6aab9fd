"""GEMM callable from inside numba kernels (the convolutions, matrix products and attention call it).

Why: the CPU kernels pack a chunk of the input (im2col-like) into a small, cache-resident buffer and
multiply it right away, in parallel chunks driven by numba's thread pool. Calling BLAS from inside the
numba kernel keeps ONE thread pool busy (OpenBLAS and numba pools fighting over the same cores made
both several times slower) and keeps the packed chunk hot in cache.

How: NumPy's wheels bundle OpenBLAS (scipy-openblas) and export `cblas_sgemm`/`cblas_dgemm` under a
prefixed name. We find the symbol with ctypes, pass its address to the numba kernel as a plain integer
argument (so kernels stay cacheable with `cache=True`), and call it through `gemm()`, a numba intrinsic
that casts the integer to a function pointer. While a kernel runs, OpenBLAS is limited to one thread
(`blas_single_thread()`), since the parallelism comes from the numba chunks.

Where no usable CBLAS symbol exists (NumPy built against MKL, Accelerate, ...), `GEMM_OK` is False and
the backend falls back to plain `numpy.matmul` paths.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import threading

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

# CBLAS constants
ROW_MAJOR = 101
NO_TRANS = 111
TRANS = 112


def _find_openblas():
    """(CDLL, prefix, suffix, int_bits) of NumPy's bundled OpenBLAS, or None."""
    base = os.path.dirname(np.__file__)
    candidates = []
    for libdir in (os.path.join(base, "..", "numpy.libs"), os.path.join(base, ".libs"),
                   os.path.join(base, "..", "scipy_openblas64", "lib"),
                   os.path.join(base, "..", "scipy_openblas32", "lib")):
        candidates += sorted(glob.glob(os.path.join(libdir, "*openblas*.so*")))
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix, bits in (("scipy_", "64_", 64), ("", "64_", 64), ("scipy_", "", 32), ("", "", 32)):
            if hasattr(lib, f"{prefix}cblas_sgemm{suffix}"):
                return lib, prefix, suffix, bits
    return None


_found = _find_openblas()
GEMM_OK = False
_SGEMM = _DGEMM = 0
_get_threads = _set_threads = None
INT_BITS = 64
if _found is not None:
    _lib, _prefix, _suffix, INT_BITS = _found
    try:
        _SGEMM = ctypes.cast(getattr(_lib, f"{_prefix}cblas_sgemm{_suffix}"), ctypes.c_void_p).value
        _DGEMM = ctypes.cast(getattr(_lib, f"{_prefix}cblas_dgemm{_suffix}"), ctypes.c_void_p).value
        _get_threads = getattr(_lib, f"{_prefix}openblas_get_num_threads{_suffix}")
        _get_threads.restype = ctypes.c_int
        _get_threads.argtypes = []
        _set_threads = getattr(_lib, f"{_prefix}openblas_set_num_threads{_suffix}")
        _set_threads.restype = None
        _set_threads.argtypes = [ctypes.c_int]
        GEMM_OK = bool(_SGEMM and _DGEMM)
    except AttributeError:
        GEMM_OK = False


def gemm_ptr(dtype) -> int:
    """Address of cblas_?gemm for this dtype (an int handed to numba kernels)."""
    return _SGEMM if np.dtype(dtype) == np.float32 else _DGEMM


_LOCK = threading.RLock()
_displaced: list[int] = []     # inside `blas_single_thread`: the count it set aside (innermost last)


def blas_threads() -> int:
    """OpenBLAS's thread count as the user set it (threadpoolctl limits show up here), also inside
    `blas_single_thread`, which sets OpenBLAS itself to 1 meanwhile; 0 when unknown."""
    if _displaced:
        return _displaced[-1]
    return int(_get_threads()) if _get_threads is not None else 0


@contextlib.contextmanager
def blas_single_thread():
    """OpenBLAS on one thread for the duration (the numba chunks are the parallel level). Held under a
    process-wide lock: OpenBLAS's thread count is global, and a multi-threaded OpenBLAS called from two
    threads at once is not safe. `blas_threads()` keeps answering the user's count meanwhile (a kernel's
    part count read inside once came out 1: strided convolutions' backward data ran on one thread)."""
    with _LOCK:
        if _set_threads is None:
            yield
            return
        n = int(_get_threads())
        _displaced.append(blas_threads())
        if n != 1:
            _set_threads(1)
        try:
            yield
        finally:
            _displaced.pop()
            if n != 1:
                _set_threads(n)


@intrinsic
def gemm(typingctx, fptr, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """cblas_?gemm(RowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) from numba.

    fptr: address from `gemm_ptr`; a, b, c: addresses (ints, e.g. `arr.ctypes.data + offset`);
    alpha/beta: float32 for sgemm, float64 for dgemm (the float type picks the prototype).
    """
    if not isinstance(alpha, types.Float):
        return None
    sig = types.void(fptr, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

    def codegen(context, builder, signature, args):
        i32, bi = ir.IntType(32), ir.IntType(INT_BITS)
        fl = ir.FloatType() if signature.args[6] == types.float32 else ir.DoubleType()
        vp = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, bi, bi, bi, fl, vp, bi, vp, bi, fl, vp, bi])
        argtys = signature.args

        def as_int(idx, width):
            v = context.cast(builder, args[idx], argtys[idx], types.int64)
            return builder.trunc(v, ir.IntType(width)) if width != 64 else v

        def as_ptr(idx):
            return builder.inttoptr(as_int(idx, 64), vp)

        def as_float(idx):
            return context.cast(builder, args[idx], argtys[idx], argtys[6])

        fn = builder.inttoptr(as_int(0, 64), fnty.as_pointer())
        builder.call(fn, [ir.Constant(i32, ROW_MAJOR), as_int(1, 32), as_int(2, 32),
                          as_int(3, INT_BITS), as_int(4, INT_BITS), as_int(5, INT_BITS), as_float(6),
                          as_ptr(7), as_int(8, INT_BITS), as_ptr(9), as_int(10, INT_BITS), as_float(11),
                          as_ptr(12), as_int(13, INT_BITS)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def addr(typingctx, arr, offset):
    """Address (int64) of `arr`'s data plus `offset` elements, for `gemm` (keeps kernels cacheable)."""
    if not isinstance(arr, types.Array):
        return None
    sig = types.int64(arr, offset)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        off = context.cast(builder, args[1], signature.args[1], types.int64)
        itemsize = context.get_constant(types.int64, context.get_abi_sizeof(
            context.get_data_type(signature.args[0].dtype)))
        base = builder.ptrtoint(ary.data, ir.IntType(64))
        return builder.add(base, builder.mul(off, itemsize))

    return sig, codegen
