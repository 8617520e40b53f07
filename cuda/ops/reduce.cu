// Reductions: sum, mean, max, min and argmax over all elements or one axis.
//
// Every reduction is described to the launcher as a 3-D problem (see
// cl_reduce_desc in kernels.h): output element (o, i) of the C-contiguous
// result [outer, inner] combines the `len` input elements
//     src[o * outer_stride + r * len_stride + i * inner_stride],  r = 0 .. len-1.
// A reduction over all elements of a dense array is outer = inner = 1,
// len = size, len_stride = 1; one axis of a C-contiguous array is outer =
// the product of the extents before it, inner = the product after it.
//
// Kernels (one family; the launcher picks one from the layout, never from timing):
//   1. reduce_rows  -- the reduced axis is contiguous (len_stride == 1) and
//      not tiny. A group of threads (one warp for short rows, the whole
//      256-thread block for rows of >= 8 KiB) reads one row with 16-byte
//      vector loads, four loads in flight per thread, a scalar head up to
//      the first 16-byte boundary and a scalar tail. Each thread keeps up to
//      four independent accumulators, then warp shuffles and shared memory
//      combine them. When there are fewer rows than the GPU holds blocks
//      (a reduction over everything is one row), each row is cut into 64 KiB
//      chunks, one block each: per-chunk partials go to the workspace and
//      finalize_rows_block (a block per row) or finalize_rows (a warp per
//      row, when there are few partials) combines them in a fixed order.
//      Measured on an H200, sum over 1 GiB float32: one wave of blocks each
//      walking a long chunk ran at 3830 GB/s, many 64 KiB chunks ran faster.
//   2. reduce_cols  -- the reduced axis is strided (or tiny). Threads map to
//      output elements, so a warp reads consecutive memory of one input row
//      of the reduction and walks down the reduced axis: 32 lanes x up to
//      4 consecutive outputs (one vector load each when the layout allows),
//      8 warps per block on interleaved positions of the reduced axis, four
//      loads in flight, then the 8 partials of each output are combined
//      through shared memory in a fixed order. With few outputs the reduced
//      axis is also split across blocks; finalize_cols combines the splits
//      (partials laid out [split][output], so that pass coalesces too).
//
// Determinism: no atomics; every combination order depends only on the
// problem's shape/layout and the device's SM count and occupancy, so the
// same input gives bit-identical output on every run.
//
// Accumulation: float16/bfloat16 in float32, float32 in float32 (short
// per-thread chains, then a tree: error grows like the square root of the
// chain, not of the size), float64 in float64, integers and bool in int64
// (wrapping like NumPy), mean of integers in float64. max/min propagate NaN;
// argmax returns the first maximum, or the first NaN, like NumPy.
#include "kernels.h"
#include "dtype_convert.cuh"
#include "dtype_dispatch.cuh"

#include <limits>
#include <type_traits>

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4; // vector loads in flight per thread
constexpr int64_t kChunkVectors = 4096; // 64 KiB: one block's share of a long row

// ---- combine operations -------------------------------------------------

template <typename T> __device__ __forceinline__ bool is_nan(T v) { return v != v; }

template <typename T> __device__ __forceinline__ T lowest()
{
    return std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::lowest();
}
template <typename T> __device__ __forceinline__ T highest()
{
    return std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                : std::numeric_limits<T>::max();
}

