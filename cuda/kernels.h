/* cudalab kernel launchers: the only interface between the Python extension
 * (csrc/, plain C) and the CUDA code (the .cu files in cuda/).
 *
 * Rules: launchers take raw device pointers, sizes and a cudaStream_t, enqueue
 * work on that stream and return the cudaError_t of the launch (or of argument
 * checks: cudaErrorInvalidValue). They never synchronize, never allocate, and
 * never touch Python. Strides are in ELEMENTS here (csrc converts from bytes).
 */
#ifndef CUDALAB_KERNELS_H
#define CUDALAB_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The element types cudalab supports. The order is part of the ABI between
 * csrc and cuda: never reorder, only append. */
typedef enum cl_dtype {
    CL_BOOL = 0,
    CL_INT8,
    CL_UINT8,
    CL_INT32,
    CL_INT64,
    CL_FLOAT16,
    CL_BFLOAT16,
    CL_FLOAT32,
    CL_FLOAT64,
    CL_NUM_DTYPES
} cl_dtype;

/* Highest rank of any array: matches the fixed-size shape/stride arrays the
 * kernels receive by value. */
#define CL_MAX_NDIM 8

/* A strided view as a kernel sees it: shape and element strides, rank <= 8. */
typedef struct cl_layout {
    int ndim;
    int64_t shape[CL_MAX_NDIM];
    int64_t strides[CL_MAX_NDIM]; /* in elements of the view's dtype */
} cl_layout;

/* dst[i] = (dst_dtype) src[i] for every index of `shape`, where both arrays
 * are addressed through their own element strides. Casts follow NumPy's
 * astype (float->int truncates, x->bool is x != 0, bool->x is 0/1,
 * float16/bfloat16 convert through float32). Same dtype and both dense and
 * alike ordered becomes one cudaMemcpyAsync. ndim may be 0 (one element). */
cudaError_t cl_copy_cast(void *dst, cl_dtype dst_dtype, const int64_t *dst_strides,
                         const void *src, cl_dtype src_dtype, const int64_t *src_strides,
                         int ndim, const int64_t *shape, cudaStream_t stream);

/* Writes `n` copies of the `itemsize`-byte pattern at `value` (1, 2, 4 or 8
 * bytes, host memory) to the contiguous buffer `dst`. */
cudaError_t cl_fill(void *dst, size_t n, const void *value, size_t itemsize,
                    cudaStream_t stream);

/* ---- elementwise.cu ------------------------------------------------------ */

/* ---- reduce.cu ----------------------------------------------------------- */

/* ---- transpose.cu -------------------------------------------------------- */

/* ---- random.cu ----------------------------------------------------------- */

#ifdef __cplusplus
}
#endif

#endif /* CUDALAB_KERNELS_H */
