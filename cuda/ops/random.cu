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
//             from the 4 words (w0, w1, w2, w3) of its block, with K = 4
//             (one word per element) or K = 2 (two words per element)
//   attempt = 0, or 1..255 for the rare redraws of the integer rejection
//             sampler (group indices stay below 2^56)
//
// Conversions (float32 arithmetic for float16, bfloat16 and float32; float64
// arithmetic for float64):
//   uniform  u = top `digits` bits of the word * 2^-digits, digits = the
//            dtype's significand (11 float16, 8 bfloat16, 24 float32; 53 for
//            float64 from two words), so u lies on an exact grid in [0, 1).
//            x = fma(u, high - low, low) (computed on halved bounds when
//            high - low overflows), clamped to [low, b] with b the largest
//            value of the dtype below `high`, then rounded to nearest into
//            the dtype. Rounding is monotone and low and b are values of the
//            dtype, so the output always lies in [low, high).
//   normal   Box-Muller on a pair of words (a, b) (elements 0,1 from w0,w1
//            and elements 2,3 from w2,w3), in float32:
//              u1     = float(a) * 2^-32 + 2^-33, in [2^-33, 1]: never
//                       log 0, and 32-bit resolution in the tails (|z| up
//                       to about 6.8)
//              theta  = 2 pi * int32(b) * 2^-32, in [-pi, pi)
//              z0, z1 = sqrt(max(-2 ln u1, 0)) * (cos, sin)(theta)
//            with the hardware's approximate log2, sqrt, sin and cos
//            (absolute error about 2^-21 on these ranges, far below what
//            any statistical test of the output can see; the max() keeps
//            the square root real). The result mean + std * z (one fma) is
//            rounded to nearest into float16/bfloat16, so those are the
//            float32 stream rounded. float64: u1 in (0, 1] and u2 in [0, 1)
//            with 53 bits from two words each, z = sqrt(-2 ln u1) *
//            (cos, sin)(2 pi u2) with float64 log, sqrt and sincospi.
//   integers low + k, k uniform in [0, span] without bias: Lemire's
//            multiply-shift (k = high half of x * range) with rejection of
//            the low half below 2^w mod range, using 32-bit words when the
//            range fits in 32 bits and 64-bit words otherwise.
//
// Threads: a thread step is the 16 bytes of one vector store (4 float32,
// 8 float16 or 16 int8 values: whole groups), so each warp store writes 512
// contiguous bytes. An int64 group of 4 (32-bit words) is 32 bytes, one
// memory sector: a thread makes one such group and neighbouring lanes swap
// halves, so that each of a warp's two 16-byte stores writes whole sectors
// (measured on an H200: 1.3x the throughput of two half-sector stores).
// Steps are spread over a grid-stride loop on a grid sized to the GPU; the
// last step stores element by element. Which thread makes a group never
// changes its values.
#include "kernels.h"
#include "dtype_dispatch.cuh"

#include <math.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kStoreBytes = 16;
// Four times the 2048 threads an SM holds at once: a grid this size keeps
// every SM busy to the end while each thread's loop stays short (measured
// on an H100: 2048 per SM was 2-5% slower, one step per thread up to 15%).
constexpr int kThreadsPerSm = 8192;

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

// ---- float element types ----------------------------------------------------

// Math: the arithmetic type; digits: significand bits (uniform resolution);
// min_exp: the exponent of the smallest normal value.
template <typename T> struct Float;
template <> struct Float<float> {
    using Math = float;
    static constexpr int digits = 24, min_exp = -126;
};
template <> struct Float<double> {
    using Math = double;
    static constexpr int digits = 53, min_exp = -1022;
};
template <> struct Float<__half> {
    using Math = float;
    static constexpr int digits = 11, min_exp = -14;
};
template <> struct Float<__nv_bfloat16> {
    using Math = float;
    static constexpr int digits = 8, min_exp = -126;
};

// The largest value of a binary format (`digits` significand bits, smallest
// normal 2^min_exp, with subnormals) strictly below x, x a finite value of
// that format. Exact in double for every format above.
double
next_below(double x, int digits, int min_exp)
{
    if (x == 0.0) {
        return -ldexp(1.0, min_exp - (digits - 1)); // the smallest subnormal
    }
    int e;
    double m = frexp(fabs(x), &e); // |x| = m * 2^e, m in [0.5, 1)
    e -= 1;                        // |x| in [2^e, 2^(e+1))
    int spacing_exp = (e > min_exp ? e : min_exp) - (digits - 1);
    if (x > 0.0 && m == 0.5 && e > min_exp) {
        spacing_exp -= 1; // just below a power of two the spacing halves
    }
    return x - ldexp(1.0, spacing_exp);
}

