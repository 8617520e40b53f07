// Pad (or crop) a stack of row-major matrices into a contiguous buffer:
//
//   dst[b][r][c] = src[b * src_batch + r * src_row + c]   for r < rows, c < cols
//                = 0                                        elsewhere in dst
//
// matmul uses it both ways around a tensor-core GEMM whose K or N is not a
// multiple of 16 bytes: operands are copied into buffers padded with zeros
// (dst larger than rows x cols), and the padded result is cropped back into
// the caller's array (dst_cols = cols < src_row). One pass writes every byte
// of dst once, zeros included, where a pitched cudaMemcpy3D plus two
// cudaMemset2D calls would cross the memory three times with row widths the
// copy engine handles poorly (8190 bytes for 4095 halves).
//
// Each thread moves one 16-byte chunk of a dst row, aligned to 16 bytes in
// memory: a dst row that does not start on a 16-byte boundary (a cropped
// result with 4095 halves per row) has a partial head chunk and a partial
// tail, written element by element, and whole chunks between them. The
// chunk's source elements are read with two aligned 16-byte loads and
// funnel shifts when the source row is misaligned (the neighbouring thread
// loads the same vector, from L1): element-wise loads of 2-byte values at a
// 16-byte stride across the warp run at half the copy bandwidth on an H200.
// Elements are raw bits of 2 or 4 bytes (the tensor-core dtypes matmul
// pads): no conversion happens here.
#include "kernels.h"

#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kChunkBytes = 16;
constexpr unsigned int kMaxGridYZ = 65535;

struct PadArgs {
    void *dst;
    const void *src;
    uintptr_t src_end; // one past the last source byte read: vector loads stop before it
    int64_t dst_rows, dst_cols, src_batch, src_row, rows, cols, depth;
};

// The 16 bytes starting at any address p: two aligned loads, then each
// output word is cut from the 8 words loaded with one funnel shift. The
// second load ends with the 16-byte block holding p's last byte: up to 15
// bytes past it, which no fault can come from (allocations are aligned far
// more coarsely) but which may lie past the end of the allocation, where
// compute-sanitizer rightly reports the read. Callers check fits16 first.
__device__ __forceinline__ uint4
load_unaligned16(const void *p)
{
    uintptr_t addr = (uintptr_t)p;
    const uint4 *base = reinterpret_cast<const uint4 *>(addr & ~(uintptr_t)(kChunkBytes - 1));
    unsigned int offset = (unsigned int)(addr & (kChunkBytes - 1));
    uint4 lo = base[0];
    if (offset == 0) {
        return lo;
    }
    uint4 hi = base[1];
    uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    unsigned int shift = (offset % 4) * 8;
    uint4 out;
    // The word index must be a constant for w[] to stay in registers.
    switch (offset / 4) {
#define CL_PAD_CUT_(k)                                                                             \
    case k:                                                                                        \
        out.x = __funnelshift_r(w[k + 0], w[k + 1], shift);                                        \
        out.y = __funnelshift_r(w[k + 1], w[k + 2], shift);                                        \
        out.z = __funnelshift_r(w[k + 2], w[k + 3], shift);                                        \
        out.w = __funnelshift_r(w[k + 3], w[k + 4], shift);                                        \
        break;
        CL_PAD_CUT_(0)
        CL_PAD_CUT_(1)
        CL_PAD_CUT_(2)
        CL_PAD_CUT_(3)
#undef CL_PAD_CUT_
    }
    return out;
}

