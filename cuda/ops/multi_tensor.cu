// Fused multi-tensor kernels for mixed-precision training: the gradient
// unscale with its non-finite check, the dynamic loss-scale update, and the
// SGD and AdamW optimizer steps (see the launchers in kernels.h).
//
// The multi-tensor launcher. A training step touches every parameter
// tensor: one launch per tensor would cost a launch (a few microseconds)
// per tensor, and small tensors would leave the GPU idle. Instead the host
// packs up to kMax(R) tensors (R arrays each, one per role: param, grad,
// state...) into a table passed by value as the kernel argument, and
// splits every tensor into chunks of kChunk elements. A block handles one
// chunk: it finds its tensor by a binary search over the table's first
// chunk indices, then streams the chunk with 4-element vector loads (16
// bytes for float32) when every array of the tensor is aligned, element by
// element otherwise. When the table is full (tensors), the launcher
// launches and starts a new one, so any number of tensors takes
// ceil(n / kMax) launches. One chunk per block (not a grid-stride loop over
// chunks) lets the hardware balance the blocks: the only tail is the last
// partial wave of small chunks.
//
// Arithmetic is in float32 (half grads are widened on load); AdamW's bias
// corrections are computed in double from the step read on the device.
// Each state is read once and written once: AdamW moves 4 + g + 4 + 4
// bytes in and 4 + 4 + 4 out per element (g = the grad's size).
//
// The skip. With found_inf given, every block reads it first and returns
// at once when it is nonzero: a step with inf/NaN gradients changes
// nothing, and the host never has to look at the flag.
#include "kernels.h"
#include "dtype_convert.cuh"
#include "dtype_dispatch.cuh"

#include <math.h>

namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;                    // elements per vector access
constexpr int kChunk = 16384;              // elements per block: 16 vectors per thread
constexpr int kTableBytes = 3800;          // the table; the op's fields fill the rest of 4 KiB
constexpr int64_t kMaxChunks = 1ll << 30;  // chunks (blocks) of one launch

// The tensors of one launch; tensor t covers blocks [first[t], first[t+1]).
template <int R> struct Table {
    static constexpr int kMax = (kTableBytes - 16) / (8 * R + 8 + 4 + 1);
    void *ptr[kMax][R];
    int64_t numel[kMax];
    int32_t first[kMax];
    uint8_t vec[kMax]; // 1: every role's pointer allows vector access
    int32_t count;
};

// The table entry of block `b`: the last tensor whose first chunk <= b.
template <int R> __device__ __forceinline__ int find_tensor(const Table<R> &tab, int b)
{
    int lo = 0, hi = tab.count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (tab.first[mid] <= b) {
            lo = mid;
        }
        else {
            hi = mid - 1;
        }
    }
    return lo;
}

template <typename T> struct alignas(sizeof(T) * kVec) Vec {
    T v[kVec];
};

template <typename T> __device__ __forceinline__ void load_vec(const void *p, int64_t i, float *x)
{
    const Vec<T> v = reinterpret_cast<const Vec<T> *>(static_cast<const T *>(p) + i)[0];
#pragma unroll
    for (int k = 0; k < kVec; k++) {
        x[k] = cl::convert<float>(v.v[k]);
    }
}

template <typename T> __device__ __forceinline__ void store_vec(void *p, int64_t i, const float *x)
{
    Vec<T> v;
#pragma unroll
    for (int k = 0; k < kVec; k++) {
        v.v[k] = cl::convert<T>(x[k]);
    }
    reinterpret_cast<Vec<T> *>(static_cast<T *>(p) + i)[0] = v;
}