template <typename T> __device__ __forceinline__ T add(T a, T b) { return a + b; }
// int64 accumulation wraps (as NumPy's does) without signed-overflow UB.
template <> __device__ __forceinline__ int64_t add(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

template <typename Acc> struct SumOp {
    using State = Acc;
    __device__ __forceinline__ static State identity() { return Acc(0); }
    template <typename In> __device__ __forceinline__ static State make(In x, int64_t)
    {
        return static_cast<Acc>(cl::widen(x));
    }
    __device__ __forceinline__ static State combine(State a, State b) { return add(a, b); }
    template <typename Out>
    __device__ __forceinline__ static Out finish(State s, int64_t count, int mean)
    {
        if (mean) {
            s = s / static_cast<Acc>(count); // 0 / 0 -> NaN for an empty mean
        }
        return cl::convert<Out>(s);
    }
};

// Max (IsMax) or min, propagating NaN.
template <typename Acc, bool IsMax> struct ExtremeOp {
    using State = Acc;
    __device__ __forceinline__ static State identity() { return IsMax ? lowest<Acc>() : highest<Acc>(); }
    template <typename In> __device__ __forceinline__ static State make(In x, int64_t)
    {
        return static_cast<Acc>(cl::widen(x));
    }
    __device__ __forceinline__ static State combine(State a, State b)
    {
        if (is_nan(a)) {
            return a;
        }
        if (is_nan(b)) {
            return b;
        }
        return (IsMax ? b > a : b < a) ? b : a;
    }
    template <typename Out>
    __device__ __forceinline__ static Out finish(State s, int64_t, int)
    {
        return cl::convert<Out>(s);
    }
};

template <typename Acc> struct ArgState {
    Acc v;
    int64_t i;
};

// argmax: the total order (value, NaN above everything, smaller index first
// on ties) makes combine commutative and associative, so any tree gives
// NumPy's answer: the first maximum, or the first NaN.
template <typename Acc> struct ArgMaxOp {
    using State = ArgState<Acc>;
    __device__ __forceinline__ static State identity() { return State{lowest<Acc>(), INT64_MAX}; }
    template <typename In> __device__ __forceinline__ static State make(In x, int64_t idx)
    {
        return State{static_cast<Acc>(cl::widen(x)), idx};
    }
    __device__ __forceinline__ static State combine(State a, State b)
    {
        bool an = is_nan(a.v), bn = is_nan(b.v);
        if (an || bn) {
            if (an && bn) {
                return b.i < a.i ? b : a;
            }
            return an ? a : b;
        }
        if (b.v > a.v || (b.v == a.v && b.i < a.i)) {
            return b;
        }
        return a;
    }
    template <typename Out>
    __device__ __forceinline__ static Out finish(State s, int64_t, int)
    {
        return static_cast<Out>(s.i);
    }
};

// ---- warp / vector helpers ------------------------------------------------

template <typename T> __device__ __forceinline__ T shfl_down(T v, int offset)
{
    return __shfl_down_sync(0xffffffffu, v, offset);
}
template <typename Acc> __device__ __forceinline__ ArgState<Acc> shfl_down(ArgState<Acc> v, int offset)
{
    return ArgState<Acc>{__shfl_down_sync(0xffffffffu, v.v, offset),
                         __shfl_down_sync(0xffffffffu, v.i, offset)};
}

// Lane 0 ends up with the combination of all 32 lanes (fixed tree).
template <typename Op> __device__ __forceinline__ typename Op::State warp_reduce(typename Op::State s)
{
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        s = Op::combine(s, shfl_down(s, offset));
    }
    return s;
}

template <int Bytes> struct RawOf;
template <> struct RawOf<16> { using T = uint4; };
template <> struct RawOf<8> { using T = uint2; };
template <> struct RawOf<4> { using T = unsigned int; };

template <typename Raw> __device__ __forceinline__ Raw load_raw(const void *p)
{
    return __ldg(reinterpret_cast<const Raw *>(p));
}

// ---- kernel 1: contiguous rows ------------------------------------------------

struct RowsParams {
    const void *src;
    void *dst;
    void *partial;        // [rows][splits] states when splits > 1
    int64_t rows;         // outer * inner
    int64_t inner;
    int64_t outer_stride; // elements
    int64_t inner_stride; // elements
    int64_t len;          // elements per row
    int64_t splits;       // blocks sharing a row, each a contiguous chunk
    int64_t per_split;    // 16-byte vectors per chunk
    int tpr;              // threads per row: 32 or kThreads
    int mean;
};

