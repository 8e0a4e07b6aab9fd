"""The GPU backend against the CPU backend (the reference), and the GPU plumbing that runs without a GPU.

Conformance tests (marked `gpu_only`) run twice: "gpu" on a device (skipped, with the reason, where
`available_backends()` has no "gpu") and "gpu-standin" over the host stand-in of CuPy/cuDNN/NCCL
(tests/gpu_standin: real backend code, the kernels' real CUDA source compiled as C++, convolutions by the
CPU backend), which tests our glue everywhere but is NOT a GPU verification. They compare every kernel of the contract with the CPU backend on the same data: the reference is
always computed in float64 from the very values the GPU gets, so float64 results must agree to ~1e-10 and
float32 ones, in the default strict "fp32" precision, to ~1e-5 relative (TF32 would be ~1e-3).
NOT RUN ON HARDWARE when written (no GPU on the machine it was written on): scripts/gpu_check.sh runs them.

The tests without a GPU check the one-line ConfigError where CuPy / a GPU is missing (GPU backend and
make_comm("nccl")), the local-rank device choice, and the cuDNN library locator.
"""
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pydtnn.backends import ConvSpec, PoolSpec, available_backends
from pydtnn.backends.gpu.cudnn import find_libcudnn, load_libcudnn
from pydtnn.backends.gpu.device import GPU_HINT, LOCAL_RANK_VARS, choose_device, local_rank
from pydtnn.backends.cpu.backend import CPUBackend
from pydtnn.errors import ConfigError

from paths import REPO_DIR as REPO  # noqa: E402
HAS_GPU = "gpu" in available_backends()
_KIND = ["gpu"]          # what `_gpu()` builds in the running test: "gpu" or "gpu-standin"


@pytest.fixture(params=["gpu", "gpu-standin"])
def gpu_kind(request):
    """Each GPU test runs twice: on a real device ("gpu", skipped without one) and over the host stand-in
    of CuPy/cuDNN ("gpu-standin", tests/gpu_standin): the second is a test of our glue, not of the GPU."""
    if request.param == "gpu":
        if not HAS_GPU:
            pytest.skip("no GPU here: CuPy is not installed or sees no CUDA device "
                        "(pydtnn.backends.available_backends() has no 'gpu')")
        _KIND[0] = "gpu"
        yield "gpu"
        return
    import gpu_standin
    with gpu_standin.active():
        _KIND[0] = "gpu-standin"
        try:
            yield "gpu-standin"
        finally:
            _KIND[0] = "gpu"


gpu_only = pytest.mark.usefixtures("gpu_kind")


# ==================================================================================== without a GPU

