"""CUDA kernels of the GPU backend (CuPy RawModule / ElementwiseKernel), compiled once per dtype.

Pooling (NCHW, one plane = H*W contiguous values per (n, c)):
- forward: one thread per output; max keeps the FIRST arg-max in window order (row by row), padding is
  -inf; avg divides by kh*kw (padded zeros count), as the CPU backend does;
- backward: one thread per INPUT element gathers the outputs whose window covers it (no atomics,
  deterministic, overlapping windows included); max adds dy where the stored arg-max is this element.
Batch normalization (channel c of element (n, c, p), p < HW; 2-D (N, C) input is HW = 1):
- `bn_partial`: per (channel, slice) block partial sums in double: sum(x - shift), sum((x - shift)^2)
  with shift = the channel's first value (a stable one-pass variance), or in backward mode sum(dy) and
  sum(dy * (x - mean));
- `bn_finalize_fwd` / `bn_finalize_bwd`: one thread per channel adds the partials and computes the
  per-channel coefficients; `bn_apply` / `bn_apply_bwd`: element-wise y = (x - mean) * scale + beta and
  dx = k1 dy + k2 (x - mean) + k3, in double.

NOT RUN ON HARDWARE (written on a machine without a GPU); tests/test_gpu_backend.py checks every kernel
against the CPU backend on the device.
"""
from __future__ import annotations

import numpy as np

_SOURCE = r"""
#define GRID_LOOP(i, n) for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
                             i += (long long)blockDim.x * gridDim.x)

extern "C" __global__ void pool_fwd(const T* x, T* y, int* idx, long long total, int H, int W, int Ho, int Wo,
                                    int kh, int kw, int sh, int sw, int ph, int pw, int is_max) {
    GRID_LOOP(o, total) {
        int wo = (int)(o % Wo);
        long long t = o / Wo;
        int ho = (int)(t % Ho);
        long long nc = t / Ho;
        const T* xp = x + nc * H * W;
        T best = 0;
        int bi = -1;
        for (int i = 0; i < kh; ++i) {
            int h = ho * sh - ph + i;
            if (h < 0 || h >= H) continue;
            for (int j = 0; j < kw; ++j) {
                int w = wo * sw - pw + j;
                if (w < 0 || w >= W) continue;
                T v = xp[h * W + w];
                if (is_max) {
                    if (bi < 0 || v > best) { best = v; bi = h * W + w; }
                } else {
                    best += v;
                }
            }
        }
        if (is_max) {
            y[o] = bi < 0 ? (T)__longlong_as_double(0xfff0000000000000ULL) : best;   // -inf
            idx[o] = bi;
        } else {
            y[o] = best * (T)(1.0 / (kh * kw));
        }
    }
}

extern "C" __global__ void pool_bwd(const T* dy, const int* idx, T* dx, long long total, int H, int W,
                                    int Ho, int Wo, int kh, int kw, int sh, int sw, int ph, int pw, int is_max) {
    GRID_LOOP(q, total) {
        int w = (int)(q % W);
        long long t = q / W;
        int h = (int)(t % H);
        long long nc = t / H;
        int me = h * W + w;
        int a = h + ph - kh + 1, b = w + pw - kw + 1;
        int ho0 = a <= 0 ? 0 : (a + sh - 1) / sh, ho1 = min((h + ph) / sh, Ho - 1);
        int wo0 = b <= 0 ? 0 : (b + sw - 1) / sw, wo1 = min((w + pw) / sw, Wo - 1);
        long long base = nc * Ho * Wo;
        T acc = 0;
        for (int ho = ho0; ho <= ho1; ++ho) {
            for (int wo = wo0; wo <= wo1; ++wo) {
                long long o = base + (long long)ho * Wo + wo;
                if (!is_max || idx[o] == me) acc += dy[o];
            }
        }
        dx[q] = is_max ? acc : acc * (T)(1.0 / (kh * kw));
    }
}

extern "C" __global__ void bn_partial(const T* x, const T* dy, const double* shift, double* part, long long M,
                                      int C, int HW, int S, int backward) {
    __shared__ double s1[256];
    __shared__ double s2[256];
    int c = blockIdx.y, s = blockIdx.x, tid = threadIdx.x;
    double sh = backward ? shift[c] : (double)x[(long long)c * HW];
    double a1 = 0.0, a2 = 0.0;
    for (long long j = (long long)s * blockDim.x + tid; j < M; j += (long long)S * blockDim.x) {
        long long n = j / HW;
        long long off = (n * C + c) * HW + (j - n * HW);
        double d = (double)x[off] - sh;
        if (backward) {
            double g = (double)dy[off];
            a1 += g;
            a2 += g * d;
        } else {
            a1 += d;
            a2 += d * d;
        }
    }
    s1[tid] = a1;
    s2[tid] = a2;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (tid < k) { s1[tid] += s1[tid + k]; s2[tid] += s2[tid + k]; }
        __syncthreads();
    }
    if (tid == 0) {
        part[2 * ((long long)c * S + s)] = s1[0];
        part[2 * ((long long)c * S + s) + 1] = s2[0];
    }
}

extern "C" __global__ void bn_finalize_fwd(const double* part, const T* x, const T* gamma, int C, int HW, int S,
                                           double m, double eps, T* mean_out, T* var_out, double* mean64,
                                           double* scale64, double* invstd64) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double t1 = 0.0, t2 = 0.0;
    for (int s = 0; s < S; ++s) {
        t1 += part[2 * ((long long)c * S + s)];
        t2 += part[2 * ((long long)c * S + s) + 1];
    }
    double d1 = t1 / m;
    double mean = (double)x[(long long)c * HW] + d1;
    double var = fmax(t2 / m - d1 * d1, 0.0);
    double invstd = 1.0 / sqrt(var + eps);
    mean_out[c] = (T)mean;
    var_out[c] = (T)var;
    mean64[c] = mean;
    scale64[c] = (double)gamma[c] * invstd;
    invstd64[c] = invstd;
}

extern "C" __global__ void bn_finalize_bwd(const double* part, const double* invstd64, const T* gamma, int C,
                                           int S, double m, double* k1, double* k2, double* k3, T* dgamma,
                                           T* dbeta) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double sdy = 0.0, sdyx = 0.0;
    for (int s = 0; s < S; ++s) {
        sdy += part[2 * ((long long)c * S + s)];
        sdyx += part[2 * ((long long)c * S + s) + 1];
    }
    double g = (double)gamma[c], is = invstd64[c];
    k1[c] = g * is;
    k2[c] = -g * is * is * is * sdyx / m;
    k3[c] = -g * is * sdy / m;
    dgamma[c] = (T)(sdyx * is);
    dbeta[c] = (T)sdy;
}
"""