template <typename In, typename Op, typename Out>
__global__ void __launch_bounds__(kThreads) reduce_rows(RowsParams a)
{
    using State = typename Op::State;
    constexpr int N = 16 / sizeof(In);  // elements per 16-byte vector
    constexpr int L = N < 4 ? N : 4;    // independent accumulators
    __shared__ State warp_partials[kWarps];

    const In *src = static_cast<const In *>(a.src);
    const int tid = threadIdx.x;
    const int tpr = a.tpr;
    const int lane = tid % tpr;
    const int groups = kThreads / tpr;
    const int64_t items = a.rows * a.splits;
    // With tpr == kThreads, w is uniform across the block (the
    // __syncthreads below is safe); with tpr == 32 it is uniform per warp.
    for (int64_t w = (int64_t)blockIdx.x * groups + tid / tpr; w < items;
         w += (int64_t)gridDim.x * groups) {
        const int64_t row = w / a.splits;
        const int64_t s = w - row * a.splits;
        const int64_t o = row / a.inner;
        const In *p = src + o * a.outer_stride + (row - o * a.inner) * a.inner_stride;
        const int mis = (int)(((uintptr_t)p & 15) / sizeof(In));
        const int64_t head = mis ? (a.len < N - mis ? a.len : N - mis) : 0;
        const int64_t nvec = (a.len - head) / N;
        const int64_t tail = head + nvec * N;

        State acc[L];
#pragma unroll
        for (int k = 0; k < L; k++) {
            acc[k] = Op::identity();
        }
        if (s == 0 && lane < head) {
            acc[0] = Op::combine(acc[0], Op::make(p[lane], lane));
        }
        if (s == a.splits - 1 && lane < a.len - tail) {
            acc[1 % L] = Op::combine(acc[1 % L], Op::make(p[tail + lane], tail + lane));
        }
        // Split s reads its own contiguous chunk of the row's vectors.
        const uint4 *vp = reinterpret_cast<const uint4 *>(p + head);
        const int64_t vbegin = s * a.per_split;
        const int64_t vend = vbegin + a.per_split < nvec ? vbegin + a.per_split : nvec;
        int64_t v = vbegin + lane;
        for (; v + (kUnroll - 1) * tpr < vend; v += kUnroll * tpr) {
            uint4 raw[kUnroll];
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                raw[u] = __ldg(vp + v + u * tpr);
            }
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                const In *e = reinterpret_cast<const In *>(&raw[u]);
                const int64_t base = head + (v + u * tpr) * N;
#pragma unroll
                for (int k = 0; k < N; k++) {
                    acc[k % L] = Op::combine(acc[k % L], Op::make(e[k], base + k));
                }
            }
        }
        // The last, partial tile of the chunk.
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int64_t idx = v + u * tpr;
            if (idx < vend) {
                uint4 raw = __ldg(vp + idx);
                const In *e = reinterpret_cast<const In *>(&raw);
                const int64_t base = head + idx * N;
#pragma unroll
                for (int k = 0; k < N; k++) {
                    acc[k % L] = Op::combine(acc[k % L], Op::make(e[k], base + k));
                }
            }
        }
        State t = acc[0];
#pragma unroll
        for (int k = 1; k < L; k++) {
            t = Op::combine(t, acc[k]);
        }
        t = warp_reduce<Op>(t);
        if (tpr == kThreads) {
            if (tid % 32 == 0) {
                warp_partials[tid / 32] = t;
            }
            __syncthreads();
            if (tid < 32) {
                t = tid < kWarps ? warp_partials[tid] : Op::identity();
                t = warp_reduce<Op>(t);
            }
            __syncthreads(); // warp_partials is reused by the next item
        }
        if (lane == 0) {
            if (a.splits == 1) {
                static_cast<Out *>(a.dst)[row] = Op::template finish<Out>(t, a.len, a.mean);
            }
            else {
                static_cast<State *>(a.partial)[w] = t;
            }
        }
    }
}

