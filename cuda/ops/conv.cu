// Convolution as GEMM in NHWC: the data movement around the GEMMs.
//
//   im2col      (N, H, W, C) -> (N*OH*OW, Kp): row (n, oh, ow) holds the kh x kw
//               window under that output position, ordered (ky, kx, c), zeros
//               where the window hangs over the padding, then zeros up to Kp
//               (K = kh*kw*C rounded up so the GEMM's K is tensor-core aligned).
//               A 1x1 stride-2 convolution uses it as a strided gather.
//   max_pool    kernel x kernel max over NHWC windows (padding never wins; a
//               NaN in the window gives NaN, as in torch)
//   avg_pool    global mean over H*W: (N, H, W, C) -> (N, C), float32 sums
//   pad_channels (P, C) -> (P, Cp): the cast images with zero channels added,
//               so that the implicit-GEMM stem reads whole 16-byte vectors
//
// All three index the output linearly and decompose the index into
// coordinates; adjacent threads own adjacent channels, so reads and writes of
// a pixel's channel vector are coalesced. Where the channel count allows, a
// thread moves a 16-byte vector (8 halves or 4 floats) at once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dtype_convert.cuh"
#include "dtype_dispatch.cuh"
#include "kernels.h"

#include <math.h>
#include <type_traits>

namespace {

constexpr int kThreads = 256;

template <typename T, int N> struct alignas(sizeof(T) * N) Vec {
    T v[N];
};

// Output position (n, oh, ow) of output row r. 32-bit: the launchers refuse
// more than INT32_MAX rows (64-bit division costs several times as much, and
// the stem's im2col does little else).
struct RowCoord {
    int n, oh, ow;
};

__device__ __forceinline__ RowCoord row_coord(int r, int oh_size, int ow_size)
{
    RowCoord p;
    p.ow = r % ow_size;
    int t = r / ow_size;
    p.oh = t % oh_size;
    p.n = t / oh_size;
    return p;
}

// One thread per VEC consecutive columns of one output row, written as one
// 16-byte store. With C % VEC == 0 (and Tin == Tout) the VEC columns are one
// tap's channels: one 16-byte load. Otherwise (the stem: C = 3, float32 in)
// the thread walks its columns tap by tap with scalar loads.
// Index: the flat loop index, 32-bit whenever the launch allows (a 64-bit
// division per vector cost the stem's gather a third of its time).
template <typename Index, typename Tin, typename Tout, int VEC, bool CHANNEL_VECTORS>
__global__ void im2col_kernel(Tout *__restrict__ dst, const Tin *__restrict__ src,
                              cl_conv_geometry g, Index total)
{
    const int cols = g.k_padded / VEC;
    const int k = g.kh * g.kw * g.c;
    for (Index i = blockIdx.x * (Index)blockDim.x + threadIdx.x; i < total;
         i += (Index)gridDim.x * blockDim.x) {
        int r = (int)(i / cols);
        int j = (int)(i - (Index)r * cols) * VEC;
        RowCoord p = row_coord(r, g.oh, g.ow);
        const int ih0 = p.oh * g.stride - g.padding, iw0 = p.ow * g.stride - g.padding;
        const Tin *image = src + (int64_t)p.n * g.h * g.w * g.c;
        Vec<Tout, VEC> out;
        int c = j % g.c, tap = j / g.c;
        if constexpr (CHANNEL_VECTORS) {
            int ih = ih0 + tap / g.kw, iw = iw0 + tap % g.kw;
            if (j < k && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) {
                out = *reinterpret_cast<const Vec<Tout, VEC> *>(
                    image + ((int64_t)ih * g.w + iw) * g.c + c);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    out.v[e] = cl::convert<Tout>(0.0f);
                }
            }
        } else {
            int ky = tap / g.kw, kx = tap % g.kw;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                int ih = ih0 + ky, iw = iw0 + kx;
                bool inside = j + e < k && ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
                out.v[e] = inside ? cl::convert<Tout>(image[((int64_t)ih * g.w + iw) * g.c + c])
                                  : cl::convert<Tout>(0.0f);
                if (++c == g.c) {
                    c = 0;
                    if (++kx == g.kw) {
                        kx = 0;
                        ky++;
                    }
                }
            }
        }
        reinterpret_cast<Vec<Tout, VEC> *>(dst)[i] = out;
    }
}

