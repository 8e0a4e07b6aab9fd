"""The prelude every kernel family's source shares: grid-stride loops, index types, rounding-exact arithmetic."""

SOURCE = r"""
#define GRID_STRIDE(I, i, n) for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I)(n); \
                                  i += (I)blockDim.x * gridDim.x)
typedef unsigned int idx32_t;
typedef long long idx64_t;

// One rounding per operation, never contracted into a fused multiply-add: these reproduce, bit for bit, a
// sequence of separate array operations (the running statistics' update as NumPy and CuPy compute it).
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// max(v, 0) as NumPy's maximum: NaN stays NaN (a diverged run shows in its loss)
__device__ __forceinline__ T relu_of(T v) { return (v > (T)0 || v != v) ? v : (T)0; }

// 16 bytes of T (4 floats, 2 doubles) loaded and stored as one: an element-wise kernel with `packed` set walks
// packs (the caller checks that every array is 16-byte aligned and the size a multiple of PACK)
#define PACK ((int)(16 / sizeof(T)))
struct __align__(16) Pack { T v[16 / sizeof(T)]; };

// The per-channel passes over NCHW arrays walk (plane, chunk) pairs when planes are large (`chunks` > 0: a block
// takes PLANE_CHUNK consecutive elements of one (n, c) plane, its channel known once, no division per element),
// element by element otherwise (small planes: a block spans several). `body` sees i (the element) and c.
#define PLANE_CHUNK 1024
#define FOR_PLANE_CHUNKS(I, total, HW, C, chunks, body) \
    for (I b = blockIdx.x; b < (total) / (I)(HW) * (I)(chunks); b += gridDim.x) { \
        I plane = b / (I)(chunks); \
        int lo = (int)(b - plane * (I)(chunks)) * PLANE_CHUNK, hi = min((HW), lo + PLANE_CHUNK); \
        int c = (int)(plane % (I)(C)); \
        I base = plane * (I)(HW); \
        for (int k = lo + threadIdx.x; k < hi; k += blockDim.x) { I i = base + k; body } \
    }
"""
