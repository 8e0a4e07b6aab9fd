"""The GPU backend's matrix products through its own cuBLAS handle (`pydtnn/backends/gpu/matmul.py`,
`cublas.py`, `cublas_library.py`), and the stand-in's cuBLAS (`tests/gpu_standin/fake_cublas.py`).

- `matmul` as numpy.matmul (2-D, transposed views on either side, attention's batched 4-D products on head
  views, a matrix broadcast over a batch, 1-D operands, `out=`), float32 in each precision and float64, on a
  device ("gpu", skipped without one) and over the stand-in ("gpu-standin"), against NumPy in float64 from the
  same inputs. Tolerances from the error analysis of a dot product of length k (Higham, Accuracy and
  Stability of Numerical Algorithms, 3.1): |fl(AB) - AB| <= gamma_k |A||B| elementwise, gamma_k ~ k u, with
  u = 2^-24 (float32) or 2^-53 (float64), plus one rounding of the result; TF32 tensor cores first reduce each
  input to a 10-bit mantissa, a relative error of at most 2^-11 rounded (2^-10 if truncated: the bound used,
  as NVIDIA does not document which), so a product term is off by 2 * 2^-10 + 2^-20 relative before the
  float32 sum, whose additions tensor cores may truncate rather than round (2u each: the bound doubles).
- the handle: the math mode per precision, every call on CuPy's current stream with the backend's workspace
  set after the stream (cublasSetStream resets it), cuBLAS's status named in the error;
- graphs: a capture of an FC's forward and backward, and of attention's, succeeds and its replay equals the
  eager run bit for bit, with the same cuBLAS calls (sizes, transposes, math mode, workspace) in the same order;
- the stand-in refuses what cuBLAS refuses (each rule names its source) and the loader finds libcublas.
"""
import ctypes
import os

import numpy as np
import pytest

import gpu_standin
from gpu_standin import counters, fake_cublas
from pydtnn.backends import available_backends
from pydtnn.backends.gpu import cublas_library
from pydtnn.backends.gpu.cublas import (DEFAULT_MATH, PEDANTIC_MATH, TF32_TENSOR_OP_MATH, CublasError,
                                        math_mode)
from pydtnn.errors import ConfigError

HAS_GPU = "gpu" in available_backends()
_BACKENDS = {}
CONFIGS = [("float64", "fp32"), ("float32", "fp32"), ("float32", "fp32_strict"), ("float32", "tf32")]


@pytest.fixture(params=["gpu", "gpu-standin"])
def kind(request):
    if request.param == "gpu":
        if not HAS_GPU:
            pytest.skip("no GPU here: CuPy is not installed or sees no CUDA device")
        yield "gpu"
        return
    with gpu_standin.active():
        yield "gpu-standin"


@pytest.fixture
def standin():
    with gpu_standin.active() as cupy:
        yield cupy


def _backend(kind, dtype="float64", precision="fp32"):
    """One backend per configuration and kind for the module (a device's handle is made once)."""
    from pydtnn.backends.gpu.backend import GPUBackend
    key = (kind, dtype, precision)
    if kind == "gpu-standin" or key not in _BACKENDS:
        _BACKENDS[key] = GPUBackend(dtype=dtype, seed=0, precision=precision, auto_conv_alg=False)
    return _BACKENDS[key]


def _bound(a, b, dtype, precision, k):
    """The elementwise error bound of a @ b in `dtype` / `precision` (the module docstring's analysis)."""
    u = 2.0 ** -53 if dtype == "float64" else 2.0 ** -24
    tf32 = dtype == "float32" and precision == "tf32"
    per_term = 2 * 2.0 ** -10 + 2.0 ** -20 if tf32 else 0.0
    return (per_term + (k + 2) * u * (2 if tf32 else 1)) * np.matmul(np.abs(a), np.abs(b)) + np.finfo(dtype).tiny


