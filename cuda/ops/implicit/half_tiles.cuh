// The tile shapes of the 16-bit types (float16 and bfloat16, float32
// accumulation): one list, so the two dtypes always build and name the same
// kernels. conv_f16.cu and conv_bf16.cu each instantiate it for their type,
// in a translation unit of its own (the two compile in parallel).
// Tile shapes: threadblock MxNxK, warps, pipeline stages; mma.sync 16x8x16.
#pragma once

#include "conv_cutlass.cuh"

namespace cl_implicit {
namespace half_tiles {

using Mma = cutlass::gemm::GemmShape<16, 8, 16>;
template <int M, int N, int K> using Shape = cutlass::gemm::GemmShape<M, N, K>;

constexpr int kCount = 6;
// The stem's kernel: exactly 4 channels per tap (kFixedChannels).
constexpr int kFixedChannelsTile = 3;
inline const char *const names[kCount] = {"128x128x64_3",   "128x64x64_4", "256x128x64_3",
                                          "128x64x64_4_c4", "64x64x64_3",  "64x64x64_3_c4"};

template <typename Half>
cudaError_t make(int tile, const cl_conv_implicit_desc *d, conv_op **out)
{
    switch (tile) {
    case 0: return CutlassConv<Half, Shape<128, 128, 64>, Shape<64, 64, 64>, Mma, 3>::make(d, out);
    case 1: return CutlassConv<Half, Shape<128, 64, 64>, Shape<64, 32, 64>, Mma, 4>::make(d, out);
    case 2: return CutlassConv<Half, Shape<256, 128, 64>, Shape<64, 64, 64>, Mma, 3>::make(d, out);
    case 3: return CutlassConv<Half, Shape<128, 64, 64>, Shape<64, 32, 64>, Mma, 4, 4>::make(d, out);
    // Small tiles, smaller warp tiles: more CTAs resident per SM to hide the
    // load latency of short reductions (the stem's K = 196, layer1's 576).
    case 4: return CutlassConv<Half, Shape<64, 64, 64>, Shape<32, 32, 64>, Mma, 3>::make(d, out);
    case 5: return CutlassConv<Half, Shape<64, 64, 64>, Shape<32, 32, 64>, Mma, 3, 4>::make(d, out);
    }
    return cudaErrorInvalidValue;
}

} // namespace half_tiles
} // namespace cl_implicit
