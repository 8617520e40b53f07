// Device random numbers from a counter-based generator: Philox4x32-10
// (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), implemented here from the paper's definition.
//
// Philox maps a 128-bit counter and a 64-bit key to 128 random bits through
// 10 rounds of two 32x32->64-bit multiplications, with a Weyl-sequence key
// schedule. Because the output is a pure function of (counter, key), there
// is no generator state on the device: thread work never depends on the grid
// and the same (seed, offset) gives bit-identical arrays on any GPU.
//
// Stream layout of one call (key = the seed, offset = a per-call number the
// Python side advances):
//   counter = (g_lo, g_hi | attempt << 24, offset_lo, offset_hi)
//   g       = element group index: group g produces elements [g*K, g*K + K)
//             with K = 4 (32 random bits per element) or K = 2 (64 bits)
//   attempt = 0, or 1..255 for the rare redraws of the integer rejection
//             sampler (group indices stay below 2^56)
//
// Conversions:
//   uniform  u = top `digits` bits * 2^-digits, digits = the dtype's
//            significand (11 float16, 8 bfloat16, 24 float32, 53 float64 from
//            two words), so u lies on an exact grid in [0, 1). The value
//            low + (high - low) * u is computed in float32 (float64 for
//            float64), rounded to nearest into the dtype, and a result that
//            rounds up to `high` is replaced by the largest value below it:
//            the output is always in [low, high).
//   normal   Box-Muller: z0, z1 = sqrt(-2 ln u1) * (cos, sin)(2 pi u2) with u1
//            in (0, 1] (never log 0), in float32 for float16/bfloat16/float32
//            (24-bit uniforms), in float64 with 53-bit uniforms for float64;
//            mean + std * z rounded to nearest into the dtype.
//   integers low + k, k uniform in [0, span] without bias: Lemire's
//            multiply-shift (k = high half of x * range) with rejection of
//            the low half below 2^w mod range, using 32-bit words when the
//            range fits in 32 bits and 64-bit words otherwise.
//
// Each thread handles whole groups in a grid-stride loop; full groups are
// written with one vector store when the group's bytes are 16-byte aligned
// (or smaller and naturally aligned), the tail group element by element.
#include "kernels.h"
#include "dtype_convert.cuh"

#include <stdint.h>

namespace {

constexpr int kThreads = 256;

struct Philox {
    uint32_t v[4];
};

// One Philox4x32-10 block. The constants are the paper's: multipliers
// 0xD2511F53 and 0xCD9E8D57, key increments 0x9E3779B9 (golden ratio) and
// 0xBB67AE85 (sqrt(3) - 1).
__device__ __forceinline__ Philox
philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1)
{
#pragma unroll
    for (int round = 0; round < 10; round++) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    return Philox{{c0, c1, c2, c3}};
}

struct Stream {
    uint32_t k0, k1, o0, o1;
    __device__ __forceinline__ Philox block(int64_t g, uint32_t attempt = 0) const
    {
        return philox4x32_10((uint32_t)g, (uint32_t)((uint64_t)g >> 32) | (attempt << 24), o0,
                             o1, k0, k1);
    }
};

Stream
make_stream(uint64_t key, uint64_t offset)
{
    return Stream{(uint32_t)key, (uint32_t)(key >> 32), (uint32_t)offset,
                  (uint32_t)(offset >> 32)};
}

// ---- element types: significand digits, rounding, next value below --------

template <typename T> struct Float;
template <> struct Float<float> {
    using Math = float;
    static constexpr int digits = 24;
};
template <> struct Float<double> {
    using Math = double; // 53-bit uniforms from two words (unit53)
};
template <> struct Float<__half> {
    using Math = float;
    static constexpr int digits = 11;
};
template <> struct Float<__nv_bfloat16> {
    using Math = float;
    static constexpr int digits = 8;
};

template <typename T> __device__ __forceinline__ double as_double(T v)
{
    return (double)cl::widen(v);
}

