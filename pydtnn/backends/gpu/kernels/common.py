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
"""
