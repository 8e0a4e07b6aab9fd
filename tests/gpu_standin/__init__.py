"""A stand-in for the small part of CuPy, cuDNN and NCCL that PyDTNN's GPU backend uses, so that the
backend's GLUE runs on machines without a GPU: NumPy memory for device arrays, the kernels' real CUDA
source compiled as C++ on the host, and cuDNN / NCCL stand-ins that check every call they receive and
compute with the CPU backend. Passing tests here say the glue is right; they say nothing about NVIDIA's
libraries or the hardware (GPU verification means a run on a GPU: scripts/gpu_check.sh).

Modelled: device arrays (device_memory), kernels (host_kernels), cuDNN (fake_cudnn), cuBLAS as the backend
calls it (fake_cublas; CuPy's own products are fake_cupy's), NCCL (fake_nccl), what a step costs (counters:
launches, allocations, synchronizations, transfers), and CUDA graphs (graphs: the thread-local current
stream, stream capture that records instead of running and poisons fresh results, replay by `Graph.launch`,
what a capture refuses, private memory pools and `using_allocator`).

    with gpu_standin.active():            # sys.modules["cupy"], ["cudnn"], ... are the stand-ins
        be = GPUBackend(dtype="float64")

In a subprocess: PYTHONPATH=tests/gpu_standin/site plus PYDTNN_GPU_STANDIN=1 installs it at start-up
(sitecustomize), for launcher runs with --enable_gpu true.
"""
from __future__ import annotations

import contextlib
import os
import sys

from . import fake_cublas, fake_cudnn, fake_cupy, graphs

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
_NAMES = ("cupyx", "cupy", "cupy.cuda", "cupy.cuda.runtime", "cupy.cuda.nccl", "cupy.cuda.graph", "cudnn")


def _install():
    """Put the stand-ins in sys.modules, the legacy cuDNN stand-in behind load_libcudnn and the cuBLAS one
    behind load_libcublas; returns what to restore."""
    import pydtnn.backends.gpu.cublas_library as cublas_glue
    import pydtnn.backends.gpu.cudnn.library as cudnn_glue
    saved = {name: sys.modules.get(name, _MISSING) for name in _NAMES}
    saved["load_libcudnn"] = cudnn_glue.load_libcudnn
    saved["load_libcublas"] = cublas_glue.load_libcublas
    modules = fake_cupy.build_modules()
    modules["cudnn"] = fake_cudnn.build_frontend_module()
    sys.modules.update(modules)
    legacy = fake_cudnn.LegacyLibrary()
    cudnn_glue.load_libcudnn = lambda: legacy
    cublas = fake_cublas.Library()
    cublas_glue.load_libcublas = lambda: cublas
    return saved


_MISSING = object()


def _restore(saved):
    import pydtnn.backends.gpu.cublas_library as cublas_glue
    import pydtnn.backends.gpu.cudnn.library as cudnn_glue
    cudnn_glue.load_libcudnn = saved.pop("load_libcudnn")
    cublas_glue.load_libcublas = saved.pop("load_libcublas")
    for name, mod in saved.items():
        if mod is _MISSING:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod


@contextlib.contextmanager
def active(frontend: str = "ok", decline_double: bool = False):
    """The stand-in installed for the duration of the block (frontend mode: see fake_cudnn)."""
    old = dict(fake_cudnn.SETTINGS)
    fake_cudnn.SETTINGS.update(mode=frontend, decline_double=decline_double)
    saved = _install()
    try:
        yield sys.modules["cupy"]
    finally:
        _restore(saved)
        fake_cudnn.SETTINGS.update(old)
        left_open = graphs.reset()
    if left_open:       # (not while an error propagates: that one says more)
        raise AssertionError(f"stand-in: stream capture(s) left open at the end of the block: {left_open}")


def install_for_process():
    """For sitecustomize: install for the whole process (never restored)."""
    _install()


def subprocess_env(env=None, **settings) -> dict:
    """Environment for a child process that runs with the stand-in installed at start-up."""
    env = dict(os.environ if env is None else env)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([SITE_DIR, repo] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYDTNN_GPU_STANDIN"] = "1"
    env.update({k: str(v) for k, v in settings.items()})
    return env