_CTYPES = {"float32": "float", "float64": "double"}
_MODULES = {}
_ELEMENTWISE = {}


def module(cupy, dtype):
    """The RawModule of `_SOURCE` for `dtype` (float32 / float64), compiled once per process."""
    name = np.dtype(dtype).name
    mod = _MODULES.get(name)
    if mod is None:
        mod = _MODULES[name] = cupy.RawModule(code=f"typedef {_CTYPES[name]} T;\n" + _SOURCE)
    return mod


def elementwise(cupy):
    """bn_apply(x, mean64, scale64, beta, HW, C) -> y and bn_apply_bwd(dy, x, mean64, k1, k2, k3, HW, C) -> dx."""
    if not _ELEMENTWISE:
        _ELEMENTWISE["bn_apply"] = cupy.ElementwiseKernel(
            "T x, raw float64 mean, raw float64 scale, raw T beta, int64 HW, int64 C", "T y",
            "long long c = (i / HW) % C; y = (T)(((double)x - mean[c]) * scale[c] + (double)beta[c]);",
            "pydtnn_bn_apply")
        _ELEMENTWISE["bn_apply_bwd"] = cupy.ElementwiseKernel(
            "T dy, T x, raw float64 mean, raw float64 k1, raw float64 k2, raw float64 k3, int64 HW, int64 C",
            "T dx",
            "long long c = (i / HW) % C; "
            "dx = (T)(k1[c] * (double)dy + k2[c] * ((double)x - mean[c]) + k3[c]);",
            "pydtnn_bn_apply_bwd")
    return _ELEMENTWISE