// One 256-thread block per row combines that row's `splits` partials in a
// fixed order: for the few rows with many splits (a sum over everything has
// one row and about one wave of splits), where a single warp would walk
// hundreds of partials one dependent load after another (~15 us on an H200).
template <typename Op, typename Out>
__global__ void __launch_bounds__(kThreads)
finalize_rows_block(const typename Op::State *partial, Out *dst, int64_t rows, int64_t splits,
                    int64_t count, int mean)
{
    using State = typename Op::State;
    __shared__ State warp_partials[kWarps];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        State t = Op::identity();
#pragma unroll 8
        for (int64_t j = threadIdx.x; j < splits; j += kThreads) {
            t = Op::combine(t, partial[row * splits + j]);
        }
        t = warp_reduce<Op>(t);
        if (threadIdx.x % 32 == 0) {
            warp_partials[threadIdx.x / 32] = t;
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            t = threadIdx.x < kWarps ? warp_partials[threadIdx.x] : Op::identity();
            t = warp_reduce<Op>(t);
            if (threadIdx.x == 0) {
                dst[row] = Op::template finish<Out>(t, count, mean);
            }
        }
        __syncthreads(); // warp_partials is reused by the next row
    }
}

// One warp per row combines that row's `splits` partials in a fixed order.
template <typename Op, typename Out>
__global__ void __launch_bounds__(kThreads)
finalize_rows(const typename Op::State *partial, Out *dst, int64_t rows, int64_t splits,
              int64_t count, int mean)
{
    using State = typename Op::State;
    const int lane = threadIdx.x % 32;
    for (int64_t row = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32; row < rows;
         row += (int64_t)gridDim.x * kWarps) {
        State t = Op::identity();
        for (int64_t j = lane; j < splits; j += 32) {
            t = Op::combine(t, partial[row * splits + j]);
        }
        t = warp_reduce<Op>(t);
        if (lane == 0) {
            dst[row] = Op::template finish<Out>(t, count, mean);
        }
    }
}

// ---- kernel 2: strided reduced axis, threads over outputs ----------------------

struct ColsParams {
    const void *src;
    void *dst;
    void *partial;         // [splits][outputs] states when splits > 1
    int64_t outputs;       // outer * inner
    int64_t inner;
    int64_t outer_stride;  // elements
    int64_t inner_stride;  // elements
    int64_t len;
    int64_t len_stride;    // elements
    int64_t tiles;         // ceil(outputs / (32 * V))
    int64_t splits;
    int64_t per_split;     // positions of the reduced axis per split
    int vec;               // 1: V consecutive outputs per thread as one vector load
    int mean;
};

template <typename In> struct ColsVec {
    static constexpr int V = 16 / sizeof(In) < 4 ? 16 / sizeof(In) : 4;
    using Raw = typename RawOf<V * sizeof(In)>::T;
};

