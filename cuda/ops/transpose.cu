// 2-D transpose: B = A.T, where A is rows x cols (any element strides) and
// B is cols x rows with unit stride along its rows (B[j][i] at dst[j*ld + i]).
//
// A transpose moves every byte once in and once out, so the yardstick is the
// device-to-device copy bandwidth (bytes read + written). The difficulty is
// that A's rows are contiguous but B's rows are A's columns: one of the two
// sides is always strided unless the data is staged somewhere. The teaching
// versions below show why, step by step. Elements are moved as raw bits
// (1, 2, 4 or 8 bytes): no dtype conversion happens here.
//
//   v1 "naive"           One thread per element, threadIdx.x runs along A's
//                        row, so a warp READS 32 consecutive elements
//                        (coalesced) but WRITES 32 elements a whole B row
//                        apart: every store touches its own 32-byte sector,
//                        of which 4 bytes (float32) are used. Expect roughly
//                        a quarter to a third of copy bandwidth (~1 TB/s on
//                        an H100/H200 for float32), worse for small dtypes.
//   v2 "coalesced_write" The opposite mapping: threadIdx.x runs along B's
//                        row, so writes coalesce and reads are strided. Often
//                        a little better than v1 on Hopper (a strided read
//                        sector is reused from L1/L2 by the neighbouring
//                        warps of the block, a strided partial write is not
//                        merged as well), but still far from copy speed.
//   v3 "tiled"           A 32x32 tile is staged in shared memory by a 32x8
//                        block (4 elements per thread): read a tile of A with
//                        coalesced loads, __syncthreads, write the tile's
//                        columns as B's rows with coalesced stores. Both
//                        global sides are now coalesced, but reading a
//                        COLUMN of tile[32][32] hits one shared-memory bank
//                        32 times (float32: a row is exactly 32 banks long),
//                        a 32-way bank conflict that serializes every
//                        column read. Expect about half of copy bandwidth.
//   v4 "tiled_padded"    v3 with tile[32][33]: the extra column shifts each
//                        row by one bank, so a column read touches 32
//                        different banks and shared memory runs at full
//                        speed. The usual textbook answer; on Hopper it is
//                        limited by how few bytes each thread keeps in flight
//                        (4 loads) rather than by shared memory. Expect
//                        60-75% of copy bandwidth.
//   v5 "best"            A 64x64 tile per 32x8 block: each thread keeps 16
//                        independent loads in flight (16 KiB per block for
//                        float32; 64 warps per SM hide the ~600-800 ns DRAM
//                        latency that a 3-5 TB/s memory needs), padded per
//                        element size so that column reads are conflict-free
//                        for 1, 2, 4 and 8-byte elements (row pitch an odd
//                        number of 4-byte words; 8-byte rows an odd number of
//                        8-byte words). Expect 80-90% of copy bandwidth for
//                        float32 on an H100/H200, i.e. ~3x PyTorch's
//                        x.t().contiguous(). When A is column-major (its
//                        stride along rows is 1) B is a plain 2-D copy and
//                        goes to cl_copy_cast instead.
//
// The GB/s figures above are what the design should give on an H100/H200
// (copy ~3.0 TB/s on an H100, ~4.3 TB/s on an H200), not yet measurements:
// benchmarks/bench_transpose.py measures every version beside PyTorch.
//
// Every kernel walks the tiles with a grid-stride loop (results do not depend
// on the grid) and checks bounds per element, so any rows/cols and any
// strides (negative ones too) are correct. copy.cu routes the "destination
// C-contiguous, source its transpose" layout of ascontiguousarray(a.T) here
// with method v5.
#include "kernels.h"
#include "dtype_dispatch.cuh"

#include <stdint.h>

