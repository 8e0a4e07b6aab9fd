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
from pydtnn.backends.cpu.backend import CPUBackend
from pydtnn.errors import ConfigError

from paths import REPO_DIR as REPO  # noqa: E402
LAUNCHER = os.path.join(REPO, "scripts", "pydtnn_benchmark.py")


@pytest.fixture
def standin():
    with gpu_standin.active() as cupy:
        yield cupy


def _backend(**kw):
    from pydtnn.backends.gpu.backend import GPUBackend
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


def test_glue_standin_device_arrays_are_not_numpy_arrays(standin):
    """As CuPy's: a type of its own that NumPy, buffers and host operands refuse, and device results."""
    d = standin.asarray(np.arange(4.0))
    assert not isinstance(d, np.ndarray)
    for convert in (np.asarray, np.array, np.ascontiguousarray, memoryview):
        with pytest.raises(TypeError):
            convert(d)
    for mix in (lambda: d + np.ones(4), lambda: np.ones(4) * d, lambda: d - np.asarray(1.0),
                lambda: standin.maximum(d, np.ones(4)), lambda: np.add(d, np.ones(4))):
        with pytest.raises(TypeError, match="Unsupported type <class 'numpy.ndarray'>"):
            mix()
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray"):
        d[...] = np.ones(4)
    with pytest.raises(TypeError, match="Python sequence"):
        d[...] = [1.0, 2.0, 3.0, 4.0]
    total = d.sum()
    assert isinstance(total, standin.ndarray) and total.ndim == 0 and float(total) == 6
    assert isinstance(np.sum(d), standin.ndarray) and isinstance(d * np.float64(2), standin.ndarray)
    assert np.add(d, d, out=d) is d and np.array_equal(d.get(), [0, 2, 4, 6])
    d[np.array([0, 2])] = 5.0                                    # host index arrays are fine (CuPy copies them)
    assert np.array_equal(d.get(), [5, 2, 5, 6]) and d[1].item() == 2.0
    host = np.arange(3.0)
    dev = standin.asarray(host)
    host[0] = 7                                                  # a device copy never aliases the host
    assert float(dev[0]) == 0


def test_glue_optimizers_step_device_arrays_as_host_ones(standin):
    """SGD's fused CPU update (numba) must not see device arrays: every optimizer steps them with the
    array module's operations, to the host result."""
    from pydtnn.optimizers import SGD, Adam, RMSProp
    rng = np.random.default_rng(0)
    w0, grads = rng.standard_normal(50), [rng.standard_normal(50) for _ in range(3)]
    for make in (lambda: SGD(0.1, momentum=0.9), lambda: SGD(0.1, momentum=0.9, nesterov=True),
                 lambda: Adam(0.01), lambda: RMSProp(0.01)):
        host_opt, dev_opt = make(), make()
        w_host, w_dev = w0.copy(), standin.asarray(w0)
        for g in grads:
            host_opt.step(w_host, g.copy())
            dev_opt.step(w_dev, standin.asarray(g))
        assert isinstance(w_dev, standin.ndarray)
        assert rel_err(w_dev.get(), w_host) < 1e-13, type(host_opt).__name__


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
    from pydtnn.backends.gpu import kernels as _gpu_kernels
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
    from pydtnn.backends.gpu import kernels as _gpu_kernels
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
    # float32 arithmetic errs by ~1e-7 relative here; the stand-in's FFT and Winograd plans (allowed by "fp32")
    # add ~5e-5 of the largest value, its TF32 plans ~1e-3
    tol = 1e-12 if be.dtype == np.float64 else {"fp32_strict": 1e-5, "fp32": 1e-4, "tf32": 1e-2}[be.precision]
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


def _executed(op=None):
    """(plan index, plan name) of every frontend execution recorded since the last clear."""
    return [(c[3], c[4]) for c in fake_cudnn.FRONTEND_CALLS if c[0] == "execute" and (op is None or c[1] == op)]