// ---- words to uniforms ------------------------------------------------------

// k * 2^-d for the top d bits k of x, exactly (d <= 24).
template <int d> __device__ __forceinline__ float unit_float(uint32_t x)
{
    return (float)(x >> (32 - d)) * (1.0f / (float)(1u << d));
}
// 53-bit k * 2^-53 in [0, 1) from two words.
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

// v[0], v[1] = a, b rounded to nearest into T (v at an even index): one
// packed conversion for the 16-bit types.
template <typename T> __device__ __forceinline__ void put2(T *v, float a, float b)
{
    v[0] = a;
    v[1] = b;
}
template <> __device__ __forceinline__ void put2(__half *v, float a, float b)
{
    *reinterpret_cast<__half2 *>(v) = __floats2half2_rn(a, b);
}
template <> __device__ __forceinline__ void put2(__nv_bfloat16 *v, float a, float b)
{
    *reinterpret_cast<__nv_bfloat162 *>(v) = __floats2bfloat162_rn(a, b);
}

// ---- generators: the K values of group g ------------------------------------
//
// Each has K (elements per group) and `operator()(s, g, v)` writing v[0..K).

// x = scale * fma(u, width, base) clamped to [low, top], top the largest
// dtype value below high. Normally scale = 1, base = low, width = high - low;
// when high - low overflows M, scale = 2 and base, width are halved (exact:
// such bounds are far above the subnormals).
template <typename T, typename M = typename Float<T>::Math> struct Uniform {
    static constexpr int K = sizeof(T) == 8 ? 2 : 4;
    M base, width, scale, low, top;
    __device__ __forceinline__ M value(M u) const
    {
        return fmax(fmin(scale * fma(u, width, base), top), low);
    }
    __device__ __forceinline__ void operator()(const Stream &s, int64_t g, T *v) const
    {
        Philox r = s.block(g);
        if constexpr (K == 2) {
            v[0] = value(unit53(r.v[0], r.v[1]));
            v[1] = value(unit53(r.v[2], r.v[3]));
        }
        else {
            constexpr int d = Float<T>::digits;
            put2(v, value(unit_float<d>(r.v[0])), value(unit_float<d>(r.v[1])));
            put2(v + 2, value(unit_float<d>(r.v[2])), value(unit_float<d>(r.v[3])));
        }
    }
};

template <typename T>
Uniform<T>
make_uniform(double low, double high)
{
    using M = typename Float<T>::Math;
    const M lo = (M)low, hi = (M)high;
    const M top = (M)next_below(high, Float<T>::digits, Float<T>::min_exp);
    if (isinf(hi - lo)) {
        return Uniform<T>{lo / 2, hi / 2 - lo / 2, (M)2, lo, top};
    }
    return Uniform<T>{lo, hi - lo, (M)1, lo, top};
}

// (z0, z1): a standard normal pair from words (a, b) in float32.
__device__ __forceinline__ float2
box_muller(uint32_t a, uint32_t b)
{
    const float kTwoPi = 6.283185307179586f;
    float u1 = fmaf((float)a, 0x1p-32f, 0x1p-33f);
    float lg, radius;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(lg) : "f"(u1));
    float r2 = fmaxf(-2.0f * 0.6931471805599453f * lg, 0.0f);
    asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(radius) : "f"(r2));
    float theta = (float)(int32_t)b * (kTwoPi * 0x1p-32f);
    float sn, cs;
    __sincosf(theta, &sn, &cs);
    return make_float2(radius * cs, radius * sn);
}

template <typename T> struct Normal {
    static constexpr int K = 4;
    float mean, std;
    __device__ __forceinline__ void operator()(const Stream &s, int64_t g, T *v) const
    {
        Philox r = s.block(g);
#pragma unroll
        for (int k = 0; k < 4; k += 2) {
            float2 z = box_muller(r.v[k], r.v[k + 1]);
            put2(v + k, fmaf(std, z.x, mean), fmaf(std, z.y, mean));
        }
    }
};

