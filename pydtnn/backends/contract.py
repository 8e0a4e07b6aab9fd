"""The backend contract: the `Backend` base class every backend implements, and the static parameters
(`ConvSpec`, `PoolSpec`) its kernels take. One kernel library per device, chosen per model (no
process-wide global; `pydtnn.backends.get_backend` makes one).

A backend object carries
- `name`: "cpu" or "gpu";
- `xp`: the array module (numpy or cupy); layers do their element-wise math with it;
- `dtype`: the floating dtype of parameters and activations;
- `layout`: the INTERNAL layout of 4-D activations, "NHWC" (CPU: channels contiguous, so a convolution
  is a GEMM over channels) or "NCHW". Users never see it: `to_internal`/`to_user` convert at the edges
  of the model (Input, Flatten, model outputs) and around user layers (those without
  `internal_layout = True`, see pydtnn/layers/base.py), so weights, Flatten's order, checkpoints and
  custom layers are NCHW everywhere;
- `rng`: a seeded random generator (dropout masks, augmentation on device);
- the heavy kernels below.

Kernel conventions
- `x`, `y`, `dy`, `dx` are 4-D arrays in the backend's internal layout.
- Convolution weights are in the user layout (K, C // groups, kh, kw); returned `dw` too.
- `ConvSpec` / `PoolSpec` hold the static parameters; a layer builds one at `initialize` time, and a
  backend may cache plans or buffers keyed by it.
- A forward kernel returns `(y, ctx)`; `ctx` is opaque and handed back to the backward kernels
  (im2col columns, argmax indices, cuDNN descriptors...).
- The sequence layers' kernels (`softmax`, `softmax_backward`, `attention_forward`, `attention_backward`,
  `erfc`, `scatter_add_rows`) have device-independent defaults here, written with `xp`; a backend
  overrides them where it has a faster kernel (the CPU's numba row softmax and fused attention). A
  kernel taking 4-D images must also be listed in `nchw_view.IMAGE_KERNELS`, which the gradient checker
  uses to run layers in NCHW on any backend.
- Every optional keyword a kernel takes is declared here, on the base class, with its meaning. A keyword
  that only some backends honour is tied to a capability (a class attribute, False here): callers pass it
  only where the backend sets that capability (`fuses_relu`, `reuses_bn_moments`).
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass

import numpy as np

from pydtnn.errors import ConfigError, ShapeError


def parse_dtype(dtype, backend_name: str):
    """The backend's floating dtype: float32 or float64 (a ConfigError for anything else)."""
    import numpy as np
    try:
        dt = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        dt = None
    if dt is None or dt.type not in (np.float32, np.float64):
        raise ConfigError(f"unsupported dtype {dtype!r} for the {backend_name} backend: choose 'float32' or 'float64'")
    return dt


