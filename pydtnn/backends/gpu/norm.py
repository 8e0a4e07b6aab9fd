"""The GPU backend's batch normalization: our own kernels (`kernels/norm.py`), not cuDNN's.

Per-channel partial sums in double with a shifted one-pass variance (the CPU backend's formulation, so both
backends agree to rounding), one pass for the output and one for dx, the biased batch variance returned.
Chosen over the cuDNN frontend's batchnorm because it also covers float64 and 2-D inputs, needs no graph per
shape and no host-scalar wrappers for epsilon and momentum, and keeps the exact semantics in view.

What a step of ResNet-50 showed on the H200 shaped the rest: a ReLU after the normalization runs inside
its output pass (`relu=True`) and its mask inside the backward's two passes (`relu_y`: recomputed from x, no
array of it read); another path's gradient is added in the backward's last pass (`addend`); the running
statistics are updated inside the finalize kernel (`running`); dgamma and dbeta are written where the
caller says (`out`: the model's flat gradient buffer); and the per-channel vectors live in buffers kept per
layer (keyed by its gamma's address), not allocated anew every step. A synchronized BatchNorm (`sync`)
reduces its sums over the replicas between the kernels.
"""
from __future__ import annotations

import numpy as np

from pydtnn.errors import ShapeError

_SLICE_BLOCKS = 528          # about 4 blocks per SM of an H100/H200 in all


