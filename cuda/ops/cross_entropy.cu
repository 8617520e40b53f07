// Fused softmax cross-entropy, forward and backward (cl_cross_entropy in
// kernels.h).
//
// Per row x of C logits with label y, in float32 with m = max(x) and
// s = sum of exp(x - m):
//     loss      = log(s) + m - x[y]
//     d loss/dx = exp(x - m) / s - onehot(y)
// and the gradient written is that times g (1 / rows-not-ignored for the mean,
// 1 otherwise) times the device-side loss scale, so the backward starts from
// the scaled loss as a dynamic loss scaler needs.
//
// Kernels (between 1 and 2 row_dispatch.cuh picks, as for softmax.cu):
//   1. ce_warp   -- C <= 1024: one warp per row, the row held in registers
//      (16-byte vector loads when every row is aligned): max, sum and the
//      picked logit x[y] are warp shuffles, and the gradient is written from
//      the registers: one read of the logits and one write of the gradient.
//   2. ce_block  -- longer rows: one block per row. The first pass keeps a
//      running (max, sum) per thread (row_softmax.cuh), combined across the
//      block; the second re-reads the row (mostly from L2) to write the
//      gradient. Without a gradient there is no second pass.
//   3. ce_count, ce_total -- one block each: the rows not ignored (before
//      the row kernel, for the mean's gradient) and the sum or mean of the
//      per-row losses (after it), each summed in a fixed order so that the
//      result is the same bits on every run.
// A label outside [0, C) is never used as an index: its row gets NaN.
#include "kernels.h"
#include "dtype_convert.cuh"
#include "dtype_dispatch.cuh"
#include "row_dispatch.cuh"
#include "row_softmax.cuh"

namespace {

using namespace cl_rows;

constexpr int kReduceThreads = 1024; // ce_count, ce_total

// The logits' dtypes.
#define CE_TYPES_(X, ...)                                                          \
    X(CL_FLOAT16, __half, __VA_ARGS__)                                             \
    X(CL_BFLOAT16, __nv_bfloat16, __VA_ARGS__)                                     \
    X(CL_FLOAT32, float, __VA_ARGS__)

struct Params {
    const void *logits;
    const void *labels;
    void *grad;
    float *losses;
    const float *count;      // NULL: g is inv_rows
    const float *loss_scale; // NULL: 1
    int64_t rows, cols, logits_ld, grad_ld, labels_stride, losses_stride, ignore_index;
    float inv_rows; // 1 / rows for the mean, 1 for sum and none
    int label64, has_ignore;
};

// What a row's label makes of it.
struct Row {
    int64_t label;
    bool ignored, bad; // ignore_index; outside [0, C) otherwise
};

__device__ __forceinline__ Row
row_label(const Params &p, int64_t row)
{
    const int64_t at = row * p.labels_stride;
    Row r;
    r.label = p.label64 ? static_cast<const int64_t *>(p.labels)[at]
                        : (int64_t) static_cast<const int32_t *>(p.labels)[at];
    r.ignored = p.has_ignore && r.label == p.ignore_index;
    r.bad = !r.ignored && (r.label < 0 || r.label >= p.cols);
    return r;
}

// The factor of the row's gradient: 0 for an ignored row, NaN for a bad one.
__device__ __forceinline__ float
row_factor(const Params &p, const Row &r)
{
    if (r.ignored) {
        return 0.0f;
    }
    if (r.bad) {
        return __int_as_float(0x7fffffff);
    }
    const float g = p.count != nullptr ? 1.0f / *p.count : p.inv_rows;
    return p.loss_scale != nullptr ? g * *p.loss_scale : g;
}

__device__ __forceinline__ float
row_loss(const Row &r, float m, float s, float picked)
{
    return r.ignored ? 0.0f : r.bad ? __int_as_float(0x7fffffff) : (log_(s) + m) - picked;
}

// One gradient element; an ignored row is exactly 0 whatever its logits.
template <typename T>
__device__ __forceinline__ T
grad_of(float x, int64_t col, const Row &r, float m, float inv_s, float g)
{
    const float d = exp_(x - m) * inv_s - (col == r.label ? 1.0f : 0.0f);
    return cl::convert<T>(r.ignored ? 0.0f : d * g);
}

// ---- kernel 1: a warp per row, the row in registers -----------------------------

// Lane `lane` holds elements (c * 32 + lane) * kVec + j, c < kChunks, j < kVec.
template <typename T, int kVec, int kChunks>
__global__ void __launch_bounds__(kWarpRowThreads) ce_warp(Params p)
{
    constexpr int kPer = kVec * kChunks;
    const int lane = threadIdx.x % 32;
    for (int64_t row = (int64_t)blockIdx.x * kWarpRowsPerBlock + threadIdx.x / 32; row < p.rows;
         row += (int64_t)gridDim.x * kWarpRowsPerBlock) {
        const T *src = static_cast<const T *>(p.logits) + row * p.logits_ld;
        const Row r = row_label(p, row);
        float x[kPer];
        float m = neg_inf<float>(), picked = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
            const int64_t at = ((int64_t)c * 32 + lane) * kVec;
            T v[kVec];
            if (at < p.cols) { // cols is a multiple of kVec
                load<T, kVec>(v, src + at);
            }
#pragma unroll
            for (int j = 0; j < kVec; j++) {
                x[c * kVec + j] = at < p.cols ? static_cast<float>(cl::widen(v[j]))
                                              : neg_inf<float>(); // adds 0, never written
                m = max_(m, x[c * kVec + j]);
                picked = at + j == r.label ? x[c * kVec + j] : picked;
            }
        }
        float s = 0.0f;
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            m = max_(m, __shfl_xor_sync(0xffffffffu, m, offset));
        }
#pragma unroll
        for (int k = 0; k < kPer; k++) {
            s += x[k] == neg_inf<float>() ? 0.0f : exp_(x[k] - m);
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, offset);
            picked += __shfl_xor_sync(0xffffffffu, picked, offset); // one lane holds it
        }
        if (lane == 0) {
            p.losses[row * p.losses_stride] = row_loss(r, m, s, picked);
        }
        if (p.grad == nullptr) {
            continue;
        }
        T *dst = static_cast<T *>(p.grad) + row * p.grad_ld;
        const float g = row_factor(p, r), inv_s = 1.0f / s;
