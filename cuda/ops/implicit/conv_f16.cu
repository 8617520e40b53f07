// Implicit-GEMM convolution kernels for float16 (the tile list: half_tiles.cuh).
#include "half_tiles.cuh"

namespace cl_implicit {

const tile_family float16_tiles = {half_tiles::kCount, half_tiles::names,
                                   half_tiles::make<cutlass::half_t>,
                                   half_tiles::kFixedChannelsTile};

} // namespace cl_implicit
