// Device helpers of the kernels that compute a softmax row by row (softmax.cu,
// cross_entropy.cu): the running (max, sum) of exp that makes a stable
// softmax in one pass, its warp and block combines, 16-byte vector loads and
// stores, and the launch shape of the block-per-row kernels. A .cu file
// brings them into its anonymous namespace with `using namespace cl_rows`.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <limits>

#include "dtype_convert.cuh"

namespace cl_rows {

constexpr int kUnroll = 4;           // vector loads in flight per thread (block kernel)
constexpr int64_t kMaxGrid = (int64_t)1 << 20; // grid-stride loops cover the rest

template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return log(x); }
// The max ignores NaN (fmax); a NaN still reaches the sum and spoils it.
__device__ __forceinline__ float max_(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_(double a, double b) { return fmax(a, b); }

template <typename A> __device__ __forceinline__ A neg_inf()
{
    return -std::numeric_limits<A>::infinity();
}

// ---- running (max, sum) ------------------------------------------------------

template <typename A> struct MaxSum {
    A m, s;
};

// Add x to a running (m, s) with s = sum of exp(x_k - m).
template <typename A> __device__ __forceinline__ void add(MaxSum<A> &r, A x)
{
    if (x > r.m) {
        // (x - x) + 1 is 1, or NaN for x = +inf (whose row is NaN, see above).
        r.s = r.s * exp_(r.m - x) + ((x - x) + A(1));
        r.m = x;
    }
    else if (x != neg_inf<A>()) { // -inf adds 0, also while m is -inf
        r.s += exp_(x - r.m);
    }
}

template <typename A> __device__ __forceinline__ A rescale(A s, A m, A to)
{
    return m == neg_inf<A>() ? A(0) * s : s * exp_(m - to); // 0 * s keeps a NaN
}

template <typename A> __device__ __forceinline__ MaxSum<A> combine(MaxSum<A> a, MaxSum<A> b)
{
    const A m = max_(a.m, b.m);
    return MaxSum<A>{m, rescale(a.s, a.m, m) + rescale(b.s, b.m, m)};
}

template <typename A> __device__ __forceinline__ MaxSum<A> warp_combine(MaxSum<A> r)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        MaxSum<A> o{__shfl_xor_sync(0xffffffffu, r.m, offset),
                    __shfl_xor_sync(0xffffffffu, r.s, offset)};
        r = combine(r, o);
    }
    return r;
}

// ---- loads and stores of kVec elements (one 16-byte access when kVec > 1) ----

template <typename T, int kVec> __device__ __forceinline__ void load(T (&v)[kVec], const T *p)
{
    if constexpr (kVec == 1) {
        v[0] = *p;
    }
    else {
        static_assert(kVec * sizeof(T) == 16, "vectors are 16 bytes");
        const uint4 raw = *reinterpret_cast<const uint4 *>(p);
        const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int j = 0; j < kVec; j++) {
            v[j] = e[j];
        }
    }
}

template <typename T, int kVec> __device__ __forceinline__ void store(T *p, const T (&v)[kVec])
{
    if constexpr (kVec == 1) {
        *p = v[0];
    }
    else {
        uint4 raw;
        T *e = reinterpret_cast<T *>(&raw);
#pragma unroll
        for (int j = 0; j < kVec; j++) {
            e[j] = v[j];
        }
        *reinterpret_cast<uint4 *>(p) = raw;
    }
}

// ---- a block per row ------------------------------------------------------------

// A block of up to 512 threads per row: a long row owned by few blocks (one
// row, or fewer rows than SMs) is limited by how many loads each SM keeps in
// flight, not by bandwidth, so the block is as wide as the row can use
// (block_threads) and both passes keep kUnroll vectors in flight per thread.
constexpr int kBlockMaxThreads = 512;
constexpr int kBlockMinThreads = 128;

