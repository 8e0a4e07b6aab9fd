"""cuBLAS of the stand-in: the ctypes library the GPU backend gets from `load_libcublas()` (its own handle, as
`pydtnn/backends/gpu/cublas.py` uses it), computing with NumPy on the device arrays' host memory.

What is checked (the glue, not NVIDIA's library), against cublas_api.h (CUDA 12.6):
- each argument's ctypes type and order: the handle as c_void_p (made by cublasCreate_v2), enums and int
  sizes as Python ints (ctypes passes them as C int), `long long` strides as c_longlong, `size_t` as c_size_t,
  device pointers as c_void_p, alpha and beta by reference in the data's precision (c_float for S, c_double
  for D routines: pointer mode host, the only one modelled);
- what cuBLAS itself refuses, returned as its status (CUBLAS_STATUS_INVALID_VALUE, 7): an unknown transpose,
  math or pointer mode, negative sizes, a leading dimension under the rows it stores (lda < max(1, m) for an
  untransposed A, per the cublas<t>gemm error values), a workspace not aligned to 256 bytes
  (cublasSetWorkspace);
- every matrix (each of a batch) lies inside one live device allocation, of the routine's dtype, and so does
  the workspace, at every call (a workspace freed since cublasSetWorkspace is caught); a batch's C matrices
  do not overlap.
Modelled as cuBLAS documents it:
- cublasSetStream_v2 resets the handle's workspace to cuBLAS's own pool (cuBLAS guide, cublasSetStream());
- a GEMM goes to its handle's stream through `graphs.launch`: run now, or recorded by a capture of that
  stream; a handle left on another stream while its thread captures is refused (as the cuDNN stand-in);
- a GEMM on a capturing stream with no workspace of the caller's is refused: cuBLAS would allocate one with
  cudaMallocAsync, a memory node inside the graph (cuBLAS guide, "CUDA Graphs Support": "use the
  cublasSetWorkspace() function to provide user-owned workspace memory");
- numerics: products in the data's precision; under CUBLAS_TF32_TENSOR_OP_MATH (and the deprecated
  TENSOR_OP_MATH) float32 inputs are rounded to TF32 first, as tensor cores read them; beta = 0 never reads C.
Each GEMM counts one "cublas" launch, named "gemm" or "gemm_strided_batched"; calls are recorded in `CALLS`.
"""
from __future__ import annotations

import ctypes

import numpy as np

from . import counters, device_memory, graphs
from .fake_cudnn import _tf32

CALLS: list[tuple] = []
SUCCESS, INVALID_VALUE = 0, 7
_TF32_MODES = (1, 3)                    # CUBLAS_TENSOR_OP_MATH (deprecated), CUBLAS_TF32_TENSOR_OP_MATH
_MATH_MODES = (0, 1, 2, 3)
_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
_BYREF = type(ctypes.byref(ctypes.c_int()))
# the header's types (ctypes.c_longlong and c_size_t are aliases of c_long and c_ulong on 64-bit Linux)
_C_NAMES = {ctypes.c_longlong: "long long (c_longlong)", ctypes.c_size_t: "size_t (c_size_t)",
            ctypes.c_void_p: "a pointer (c_void_p)"}


class _Handle:
    def __init__(self):
        self.stream = 0                 # the legacy stream until cublasSetStream
        self.workspace = None           # (ptr, bytes) of the caller's, None: cuBLAS's own pool
        self.math = 0
        self.pointer_mode = 0


class _Stream:
    """What `graphs.is_capturing` takes: a stream's handle."""

    def __init__(self, ptr):
        self.ptr = ptr