#pragma unroll
        for (int c = 0; c < kChunks; c++) {
            const int64_t at = ((int64_t)c * 32 + lane) * kVec;
            if (at < p.cols) {
                T y[kVec];
#pragma unroll
                for (int j = 0; j < kVec; j++) {
                    y[j] = grad_of<T>(x[c * kVec + j], at + j, r, m, inv_s, g);
                }
                store<T, kVec>(dst + at, y);
            }
        }
    }
}

// ---- kernel 2: a block per row, two passes ---------------------------------------

template <typename T, int kVec>
__global__ void __launch_bounds__(kBlockMaxThreads) ce_block(Params p)
{
    const int64_t step = (int64_t)blockDim.x * kVec;
    for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) { // uniform per block
        const T *src = static_cast<const T *>(p.logits) + row * p.logits_ld;
        const Row r = row_label(p, row);
        const MaxSum<float> ms = block_row_max_sum<T, kVec>(src, p.cols);
        if (threadIdx.x == 0) { // x[y] was just read: an L1 or L2 hit
            const float picked =
                r.ignored || r.bad ? 0.0f : static_cast<float>(cl::widen(src[r.label]));
            p.losses[row * p.losses_stride] = row_loss(r, ms.m, ms.s, picked);
        }
        if (p.grad == nullptr) {
            continue;
        }
        T *dst = static_cast<T *>(p.grad) + row * p.grad_ld;
        const float g = row_factor(p, r), inv_s = 1.0f / ms.s;
        for (int64_t i = threadIdx.x * kVec; i < p.cols; i += kUnroll * step) {
            T v[kUnroll][kVec];
            load_unrolled<T, kVec>(v, src, i, step, p.cols);
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                if (i + u * step < p.cols) {
                    T y[kVec];
#pragma unroll
                    for (int j = 0; j < kVec; j++) {
                        const float x = static_cast<float>(cl::widen(v[u][j]));
                        y[j] = grad_of<T>(x, i + u * step + j, r, ms.m, inv_s, g);
                    }
                    store<T, kVec>(dst + i + u * step, y);
                }
            }
        }
    }
}

// ---- kernels 3: the count and the total, one block each --------------------------

// A float sum over the block in a fixed order; every thread gets it.
__device__ float
block_sum(float v)
{
    __shared__ float sm[kReduceThreads / 32];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    if (threadIdx.x % 32 == 0) {
        sm[threadIdx.x / 32] = v;
    }
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++) {
        total += sm[w];
    }
    return total;
}

// The rows whose label is not ignore_index (all rows without one).
__device__ float
rows_counted(const Params &p)
{
    if (!p.has_ignore) {
        return (float)p.rows;
    }
    float n = 0.0f;
    for (int64_t row = threadIdx.x; row < p.rows; row += blockDim.x) {
        n += row_label(p, row).ignored ? 0.0f : 1.0f;
    }
    return block_sum(n);
}