def _conv3x3(be, seed=0):
    """A 3x3 stride-1 convolution (Winograd applies) through fprop/dgrad/wgrad; returns the three results
    and the float64 CPU references."""
    spec = ConvSpec(4, 5, (3, 3), (1, 1), (1, 1))
    rng = np.random.default_rng(seed)
    x, w, dy = rng.standard_normal((2, 4, 6, 7)), rng.standard_normal((5, 4, 3, 3)), rng.standard_normal((2, 5, 6, 7))
    x, w, dy = (a.astype(be.dtype).astype(np.float64) for a in (x, w, dy))
    y, ctx = be.conv2d_forward(be.asarray(x), be.asarray(w), None, spec)
    dx = be.conv2d_backward_data(be.asarray(dy), be.asarray(w), ctx, spec)
    dw, _ = be.conv2d_backward_weights(be.asarray(dy), ctx, spec, False)
    cpu = CPUBackend(dtype="float64")
    yr, cctx = cpu.conv2d_forward(cpu.to_internal(x), w, None, spec)
    refs = (cpu.to_user(yr), cpu.to_user(cpu.conv2d_backward_data(cpu.to_internal(dy), w, cctx, spec)),
            cpu.conv2d_backward_weights(cpu.to_internal(dy), cctx, spec, False)[0])
    return [a.get() for a in (y, dx, dw)], refs


def test_glue_standin_inexact_plans_really_are_inexact():
    """The stand-in's FFT/Winograd/TF32 plans miss strict fp32's 1e-5 (else the strict tests could not
    fail), and its plain plans, in float32 arithmetic, meet it."""
    spec = ConvSpec(16, 16, (3, 3), (1, 1), (1, 1))
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 16, 8, 8)).astype(np.float32), rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    ref = fake_cudnn.conv_emulated("exact", "fprop", spec, np.float64, x=x, w=w)
    errs = {k: rel_err(fake_cudnn.conv_emulated(k, "fprop", spec, np.float32, x=x, w=w), ref)
            for k in ("exact", "split", "tf32", "fft", "winograd")}
    assert errs["exact"] < 1e-6 and errs["split"] < 1e-6 and errs["exact"] > 0, errs     # float32, not float64
    assert min(errs["tf32"], errs["fft"], errs["winograd"]) > 1e-5, errs


@pytest.mark.parametrize("impl", ["auto", "legacy"])
def test_glue_strict_fp32_uses_no_tensor_core_fft_or_winograd_plan(impl):
    """fp32_strict runs on the legacy API's named algorithms: the stand-in's frontend, like cuDNN 9.19 on the
    H200, has a Winograd wgrad plan with no Winograd note, which a note filter would let through (this test
    failed that way: 5e-5 > 1e-5)."""
    with gpu_standin.active():
        fake_cudnn.FRONTEND_CALLS.clear()
        fake_cudnn.LEGACY_CALLS.clear()
        be = _backend(dtype="float32", precision="fp32_strict", conv_impl=impl)
        got, refs = _conv3x3(be)
        for g, r in zip(got, refs):
            assert rel_err(g, r) < 1e-5
        assert not _executed() and be.conv_report()["served"] == {"frontend": 0, "legacy": 3}
        runs = [c for c in fake_cudnn.LEGACY_CALLS if c[0].startswith("cudnnConvolution")]
        inexact = {"cudnnConvolutionForward": {4, 5, 6, 7}, "cudnnConvolutionBackwardData": {2, 3, 4, 5},
                   "cudnnConvolutionBackwardFilter": {2, 4, 5, 6}}
        assert len(runs) >= 3 and all(math == 3 and algo not in inexact[f] for f, math, algo in runs), runs
        with pytest.raises(ConfigError, match="fp32_strict runs on cuDNN's legacy API") as e:
            _backend(dtype="float32", precision="fp32_strict", conv_impl="frontend")
        assert "\n" not in str(e.value)