def _heads(qkv, n, t, heads):
    """(N T, D) -> (N, H, T, hd) views, as attention takes them."""
    return qkv.reshape(n, t, heads, qkv.shape[-1] // heads).transpose(0, 2, 1, 3)


def _cases(rng):
    """name -> (host operands, how the device operands are made from device copies of them)."""
    x, w = rng.standard_normal((33, 70)), rng.standard_normal((70, 17))
    qkv = rng.standard_normal((2 * 9, 3 * 12))
    same = lambda a, b: (a, b)                                             # noqa: E731
    return {
        "2-D": ((x, w), same),
        "a transposed view": ((x, w), lambda a, b: (a.T.copy().T, b)),         # column-major x
        "b transposed view (w.T)": ((x, w), lambda a, b: (a, b.T.copy().T)),
        "both transposed": ((x, w), lambda a, b: (a.T.copy().T, b.T.copy().T)),
        "reversed rows (a negative stride)": ((x, w), lambda a, b: (a[::-1], b[:, ::-1])),
        "weight gradient x.T @ dy": ((x, rng.standard_normal((33, 17))), lambda a, b: (a.T, b)),
        "attention q @ k^T on head views": ((qkv, qkv), lambda a, b: (
            _heads(a[:, :12], 2, 9, 3), _heads(b[:, 12:24], 2, 9, 3).transpose(0, 1, 3, 2))),
        "attention batched contiguous": ((rng.standard_normal((2, 3, 9, 9)), rng.standard_normal((2, 3, 9, 4))),
                                         same),
        "matrix broadcast over a batch (Upsample2D)": ((rng.standard_normal((8, 4)), rng.standard_normal((2, 3, 4, 5))),
                                                       same),
        "partial broadcast": ((rng.standard_normal((2, 1, 4, 6)), rng.standard_normal((1, 3, 6, 5))), same),
        "matrix @ vector": ((x, w[:, 0].copy()), same),
        "vector @ vector": ((w[:, 0].copy(), w[:, 1].copy()), same),
    }


@pytest.mark.parametrize("dtype,precision", CONFIGS)
@pytest.mark.parametrize("name", list(_cases(np.random.default_rng(0))))
def test_matmul_matches_numpy_within_its_error_bound(kind, dtype, precision, name):
    be = _backend(kind, dtype, precision)
    (a, b), make = _cases(np.random.default_rng(0))[name]
    a, b = a.astype(dtype), b.astype(dtype)
    ha, hb = make(a, b)
    da, db = make(be.xp.asarray(a), be.xp.asarray(b))
    got = be.to_numpy(be.matmul(da, db))
    ref = np.matmul(ha.astype(np.float64), hb.astype(np.float64))
    assert got.shape == ref.shape and got.dtype == np.dtype(dtype)
    bound = _bound(ha.astype(np.float64), hb.astype(np.float64), dtype, precision, ha.shape[-1])
    assert np.all(np.abs(got - ref) <= bound), float(np.max(np.abs(got - ref) / bound))


@pytest.mark.parametrize("dtype,precision", CONFIGS)
def test_matmul_into_out(kind, dtype, precision):
    """`out=`: written in place when C-contiguous (the FC weight gradient), through a copy otherwise, and a
    product that reads `out` itself is computed aside first."""
    be = _backend(kind, dtype, precision)
    cp, rng = be.xp, np.random.default_rng(1)
    x, dy = rng.standard_normal((40, 12)).astype(dtype), rng.standard_normal((40, 9)).astype(dtype)
    ref = x.T.astype(np.float64) @ dy.astype(np.float64)
    bound = _bound(np.abs(x.T.astype(np.float64)), np.abs(dy.astype(np.float64)), dtype, precision, 40)
    dw = cp.empty((12, 9), dtype)
    assert be.matmul(cp.asarray(x).T, cp.asarray(dy), out=dw) is dw
    assert np.all(np.abs(be.to_numpy(dw) - ref) <= bound)
    strided = cp.zeros((12, 18), dtype)[:, ::2]                 # not C-contiguous
    assert be.matmul(cp.asarray(x).T, cp.asarray(dy), out=strided) is strided
    assert np.all(np.abs(be.to_numpy(strided) - ref) <= bound)
    s = cp.asarray(rng.standard_normal((6, 6)).astype(dtype))
    before = be.to_numpy(s).astype(np.float64)
    be.matmul(s, s, out=s)
    assert np.all(np.abs(be.to_numpy(s) - before @ before) <= _bound(before, before, dtype, precision, 6))


def test_matmul_keeps_numpys_errors_and_other_dtypes(kind):
    be = _backend(kind)
    cp = be.xp
    with pytest.raises(ValueError):
        be.matmul(cp.zeros((2, 3)), cp.zeros((4, 5)))
    ints = be.matmul(cp.asarray(np.arange(6).reshape(2, 3)), cp.asarray(np.arange(3)))
    assert be.to_numpy(ints).tolist() == [5, 14]
    assert be.to_numpy(be.matmul(cp.zeros((3, 0)), cp.zeros((0, 2)))).tolist() == [[0, 0]] * 3
    assert be.matmul(cp.zeros((0, 4)), cp.zeros((4, 2))).shape == (0, 2)


# ============================================================================== the handle (stand-in)

def test_the_math_mode_follows_the_precision(standin):
    """cublas_api.h cublasMath_t: DEFAULT 0 ("fp32": no TF32 since CUDA 11), PEDANTIC 2 ("fp32_strict"),
    TF32_TENSOR_OP 3 ("tf32"); float64 always the default."""
    expected = {("float32", "fp32"): DEFAULT_MATH, ("float32", "fp32_strict"): PEDANTIC_MATH,
                ("float32", "tf32"): TF32_TENSOR_OP_MATH, ("float64", "tf32"): DEFAULT_MATH}
    for (dtype, precision), mode in expected.items():
        assert math_mode(precision, dtype) == mode
        fake_cublas.CALLS.clear()
        be = _backend("gpu-standin", dtype, precision)
        be.matmul(be.xp.ones((2, 3), dtype), be.xp.ones((3, 4), dtype))
        assert ("cublasSetMathMode", mode) in fake_cublas.CALLS
        gemms = [c for c in fake_cublas.CALLS if c[0].startswith("cublas") and "gemm" in c[0]]
        assert gemms and all(c[1] == mode for c in gemms), fake_cublas.CALLS


def test_tf32_math_rounds_the_inputs_and_fp32_does_not(standin):
    """Values TF32 cannot hold (1 + 2^-20): with "tf32" the product is that of the inputs rounded to TF32
    (as tensor cores read them, the stand-in's model), with "fp32" and "fp32_strict" float32's own."""
    a = np.full((4, 64), 1 + 2.0 ** -20, np.float32)
    b = np.full((64, 3), 1 - 2.0 ** -21, np.float32)
    results = {}
    for precision in ("tf32", "fp32", "fp32_strict"):
        be = _backend("gpu-standin", "float32", precision)
        results[precision] = be.to_numpy(be.matmul(be.xp.asarray(a), be.xp.asarray(b)))
    assert np.all(results["tf32"] == 64.0)                             # both rounded to 1
    exact = 64 * (1 + 2.0 ** -20) * (1 - 2.0 ** -21)
    for precision in ("fp32", "fp32_strict"):
        assert np.all(np.abs(results[precision] - exact) <= 66 * 2.0 ** -24 * 64), results[precision]
        assert np.all(results[precision] != 64.0)


def test_every_call_sets_the_current_stream_then_the_workspace(standin):
    """cuBLAS guide, cublasSetStream(): it "unconditionally resets the cuBLAS library workspace back to the
    default workspace pool", so the backend's workspace is set after the stream, before every GEMM."""
    be = _backend("gpu-standin", "float32")
    cp = standin
    x = cp.ones((4, 4), np.float32)
    ws = be.cublas._workspace[0].value
    for stream in (cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)):
        fake_cublas.CALLS.clear()
        with stream:
            be.matmul(x, x)
            be.matmul(x, x)
        names = [c[0] for c in fake_cublas.CALLS]
        assert names == ["cublasSetStream_v2", "cublasSetWorkspace_v2", "cublasSgemm_v2"] * 2, names
        assert all(c[1] == stream.ptr for c in fake_cublas.CALLS if c[0] == "cublasSetStream_v2")
        assert all(c[1] == ws and c[2] >= 4 << 20 for c in fake_cublas.CALLS if c[0] == "cublasSetWorkspace_v2")
    assert ws % 256 == 0                                        # cublasSetWorkspace: 256-byte alignment


