"""Batch normalization kernels (channel c of element (n, c, p), p < HW; a 2-D (N, C) input is HW = 1).

- `bn_partial`: one block per (channel, slice), both on gridDim.x (gridDim.y would cap channels at 65,535):
  partial sums in double of (x - shift) and (x - shift)^2 with shift = the channel's first value (a stable
  one-pass variance); in backward mode of g and g * (x - mean), g = dy, or, with the ReLU fused after the
  normalization, dy where the forward's output was positive (recomputed from x: no array of it is read);
- `bn_finalize_fwd`: one thread per channel adds the partials, computes the per-channel coefficients and,
  when asked, updates the running statistics in place, with the rounding of the separate float operations
  the layer would otherwise run (running = running * m + (1 - m) * batch; the variance unbiased);
- `bn_apply`: y = (x - mean) * scale + beta in double, with the ReLU fused when asked;
- `bn_finalize_bwd`: the backward coefficients, and dgamma, dbeta written where the caller says (the model's
  flat gradient buffer);
- `bn_apply_bwd`: dx = k1 g + k2 (x - mean) + k3, plus another path's gradient when asked (a block's sum).
"""

SOURCE = r"""
// the normalized output, as bn_apply writes it before its ReLU (one expression: the backward recomputes it)
__device__ __forceinline__ T bn_y(T x, double mean, double scale, T beta) {
    return (T)fma((double)x - mean, scale, (double)beta);
}

template <typename I>
__device__ __forceinline__ void bn_partial_add(const T* x, const T* dy, I off, double sh, double sc, T bt, int mode,
                                               double& a1, double& a2) {
    double d = (double)x[off] - sh;
    if (mode) {
        T gt = dy[off];
        if (mode == 2) gt = gt * (T)(bn_y(x[off], sh, sc, bt) > (T)0);
        double g = (double)gt;
        a1 += g;
        a2 += g * d;
    } else {
        a1 += d;
        a2 += d * d;
    }
}

template <typename I>
__device__ __forceinline__ void bn_partial_body(const T* x, const T* dy, const double* mean, const double* scale,
                                                const T* beta, double* part, I M, int C, int HW, int S, int mode) {
    __shared__ double s1[256];
    __shared__ double s2[256];
    int c = blockIdx.x / S, s = blockIdx.x % S, tid = threadIdx.x;
    double sh = mode ? mean[c] : (double)x[(I)c * (I)HW];
    double sc = mode == 2 ? scale[c] : 0.0;
    T bt = mode == 2 ? beta[c] : (T)0;
    double a1 = 0.0, a2 = 0.0;
    if (HW >= (int)blockDim.x) {        // large planes: slice s takes planes s, s + S, ...; no division per element
        I N = M / (I)HW;
        for (I n = s; n < N; n += S) {
            I base = (n * (I)C + (I)c) * (I)HW;
            for (int k = tid; k < HW; k += blockDim.x) bn_partial_add<I>(x, dy, base + k, sh, sc, bt, mode, a1, a2);
        }
    } else {
        for (I j = (I)s * blockDim.x + tid; j < M; j += (I)S * blockDim.x) {
            I n = j / (I)HW;
            bn_partial_add<I>(x, dy, (n * (I)C + (I)c) * (I)HW + (j - n * (I)HW), sh, sc, bt, mode, a1, a2);
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

// grid (C * S,), block (256,): block b is channel b / S, slice b % S.
// mode 0: forward sums; 1: backward sums of dy; 2: backward sums of dy masked by the fused ReLU
extern "C" __global__ void bn_partial(const T* x, const T* dy, const double* mean, const double* scale,
                                      const T* beta, double* part, long long M, int C, int HW, int S, int mode,
                                      int idx32) {
    if (idx32) bn_partial_body<idx32_t>(x, dy, mean, scale, beta, part, (idx32_t)M, C, HW, S, mode);
    else bn_partial_body<idx64_t>(x, dy, mean, scale, beta, part, M, C, HW, S, mode);
}

extern "C" __global__ void bn_finalize_fwd(const double* part, const T* x, const T* gamma, int C, int HW, int S,
                                           double m, double eps, T* mean_out, T* var_out, double* mean64,
                                           double* scale64, double* invstd64, T* run_mean, T* run_var,
                                           T momentum, T one_minus_momentum, T unbias, int update) {
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
    T mean_t = (T)mean, var_t = (T)var;
    mean_out[c] = mean_t;
    var_out[c] = var_t;
    mean64[c] = mean;
    scale64[c] = (double)gamma[c] * invstd;
    invstd64[c] = invstd;
    if (update) {
        run_mean[c] = add_rn(mul_rn(run_mean[c], momentum), mul_rn(one_minus_momentum, mean_t));
        run_var[c] = add_rn(mul_rn(run_var[c], momentum), mul_rn(mul_rn(one_minus_momentum, var_t), unbias));
    }
}

template <typename I>
__device__ __forceinline__ void bn_apply_body(const T* x, const double* mean, const double* scale,
                                              const T* beta, T* y, I total, int HW, int C, int relu, int chunks) {
    if (chunks) {
        FOR_PLANE_CHUNKS(I, total, HW, C, chunks, {
            T v = bn_y(x[i], mean[c], scale[c], beta[c]);
            y[i] = relu ? relu_of(v) : v;
        })
    } else {
        GRID_STRIDE(I, i, total) {
            int c = (int)((i / (I)HW) % (I)C);
            T v = bn_y(x[i], mean[c], scale[c], beta[c]);
            y[i] = relu ? relu_of(v) : v;
        }
    }
}

extern "C" __global__ void bn_apply(const T* x, const double* mean, const double* scale, const T* beta, T* y,
                                    long long total, int HW, int C, int relu, int chunks, int idx32) {
    if (idx32) bn_apply_body<idx32_t>(x, mean, scale, beta, y, (idx32_t)total, HW, C, relu, chunks);
    else bn_apply_body<idx64_t>(x, mean, scale, beta, y, total, HW, C, relu, chunks);
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
__device__ __forceinline__ T bn_dx(const T* dy, const T* x, const T* addend, I i, int c, const double* mean,
                                   const double* k1, const double* k2, const double* k3, const double* scale,
                                   const T* beta, int relu, int with_add) {
    T g = dy[i];
    if (relu) g = g * (T)(bn_y(x[i], mean[c], scale[c], beta[c]) > (T)0);
    T v = (T)(k1[c] * (double)g + k2[c] * ((double)x[i] - mean[c]) + k3[c]);
    return with_add ? v + addend[i] : v;
}

template <typename I>
__device__ __forceinline__ void bn_apply_bwd_body(const T* dy, const T* x, const double* mean, const double* k1,
                                                  const double* k2, const double* k3, const double* scale,
                                                  const T* beta, const T* addend, T* dx, I total, int HW, int C,
                                                  int relu, int with_add, int chunks) {
    if (chunks) {
        FOR_PLANE_CHUNKS(I, total, HW, C, chunks, {
            dx[i] = bn_dx<I>(dy, x, addend, i, c, mean, k1, k2, k3, scale, beta, relu, with_add);
        })
    } else {
        GRID_STRIDE(I, i, total) {
            int c = (int)((i / (I)HW) % (I)C);
            dx[i] = bn_dx<I>(dy, x, addend, i, c, mean, k1, k2, k3, scale, beta, relu, with_add);
        }
    }
}

extern "C" __global__ void bn_apply_bwd(const T* dy, const T* x, const double* mean, const double* k1,
                                        const double* k2, const double* k3, const double* scale, const T* beta,
                                        const T* addend, T* dx, long long total, int HW, int C, int relu,
                                        int with_add, int chunks, int idx32) {
    if (idx32) bn_apply_bwd_body<idx32_t>(dy, x, mean, k1, k2, k3, scale, beta, addend, dx, (idx32_t)total, HW, C,
                                          relu, with_add, chunks);
    else bn_apply_bwd_body<idx64_t>(dy, x, mean, k1, k2, k3, scale, beta, addend, dx, total, HW, C, relu, with_add,
                                    chunks);
}
"""
