// Softmax and log_softmax along one axis (see cl_softmax_desc in kernels.h).
//
// A row is the `len` elements of one (outer, inner) position along the axis;
// rows are numbered row = o * inner + i. Every kernel subtracts the row's
// maximum m before exp, so no exp overflows:
//     softmax     y = exp(x - m) / s           s = sum over the row of exp(x - m)
//     log_softmax y = (x - m) - log(s)
// Arithmetic is in float32 for float16/bfloat16/float32 and in float64 for
// float64. Softmax is memory-bound: the ideal is one read and one write of
// every element.
//
// Kernels (the launcher picks one from the layout; between 1 and 2,
// row_dispatch.cuh, which cross_entropy.cu shares):
//   1. softmax_warp   -- the axis is contiguous and len <= 1024: one warp per
//      row. The row is loaded once into registers (up to 32 elements per
//      lane; 16-byte vector loads and stores when every row is aligned), the
//      max and the sum are warp shuffles, and the result is written from the
//      registers: one read and one write per element.
//   2. softmax_block  -- the axis is contiguous and longer: one block per
//      row, 128 to 512 threads wide by the row's length. The first pass
//      keeps a running (max, sum) per thread:
//      when the max grows the sum so far is rescaled by exp(old - new), so
//      one pass finds both. The pairs are combined across the block, and a
//      second pass re-reads the row (mostly from L2) and writes it. Vector
//      loads when aligned.
//   3. softmax_cols   -- the axis is strided: a block owns 32 neighbouring
//      rows (coalesced when they are neighbours in memory, inner stride 1)
//      and its 8 warps split the axis; running (max, sum) pairs per thread
//      are combined through shared memory, then each warp writes its part.
//
// Special values, as PyTorch: NaN anywhere in a row, or +inf, gives a NaN
// sum and so a row of NaN; a row of only -inf has m = -inf and gives NaN.
// The running form keeps exactly these results: an element equal to -inf
// adds 0 even while the max is still -inf (exp(-inf - -inf) would be NaN).
// Results do not depend on the grid: every row is combined in a fixed order.
#include "kernels.h"
#include "dtype_convert.cuh"
#include "dtype_dispatch.cuh"
#include "row_dispatch.cuh"
#include "row_softmax.cuh"

namespace {

using namespace cl_rows;

constexpr int kThreads = 256; // softmax_cols: 8 warps split the axis of 32 rows
constexpr int kWarps = kThreads / 32;

struct Params {
    const void *src;
    void *dst;
    int64_t rows; // outer * inner
    int64_t inner, len;
    int64_t src_outer, src_inner, src_len; // elements
    int64_t dst_outer, dst_inner, dst_len;
    int log;
};

__device__ __forceinline__ int64_t
row_offset(int64_t row, int64_t inner, int64_t outer_stride, int64_t inner_stride)
{
    const int64_t o = row / inner;
    return o * outer_stride + (row - o * inner) * inner_stride;
}

// y for one element from the row's m and `scale` (1 / s, or log(s) for log_softmax).
template <typename T, typename A> __device__ __forceinline__ T output(A x, A m, A scale, int log)
{
    return cl::convert<T>(log ? (x - m) - scale : exp_(x - m) * scale);
}

// ---- kernel 1: a warp per row, the row in registers -----------------------------

// Lane `lane` holds elements (c * 32 + lane) * kVec + j, c < kChunks, j < kVec.
template <typename T, int kVec, int kChunks>
__global__ void __launch_bounds__(kWarpRowThreads) softmax_warp(Params p)
{
    using A = typename AccOf<T>::type;
    constexpr int kPer = kVec * kChunks;
    const int lane = threadIdx.x % 32;
    for (int64_t row = (int64_t)blockIdx.x * kWarpRowsPerBlock + threadIdx.x / 32; row < p.rows;
         row += (int64_t)gridDim.x * kWarpRowsPerBlock) {
        const T *src = static_cast<const T *>(p.src) +
                       row_offset(row, p.inner, p.src_outer, p.src_inner);
        T *dst = static_cast<T *>(p.dst) + row_offset(row, p.inner, p.dst_outer, p.dst_inner);
        A x[kPer];
        A m = neg_inf<A>();
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
            const int64_t at = ((int64_t)c * 32 + lane) * kVec;
            if (at < p.len) { // len is a multiple of kVec
                T v[kVec];
                load<T, kVec>(v, src + at);
#pragma unroll
                for (int j = 0; j < kVec; j++) {
                    x[c * kVec + j] = static_cast<A>(cl::widen(v[j]));
                    m = max_(m, x[c * kVec + j]);
                }
            }
            else {
#pragma unroll
                for (int j = 0; j < kVec; j++) {
                    x[c * kVec + j] = neg_inf<A>(); // never summed nor written
                }
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            m = max_(m, __shfl_xor_sync(0xffffffffu, m, offset));
        }
        A s = 0;
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
            if (((int64_t)c * 32 + lane) * kVec < p.len) {
#pragma unroll
                for (int j = 0; j < kVec; j++) {
                    s += exp_(x[c * kVec + j] - m);
                }
            }
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, offset);
        }
        const A scale = p.log ? log_(s) : A(1) / s;
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
            const int64_t at = ((int64_t)c * 32 + lane) * kVec;
            if (at < p.len) {
                T y[kVec];
#pragma unroll
                for (int j = 0; j < kVec; j++) {
                    y[j] = output<T>(x[c * kVec + j], m, scale, p.log);
                }
                store<T, kVec>(dst + at, y);
            }
        }
    }
}