def test_a_refused_call_raises_with_cublas_status_name(standin):
    """cublas<t>gemm's error values: CUBLAS_STATUS_INVALID_VALUE for lda < max(1, m) (A untransposed)."""
    be = _backend("gpu-standin", "float32")
    x = standin.ones((4, 4), np.float32)
    with pytest.raises(CublasError, match=r"cublasSgemm_v2 failed: CUBLAS_STATUS_INVALID_VALUE \(7\)"):
        be.cublas.gemm(np.float32, 0, 0, 4, 4, 4, x.data.ptr, 3, x.data.ptr, 4, x.data.ptr, 4)


# ================================================================================ graphs (stand-in)

def _fc_step(be, x, w, b, dy, dw, db):
    """What an FC layer runs in a step: forward (x @ w + b), the input gradient (dy @ w.T), the weight and
    bias gradients (x.T @ dy into dw, dy summed into db)."""
    y = be.linear(x, w, b)
    dx = be.matmul(dy, w.T)
    be.linear_weight_grads(x, dy, dw, db)
    return y, dx, dw, db


def _attention_step(be, qkv, dcontext):
    context, attn = be.attention_forward(qkv, 2, 5, 3, causal=True)
    return context, be.attention_backward(dcontext, qkv, attn, None, 2, 5, 3)


