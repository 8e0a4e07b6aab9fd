"""CUDA kernels of the GPU backend (one CuPy RawModule), compiled once per (device, dtype).

Index arithmetic: every kernel takes `idx32`, set by the caller when every index it computes (inputs and
outputs) is below 2**31; the kernels then divide in unsigned 32-bit, which is several times cheaper on the
GPU than the 64-bit divide they use otherwise (one body, templated on the index type).
Pooling (NCHW, one plane = H*W contiguous values per (n, c)):
- forward: one thread per output; max keeps the FIRST arg-max in window order (row by row), padding is
  -inf; avg divides by kh*kw (padded zeros count), as the CPU backend does;
- backward: one thread per INPUT element gathers the outputs whose window covers it (no atomics,
  deterministic, overlapping windows included); max adds dy where the stored arg-max is this element.
Batch normalization (channel c of element (n, c, p), p < HW; 2-D (N, C) input is HW = 1):
- `bn_partial`: one block per (channel, slice), both on gridDim.x (gridDim.y would cap channels at
  65,535): partial sums in double of (x - shift) and (x - shift)^2 with shift = the channel's first value
  (a stable one-pass variance), or in backward mode of dy and dy * (x - mean);
- `bn_finalize_fwd` / `bn_finalize_bwd`: one thread per channel adds the partials and computes the
  per-channel coefficients; `bn_apply` / `bn_apply_bwd`: element-wise y = (x - mean) * scale + beta and
  dx = k1 dy + k2 (x - mean) + k3, in double.
Random numbers (`uniform_fill`): counter-based, out[i] = SplitMix64 output number (offset + i) of the
stream keyed by the seed, so a generator's whole state is two integers (seed, offset) that a checkpoint
can save and restore (see `_gpu_random`).

NOT RUN ON HARDWARE (written on a machine without a GPU). tests/backends/test_gpu_backend.py checks every kernel
against the CPU backend, on a device and, compiled as C++ on the host, through the stand-in harness
(tests/gpu_standin).
"""
from __future__ import annotations

import numpy as np