template <typename In, typename Op, typename Out>
__global__ void __launch_bounds__(kThreads) reduce_cols(ColsParams a)
{
    using State = typename Op::State;
    constexpr int V = ColsVec<In>::V;
    using Raw = typename ColsVec<In>::Raw;
    constexpr int kCols = 32 * V; // outputs per block tile
    __shared__ State sm[kWarps][kCols];

    const In *src = static_cast<const In *>(a.src);
    const int tx = threadIdx.x % 32;
    const int ty = threadIdx.x / 32;
    const int64_t items = a.tiles * a.splits;
    for (int64_t b = blockIdx.x; b < items; b += gridDim.x) { // uniform per block
        const int64_t tile = b % a.tiles;
        const int64_t s = b / a.tiles;
        const int64_t r0 = s * a.per_split;
        const int64_t r1 = r0 + a.per_split < a.len ? r0 + a.per_split : a.len;
        const int64_t q_base = tile * kCols;
        State acc[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            acc[k] = Op::identity();
        }
        if (a.vec) {
            // Thread owns outputs q0 .. q0+V-1: one row of `inner`, contiguous.
            const int64_t q0 = q_base + tx * V;
            if (q0 < a.outputs) {
                const int64_t o = q0 / a.inner;
                const In *p = src + o * a.outer_stride + (q0 - o * a.inner);
                int64_t r = r0 + ty;
                for (; r + (kUnroll - 1) * kWarps < r1; r += kUnroll * kWarps) {
                    Raw raw[kUnroll];
#pragma unroll
                    for (int u = 0; u < kUnroll; u++) {
                        raw[u] = load_raw<Raw>(p + (r + u * kWarps) * a.len_stride);
                    }
#pragma unroll
                    for (int u = 0; u < kUnroll; u++) {
                        const In *e = reinterpret_cast<const In *>(&raw[u]);
#pragma unroll
                        for (int k = 0; k < V; k++) {
                            acc[k] = Op::combine(acc[k], Op::make(e[k], r + u * kWarps));
                        }
                    }
                }
                for (; r < r1; r += kWarps) {
                    Raw raw = load_raw<Raw>(p + r * a.len_stride);
                    const In *e = reinterpret_cast<const In *>(&raw);
#pragma unroll
                    for (int k = 0; k < V; k++) {
                        acc[k] = Op::combine(acc[k], Op::make(e[k], r));
                    }
                }
            }
#pragma unroll
            for (int k = 0; k < V; k++) {
                sm[ty][tx * V + k] = acc[k];
            }
        }
        else {
            // Scalar loads, any strides: thread owns outputs q_base + k*32 + tx,
            // so a warp still reads consecutive outputs together.
            const In *p[V];
            bool ok[V];
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int64_t q = q_base + k * 32 + tx;
                ok[k] = q < a.outputs;
                const int64_t o = ok[k] ? q / a.inner : 0;
                p[k] = src + o * a.outer_stride + (ok[k] ? q - o * a.inner : 0) * a.inner_stride;
            }
            for (int64_t r = r0 + ty; r < r1; r += kWarps) {
                In x[V];
#pragma unroll
                for (int k = 0; k < V; k++) {
                    if (ok[k]) {
                        x[k] = p[k][r * a.len_stride];
                    }
                }
#pragma unroll
                for (int k = 0; k < V; k++) {
                    if (ok[k]) {
                        acc[k] = Op::combine(acc[k], Op::make(x[k], r));
                    }
                }
            }
#pragma unroll
            for (int k = 0; k < V; k++) {
                sm[ty][k * 32 + tx] = acc[k];
            }
        }
        __syncthreads();
        for (int c = threadIdx.x; c < kCols; c += kThreads) {
            State t = sm[0][c];
#pragma unroll
            for (int y = 1; y < kWarps; y++) {
                t = Op::combine(t, sm[y][c]);
            }
            const int64_t q = q_base + c;
            if (q < a.outputs) {
                if (a.splits == 1) {
                    static_cast<Out *>(a.dst)[q] = Op::template finish<Out>(t, a.len, a.mean);
                }
                else {
                    static_cast<State *>(a.partial)[s * a.outputs + q] = t;
                }
            }
        }
        __syncthreads(); // sm is reused by the next item
    }
}

// One thread per output combines its splits in order (coalesced: [split][output]).
template <typename Op, typename Out>
__global__ void __launch_bounds__(kThreads)
finalize_cols(const typename Op::State *partial, Out *dst, int64_t outputs, int64_t splits,
              int64_t count, int mean)
{
    using State = typename Op::State;
    for (int64_t q = (int64_t)blockIdx.x * kThreads + threadIdx.x; q < outputs;
         q += (int64_t)gridDim.x * kThreads) {
        State t = partial[q];
        for (int64_t s = 1; s < splits; s++) {
            t = Op::combine(t, partial[s * outputs + q]);
        }
        dst[q] = Op::template finish<Out>(t, count, mean);
    }
}

// ---- planning and launch ------------------------------------------------------

constexpr int64_t kMaxGrid = (int64_t)1 << 30;

int64_t
ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

unsigned int
grid_of(int64_t blocks)
{
    return (unsigned int)(blocks < 1 ? 1 : (blocks > kMaxGrid ? kMaxGrid : blocks));
}

constexpr int kCachedDevices = 256;

cudaError_t
sm_count(int *out)
{
    static int cache[kCachedDevices];
    int device;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) {
        return err;
    }
    if (device >= 0 && device < kCachedDevices && cache[device] > 0) {
        *out = cache[device];
        return cudaSuccess;
    }
    err = cudaDeviceGetAttribute(out, cudaDevAttrMultiProcessorCount, device);
    if (err == cudaSuccess && device >= 0 && device < kCachedDevices) {
        cache[device] = *out;
    }
    return err;
}