class BatchNormKernels:
    """Mixed into `GPUBackend`."""
    fuses_relu = True            # relu= / relu_y=: a following ReLU runs inside the normalization's passes

    def _slices(self, c, m, hw=1):
        """Blocks per channel of the partial-sum kernels: about `_SLICE_BLOCKS` in all, each with work (where
        planes are large, `bn_partial` gives a slice whole planes: at most one slice a plane)."""
        s = max(1, min(-(-_SLICE_BLOCKS // c), -(-m // self.kernels.BLOCK)))
        return int(min(s, max(1, m // hw)) if hw >= self.kernels.BLOCK else s)

    def _bn_geometry(self, x, gamma, what):
        x = self._c(x)
        if x.ndim not in (2, 4):
            raise ShapeError(f"{what} expects a 2-D (N, C) or 4-D NCHW array, got shape {x.shape}")
        c = x.shape[1]
        if int(np.prod(gamma.shape)) != c:
            raise ShapeError(f"{what}: input has {c} channels but gamma has {int(np.prod(gamma.shape))}")
        hw = int(np.prod(x.shape[2:])) if x.ndim == 4 else 1
        return x, c, hw, x.size // max(c, 1)

    def _bn_partial(self, x, dy, mean64, scale64, beta, c, hw, m, mode, owner):
        """Per-channel partial sums (see `kernels/norm.py`; mode 0 forward, 1 backward, 2 backward through the
        fused ReLU): returns (partials, number of slices). One block per (channel, slice), all on gridDim.x."""
        s = self._slices(c, m, hw)
        part = self._scratch(owner, "bn_part", (c * s * 2,), np.float64)
        nothing = part                                   # forward: the kernel reads x's first values instead
        self._fn("bn_partial")((c * s,), (self.kernels.BLOCK,),
                               (x, dy, nothing if mean64 is None else mean64, nothing if scale64 is None else scale64,
                                beta, part, np.int64(m), np.int32(c), np.int32(hw), np.int32(s), np.int32(mode),
                                self.kernels.index32(x.size)))
        return part, s

    def _bn_apply(self, x, mean64, scale64, beta, hw, c, relu):
        y = self.xp.empty_like(x)
        self._plane_launch("bn_apply", x.size, hw, (x, mean64, scale64, beta, y, np.int64(x.size), np.int32(hw),
                                                    np.int32(c), np.int32(bool(relu)), self.kernels.index32(x.size)))
        return y

    def _per_channel(self, name, c, args):
        self._fn(name)((-(-c // 128),), (128,), args)

    def _momentum_args(self, running, n):
        """The running-statistics arguments of bn_finalize_fwd: arrays, then momentum, 1 - momentum and the
        unbiasing factor as the layer's float operations round them (in the data's dtype)."""
        if running is None:
            dummy = self._scratch(None, "no_running", (1,), self.dtype)
            one = self.dtype.type(1)
            return dummy, dummy, one, one, one, np.int32(0)
        mean, var, momentum = running
        t = self.dtype.type
        return (mean, var, t(momentum), t(1 - momentum), t(n / max(n - 1, 1)), np.int32(1))

    def batchnorm_forward_train(self, x, gamma, beta, eps: float, sync=None, center=None, relu=False, known=None,
                                running=None):
        if known is not None:
            raise ValueError("batchnorm_forward_train: the GPU backend does not take known moments "
                             "(reuses_bn_moments is False)")
        x, c, hw, m = self._bn_geometry(x, gamma, "batchnorm_forward_train")
        if m == 0:
            raise ShapeError("batchnorm_forward_train: empty batch")
        gamma, beta = self._c(gamma).reshape(-1), self._c(beta).reshape(-1)
        part, s = self._bn_partial(x, x, None, None, beta, c, hw, m, 0, gamma)
        if sync is not None:
            return self._bn_forward_synced(x, gamma, beta, eps, part, m, hw, sync, center, relu, running)
        vec = lambda name, dt: self._scratch(gamma, name, (c,), dt)      # noqa: E731
        mean, var = vec("mean", self.dtype), vec("var", self.dtype)
        mean64, scale64, invstd64 = vec("mean64", np.float64), vec("scale64", np.float64), vec("invstd64", np.float64)
        self._per_channel("bn_finalize_fwd", c, (part, x, gamma, np.int32(c), np.int32(hw), np.int32(s),
                                                 np.float64(m), np.float64(eps), mean, var, mean64, scale64,
                                                 invstd64) + self._momentum_args(running, m))
        y = self._bn_apply(x, mean64, scale64, beta, hw, c, relu)
        return y, mean, var, (x, mean64, invstd64, gamma, hw, m, scale64, beta, bool(relu))

    def _bn_forward_synced(self, x, gamma, beta, eps, part, m, hw, sync, center, relu, running):
        """Global-batch statistics: the partial sums (about each channel's first element, as the kernel
        takes them) are added up here, reduced over replicas by `sync`, and finalized in float64."""
        cp = self.xp
        c = gamma.shape[0]
        t = part.reshape(c, -1, 2).sum(axis=1)
        shift = (x[0, :, 0, 0] if x.ndim == 4 else x[0, :]).astype(np.float64)
        centre = cp.asarray(center, dtype=np.float64).reshape(-1)
        t1, t2, count = sync.forward_moments(cp, t[:, 0], t[:, 1], m, shift, centre)
        d1 = t1 / count
        mean64 = centre + d1
        var64 = cp.maximum(t2 / count - d1 * d1, 0.0)
        invstd64 = 1.0 / cp.sqrt(var64 + eps)
        scale64 = gamma.astype(np.float64) * invstd64
        y = self._bn_apply(x, mean64, scale64, beta, hw, c, relu)
        mean, var = mean64.astype(self.dtype), var64.astype(self.dtype)
        if running is not None:
            self.update_running_stats(running, mean, var, count)
        return y, mean, var, (x, mean64, invstd64, gamma, hw, count, scale64, beta, bool(relu))

    def batchnorm_forward_infer(self, x, gamma, beta, mean, var, eps: float, relu=False):
        cp = self.xp
        x, c, hw, m = self._bn_geometry(x, gamma, "batchnorm_forward_infer")
        mean64 = cp.asarray(mean, dtype=np.float64).reshape(-1)
        scale64 = cp.asarray(gamma, dtype=np.float64).reshape(-1) / cp.sqrt(
            cp.asarray(var, dtype=np.float64).reshape(-1) + eps)
        return self._bn_apply(x, mean64, scale64, self._c(beta).reshape(-1), hw, c, relu)

    def batchnorm_backward(self, dy, ctx, sync=None, relu_y=None, addend=None, out=None):
        """`relu_y`: the output of the ReLU fused after this normalization (dy is the gradient after it); its
        mask is recomputed from x where the forward ran fused, else that ReLU's backward runs first. `addend`:
        another path's gradient of x, added to dx in the same pass. `out`: (dgamma, dbeta) arrays to write."""
        cp = self.xp
        x, mean64, invstd64, gamma, hw, count, scale64, beta, fused = ctx
        dy = self._c(dy)
        if dy.shape != x.shape:
            raise ShapeError(f"batchnorm_backward: dy has shape {dy.shape}, expected {x.shape}")
        if addend is not None and tuple(addend.shape) != x.shape:
            raise ShapeError(f"batchnorm_backward: addend has shape {tuple(addend.shape)}, expected {x.shape}")
        relu = relu_y is not None
        if relu and not fused:                 # the forward ran unfused: the ReLU's backward first
            dy, relu = self.relu_backward(dy, relu_y), False
        c = x.shape[1]
        m = x.size // c
        part, s = self._bn_partial(x, dy, mean64, scale64, beta, c, hw, m, 2 if relu else 1, gamma)
        dgamma, dbeta = out if out is not None else (cp.empty(c, self.dtype), cp.empty(c, self.dtype))
        vec = lambda name: self._scratch(gamma, name, (c,), np.float64)      # noqa: E731
        if sync is None:
            k1, k2, k3 = vec("k1"), vec("k2"), vec("k3")
            self._per_channel("bn_finalize_bwd", c, (part, invstd64, gamma, np.int32(c), np.int32(s),
                                                     np.float64(m), k1, k2, k3, dgamma, dbeta))
        else:       # this replica's dgamma, dbeta; dx from the sums over every replica
            t = part.reshape(c, -1, 2).sum(axis=1)
            dgamma[...] = (t[:, 1] * invstd64).astype(self.dtype)
            dbeta[...] = t[:, 0].astype(self.dtype)
            sdy, sdyx = sync.backward_sums(cp, t[:, 0], t[:, 1])
            g = gamma.astype(np.float64)
            k1 = g * invstd64
            k2 = -g * invstd64 ** 3 * sdyx / count
            k3 = -k1 * sdy / count
        dx = cp.empty_like(x)
        add = self._c(addend) if addend is not None else dx
        self._plane_launch("bn_apply_bwd", x.size, hw,
                           (dy, x, mean64, k1, k2, k3, scale64, beta, add, dx, np.int64(x.size), np.int32(hw),
                            np.int32(c), np.int32(relu), np.int32(addend is not None), self.kernels.index32(x.size)))
        return dx, dgamma, dbeta