// The largest T strictly below `x` (x finite, exactly representable in T).
__device__ __forceinline__ float next_below(float x) { return nextafterf(x, -INFINITY); }
__device__ __forceinline__ double next_below(double x) { return nextafter(x, -(double)INFINITY); }
__device__ __forceinline__ __half next_below(__half x)
{
    unsigned short b = __half_as_ushort(x);
    if ((b & 0x7FFFu) == 0) {
        return __ushort_as_half(0x8001u); // below +-0: the smallest negative subnormal
    }
    return __ushort_as_half((b & 0x8000u) ? (unsigned short)(b + 1) : (unsigned short)(b - 1));
}
__device__ __forceinline__ __nv_bfloat16 next_below(__nv_bfloat16 x)
{
    unsigned short b = __bfloat16_as_ushort(x);
    if ((b & 0x7FFFu) == 0) {
        return __ushort_as_bfloat16(0x8001u);
    }
    return __ushort_as_bfloat16((b & 0x8000u) ? (unsigned short)(b + 1)
                                              : (unsigned short)(b - 1));
}

// u in [0, 1) from the top `digits` bits of a 32-bit word (digits <= 24).
template <int digits> __device__ __forceinline__ float unit_open1(uint32_t x)
{
    return (float)(x >> (32 - digits)) * (1.0f / (float)(1u << digits));
}
// u in (0, 1] (for the logarithm of Box-Muller).
__device__ __forceinline__ float unit_open0_f(uint32_t x)
{
    return (float)((x >> 8) + 1u) * (1.0f / 16777216.0f);
}
// 53-bit u in [0, 1) from two words.
__device__ __forceinline__ double unit53(uint32_t a, uint32_t b)
{
    uint64_t bits = ((uint64_t)(a >> 5) << 26) | (uint64_t)(b >> 6);
    return (double)bits * (1.0 / 9007199254740992.0);
}
__device__ __forceinline__ double unit53_open0(uint32_t a, uint32_t b)
{
    uint64_t bits = ((uint64_t)(a >> 5) << 26) | (uint64_t)(b >> 6);
    return (double)(bits + 1) * (1.0 / 9007199254740992.0);
}

// ---- group stores ----------------------------------------------------------

template <int kBytes> struct alignas(kBytes < 16 ? kBytes : 16) Pack {
    unsigned char b[kBytes];
};

// Write K elements of group g: one vector store for a full group, element
// stores for the tail. Groups start at multiples of K elements of a pool
// allocation (256-byte aligned), so a full group is naturally aligned.
template <typename T, int K>
__device__ __forceinline__ void
store_group(T *out, int64_t g, int64_t n, const T (&v)[K])
{
    int64_t base = g * K;
    if (base + K <= n) {
        union {
            T t[K];
            Pack<K * sizeof(T)> p;
        } u;
#pragma unroll
        for (int k = 0; k < K; k++) {
            u.t[k] = v[k];
        }
        *reinterpret_cast<Pack<K * sizeof(T)> *>(out + base) = u.p;
    }
    else {
#pragma unroll
        for (int k = 0; k < K; k++) {
            if (base + k < n) {
                out[base + k] = v[k];
            }
        }
    }
}

// ---- kernels ---------------------------------------------------------------