// Resident blocks of `kernel` on the whole GPU: the grid one wave fills.
// `cache` (one per kernel, indexed by device) keeps the occupancy answer.
template <typename Kernel>
cudaError_t
wave_blocks(Kernel kernel, int *cache, int64_t *out)
{
    int sms, device, per_sm = 0;
    cudaError_t err = sm_count(&sms);
    if (err != cudaSuccess || (err = cudaGetDevice(&device)) != cudaSuccess) {
        return err;
    }
    const bool cacheable = device >= 0 && device < kCachedDevices;
    if (cacheable && cache[device] > 0) {
        per_sm = cache[device];
    }
    else {
        err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
        if (err != cudaSuccess) {
            return err;
        }
        per_sm = per_sm > 0 ? per_sm : 1;
        if (cacheable) {
            cache[device] = per_sm;
        }
    }
    *out = (int64_t)sms * per_sm;
    return cudaSuccess;
}

// How many pieces to cut each of `base` independent work items into so that
// the blocks fill whole waves: the smallest split count (at most max_splits)
// with the best ratio of blocks to wave slots over at most ~4 waves. Pure
// arithmetic on the shape and the device, so the plan never varies.
int64_t
pick_splits(int64_t base, int64_t wave, int64_t max_splits)
{
    if (base >= 4 * wave || max_splits <= 1) {
        return 1;
    }
    int64_t limit = ceil_div(4 * wave, base);
    limit = limit < max_splits ? limit : max_splits;
    int64_t best = 1;
    double best_eff = 0.0;
    for (int64_t s = 1; s <= limit; s++) {
        const int64_t blocks = base * s;
        const double eff = (double)blocks / (double)(ceil_div(blocks, wave) * wave);
        if (eff > best_eff + 1e-9) {
            best_eff = eff;
            best = s;
        }
    }
    return best;
}

bool
aligned(const void *p, size_t bytes)
{
    return ((uintptr_t)p % bytes) == 0;
}

// The plans depend on the layout alone; with `need` set, they only report the
// workspace bytes (the same plan, so the two calls always agree).

// Kernel 1 for a contiguous reduced axis: a warp or a block per row, long rows
// cut into chunks when there are few of them.
template <typename In, typename Op, typename Out>
cudaError_t
run_rows(const cl_reduce_desc *d, void *ws, size_t ws_bytes, size_t *need, cudaStream_t stream)
{
    using State = typename Op::State;
    const int64_t outputs = d->outer * d->inner;
    const int mean = d->op == CL_REDUCE_MEAN;
    constexpr int N = 16 / sizeof(In);
    cudaError_t err;
    RowsParams p;
    p.src = d->src;
    p.dst = d->dst;
    p.partial = ws;
    p.rows = outputs;
    p.inner = d->inner;
    p.outer_stride = d->outer_stride;
    p.inner_stride = d->inner_stride;
    p.len = d->len;
    p.tpr = d->len * (int64_t)sizeof(In) >= 8192 ? kThreads : 32;
    const int64_t nvec = ceil_div(d->len, N);
    p.splits = 1;
    p.per_split = nvec;
    int64_t wave;
    static int occupancy[kCachedDevices];
    if ((err = wave_blocks(reduce_rows<In, Op, Out>, occupancy, &wave)) != cudaSuccess) {
        return err;
    }
    if (p.tpr == kThreads) {
        // Few long rows: cut each into 64 KiB chunks, one block each, many
        // waves of short-lived blocks (like one block per row of a wide
        // matrix, the fastest case measured); a block per row combines the
        // chunk partials (finalize_rows_block).
        if (outputs < wave) {
            p.per_split = kChunkVectors;
            p.splits = ceil_div(nvec, p.per_split);
        }
    }
    p.mean = mean;
    const size_t bytes = p.splits > 1 ? (size_t)(outputs * p.splits) * sizeof(State) : 0;
    if (need != nullptr) {
        *need = bytes;
        return cudaSuccess;
    }
    if (ws_bytes < bytes || (bytes > 0 && !aligned(ws, alignof(State)))) {
        return cudaErrorInvalidValue;
    }
    const int groups = kThreads / p.tpr;
    reduce_rows<In, Op, Out><<<grid_of(ceil_div(outputs * p.splits, groups)), kThreads, 0,
                               stream>>>(p);
    if (p.splits > 1) {
        if ((err = cudaGetLastError()) != cudaSuccess) {
            return err;
        }
        // The choice depends on the plan alone, so results stay bit-identical.
        if (p.splits > 4 * 32) {
            finalize_rows_block<Op, Out><<<grid_of(outputs), kThreads, 0, stream>>>(
                static_cast<const State *>(ws), static_cast<Out *>(d->dst), outputs,
                p.splits, d->len, mean);
        }
        else {
            finalize_rows<Op, Out><<<grid_of(ceil_div(outputs, kWarps)), kThreads, 0,
                                     stream>>>(static_cast<const State *>(ws),
                                               static_cast<Out *>(d->dst), outputs, p.splits,
                                               d->len, mean);
        }
    }
    return cudaGetLastError();
}

