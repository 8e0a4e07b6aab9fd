"""Counter-based random numbers (`uniform_fill`): out[i] = SplitMix64 output number (offset + i) of the stream
keyed by the seed, so a generator's whole state is two integers (seed, offset) that a checkpoint can save
and restore (see `pydtnn.backends.gpu.rng`). In a captured CUDA graph the key and the offset cannot be kernel
arguments (a graph replays the values it was captured with): `uniform_fill_at` reads them from a device pair
that `rng_base_set` writes before each replay (`pydtnn.backends.gpu.graphs`)."""

SOURCE = r"""
__device__ __forceinline__ unsigned long long splitmix64_mix(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ void splitmix64_fill(T* out, long long n, unsigned long long key,
                                                unsigned long long offset) {
    GRID_STRIDE(idx64_t, i, n) {
        unsigned long long h = splitmix64_mix(key + (offset + (unsigned long long)i + 1ULL) * 0x9E3779B97F4A7C15ULL);
        out[i] = sizeof(T) == 4 ? (T)((float)(h >> 40) * (1.0f / 16777216.0f))
                                : (T)((double)(h >> 11) * (1.0 / 9007199254740992.0));
    }
}

// out[i] in [0, 1): number (offset + i) of the SplitMix64 stream that starts at `key`
extern "C" __global__ void uniform_fill(T* out, long long n, unsigned long long key, unsigned long long offset) {
    splitmix64_fill(out, n, key, offset);
}

// the same numbers, the key and offset read from base[0] and base[1] + delta (delta: the numbers a graph's
// earlier draws took)
extern "C" __global__ void uniform_fill_at(T* out, long long n, const unsigned long long* base,
                                           unsigned long long delta) {
    splitmix64_fill(out, n, base[0], base[1] + delta);
}

// the generator's state where a graph reads it (one thread)
extern "C" __global__ void rng_base_set(unsigned long long* base, unsigned long long key, unsigned long long offset) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        base[0] = key;
        base[1] = offset;
    }
}
"""
