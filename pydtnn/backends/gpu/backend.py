"""The GPU backend: CuPy arrays, layout NCHW, cuDNN convolutions, cuBLAS products, our own CUDA kernels for
the rest.

One file per kernel family, named as on the CPU backend (module and mixin: `gpu/norm.py` and `cpu/norm.py`
both hold `BatchNormKernels`); the CUDA source of a family's own kernels is the file of the same name under
`kernels/`. `conv` (`ConvKernels`: cuDNN through `cudnn.ConvRunner`, the bias in `elementwise`'s kernel),
`matmul` (`MatmulKernels`: cuBLAS through the backend's own handle, `cublas`), `norm` (`BatchNormKernels`),
`pool` (`PoolingKernels`), `elementwise` (`ElementwiseKernels`: ReLU, a block's sum, bias); the random
generator is `rng`, the device choice `device`.

- Device: `GPUBackend(device=None)` takes the launcher's local rank modulo the visible devices (see
  `device`), made current BEFORE anything is allocated.
- `precision` (float32 data; float64 always computes in double): "fp32" (default: no TF32, any cuDNN
  algorithm, as PyTorch with TF32 off), "tf32" (cuDNN and cuBLAS may use TF32 tensor cores) or "fp32_strict"
  (no TF32, FFT or Winograd: see `cudnn.precision`; cuBLAS's pedantic math); visible as `backend.precision`.
  The products' math mode is set on the backend's own cuBLAS handle (`cublas`), so backends of different
  precisions can share a process.
- `auto_conv_alg` (default on): cuDNN plans chosen by measurement where they win (`cudnn.autotune`);
  `deterministic` (default: $PYDTNN_GPU_DETERMINISTIC, else off): only cuDNN plans that give the same bits
  every run, and no autotuning (two processes could pin different plans); every other GPU kernel here is
  deterministic already.
- No allocation outside CuPy's memory pool; small per-layer vectors (batch statistics, partial sums) live in
  buffers kept per layer (`_scratch`), so a step allocates its activations and little else.
"""
from __future__ import annotations

import os

import numpy as np

from pydtnn.backends.contract import Backend, parse_dtype
from pydtnn.backends.gpu.conv import ConvKernels
from pydtnn.backends.gpu.cublas import Cublas
from pydtnn.backends.gpu.device import use_device
from pydtnn.backends.gpu.elementwise import ElementwiseKernels
from pydtnn.backends.gpu.matmul import MatmulKernels
from pydtnn.backends.gpu.norm import BatchNormKernels
from pydtnn.backends.gpu.pool import PoolingKernels
from pydtnn.errors import ConfigError, ShapeError

DETERMINISTIC_VAR = "PYDTNN_GPU_DETERMINISTIC"


def _deterministic(value) -> bool:
    """The `deterministic` option: the argument when given, else $PYDTNN_GPU_DETERMINISTIC (1/true/yes: on),
    else off."""
    if value is None:
        env = os.environ.get(DETERMINISTIC_VAR, "").strip().lower()
        if env not in ("", "0", "1", "true", "false", "yes", "no"):
            raise ConfigError(f"{DETERMINISTIC_VAR} must be 1 or 0, got {env!r}")
        return env in ("1", "true", "yes")
    if not isinstance(value, bool):
        raise ConfigError(f"GPU option deterministic must be True or False, got {value!r}")
    return value


