"""Element-wise kernels: ReLU forward and backward, the sum of a block's paths (with its ReLU), a
convolution's bias (with the ReLU after it), and per-channel sums of a gradient (a bias's gradient, taken in
the pass that applies the ReLU's mask).

One pass over memory each, where CuPy's expressions took two or three (greater, maximum, multiply); the
plain element-wise ones load and store 16 bytes at a time where the arrays allow (`Pack`), the per-channel
ones walk whole planes where planes are large (`FOR_PLANE_CHUNKS`).
NaN stays NaN through the ReLU (as NumPy's maximum); its backward multiplies by the mask, so dy * 0 is what
NumPy's `dy * (y > 0)` gives, NaN and inf included.
"""

SOURCE = r"""
template <typename I>
__device__ __forceinline__ void relu_fwd_body(const T* x, T* y, I total, int packed) {
    if (packed) {
        GRID_STRIDE(I, i, total / PACK) {
            Pack p = ((const Pack*)x)[i];
            for (int k = 0; k < PACK; ++k) p.v[k] = relu_of(p.v[k]);
            ((Pack*)y)[i] = p;
        }
    } else {
        GRID_STRIDE(I, i, total) { y[i] = relu_of(x[i]); }
    }
}

extern "C" __global__ void relu_fwd(const T* x, T* y, long long total, int packed, int idx32) {
    if (idx32) relu_fwd_body<idx32_t>(x, y, (idx32_t)total, packed);
    else relu_fwd_body<idx64_t>(x, y, total, packed);
}

template <typename I>
__device__ __forceinline__ void relu_bwd_body(const T* dy, const T* y, T* dx, I total, int packed) {
    if (packed) {
        GRID_STRIDE(I, i, total / PACK) {
            Pack g = ((const Pack*)dy)[i], m = ((const Pack*)y)[i];
            for (int k = 0; k < PACK; ++k) g.v[k] = g.v[k] * (T)(m.v[k] > (T)0);
            ((Pack*)dx)[i] = g;
        }
    } else {
        GRID_STRIDE(I, i, total) { dx[i] = dy[i] * (T)(y[i] > (T)0); }
    }
}

extern "C" __global__ void relu_bwd(const T* dy, const T* y, T* dx, long long total, int packed, int idx32) {
    if (idx32) relu_bwd_body<idx32_t>(dy, y, dx, (idx32_t)total, packed);
    else relu_bwd_body<idx64_t>(dy, y, dx, total, packed);
}

// dx = (dy + a) * (y > 0): the mask of a gradient in two parts, summed in the same pass (an AdditionBlock's
// last sum handed to the block before it: pydtnn/execution/sum_handoff.py)
template <typename I>
__device__ __forceinline__ void relu_bwd_sum_body(const T* dy, const T* a, const T* y, T* dx, I total, int packed) {
    if (packed) {
        GRID_STRIDE(I, i, total / PACK) {
            Pack g = ((const Pack*)dy)[i], p = ((const Pack*)a)[i], m = ((const Pack*)y)[i];
            for (int k = 0; k < PACK; ++k) g.v[k] = (g.v[k] + p.v[k]) * (T)(m.v[k] > (T)0);
            ((Pack*)dx)[i] = g;
        }
    } else {
        GRID_STRIDE(I, i, total) { dx[i] = (dy[i] + a[i]) * (T)(y[i] > (T)0); }
    }
}

extern "C" __global__ void relu_bwd_sum(const T* dy, const T* a, const T* y, T* dx, long long total, int packed,
                                        int idx32) {
    if (idx32) relu_bwd_sum_body<idx32_t>(dy, a, y, dx, (idx32_t)total, packed);
    else relu_bwd_sum_body<idx64_t>(dy, a, y, dx, total, packed);
}

template <typename I>
__device__ __forceinline__ void add_act_body(const T* a, const T* b, T* y, I total, int relu, int packed) {
    if (packed) {
        GRID_STRIDE(I, i, total / PACK) {
            Pack p = ((const Pack*)a)[i], q = ((const Pack*)b)[i];
            for (int k = 0; k < PACK; ++k) {
                T v = p.v[k] + q.v[k];
                p.v[k] = relu ? relu_of(v) : v;
            }
            ((Pack*)y)[i] = p;
        }
    } else {
        GRID_STRIDE(I, i, total) {
            T v = a[i] + b[i];
            y[i] = relu ? relu_of(v) : v;
        }
    }
}

extern "C" __global__ void add_act(const T* a, const T* b, T* y, long long total, int relu, int packed, int idx32) {
    if (idx32) add_act_body<idx32_t>(a, b, y, (idx32_t)total, relu, packed);
    else add_act_body<idx64_t>(a, b, y, total, relu, packed);
}

// y (N, C, HW) += bias[c], in place, then max(y, 0) when asked
template <typename I>
__device__ __forceinline__ void bias_act_body(T* y, const T* bias, I total, int HW, int C, int relu, int chunks) {
    if (chunks) {
        FOR_PLANE_CHUNKS(I, total, HW, C, chunks, {
            T v = y[i] + bias[c];
            y[i] = relu ? relu_of(v) : v;
        })
    } else {
        GRID_STRIDE(I, i, total) {
            T v = y[i] + bias[(int)((i / (I)HW) % (I)C)];
            y[i] = relu ? relu_of(v) : v;
        }
    }
}

extern "C" __global__ void bias_act(T* y, const T* bias, long long total, int HW, int C, int relu, int chunks,
                                    int idx32) {
    if (idx32) bias_act_body<idx32_t>(y, bias, (idx32_t)total, HW, C, relu, chunks);
    else bias_act_body<idx64_t>(y, bias, total, HW, C, relu, chunks);
}

// Per-channel partial sums (in double) of g over (N, HW): g = dy, or with `relu` g = dy * (y > 0), written to
// g_out. grid (C * S,), block (256,): block b is channel b / S, slice b % S, as bn_partial.
template <typename I>
__device__ __forceinline__ double chan_sum_one(const T* dy, const T* y, T* g_out, I off, int relu) {
    T g = dy[off];
    if (relu) {
        g = g * (T)(y[off] > (T)0);
        g_out[off] = g;
    }
    return (double)g;
}

template <typename I>
__device__ __forceinline__ void chan_sum_partial_body(const T* dy, const T* y, T* g_out, double* part, I M, int C,
                                                      int HW, int S, int relu) {
    __shared__ double s1[256];
    int c = blockIdx.x / S, s = blockIdx.x % S, tid = threadIdx.x;
    double a1 = 0.0;
    if (HW >= (int)blockDim.x) {        // large planes: slice s takes planes s, s + S, ... (as bn_partial)
        for (I n = s; n < M / (I)HW; n += S) {
            I base = (n * (I)C + (I)c) * (I)HW;
            for (int k = tid; k < HW; k += blockDim.x) a1 += chan_sum_one<I>(dy, y, g_out, base + k, relu);
        }
    } else {
        for (I j = (I)s * blockDim.x + tid; j < M; j += (I)S * blockDim.x) {
            I n = j / (I)HW;
            a1 += chan_sum_one<I>(dy, y, g_out, (n * (I)C + (I)c) * (I)HW + (j - n * (I)HW), relu);
        }
    }
    s1[tid] = a1;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (tid < k) s1[tid] += s1[tid + k];
        __syncthreads();
    }
    if (tid == 0) part[(long long)c * S + s] = s1[0];
}

extern "C" __global__ void chan_sum_partial(const T* dy, const T* y, T* g_out, double* part, long long M, int C,
                                            int HW, int S, int relu, int idx32) {
    if (idx32) chan_sum_partial_body<idx32_t>(dy, y, g_out, part, (idx32_t)M, C, HW, S, relu);
    else chan_sum_partial_body<idx64_t>(dy, y, g_out, part, M, C, HW, S, relu);
}

extern "C" __global__ void chan_sum_finalize(const double* part, int C, int S, T* out) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double t = 0.0;
    for (int s = 0; s < S; ++s) t += part[(long long)c * S + s];
    out[c] = (T)t;
}
"""