__global__ void __launch_bounds__(kReduceThreads) ce_count(Params p, float *count)
{
    const float n = rows_counted(p);
    if (threadIdx.x == 0) {
        *count = n;
    }
}

__global__ void __launch_bounds__(kReduceThreads) ce_total(Params p, float *total, int mean)
{
    float s = 0.0f;
    for (int64_t row = threadIdx.x; row < p.rows; row += blockDim.x) {
        s += p.losses[row * p.losses_stride];
    }
    s = block_sum(s);
    __syncthreads(); // block_sum's shared memory is reused by rows_counted
    const float n = mean ? rows_counted(p) : 1.0f;
    if (threadIdx.x == 0) {
        *total = mean ? s / n : s;
    }
}

// ---- launch ------------------------------------------------------------------------

// Kernels 1 and 2, as row_dispatch.cuh picks and launches them.
struct CrossEntropyRows {
    template <typename T, int kVec, int kChunks>
    static void warp(dim3 grid, dim3 block, cudaStream_t stream, const Params &p)
    {
        ce_warp<T, kVec, kChunks><<<grid, block, 0, stream>>>(p);
    }
    template <typename T, int kVec>
    static void block(dim3 grid, dim3 block, cudaStream_t stream, const Params &p)
    {
        ce_block<T, kVec><<<grid, block, 0, stream>>>(p);
    }
};

// Every row of `base` (rows `ld` elements apart) starts on a 16-byte boundary.
template <typename T>
bool
rows_aligned(const void *base, int64_t ld, int64_t rows)
{
    constexpr int64_t V = 16 / sizeof(T);
    return (uintptr_t)base % 16 == 0 && (rows == 1 || ld % V == 0);
}

template <typename T>
cudaError_t
launch_rows(const cl_cross_entropy_desc &d, const Params &p, cudaStream_t stream)
{
    constexpr int V = 16 / sizeof(T);
    const bool vec = d.cols % V == 0 && rows_aligned<T>(d.logits, d.logits_ld, d.rows) &&
                     (d.grad == nullptr || rows_aligned<T>(d.grad, d.grad_ld, d.rows));
    return dispatch_rows<CrossEntropyRows, T>(p, p.rows, d.cols, vec, stream);
}

cudaError_t
launch_rows_of(const cl_cross_entropy_desc &d, const Params &p, cudaStream_t stream)
{
    CL_DISPATCH(d.dtype, CE_TYPES_, return launch_rows<scalar_t>(d, p, stream));
}

// count (when the mean's gradient needs it), the rows, the total.
cudaError_t
launch_all(const cl_cross_entropy_desc &d, Params p, cudaStream_t stream)
{
    const bool mean = d.reduction == CL_LOSS_MEAN;
    if (mean && d.grad != nullptr && d.has_ignore) {
        ce_count<<<1, kReduceThreads, 0, stream>>>(p, d.count);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) {
            return err;
        }
        p.count = d.count;
    }
    if (d.rows > 0) {
        cudaError_t err = launch_rows_of(d, p, stream);
        if (err != cudaSuccess) {
            return err;
        }
    }
    if (d.reduction == CL_LOSS_NONE) {
        return cudaSuccess;
    }
    ce_total<<<1, kReduceThreads, 0, stream>>>(p, d.total, mean ? 1 : 0);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t
cl_cross_entropy(const cl_cross_entropy_desc *d, cudaStream_t stream)
{
    if (d == nullptr || d->rows < 0 || d->cols < 1 || d->losses == nullptr ||
        (d->label_dtype != CL_INT32 && d->label_dtype != CL_INT64) ||
        (d->reduction != CL_LOSS_NONE && d->total == nullptr) ||
        (d->reduction == CL_LOSS_MEAN && d->grad != nullptr && d->has_ignore &&
         d->count == nullptr)) {
        return cudaErrorInvalidValue;
    }
    Params p;
    p.logits = d->logits;
    p.labels = d->labels;
    p.grad = d->grad;
    p.losses = d->losses;
    p.count = nullptr;
    p.loss_scale = d->loss_scale;
    p.rows = d->rows;
    p.cols = d->cols;
    p.logits_ld = d->logits_ld;
    p.grad_ld = d->grad_ld;
    p.labels_stride = d->labels_stride;
    p.losses_stride = d->losses_stride;
    p.ignore_index = d->ignore_index;
    p.inv_rows = d->reduction == CL_LOSS_MEAN && d->rows > 0 ? 1.0f / (float)d->rows : 1.0f;
    p.label64 = d->label_dtype == CL_INT64;
    p.has_ignore = d->has_ignore;
    return launch_all(*d, p, stream);
}