def _hide_cupy(monkeypatch):
    """Make `import cupy` fail, as on a machine without the GPU stack (works on a GPU machine too)."""
    for name in [m for m in sys.modules if m == "cupy" or m.startswith("cupy.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cupy", None)


def test_gpu_backend_without_cupy_is_a_one_line_config_error(monkeypatch):
    from pydtnn import Model
    from pydtnn.backends import get_backend
    from pydtnn.backends.gpu.backend import GPUBackend
    _hide_cupy(monkeypatch)
    for make in (GPUBackend, lambda: get_backend("gpu"), lambda: Model(backend="gpu", dtype="float32")):
        with pytest.raises(ConfigError) as e:
            make()
        msg = str(e.value)
        assert "\n" not in msg
        assert msg.startswith("the GPU backend needs CuPy and an NVIDIA GPU: pip install '.[gpu]'")


@pytest.mark.skipif(HAS_GPU, reason="a GPU is visible here: the backend is constructed, not refused")
def test_gpu_backend_refused_here():
    from pydtnn.backends.gpu.backend import GPUBackend
    with pytest.raises(ConfigError, match=r"^the GPU backend needs CuPy and an NVIDIA GPU"):
        GPUBackend()


def test_gpu_backend_checks_its_arguments_first():
    from pydtnn.backends.gpu.backend import GPUBackend
    with pytest.raises(ConfigError, match="precision must be one of fp32, tf32, fp32_strict"):
        GPUBackend(precision="fp16")
    with pytest.raises(ConfigError, match="unsupported dtype"):
        GPUBackend(dtype="float16")


def test_make_comm_nccl_without_cupy_is_a_config_error(monkeypatch):
    from pydtnn.parallel.comm import make_comm
    _hide_cupy(monkeypatch)
    with pytest.raises(ConfigError) as e:
        make_comm("nccl")
    assert "\n" not in str(e.value)
    assert str(e.value).startswith("the NCCL communicator needs the GPU backend (CuPy with cupy.cuda.nccl")


@pytest.mark.skipif(HAS_GPU, reason="a GPU is visible here: make_comm('nccl') would build a communicator")
def test_make_comm_nccl_refused_here():
    from pydtnn.parallel.comm import make_comm
    with pytest.raises(ConfigError, match="NCCL"):
        make_comm("nccl")


def test_gpu_modules_import_without_cupy():
    code = ("import sys, pydtnn.backends.gpu.backend, pydtnn.backends.gpu.cudnn, pydtnn.backends.gpu.kernels, "
            "pydtnn.parallel.comm.nccl; assert 'cupy' not in sys.modules, 'cupy imported at module import'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env=dict(os.environ, PYTHONPATH=REPO))
    assert r.returncode == 0, r.stderr


def test_local_rank_from_launcher_variables():
    assert local_rank({}) == 0
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}) == 3
    assert local_rank({"MPI_LOCALRANKID": "2"}) == 2                      # MPICH / Hydra
    assert local_rank({"PMI_LOCAL_RANK": "5"}) == 5
    assert local_rank({"SLURM_LOCALID": "1"}) == 1
    # Open MPI's variable wins over the others; junk and negative values are skipped
    assert local_rank({"MPI_LOCALRANKID": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}) == 1
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "x", "MPI_LOCALRANKID": "4"}) == 4
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "-1"}) == 0
    assert local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": " 6 "}) == 6
    assert LOCAL_RANK_VARS[0] == "OMPI_COMM_WORLD_LOCAL_RANK"


def test_device_choice_is_local_rank_modulo_device_count():
    assert choose_device({}, 1) == 0
    assert choose_device({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 4) == 3
    assert choose_device({"OMPI_COMM_WORLD_LOCAL_RANK": "5"}, 4) == 1
    assert choose_device({"MPI_LOCALRANKID": "2"}, 1) == 0                # three ranks on one GPU share it
    assert [choose_device({"PMI_LOCAL_RANK": str(r)}, 2) for r in range(5)] == [0, 1, 0, 1, 0]
    assert choose_device({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 4, device=2) == 2   # explicit device wins
    with pytest.raises(ConfigError, match="device must be an int in 0..3"):
        choose_device({}, 4, device=4)
    with pytest.raises(ConfigError, match="device must be an int"):
        choose_device({}, 4, device=True)
    with pytest.raises(ConfigError, match=re.escape(GPU_HINT)):
        choose_device({}, 0)


def test_cudnn_locator(tmp_path):
    assert find_libcudnn(env={}, search_paths=[str(tmp_path)], system=False) is None
    for sub in ("nvidia/cu13/lib", "nvidia/cudnn/lib"):               # the later one is searched first
        (tmp_path / sub).mkdir(parents=True)
        (tmp_path / sub / "libcudnn.so.9").write_bytes(b"")
    found = find_libcudnn(env={}, search_paths=[str(tmp_path)], system=False)
    assert found == str(tmp_path / "nvidia/cudnn/lib/libcudnn.so.9")
    ld = tmp_path / "ld"
    ld.mkdir()
    (ld / "libcudnn.so.9").write_bytes(b"")
    env = {"LD_LIBRARY_PATH": f"/nonexistent{os.pathsep}{ld}"}
    assert find_libcudnn(env=env, search_paths=[str(tmp_path)], system=False) == str(ld / "libcudnn.so.9")
    assert find_libcudnn(env={"PYDTNN_CUDNN_LIB": str(ld / "libcudnn.so.9")}) == str(ld / "libcudnn.so.9")
    assert find_libcudnn(env={"PYDTNN_CUDNN_LIB": str(tmp_path / "missing.so")}) is None
    # wherever it runs, the real search answers a path or None (never raises)
    real = find_libcudnn()
    assert real is None or isinstance(real, str)


def test_cudnn_loader_without_library_is_a_config_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PYDTNN_CUDNN_LIB", str(tmp_path / "missing.so"))
    with pytest.raises(ConfigError, match="libcudnn.so.9 not found"):
        load_libcudnn()


# ============================================================================ conformance (on a GPU)

def _gpu(dtype="float64", precision="fp32_strict", **kw):
    """One backend per configuration for the whole module (kernels compile and cuDNN graphs build once).
    float32 conformance runs in "fp32_strict" (no TF32, FFT or Winograd), whose error stays near float32
    rounding, so 1e-5 holds; "fp32" and "tf32" have tests of their own."""
    from pydtnn.backends.gpu.backend import GPUBackend
    key = (_KIND[0], dtype, precision, tuple(sorted(kw.items())))
    if key not in _BACKENDS:
        _BACKENDS[key] = GPUBackend(dtype=dtype, seed=0, precision=precision, **kw)
    return _BACKENDS[key]


_BACKENDS = {}
CPU64 = CPUBackend(dtype="float64")
TOL = {"float64": 1e-10, "float32": 1e-5}
DTYPES = ["float64", "float32"]


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)) if b.size else 0.0