// `n` (1 or kVec) elements from i of every role the op reads, the op on each
// element, and the roles it writes stored back. The grad role has type G,
// every other role float32.
template <class Op, typename G, int N>
__device__ __forceinline__ void process(Op &op, void *const *ptr, int64_t i)
{
    constexpr int R = Op::kRoles;
    float x[R][kVec] = {};
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (op.reads >> r & 1u) {
            if (N == kVec) {
                r == Op::kGrad ? load_vec<G>(ptr[r], i, x[r]) : load_vec<float>(ptr[r], i, x[r]);
            }
            else {
                x[r][0] = r == Op::kGrad ? cl::convert<float>(static_cast<const G *>(ptr[r])[i])
                                         : static_cast<const float *>(ptr[r])[i];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < N; k++) {
        float e[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            e[r] = x[r][k];
        }
        op.apply(e);
#pragma unroll
        for (int r = 0; r < R; r++) {
            x[r][k] = e[r];
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (op.writes >> r & 1u) {
            if (N == kVec) {
                r == Op::kGrad ? store_vec<G>(ptr[r], i, x[r]) : store_vec<float>(ptr[r], i, x[r]);
            }
            else if (r == Op::kGrad) {
                static_cast<G *>(ptr[r])[i] = cl::convert<G>(x[r][0]);
            }
            else {
                static_cast<float *>(ptr[r])[i] = x[r][0];
            }
        }
    }
}

// One block, one chunk of one tensor of the table.
template <class Op, typename G>
__global__ void __launch_bounds__(kThreads) mt_kernel(const Table<Op::kRoles> tab, Op op)
{
    if (op.skipped()) {
        return;
    }
    op.setup();
    const int t = find_tensor(tab, blockIdx.x);
    const int64_t start = (int64_t)(blockIdx.x - tab.first[t]) * kChunk;
    const int64_t end = min(start + kChunk, tab.numel[t]);
    void *const *ptr = tab.ptr[t];
    int64_t i = start + threadIdx.x;
    if (tab.vec[t]) {
        const int64_t vend = start + (end - start) / kVec * kVec;
        for (int64_t v = start + (int64_t)threadIdx.x * kVec; v < vend; v += kThreads * kVec) {
            process<Op, G, kVec>(op, ptr, v);
        }
        i = vend + threadIdx.x;
    }
    for (; i < end; i += kThreads) {
        process<Op, G, 1>(op, ptr, i);
    }
    op.finish();
}

// ---- the ops (one element: e[role]) -----------------------------------------

// What every op shares: its role masks, the skip, and an empty finish().
struct OpBase {
    unsigned reads, writes; // role bit masks
    const float *found_inf;  // NULL: never skip
    __device__ bool skipped() const { return found_inf != nullptr && *found_inf != 0.0f; }
    __device__ void finish() {}
};

// Role 0: the grad. g *= inv_scale; a non-finite input raises the flag.
struct Unscale : OpBase {
    static constexpr int kRoles = 1, kGrad = 0;
    const float *inv_scale;
    float *flag;
    float inv;
    bool bad;
    __device__ void setup()
    {
        inv = *inv_scale;
        bad = false;
    }
    __device__ void apply(float (&e)[1])
    {
        bad |= !isfinite(e[0]);
        e[0] *= inv;
    }
    __device__ void finish()
    {
        if (bad) {
            *flag = 1.0f; // every writer stores the same value: no atomic needed
        }
    }
};

// Roles: param, grad, momentum buffer. torch.optim.SGD's rule.
struct Sgd : OpBase {
    static constexpr int kRoles = 3, kGrad = 1;
    float lr, momentum, keep, weight_decay; // keep = 1 - dampening
    bool nesterov, first_step, has_buf;
    const float *grad_scale, *lr_device; // lr_device: NULL, or lr read on the device
    float scale;
    __device__ void setup()
    {
        scale = grad_scale != nullptr ? *grad_scale : 1.0f;
        lr = lr_device != nullptr ? *lr_device : lr;
    }
    __device__ void apply(float (&e)[3])
    {
        float g = grad_scale != nullptr ? e[1] / scale : e[1];
        if (weight_decay != 0.0f) {
            g += weight_decay * e[0];
        }
        if (has_buf) {
            const float b = first_step ? g : momentum * e[2] + keep * g;
            e[2] = b;
            g = nesterov ? g + momentum * b : b;
        }
        e[0] -= lr * g;
    }
};

// Roles: param, grad, exp_avg, exp_avg_sq. torch.optim.AdamW's rule, with
// the step (already counted for this update) read on the device.
struct AdamW : OpBase {
    static constexpr int kRoles = 4, kGrad = 1;
    double lr, beta1, beta2, weight_decay;
    float b1, b2, c1, c2, eps; // c = 1 - beta
    const float *grad_scale, *lr_device; // lr_device: NULL, or lr read on the device
    const void *step;
    bool step_is_int;
    float scale, step_size, bc2_sqrt, decay; // decay = 1 - lr * weight_decay
    __device__ void setup()
    {
        scale = grad_scale != nullptr ? *grad_scale : 1.0f;
        const double s = step_is_int ? (double)*static_cast<const int32_t *>(step)
                                     : (double)*static_cast<const float *>(step);
        const double rate = lr_device != nullptr ? (double)*lr_device : lr;
        decay = (float)(1.0 - rate * weight_decay);
        step_size = (float)(rate / (1.0 - pow(beta1, s)));
        bc2_sqrt = (float)sqrt(1.0 - pow(beta2, s));
    }
    __device__ void apply(float (&e)[4])
    {
        const float g = grad_scale != nullptr ? e[1] / scale : e[1];
        const float m = b1 * e[2] + c1 * g;
        const float v = b2 * e[3] + c2 * g * g;
        const float denom = sqrtf(v) / bc2_sqrt + eps;
        e[0] = e[0] * decay - step_size * m / denom;
        e[2] = m;
        e[3] = v;
    }
};

// ---- host side --------------------------------------------------------------

bool aligned(const void *p, size_t bytes) { return (uintptr_t)p % bytes == 0; }

template <class Op, typename G>
cudaError_t flush(Table<Op::kRoles> &tab, int64_t chunks, const Op &op, cudaStream_t stream)
{
    if (tab.count > 0) {
        mt_kernel<Op, G><<<(unsigned)chunks, kThreads, 0, stream>>>(tab, op);
        tab.count = 0;
        return cudaGetLastError();
    }
    return cudaSuccess;
}

// Every non-empty tensor into tables, launching each table when it is full.
template <class Op, typename G>
cudaError_t launch_all(const cl_mt_tensor *t, int n, const Op &op, cudaStream_t stream)
{
    constexpr int R = Op::kRoles;
    static_assert(sizeof(Table<R>) + sizeof(Op) <= 4096, "kernel arguments exceed 4 KiB");
    Table<R> tab;
    tab.count = 0;
    int64_t chunks = 0;
    for (int i = 0; i < n; i++) {
        const int64_t c = (t[i].numel + kChunk - 1) / kChunk;
        if (t[i].numel <= 0) {
            continue;
        }
        if (c > kMaxChunks) {
            return cudaErrorInvalidValue;
        }
        if (tab.count == Table<R>::kMax || chunks + c > kMaxChunks) {
            cudaError_t err = flush<Op, G>(tab, chunks, op, stream);
            if (err != cudaSuccess) {
                return err;
            }
            chunks = 0;
        }
        const int k = tab.count++;
        bool vec = true;
        for (int r = 0; r < R; r++) {
            void *p = t[i].data[r];
            const bool used = ((op.reads | op.writes) >> r & 1u) != 0;
            if (used && p == nullptr) {
                return cudaErrorInvalidValue;
            }
            tab.ptr[k][r] = p;
            vec = vec && (!used || aligned(p, kVec * (r == Op::kGrad ? sizeof(G) : 4)));
        }
        tab.numel[k] = t[i].numel;
        tab.first[k] = (int32_t)chunks;
        tab.vec[k] = vec;
        chunks += c;
    }
    return flush<Op, G>(tab, chunks, op, stream);
}

// The grad dtypes the kernels take.
#define GRAD_TYPES(X, ...)                                                         \
    X(CL_FLOAT16, __half, __VA_ARGS__)                                             \
    X(CL_BFLOAT16, __nv_bfloat16, __VA_ARGS__)                                     \
    X(CL_FLOAT32, float, __VA_ARGS__)

__global__ void update_scale_kernel(float *scale, int32_t *tracker, const float *found_inf,
                                    double growth, double backoff, int32_t interval)
{
    if (*found_inf != 0.0f) {
        *scale = (float)((double)*scale * backoff);
        *tracker = 0;
        return;
    }
    // A successful step: count it, then compare with the interval.
    const int32_t successful = *tracker + 1;
    if (successful == interval) {
        const float grown = (float)((double)*scale * growth);
        if (isfinite(grown)) { // never grow past float32's range
            *scale = grown;
        }
        *tracker = 0;
    }
    else {
        *tracker = successful;
    }
}

template <typename S> __global__ void count_step_kernel(S *step, const float *found_inf)
{
    if (found_inf == nullptr || *found_inf == 0.0f) {
        *step += (S)1;
    }
}

} // namespace

extern "C" cudaError_t
cl_mt_unscale(const cl_mt_tensor *tensors, int n, cl_dtype dtype, const float *inv_scale,
              float *found_inf, cudaStream_t stream)
{
    if (n < 0 || inv_scale == nullptr || found_inf == nullptr) {
        return cudaErrorInvalidValue;
    }
    Unscale op = {};
    op.reads = op.writes = 1u;
    op.inv_scale = inv_scale;
    op.flag = found_inf;
    CL_DISPATCH(dtype, GRAD_TYPES, return launch_all<Unscale, scalar_t>(tensors, n, op, stream));
}

extern "C" cudaError_t
cl_amp_update_scale(float *scale, int32_t *growth_tracker, const float *found_inf,
                    double growth_factor, double backoff_factor, int32_t growth_interval,
                    cudaStream_t stream)
{
    if (scale == nullptr || growth_tracker == nullptr || found_inf == nullptr) {
        return cudaErrorInvalidValue;
    }
    update_scale_kernel<<<1, 1, 0, stream>>>(scale, growth_tracker, found_inf, growth_factor,
                                             backoff_factor, growth_interval);
    return cudaGetLastError();
}

extern "C" cudaError_t
cl_mt_sgd(const cl_mt_tensor *tensors, int n, cl_dtype grad_dtype, const cl_sgd_args *a,
          cudaStream_t stream)
{
    if (n < 0 || a == nullptr) {
        return cudaErrorInvalidValue;
    }
    Sgd op = {};
    op.has_buf = a->momentum != 0.0;
    op.reads = 3u | (op.has_buf && !a->first_step ? 4u : 0u);
    op.writes = 1u | (op.has_buf ? 4u : 0u);
    op.found_inf = a->found_inf;
    op.grad_scale = a->grad_scale;
    op.lr = (float)a->lr;
    op.lr_device = a->lr_device;
    op.momentum = (float)a->momentum;
    op.keep = (float)(1.0 - a->dampening);
    op.weight_decay = (float)a->weight_decay;
    op.nesterov = a->nesterov != 0;
    op.first_step = a->first_step != 0;
    CL_DISPATCH(grad_dtype, GRAD_TYPES, return launch_all<Sgd, scalar_t>(tensors, n, op, stream));
}

extern "C" cudaError_t
cl_mt_adamw(const cl_mt_tensor *tensors, int n, cl_dtype grad_dtype, const cl_adamw_args *a,
            cudaStream_t stream)
{
    if (n < 0 || a == nullptr || a->step == nullptr ||
        (a->step_dtype != CL_FLOAT32 && a->step_dtype != CL_INT32)) {
        return cudaErrorInvalidValue;
    }
    // The step is counted first, so the update kernels read the new count.
    if (a->step_dtype == CL_INT32) {
        count_step_kernel<<<1, 1, 0, stream>>>(static_cast<int32_t *>(a->step), a->found_inf);
    }
    else {
        count_step_kernel<<<1, 1, 0, stream>>>(static_cast<float *>(a->step), a->found_inf);
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        return err;
    }
    AdamW op = {};
    op.reads = 15u;
    op.writes = 1u | 4u | 8u;
    op.found_inf = a->found_inf;
    op.grad_scale = a->grad_scale;
    op.lr = a->lr;
    op.lr_device = a->lr_device;
    op.weight_decay = a->weight_decay;
    op.beta1 = a->beta1;
    op.beta2 = a->beta2;
    op.b1 = (float)a->beta1;
    op.b2 = (float)a->beta2;
    op.c1 = (float)(1.0 - a->beta1);
    op.c2 = (float)(1.0 - a->beta2);
    op.eps = (float)a->eps;
    op.step = a->step;
    op.step_is_int = a->step_dtype == CL_INT32;
    CL_DISPATCH(grad_dtype, GRAD_TYPES,
                return launch_all<AdamW, scalar_t>(tensors, n, op, stream));
}