// Kernel 2 for a strided (or tiny) reduced axis: threads over outputs, the
// axis split across blocks when there are few outputs.
template <typename In, typename Op, typename Out>
cudaError_t
run_cols(const cl_reduce_desc *d, void *ws, size_t ws_bytes, size_t *need, cudaStream_t stream)
{
    using State = typename Op::State;
    const int64_t outputs = d->outer * d->inner;
    const int mean = d->op == CL_REDUCE_MEAN;
    cudaError_t err;
    constexpr int V = ColsVec<In>::V;
    ColsParams p;
    p.src = d->src;
    p.dst = d->dst;
    p.partial = ws;
    p.outputs = outputs;
    p.inner = d->inner;
    p.outer_stride = d->outer_stride;
    p.inner_stride = d->inner_stride;
    p.len = d->len;
    p.len_stride = d->len_stride;
    p.vec = d->inner_stride == 1 && d->inner % V == 0 && d->outer_stride % V == 0 &&
            d->len_stride % V == 0 && aligned(d->src, V * sizeof(In));
    p.tiles = ceil_div(outputs, 32 * V);
    p.splits = 1;
    p.per_split = d->len;
    p.mean = mean;
    int64_t wave;
    static int occupancy[kCachedDevices];
    if ((err = wave_blocks(reduce_cols<In, Op, Out>, occupancy, &wave)) != cudaSuccess) {
        return err;
    }
    const int64_t splits =
        pick_splits(p.tiles, wave, ceil_div(d->len, (int64_t)kWarps * kUnroll * 2));
    if (splits > 1) {
        p.per_split = ceil_div(d->len, splits);
        p.splits = ceil_div(d->len, p.per_split);
    }
    const size_t bytes = p.splits > 1 ? (size_t)(outputs * p.splits) * sizeof(State) : 0;
    if (need != nullptr) {
        *need = bytes;
        return cudaSuccess;
    }
    if (ws_bytes < bytes || (bytes > 0 && !aligned(ws, alignof(State)))) {
        return cudaErrorInvalidValue;
    }
    reduce_cols<In, Op, Out><<<grid_of(p.tiles * p.splits), kThreads, 0, stream>>>(p);
    if (p.splits > 1) {
        if ((err = cudaGetLastError()) != cudaSuccess) {
            return err;
        }
        finalize_cols<Op, Out><<<grid_of(ceil_div(outputs, kThreads)), kThreads, 0, stream>>>(
            static_cast<const State *>(ws), static_cast<Out *>(d->dst), outputs, p.splits, d->len,
            mean);
    }
    return cudaGetLastError();
}

template <typename In, typename Op, typename Out>
cudaError_t
run(const cl_reduce_desc *d, void *ws, size_t ws_bytes, size_t *need, cudaStream_t stream)
{
    if (need != nullptr) {
        *need = 0;
    }
    if (d->outer * d->inner <= 0) {
        return cudaSuccess;
    }
    if (d->len_stride == 1 && d->len > 16) {
        return run_rows<In, Op, Out>(d, ws, ws_bytes, need, stream);
    }
    return run_cols<In, Op, Out>(d, ws, ws_bytes, need, stream);
}

// ---- dispatch: (op, input dtype) -> the one natural (accumulator, output) ----