def data(shape, dtype, seed, integers=False):
    """Host data exactly representable in `dtype`, returned as float64 (the reference's input)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, size=shape) if integers else rng.standard_normal(shape)
    return np.asarray(x, dtype=dtype).astype(np.float64)


CONV_CASES = [
    # (N, C, H, W), out channels, kernel, stride, padding, dilation, groups
    ((2, 3, 9, 11), 4, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((2, 4, 10, 9), 6, (3, 3), (2, 2), (1, 1), (1, 1), 1),       # stride 2
    ((2, 3, 11, 10), 5, (3, 3), (1, 1), (2, 2), (2, 2), 1),      # dilation 2
    ((2, 3, 12, 9), 4, (3, 3), (2, 2), (1, 1), (2, 2), 1),       # stride 2 and dilation 2
    ((2, 3, 8, 7), 4, (3, 3), (1, 1), (0, 0), (1, 1), 1),        # no padding
    ((2, 5, 8, 8), 5, (3, 3), (1, 1), (1, 1), (1, 1), 5),        # depthwise
    ((2, 6, 9, 9), 6, (3, 3), (2, 2), (1, 1), (1, 1), 6),        # depthwise, stride 2
    ((2, 8, 7, 7), 16, (1, 1), (1, 1), (0, 0), (1, 1), 1),       # 1x1 (pointwise)
    ((2, 8, 9, 9), 12, (1, 1), (2, 2), (0, 0), (1, 1), 1),       # 1x1 stride 2 (projection shortcut)
    ((2, 3, 16, 16), 8, (7, 7), (2, 2), (3, 3), (1, 1), 1),      # ResNet stem
    ((2, 2, 6, 7), 3, (2, 3), (1, 2), (0, 1), (1, 1), 1),        # asymmetric everything
    ((1, 1, 5, 5), 2, (5, 5), (1, 1), (0, 0), (1, 1), 1),        # kernel as large as the image
]


def _conv_spec(case):
    xshape, k, kernel, stride, padding, dilation, groups = case
    return ConvSpec(xshape[1], k, kernel, stride, padding, dilation, groups)


def _conv_reference(x, w, b, dy, spec):
    cpu = CPU64
    y, ctx = cpu.conv2d_forward(cpu.to_internal(x), w, b, spec)
    dx = cpu.conv2d_backward_data(cpu.to_internal(dy), w, ctx, spec)
    dw, db = cpu.conv2d_backward_weights(cpu.to_internal(dy), ctx, spec, True)
    return cpu.to_user(y), cpu.to_user(dx), dw, db


def _conv_gpu(be, x, w, b, dy, spec):
    y, ctx = be.conv2d_forward(be.asarray(x), be.asarray(w), be.asarray(b), spec)
    dx = be.conv2d_backward_data(be.asarray(dy), be.asarray(w), ctx, spec)
    dw, db = be.conv2d_backward_weights(be.asarray(dy), ctx, spec, True)
    return [be.to_numpy(a) for a in (y, dx, dw, db)]


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES, ids=[f"{c[0]}-k{c[1]}-{c[2]}-s{c[3]}-p{c[4]}-d{c[5]}-g{c[6]}"
                                                  for c in CONV_CASES])
def test_conv_matches_cpu(case, dtype):
    spec = _conv_spec(case)
    xshape = case[0]
    n, _, h, w_ = xshape
    ho, wo = spec.output_hw(h, w_)
    x = data(xshape, dtype, 1)
    w = data((spec.out_channels, spec.in_channels // spec.groups) + spec.kernel, dtype, 2)
    b = data((spec.out_channels,), dtype, 3)
    dy = data((n, spec.out_channels, ho, wo), dtype, 4)
    ref = _conv_reference(x, w, b, dy, spec)
    got = _conv_gpu(_gpu(dtype), x, w, b, dy, spec)
    for name, g, r in zip(("y", "dx", "dw", "db"), got, ref):
        assert rel_err(g, r) < TOL[dtype], f"{name}: relative error {rel_err(g, r):.2e}"


def _frontend_importable():
    try:
        import cudnn  # noqa: F401
        return True
    except Exception:  # noqa: BLE001
        return False


@gpu_only
@pytest.mark.parametrize("impl", ["frontend", "legacy"])
def test_conv_fp32_is_strict_and_tf32_runs(impl):
    """A convolution big enough for TF32 to show (~3e-4) must stay within 1e-5 in "fp32_strict"; "fp32" (no
    TF32, FFT and Winograd allowed) and "tf32" run within 1e-2."""
    if impl == "frontend" and not _frontend_importable():
        pytest.skip("nvidia-cudnn-frontend is not installed")
    spec = ConvSpec(64, 64, (3, 3), (1, 1), (1, 1))
    x, w = data((8, 64, 16, 16), "float32", 5), data((64, 64, 3, 3), "float32", 6)
    dy = data((8, 64, 16, 16), "float32", 7)
    b = np.zeros(64)
    ref = _conv_reference(x, w, b, dy, spec)
    strict = _gpu("float32", "fp32_strict", conv_impl="legacy" if impl == "frontend" else impl)
    got = _conv_gpu(strict, x, w, b, dy, spec)
    errs = [rel_err(g, r) for g, r in zip(got, ref)][:3]
    assert max(errs) < 1e-5, f"fp32_strict: y/dx/dw relative errors {errs}"
    assert strict.precision == "fp32_strict" and strict.conv_report()["served"]["legacy"] >= 3
    for precision in ("fp32", "tf32"):
        loose = _gpu("float32", precision, conv_impl=impl)
        errs = [rel_err(g, r) for g, r in zip(_conv_gpu(loose, x, w, b, dy, spec), ref)][:3]
        assert max(errs) < 1e-2, f"{precision} {impl}: y/dx/dw relative errors {errs}"
        assert loose.conv_report()["served"][impl] >= 3


@gpu_only
def test_conv_autotuned_matches_cpu():
    spec = _conv_spec(CONV_CASES[1])
    x, w, b = data((4, 4, 10, 9), "float32", 1), data((6, 4, 3, 3), "float32", 2), data((6,), "float32", 3)
    dy = data((4, 6, 5, 5), "float32", 4)
    got = _conv_gpu(_gpu("float32", auto_conv_alg=True), x, w, b, dy, spec)
    for g, r in zip(got, _conv_reference(x, w, b, dy, spec)):
        assert rel_err(g, r) < 1e-5


@gpu_only
def test_fc_matmul_fp32_is_strict():
    """The backend's float32 matmul (cuBLAS) with TF32 off in "fp32" precision (a 4096-long reduction)."""
    be = _gpu("float32", "fp32")
    a, b = data((128, 4096), "float32", 1), data((4096, 96), "float32", 2)
    got = be.to_numpy(be.matmul(be.asarray(a), be.asarray(b)))
    assert rel_err(got, a @ b) < 1e-5