def test_glue_fp32_means_no_tf32_and_any_algorithm():
    """fp32 is PyTorch's fp32 (TF32 off): never a tensor-core plan, FFT and Winograd allowed; tf32 takes the
    tensor cores."""
    with gpu_standin.active():
        fake_cudnn.FRONTEND_CALLS.clear()
        got, refs = _conv3x3(_backend(dtype="float32", precision="fp32", conv_impl="frontend", auto_conv_alg=False))
        names = {name for _, name in _executed()}
        assert len(_executed()) == 3 and "tensor_core" not in names and names & {"winograd", "fft"}, names
        assert max(rel_err(g, r) for g, r in zip(got, refs)) < 1e-4          # Winograd's ~5e-5 in the stand-in
        fake_cudnn.FRONTEND_CALLS.clear()
        got, refs = _conv3x3(_backend(dtype="float32", precision="tf32", conv_impl="frontend", auto_conv_alg=False))
        assert max(rel_err(g, r) for g, r in zip(got, refs)) > 1e-5
        assert {name for _, name in _executed()} == {"tensor_core"}
        with pytest.raises(ConfigError, match="GPU precision must be one of fp32, tf32, fp32_strict"):
            _backend(dtype="float32", precision="fp16")


@pytest.mark.parametrize("impl", ["frontend", "legacy"])
def test_glue_deterministic_mode_repeats_the_bits(impl, monkeypatch):
    """Non-deterministic plans (atomics) give other bits on every call in the stand-in, as on a GPU; the
    deterministic mode takes none of them."""
    def dgrads(be, n=5):
        spec = ConvSpec(3, 4, (3, 3), (1, 1), (1, 1))
        rng = np.random.default_rng(1)
        x, w, dy = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3)), rng.standard_normal((2, 4, 6, 6))
        _, ctx = be.conv2d_forward(be.asarray(x), be.asarray(w), None, spec)
        return [be.conv2d_backward_data(be.asarray(dy), be.asarray(w), ctx, spec).get() for _ in range(n)]
    with gpu_standin.active():
        monkeypatch.setattr(fake_cudnn, "_RANDOM", __import__("random").Random(0))
        loose = dgrads(_backend(conv_impl=impl))
        assert any(not np.array_equal(loose[0], a) for a in loose[1:])
        fake_cudnn.FRONTEND_CALLS.clear()
        fake_cudnn.LEGACY_CALLS.clear()
        strict = dgrads(_backend(conv_impl=impl, deterministic=True))
        assert all(np.array_equal(strict[0], a) for a in strict[1:])
        assert rel_err(strict[0], loose[0]) < 1e-12
        if impl == "frontend":
            assert "atomics" not in {name for _, name in _executed()}
        else:
            assert {c[2] for c in fake_cudnn.LEGACY_CALLS if c[0] == "cudnnConvolutionBackwardData"} == {1}
        monkeypatch.setenv("PYDTNN_GPU_DETERMINISTIC", "1")
        assert _backend().deterministic and _backend().conv_report()["deterministic"]
        monkeypatch.setenv("PYDTNN_GPU_DETERMINISTIC", "maybe")
        with pytest.raises(ConfigError, match="PYDTNN_GPU_DETERMINISTIC must be 1 or 0"):
            _backend()


def _costs(monkeypatch, **costs):
    """Give the stand-in's frontend plans of these names these costs (ms), every graph built from now on."""
    original = fake_cudnn._plans

    def plans(op, io, spec):
        out = original(op, io, spec)
        for p in out:
            p.cost = costs.get(p.name, p.cost)
        return out
    monkeypatch.setattr(fake_cudnn, "_plans", plans)