@dataclass(frozen=True)
class ConvSpec:
    """Static parameters of a 2-D convolution (all pairs are (height, width))."""
    in_channels: int
    out_channels: int
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)      # symmetric zero padding
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1                        # 1, or in_channels for depthwise (then out_channels == in_channels)

    def output_hw(self, h: int, w: int) -> tuple[int, int]:
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel, self.stride, self.padding, self.dilation
        return ((h + 2 * ph - dh * (kh - 1) - 1) // sh + 1,
                (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1)


@dataclass(frozen=True)
class PoolSpec:
    """Static parameters of a 2-D pooling. Average pooling counts padded zeros (like PyTorch's default)."""
    kind: str                              # "max" or "avg"
    pool: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int] = (0, 0)

    def output_hw(self, h: int, w: int) -> tuple[int, int]:
        (kh, kw), (sh, sw), (ph, pw) = self.pool, self.stride, self.padding
        return (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1


class HostInputs:
    """`Backend.input_pipeline` where batches stay in host memory: hands them over as they are."""

    def put(self, *arrays):
        return arrays

    def get(self, ticket):
        return ticket

    def done(self, ticket):
        pass


class ReadScalars:
    """Numbers read already (`Backend.read_scalars_later` of a backend that runs as it is called)."""
    __slots__ = ("values",)

    def __init__(self, values):
        self.values = values

    def result(self) -> np.ndarray:
        return self.values


class CaptureFailed(Exception):
    """A call `Backend.capture` could not capture (the reason, one line); the caller runs it as it is."""


class Backend:
    """Methods every backend implements. See the module docstring for the conventions."""
    name: str
    layout: str

    def __init__(self, dtype="float32", seed: int = 0):
        raise NotImplementedError

    # --- arrays -------------------------------------------------------------------------------------
    def asarray(self, a):                  # host or device array -> device array of self.dtype
        raise NotImplementedError

    def to_numpy(self, a):                 # device array -> numpy array
        raise NotImplementedError

    def input_pipeline(self):
        """What takes a rank's next batch to this backend while the current step computes: `put(*host arrays)`
        (the prefetch thread) -> a ticket, `get(ticket)` -> the arrays where the step reads them, `done(ticket)`
        after the step. Here (host memory) the arrays themselves; the GPU's copies asynchronously."""
        return HostInputs()

    def one_hot(self, labels, nclasses):
        """Integer labels (N,) or (N, T) -> one-hot targets (N, [T,] nclasses) in this backend's dtype, the
        values `pydtnn.targets.one_hot` gives (the labels checked before: they are in 0..nclasses - 1)."""
        xp = self.xp
        labels = xp.asarray(labels)
        out = xp.zeros(labels.shape + (nclasses,), dtype=self.dtype)
        out.reshape(-1, nclasses)[xp.arange(labels.size), labels.reshape(-1)] = 1
        return out

    def read_scalars(self, values):
        """Scalars of this backend (a loss, metrics: 0-d arrays or floats) as one float64 host array, in ONE
        device-to-host read: on a GPU the step's only wait for the device's results."""
        return np.asarray(self.to_numpy(self.stacked_scalars(values)), dtype=np.float64)

    def stacked_scalars(self, values):
        """Scalars of this backend as one 1-D float64 array of this backend (what one read takes)."""
        xp = self.xp
        return xp.stack([xp.asarray(v, dtype=np.float64).reshape(()) for v in values])

    # --- the host a step ahead of the device ---------------------------------------------------------
    # asynchronous: work is queued on a device and runs later, so the launcher's loop reads a step's loss,
    # metrics and compute time one step late and never waits for the device inside a step
    # (`pydtnn.parallel.lagged_step`); False where work runs as it is called (NumPy)
    asynchronous = False

    def read_scalars_later(self, values):
        """`read_scalars` begun now, its numbers given by the handle's `result()` (which then waits, if the
        device has not got there yet). Here (host memory) read at once."""
        return ReadScalars(self.read_scalars(values))

    def mark(self):
        """A point in this backend's work; `seconds_between` two of them, once the later one is reached (a
        GPU's: device time, by events; here the host's clock, the work being done when called)."""
        return time.perf_counter()

    def seconds_between(self, start, end) -> float:
        return end - start

    # --- graphs: a call captured once, replayed with one launch (`pydtnn.backends.gpu.graphs`) ---------------
    graphs = False                         # whether `capture` can
    capturing = False                      # True while `capture` records: a check that reads the device skips

    def capture(self, fn, inputs):
        """`fn(*inputs)` captured: `.replay(inputs)` runs it again on new inputs of the same shapes and returns
        its outputs. CaptureFailed (the reason) where it cannot be; here always. Run `fn` eagerly inside
        `capture_warmup()` just before: what it creates on first use then exists before the capture."""
        raise CaptureFailed(f"the {self.name} backend has no graphs")

    def capture_warmup(self):
        """A context for a call's last eager run before its capture, which it runs as the capture will (a GPU's:
        on the stream captures use); here nothing changes."""
        return contextlib.nullcontext()

    def to_internal(self, x_nchw):         # 4-D user NCHW -> internal layout (may be a view)
        raise NotImplementedError

    def to_user(self, x):                  # 4-D internal layout -> user NCHW (may be a view)
        raise NotImplementedError

    @property
    def channel_axis(self) -> int:         # axis of channels in a 4-D internal array
        return 3 if self.layout == "NHWC" else 1

    def internal_shape(self, n: int, chw: tuple[int, int, int]) -> tuple[int, int, int, int]:
        c, h, w = chw
        return (n, h, w, c) if self.layout == "NHWC" else (n, c, h, w)

    def _check4(self, x, what):
        if x.ndim != 4:
            raise ShapeError(f"{what} expects a 4-D {self.layout} array, got shape {x.shape}")

    @staticmethod
    def _out_hw(spec, h, w, what):
        ho, wo = spec.output_hw(h, w)
        if ho <= 0 or wo <= 0:
            raise ShapeError(f"{what}: input {h}x{w} is too small for {spec} (output {ho}x{wo})")
        return ho, wo

    def seed(self, seed: int) -> None:     # reseed self.rng
        raise NotImplementedError

    def synchronize(self) -> None:         # wait for queued device work (timing); no-op on the CPU
        pass

    # --- convolution --------------------------------------------------------------------------------
    # fuses_conv_relu: conv2d_forward takes relu=True (y = relu(conv(x, w) + b), the bias and the ReLU in one
    # pass) and bias_relu_backward runs that ReLU's backward with the bias's gradient in one pass: a Conv2D
    # followed by a Relu then runs as a pair (pydtnn/execution/relu_fusion.py), where this is True.
    fuses_conv_relu = False

    def conv2d_forward(self, x, w, b, spec: ConvSpec, relu=False):
        """y = conv(x, w) + b (b may be None), relu(y) with ``relu`` (only where `fuses_conv_relu`).
        Returns (y, ctx)."""
        raise NotImplementedError

    def conv2d_backward_data(self, dy, w, ctx, spec: ConvSpec):
        """dL/dx, same shape as the forward x."""
        raise NotImplementedError

    def conv2d_backward_weights(self, dy, ctx, spec: ConvSpec, with_bias: bool, out=None):
        """(dw, db): dw shaped like w (K, C // groups, kh, kw); db (K,) or None. ``out``: (dw, db) arrays
        to write them into (db None without a bias), e.g. views of the model's flat gradient buffer; they
        are returned then."""
        raise NotImplementedError

    def bias_relu_backward(self, dy, y, db_out=None):
        """(g, db) for a convolution whose bias and ReLU ran in one pass (conv2d_forward(relu=True)): g = dy
        masked by the ReLU's output y (the gradient of the convolution's output), db = g summed over every
        axis but the channels' (None when ``db_out`` is None: no bias), written into ``db_out``."""
        g = self.relu_backward(dy, y)
        if db_out is None:
            return g, None
        axis = self.channel_axis if g.ndim == 4 else g.ndim - 1
        db_out[...] = g.sum(axis=tuple(a for a in range(g.ndim) if a != axis))
        return g, db_out

    @staticmethod
    def into(results, out):
        """`results` (arrays or None), or, with ``out`` (arrays or None, one each), each copied into its
        `out` array, which are returned: kernels that cannot write into the caller's arrays directly."""
        if out is None:
            return results
        for r, o in zip(results, out):
            if o is not None and r is not o:
                o[...] = r
        return tuple(out)

    def conv2d_context(self, x):
        """The ctx `conv2d_forward(x, ...)` returns, without computing y: the transposed convolution
        (ConvTranspose2D) runs `conv2d_backward_data` as its forward and needs the ctx of a convolution
        whose input it has not computed yet (then `x` is an empty array of that shape). Every backend's
        convolution ctx is `(x,)` today; a backend whose ctx holds more overrides this."""
        return (x,)

    # --- pooling ------------------------------------------------------------------------------------
    def pool2d_forward(self, x, spec: PoolSpec):
        """Returns (y, ctx)."""
        raise NotImplementedError

    def pool2d_backward(self, dy, ctx, spec: PoolSpec):
        raise NotImplementedError

    # --- ReLU (layers call these; a backend may override them with faster kernels) ---------------------
    def relu_forward(self, x):
        """max(x, 0); NaN stays NaN."""
        return self.xp.maximum(x, 0)

    def relu_backward(self, dy, y, addend=None):
        """dL/dx of y = relu(x) from dy = dL/dy; with `addend`, from dy + addend (a gradient in two parts,
        summed in the same pass: `pydtnn.execution.sum_handoff`)."""
        return (dy if addend is None else dy + addend) * (y > 0)

    def add(self, a, b, relu=False):
        """a + b in a new array (relu(a + b) with `relu`): the merge of an AdditionBlock's paths. Every
        backend takes `relu` (this is its reference); the model asks for it where it fuses a Relu into
        the merge, which it does where `fuses_relu`."""
        y = self.xp.add(a, b)
        return self.xp.maximum(y, 0, out=y) if relu else y

    # --- element-wise and row kernels of the sequence layers (device-independent defaults) ------------
    def matmul(self, a, b, out=None):      # a @ b as numpy.matmul (FC, attention); the CPU backend threads it
        return self.xp.matmul(a, b, out=out)

    def linear(self, x, w, b=None):
        """x @ w + b for 2-D x and w (w may be a transposed view), b of w's columns or None: the FC and
        attention projections (the CPU backend writes b into the output rows before the product adds on)."""
        y = self.matmul(x, w)
        if b is not None:
            y += b
        return y

    def linear_weight_grads(self, x, dy, dw, db=None, out_in=False):
        """The weight and bias gradients of `linear` for 2-D x (rows, in) and dy (rows, out), into the given
        arrays: dw = x^T dy (in, out), or dy^T x (out, in) with `out_in` (weights stored as PyTorch's);
        db (None: no bias) = dy summed over rows."""
        if out_in:
            self.matmul(dy.T, x, out=dw)
        else:
            self.matmul(x.T, dy, out=dw)
        if db is not None:
            dy.sum(axis=0, out=db)

    def gelu_forward(self, x):
        """(y, ctx) of the exact GELU y = x Phi(x), Phi through erfc (accurate in both tails)."""
        cdf = 0.5 * self.erfc(x * x.dtype.type(-0.7071067811865476))
        return x * cdf, (x, cdf)

    def gelu_backward(self, dy, ctx):
        x, cdf = ctx
        pdf = self.xp.exp(-0.5 * x * x) * x.dtype.type(0.3989422804014327)      # 1 / sqrt(2 pi)
        return dy * (cdf + x * pdf)

    def layernorm_forward(self, x, gamma, beta, eps: float):
        """(y, ctx) of LayerNorm over the last axis: x_hat = (x - mean) / sqrt(var + eps), y = x_hat gamma + beta."""
        centred = x - x.mean(axis=-1, keepdims=True)
        inv_std = 1 / self.xp.sqrt((centred * centred).mean(axis=-1, keepdims=True) + x.dtype.type(eps))
        x_hat = centred * inv_std
        return x_hat * gamma + beta, (x_hat, inv_std)

    def layernorm_backward(self, dy, ctx, gamma):
        """(dx, dgamma, dbeta) of `layernorm_forward`."""
        x_hat, inv_std = ctx
        rows = tuple(range(dy.ndim - 1))
        g = dy * gamma
        dx = inv_std * (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True))
        return dx, (dy * x_hat).sum(axis=rows), dy.sum(axis=rows)

    def erfc(self, x):
        """The complementary error function, to double precision (GELU); see `pydtnn.backends.special`."""
        from pydtnn.backends.special import erfc
        return erfc(self.xp, x)

    def softmax(self, s, causal=False):
        """Softmax over the last axis of `s`, IN PLACE (s is a scratch array the caller owns), stable: the
        row maximum is subtracted first. `causal`: entries j > i of the last two axes (T, T) count as
        -inf (weight 0). Returns s. Attention calls it on (N, heads, T, T) scores."""
        xp = self.xp
        if causal:
            t = s.shape[-1]
            s += xp.where(xp.triu(xp.ones((t, t), dtype=bool), 1), -xp.inf, 0.0).astype(s.dtype)
        s -= s.max(axis=-1, keepdims=True)
        xp.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return s

    def softmax_backward(self, y, g):
        """dL/ds of y = softmax(s) over the last axis from g = dL/dy, IN PLACE in g (a scratch array the
        caller owns): y * (g - sum(g * y)). Returns g."""
        g -= (g * y).sum(axis=-1, keepdims=True)
        g *= y
        return g

    @staticmethod
    def _heads(a, n, t, heads):
        """(N T, D) -> (N, H, T, hd), a view."""
        return a.reshape(n, t, heads, a.shape[-1] // heads).transpose(0, 2, 1, 3)

    def attention_forward(self, qkv, n, t, heads, causal=False, mask=None):
        """Scaled dot-product attention of every (sample, head). qkv: (N T, 3D), the q, k, v projections
        side by side; mask: None, or (N, H, T, T) dropout factors applied to the attention weights.
        Returns (context (N T, D), attn (N, H, T, T): the softmax weights before dropout, which
        `attention_backward` takes back). As batched matmuls here; the CPU backend fuses a pair's work."""
        d = qkv.shape[1] // 3
        q, k, v = (self._heads(qkv[:, i * d:(i + 1) * d], n, t, heads) for i in range(3))
        scores = self.matmul(q, k.transpose(0, 1, 3, 2))
        scores *= scores.dtype.type(1 / math.sqrt(d // heads))
        attn = self.softmax(scores, causal=causal)
        context = self.matmul(attn if mask is None else attn * mask, v)
        return context.transpose(0, 2, 1, 3).reshape(n * t, d), attn

    def attention_backward(self, dcontext, qkv, attn, mask, n, t, heads):
        """dL/d qkv (N T, 3D) of `attention_forward` from dcontext = dL/d context (N T, D)."""
        xp, mm = self.xp, self.matmul
        d = qkv.shape[1] // 3
        q, k, v = (self._heads(qkv[:, i * d:(i + 1) * d], n, t, heads) for i in range(3))
        dctx = self._heads(dcontext, n, t, heads)
        dv = mm((attn if mask is None else attn * mask).transpose(0, 1, 3, 2), dctx)
        dattn = mm(dctx, v.transpose(0, 1, 3, 2))
        if mask is not None:
            dattn *= mask
        dscores = self.softmax_backward(attn, dattn)
        dscores *= dscores.dtype.type(1 / math.sqrt(d // heads))
        dq = mm(dscores, k)
        dk = mm(dscores.transpose(0, 1, 3, 2), q)
        return xp.concatenate([g.transpose(0, 2, 1, 3).reshape(n * t, d) for g in (dq, dk, dv)], axis=1)

    def scatter_add_rows(self, out, ids, rows):
        """out[ids[i]] += rows[i] for every i, repeated ids adding up (Embedding's weight gradient).
        NumPy's (and CuPy's) `add.at` where the array module has it; else a one-hot GEMM in chunks."""
        xp = self.xp
        at = getattr(getattr(xp, "add", None), "at", None)
        if at is not None:
            at(out, ids, rows)
            return out
        chunk = max(1, (1 << 22) // max(out.shape[0], 1))
        classes = xp.arange(out.shape[0])
        for start in range(0, len(ids), chunk):
            one_hot = (ids[start:start + chunk, None] == classes[None, :]).astype(out.dtype)
            out += self.matmul(one_hot.T, rows[start:start + chunk])
        return out

    # --- batch normalization (per channel; statistics over every other axis) -------------------------
    # Capabilities: the optional work a backend's batchnorm kernels do. Callers check them before passing
    # the keywords that need them; a backend that sets one takes every keyword it names.
    #
    # fuses_relu: batchnorm_forward_train and batchnorm_forward_infer take relu=True (the ReLU applied in
    # the same pass: y = relu(bn(x))) and batchnorm_backward takes relu_y (the gradient arriving after
    # that ReLU). The model then runs a BatchNormalization, or an AdditionBlock's merge (`add(relu=True)`,
    # which every backend takes), followed by a Relu as one pass over memory, keeping both layers
    # (pydtnn/execution/relu_fusion.py).
    fuses_relu = False
    # reuses_bn_moments: batchnorm_forward_train takes known= (moments summed before) and
    # batchnorm_moments(ctx) gives a training forward's own: a dense chain hands the moments of a layer's
    # input on to the next layer, whose input holds it (pydtnn/execution/concat_chain.py).
    reuses_bn_moments = False

    def update_running_stats(self, running, mean, var, count):
        """running = (mean, var, momentum): the running statistics, IN PLACE, from a batch's mean and biased
        variance (arrays of the data's dtype) over `count` rows: running = momentum running + (1 - momentum)
        batch, the variance unbiased by count / (count - 1). The reference every backend matches bit for bit
        (these very array operations, in this order)."""
        rm, rv, m = running
        rm *= m
        rm += (1 - m) * mean
        rv *= m
        rv += (1 - m) * var * (count / max(count - 1, 1))

    def batchnorm_forward_train(self, x, gamma, beta, eps: float, sync=None, center=None, relu=False, known=None,
                                running=None):
        """Returns (y, batch_mean, batch_var_biased, ctx).
        - ``running`` (every backend takes it): (mean, var, momentum) running statistics to update in place
          from this batch's, as `update_running_stats` does (the global batch's with ``sync``).
        - ``sync`` (a `pydtnn.parallel.sync_batchnorm.BatchNormSync`): the statistics are the global
          batch's: the local per-channel sums go through ``sync.forward_moments`` about ``center`` (the same
          on every replica).
        - ``relu`` (only where `fuses_relu`): y = relu(bn(x)); ctx keeps what batchnorm_backward's
          ``relu_y`` needs.
        - ``known`` (only where `reuses_bn_moments`, never with ``sync``): (mean, biased variance), float64,
          of x's last len(mean) channels in this batch, as `batchnorm_moments` gave them; only the
          channels in front of them are summed."""
        raise NotImplementedError

    def batchnorm_moments(self, ctx):
        """(mean, biased variance), float64, of the batch the training forward that made `ctx` normalized
        with. Only where `reuses_bn_moments`."""
        raise NotImplementedError

    def batchnorm_forward_infer(self, x, gamma, beta, mean, var, eps: float, relu=False):
        """y = gamma (x - mean) / sqrt(var + eps) + beta with the given (running) statistics; ``relu``
        (only where `fuses_relu`): relu(y)."""
        raise NotImplementedError

    def batchnorm_backward(self, dy, ctx, sync=None, relu_y=None, addend=None, out=None):
        """Returns (dx, dgamma, dbeta): dgamma and dbeta over this replica's rows (the gradient reduction
        adds them up).
        - ``out`` (every backend takes it): (dgamma, dbeta) arrays to write them into (the model's flat
          gradient buffer), returned then.
        - ``sync``: dx uses the sums over every replica (``sync.backward_sums``).
        - ``relu_y`` (only where `fuses_relu`): the output of the ReLU the forward applied (relu=True);
          dy is the gradient after that ReLU, and the ReLU's backward happens in the same pass.
        - ``addend`` (x's shape; every backend takes it): dx + addend, another path's gradient of x,
          summed in the same pass."""
        raise NotImplementedError
