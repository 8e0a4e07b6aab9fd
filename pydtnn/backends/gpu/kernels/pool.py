"""Pooling kernels (NCHW, one plane = H*W contiguous values per (n, c)).

- forward: one thread per output; max keeps the FIRST arg-max in window order (row by row), padding is
  -inf; avg divides by kh*kw (padded zeros count), as the CPU backend does;
- backward: one thread per INPUT element gathers the outputs whose window covers it (no atomics,
  deterministic, overlapping windows included); max adds dy where the stored arg-max is this element;
- global average pooling's backward spreads dy / (H*W) over its plane (`gavg_bwd`).
"""

SOURCE = r"""
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
__device__ __forceinline__ void gavg_bwd_body(const T* dy, T* dx, I total, int HW, T scale) {
    GRID_STRIDE(I, i, total) {
        dx[i] = dy[i / (I)HW] * scale;
    }
}

extern "C" __global__ void gavg_bwd(const T* dy, T* dx, long long total, int HW, T scale, int idx32) {
    if (idx32) gavg_bwd_body<idx32_t>(dy, dx, (idx32_t)total, HW, scale);
    else gavg_bwd_body<idx64_t>(dy, dx, total, HW, scale);
}
"""