def test_glue_autotune_times_medians_and_keeps_the_heuristic_unless_5_percent_faster(monkeypatch):
    """Each candidate is timed over >= 10 event-timed runs after warm-up, its inputs rotated among fresh copies.
    With +-30% noise on every run the medians still rank two plans 40% apart the same way for every seed of
    the noise; without noise, a plan 3% faster than the heuristic's (split, first in the list) never displaces
    it, one 6% faster does."""
    import random

    from pydtnn.backends.gpu.cudnn import autotune
    with gpu_standin.active():
        for noise, faster, expected in ((0.3, 0.6, "exact"), (0.0, 0.97, "split"), (0.0, 0.94, "exact")):
            monkeypatch.setitem(fake_cudnn.SETTINGS, "noise", noise)
            _costs(monkeypatch, split=0.25, exact=0.25 * faster)
            for seed in range(6 if noise else 1):
                autotune.clear_memory()
                monkeypatch.setattr(fake_cudnn, "_RANDOM", random.Random(seed))
                fake_cudnn.FRONTEND_CALLS.clear()
                be = _backend(auto_conv_alg=True)
                (y, _, _), refs = _conv3x3(be)
                runs = _executed("fprop")
                timed = [name for _, name in runs[:-1]]
                assert {timed.count(n) for n in set(timed)} == {autotune.RUNS + autotune.WARMUP}, timed
                assert runs[-1][1] == expected, (noise, faster, seed, runs[-1])
                assert rel_err(y, refs[0]) < 1e-12
        # the inputs rotate: the timed runs of one plan read autotune.ROTATIONS different x buffers
        reads = [c[5] for c in fake_cudnn.FRONTEND_CALLS if c[0] == "execute" and c[1] == "fprop" and c[4] == "exact"]
        assert len(set(reads[:-1])) == autotune.ROTATIONS, reads


def test_glue_autotune_choice_is_cached_per_device_cudnn_version_and_convolution(monkeypatch, tmp_path):
    from pydtnn.backends.gpu.cudnn import autotune
    cache = tmp_path / "plans.json"
    monkeypatch.setenv(autotune.CACHE_VAR, str(cache))
    with gpu_standin.active():
        _costs(monkeypatch, split=0.25, exact=0.15)
        autotune.clear_memory()
        fake_cudnn.FRONTEND_CALLS.clear()
        _conv3x3(_backend(auto_conv_alg=True))
        first = len(_executed())
        assert first > 3 * autotune.RUNS                      # measured
        keys = json.loads(cache.read_text())
        assert all(k.startswith("stand-in (host)#0|cudnn") for k in keys), keys
        assert sorted(k.split("|")[5] for k in keys) == ["dgrad", "fprop", "wgrad"], keys
        assert [v["plan"] for k, v in keys.items() if "|fprop|" in k] == ["exact"]
        autotune.clear_memory()                               # a new process: the file answers
        fake_cudnn.FRONTEND_CALLS.clear()
        _conv3x3(_backend(auto_conv_alg=True))
        assert len(_executed()) == 3 and _executed("fprop")[0][1] == "exact"
        autotune.clear_memory()
        fake_cudnn.FRONTEND_CALLS.clear()                     # determinism: no autotuning, no cache
        _conv3x3(_backend(auto_conv_alg=True, deterministic=True))
        assert len(_executed()) == 3 and _executed("fprop")[0][1] == "split"


def test_glue_step_guard_keeps_the_faster_plan_set(monkeypatch):
    """The guard times whole steps with the tuned plans and with the heuristic's and keeps the winner: here
    the tuned plan wins while tuning, then turns slow in the step (as VGG-16's TF32 plans did on the H200)."""
    from pydtnn.backends.gpu.cudnn import autotune
    with gpu_standin.active():
        monkeypatch.setitem(fake_cudnn.SETTINGS, "noise", 0.0)
        _costs(monkeypatch, split=0.25, exact=0.15)
        autotune.clear_memory()
        be = _backend(auto_conv_alg=True)
        step = lambda: _conv3x3(be)                          # noqa: E731
        step()
        assert be.conv.differs()
        report = be.conv.guard(step)
        assert report["kept"] == "tuned" and report["tuned"] < report["heuristic"]
        for call in be.conv.calls.values():                   # the tuned plan is slow in a real step
            call.graph.plans[call.plans["tuned"][0]].cost = 0.5
        report = be.conv.guard(step)
        assert report["kept"] == "heuristic" and be.conv_report()["plans"] == "heuristic"
        fake_cudnn.FRONTEND_CALLS.clear()
        step()
        assert {name for _, name in _executed("fprop")} == {"split"}
        assert _backend(auto_conv_alg=False).conv.guard(step) == {}     # nothing to compare