// A few channels per tap (the stem: 3 float32 channels) are not one vector,
// and gathering them element by element from global memory made the stem's
// im2col the slowest step per byte. Here a block takes ROWS consecutive
// output pixels of one output row: it first stages the kh input rows their
// windows cover (converted to Tout, zeros over the padding) in shared
// memory with coalesced loads, and a table of each column's offset in that
// patch; then every output row is the same gather shifted by stride * c, and
// is written as 16-byte vectors.
template <typename Tin, typename Tout, int ROWS>
__global__ void im2col_rows_kernel(Tout *__restrict__ dst, const Tin *__restrict__ src,
                                   cl_conv_geometry g)
{
    extern __shared__ __align__(16) unsigned char staged[];
    constexpr int VEC = 16 / sizeof(Tout);
    const int tiles = (g.ow + ROWS - 1) / ROWS;
    const int tile = blockIdx.x % tiles;
    const int oh = (blockIdx.x / tiles) % g.oh;
    const int n = blockIdx.x / tiles / g.oh;
    const int ow0 = tile * ROWS;
    const int count = min(ROWS, g.ow - ow0);
    const int w_in = (ROWS - 1) * g.stride + g.kw;
    const int k = g.kh * g.kw * g.c;
    int *column = reinterpret_cast<int *>(staged);
    Tout *patch = reinterpret_cast<Tout *>(staged + ((g.k_padded * sizeof(int) + 15) & ~15));
    for (int j = threadIdx.x; j < g.k_padded; j += blockDim.x) {
        const int tap = j / g.c;
        column[j] = j < k ? ((tap / g.kw) * w_in + tap % g.kw) * g.c + j % g.c : -1;
    }
    const int ih0 = oh * g.stride - g.padding, iw0 = ow0 * g.stride - g.padding;
    const Tin *image = src + (int64_t)n * g.h * g.w * g.c;
    for (int e = threadIdx.x; e < g.kh * w_in * g.c; e += blockDim.x) {
        const int ch = e % g.c, x = (e / g.c) % w_in, ky = e / g.c / w_in;
        const int ih = ih0 + ky, iw = iw0 + x;
        patch[e] = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w
                       ? cl::convert<Tout>(image[((int64_t)ih * g.w + iw) * g.c + ch])
                       : cl::convert<Tout>(0.0f);
    }
    __syncthreads();
    const int vecs = g.k_padded / VEC;
    Vec<Tout, VEC> *rows = reinterpret_cast<Vec<Tout, VEC> *>(
        dst + (((int64_t)n * g.oh + oh) * g.ow + ow0) * g.k_padded);
    for (int v = threadIdx.x; v < count * vecs; v += blockDim.x) {
        const int r = v / vecs, j0 = (v - r * vecs) * VEC, shift = r * g.stride * g.c;
        Vec<Tout, VEC> out;
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            const int at = column[j0 + e];
            out.v[e] = at >= 0 ? patch[at + shift] : cl::convert<Tout>(0.0f);
        }
        rows[v] = out;
    }
}

// The larger of a and b, NaN if either is NaN (torch's max_pool2d propagates
// NaN; fmaxf and a plain `a >= b ? a : b` would drop a NaN held in `a`).
template <typename T> __device__ __forceinline__ T max_of(T a, T b)
{
    const auto x = cl::widen(a), y = cl::widen(b);
    return (x >= y || x != x) ? a : b;
}

// One thread per VEC channels of one output pixel.
template <typename Index, typename T, int VEC>
__global__ void max_pool_kernel(T *__restrict__ dst, const T *__restrict__ src,
                                cl_conv_geometry g, Index total)
{
    const int groups = g.c / VEC;
    for (Index i = blockIdx.x * (Index)blockDim.x + threadIdx.x; i < total;
         i += (Index)gridDim.x * blockDim.x) {
        int r = (int)(i / groups);
        int c = (int)(i - (Index)r * groups) * VEC;
        RowCoord p = row_coord(r, g.oh, g.ow);
        Vec<T, VEC> best;
        bool any = false;
        for (int ky = 0; ky < g.kh; ky++) {
            int ih = p.oh * g.stride - g.padding + ky;
            if (ih < 0 || ih >= g.h) {
                continue;
            }
            for (int kx = 0; kx < g.kw; kx++) {
                int iw = p.ow * g.stride - g.padding + kx;
                if (iw < 0 || iw >= g.w) {
                    continue;
                }
                const T *at = src + (((int64_t)p.n * g.h + ih) * g.w + iw) * g.c + c;
                Vec<T, VEC> v = *reinterpret_cast<const Vec<T, VEC> *>(at);
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    best.v[e] = any ? max_of(best.v[e], v.v[e]) : v.v[e];
                }
                any = true;
            }
        }
        // A window entirely in the padding (impossible when padding < kernel) stays -inf.
        if (!any) {
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                best.v[e] = cl::convert<T>(-INFINITY);
            }
        }
        reinterpret_cast<Vec<T, VEC> *>(dst)[i] = best;
    }
}