template <typename A> __device__ MaxSum<A> block_combine(MaxSum<A> r)
{
    __shared__ A sm_m[kBlockMaxThreads / 32], sm_s[kBlockMaxThreads / 32];
    const int warps = blockDim.x / 32;
    r = warp_combine(r);
    if (threadIdx.x % 32 == 0) {
        sm_m[threadIdx.x / 32] = r.m;
        sm_s[threadIdx.x / 32] = r.s;
    }
    __syncthreads();
    r = MaxSum<A>{sm_m[0], sm_s[0]};
    for (int w = 1; w < warps; w++) { // every thread, the same order
        r = combine(r, MaxSum<A>{sm_m[w], sm_s[w]});
    }
    __syncthreads(); // the next row reuses sm_m, sm_s
    return r;
}

// The kUnroll vectors of one step of a block-row pass from element i, those
// inside the row: all loads issued before any is used.
template <typename T, int kVec>
__device__ __forceinline__ void
load_unrolled(T (&v)[kUnroll][kVec], const T *src, int64_t i, int64_t step, int64_t len)
{
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        if (i + u * step < len) {
            load<T, kVec>(v[u], src + i + u * step);
        }
    }
}

// Add one step's loaded values (those inside the row; the rest are -inf) to
// the running (m, s): the step's own max first, one rescale of s, then
// kUnroll * kVec independent exps summed per unroll slot. Adding element by
// element (add above) chains every exp behind the previous compare and sum;
// a row owned by one block is bound by that chain, not by bandwidth. The
// special values come out as add gives them: a NaN or +inf makes s NaN, -inf
// adds 0 (also while m is still -inf).
template <typename T, int kVec, typename A>
__device__ __forceinline__ void
add_step(MaxSum<A> &r, const T (&v)[kUnroll][kVec], int64_t i, int64_t step, int64_t len)
{
    A x[kUnroll][kVec];
    A cm = neg_inf<A>();
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        const bool inside = i + u * step < len;
#pragma unroll
        for (int j = 0; j < kVec; j++) {
            x[u][j] = inside ? static_cast<A>(cl::widen(v[u][j])) : neg_inf<A>();
            cm = max_(cm, x[u][j]);
        }
    }
    const A m = max_(r.m, cm);
    A part[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        part[u] = A(0);
#pragma unroll
        for (int j = 0; j < kVec; j++) {
            if (x[u][j] != neg_inf<A>()) {
                part[u] += exp_(x[u][j] - m);
            }
        }
    }
    A s = rescale(r.s, r.m, m);
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        s += part[u];
    }
    r = MaxSum<A>{m, s};
}

// The first pass of a block-per-row kernel: the running (max, sum) over the
// `len` elements of the row at src (kVec elements per access), combined
// across the block; every thread gets it.
template <typename T, int kVec>
__device__ MaxSum<typename AccOf<T>::type>
block_row_max_sum(const T *src, int64_t len)
{
    using A = typename AccOf<T>::type;
    const int64_t step = (int64_t)blockDim.x * kVec;
    MaxSum<A> r{neg_inf<A>(), A(0)};
    for (int64_t i = threadIdx.x * kVec; i < len; i += kUnroll * step) {
        T v[kUnroll][kVec];
        load_unrolled<T, kVec>(v, src, i, step, len);
        add_step<T, kVec>(r, v, i, step, len);
    }
    return block_combine(r);
}

// Threads of softmax_block for rows of `len`: one kUnroll x kVec slice of the
// row per thread, in whole warps, between 128 and 512 (more would cap the
// registers at 64 and spill the unrolled loads).
inline unsigned int
block_threads(int64_t len, int vec)
{
    int64_t want = (len + (int64_t)kUnroll * vec - 1) / ((int64_t)kUnroll * vec);
    want = (want + 31) / 32 * 32;
    return (unsigned int)(want < kBlockMinThreads ? kBlockMinThreads
                                                  : (want > kBlockMaxThreads ? kBlockMaxThreads
                                                                             : want));
}

inline unsigned int
grid_of(int64_t blocks)
{
    return (unsigned int)(blocks < 1 ? 1 : (blocks > kMaxGrid ? kMaxGrid : blocks));
}

} // namespace cl_rows