def _captured_equals_eager(be, fn, inputs):
    """fn(*inputs) eagerly, then captured and replayed on the same inputs: (eager results, replayed results,
    eager kernels, captured kernels, eager cuBLAS calls, captured cuBLAS calls)."""
    fake_cublas.CALLS.clear()
    with counters.counting() as c:
        eager = [be.to_numpy(r) for r in fn(*inputs)]
    eager_calls, fake_cublas.CALLS[:] = list(fake_cublas.CALLS), []
    call = be.capture(fn, inputs)
    captured_calls = list(fake_cublas.CALLS)
    replayed = [be.to_numpy(r) for r in call.replay(inputs)]
    return eager, replayed, c.kernels, call.graph.kernels, eager_calls, captured_calls


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("step", ["fc", "attention"])
def test_a_capture_of_products_replays_the_eager_bits_with_the_same_cublas_calls(standin, dtype, step):
    be = _backend("gpu-standin", dtype, "tf32")
    cp, rng = standin, np.random.default_rng(2)
    arr = lambda *shape: cp.asarray(rng.standard_normal(shape).astype(dtype))      # noqa: E731
    if step == "fc":
        fn = lambda x, w, b, dy: _fc_step(be, x, w, b, dy, cp.empty((7, 4), dtype), cp.empty(4, dtype))  # noqa: E731
        inputs = (arr(6, 7), arr(7, 4), arr(4), arr(6, 4))
    else:
        fn = lambda qkv, dcontext: _attention_step(be, qkv, dcontext)      # noqa: E731
        inputs = (arr(10, 18), arr(10, 6))
    eager, replayed, eager_kernels, captured_kernels, eager_calls, captured_calls = _captured_equals_eager(
        be, fn, inputs)
    assert len(eager) == len(replayed)
    for e, r in zip(eager, replayed):
        np.testing.assert_array_equal(r, e)                    # bit for bit
    library = lambda kernels: [k for k in kernels if k.startswith("cublas:")]      # noqa: E731
    assert library(captured_kernels) == library(eager_kernels)             # the same GEMMs in the same order
    assert library(captured_kernels), captured_kernels
    gemms = lambda calls: [c for c in calls if "gemm" in c[0]]          # noqa: E731
    assert gemms(captured_calls) == gemms(eager_calls)         # the same cuBLAS calls, arguments and math
    workspaces = lambda calls: [c for c in calls if c[0] == "cublasSetWorkspace_v2"]      # noqa: E731
    assert workspaces(captured_calls) == workspaces(eager_calls)            # the same workspace, every call
    assert len(workspaces(eager_calls)) == len(gemms(eager_calls))


