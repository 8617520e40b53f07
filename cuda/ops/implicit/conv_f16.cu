// Implicit-GEMM convolution kernels for float16 (float32 accumulation).
// Tile shapes: threadblock MxNxK, warps, pipeline stages; mma.sync 16x8x16.
#include "conv_cutlass.cuh"

namespace cl_implicit {
namespace {

using Mma = cutlass::gemm::GemmShape<16, 8, 16>;
using Half = cutlass::half_t;
template <int M, int N, int K> using Shape = cutlass::gemm::GemmShape<M, N, K>;

const char *const names[] = {"128x128x64_3", "128x64x64_4", "256x128x64_3",
                             "128x64x64_4_c4", "64x64x64_3",    "64x64x64_3_c4"};

cudaError_t make(int tile, const cl_conv_implicit_desc *d, conv_op **out)
{
    switch (tile) {
    case 0: return CutlassConv<Half, Shape<128, 128, 64>, Shape<64, 64, 64>, Mma, 3>::make(d, out);
    case 1: return CutlassConv<Half, Shape<128, 64, 64>, Shape<64, 32, 64>, Mma, 4>::make(d, out);
    case 2: return CutlassConv<Half, Shape<256, 128, 64>, Shape<64, 64, 64>, Mma, 3>::make(d, out);
    // The stem: exactly 4 channels per tap (kFixedChannels).
    case 3: return CutlassConv<Half, Shape<128, 64, 64>, Shape<64, 32, 64>, Mma, 4, 4>::make(d, out);
    // Small tiles, smaller warp tiles: more CTAs resident per SM to hide the
    // load latency of short reductions (the stem's K = 196, layer1's 576).
    case 4: return CutlassConv<Half, Shape<64, 64, 64>, Shape<32, 32, 64>, Mma, 3>::make(d, out);
    case 5: return CutlassConv<Half, Shape<64, 64, 64>, Shape<32, 32, 64>, Mma, 3, 4>::make(d, out);
    }
    return cudaErrorInvalidValue;
}

} // namespace

const tile_family float16_tiles = {6, names, make, 3};

} // namespace cl_implicit