// Results with the dtype's own rounding and the [low, high) guarantee.
template <typename T>
__device__ __forceinline__ T
uniform_value(typename Float<T>::Math u, typename Float<T>::Math low,
              typename Float<T>::Math width, T low_t, T high_t)
{
    T v = cl::convert<T>(low + width * u);
    if (as_double(v) >= as_double(high_t)) {
        v = next_below(high_t);
    }
    if (as_double(v) < as_double(low_t)) {
        v = low_t;
    }
    return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
uniform_kernel(T *__restrict__ out, int64_t n, double low, double high, Stream s)
{
    using M = typename Float<T>::Math;
    const T low_t = cl::convert<T>(low), high_t = cl::convert<T>(high);
    const M lo = (M)low, width = (M)high - (M)low;
    constexpr int K = sizeof(T) == 8 ? 2 : 4;
    int64_t groups = (n + K - 1) / K;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
         g += (int64_t)gridDim.x * blockDim.x) {
        Philox r = s.block(g);
        T v[K];
        if constexpr (K == 2) {
            v[0] = uniform_value<T>(unit53(r.v[0], r.v[1]), lo, width, low_t, high_t);
            v[1] = uniform_value<T>(unit53(r.v[2], r.v[3]), lo, width, low_t, high_t);
        }
        else {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                v[k] = uniform_value<T>(unit_open1<Float<T>::digits>(r.v[k]), lo, width, low_t,
                                        high_t);
            }
        }
        store_group<T, K>(out, g, n, v);
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
normal_kernel(T *__restrict__ out, int64_t n, double mean, double stddev, Stream s)
{
    constexpr int K = sizeof(T) == 8 ? 2 : 4;
    int64_t groups = (n + K - 1) / K;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
         g += (int64_t)gridDim.x * blockDim.x) {
        Philox r = s.block(g);
        T v[K];
        if constexpr (K == 2) {
            double u1 = unit53_open0(r.v[0], r.v[1]), u2 = unit53(r.v[2], r.v[3]);
            double rad = sqrt(-2.0 * log(u1)), sn, cs;
            sincospi(2.0 * u2, &sn, &cs);
            v[0] = cl::convert<T>(mean + stddev * (rad * cs));
            v[1] = cl::convert<T>(mean + stddev * (rad * sn));
        }
        else {
            const float m = (float)mean, sd = (float)stddev;
#pragma unroll
            for (int k = 0; k < 4; k += 2) {
                float u1 = unit_open0_f(r.v[k]), u2 = unit_open1<24>(r.v[k + 1]);
                float rad = sqrtf(-2.0f * logf(u1)), sn, cs;
                sincospif(2.0f * u2, &sn, &cs);
                v[k] = cl::convert<T>(fmaf(sd, rad * cs, m));
                v[k + 1] = cl::convert<T>(fmaf(sd, rad * sn, m));
            }
        }
        store_group<T, K>(out, g, n, v);
    }
}

constexpr uint32_t kMaxAttempts = 255;

// k uniform in [0, range) for range in [1, 2^32), from the word `x` of the
// group; a rejected word is redrawn from the same lane of attempt 1, 2, ...
__device__ __forceinline__ uint32_t
bounded32(uint32_t x, uint32_t range, const Stream &s, int64_t g, int lane)
{
    uint64_t m = (uint64_t)x * range;
    uint32_t l = (uint32_t)m;
    if (l < range) {
        uint32_t threshold = (0u - range) % range; // 2^32 mod range
        for (uint32_t attempt = 1; l < threshold && attempt <= kMaxAttempts; attempt++) {
            x = s.block(g, attempt).v[lane];
            m = (uint64_t)x * range;
            l = (uint32_t)m;
        }
    }
    return (uint32_t)(m >> 32);
}

__device__ __forceinline__ uint64_t
bounded64(uint64_t x, uint64_t range, const Stream &s, int64_t g, int pair)
{
    uint64_t lo = x * range;
    if (lo < range) {
        uint64_t threshold = (0ull - range) % range; // 2^64 mod range
        for (uint32_t attempt = 1; lo < threshold && attempt <= kMaxAttempts; attempt++) {
            Philox r = s.block(g, attempt);
            x = ((uint64_t)r.v[2 * pair] << 32) | r.v[2 * pair + 1];
            lo = x * range;
        }
    }
    return __umul64hi(x, range);
}

template <typename T, bool kWide>
__global__ void __launch_bounds__(kThreads)
integers_kernel(T *__restrict__ out, int64_t n, int64_t low, uint64_t span, Stream s)
{
    constexpr int K = kWide ? 2 : 4;
    int64_t groups = (n + K - 1) / K;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
         g += (int64_t)gridDim.x * blockDim.x) {
        Philox r = s.block(g);
        T v[K];
#pragma unroll
        for (int k = 0; k < K; k++) {
            uint64_t kval;
            if constexpr (kWide) {
                uint64_t x = ((uint64_t)r.v[2 * k] << 32) | r.v[2 * k + 1];
                kval = span == ~0ull ? x : bounded64(x, span + 1, s, g, k);
            }
            else {
                kval = span == 0xFFFFFFFFull ? r.v[k]
                                             : bounded32(r.v[k], (uint32_t)(span + 1), s, g, k);
            }
            v[k] = (T)((uint64_t)low + kval); // two's complement wrap into T
        }
        store_group<T, K>(out, g, n, v);
    }
}

__global__ void
philox_kat_kernel(uint32_t *out, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                  uint32_t k1)
{
    Philox r = philox4x32_10(c0, c1, c2, c3, k0, k1);
    for (int k = 0; k < 4; k++) {
        out[k] = r.v[k];
    }
}