class GPUBackend(ConvKernels, MatmulKernels, BatchNormKernels, PoolingKernels, ElementwiseKernels, Backend):
    """CuPy/cuDNN kernels, NCHW inside and out."""
    name = "gpu"
    layout = "NCHW"

    def __init__(self, dtype="float32", seed: int = 0, device=None, precision: str = "fp32",
                 auto_conv_alg: bool = True, conv_impl: str | None = None, deterministic: bool | None = None):
        from pydtnn.backends.gpu.cudnn import precision as precisions
        self.dtype = parse_dtype(dtype, "gpu")
        self.precision = precisions.check(precision)
        self.deterministic = _deterministic(deterministic)
        cupy, self.device = use_device(device)          # before any allocation
        self.xp = cupy
        self.auto_conv_alg = bool(auto_conv_alg) and not self.deterministic
        from pydtnn.backends.gpu import kernels
        self.kernels = kernels
        self._fns = {}
        self._buffers = {}
        self._readback = None              # the side stream of the lagged reads, made at the first
        self._unused_index = None
        self.seed(seed)
        from pydtnn.backends.gpu.cudnn import ConvRunner
        self.conv = ConvRunner(cupy, self.dtype, precision, conv_impl, self.auto_conv_alg, self.deterministic)
        self.cublas = Cublas(cupy, self.dtype, self.precision)

    # --- arrays -------------------------------------------------------------------------------------
    def asarray(self, a):
        cp = self.xp
        if isinstance(a, cp.ndarray):
            return cp.ascontiguousarray(a, dtype=self.dtype)
        return cp.asarray(np.ascontiguousarray(a, dtype=self.dtype))

    def to_numpy(self, a):
        if isinstance(a, self.xp.ndarray):
            return a.get()
        return np.asarray(a)

    def to_internal(self, x_nchw):
        x = self.asarray(x_nchw)
        if x.ndim != 4:
            raise ShapeError(f"to_internal expects a 4-D NCHW array, got shape {x.shape}")
        return x

    def to_user(self, x):
        if x.ndim != 4:
            raise ShapeError(f"to_user expects a 4-D NCHW array, got shape {x.shape}")
        return x

    def seed(self, seed: int) -> None:
        """A counter-based generator (`rng`): its state can be checkpointed, unlike CuPy's."""
        from pydtnn.backends.gpu.rng import CounterRNG
        self.rng = CounterRNG(self.xp, self.dtype, self._uniform_fill, seed, self._uniform_fill_at, self._rng_base_set)

    def _uniform_fill(self, out, key, offset):
        self._launch("uniform_fill", out.size, (out, np.int64(out.size), key, offset))

    def _uniform_fill_at(self, out, base, delta):
        self._launch("uniform_fill_at", out.size, (out, np.int64(out.size), base, delta))

    def _rng_base_set(self, base, key, offset):
        self._fn("rng_base_set")((1,), (1,), (base, key, offset))

    def synchronize(self) -> None:
        self.xp.cuda.runtime.deviceSynchronize()

    # --- the host a step ahead (contract: `asynchronous`) -----------------------------------------------
    asynchronous = True

    def read_scalars_later(self, values):
        """The scalars stacked on the device and copied to pinned memory on a side stream (`readback`)."""
        if self._readback is None:
            from pydtnn.backends.gpu.readback import Readback
            self._readback = Readback(self.xp, self.device)
        return self._readback.start(self.stacked_scalars(values))

    # --- CUDA graphs (contract: `capture`) ---------------------------------------------------------------
    graphs = True

    def capture(self, fn, inputs):
        """`fn(*inputs)` as a CUDA graph (`graphs.capture`)."""
        from pydtnn.backends.gpu.graphs import capture
        return capture(self, fn, inputs)

    def capture_warmup(self):
        """The block runs on the stream captures use, drawing as a graph draws (`graphs.warmup`)."""
        from pydtnn.backends.gpu.graphs import warmup
        return warmup(self)

    def workspaces(self) -> list:
        """The device buffers the libraries use as workspaces now: a capture holds them (`graphs`)."""
        return [self.conv.workspace.buf, self.cublas.workspace]

    def mark(self):
        """An event recorded on the compute stream."""
        event = self.xp.cuda.Event()
        event.record(self.xp.cuda.get_current_stream())
        return event

    def seconds_between(self, start, end) -> float:
        return self.xp.cuda.get_elapsed_time(start, end) / 1e3

    def conv_report(self) -> dict:
        """Which cuDNN implementation serves which convolution, with which plans (and why the legacy API)."""
        return self.conv.report()

    # --- helpers ------------------------------------------------------------------------------------
    def _c(self, a):
        return self.asarray(a)

    def _fn(self, name):
        fn = self._fns.get(name)
        if fn is None:
            fn = self._fns[name] = self.kernels.module(self.xp, self.dtype).get_function(name)
        return fn

    def _launch(self, name, total, args):
        self._fn(name)((self.kernels.grid(total),), (self.kernels.BLOCK,), args)

    def _launch_packed(self, name, total, arrays, args):
        """An element-wise kernel over `total` elements of `arrays`, in packs of 16 bytes where every array
        is 16-byte aligned and `total` a multiple of a pack (`kernels/common.py`); `args` end with idx32."""
        pack = 16 // self.dtype.itemsize
        packed = total % pack == 0 and all(a.data.ptr % 16 == 0 for a in arrays)
        self._fn(name)((self.kernels.grid(total // pack if packed else total),), (self.kernels.BLOCK,),
                       args[:-1] + (np.int32(packed), args[-1]))

    def _plane_launch(self, name, total, hw, args):
        """A per-channel pass over (n, c) planes of `hw` values: by (plane, chunk) pairs where planes are large
        (the block's channel known once), element by element otherwise (`kernels/common.py`,
        FOR_PLANE_CHUNKS); `args` end with idx32."""
        block = self.kernels.BLOCK
        if hw >= block:
            chunks = -(-hw // self.kernels.PLANE_CHUNK)
            grid = max(1, min(total // hw * chunks, 65535 * 8))
        else:
            chunks, grid = 0, self.kernels.grid(total)
        self._fn(name)((grid,), (block,), args[:-1] + (np.int32(chunks), args[-1]))

    def _scratch(self, owner, name, shape, dtype):
        """A device buffer kept between calls for `owner` (a layer's persistent array: its address names the
        layer; None: one shared buffer), e.g. a BatchNormalization's per-channel statistics, rewritten by its
        next call. Nothing here outlives what a layer keeps of its last call anyway (its ctx)."""
        key = (0 if owner is None else owner.data.ptr, name, tuple(shape), np.dtype(dtype).str)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = self.xp.empty(shape, dtype)
        return buf

    # --- inputs -----------------------------------------------------------------------------------------
    def input_pipeline(self):
        """Batches sent to the device by an asynchronous copy from pinned memory (`inputs.DeviceInputs`)."""
        from pydtnn.backends.gpu.inputs import DeviceInputs
        return DeviceInputs(self.xp, self.device)

    def one_hot(self, labels, nclasses):
        """Integer labels (the device's or the host's) -> one-hot targets on the device: rows of a cached
        identity matrix, one gather."""
        eye = self._buffers.get(("eye", nclasses))
        if eye is None:
            eye = self._buffers[("eye", nclasses)] = self.xp.eye(nclasses, dtype=self.dtype)
        return eye[self.xp.asarray(labels)]