def test_a_gemm_captured_without_a_workspace_of_its_own_is_refused(standin):
    """cuBLAS guide, "CUDA Graphs Support": captured cuBLAS routines may create memory nodes (cudaMallocAsync)
    unless given "user-owned workspace memory" with cublasSetWorkspace(); and cublasSetStream() resets that
    workspace. The stand-in refuses such a GEMM; with the workspace set after the stream it is captured."""
    cp = standin
    be = _backend("gpu-standin", "float32")
    lib, h = be.cublas.lib, be.cublas.handle
    x = cp.ones((4, 4), np.float32)
    one, zero = ctypes.c_float(1), ctypes.c_float(0)
    args = (h, 0, 0, 4, 4, 4, ctypes.byref(one), ctypes.c_void_p(x.data.ptr), 4, ctypes.c_void_p(x.data.ptr), 4,
            ctypes.byref(zero), ctypes.c_void_p(x.data.ptr), 4)
    s = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
        s.begin_capture()
        try:
            lib.cublasSetWorkspace_v2(h, *be.cublas._workspace)
            lib.cublasSetStream_v2(h, ctypes.c_void_p(s.ptr))          # resets the workspace
            with pytest.raises(AssertionError, match="CUDA Graphs Support"):
                lib.cublasSgemm_v2(*args)
            lib.cublasSetWorkspace_v2(h, *be.cublas._workspace)
            with counters.counting() as c:
                assert lib.cublasSgemm_v2(*args) == 0
            assert c.n["captured"] == 1 and c.kernels == []             # recorded, not run
        finally:
            graph = s.end_capture()
    assert graph.kernels == ["cublas:gemm"]


def test_a_gemm_on_a_handle_left_on_another_stream_during_a_capture_is_refused(standin):
    cp = standin
    be = _backend("gpu-standin", "float32")
    x = cp.ones((4, 4), np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc), s:
        s.begin_capture()
        try:
            with cp.cuda.Stream(non_blocking=True):                    # the handle follows the current stream
                with pytest.raises(AssertionError, match="outside the graph"):
                    be.matmul(x, x)
        finally:
            with pytest.raises(cp.cuda.runtime.CUDARuntimeError):
                s.end_capture()


def test_the_standin_checks_argument_types_as_cublas_api_h_declares_them(standin):
    """cublas_api.h: `long long int strideA` (c_longlong: a plain int would go as a 32-bit C int),
    `const float *alpha` for S routines, `size_t workspaceSizeInBytes`, handles and pointers as c_void_p."""
    cp = standin
    be = _backend("gpu-standin", "float32")
    lib, h = be.cublas.lib, be.cublas.handle
    x = cp.ones((2, 4, 4), np.float32)
    p = ctypes.c_void_p(x.data.ptr)
    one, zero, done = ctypes.c_float(1), ctypes.c_float(0), ctypes.c_double(1)
    good = [h, 0, 0, 4, 4, 4, ctypes.byref(one), p, 4, ctypes.c_longlong(16), p, 4, ctypes.c_longlong(16),
            ctypes.byref(zero), p, 4, ctypes.c_longlong(16), 2]
    assert lib.cublasSgemmStridedBatched(*good) == 0
    wrong = ((9, 16, r"long long \(c_longlong\) expected"), (6, ctypes.byref(done), r"byref\(c_float\)"),
             (7, x.data.ptr, r"pointer \(c_void_p\) expected"), (0, h.value, "c_void_p"))
    for i, bad, message in wrong:
        args = list(good)
        args[i] = bad
        with pytest.raises(TypeError, match=message):
            lib.cublasSgemmStridedBatched(*args)
    args = list(good)
    args[12] = ctypes.c_longlong(32)                            # the second B runs past the allocation
    with pytest.raises(AssertionError, match="past its device allocation"):
        lib.cublasSgemmStridedBatched(*args)
    with pytest.raises(TypeError, match=r"size_t \(c_size_t\) expected"):
        lib.cublasSetWorkspace_v2(h, be.cublas._workspace[0], 1 << 20)
    assert lib.cublasSetWorkspace_v2(h, ctypes.c_void_p(be.cublas._workspace[0].value + 8),
                                     ctypes.c_size_t(1 << 10)) == fake_cublas.INVALID_VALUE     # not 256-aligned


