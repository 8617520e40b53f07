// The interface between the dispatcher (conv_implicit.cu, compiled for every
// architecture) and the CUTLASS kernels (conv_<dtype>.cu, compiled only for
// SM80 and newer): an object that holds one prepared convolution.
#pragma once

#include <cuda_runtime.h>

#include "kernels.h"

namespace cl_implicit {

struct conv_op {
    virtual ~conv_op() = default;
    // out = epilogue(conv(x, w), c), c the bias, the residual or NULL as the
    // descriptor's epilogue says.
    virtual cudaError_t run(void *out, const void *x, const void *w, const void *c,
                            cudaStream_t stream) const = 0;
};

// One dtype's kernels: how many tile shapes, their names, a factory
// (cudaErrorNotSupported when the shape is outside what the tile's kernel
// can do), and the tile for exactly CL_CONV_FIXED_CHANNELS input channels.
struct tile_family {
    int count;
    const char *const *names;
    cudaError_t (*make)(int tile, const cl_conv_implicit_desc *d, conv_op **out);
    int fixed_channels_tile;
};

extern const tile_family float16_tiles, bfloat16_tiles, tf32_tiles;

} // namespace cl_implicit