_SOURCE = r"""
#define GRID_STRIDE(I, i, n) for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I)(n); \
                                  i += (I)blockDim.x * gridDim.x)
typedef unsigned int idx32_t;
typedef long long idx64_t;

template <typename I>
__device__ __forceinline__ void pool_fwd_body(const T* x, T* y, int* idx, I total, int H, int W, int Ho,
                                              int Wo, int kh, int kw, int sh, int sw, int ph, int pw,
                                              int is_max) {
    GRID_STRIDE(I, o, total) {
        int wo = (int)(o % (I)Wo);
        I t = o / (I)Wo;
        int ho = (int)(t % (I)Ho);
        I nc = t / (I)Ho;
        const T* xp = x + nc * (I)H * (I)W;
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

extern "C" __global__ void pool_fwd(const T* x, T* y, int* idx, long long total, int H, int W, int Ho, int Wo,
                                    int kh, int kw, int sh, int sw, int ph, int pw, int is_max, int idx32) {
    if (idx32) pool_fwd_body<idx32_t>(x, y, idx, (idx32_t)total, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, is_max);
    else pool_fwd_body<idx64_t>(x, y, idx, total, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, is_max);
}

template <typename I>
__device__ __forceinline__ void pool_bwd_body(const T* dy, const int* idx, T* dx, I total, int H, int W,
                                              int Ho, int Wo, int kh, int kw, int sh, int sw, int ph, int pw,
                                              int is_max) {
    GRID_STRIDE(I, q, total) {
        int w = (int)(q % (I)W);
        I t = q / (I)W;
        int h = (int)(t % (I)H);
        I nc = t / (I)H;
        int me = h * W + w;
        int a = h + ph - kh + 1, b = w + pw - kw + 1;
        int ho0 = a <= 0 ? 0 : (a + sh - 1) / sh, ho1 = min((h + ph) / sh, Ho - 1);
        int wo0 = b <= 0 ? 0 : (b + sw - 1) / sw, wo1 = min((w + pw) / sw, Wo - 1);
        I base = nc * (I)Ho * (I)Wo;
        T acc = 0;
        for (int ho = ho0; ho <= ho1; ++ho) {
            for (int wo = wo0; wo <= wo1; ++wo) {
                I o = base + (I)(ho * Wo + wo);
                if (!is_max || idx[o] == me) acc += dy[o];
            }
        }
        dx[q] = is_max ? acc : acc * (T)(1.0 / (kh * kw));
    }
}

extern "C" __global__ void pool_bwd(const T* dy, const int* idx, T* dx, long long total, int H, int W,
                                    int Ho, int Wo, int kh, int kw, int sh, int sw, int ph, int pw, int is_max,
                                    int idx32) {
    if (idx32) pool_bwd_body<idx32_t>(dy, idx, dx, (idx32_t)total, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, is_max);
    else pool_bwd_body<idx64_t>(dy, idx, dx, total, H, W, Ho, Wo, kh, kw, sh, sw, ph, pw, is_max);
}

template <typename I>
__device__ __forceinline__ void bn_partial_body(const T* x, const T* dy, const double* shift, double* part,
                                                I M, int C, int HW, int S, int backward) {
    __shared__ double s1[256];
    __shared__ double s2[256];
    int c = blockIdx.x / S, s = blockIdx.x % S, tid = threadIdx.x;
    double sh = backward ? shift[c] : (double)x[(I)c * (I)HW];
    double a1 = 0.0, a2 = 0.0;
    for (I j = (I)s * blockDim.x + tid; j < M; j += (I)S * blockDim.x) {
        I n = j / (I)HW;
        I off = (n * (I)C + (I)c) * (I)HW + (j - n * (I)HW);
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

// grid (C * S,), block (256,): block b is channel b / S, slice b % S
extern "C" __global__ void bn_partial(const T* x, const T* dy, const double* shift, double* part, long long M,
                                      int C, int HW, int S, int backward, int idx32) {
    if (idx32) bn_partial_body<idx32_t>(x, dy, shift, part, (idx32_t)M, C, HW, S, backward);
    else bn_partial_body<idx64_t>(x, dy, shift, part, M, C, HW, S, backward);
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

template <typename I>
__device__ __forceinline__ void bn_apply_body(const T* x, const double* mean, const double* scale,
                                              const T* beta, T* y, I total, int HW, int C) {
    GRID_STRIDE(I, i, total) {
        int c = (int)((i / (I)HW) % (I)C);
        y[i] = (T)(((double)x[i] - mean[c]) * scale[c] + (double)beta[c]);
    }
}

extern "C" __global__ void bn_apply(const T* x, const double* mean, const double* scale, const T* beta, T* y,
                                    long long total, int HW, int C, int idx32) {
    if (idx32) bn_apply_body<idx32_t>(x, mean, scale, beta, y, (idx32_t)total, HW, C);
    else bn_apply_body<idx64_t>(x, mean, scale, beta, y, total, HW, C);
}

template <typename I>
__device__ __forceinline__ void bn_apply_bwd_body(const T* dy, const T* x, const double* mean, const double* k1,
                                                  const double* k2, const double* k3, T* dx, I total, int HW,
                                                  int C) {
    GRID_STRIDE(I, i, total) {
        int c = (int)((i / (I)HW) % (I)C);
        dx[i] = (T)(k1[c] * (double)dy[i] + k2[c] * ((double)x[i] - mean[c]) + k3[c]);
    }
}

extern "C" __global__ void bn_apply_bwd(const T* dy, const T* x, const double* mean, const double* k1,
                                        const double* k2, const double* k3, T* dx, long long total, int HW,
                                        int C, int idx32) {
    if (idx32) bn_apply_bwd_body<idx32_t>(dy, x, mean, k1, k2, k3, dx, (idx32_t)total, HW, C);
    else bn_apply_bwd_body<idx64_t>(dy, x, mean, k1, k2, k3, dx, total, HW, C);
}

__device__ __forceinline__ unsigned long long splitmix64_mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// out[i] in [0, 1): number (offset + i) of the SplitMix64 stream that starts at `key`
extern "C" __global__ void uniform_fill(T* out, long long n, unsigned long long key, unsigned long long offset) {
    GRID_STRIDE(idx64_t, i, n) {
        unsigned long long h = splitmix64_mix(key + (offset + (unsigned long long)i + 1ULL) * 0x9E3779B97F4A7C15ULL);
        out[i] = sizeof(T) == 4 ? (T)((float)(h >> 40) * (1.0f / 16777216.0f))
                                : (T)((double)(h >> 11) * (1.0 / 9007199254740992.0));
    }
}
"""

_CTYPES = {"float32": "float", "float64": "double"}
_MODULES = {}
INDEX32_LIMIT = 2 ** 31      # every index below this: the kernels' 32-bit path (`idx32`)


def module(cupy, dtype):
    """The RawModule of `_SOURCE` for `dtype` (float32 / float64) on the current device, compiled once per
    process. Keyed by device too (a module's functions are loaded on the device current at compilation),
    and by the CuPy module itself (the test stand-in of CuPy compiles its own)."""
    name = np.dtype(dtype).name
    key = (id(cupy), int(cupy.cuda.Device().id), name)
    mod = _MODULES.get(key)
    if mod is None:
        mod = _MODULES[key] = cupy.RawModule(code=f"typedef {_CTYPES[name]} T;\n" + _SOURCE)
    return mod


def index32(*sizes) -> np.int32:
    """The `idx32` argument: 1 when every size (so every index into those arrays) is below 2**31."""
    return np.int32(max(int(s) for s in sizes) < INDEX32_LIMIT)
