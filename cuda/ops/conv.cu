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
template <typename Tin, typename Tout, int VEC, bool CHANNEL_VECTORS>
__global__ void im2col_kernel(Tout *__restrict__ dst, const Tin *__restrict__ src,
                              cl_conv_geometry g, int64_t total)
{
    const int cols = g.k_padded / VEC;
    const int k = g.kh * g.kw * g.c;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int r = (int)(i / cols);
        int j = (int)(i - (int64_t)r * cols) * VEC;
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

// The larger of a and b, NaN if either is NaN (torch's max_pool2d propagates
// NaN; fmaxf and a plain `a >= b ? a : b` would drop a NaN held in `a`).
template <typename T> __device__ __forceinline__ T max_of(T a, T b)
{
    const auto x = cl::widen(a), y = cl::widen(b);
    return (x >= y || x != x) ? a : b;
}

// One thread per VEC channels of one output pixel.
template <typename T, int VEC>
__global__ void max_pool_kernel(T *__restrict__ dst, const T *__restrict__ src,
                                cl_conv_geometry g, int64_t total)
{
    const int groups = g.c / VEC;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int r = (int)(i / groups);
        int c = (int)(i - (int64_t)r * groups) * VEC;
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
        int64_t total = rows * g->k_padded;
        im2col_kernel<Tin, Tout, 1, false><<<grid_for(total), kThreads, 0, stream>>>(
            (Tout *)dst, (const Tin *)src, *g, total);
        return cudaGetLastError();
    }
    int64_t total = rows * (g->k_padded / vec);
    if (std::is_same<Tin, Tout>::value && g->c % vec == 0 && aligned16(src)) {
        im2col_kernel<Tin, Tout, vec, true><<<grid_for(total), kThreads, 0, stream>>>(
            (Tout *)dst, (const Tin *)src, *g, total);
    } else {
        im2col_kernel<Tin, Tout, vec, false><<<grid_for(total), kThreads, 0, stream>>>(
            (Tout *)dst, (const Tin *)src, *g, total);
    }
    return cudaGetLastError();
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
        int64_t total = pixels * (g->c / vec);
        max_pool_kernel<T, vec><<<grid_for(total), kThreads, 0, stream>>>(
            (T *)dst, (const T *)src, *g, total);
    } else {
        int64_t total = pixels * g->c;
        max_pool_kernel<T, 1><<<grid_for(total), kThreads, 0, stream>>>((T *)dst, (const T *)src,
                                                                         *g, total);
    }
    return cudaGetLastError();
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