// load_unaligned16(p) reads no byte at or past `end`.
__device__ __forceinline__ bool
fits16(const void *p, uintptr_t end)
{
    return (((uintptr_t)p + kChunkBytes - 1) | (uintptr_t)(kChunkBytes - 1)) < end;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
pad_matrices(PadArgs a)
{
    constexpr int V = kChunkBytes / sizeof(T);
    int64_t chunk = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    T *dst = static_cast<T *>(a.dst);
    const T *src = static_cast<const T *>(a.src);
    for (int64_t b = blockIdx.z; b < a.depth; b += gridDim.z) {
        for (int64_t r = blockIdx.y; r < a.dst_rows; r += gridDim.y) {
            T *d = dst + (b * a.dst_rows + r) * a.dst_cols;
            // Elements before the row's first 16-byte boundary: chunk 0
            // holds them (partial), whole chunks follow.
            int head = (int)(((kChunkBytes - (uintptr_t)d % kChunkBytes) % kChunkBytes) /
                             sizeof(T));
            int64_t c0 = chunk * V - (head > 0 ? V - head : 0);
            if (c0 >= a.dst_cols) {
                continue;
            }
            const T *s = src + b * a.src_batch + r * a.src_row;
            union {
                uint4 chunk;
                T e[V];
            } v;
            bool whole = c0 >= 0 && c0 + V <= a.dst_cols;
            if (r < a.rows && c0 >= 0 && c0 + V <= a.cols && fits16(s + c0, a.src_end)) {
                v.chunk = load_unaligned16(s + c0);
            }
            else {
#pragma unroll
                for (int i = 0; i < V; i++) {
                    int64_t c = c0 + i;
                    v.e[i] = (r < a.rows && c >= 0 && c < a.cols) ? s[c] : T(0);
                }
            }
            if (whole) {
                *reinterpret_cast<uint4 *>(d + c0) = v.chunk;
            }
            else {
#pragma unroll
                for (int i = 0; i < V; i++) {
                    int64_t c = c0 + i;
                    if (c >= 0 && c < a.dst_cols) {
                        d[c] = v.e[i];
                    }
                }
            }
        }
    }
}

template <typename T>
cudaError_t
launch(PadArgs a, cudaStream_t stream)
{
    constexpr int64_t V = kChunkBytes / sizeof(T);
    int64_t chunks = (a.dst_cols + V - 1) / V + 1; // + 1: a partial head chunk
    int64_t blocks = (chunks + kThreads - 1) / kThreads;
    if (blocks > (int64_t)INT32_MAX) {
        return cudaErrorInvalidValue;
    }
    dim3 grid((unsigned int)blocks,
              (unsigned int)(a.dst_rows < kMaxGridYZ ? a.dst_rows : kMaxGridYZ),
              (unsigned int)(a.depth < kMaxGridYZ ? a.depth : kMaxGridYZ));
    pad_matrices<T><<<grid, kThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t
cl_pad_matrices(void *dst, int64_t dst_rows, int64_t dst_cols, const void *src,
                int64_t src_batch, int64_t src_row, int64_t rows, int64_t cols, int64_t depth,
                size_t itemsize, cudaStream_t stream)
{
    if (dst_rows < 0 || dst_cols < 0 || rows < 0 || cols < 0 || depth < 0 ||
        rows > dst_rows || cols > dst_cols || (uintptr_t)dst % itemsize != 0 ||
        (uintptr_t)src % itemsize != 0) {
        return cudaErrorInvalidValue;
    }
    if (dst_rows == 0 || dst_cols == 0 || depth == 0) {
        return cudaSuccess;
    }
    // The last element read is (depth-1, rows-1, cols-1); strides may be 0.
    int64_t last = (rows > 0 && cols > 0)
                       ? (depth - 1) * (src_batch > 0 ? src_batch : 0) +
                             (rows - 1) * (src_row > 0 ? src_row : 0) + cols - 1
                       : -1;
    uintptr_t src_end = (uintptr_t)src + (uintptr_t)((last + 1) * (int64_t)itemsize);
    PadArgs a = {dst, src, src_end, dst_rows, dst_cols, src_batch, src_row, rows, cols, depth};
    switch (itemsize) {
    case 2: return launch<uint16_t>(a, stream);
    case 4: return launch<uint32_t>(a, stream);
    default: return cudaErrorInvalidValue;
    }
}
