// Copies between device arrays of any layout, with dtype conversion.
//
// Used by ascontiguousarray, copy(), astype() and get() of non-dense views.
// Every element goes through cl::convert (dtype_convert.cuh): float to
// integer saturates, NaN -> 0.
// The launcher first simplifies the layout (drops extent-1 axes, merges axes
// that are contiguous in both arrays), then picks the cheapest path:
//   1. same dtype, both dense in the same order  -> one cudaMemcpyAsync
//   2. both contiguous after merging, any dtypes -> copy_cast_vec4 when both
//      pointers are aligned to 4 elements (4 elements per load and store),
//      else copy_cast_contiguous: flat grid-stride loops, coalesced
//   3. same dtype, two axes left, destination rows unit-stride and source
//      columns unit-stride (dst strides (N, 1), src strides (1, M): the
//      source is the transpose of the destination, as in
//      ascontiguousarray(a.T)) -> cl_transpose_2d's best tiled kernel
//      (transpose.cu), coalesced on both sides through shared memory
//   4. anything else                             -> copy_cast_strided:
//      one thread per destination element (in destination order, so writes
//      coalesce), source offset decoded from the index axis by axis
#include "kernels.h"
#include "dtype_convert.cuh"

namespace {

constexpr int kThreads = 256;

template <typename Dst, typename Src>
__global__ void __launch_bounds__(kThreads)
copy_cast_contiguous(Dst *__restrict__ dst, const Src *__restrict__ src, int64_t n)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = cl::convert<Dst>(src[i]);
    }
}

// Four elements moved as one aligned load and one aligned store.
template <typename T>
struct alignas(4 * sizeof(T)) Vec4 {
    T v[4];
};

// n elements as n / 4 vectors; block 0 also copies the last n % 4 elements.
template <typename Dst, typename Src>
__global__ void __launch_bounds__(kThreads)
copy_cast_vec4(Dst *__restrict__ dst, const Src *__restrict__ src, int64_t n)
{
    int64_t nvec = n / 4;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const Vec4<Src> *in = reinterpret_cast<const Vec4<Src> *>(src);
    Vec4<Dst> *out = reinterpret_cast<Vec4<Dst> *>(dst);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) {
        Vec4<Src> a = in[i];
        Vec4<Dst> b;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            b.v[k] = cl::convert<Dst>(a.v[k]);
        }
        out[i] = b;
    }
    int64_t tail = nvec * 4 + threadIdx.x;
    if (blockIdx.x == 0 && tail < n) {
        dst[tail] = cl::convert<Dst>(src[tail]);
    }
}

template <typename Dst, typename Src>
__global__ void __launch_bounds__(kThreads)
copy_cast_strided(Dst *__restrict__ dst, const Src *__restrict__ src, cl_layout dst_layout,
                  cl_layout src_layout, int64_t n)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t rest = i, dst_off = 0, src_off = 0;
        // Innermost axis first; ndim is small and uniform across the grid.
        for (int d = dst_layout.ndim - 1; d >= 0; d--) {
            int64_t extent = dst_layout.shape[d];
            int64_t idx = rest % extent;
            rest /= extent;
            dst_off += idx * dst_layout.strides[d];
            src_off += idx * src_layout.strides[d];
        }
        dst[dst_off] = cl::convert<Dst>(src[src_off]);
    }
}