POOL_CASES = [
    ((2, 3, 8, 8), ((2, 2), (2, 2), (0, 0))),
    ((2, 3, 7, 9), ((3, 3), (2, 2), (1, 1))),      # overlapping windows + padding (ResNet stem)
    ((2, 2, 5, 6), ((2, 3), (1, 1), (0, 0))),      # stride 1
    ((2, 2, 9, 8), ((3, 2), (2, 3), (1, 1))),      # asymmetric
    ((2, 3, 5, 7), ((5, 7), (5, 7), (0, 0))),      # global
]


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("integers", [False, True], ids=["normal", "ties"])
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[str(c) for c in POOL_CASES])
def test_pooling_matches_cpu(case, kind, integers, dtype):
    xshape, (pool, stride, padding) = case
    spec = PoolSpec(kind, pool, stride, padding)
    n, c, h, w = xshape
    ho, wo = spec.output_hw(h, w)
    x = data(xshape, dtype, 11, integers=integers)       # integers: ties, so the first-index rule matters
    dy = data((n, c, ho, wo), dtype, 12)
    cpu = CPU64
    y_ref, ctx = cpu.pool2d_forward(cpu.to_internal(x), spec)
    dx_ref = cpu.to_user(cpu.pool2d_backward(cpu.to_internal(dy), ctx, spec))
    be = _gpu(dtype)
    y, gctx = be.pool2d_forward(be.asarray(x), spec)
    dx = be.pool2d_backward(be.asarray(dy), gctx, spec)
    assert rel_err(be.to_numpy(y), cpu.to_user(y_ref)) < TOL[dtype]
    assert rel_err(be.to_numpy(dx), dx_ref) < TOL[dtype]


