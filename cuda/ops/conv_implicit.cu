// The C entry points of the implicit-GEMM convolution: validate the
// descriptor, check the device, pick a tile shape, and hand over to the
// CUTLASS kernels of ops/implicit/. Compiled for every architecture; the
// kernels themselves only for SM80 and newer, and only when the build's
// architecture list has one (CUDALAB_IMPLICIT_GEMM is then defined).
#include <new>

#include "implicit/conv_op.h"
#include "kernels.h"

struct cl_conv_implicit {
    cl_implicit::conv_op *op;
    cl_conv_epilogue epilogue;
};

namespace {

const cl_implicit::tile_family *family(cl_dtype dtype)
{
#ifdef CUDALAB_IMPLICIT_GEMM
    switch (dtype) {
    case CL_FLOAT16: return &cl_implicit::float16_tiles;
    case CL_BFLOAT16: return &cl_implicit::bfloat16_tiles;
    case CL_FLOAT32: return &cl_implicit::tf32_tiles;
    default: break;
    }
#endif
    (void)dtype;
    return nullptr;
}

// Without a measurement (the plans measure): the stem's kernel for its 4
// channels; else a narrow tile where cout is small, so that half of a
// 128-wide tile does not compute padding.
int default_tile(const cl_implicit::tile_family *f, const cl_conv_implicit_desc *d)
{
    if (d->g.c == CL_CONV_FIXED_CHANNELS) {
        return f->fixed_channels_tile;
    }
    return d->cout <= 64 ? 1 : 0;
}

bool aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

bool valid(const cl_conv_implicit_desc *d)
{
    const cl_conv_geometry &g = d->g;
    if (g.n <= 0 || g.h <= 0 || g.w <= 0 || g.c <= 0 || d->cout <= 0 || g.kh <= 0 ||
        g.kw <= 0 || g.stride <= 0 || g.padding < 0) {
        return false;
    }
    // The output size must be the one the geometry implies.
    return g.oh == (g.h + 2 * g.padding - g.kh) / g.stride + 1 &&
           g.ow == (g.w + 2 * g.padding - g.kw) / g.stride + 1 && g.oh > 0 && g.ow > 0 &&
           (d->epilogue == CL_CONV_EPILOGUE_NONE || d->epilogue == CL_CONV_EPILOGUE_BIAS ||
            d->epilogue == CL_CONV_EPILOGUE_RESIDUAL);
}

} // namespace

extern "C" int cl_conv_implicit_tiles(cl_dtype dtype)
{
    const cl_implicit::tile_family *f = family(dtype);
    return f == nullptr ? 0 : f->count;
}

extern "C" const char *cl_conv_implicit_tile_name(cl_dtype dtype, int tile)
{
    const cl_implicit::tile_family *f = family(dtype);
    return f == nullptr || tile < 0 || tile >= f->count ? nullptr : f->names[tile];
}

extern "C" int cl_conv_implicit_alignment(cl_dtype dtype)
{
    return dtype == CL_FLOAT32 ? 4 : 8;
}

extern "C" cudaError_t cl_conv_implicit_create(cl_conv_implicit **out,
                                               const cl_conv_implicit_desc *d, int tile)
{
    *out = nullptr;
    const cl_implicit::tile_family *f = family(d->dtype);
    if (!valid(d)) {
        return cudaErrorInvalidValue;
    }
    if (f == nullptr) {
        return cudaErrorNotSupported;
    }
    int device, major;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
        err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    }
    if (err != cudaSuccess) {
        return err;
    }
    if (major < 8) {
        return cudaErrorNotSupported;
    }
    const int align = cl_conv_implicit_alignment(d->dtype);
    if ((d->g.c % align != 0 && d->g.c != CL_CONV_FIXED_CHANNELS) || d->cout % align != 0) {
        return cudaErrorNotSupported;
    }
    if (tile < 0) {
        tile = default_tile(f, d);
    }
    if (tile >= f->count) {
        return cudaErrorInvalidValue;
    }
    auto *handle = new (std::nothrow) cl_conv_implicit{nullptr, d->epilogue};
    if (handle == nullptr) {
        return cudaErrorMemoryAllocation;
    }
    err = f->make(tile, d, &handle->op);
    if (err != cudaSuccess) {
        delete handle;
        return err;
    }
    *out = handle;
    return cudaSuccess;
}

extern "C" cudaError_t cl_conv_implicit_run(const cl_conv_implicit *op, void *out,
                                            const void *x, const void *w, const void *c,
                                            cudaStream_t stream)
{
    const bool needs_c = op->epilogue != CL_CONV_EPILOGUE_NONE;
    if (needs_c != (c != nullptr)) {
        return cudaErrorInvalidValue;
    }
    if (!aligned16(out) || !aligned16(x) || !aligned16(w) || (c != nullptr && !aligned16(c))) {
        return cudaErrorMisalignedAddress;
    }
    return op->op->run(out, x, w, c, stream);
}

extern "C" void cl_conv_implicit_destroy(cl_conv_implicit *op)
{
    if (op != nullptr) {
        delete op->op;
        delete op;
    }
}
