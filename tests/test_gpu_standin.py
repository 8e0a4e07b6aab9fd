"""Glue tests of the GPU backend over the host stand-in of CuPy/cuDNN/NCCL (tests/gpu_standin).

They run the real GPUBackend, NCCLComm and launcher code on any machine, with the kernels' real CUDA
source compiled as C++; they check OUR glue (calls, arguments, shapes, fall-backs, checkpoints), never
NVIDIA's libraries or a GPU: that is scripts/gpu_check.sh's job on hardware. The stand-in's own checks
are tested first (a checker that accepts everything would make every other test here vacuous).
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpu_standin
from gpu_standin import fake_cudnn, fake_nccl, host_kernels
from pydtnn.backends import ConvSpec, PoolSpec
from pydtnn.backends.cpu import CPUBackend
from pydtnn.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, "scripts", "pydtnn_benchmark.py")


@pytest.fixture
def standin():
    with gpu_standin.active() as cupy:
        yield cupy


def _backend(**kw):
    from pydtnn.backends.gpu import GPUBackend
    return GPUBackend(**{"dtype": "float64", **kw})


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# ============================================================================ the stand-in's checks

def test_glue_standin_kernel_launch_checks_argument_types(standin):
    be = _backend()
    fn = be._fn("uniform_fill")
    out = standin.empty(8, np.float64)
    good = (out, np.int64(8), np.uint64(1), np.uint64(0))
    fn((1,), (32,), good)
    assert 0 <= float(out.min()) and float(out.max()) < 1
    bad = {
        "host array": ((np.empty(8),) + good[1:], "host numpy.ndarray"),
        "wrong dtype": ((standin.empty(8, np.float32),) + good[1:], "device array of float32"),
        "python int": ((out, 8) + good[2:], "expected numpy.int64"),
        "wrong scalar type": ((out, np.int32(8)) + good[2:], "expected numpy.int64"),
        "not contiguous": ((standin.empty(16, np.float64)[::2],) + good[1:], "not C-contiguous"),
        "too few": (good[:3], "takes 4 arguments"),
    }
    for what, (args, msg) in bad.items():
        with pytest.raises(TypeError, match=msg):
            fn((1,), (32,), args)
    with pytest.raises(AssertionError, match="gridDim.y = 65536"):
        fn((1, 65536), (32,), good)
    with pytest.raises(AssertionError, match="threads a block"):
        fn((1,), (64, 32), good)


def test_glue_standin_device_arrays_refuse_host_operands(standin):
    d = standin.asarray(np.arange(4.0))
    with pytest.raises(TypeError, match="host numpy.ndarray"):
        d + np.ones(4)
    with pytest.raises(TypeError, match="host numpy.ndarray"):
        standin.maximum(d, np.ones(4))
    host = np.arange(3.0)
    dev = standin.asarray(host)
    host[0] = 7                                                  # a device copy never aliases the host
    assert float(dev[0]) == 0 and isinstance(dev + 1, standin.ndarray)
    assert np.array_equal((d * 2).get(), [0, 2, 4, 6])


def test_glue_standin_cudnn_checks_strides_in_elements(standin):
    import cudnn
    h = cudnn.create_handle()
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=h)
    x = standin.zeros((1, 2, 4, 4), np.float32)
    X = g.tensor(name="X", dim=list(x.shape), stride=[s for s in x.strides], data_type=cudnn.data_type.FLOAT)
    W = g.tensor(name="W", dim=[3, 2, 3, 3], stride=[18, 9, 3, 1], data_type=cudnn.data_type.FLOAT)
    Y = g.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1])
    Y.set_output(True).set_dim([1, 3, 4, 4]).set_stride([48, 16, 4, 1])
    with pytest.raises(AssertionError, match="strides in ELEMENTS"):          # byte strides given
        g.validate()


# ======================================================================= kernels and backend glue

def test_glue_bn_partial_keeps_channels_off_grid_y(standin):
    """Batch norm launches one 1-D grid of channel x slice blocks (gridDim.y is capped at 65,535)."""
    be = _backend()
    host_kernels.LAUNCHES.clear()
    x = be.asarray(np.random.default_rng(0).standard_normal((4, 300)))
    be.batchnorm_forward_train(x, be.asarray(np.ones(300)), be.asarray(np.zeros(300)), 1e-5)
    grids = [g for name, g, _ in host_kernels.LAUNCHES if name == "bn_partial"]
    assert grids and all(g[1] == 1 and g[2] == 1 and g[0] >= 300 for g in grids)


def test_glue_kernels_64bit_index_path_matches_32bit(standin, monkeypatch):
    """The idx32 fast path and the 64-bit path give identical results (the 64-bit one is forced by
    lowering the threshold: arrays past 2**31 elements do not fit a test)."""
    from pydtnn.backends import _gpu_kernels
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((2, 3, 7, 9)), rng.standard_normal((2, 3, 4, 5))
    spec = PoolSpec("max", (3, 3), (2, 2), (1, 1))

    def run():
        be = _backend()
        y, ctx = be.pool2d_forward(be.asarray(x), spec)
        dx = be.pool2d_backward(be.asarray(dy), ctx, spec)
        g, b = be.asarray(np.linspace(0.5, 1.5, 3)), be.asarray(np.zeros(3))
        yb, m, v, bctx = be.batchnorm_forward_train(be.asarray(x), g, b, 1e-5)
        dxb = be.batchnorm_backward(be.asarray(x), bctx)[0]
        return [a.get() for a in (y, dx, yb, m, v, dxb)]
    fast = run()
    monkeypatch.setattr(_gpu_kernels, "INDEX32_LIMIT", 0)
    host_kernels.LAUNCHES.clear()
    slow = run()
    assert _gpu_kernels.index32(1) == 0
    for a, b in zip(fast, slow):
        assert np.array_equal(a, b)


def test_glue_kernel_cache_is_per_device_and_dtype(standin, monkeypatch):
    from pydtnn.backends import _gpu_kernels
    monkeypatch.setenv("PYDTNN_STANDIN_DEVICES", "2")
    a = _gpu_kernels.module(standin, "float32")
    assert _gpu_kernels.module(standin, "float32") is a
    assert _gpu_kernels.module(standin, "float64") is not a
    with standin.cuda.Device(1):
        assert _gpu_kernels.module(standin, "float32") is not a


def test_glue_explicit_conv_impl_beats_environment(standin, monkeypatch):
    monkeypatch.setenv("PYDTNN_GPU_CONV", "legacy")
    assert _backend(conv_impl="frontend").conv.impl == "frontend"
    assert _backend().conv.impl == "legacy"                      # no argument: the environment decides
    monkeypatch.delenv("PYDTNN_GPU_CONV")
    assert _backend().conv.impl == "auto"


def _conv_round(be, seed=0):
    spec = ConvSpec(3, 4, (3, 3), (2, 1), (1, 1))
    rng = np.random.default_rng(seed)
    x, w, dy = rng.standard_normal((2, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal((2, 4, 4, 6))
    y, ctx = be.conv2d_forward(be.asarray(x), be.asarray(w), None, spec)
    dx = be.conv2d_backward_data(be.asarray(dy), be.asarray(w), ctx, spec)
    dw, _ = be.conv2d_backward_weights(be.asarray(dy), ctx, spec, False)
    cpu = CPUBackend(dtype="float64")
    yr, cctx = cpu.conv2d_forward(cpu.to_internal(x), w, None, spec)
    dxr = cpu.conv2d_backward_data(cpu.to_internal(dy), w, cctx, spec)
    dwr, _ = cpu.conv2d_backward_weights(cpu.to_internal(dy), cctx, spec, False)
    tol = 1e-12 if be.dtype == np.float64 else 1e-5
    for got, ref in ((y, cpu.to_user(yr)), (dx, cpu.to_user(dxr)), (dw, dwr)):
        assert rel_err(got.get(), ref) < tol


@pytest.mark.parametrize("mode", ["missing", "no_libcudnn"])
def test_glue_frontend_that_cannot_start_falls_back_to_legacy(mode):
    with gpu_standin.active(frontend=mode):
        be = _backend(conv_impl="auto")
        _conv_round(be)
        report = be.conv_report()
        assert report["served"] == {"frontend": 0, "legacy": 3}
        assert report["fallbacks"]["frontend"].startswith("cannot start: ")
        with pytest.raises(ConfigError) as e:
            _backend(conv_impl="frontend")
        assert "\n" not in str(e.value) and "cuDNN frontend cannot start" in str(e.value)


def test_glue_frontend_declining_a_geometry_falls_back_per_convolution():
    with gpu_standin.active(decline_double=True):
        be = _backend()
        _conv_round(be)
        assert be.conv_report()["served"] == {"frontend": 0, "legacy": 3}
        be32 = _backend(dtype="float32")
        _conv_round(be32)
        assert be32.conv_report()["served"] == {"frontend": 3, "legacy": 0}


@pytest.mark.parametrize("mode", ["ok", "old"])
def test_glue_frontend_autotune_with_and_without_select_plan(mode):
    with gpu_standin.active(frontend=mode):
        fake_cudnn.FRONTEND_CALLS.clear()
        be = _backend(dtype="float32", auto_conv_alg=True)
        _conv_round(be)
        assert be.conv_report()["served"] == {"frontend": 3, "legacy": 0}
        selected = [c for c in fake_cudnn.FRONTEND_CALLS if c[0] == "select_plan"]
        assert (len(selected) == 3) if mode == "ok" else not selected
        _conv_round(be, seed=1)                      # cached graphs: plan chosen by index without select_plan


def test_glue_precision_reaches_cudnn(standin):
    fake_cudnn.FRONTEND_CALLS.clear()
    _conv_round(_backend(dtype="float32", precision="fp32", conv_impl="frontend"))
    notes = [c[1] for c in fake_cudnn.FRONTEND_CALLS if c[0] == "deselect_numeric_notes"]
    assert len(notes) == 3 and all(fake_cudnn.numerical_note.TENSOR_CORE in n for n in notes)
    fake_cudnn.FRONTEND_CALLS.clear()
    _conv_round(_backend(dtype="float32", precision="tf32", conv_impl="frontend"))
    assert not [c for c in fake_cudnn.FRONTEND_CALLS if c[0] == "deselect_numeric_notes"]
    fake_cudnn.LEGACY_CALLS.clear()
    _conv_round(_backend(dtype="float32", precision="fp32", conv_impl="legacy"))
    runs = [c for c in fake_cudnn.LEGACY_CALLS if c[0].startswith("cudnnConvolution")]
    assert len(runs) == 3 and all(math == 3 for _, math in runs)          # CUDNN_FMA_MATH: no TF32
    from gpu_standin import fake_cupy
    assert ("set_compute_type", "float32", 0) in fake_cupy.CALLS


# ============================================================================= random numbers

def test_glue_gpu_rng_state_roundtrips_through_json(standin):
    be = _backend(dtype="float32", seed=3)
    be.rng.random((5, 7))
    state = json.loads(json.dumps(be.rng.bit_generator.state))
    a = be.rng.random((4, 6)).get()
    be.seed(99)
    be.rng.bit_generator.state = state
    assert np.array_equal(be.rng.random((4, 6)).get(), a)
    assert a.dtype == np.float32 and 0 <= a.min() and a.max() < 1
    assert not np.array_equal(_backend(dtype="float32", seed=4).rng.random((4, 6)).get(), a)
    with pytest.raises(ValueError, match="not a GPU generator state"):
        be.rng.bit_generator.state = np.random.default_rng(0).bit_generator.state


def test_gpu_rng_host_mix_matches_kernel():
    """The host-side key derivation is SplitMix64's output function (reference value of the algorithm:
    the first output of the stream seeded with 0 is 0xE220A8397B1DCDAF)."""
    from pydtnn.backends._gpu_random import splitmix64_mix
    assert splitmix64_mix(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF


# ====================================================================================== NCCL

def test_glue_nccl_unique_id_conversions():
    from pydtnn.parallel.nccl import shared_devices, unique_id_for_cupy, unique_id_to_bytes
    raw = bytes(range(128))
    assert unique_id_to_bytes(raw) == raw
    signed = tuple(int(v) for v in np.frombuffer(raw, np.int8))        # CuPy 13's tuple form
    assert unique_id_to_bytes(signed) == raw
    assert unique_id_for_cupy(raw, "14.2.0") == raw
    assert unique_id_for_cupy(raw, "13.6.0") == signed
    with pytest.raises(RuntimeError, match="expected 128"):
        unique_id_to_bytes(b"short")
    assert shared_devices([("h", "0000:01:00.0"), ("h", "0000:02:00.0")]) == []
    assert shared_devices([["h", "a"], ["g", "a"], ["h", "a"]]) == [([0, 2], ("h", "a"))]


def test_glue_nccl_unavailable_is_one_line_config_error(monkeypatch):
    from pydtnn.parallel.comm import make_comm
    monkeypatch.setenv("PYDTNN_STANDIN_NCCL", "missing")
    with gpu_standin.active():
        with pytest.raises(ConfigError) as e:
            make_comm("nccl")
    assert "\n" not in str(e.value) and "finds no libnccl" in str(e.value)


_NCCL_TWO_RANKS = textwrap.dedent("""
    import numpy as np
    import cupy as cp
    from pydtnn.errors import ConfigError
    from pydtnn.parallel.comm import make_comm
    try:
        comm = make_comm("nccl")
    except ConfigError as e:
        print(f"REFUSED {e}|", flush=True)
        raise SystemExit(0)
    a = cp.arange(6, dtype=cp.float32) * (comm.rank + 1)
    comm.allreduce_sum_(a)
    req = comm.iallreduce_sum_(b := cp.ones(3, cp.float64))
    comm.waitall([req])
    print(f"SUM {comm.rank} {a.get().tolist()} {b.get().tolist()}|", flush=True)
