// Implicit-GEMM convolution kernels for bfloat16 (the tile list: half_tiles.cuh).
#include "half_tiles.cuh"

namespace cl_implicit {

const tile_family bfloat16_tiles = {half_tiles::kCount, half_tiles::names,
                                    half_tiles::make<cutlass::bfloat16_t>,
                                    half_tiles::kFixedChannelsTile};

} // namespace cl_implicit
