// The launch choice of the kernels that work row by row on contiguous rows
// (softmax.cu, cross_entropy.cu), written once: which kernel, which vector
// width, how many chunks per lane, and the grid.
//
//   rows of len <= kWarpMaxLen: the warp kernel, one warp per row and
//       kWarpRowsPerBlock rows per block of kWarpRowThreads; each lane holds
//       kVec * kChunks elements, kChunks the smallest power of two (kVec *
//       kChunks at most 32) that holds (len + 31) / 32 of them;
//   longer rows: the block kernel, one block per row, block_threads(len, kVec)
//       threads wide;
//   kVec: 16 / sizeof(T) (one 16-byte access) when the caller says its rows
//       are aligned for it (`vec`), else 1.
//
// A .cu file describes its two row kernels to dispatch_rows with a struct:
//
//     struct MyRows {              // Params: what both kernels take
//         template <typename T, int kVec, int kChunks>
//         static void warp(dim3 grid, dim3 block, cudaStream_t s, const Params &p)
//         { my_warp<T, kVec, kChunks><<<grid, block, 0, s>>>(p); }
//         template <typename T, int kVec>
//         static void block(dim3 grid, dim3 block, cudaStream_t s, const Params &p)
//         { my_block<T, kVec><<<grid, block, 0, s>>>(p); }
//     };
//
// and its warp kernel is __launch_bounds__(kWarpRowThreads), row
// blockIdx.x * kWarpRowsPerBlock + threadIdx.x / 32, grid-stride by
// gridDim.x * kWarpRowsPerBlock. The block kernel's width and the grid
// helpers are row_softmax.cuh's.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "row_softmax.cuh"

namespace cl_rows {

constexpr int kWarpRowThreads = 256;                       // block of the warp kernel
constexpr int kWarpRowsPerBlock = kWarpRowThreads / 32;    // a row per warp
constexpr int64_t kWarpMaxLen = 1024;                      // longest row it takes (32 per lane)

// The warp kernel with the smallest kChunks (a power of two) that holds
// `per_lane` elements per lane.
template <typename Rows, typename T, int kVec, int kChunks, typename Params>
cudaError_t
dispatch_warp_rows(const Params &p, int64_t rows, int64_t per_lane, cudaStream_t stream)
{
    if constexpr (kVec * kChunks < 32) {
        if (kVec * kChunks < per_lane) {
            return dispatch_warp_rows<Rows, T, kVec, kChunks * 2>(p, rows, per_lane, stream);
        }
    }
    Rows::template warp<T, kVec, kChunks>(
        grid_of((rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock), kWarpRowThreads, stream, p);
    return cudaGetLastError();
}

// `rows` rows of `len` elements of T; `vec`: every row is aligned for
// 16-byte accesses and holds whole vectors (the caller's layout decides).
template <typename Rows, typename T, typename Params>
cudaError_t
dispatch_rows(const Params &p, int64_t rows, int64_t len, bool vec, cudaStream_t stream)
{
    constexpr int V = 16 / sizeof(T);
    if (len <= kWarpMaxLen) {
        const int64_t per_lane = (len + 31) / 32;
        return vec ? dispatch_warp_rows<Rows, T, V, 1>(p, rows, per_lane, stream)
                   : dispatch_warp_rows<Rows, T, 1, 1>(p, rows, per_lane, stream);
    }
    if (vec) {
        Rows::template block<T, V>(grid_of(rows), block_threads(len, V), stream, p);
    }
    else {
        Rows::template block<T, 1>(grid_of(rows), block_threads(len, 1), stream, p);
    }
    return cudaGetLastError();
}

} // namespace cl_rows