""")


@pytest.mark.parametrize("devices", [1, 2])
def test_glue_nccl_two_ranks(tmp_path, devices):
    """Two ranks on one (stand-in) GPU: every rank refuses with one line; on two GPUs they reduce."""
    from mpi_helpers import run_mpi
    script = tmp_path / "nccl2.py"
    script.write_text(_NCCL_TWO_RANKS)
    env = {k: v for k, v in gpu_standin.subprocess_env(PYDTNN_STANDIN_DEVICES=devices).items()
           if k in ("PYTHONPATH", "PYDTNN_GPU_STANDIN", "PYDTNN_STANDIN_DEVICES")}
    r = run_mpi(2, script, timeout=120, check=True, env=env)
    out = r.stdout + r.stderr
    if devices == 1:
        assert out.count("REFUSED NCCL needs one GPU per rank, but ranks 0, 1 share the GPU") == 2, out
    else:
        for rank in (0, 1):
            assert f"SUM {rank} [0.0, 3.0, 6.0, 9.0, 12.0, 15.0] [2.0, 2.0, 2.0]|" in out, out
    assert fake_nccl.NCCL_SUM == 0


# ================================================================================== the launcher

_MODEL = """
from pydtnn.activations import Relu
from pydtnn.layers import FC, BatchNormalization, Conv2D, Dropout, Flatten, Input, MaxPool2D