// ---- kernel 2: a block per row, two passes ---------------------------------------

template <typename T, int kVec>
__global__ void __launch_bounds__(kBlockMaxThreads) softmax_block(Params p)
{
    using A = typename AccOf<T>::type;
    const int64_t step = (int64_t)blockDim.x * kVec;
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) { // uniform per block
        const T *src = static_cast<const T *>(p.src) +
                       row_offset(row, p.inner, p.src_outer, p.src_inner);
        T *dst = static_cast<T *>(p.dst) + row_offset(row, p.inner, p.dst_outer, p.dst_inner);
        const MaxSum<A> r = block_row_max_sum<T, kVec>(src, p.len);
        const A scale = p.log ? log_(r.s) : A(1) / r.s;
        for (int64_t i = threadIdx.x * kVec; i < p.len; i += kUnroll * step) {
            T v[kUnroll][kVec];
            load_unrolled<T, kVec>(v, src, i, step, p.len);
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                if (i + u * step < p.len) {
                    T y[kVec];
#pragma unroll
                    for (int j = 0; j < kVec; j++) {
                        y[j] = output<T>(static_cast<A>(cl::widen(v[u][j])), r.m, scale, p.log);
                    }
                    store<T, kVec>(dst + i + u * step, y);
                }
            }
        }
    }
}

// ---- kernel 3: strided axis, 32 rows per block ------------------------------------

template <typename T>
__global__ void __launch_bounds__(kThreads) softmax_cols(Params p)
{
    using A = typename AccOf<T>::type;
    __shared__ A sm_m[kWarps][32], sm_s[kWarps][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t tiles = (p.rows + 31) / 32;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) { // uniform per block
        const int64_t row = t * 32 + lane;
        const bool ok = row < p.rows;
        const T *src = static_cast<const T *>(p.src) +
                       (ok ? row_offset(row, p.inner, p.src_outer, p.src_inner) : 0);
        T *dst = static_cast<T *>(p.dst) +
                 (ok ? row_offset(row, p.inner, p.dst_outer, p.dst_inner) : 0);
        MaxSum<A> r{neg_inf<A>(), A(0)};
        if (ok) {
#pragma unroll 4
            for (int64_t k = warp; k < p.len; k += kWarps) {
                add(r, static_cast<A>(cl::widen(src[k * p.src_len])));
            }
        }
        sm_m[warp][lane] = r.m;
        sm_s[warp][lane] = r.s;
        __syncthreads();
        r = MaxSum<A>{sm_m[0][lane], sm_s[0][lane]};
#pragma unroll
        for (int w = 1; w < kWarps; w++) {
            r = combine(r, MaxSum<A>{sm_m[w][lane], sm_s[w][lane]});
        }
        const A scale = p.log ? log_(r.s) : A(1) / r.s;
        if (ok) {
#pragma unroll 4
            for (int64_t k = warp; k < p.len; k += kWarps) {
                const A x = static_cast<A>(cl::widen(src[k * p.src_len]));
                dst[k * p.dst_len] = output<T>(x, r.m, scale, p.log);
            }
        }
        __syncthreads(); // the next tile reuses sm_m, sm_s
    }
}

// ---- launch ------------------------------------------------------------------------

// Kernels 1 and 2, as row_dispatch.cuh picks and launches them.
struct SoftmaxRows {
    template <typename T, int kVec, int kChunks>
    static void warp(dim3 grid, dim3 block, cudaStream_t stream, const Params &p)
    {
        softmax_warp<T, kVec, kChunks><<<grid, block, 0, stream>>>(p);
    }
    template <typename T, int kVec>
    static void block(dim3 grid, dim3 block, cudaStream_t stream, const Params &p)
    {
        softmax_block<T, kVec><<<grid, block, 0, stream>>>(p);
    }
};

// Every row starts on a 16-byte boundary and holds whole vectors.
template <typename T>
bool
rows_aligned(const cl_softmax_desc &d)
{
    constexpr int64_t V = 16 / sizeof(T);
    const bool outer_ok = d.outer == 1 || (d.src_outer % V == 0 && d.dst_outer % V == 0);
    const bool inner_ok = d.inner == 1 || (d.src_inner % V == 0 && d.dst_inner % V == 0);
    return (uintptr_t)d.src % 16 == 0 && (uintptr_t)d.dst % 16 == 0 && d.len % V == 0 &&
           outer_ok && inner_ok;
}

template <typename T>
cudaError_t
launch(const cl_softmax_desc &d, cudaStream_t stream)
{
    const Params p{d.src,       d.dst,       d.outer * d.inner, d.inner,     d.len,
                   d.src_outer, d.src_inner, d.src_len,         d.dst_outer, d.dst_inner,
                   d.dst_len,   d.log};
    if (d.src_len == 1 && d.dst_len == 1) {
        return dispatch_rows<SoftmaxRows, T>(p, p.rows, d.len, rows_aligned<T>(d), stream);
    }
    softmax_cols<T><<<grid_of((p.rows + 31) / 32), kThreads, 0, stream>>>(p);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t
cl_softmax(const cl_softmax_desc *d, cudaStream_t stream)
{
    if (d == nullptr || d->outer < 0 || d->inner < 0 || d->len < 0) {
        return cudaErrorInvalidValue;
    }
    if (d->outer == 0 || d->inner == 0 || d->len == 0) {
        return cudaSuccess;
    }
    CL_DISPATCH(d->dtype, CL_FLOAT_TYPES, return launch<scalar_t>(*d, stream));
}