class Library:
    """The ctypes library object `Cublas` gets from `load_libcublas()`."""

    def __init__(self):
        self._handles: dict[int, _Handle] = {}
        self._next = 0x7000

    # --- argument checks ----------------------------------------------------------------------------
    def _handle(self, v, fname):
        if not isinstance(v, ctypes.c_void_p):
            raise TypeError(f"{fname} argument 0: the handle must be passed as c_void_p, got {type(v).__name__}")
        h = self._handles.get(v.value)
        if h is None:
            raise AssertionError(f"{fname}: not a handle made by cublasCreate_v2")
        return h

    @staticmethod
    def _ints(vals, fname, first):
        for i, v in enumerate(vals):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{fname} argument {first + i}: an int expected (passed as C int), got "
                                f"{type(v).__name__}")
        return [int(v) for v in vals]

    @staticmethod
    def _typed(v, ctype, fname, i):
        if type(v) is not ctype:
            raise TypeError(f"{fname} argument {i}: {_C_NAMES[ctype]} expected, got {type(v).__name__}")
        return v.value or 0

    @staticmethod
    def _ref(v, ctype, fname, i):
        if not isinstance(v, _BYREF) or type(v._obj) is not ctype:
            got = type(getattr(v, "_obj", v)).__name__
            raise TypeError(f"{fname} argument {i}: byref({ctype.__name__}) expected, got {got}")
        return v._obj.value

    # --- the handle ---------------------------------------------------------------------------------
    def cublasCreate_v2(self, out):
        if not isinstance(out, _BYREF) or not isinstance(out._obj, ctypes.c_void_p):
            raise TypeError("cublasCreate_v2: expected ctypes.byref(c_void_p)")
        self._next += 0x10
        out._obj.value = self._next
        self._handles[self._next] = _Handle()
        CALLS.append(("cublasCreate_v2",))
        return SUCCESS

    def cublasSetStream_v2(self, handle, stream):
        h = self._handle(handle, "cublasSetStream_v2")
        h.stream = self._typed(stream, ctypes.c_void_p, "cublasSetStream_v2", 1)
        h.workspace = None              # "unconditionally resets the cuBLAS library workspace"
        CALLS.append(("cublasSetStream_v2", h.stream))
        return SUCCESS

    def cublasSetWorkspace_v2(self, handle, ptr, nbytes):
        h = self._handle(handle, "cublasSetWorkspace_v2")
        ptr = self._typed(ptr, ctypes.c_void_p, "cublasSetWorkspace_v2", 1)
        nbytes = self._typed(nbytes, ctypes.c_size_t, "cublasSetWorkspace_v2", 2)
        if ptr % 256:
            return INVALID_VALUE        # "has to be aligned to at least 256 bytes"
        device_memory.find(ptr, nbytes, "cublasSetWorkspace_v2 workspace")
        h.workspace = (ptr, nbytes)
        CALLS.append(("cublasSetWorkspace_v2", ptr, nbytes))
        return SUCCESS

    def cublasSetMathMode(self, handle, mode):
        h = self._handle(handle, "cublasSetMathMode")
        mode = self._ints((mode,), "cublasSetMathMode", 1)[0]
        if mode & ~_DISALLOW_REDUCED_PRECISION_REDUCTION not in _MATH_MODES:
            return INVALID_VALUE
        h.math = mode & ~_DISALLOW_REDUCED_PRECISION_REDUCTION
        CALLS.append(("cublasSetMathMode", h.math))
        return SUCCESS

    def cublasSetPointerMode_v2(self, handle, mode):
        h = self._handle(handle, "cublasSetPointerMode_v2")
        mode = self._ints((mode,), "cublasSetPointerMode_v2", 1)[0]
        if mode not in (0, 1):
            return INVALID_VALUE
        if mode != 0:
            raise AssertionError("cublasSetPointerMode_v2: only CUBLAS_POINTER_MODE_HOST is modelled")
        h.pointer_mode = mode
        return SUCCESS

    # --- GEMMs --------------------------------------------------------------------------------------
    def cublasSgemm_v2(self, *args):
        return self._gemm("cublasSgemm_v2", np.float32, False, args)

    def cublasDgemm_v2(self, *args):
        return self._gemm("cublasDgemm_v2", np.float64, False, args)

    def cublasSgemmStridedBatched(self, *args):
        return self._gemm("cublasSgemmStridedBatched", np.float32, True, args)

    def cublasDgemmStridedBatched(self, *args):
        return self._gemm("cublasDgemmStridedBatched", np.float64, True, args)

    def _gemm(self, fname, dtype, batched, args):
        # (handle, transa, transb, m, n, k, alpha, A, lda, [strideA,] B, ldb, [strideB,] beta, C, ldc,
        #  [strideC, batchCount])
        if len(args) != (18 if batched else 14):
            raise TypeError(f"{fname} takes {18 if batched else 14} arguments, got {len(args)}")
        scalar = ctypes.c_float if dtype == np.float32 else ctypes.c_double
        h = self._handle(args[0], fname)
        transa, transb, m, n, k = self._ints(args[1:6], fname, 1)
        alpha = self._ref(args[6], scalar, fname, 6)
        if batched:
            pa, pb, pc, pbeta, lds, strides = 7, 10, 14, 13, (8, 11, 15), (9, 12, 16)
            sa, sb, sc = (self._typed(args[i], ctypes.c_longlong, fname, i) for i in strides)
            count = self._ints(args[17:], fname, 17)[0]
        else:
            pa, pb, pc, pbeta, lds = 7, 9, 12, 11, (8, 10, 13)
            sa = sb = sc = 0
            count = 1
        lda, ldb, ldc = (self._ints(args[i:i + 1], fname, i)[0] for i in lds)
        beta = self._ref(args[pbeta], scalar, fname, pbeta)
        a, b, c = (self._typed(args[i], ctypes.c_void_p, fname, i) for i in (pa, pb, pc))
        # the cublas<t>gemm error values
        if transa not in (0, 1, 2) or transb not in (0, 1, 2) or min(m, n, k, count) < 0:
            return INVALID_VALUE
        (rows_a, cols_a), (rows_b, cols_b) = ((m, k) if transa == 0 else (k, m)), ((k, n) if transb == 0 else (n, k))
        if lda < max(1, rows_a) or ldb < max(1, rows_b) or ldc < max(1, m):
            return INVALID_VALUE
        if h.pointer_mode != 0:
            raise AssertionError(f"{fname}: pointer mode device is not modelled")
        CALLS.append((fname, h.math, transa, transb, m, n, k, count))
        if m == 0 or n == 0 or count == 0:
            return SUCCESS
        if count > 1 and sc < ldc * (n - 1) + m:
            raise AssertionError(f"{fname}: the {count} C matrices overlap (strideC {sc}): the results would be "
                                 "undefined")
        if h.workspace is not None:     # still the live allocation it was
            device_memory.find(h.workspace[0], h.workspace[1], f"{fname}: the workspace set by cublasSetWorkspace_v2")
        elif graphs.is_capturing(_Stream(h.stream)):
            raise AssertionError(
                f"stand-in: {fname} on a capturing stream without a workspace of the caller's: cuBLAS would "
                "allocate one with cudaMallocAsync, a memory node inside the graph (cuBLAS guide, 'CUDA Graphs "
                "Support': set one with cublasSetWorkspace after cublasSetStream)")
        A = _matrices(a, rows_a, cols_a, lda, sa, count, dtype, f"{fname} A") if k else None
        B = _matrices(b, rows_b, cols_b, ldb, sb, count, dtype, f"{fname} B") if k else None
        C = _matrices(c, m, n, ldc, sc, count, dtype, f"{fname} C")
        tf32 = h.math in _TF32_MODES and dtype == np.float32

        def execute():
            if not counters.SETTINGS["execute"]:
                C[...] = 0
                return
            if k == 0:
                product = np.zeros(C.shape, dtype)
            else:
                opa = A if transa == 0 else A.transpose(0, 2, 1)
                opb = B if transb == 0 else B.transpose(0, 2, 1)
                if tf32:
                    opa, opb = _tf32(opa).reshape(opa.shape), _tf32(opb).reshape(opb.shape)
                product = np.matmul(opa, opb).astype(dtype, copy=False)
            if alpha != 1:
                product = product * dtype(alpha)
            C[...] = product if beta == 0 else product + dtype(beta) * C
        graphs.launch("cublas", "gemm_strided_batched" if batched else "gemm", execute, stream=h.stream)
        return SUCCESS

    def __getattr__(self, name):
        raise AttributeError(f"the cuBLAS stand-in has no {name} (undefined symbol)")


def _matrices(ptr, rows, cols, ld, stride, count, dtype, what):
    """`count` column-major (rows, cols) matrices with leading dimension `ld`, `stride` elements apart, as a
    (count, rows, cols) NumPy view of the device memory at `ptr` (each inside one live allocation)."""
    if count > 1 and stride < 0:
        raise AssertionError(f"{what}: negative stride {stride}")
    view = device_memory.view(ptr, (count, cols, rows), (stride, ld, 1), dtype, what)
    return view.transpose(0, 2, 1)