namespace {

constexpr int kWarp = 32;
constexpr int kRows = 8; // threads per block along y: every kernel uses 32x8 = 256 threads
constexpr int kThreads = kWarp * kRows;

// Shared-memory padding (in elements) that makes a tile column read
// conflict-free: the row pitch becomes an odd number of 4-byte banks (1-, 2-,
// 4-byte elements) or of 8-byte bank pairs (8-byte elements).
template <typename T> constexpr int conflict_free_pad() { return sizeof(T) >= 4 ? 1 : 4 / (int)sizeof(T); }

// v1 and v2: one element per thread, a 32x8 patch per block iteration.
// kAlongRow = true: threadIdx.x walks A's row (v1, coalesced reads);
// false: threadIdx.x walks B's row (v2, coalesced writes).
template <typename T, bool kAlongRow>
__global__ void __launch_bounds__(kThreads)
transpose_naive(T *__restrict__ dst, int64_t ld, const T *__restrict__ src, int64_t s0,
                int64_t s1, int64_t rows, int64_t cols, int64_t patches_x, int64_t npatches)
{
    for (int64_t p = blockIdx.x; p < npatches; p += gridDim.x) {
        int64_t py = p / patches_x, px = p - py * patches_x;
        int64_t fast = px * kWarp + threadIdx.x; // the coalesced index
        int64_t slow = py * kRows + threadIdx.y;
        int64_t i = kAlongRow ? slow : fast; // row of A
        int64_t j = kAlongRow ? fast : slow; // column of A = row of B
        if (i < rows && j < cols) {
            dst[j * ld + i] = src[i * s0 + j * s1];
        }
    }
}

// v3, v4, v5: a kTile x kTile tile staged in shared memory by a 32x8 block.
// Read phase: threadIdx.x along A's row. Write phase: threadIdx.x along B's
// row, reading a column of the tile.
template <typename T, int kTile, int kPad>
__global__ void __launch_bounds__(kThreads)
transpose_tiled(T *__restrict__ dst, int64_t ld, const T *__restrict__ src, int64_t s0,
                int64_t s1, int64_t rows, int64_t cols, int64_t tiles_x, int64_t ntiles)
{
    static_assert(kTile % kWarp == 0 && kTile % kRows == 0, "tile must fit the block");
    __shared__ T tile[kTile][kTile + kPad];
    for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
        int64_t ty = t / tiles_x, tx = t - ty * tiles_x;
        int64_t i0 = ty * kTile, j0 = tx * kTile;
#pragma unroll
        for (int r = 0; r < kTile; r += kRows) {
#pragma unroll
            for (int c = 0; c < kTile; c += kWarp) {
                int64_t i = i0 + r + threadIdx.y, j = j0 + c + threadIdx.x;
                if (i < rows && j < cols) {
                    tile[r + threadIdx.y][c + threadIdx.x] = src[i * s0 + j * s1];
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < kTile; r += kRows) {
#pragma unroll
            for (int c = 0; c < kTile; c += kWarp) {
                int64_t j = j0 + r + threadIdx.y, i = i0 + c + threadIdx.x;
                if (i < rows && j < cols) {
                    dst[j * ld + i] = tile[c + threadIdx.x][r + threadIdx.y];
                }
            }
        }
        __syncthreads(); // the tile is reused by the next iteration
    }
}

// Elements move as raw bits: each dtype maps to the unsigned type of its size,
// so dtypes of one size share one instantiation.
#define RAW_TYPES(X, ...)                                                       \
    X(CL_BOOL, uint8_t, __VA_ARGS__)                                               \
    X(CL_INT8, uint8_t, __VA_ARGS__)                                               \
    X(CL_UINT8, uint8_t, __VA_ARGS__)                                              \
    X(CL_INT32, uint32_t, __VA_ARGS__)                                             \
    X(CL_INT64, uint64_t, __VA_ARGS__)                                             \
    X(CL_FLOAT16, uint16_t, __VA_ARGS__)                                           \
    X(CL_BFLOAT16, uint16_t, __VA_ARGS__)                                          \
    X(CL_FLOAT32, uint32_t, __VA_ARGS__)                                           \
    X(CL_FLOAT64, uint64_t, __VA_ARGS__)

unsigned int
grid_for(int64_t units)
{
    // Up to 2^20 blocks; the grid-stride loops cover anything larger.
    const int64_t cap = int64_t(1) << 20;
    return (unsigned int)(units < cap ? (units > 0 ? units : 1) : cap);
}

int64_t
ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

template <typename T>
cudaError_t
launch(int method, void *dst_v, int64_t ld, const void *src_v, int64_t s0, int64_t s1,
       int64_t rows, int64_t cols, cudaStream_t stream)
{
    T *dst = static_cast<T *>(dst_v);
    const T *src = static_cast<const T *>(src_v);
    dim3 block(kWarp, kRows);
    switch (method) {
    case CL_TRANSPOSE_NAIVE: {
        int64_t px = ceil_div(cols, kWarp), n = px * ceil_div(rows, kRows);
        transpose_naive<T, true><<<grid_for(n), block, 0, stream>>>(dst, ld, src, s0, s1, rows,
                                                                    cols, px, n);
        break;
    }
    case CL_TRANSPOSE_COALESCED_WRITE: {
        int64_t px = ceil_div(rows, kWarp), n = px * ceil_div(cols, kRows);
        transpose_naive<T, false><<<grid_for(n), block, 0, stream>>>(dst, ld, src, s0, s1,
                                                                     rows, cols, px, n);
        break;
    }
    case CL_TRANSPOSE_TILED: {
        int64_t tx = ceil_div(cols, 32), n = tx * ceil_div(rows, 32);
        transpose_tiled<T, 32, 0><<<grid_for(n), block, 0, stream>>>(dst, ld, src, s0, s1, rows,
                                                                     cols, tx, n);
        break;
    }
    case CL_TRANSPOSE_TILED_PADDED: {
        int64_t tx = ceil_div(cols, 32), n = tx * ceil_div(rows, 32);
        transpose_tiled<T, 32, 1><<<grid_for(n), block, 0, stream>>>(dst, ld, src, s0, s1, rows,
                                                                     cols, tx, n);
        break;
    }
    case CL_TRANSPOSE_BEST: {
        int64_t tx = ceil_div(cols, 64), n = tx * ceil_div(rows, 64);
        transpose_tiled<T, 64, conflict_free_pad<T>()><<<grid_for(n), block, 0, stream>>>(
            dst, ld, src, s0, s1, rows, cols, tx, n);
        break;
    }
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t
cl_transpose_2d(void *dst, int64_t ld_dst, const void *src, int64_t src_stride0,
                int64_t src_stride1, int64_t rows, int64_t cols, cl_dtype dtype, int method,
                cudaStream_t stream)
{
    if (dtype < 0 || dtype >= CL_NUM_DTYPES || method < 0 || method >= CL_TRANSPOSE_NUM_METHODS ||
        rows < 0 || cols < 0) {
        return cudaErrorInvalidValue;
    }
    if (rows == 0 || cols == 0) {
        return cudaSuccess;
    }
    if (method == CL_TRANSPOSE_BEST && src_stride0 == 1 && src_stride1 != 1 && rows > 1) {
        // A is column-major: B's rows are A's columns, already contiguous.
        // This is a plain 2-D copy (one cudaMemcpyAsync when it is dense).
        const int64_t shape[2] = {cols, rows};
        const int64_t dst_strides[2] = {ld_dst, 1};
        const int64_t src_strides[2] = {src_stride1, 1};
        return cl_copy_cast(dst, dtype, dst_strides, src, dtype, src_strides, 2, shape, stream);
    }
    CL_DISPATCH(dtype, RAW_TYPES,
                return launch<scalar_t>(method, dst, ld_dst, src, src_stride0, src_stride1, rows,
                                        cols, stream));
}