template <> struct Normal<double> {
    static constexpr int K = 2;
    double mean, std;
    __device__ __forceinline__ void operator()(const Stream &s, int64_t g, double *v) const
    {
        Philox r = s.block(g);
        double u1 = unit53_open0(r.v[0], r.v[1]), u2 = unit53(r.v[2], r.v[3]);
        double radius = sqrt(-2.0 * log(u1)), sn, cs;
        sincospi(2.0 * u2, &sn, &cs);
        v[0] = mean + std * (radius * cs);
        v[1] = mean + std * (radius * sn);
    }
};

template <typename T>
Normal<T>
make_normal(double mean, double std)
{
    using M = typename Float<T>::Math;
    return Normal<T>{(M)mean, (M)std};
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

// kWide: span needs 64-bit words (two per element).
template <typename T, bool kWide> struct Integers {
    static constexpr int K = kWide ? 2 : 4;
    int64_t low;
    uint64_t span;
    __device__ __forceinline__ void operator()(const Stream &s, int64_t g, T *v) const
    {
        Philox r = s.block(g);
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
    }
};

// ---- the kernel -------------------------------------------------------------

// One thread step: the E = 16 / sizeof(T) consecutive elements of one
// 16-byte store, G = E / K whole groups.
template <typename T, typename Gen> struct Step {
    static constexpr int E = kStoreBytes / (int)sizeof(T), K = Gen::K, G = E / K;
    static_assert(G >= 1 && G * K == E, "a step is whole groups");
    union {
        T v[E];
        uint4 q;
    };

    __device__ __forceinline__ void generate(const Gen &gen, const Stream &s, int64_t t)
    {
#pragma unroll
        for (int j = 0; j < G; j++) {
            gen(s, t * G + j, v + j * K);
        }
    }
};

template <typename T, typename Gen>
__global__ void __launch_bounds__(kThreads)
fill_kernel(T *__restrict__ out, int64_t n, Gen gen, Stream s)
{
    using S = Step<T, Gen>;
    const int64_t steps = (n + S::E - 1) / S::E;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < steps;
         t += (int64_t)gridDim.x * blockDim.x) {
        S step;
        step.generate(gen, s, t);
        const int64_t base = t * S::E;
        if (base + S::E <= n) {
            *reinterpret_cast<uint4 *>(out + base) = step.q;
        }
        else {
#pragma unroll
            for (int k = 0; k < S::E; k++) {
                if (base + k < n) {
                    out[base + k] = step.v[k];
                }
            }
        }
    }
}

// Stores the two elements q (two 8-byte values) at element e, or those
// of them below n.
template <typename T>
__device__ __forceinline__ void
store_pair(T *out, int64_t n, int64_t e, uint4 q)
{
    static_assert(sizeof(T) == 8, "pairs of 8-byte elements");
    if (e + 2 <= n) {
        *reinterpret_cast<uint4 *>(out + e) = q;
    }
    else if (e < n) {
        *reinterpret_cast<uint2 *>(out + e) = make_uint2(q.x, q.y);
    }
}

// Groups of 32 bytes (int64 from 32-bit words: 4 elements, one memory
// sector). Each thread makes one group; neighbouring lanes swap halves so
// that each 16-byte store instruction of a warp writes whole sectors: lane
// 2i stores the first halves of groups 2i and 2i+1, lane 2i+1 the second
// halves. The whole warp runs every iteration (the swap needs all lanes).
template <typename T, typename Gen>
__global__ void __launch_bounds__(kThreads)
fill_sectors_kernel(T *__restrict__ out, int64_t n, Gen gen, Stream s)
{
    static_assert(Gen::K * sizeof(T) == 32, "one 32-byte group per thread");
    const int64_t groups = (n + Gen::K - 1) / Gen::K;
    const int lane = (int)(threadIdx.x & 31), odd = lane & 1;
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g - lane < groups;
         g += (int64_t)gridDim.x * blockDim.x) {
        union {
            T v[Gen::K];
            uint4 q[2];
        } mine;
        gen(s, g, mine.v);
        uint4 give = odd ? mine.q[0] : mine.q[1], got;
        got.x = __shfl_xor_sync(0xFFFFFFFFu, give.x, 1);
        got.y = __shfl_xor_sync(0xFFFFFFFFu, give.y, 1);
        got.z = __shfl_xor_sync(0xFFFFFFFFu, give.z, 1);
        got.w = __shfl_xor_sync(0xFFFFFFFFu, give.w, 1);
        const int64_t first = (g - odd) * Gen::K + 2 * odd; // in the even lane's group
        store_pair(out, n, first, odd ? got : mine.q[0]);
        store_pair(out, n, first + Gen::K, odd ? mine.q[1] : got);
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

constexpr int kCachedDevices = 64;

// The grid-stride loop's thread count: kThreadsPerSm per SM of the current
// GPU (SM count cached per device).
cudaError_t
grid_threads(int64_t *out)
{
    static int cache[kCachedDevices];
    int device, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) {
        return err;
    }
    bool cacheable = device >= 0 && device < kCachedDevices;
    if (cacheable) {
        sms = cache[device];
    }
    if (sms <= 0) {
        err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        if (err != cudaSuccess) {
            return err;
        }
        if (cacheable) {
            cache[device] = sms;
        }
    }
    *out = (int64_t)sms * kThreadsPerSm;
    return cudaSuccess;
}

