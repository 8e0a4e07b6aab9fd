"""Convolutions in plain NumPy (`sliding_window_view` + `tensordot`), where numba cannot call NumPy's BLAS
(NumPy linked to another BLAS than its wheels' OpenBLAS, see `runtime.blas`): correct, several times
slower. `NumpyConvKernels`, mixed into `conv.ConvKernels`, which takes this path when `use_blas_kernels` is
False (tests set it to compare against the fast paths).
"""
from __future__ import annotations

import warnings

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pydtnn.backends.contract import ConvSpec
from pydtnn.backends.cpu.runtime import blas

_warned = []


def _warn_fallback():
    if not blas.GEMM_OK and not _warned:
        _warned.append(True)
        # stacklevel: the caller of the backend's conv2d_forward
        warnings.warn("pydtnn cpu backend: NumPy's BLAS is not the OpenBLAS of NumPy's wheels, so convolutions "
                      "use a plain NumPy path (correct but several times slower)", RuntimeWarning, stacklevel=4)


class NumpyConvKernels:
    """The NumPy convolution: a windows view (N, Ho, Wo, C, kh, kw) of the padded input, contracted."""

    def _numpy_forward(self, x, w, bias, y, spec: ConvSpec):
        _warn_fallback()
        _, ho, wo, _ = y.shape
        y[...] = np.tensordot(self._windows(x, spec, ho, wo), self._c(w), axes=([3, 4, 5], [1, 2, 3]))
        if bias.size:
            y += bias

    def _numpy_backward_data(self, dy, w, dx, spec: ConvSpec):
        """dx of conv(x, w), in a new array (`dx` gives the shape)."""
        w = self._c(w)
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        n, h, wd, c = dx.shape
        _, ho, wo, _ = dy.shape
        dcol = np.tensordot(dy, w, axes=([3], [0]))                          # (N, Ho, Wo, C, kh, kw)
        dxp = np.zeros((n, h + 2 * ph + sh, wd + 2 * pw + sw, c), self.dtype)
        for i in range(kh):
            for j in range(kw):
                dxp[:, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw] += dcol[..., i, j]
        return np.ascontiguousarray(dxp[:, ph:ph + h, pw:pw + wd])

    def _numpy_backward_weights(self, x, dy, spec: ConvSpec, with_bias):
        _, ho, wo, k = dy.shape
        dwu = np.tensordot(dy, self._windows(x, spec, ho, wo), axes=([0, 1, 2], [0, 1, 2]))
        db = dy.reshape(-1, k).sum(axis=0) if with_bias else None
        return np.ascontiguousarray(dwu, dtype=self.dtype), db

    def _windows(self, x, spec: ConvSpec, ho, wo):
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = spec.kernel, spec.stride, spec.padding, spec.dilation
        xp = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)))
        win = sliding_window_view(xp, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(1, 2))
        return win[:, :sh * (ho - 1) + 1:sh, :sw * (wo - 1) + 1:sw, :, ::dh, ::dw]