unsigned int
grid_for(int64_t n)
{
    // Enough blocks to fill any current GPU several times over; the
    // grid-stride loop covers the rest.
    int64_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned int)(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

template <typename Dst, typename Src>
cudaError_t
launch(void *dst, const void *src, bool contiguous, const cl_layout &dl, const cl_layout &sl,
       int64_t n, cudaStream_t stream)
{
    bool aligned = (uintptr_t)dst % sizeof(Vec4<Dst>) == 0 &&
                   (uintptr_t)src % sizeof(Vec4<Src>) == 0;
    if (contiguous && aligned) {
        copy_cast_vec4<Dst, Src><<<grid_for(n / 4 + 1), kThreads, 0, stream>>>(
            static_cast<Dst *>(dst), static_cast<const Src *>(src), n);
    }
    else if (contiguous) {
        copy_cast_contiguous<Dst, Src><<<grid_for(n), kThreads, 0, stream>>>(
            static_cast<Dst *>(dst), static_cast<const Src *>(src), n);
    }
    else {
        copy_cast_strided<Dst, Src><<<grid_for(n), kThreads, 0, stream>>>(
            static_cast<Dst *>(dst), static_cast<const Src *>(src), dl, sl, n);
    }
    return cudaGetLastError();
}

template <typename Src>
cudaError_t
dispatch_dst(cl_dtype dst_dtype, void *dst, const void *src, bool contiguous,
             const cl_layout &dl, const cl_layout &sl, int64_t n, cudaStream_t stream)
{
    switch (dst_dtype) {
    case CL_BOOL: return launch<bool, Src>(dst, src, contiguous, dl, sl, n, stream);
    case CL_INT8: return launch<int8_t, Src>(dst, src, contiguous, dl, sl, n, stream);
    case CL_UINT8: return launch<uint8_t, Src>(dst, src, contiguous, dl, sl, n, stream);
    case CL_INT32: return launch<int32_t, Src>(dst, src, contiguous, dl, sl, n, stream);
    case CL_INT64: return launch<int64_t, Src>(dst, src, contiguous, dl, sl, n, stream);
    case CL_FLOAT16: return launch<__half, Src>(dst, src, contiguous, dl, sl, n, stream);
    case CL_BFLOAT16: return launch<__nv_bfloat16, Src>(dst, src, contiguous, dl, sl, n, stream);
    case CL_FLOAT32: return launch<float, Src>(dst, src, contiguous, dl, sl, n, stream);
    case CL_FLOAT64: return launch<double, Src>(dst, src, contiguous, dl, sl, n, stream);
    default: return cudaErrorInvalidValue;
    }
}

// Drop extent-1 axes, then merge neighbours that are contiguous in both
// layouts. Afterwards a fully contiguous pair has ndim == 1 and strides 1.
void
simplify(int ndim, const int64_t *shape, const int64_t *dst_strides,
         const int64_t *src_strides, cl_layout *dl, cl_layout *sl)
{
    int n = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 1) {
            continue;
        }
        if (n > 0 && dl->strides[n - 1] == dst_strides[i] * shape[i] &&
            sl->strides[n - 1] == src_strides[i] * shape[i]) {
            dl->shape[n - 1] *= shape[i];
            sl->shape[n - 1] = dl->shape[n - 1];
            dl->strides[n - 1] = dst_strides[i];
            sl->strides[n - 1] = src_strides[i];
            continue;
        }
        dl->shape[n] = sl->shape[n] = shape[i];
        dl->strides[n] = dst_strides[i];
        sl->strides[n] = src_strides[i];
        n++;
    }
    if (n == 0) { // a single element
        dl->shape[0] = sl->shape[0] = 1;
        dl->strides[0] = sl->strides[0] = 1;
        n = 1;
    }
    dl->ndim = sl->ndim = n;
}

} // namespace

extern "C" cudaError_t
cl_copy_cast(void *dst, cl_dtype dst_dtype, const int64_t *dst_strides, const void *src,
             cl_dtype src_dtype, const int64_t *src_strides, int ndim, const int64_t *shape,
             cudaStream_t stream)
{
    if (ndim < 0 || ndim > CL_MAX_NDIM || dst_dtype < 0 || dst_dtype >= CL_NUM_DTYPES ||
        src_dtype < 0 || src_dtype >= CL_NUM_DTYPES) {
        return cudaErrorInvalidValue;
    }
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        n *= shape[i];
    }
    if (n == 0) {
        return cudaSuccess;
    }
    cl_layout dl, sl;
    simplify(ndim, shape, dst_strides, src_strides, &dl, &sl);
    bool contiguous = dl.ndim == 1 && dl.strides[0] == 1 && sl.strides[0] == 1;
    if (contiguous && dst_dtype == src_dtype) {
        static const size_t sizes[CL_NUM_DTYPES] = {1, 1, 1, 4, 8, 2, 2, 4, 8};
        return cudaMemcpyAsync(dst, src, (size_t)n * sizes[dst_dtype], cudaMemcpyDeviceToDevice,
                               stream);
    }
    if (dst_dtype == src_dtype && dl.ndim == 2 && dl.strides[1] == 1 && sl.strides[0] == 1 &&
        sl.strides[1] != 1) {
        // dst[r][c] = src[r + c * s]: dst is the transpose of the matrix S
        // (C x R, row stride s) that src's memory holds.
        return cl_transpose_2d(dst, dl.strides[0], src, sl.strides[1], 1, dl.shape[1],
                               dl.shape[0], dst_dtype, CL_TRANSPOSE_BEST, stream);
    }
    switch (src_dtype) {
    case CL_BOOL: return dispatch_dst<bool>(dst_dtype, dst, src, contiguous, dl, sl, n, stream);
    case CL_INT8: return dispatch_dst<int8_t>(dst_dtype, dst, src, contiguous, dl, sl, n, stream);
    case CL_UINT8: return dispatch_dst<uint8_t>(dst_dtype, dst, src, contiguous, dl, sl, n, stream);
    case CL_INT32: return dispatch_dst<int32_t>(dst_dtype, dst, src, contiguous, dl, sl, n, stream);
    case CL_INT64: return dispatch_dst<int64_t>(dst_dtype, dst, src, contiguous, dl, sl, n, stream);
    case CL_FLOAT16: return dispatch_dst<__half>(dst_dtype, dst, src, contiguous, dl, sl, n, stream);
    case CL_BFLOAT16:
        return dispatch_dst<__nv_bfloat16>(dst_dtype, dst, src, contiguous, dl, sl, n, stream);
    case CL_FLOAT32: return dispatch_dst<float>(dst_dtype, dst, src, contiguous, dl, sl, n, stream);
    case CL_FLOAT64: return dispatch_dst<double>(dst_dtype, dst, src, contiguous, dl, sl, n, stream);
    default: return cudaErrorInvalidValue;
    }
}