// One thread per channel of one image: a strided walk over H*W pixels, summed
// in float32 (double for float64). Adjacent threads read adjacent channels.
template <typename T>
__global__ void avg_pool_kernel(T *__restrict__ dst, const T *__restrict__ src, int64_t n,
                                int64_t hw, int64_t c)
{
    using acc_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * c;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t img = i / c, ch = i - img * c;
        const T *at = src + img * hw * c + ch;
        acc_t sum = 0;
        for (int64_t p = 0; p < hw; p++) {
            sum += (acc_t)cl::widen(at[p * c]);
        }
        dst[i] = cl::convert<T>(sum / (acc_t)hw);
    }
}

int grid_for(int64_t total)
{
    int64_t blocks = (total + kThreads - 1) / kThreads;
    return (int)(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

// Launch with a 32-bit flat index when `total` (plus one grid stride) fits,
// else 64-bit; returns the launch's error.
template <typename Launch> cudaError_t launch_indexed(int64_t total, Launch launch)
{
    if (total + (int64_t)65535 * 8 * kThreads < INT32_MAX) {
        launch((int32_t)total);
    } else {
        launch(total);
    }
    return cudaGetLastError();
}

template <typename Tin, typename Tout>
cudaError_t launch_im2col(void *dst, const void *src, const cl_conv_geometry *g,
                          cudaStream_t stream)
{
    int64_t rows = (int64_t)g->n * g->oh * g->ow;
    constexpr int vec = 16 / sizeof(Tout);
    if (rows > INT32_MAX) {
        return cudaErrorInvalidValue;
    }
    if (g->k_padded % vec != 0 || !aligned16(dst)) {
        // Rows that are not whole 16-byte vectors: one element per thread.
        return launch_indexed(rows * g->k_padded, [&](auto total) {
            using Index = decltype(total);
            im2col_kernel<Index, Tin, Tout, 1, false><<<grid_for(total), kThreads, 0, stream>>>(
                (Tout *)dst, (const Tin *)src, *g, total);
        });
    }
    constexpr int staged_rows = 64;
    const size_t staged = ((g->k_padded * sizeof(int) + 15) & ~(size_t)15) +
                          (size_t)g->kh * ((staged_rows - 1) * g->stride + g->kw) * g->c *
                              sizeof(Tout);
    const int64_t blocks = (int64_t)g->n * g->oh * ((g->ow + staged_rows - 1) / staged_rows);
    if (g->c < vec && staged <= 48 * 1024 && blocks <= INT32_MAX) {
        // Few channels (the stem): the windows staged in shared memory.
        im2col_rows_kernel<Tin, Tout, staged_rows><<<(int)blocks, kThreads, staged, stream>>>(
            (Tout *)dst, (const Tin *)src, *g);
        return cudaGetLastError();
    }
    if (std::is_same<Tin, Tout>::value && g->c % vec == 0 && aligned16(src)) {
        return launch_indexed(rows * (g->k_padded / vec), [&](auto total) {
            using Index = decltype(total);
            im2col_kernel<Index, Tin, Tout, vec, true><<<grid_for(total), kThreads, 0, stream>>>(
                (Tout *)dst, (const Tin *)src, *g, total);
        });
    }
    return launch_indexed(rows * (g->k_padded / vec), [&](auto total) {
        using Index = decltype(total);
        im2col_kernel<Index, Tin, Tout, vec, false><<<grid_for(total), kThreads, 0, stream>>>(
            (Tout *)dst, (const Tin *)src, *g, total);
    });
}

template <typename T>
cudaError_t launch_max_pool(void *dst, const void *src, const cl_conv_geometry *g,
                            cudaStream_t stream)
{
    int64_t pixels = (int64_t)g->n * g->oh * g->ow;
    constexpr int vec = 16 / sizeof(T);
    if (pixels > INT32_MAX) {
        return cudaErrorInvalidValue;
    }
    if (g->c % vec == 0 && aligned16(dst) && aligned16(src)) {
        return launch_indexed(pixels * (g->c / vec), [&](auto total) {
            using Index = decltype(total);
            max_pool_kernel<Index, T, vec><<<grid_for(total), kThreads, 0, stream>>>(
                (T *)dst, (const T *)src, *g, total);
        });
    }
    return launch_indexed(pixels * g->c, [&](auto total) {
        using Index = decltype(total);
        max_pool_kernel<Index, T, 1><<<grid_for(total), kThreads, 0, stream>>>(
            (T *)dst, (const T *)src, *g, total);
    });
}

// One thread per output pixel: c loads, then the CP converted channels as
// one vector store (the stem: 3 floats in, 4 halves or floats out).
template <typename Tin, typename Tout, int CP>
__global__ void pad_channels_kernel(Tout *__restrict__ dst, const Tin *__restrict__ src,
                                    int64_t pixels, int c)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < pixels;
         i += (int64_t)gridDim.x * blockDim.x) {
        Vec<Tout, CP> out;
#pragma unroll
        for (int e = 0; e < CP; e++) {
            out.v[e] = e < c ? cl::convert<Tout>(src[i * c + e]) : cl::convert<Tout>(0.0f);
        }
        reinterpret_cast<Vec<Tout, CP> *>(dst)[i] = out;
    }
}