def test_glue_failing_plan_does_not_drop_the_graph(caplog):
    """A plan that raises (not a decline) is passed over by the per-index walk, logged once; Frontend
    1.32's own build_plans() would let that RuntimeError escape (the old cause of a silent fall-back to the
    legacy API)."""
    import logging
    with gpu_standin.active(), caplog.at_level(logging.WARNING, logger="pydtnn.gpu"):
        be = _backend(dtype="float32", precision="fp32", conv_impl="auto")
        _conv3x3(be)
        _conv_round(be)
        report = be.conv_report()
        assert report["served"] == {"frontend": 6, "legacy": 0}, report
        assert report["plans_passed_over"]["failed"] == 6 and report["plans_passed_over"]["deselected"] >= 6
        notes = [r.getMessage() for r in caplog.records if r.name == "pydtnn.gpu"]
        assert len(notes) == 1 and "failed to build or run" in notes[0] and "\n" not in notes[0], notes
        import cudnn
        g = cudnn.pygraph(io_data_type=cudnn.data_type.DOUBLE, compute_data_type=cudnn.data_type.DOUBLE,
                          handle=cudnn.create_handle())
        X = g.tensor(name="X", dim=[1, 1, 4, 4], stride=[16, 16, 4, 1], data_type=cudnn.data_type.DOUBLE)
        W = g.tensor(name="W", dim=[1, 1, 3, 3], stride=[9, 9, 3, 1], data_type=cudnn.data_type.DOUBLE)
        g.conv_fprop(image=X, weight=W, padding=[1, 1], stride=[1, 1], dilation=[1, 1]).set_output(True).set_dim(
            [1, 1, 4, 4]).set_stride([16, 16, 4, 1]).set_data_type(cudnn.data_type.DOUBLE)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A])
        g.check_support()
        with pytest.raises(RuntimeError, match="STATUS_INTERNAL_ERROR") as e:
            g.build_plans()
        assert not isinstance(e.value, cudnn.cudnnGraphNotSupportedError)