// The type max/min/argmax compare in: small integers and bool as int, halves
// as float. Float sums accumulate in it too.
template <typename In> struct Acc { using T = In; };
template <> struct Acc<bool> { using T = int; };
template <> struct Acc<int8_t> { using T = int; };
template <> struct Acc<uint8_t> { using T = int; };
template <> struct Acc<__half> { using T = float; };
template <> struct Acc<__nv_bfloat16> { using T = float; };

template <typename In> constexpr bool kIsFloat = std::is_floating_point<In>::value;
template <> constexpr bool kIsFloat<__half> = true;
template <> constexpr bool kIsFloat<__nv_bfloat16> = true;

// Kernel types per op; the output types match cl_reduce_result_dtype (the
// launcher checks dst_dtype against it before it gets here).
template <typename In>
cudaError_t
run_op(const cl_reduce_desc *d, void *ws, size_t ws_bytes, size_t *need, cudaStream_t stream)
{
    using A = typename Acc<In>::T;
    constexpr bool F = kIsFloat<In>;
    using SumAcc = std::conditional_t<F, A, int64_t>; // integers wrap like NumPy's int64
    using SumOut = std::conditional_t<F, In, int64_t>;
    using MeanAcc = std::conditional_t<F, A, double>;
    using MeanOut = std::conditional_t<F, In, double>;
    switch (d->op) {
    case CL_REDUCE_SUM: return run<In, SumOp<SumAcc>, SumOut>(d, ws, ws_bytes, need, stream);
    case CL_REDUCE_MEAN: return run<In, SumOp<MeanAcc>, MeanOut>(d, ws, ws_bytes, need, stream);
    case CL_REDUCE_MAX: return run<In, ExtremeOp<A, true>, In>(d, ws, ws_bytes, need, stream);
    case CL_REDUCE_MIN: return run<In, ExtremeOp<A, false>, In>(d, ws, ws_bytes, need, stream);
    case CL_REDUCE_ARGMAX: return run<In, ArgMaxOp<A>, int64_t>(d, ws, ws_bytes, need, stream);
    default: return cudaErrorInvalidValue;
    }
}

cudaError_t
dispatch(const cl_reduce_desc *d, void *ws, size_t ws_bytes, size_t *need, cudaStream_t stream)
{
    if (d == nullptr || d->op < 0 || d->op >= CL_REDUCE_NUM_OPS || d->outer < 0 || d->inner < 0 ||
        d->len < 0 || d->dst_dtype != cl_reduce_result_dtype(d->op, d->src_dtype)) {
        return cudaErrorInvalidValue;
    }
    CL_DISPATCH(d->src_dtype, CL_ALL_TYPES, return run_op<scalar_t>(d, ws, ws_bytes, need, stream));
}

} // namespace

extern "C" int
cl_reduce_result_dtype(cl_reduce_op op, cl_dtype src)
{
    if (src < 0 || src >= CL_NUM_DTYPES) {
        return -1;
    }
    const bool is_float = src == CL_FLOAT16 || src == CL_BFLOAT16 || src == CL_FLOAT32 ||
                          src == CL_FLOAT64;
    int rule;
    switch (op) {
#define CL_REDUCE_RESULT_(ID, name, on_float, on_int, ...)                                     \
    case CL_REDUCE_##ID: rule = is_float ? (on_float) : (on_int); break;
        CL_REDUCE_OPS(CL_REDUCE_RESULT_)
#undef CL_REDUCE_RESULT_
    default: return -1;
    }
    return rule == CL_REDUCE_KEEP ? (int)src : rule;
}

extern "C" cudaError_t
cl_reduce_workspace(const cl_reduce_desc *desc, size_t *bytes)
{
    if (bytes == nullptr) {
        return cudaErrorInvalidValue;
    }
    return dispatch(desc, nullptr, 0, bytes, nullptr);
}

extern "C" cudaError_t
cl_reduce(const cl_reduce_desc *desc, void *workspace, size_t workspace_bytes,
          cudaStream_t stream)
{
    return dispatch(desc, workspace, workspace_bytes, nullptr, stream);
}
