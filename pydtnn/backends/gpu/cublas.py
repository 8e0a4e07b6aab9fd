"""cuBLAS called directly (ctypes), as `cudnn.legacy` calls cuDNN: the GEMMs of `matmul.MatmulKernels`.

Why not CuPy's matmul: CuPy's cuBLAS binding refuses any call while the current stream captures a CUDA graph
(cupy_backends/cuda/libs/cublas.pyx, `setStream`: "calling cuBLAS API during stream capture is currently
unsupported"), so no product could be part of a graph. cuBLAS itself can be captured ("CUDA Graphs Support" in
the cuBLAS guide), given a workspace of the caller's: without one, a captured call may allocate its own with
cudaMallocAsync, a memory node inside the graph.

`Cublas` holds the backend's own handle and, for the handle's life, a workspace buffer of its own. Every call
sets the handle's stream to CuPy's current one and THEN the workspace (cublasSetStream resets the workspace to
cuBLAS's pool), so eager and captured calls run the same kernels on the same memory. One workspace serves
every stream, as cuDNN's does (`cudnn.Workspace`): the backend's products are ordered on its compute stream
(a graph replays there too). The math mode follows the backend's `precision` on float32 data ("tf32": TF32
tensor cores; "fp32": float32 arithmetic; "fp32_strict": cuBLAS's pedantic math); float64 always computes in
double. Scalars alpha and beta live on the host (pointer mode host), passed by reference in the data's
precision: a graph bakes their values.
"""
from __future__ import annotations

import ctypes

import numpy as np

from pydtnn.backends.gpu import cublas_library

# cublas_api.h
OP_N, OP_T = 0, 1
POINTER_MODE_HOST = 0
DEFAULT_MATH, PEDANTIC_MATH, TF32_TENSOR_OP_MATH = 0, 2, 3
STATUS_NAMES = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
                7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
                13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
                15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}
MATH_MODES = {"tf32": TF32_TENSOR_OP_MATH, "fp32": DEFAULT_MATH, "fp32_strict": PEDANTIC_MATH}

# the workspace the cuBLAS guide recommends (cublasSetWorkspace): 32 MiB on Hopper and later, 4 MiB before
_WORKSPACE_BYTES = {True: 32 << 20, False: 4 << 20}
_ALIGN = 256                    # cublasSetWorkspace: "aligned to at least 256 bytes"
_INT_MAX = 2 ** 31 - 1
# dtype -> (one matrix, a strided batch, the scalars' ctypes type)
_ROUTINES = {np.dtype(np.float32): ("cublasSgemm_v2", "cublasSgemmStridedBatched", ctypes.c_float),
             np.dtype(np.float64): ("cublasDgemm_v2", "cublasDgemmStridedBatched", ctypes.c_double)}


class CublasError(RuntimeError):
    pass


def math_mode(precision: str, dtype) -> int:
    """The handle's cublasMath_t: per `precision` for float32 data, the default (double) for float64."""
    return MATH_MODES[precision] if np.dtype(dtype) == np.float32 else DEFAULT_MATH


def _workspace_bytes(cupy) -> int:
    try:
        hopper = int(cupy.cuda.Device().compute_capability) >= 90
    except Exception:  # noqa: BLE001 - unknown device: the larger size serves every one
        hopper = True
    return _WORKSPACE_BYTES[hopper]


class Cublas:
    """The backend's cuBLAS handle: `gemm` (column-major, as cuBLAS is; see `matmul` for the row-major view)."""

    def __init__(self, cupy, dtype, precision: str):
        self.cp, self.lib = cupy, cublas_library.load_libcublas()
        self.handle = ctypes.c_void_p()
        self._check("cublasCreate_v2", ctypes.byref(self.handle))
        self.math = math_mode(precision, dtype)
        self._check("cublasSetMathMode", self.handle, self.math)
        self._check("cublasSetPointerMode_v2", self.handle, POINTER_MODE_HOST)
        nbytes = _workspace_bytes(cupy)
        self.workspace = cupy.empty(nbytes + _ALIGN, dtype=cupy.uint8)       # held as long as the handle
        start = -self.workspace.data.ptr % _ALIGN                            # (CuPy's pool aligns to 512)
        self._workspace = (ctypes.c_void_p(self.workspace.data.ptr + start), ctypes.c_size_t(nbytes))
        self._scalars = {dt: (ct(1.0), ct(0.0)) for dt, (_, _, ct) in _ROUTINES.items()}

    def _check(self, fname, *args):
        status = getattr(self.lib, fname)(*args)
        if status != 0:
            raise CublasError(f"{fname} failed: {STATUS_NAMES.get(status, 'unknown cublasStatus_t')} ({status})")

    def _bind(self):
        """The handle on CuPy's current stream, with its own workspace (set after the stream: cublasSetStream
        resets the workspace to cuBLAS's pool)."""
        stream = self.cp.cuda.get_current_stream().ptr
        self._check("cublasSetStream_v2", self.handle, ctypes.c_void_p(stream))
        self._check("cublasSetWorkspace_v2", self.handle, *self._workspace)

    def gemm(self, dtype, transa, transb, m, n, k, a, lda, b, ldb, c, ldc, batch=1, stride_a=0, stride_b=0,
             stride_c=0):
        """C = op(A) op(B) for column-major A, B, C at device addresses a, b, c (ints) in `dtype`; with `batch`
        > 1, `batch` such products, matrix i at a + i stride_a... (strides in elements; 0: the same matrix)."""
        if max(m, n, k, lda, ldb, ldc, batch) > _INT_MAX:
            raise CublasError(f"a GEMM of {batch} x ({m}, {k}) x ({k}, {n}) exceeds cuBLAS's 32-bit sizes")
        single, strided, _ = _ROUTINES[np.dtype(dtype)]
        one, zero = self._scalars[np.dtype(dtype)]
        self._bind()
        A, B, C = ctypes.c_void_p(a), ctypes.c_void_p(b), ctypes.c_void_p(c)
        if batch == 1:
            self._check(single, self.handle, transa, transb, m, n, k, ctypes.byref(one), A, lda, B, ldb,
                        ctypes.byref(zero), C, ldc)
        else:
            self._check(strided, self.handle, transa, transb, m, n, k, ctypes.byref(one),
                        A, lda, ctypes.c_longlong(stride_a), B, ldb, ctypes.c_longlong(stride_b),
                        ctypes.byref(zero), C, ldc, ctypes.c_longlong(stride_c), batch)