# ======================================================================================== the loader

def test_libcublas_locator_order(tmp_path):
    """$PYDTNN_CUBLAS_LIB, then the copy the process has mapped (CuPy's), LD_LIBRARY_PATH, the wheels."""
    for sub in ("nvidia/cublas/lib", "nvidia/cu13/lib"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "nvidia/cublas/lib/libcublas.so.12").write_bytes(b"")
    (tmp_path / "nvidia/cu13/lib/libcublas.so.13").write_bytes(b"")
    (tmp_path / "nvidia/cu13/lib/libcublasLt.so.13").write_bytes(b"")
    none = str(tmp_path / "no_maps")
    find = cublas_library.find_libcublas
    assert find(12, env={}, search_paths=[str(tmp_path)], system=False, maps_path=none) == \
        str(tmp_path / "nvidia/cublas/lib/libcublas.so.12")
    assert find(13, env={}, search_paths=[str(tmp_path)], system=False, maps_path=none) == \
        str(tmp_path / "nvidia/cu13/lib/libcublas.so.13")
    ld = tmp_path / "ld"
    ld.mkdir()
    (ld / "libcublas.so.12").write_bytes(b"")
    env = {"LD_LIBRARY_PATH": f"/nonexistent{os.pathsep}{ld}"}
    assert find(12, env=env, search_paths=[str(tmp_path)], system=False, maps_path=none) == str(ld / "libcublas.so.12")
    maps = tmp_path / "maps"
    mapped = tmp_path / "cupy_libs" / "libcublas.so.12.9.1.4"
    mapped.parent.mkdir()
    mapped.write_bytes(b"")
    other = tmp_path / "nvidia/cu13/lib/libcublas.so.13"
    maps.write_text(f"7f00-7f01 r-xp 00000000 08:01 42 {tmp_path}/cupy_libs/libcublasLt.so.12\n"
                    f"7f01-7f02 r-xp 00000000 08:01 41 {other}\n"
                    f"7f02-7f03 r-xp 00000000 08:01 43 {mapped}\n7f03-7f04 rw-p 00000000 00:00 0\n")
    assert find(12, env=env, search_paths=[str(tmp_path)], system=False, maps_path=str(maps)) == str(mapped)
    assert find(13, env=env, search_paths=[str(tmp_path)], system=False, maps_path=str(maps)) == str(other)
    override = {"PYDTNN_CUBLAS_LIB": str(ld / "libcublas.so.12")}
    assert find(12, env=override, maps_path=str(maps)) == str(ld / "libcublas.so.12")
    assert find(12, env={"PYDTNN_CUBLAS_LIB": str(tmp_path / "missing.so")}) is None
    real = find()
    assert real is None or isinstance(real, str)


def test_libcublas_loader_without_library_is_a_one_line_config_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PYDTNN_CUBLAS_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(ConfigError, match="libcublas.so.* not found") as e:
        cublas_library.load_libcublas()
    assert "\n" not in str(e.value)