// Elements one thread makes per loop iteration.
template <typename T, typename Gen> constexpr int
elements_per_thread()
{
    if constexpr (Gen::K * sizeof(T) == 32) {
        return Gen::K;
    }
    else {
        return Step<T, Gen>::E;
    }
}

// n elements from generator `gen` into the 16-byte aligned `out`.
template <typename T, typename Gen>
cudaError_t
launch(void *out, int64_t n, const Gen &gen, uint64_t key, uint64_t offset,
       cudaStream_t stream)
{
    if (n < 0 || (uintptr_t)out % kStoreBytes != 0) {
        return cudaErrorInvalidValue;
    }
    if (n == 0) {
        return cudaSuccess;
    }
    constexpr bool sectors = Gen::K * sizeof(T) == 32;
    constexpr int E = elements_per_thread<T, Gen>();
    int64_t threads, steps = (n + E - 1) / E;
    cudaError_t err = grid_threads(&threads);
    if (err != cudaSuccess) {
        return err;
    }
    if (steps < threads) {
        threads = steps;
    }
    unsigned int grid = (unsigned int)((threads + kThreads - 1) / kThreads);
    if constexpr (sectors) {
        fill_sectors_kernel<T, Gen><<<grid, kThreads, 0, stream>>>(static_cast<T *>(out), n,
                                                                   gen, make_stream(key, offset));
    }
    else {
        fill_kernel<T, Gen><<<grid, kThreads, 0, stream>>>(static_cast<T *>(out), n, gen,
                                                           make_stream(key, offset));
    }
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t
cl_random_normal(void *out, cl_dtype dtype, int64_t n, double mean, double std, uint64_t key,
                 uint64_t offset, cudaStream_t stream)
{
    CL_DISPATCH(dtype, CL_FLOAT_TYPES,
                return launch<scalar_t>(out, n, make_normal<scalar_t>(mean, std), key, offset,
                                        stream));
}

extern "C" cudaError_t
cl_random_uniform(void *out, cl_dtype dtype, int64_t n, double low, double high, uint64_t key,
                  uint64_t offset, cudaStream_t stream)
{
    if (!(low < high)) {
        return cudaErrorInvalidValue;
    }
    CL_DISPATCH(dtype, CL_FLOAT_TYPES,
                return launch<scalar_t>(out, n, make_uniform<scalar_t>(low, high), key, offset,
                                        stream));
}

extern "C" cudaError_t
cl_random_integers(void *out, cl_dtype dtype, int64_t n, int64_t low, uint64_t span,
                   uint64_t key, uint64_t offset, cudaStream_t stream)
{
    if (span > 0xFFFFFFFFull) {
        CL_DISPATCH(dtype, CL_INT_TYPES,
                    return launch<scalar_t>(out, n, Integers<scalar_t, true>{low, span}, key,
                                            offset, stream));
    }
    CL_DISPATCH(dtype, CL_INT_TYPES,
                return launch<scalar_t>(out, n, Integers<scalar_t, false>{low, span}, key,
                                        offset, stream));
}

extern "C" cudaError_t
cl_philox4x32_10(uint32_t *out, const uint32_t counter[4], const uint32_t key[2],
                 cudaStream_t stream)
{
    philox_kat_kernel<<<1, 1, 0, stream>>>(out, counter[0], counter[1], counter[2], counter[3],
                                           key[0], key[1]);
    return cudaGetLastError();
}
