// Implicit-GEMM convolution kernels for float32 data on TF32 tensor cores
// (inputs rounded to TF32 inside the mma, float32 accumulation and output).
// Tile shapes: threadblock MxNxK, warps, pipeline stages; mma.sync 16x8x8.
#include "conv_cutlass.cuh"

namespace cl_implicit {
namespace {

using Mma = cutlass::gemm::GemmShape<16, 8, 8>;
template <int M, int N, int K> using Shape = cutlass::gemm::GemmShape<M, N, K>;

const char *const names[] = {"128x128x32_3", "128x64x32_4", "128x64x32_4_c4", "64x64x32_3",
                             "64x64x32_3_c4"};

cudaError_t make(int tile, const cl_conv_implicit_desc *d, conv_op **out)
{
    switch (tile) {
    case 0: return CutlassConv<float, Shape<128, 128, 32>, Shape<64, 64, 32>, Mma, 3>::make(d, out);
    case 1: return CutlassConv<float, Shape<128, 64, 32>, Shape<64, 32, 32>, Mma, 4>::make(d, out);
    // The stem: exactly 4 channels per tap (kFixedChannels).
    case 2: return CutlassConv<float, Shape<128, 64, 32>, Shape<64, 32, 32>, Mma, 4, 4>::make(d, out);
    // Small tiles, smaller warp tiles: more CTAs resident per SM.
    case 3: return CutlassConv<float, Shape<64, 64, 32>, Shape<32, 32, 32>, Mma, 3>::make(d, out);
    case 4: return CutlassConv<float, Shape<64, 64, 32>, Shape<32, 32, 32>, Mma, 3, 4>::make(d, out);
    }
    return cudaErrorInvalidValue;
}

} // namespace

const tile_family tf32_tiles = {5, names, make, 2};

} // namespace cl_implicit