# small planes (element-wise passes), and planes of >= 256 values (a block a plane chunk: 1 and 2 chunks)
BN_SHAPES = [(4, 3, 5, 6), (8, 7), (16, 64, 14, 14), (32, 1000), (2, 3, 17, 19), (3, 2, 40, 41)]


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=[str(s) for s in BN_SHAPES])
def test_batchnorm_matches_cpu(shape, dtype):
    c = shape[1]
    rounded = lambda a: np.asarray(a, dtype=dtype).astype(np.float64)      # noqa: E731
    x = rounded(data(shape, dtype, 21) * 3 + 1.5)   # an offset, so a naive one-pass variance would suffer
    dy = data(shape, dtype, 22)
    gamma, beta = data((c,), dtype, 23), data((c,), dtype, 24)
    mean_r, var_r = np.abs(data((c,), dtype, 25)), rounded(np.abs(data((c,), dtype, 26)) + 0.5)
    eps = 1e-5
    cpu = CPU64
    to_cpu = cpu.to_internal if len(shape) == 4 else (lambda a: a)
    to_user = cpu.to_user if len(shape) == 4 else (lambda a: a)
    y_ref, m_ref, v_ref, ctx = cpu.batchnorm_forward_train(to_cpu(x), gamma, beta, eps)
    dx_ref, dg_ref, db_ref = cpu.batchnorm_backward(to_cpu(dy), ctx)
    yi_ref = cpu.batchnorm_forward_infer(to_cpu(x), gamma, beta, mean_r, var_r, eps)
    be = _gpu(dtype)
    y, m, v, gctx = be.batchnorm_forward_train(be.asarray(x), be.asarray(gamma), be.asarray(beta), eps)
    dx, dg, db = be.batchnorm_backward(be.asarray(dy), gctx)
    yi = be.batchnorm_forward_infer(be.asarray(x), be.asarray(gamma), be.asarray(beta), be.asarray(mean_r),
                                    be.asarray(var_r), eps)
    pairs = {"y": (y, to_user(y_ref)), "mean": (m, m_ref), "var": (v, v_ref), "dx": (dx, to_user(dx_ref)),
             "dgamma": (dg, dg_ref), "dbeta": (db, db_ref), "y_infer": (yi, to_user(yi_ref))}
    for name, (g, r) in pairs.items():
        err = rel_err(be.to_numpy(g), r)
        assert err < TOL[dtype], f"{name}: relative error {err:.2e}"
        assert be.to_numpy(g).dtype == np.dtype(dtype), name


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (3, 2, 40, 41)], ids=["small-planes", "large-planes"])
def test_batchnorm_fused_relu_addend_and_running_stats_equal_the_separate_passes(shape, dtype):
    """relu=, relu_y=, addend= and running= do in the kernels' passes exactly what the separate operations
    do: the same bits (the ReLU's mask is recomputed from x with the forward's very expression)."""
    be = _gpu(dtype)
    c = shape[1]
    x, dy, addend = (be.asarray(data(shape, dtype, s)) for s in (31, 32, 33))
    gamma, beta = be.asarray(data((c,), dtype, 34)), be.asarray(data((c,), dtype, 35))
    run_f = [be.asarray(np.abs(data((c,), dtype, 36))), be.asarray(np.abs(data((c,), dtype, 37)) + 0.5)]
    run_s = [a.copy() for a in run_f]
    y_f, _, _, ctx_f = be.batchnorm_forward_train(x, gamma, beta, 1e-5, relu=True, running=(*run_f, 0.9))
    y_s, m_s, v_s, ctx_s = be.batchnorm_forward_train(x, gamma, beta, 1e-5)
    be.update_running_stats((*run_s, 0.9), m_s, v_s, x.size // c)
    relu_y = be.relu_forward(y_s)
    assert np.array_equal(be.to_numpy(y_f), be.to_numpy(relu_y))
    for a, b in zip(run_f, run_s):
        assert np.array_equal(be.to_numpy(a), be.to_numpy(b))
    out = (be.xp.empty(c, be.dtype), be.xp.empty(c, be.dtype))
    dx_f, dg_f, db_f = be.batchnorm_backward(dy, ctx_f, relu_y=y_f, addend=addend, out=out)
    dx_s, dg_s, db_s = be.batchnorm_backward(be.relu_backward(dy, relu_y), ctx_s)
    assert dg_f is out[0] and db_f is out[1]
    for a, b in ((dx_f, dx_s + addend), (dg_f, dg_s), (db_f, db_s)):
        assert np.array_equal(be.to_numpy(a), be.to_numpy(b))


@gpu_only
def test_dropout_rate_scaling_and_inference_identity():
    from pydtnn import Model
    from pydtnn.layers import Dropout, Input
    be = _gpu("float32")
    model = Model(backend=be)
    model.add(Input(shape=(1000,)))
    model.add(Dropout(0.3))
    x = np.ones((64, 1000), np.float32)
    y = be.to_numpy(model.forward(x, training=True))
    dropped = float((y == 0).mean())
    assert abs(dropped - 0.3) < 0.02, dropped
    assert np.allclose(y[y != 0], 1 / 0.7)
    dx = be.to_numpy(model.backward(be.asarray(np.ones_like(x))))
    assert np.array_equal(dx, y)                       # backward applies the same mask
    assert np.array_equal(be.to_numpy(model.forward(x, training=False)), x)
    be.seed(7)
    a = be.to_numpy(model.forward(x, training=True))
    be.seed(7)
    assert np.array_equal(a, be.to_numpy(model.forward(x, training=True)))   # seeded


@gpu_only
def test_arrays_layout_and_precision_flag():
    be = _gpu("float32", "fp32")
    assert be.name == "gpu" and be.layout == "NCHW" and be.channel_axis == 1 and be.precision == "fp32"
    x = np.arange(24, dtype=np.float64).reshape(1, 2, 3, 4)
    d = be.asarray(x)
    assert isinstance(d, be.xp.ndarray) and d.dtype == np.float32 and d.flags.c_contiguous
    assert be.to_internal(d) is d and be.to_user(d) is d
    assert np.array_equal(be.to_numpy(be.asarray(d[:, :, :, ::2])), x[:, :, :, ::2])
    be.synchronize()
    with pytest.raises(ConfigError, match="implementation must be one of"):
        from pydtnn.backends.gpu.backend import GPUBackend
        GPUBackend(conv_impl="cublas")


# ---------------------------------------------------------------------- whole layers and models on a GPU

def _layers_gradient_cases():
    from paths import sibling
    tlg = sibling("layers", "test_layers_gradients")
    return tlg.CONV_CASES, tlg.POOL_CASES


LAYER_CONV_CASES, LAYER_POOL_CASES = _layers_gradient_cases()


def _gpu_model(in_shape, *layers):
    from pydtnn import Model
    from pydtnn.layers import Input
    model = Model(backend=_gpu("float64"), seed=0)
    model.add(Input(shape=in_shape))
    for layer in layers:
        model.add(layer)
    return model


@gpu_only
@pytest.mark.parametrize("in_shape,kw", LAYER_CONV_CASES, ids=[str(c[1]) for c in LAYER_CONV_CASES])
def test_conv2d_layer_gradients_on_gpu(in_shape, kw):
    """tests/layers/test_layers_gradients.py's convolution cases, with the GPU backend (float64)."""
    from gradcheck import assert_gradients
    from pydtnn.layers import Conv2D
    model = _gpu_model(in_shape, Conv2D(**kw, weights_initializer="he_normal",
                                        biases_initializer="glorot_uniform" if kw.get("use_bias", True) else "zeros"))
    assert_gradients(model, np.random.default_rng(1).standard_normal((3,) + tuple(in_shape)))


@gpu_only
@pytest.mark.parametrize("pool", ["max", "avg"])
@pytest.mark.parametrize("in_shape,kw", LAYER_POOL_CASES, ids=[str(c[1]) for c in LAYER_POOL_CASES])
def test_pooling_layer_gradients_on_gpu(in_shape, kw, pool):
    from gradcheck import assert_gradients
    from pydtnn.layers import AveragePool2D, MaxPool2D
    layer = (MaxPool2D if pool == "max" else AveragePool2D)(**kw)
    assert_gradients(_gpu_model(in_shape, layer), np.random.default_rng(1).standard_normal((3,) + tuple(in_shape)))


@gpu_only
@pytest.mark.parametrize("in_shape", [(3, 5, 4), (7,)])
def test_batchnorm_layer_gradients_on_gpu(in_shape):
    from gradcheck import assert_gradients
    from pydtnn.layers import BatchNormalization
    model = _gpu_model(in_shape, BatchNormalization())
    bn = model.layers[1]
    bn.gamma[...] = model.backend.asarray(np.linspace(0.5, 1.5, in_shape[0]))
    bn.beta[...] = model.backend.asarray(np.linspace(-1, 1, in_shape[0]))
    assert_gradients(model, np.random.default_rng(1).standard_normal((4,) + tuple(in_shape)))


def _small_resnet(model):
    from pydtnn.activations import Relu
    from pydtnn.layers import (FC, AdditionBlock, AveragePool2D, BatchNormalization, Conv2D, Flatten, Input,
                               MaxPool2D)
    model.add(Input(shape=(3, 16, 16)))
    model.add(Conv2D(nfilters=8, filter_shape=(3, 3), padding=1, use_bias=False))
    model.add(BatchNormalization())
    model.add(Relu())
    model.add(MaxPool2D(pool_shape=(3, 3), stride=2, padding=1))
    model.add(AdditionBlock([Conv2D(nfilters=8, filter_shape=(3, 3), padding=1), BatchNormalization(), Relu(),
                             Conv2D(grouping="depthwise", filter_shape=(3, 3), padding=1)], []))
    model.add(Conv2D(nfilters=16, filter_shape=(1, 1), stride=2, activation="relu"))
    model.add(AveragePool2D(pool_shape=(0, 0)))
    model.add(Flatten())
    model.add(FC(shape=(10,), activation="softmax"))
    return model


@gpu_only
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-9), ("float32", 1e-4)])
def test_model_step_matches_cpu(dtype, tol):
    """One training step of a small residual network: same initial weights, same loss and gradients."""
    from pydtnn import Model
    x = data((6, 3, 16, 16), dtype, 31)
    y = np.eye(10)[np.arange(6) % 10]
    cpu = _small_resnet(Model(backend=CPUBackend(dtype="float64"), seed=3))
    gpu = _small_resnet(Model(backend=_gpu(dtype), seed=3))
    assert np.array_equal(gpu.backend.to_numpy(gpu.params), cpu.params.astype(dtype))   # same initial weights
    loss_c, _ = cpu.compute_gradients(x, y, "categorical_cross_entropy")
    loss_g, _ = gpu.compute_gradients(x.astype(dtype), y.astype(dtype), "categorical_cross_entropy")
    assert abs(loss_g - loss_c) < tol * max(1.0, abs(loss_c))
    assert rel_err(gpu.backend.to_numpy(gpu.grads), cpu.grads) < tol