template <typename Tin, typename Tout>
__global__ void pad_channels_any_kernel(Tout *__restrict__ dst, const Tin *__restrict__ src,
                                        int64_t pixels, int c, int cp)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < pixels * cp;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t pixel = i / cp;
        int e = (int)(i - pixel * cp);
        dst[i] = e < c ? cl::convert<Tout>(src[pixel * c + e]) : cl::convert<Tout>(0.0f);
    }
}

template <typename Tin, typename Tout>
cudaError_t launch_pad_channels(void *dst, const void *src, int64_t pixels, int c, int cp,
                                cudaStream_t stream)
{
    constexpr int vec = 16 / sizeof(Tout);
    if (cp == vec && aligned16(dst)) {
        pad_channels_kernel<Tin, Tout, vec><<<grid_for(pixels), kThreads, 0, stream>>>(
            (Tout *)dst, (const Tin *)src, pixels, c);
    } else if (cp == 4 && ((uintptr_t)dst & (4 * sizeof(Tout) - 1)) == 0) {
        // The stem's 4 channels: one 8-byte (half) or 16-byte (float) store.
        pad_channels_kernel<Tin, Tout, 4><<<grid_for(pixels), kThreads, 0, stream>>>(
            (Tout *)dst, (const Tin *)src, pixels, c);
    } else {
        pad_channels_any_kernel<Tin, Tout><<<grid_for(pixels * cp), kThreads, 0, stream>>>(
            (Tout *)dst, (const Tin *)src, pixels, c, cp);
    }
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t cl_im2col(void *dst, cl_dtype dst_dtype, const void *src,
                                 cl_dtype src_dtype, const cl_conv_geometry *g,
                                 cudaStream_t stream)
{
    if ((int64_t)g->n * g->oh * g->ow == 0) {
        return cudaSuccess;
    }
    if (src_dtype == CL_FLOAT32 && dst_dtype != CL_FLOAT32) {
        // The network's stem: float32 images cast on the fly into half operands.
        CL_DISPATCH(dst_dtype, CL_FLOAT_TYPES,
                    return (launch_im2col<float, scalar_t>(dst, src, g, stream)));
    }
    if (src_dtype != dst_dtype) {
        return cudaErrorInvalidValue;
    }
    CL_DISPATCH(src_dtype, CL_FLOAT_TYPES,
                return (launch_im2col<scalar_t, scalar_t>(dst, src, g, stream)));
}

extern "C" cudaError_t cl_max_pool_nhwc(void *dst, const void *src, cl_dtype dtype,
                                        const cl_conv_geometry *g, cudaStream_t stream)
{
    if ((int64_t)g->n * g->oh * g->ow * g->c == 0) {
        return cudaSuccess;
    }
    CL_DISPATCH(dtype, CL_FLOAT_TYPES, return launch_max_pool<scalar_t>(dst, src, g, stream));
}

extern "C" cudaError_t cl_avg_pool_nhwc(void *dst, const void *src, cl_dtype dtype, int64_t n,
                                        int64_t hw, int64_t c, cudaStream_t stream)
{
    if (n * c == 0) {
        return cudaSuccess;
    }
    CL_DISPATCH(dtype, CL_FLOAT_TYPES, {
        avg_pool_kernel<scalar_t><<<grid_for(n * c), kThreads, 0, stream>>>(
            (scalar_t *)dst, (const scalar_t *)src, n, hw, c);
        return cudaGetLastError();
    });
}

extern "C" cudaError_t cl_pad_channels(void *dst, cl_dtype dst_dtype, const void *src,
                                       cl_dtype src_dtype, int64_t pixels, int c, int c_padded,
                                       cudaStream_t stream)
{
    if (c < 1 || c_padded < c || c_padded > 64) {
        return cudaErrorInvalidValue;
    }
    if (pixels == 0) {
        return cudaSuccess;
    }
    if (src_dtype == CL_FLOAT32 && dst_dtype != CL_FLOAT32) {
        CL_DISPATCH(dst_dtype, CL_FLOAT_TYPES,
                    return (launch_pad_channels<float, scalar_t>(dst, src, pixels, c, c_padded,
                                                                 stream)));
    }
    if (src_dtype != dst_dtype) {
        return cudaErrorInvalidValue;
    }
    CL_DISPATCH(src_dtype, CL_FLOAT_TYPES,
                return (launch_pad_channels<scalar_t, scalar_t>(dst, src, pixels, c, c_padded,
                                                                stream)));
}