def create_model(model):
    model.add(Input(shape=(1, 10, 10)))
    model.add(Conv2D(nfilters=4, filter_shape=(3, 3), padding=1, use_bias=False))
    model.add(BatchNormalization())
    model.add(Relu())
    model.add(MaxPool2D(pool_shape=(2, 2), stride=2))
    DROPOUT
    model.add(Flatten())
    model.add(FC(shape=(5,), activation="softmax"))
    return model
"""


def _launch(tmp_path, *args, gpu=False):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if gpu:
        env = gpu_standin.subprocess_env(env)
        args = (*args, "--enable_gpu", "true")
    r = subprocess.run([sys.executable, LAUNCHER, *map(str, args)], capture_output=True, text=True, timeout=300,
                       cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def _model_file(tmp_path, dropout):
    path = tmp_path / f"net_{int(dropout)}.py"
    path.write_text(_MODEL.replace("DROPOUT", "model.add(Dropout(0.3))" if dropout else "pass"))
    return path


def _common(model):
    return ["--model", model, "--dataset", "synthetic", "--synthetic_samples", "96", "--batch_size", "16",
            "--dtype", "float64", "--seed", "5", "--progress_bar", "false", "--lr_schedulers", "",
            "--validation_split", "0.25"]


def test_glue_launcher_enable_gpu_matches_cpu(tmp_path):
    """The launcher with --enable_gpu true, over the stand-in in a subprocess, trains as the CPU run does."""
    common = _common(_model_file(tmp_path, dropout=False)) + ["--num_epochs", "2"]
    _launch(tmp_path, *common, "--history_file", tmp_path / "cpu.json")
    r = _launch(tmp_path, *common, "--history_file", tmp_path / "gpu.json", gpu=True)
    assert "enable_gpu" in r.stdout and "True" in r.stdout
    cpu, gpu = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("cpu", "gpu"))
    assert len(cpu) == len(gpu) == 2
    for rc, rg in zip(cpu, gpu):
        for key in ("loss", "val_loss"):
            assert abs(rc[key] - rg[key]) <= 1e-9 * max(1.0, abs(rc[key])), (key, rc[key], rg[key])


def test_glue_gpu_resume_is_bit_exact_with_dropout(tmp_path):
    """Checkpoint + resume on the GPU backend (stand-in) equals the uninterrupted run bit for bit, with
    dropout: the GPU generator's state is in the checkpoint."""
    common = _common(_model_file(tmp_path, dropout=True)) + [
        "--lr_schedulers", "model_checkpoint", "--model_checkpoint_save_freq", "1"]
    full, resumed = tmp_path / "full.npz", tmp_path / "resumed.npz"
    _launch(tmp_path, *common, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "a",
            "--save_weights_and_bias_filename", full, gpu=True)
    _launch(tmp_path, *common, "--num_epochs", "1", "--checkpoint_dir", tmp_path / "b", gpu=True)
    ckpt = tmp_path / "b" / "epoch_0001.npz"
    meta = json.loads(np.load(ckpt)["__meta__"].tobytes())
    assert meta["rng_states"][0]["bit_generator"] == "pydtnn.CounterRNG/splitmix64"
    assert meta["rng_states"][0]["offset"] > 0
    _launch(tmp_path, *common, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "c", "--resume", ckpt,
            "--save_weights_and_bias_filename", resumed, gpu=True)
    a, b = np.load(full), np.load(resumed)
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k