@gpu_only
def test_nccl_comm_single_rank(tmp_path):
    """NCCLComm end to end on one rank (NCCL allows one rank per GPU; this machine may have one)."""
    from mpi_helpers import run_mpi
    script = tmp_path / "nccl_check.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        import cupy as cp
        from cupy.cuda import nccl
        from pydtnn.parallel.comm import make_comm
        comm = make_comm("nccl")
        assert comm.kind == "nccl" and comm.size == 1 and comm.rank == 0
        a = cp.arange(10, dtype=cp.float32)
        assert comm.allreduce_sum_(a) is a and np.array_equal(a.get(), np.arange(10))
        b = cp.ones((4, 3), cp.float64)[:, :2]
        comm.allreduce_sum_(b)
        assert np.array_equal(b.get(), np.ones((4, 2)))
        reqs = [comm.iallreduce_sum_(a[:5]), comm.iallreduce_sum_(a[5:])]
        comm.waitall(reqs)
        assert comm.testall(reqs) and np.array_equal(a.get(), np.arange(10))
        comm.bcast_(a, root=0)
        h = np.ones(3)
        comm.allreduce_sum_(h)
        assert np.array_equal(h, np.ones(3))
        assert list(comm.allgather(2.0)) == [2.0] and comm.weighted_mean(3.0, 2.0) == 3.0
        comm.barrier()
        print("NCCL OK", nccl.get_version())
    """))
    env = None
    if _KIND[0] == "gpu-standin":
        import gpu_standin
        env = {k: v for k, v in gpu_standin.subprocess_env().items() if k in ("PYTHONPATH", "PYDTNN_GPU_STANDIN")}
    r = run_mpi(1, script, timeout=180, check=True, env=env)
    assert "NCCL OK" in r.stdout


@gpu_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_elementwise_kernels_packed_unpacked_and_per_plane(dtype):
    """ReLU, its backward and the block sum in 16-byte packs (sizes multiple of a pack, aligned) and element by
    element (an odd size; an unaligned view); the bias + ReLU pass and the bias gradient over small and large
    planes: each against NumPy on the same values (exact: one rounding each)."""
    be = _gpu(dtype)
    for n in (4096, 4097):
        a, b = data((n + 1,), dtype, 41), data((n + 1,), dtype, 42)
        for lo in (0, 1):                                   # lo = 1: an unaligned view
            da, db = be.asarray(a)[lo:lo + n], be.asarray(b)[lo:lo + n]
            ha, hb = a[lo:lo + n].astype(dtype), b[lo:lo + n].astype(dtype)
            assert np.array_equal(be.to_numpy(be.relu_forward(da)), np.maximum(ha, 0))
            assert np.array_equal(be.to_numpy(be.relu_backward(db, da)), hb * (ha > 0))
            assert np.array_equal(be.to_numpy(be.add(da, db, relu=True)), np.maximum(ha + hb, 0))
    for shape in ((2, 3, 5, 6), (2, 3, 40, 41)):
        y, bias, dy = data(shape, dtype, 43).astype(dtype), data((shape[1],), dtype, 44).astype(dtype), \
            data(shape, dtype, 45).astype(dtype)
        got = be.to_numpy(be.bias_activation(be.asarray(y), be.asarray(bias), relu=True))
        assert np.array_equal(got, np.maximum(y + bias[None, :, None, None], 0))
        g, sums = be.bias_relu_backward(be.asarray(dy), be.asarray(got), db_out=be.xp.empty(shape[1], be.dtype))
        ref_g = dy * (got > 0)
        assert np.array_equal(be.to_numpy(g), ref_g)
        ref = ref_g.astype(np.float64).sum(axis=(0, 2, 3))
        assert rel_err(be.to_numpy(sums), ref) < TOL[dtype]