unsigned int
grid_for(int64_t groups)
{
    int64_t blocks = (groups + kThreads - 1) / kThreads;
    const int64_t cap = 65536;
    return (unsigned int)(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

template <typename T>
cudaError_t
launch_uniform(void *out, int64_t n, double low, double high, Stream s, cudaStream_t stream)
{
    constexpr int K = sizeof(T) == 8 ? 2 : 4;
    uniform_kernel<T><<<grid_for((n + K - 1) / K), kThreads, 0, stream>>>(static_cast<T *>(out),
                                                                          n, low, high, s);
    return cudaGetLastError();
}

template <typename T>
cudaError_t
launch_normal(void *out, int64_t n, double mean, double stddev, Stream s, cudaStream_t stream)
{
    constexpr int K = sizeof(T) == 8 ? 2 : 4;
    normal_kernel<T><<<grid_for((n + K - 1) / K), kThreads, 0, stream>>>(static_cast<T *>(out),
                                                                         n, mean, stddev, s);
    return cudaGetLastError();
}

template <typename T>
cudaError_t
launch_integers(void *out, int64_t n, int64_t low, uint64_t span, Stream s,
                cudaStream_t stream)
{
    if (span > 0xFFFFFFFFull) {
        integers_kernel<T, true><<<grid_for((n + 1) / 2), kThreads, 0, stream>>>(
            static_cast<T *>(out), n, low, span, s);
    }
    else {
        integers_kernel<T, false><<<grid_for((n + 3) / 4), kThreads, 0, stream>>>(
            static_cast<T *>(out), n, low, span, s);
    }
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t
cl_random_normal(void *out, cl_dtype dtype, int64_t n, double mean, double std, uint64_t key,
                 uint64_t offset, cudaStream_t stream)
{
    if (n < 0) {
        return cudaErrorInvalidValue;
    }
    if (n == 0) {
        return cudaSuccess;
    }
    Stream s = make_stream(key, offset);
    switch (dtype) {
    case CL_FLOAT16: return launch_normal<__half>(out, n, mean, std, s, stream);
    case CL_BFLOAT16: return launch_normal<__nv_bfloat16>(out, n, mean, std, s, stream);
    case CL_FLOAT32: return launch_normal<float>(out, n, mean, std, s, stream);
    case CL_FLOAT64: return launch_normal<double>(out, n, mean, std, s, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t
cl_random_uniform(void *out, cl_dtype dtype, int64_t n, double low, double high, uint64_t key,
                  uint64_t offset, cudaStream_t stream)
{
    if (n < 0 || !(low < high)) {
        return cudaErrorInvalidValue;
    }
    if (n == 0) {
        return cudaSuccess;
    }
    Stream s = make_stream(key, offset);
    switch (dtype) {
    case CL_FLOAT16: return launch_uniform<__half>(out, n, low, high, s, stream);
    case CL_BFLOAT16: return launch_uniform<__nv_bfloat16>(out, n, low, high, s, stream);
    case CL_FLOAT32: return launch_uniform<float>(out, n, low, high, s, stream);
    case CL_FLOAT64: return launch_uniform<double>(out, n, low, high, s, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t
cl_random_integers(void *out, cl_dtype dtype, int64_t n, int64_t low, uint64_t span,
                   uint64_t key, uint64_t offset, cudaStream_t stream)
{
    if (n < 0) {
        return cudaErrorInvalidValue;
    }
    if (n == 0) {
        return cudaSuccess;
    }
    Stream s = make_stream(key, offset);
    switch (dtype) {
    case CL_INT8: return launch_integers<int8_t>(out, n, low, span, s, stream);
    case CL_UINT8: return launch_integers<uint8_t>(out, n, low, span, s, stream);
    case CL_INT32: return launch_integers<int32_t>(out, n, low, span, s, stream);
    case CL_INT64: return launch_integers<int64_t>(out, n, low, span, s, stream);
    default: return cudaErrorInvalidValue;
    }
}

extern "C" cudaError_t
cl_philox4x32_10(uint32_t *out, const uint32_t counter[4], const uint32_t key[2],
                 cudaStream_t stream)
{
    philox_kat_kernel<<<1, 1, 0, stream>>>(out, counter[0], counter[1], counter[2], counter[3],
                                           key[0], key[1]);
    return cudaGetLastError();
}