def test_glue_precision_reaches_cudnn(standin):
    fake_cudnn.FRONTEND_CALLS.clear()
    _conv_round(_backend(dtype="float32", precision="fp32", conv_impl="frontend", auto_conv_alg=False))
    notes = [c[1] for c in fake_cudnn.FRONTEND_CALLS if c[0] == "deselect_numeric_notes"]
    assert len(notes) == 3 and all(fake_cudnn.numerical_note.TENSOR_CORE in n for n in notes)
    fake_cudnn.FRONTEND_CALLS.clear()
    _conv_round(_backend(dtype="float32", precision="tf32", conv_impl="frontend"))
    assert not [c for c in fake_cudnn.FRONTEND_CALLS if c[0] == "deselect_numeric_notes"]
    fake_cudnn.LEGACY_CALLS.clear()
    from gpu_standin import fake_cublas
    fake_cublas.CALLS.clear()
    _conv_round(_backend(dtype="float32", precision="fp32", conv_impl="legacy", auto_conv_alg=False))
    runs = [c for c in fake_cudnn.LEGACY_CALLS if c[0].startswith("cudnnConvolution")]
    assert len(runs) == 3 and all(math == 3 for _, math, _ in runs)       # CUDNN_FMA_MATH: no TF32
    assert ("cublasSetMathMode", 0) in fake_cublas.CALLS                  # CUBLAS_DEFAULT_MATH: no TF32


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
    from pydtnn.backends.gpu.rng import splitmix64_mix
    assert splitmix64_mix(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF


# ====================================================================================== NCCL

def test_glue_nccl_unique_id_conversions():
    from pydtnn.parallel.comm.nccl import shared_devices, unique_id_for_cupy, unique_id_to_bytes
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
    import sys
    import numpy as np
    import cupy as cp
    from pydtnn.errors import ConfigError
    from pydtnn.parallel.comm import BucketedReducer, make_comm
    from mpi4py import MPI
    mode, rank = sys.argv[1], MPI.COMM_WORLD.Get_rank()
    if mode == "no_gpu_on_rank1" and rank == 1:
        import os
        os.environ["PYDTNN_STANDIN_DEVICES"] = "0"          # this rank sees no device
    if mode == "no_unique_id" and rank == 0:
        def broken():
            raise RuntimeError("ncclUniqueId: bootstrap failed")
        cp.cuda.nccl.get_unique_id = broken
    try:
        comm = make_comm("nccl")
    except ConfigError as e:
        print(f"REFUSED {e}|", flush=True)
        raise SystemExit(0)
    a = cp.arange(6, dtype=cp.float32) * (comm.rank + 1)
    comm.allreduce_sum_(a)
    req = comm.iallreduce_sum_(b := cp.ones(3, cp.float64))
    comm.waitall([req])
    g = cp.arange(10, dtype=cp.float64) * (comm.rank + 1)
    reducer = BucketedReducer(comm, g, bucket_bytes=24)        # 3 elements a bucket: 4 buckets
    reducer.start_step()
    reducer.ready(5)
    reducer.finish()
    print(f"SUM {comm.rank} {a.get().tolist()} {b.get().tolist()} {g.get().tolist()}|", flush=True)
""")


@pytest.mark.parametrize("devices,mode", [(1, "ok"), (2, "ok"), (2, "no_gpu_on_rank1"), (2, "no_unique_id")])
def test_glue_nccl_two_ranks(tmp_path, devices, mode):
    """Two ranks on one (stand-in) GPU: every rank refuses with one line; on two GPUs they reduce (blocking,
    non-blocking, and bucketed with BucketedReducer over device buffers). A set-up failure on one rank is
    the same one-line error on every rank, not a hang of the others."""
    from mpi_helpers import run_mpi
    script = tmp_path / "nccl2.py"
    script.write_text(_NCCL_TWO_RANKS)
    env = {k: v for k, v in gpu_standin.subprocess_env(PYDTNN_STANDIN_DEVICES=devices).items()
           if k in ("PYTHONPATH", "PYDTNN_GPU_STANDIN", "PYDTNN_STANDIN_DEVICES")}
    r = run_mpi(2, script, [mode], timeout=120, check=True, env=env)
    out = r.stdout + r.stderr
    refused = [m.strip() for m in r.stdout.split("|") if m.strip().startswith("REFUSED")]   # lines may interleave
    if devices == 1:
        assert len(refused) == 2 and len(set(refused)) == 1, out
        assert refused[0].startswith("REFUSED NCCL needs one GPU per rank, but ranks 0, 1 share the GPU"), out
    elif mode == "no_gpu_on_rank1":
        assert len(refused) == 2 and len(set(refused)) == 1, out
        assert "no CUDA device is visible" in refused[0] and "(NCCL set-up failed on rank 1 of 2)" in refused[0]
    elif mode == "no_unique_id":
        assert len(refused) == 2 and len(set(refused)) == 1, out
        assert "NCCL could not create its unique id on rank 0: RuntimeError: ncclUniqueId" in refused[0]
    else:
        total = [float(3 * v) for v in range(10)]
        for rank in (0, 1):
            assert f"SUM {rank} [0.0, 3.0, 6.0, 9.0, 12.0, 15.0] [2.0, 2.0, 2.0] {total}|" in out, out
    assert fake_nccl.NCCL_SUM == 0


_NCCL_STREAMS = textwrap.dedent("""
    import cupy as cp
    from gpu_standin import fake_cupy
    from pydtnn.parallel.comm import make_comm
    comm = make_comm("nccl")
    x = cp.ones(4, cp.float32)
    fake_cupy.CALLS.clear()
    comm.allreduce_sum_(x)
    req = comm.iallreduce_sum_(x)
    comm.bcast_(x)
    comm.waitall([req])
    for call in fake_cupy.CALLS:
        if call[0] in ("record", "wait_event", "nccl"):
            print("CALL", *call, flush=True)
    print("NCCL_STREAM", comm.stream.ptr, "CURRENT", cp.cuda.get_current_stream().ptr, flush=True)
""")


def test_glue_nccl_collectives_share_one_stream_ordered_by_events(tmp_path):
    """Blocking and non-blocking collectives all run on the communicator's one NCCL stream, each after
    an event of the current stream; a blocking one makes the current stream wait for it."""
    from mpi_helpers import run_mpi
    script = tmp_path / "streams.py"
    script.write_text(_NCCL_STREAMS)
    env = {k: v for k, v in gpu_standin.subprocess_env().items() if k in ("PYTHONPATH", "PYDTNN_GPU_STANDIN")}
    r = run_mpi(1, script, timeout=120, check=True, env=env)
    calls = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("CALL")]
    nccl_stream, current = (r.stdout.split("NCCL_STREAM ")[1].split()[i] for i in (0, 2))
    assert nccl_stream != current
    collectives = [i for i, c in enumerate(calls) if c[0] == "nccl"]
    assert [calls[i][1] for i in collectives] == ["allReduce", "allReduce", "bcast"]
    recorded_on = {c[2]: c[1] for c in calls if c[0] == "record"}            # event id -> stream
    for n, i in enumerate(collectives):
        assert calls[i][2] == nccl_stream
        wait = calls[i - 1]                      # the NCCL stream waited for the current stream's work
        assert wait[0] == "wait_event" and wait[1] == nccl_stream and recorded_on[wait[2]] == current, calls
        after = calls[i + 1:i + 3]               # recorded on the NCCL stream; blocking: the current one waits
        assert after[0][0] == "record" and after[0][1] == nccl_stream, calls
        if n != 1:
            assert after[1][:2] == ["wait_event", current] and after[1][2] == after[0][2], calls


def test_glue_bucketed_reduction_of_a_gpu_rank_in_a_mixed_job():
    """--non_blocking_mpi with a GPU replica among CPU ones: BucketedReducer reduces the device gradient
    buffer through host copies (MPIComm.iallreduce_sum_); the data-parallel invariant holds."""
    from mpi_helpers import run_mpi
    env = {k: v for k, v in gpu_standin.subprocess_env(PYDTNN_STANDIN_DEVICES=1).items()
           if k in ("PYTHONPATH", "PYDTNN_GPU_STANDIN", "PYDTNN_STANDIN_DEVICES")}
    r = run_mpi(3, "invariant.py", ["proportional", "1,2,3", 60, 4, "model=bn", "sync=1", "non_blocking=1",
                                     "devices=gpu,cpu,cpu"], timeout=180, env=env, check=True)
    res = json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])
    assert res["sizes"] == [10, 20, 30]
    assert res["rel_diff"] < 1e-10 and res["stats_rel_diff"] < 1e-10, res


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


def _launch(tmp_path, *args, gpu=False, **settings):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if gpu:
        env = gpu_standin.subprocess_env(env, **settings)
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
    assert ", backend gpu)" in r.stdout.splitlines()[0], r.stdout[:500]           # the banner's model line
    cpu, gpu = (json.loads((tmp_path / f"{k}.json").read_text()) for k in ("cpu", "gpu"))
    assert len(cpu) == len(gpu) == 2
    for rc, rg in zip(cpu, gpu):
        for key in ("loss", "val_loss"):
            assert abs(rc[key] - rg[key]) <= 1e-9 * max(1.0, abs(rc[key])), (key, rc[key], rg[key])


def test_glue_gpu_resume_is_bit_exact_with_dropout(tmp_path):
    """Checkpoint + resume on the GPU backend (stand-in) equals the uninterrupted run bit for bit, with
    dropout: the GPU generator's state is in the checkpoint; cuDNN in deterministic mode, autotuning off
    (with either of them missing the stand-in's plans make this test fail, as a GPU's would)."""
    common = _common(_model_file(tmp_path, dropout=True)) + [
        "--lr_schedulers", "model_checkpoint", "--model_checkpoint_save_freq", "1",
        "--enable_cudnn_auto_conv_alg", "false"]
    full, resumed = tmp_path / "full.npz", tmp_path / "resumed.npz"
    det = {"PYDTNN_GPU_DETERMINISTIC": 1}
    _launch(tmp_path, *common, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "a",
            "--save_weights_and_bias_filename", full, gpu=True, **det)
    _launch(tmp_path, *common, "--num_epochs", "1", "--checkpoint_dir", tmp_path / "b", gpu=True, **det)
    ckpt = tmp_path / "b" / "epoch_0001.npz"
    meta = json.loads(np.load(ckpt)["__meta__"].tobytes())
    assert meta["rng_states"][0]["bit_generator"] == "pydtnn.CounterRNG/splitmix64"
    assert meta["rng_states"][0]["offset"] > 0
    _launch(tmp_path, *common, "--num_epochs", "2", "--checkpoint_dir", tmp_path / "c", "--resume", ckpt,
            "--save_weights_and_bias_filename", resumed, gpu=True, **det)
    a, b = np.load(full), np.load(resumed)
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        assert np.array_equal(a[k], b[k]), k


def test_glue_trainer_guards_tuned_plans_once_and_leaves_no_trace(monkeypatch):
    """The launcher's loop runs the guard after its first step (tuned plans against the heuristic's on whole
    passes) in passes that leave no trace: with the same plans kept, the weights equal those of a run without
    the guard, bit for bit."""
    from pydtnn import Model
    from pydtnn.backends.gpu.cudnn import autotune
    from pydtnn.activations import Relu, Softmax
    from pydtnn.datasets import from_arrays
    from pydtnn.optimizers import SGD
    from pydtnn.training.loop import Trainer
    from pydtnn.layers import FC, BatchNormalization, Conv2D, Dropout, Flatten, Input
    rng = np.random.default_rng(0)
    data = from_arrays(rng.standard_normal((12, 1, 12, 12)).astype(np.float32), rng.integers(0, 10, 12))

    def train(guard):
        autotune.clear_memory()
        be = _backend(dtype="float32", auto_conv_alg=True)
        model = Model(backend=be, seed=0)      # running statistics and a dropout stream: what a pass could leave
        for layer in (Input(shape=(1, 12, 12)), Conv2D(4, (3, 3), padding=1), BatchNormalization(), Relu(),
                      Dropout(0.3), Flatten(), FC(10), Softmax()):
            model.add(layer)
        trainer = Trainer(model, data, SGD(learning_rate=0.05), global_batch=4, progress=False, seed=0)
        if not guard:
            trainer.dp.plan_guard = {}
        trainer.fit(1)
        return trainer.dp.plan_guard, np.concatenate([a.ravel() for a in model.state_arrays().values()])
    with gpu_standin.active():
        monkeypatch.setitem(fake_cudnn.SETTINGS, "noise", 0.0)
        # the tuned plan ("exact") and the heuristic's (the first that builds) both give the same bits every call
        _costs(monkeypatch, atomics=0.5, winograd=0.5, winograd_nonfused=0.5, fft=0.5, split=0.25, exact=0.15)
        guarded, w_guarded = train(True)
        skipped, w_skipped = train(False)
    assert guarded["kept"] == "tuned" and guarded["tuned"] < guarded["heuristic"], guarded
    assert skipped == {}
    assert np.array_equal(w_guarded, w_skipped)
