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

/* The element-wise operations. Binary ones read in[0] and in[1]; AXPY computes
 * alpha * in[0] + in[1] with one rounding (a fused multiply-add); the others
 * are unary and read in[0]. Append only. */
typedef enum cl_ew_op {
    CL_EW_ADD = 0,
    CL_EW_SUB,
    CL_EW_MUL,
    CL_EW_DIV,
    CL_EW_MAXIMUM, /* NaN-propagating, as NumPy */
    CL_EW_MINIMUM,
    CL_EW_AXPY,
    CL_EW_NEG,
    CL_EW_ABS,
    CL_EW_EXP,
    CL_EW_LOG,
    CL_EW_SQRT,
    CL_EW_TANH,
    CL_EW_SIGMOID,
    CL_EW_RELU,
    CL_EW_GELU,      /* erf form */
    CL_EW_GELU_TANH, /* tanh approximation */
    CL_EW_NUM_OPS
} cl_ew_op;

/* One input of an element-wise op: an array (data != NULL) addressed through
 * `strides` (elements, one per output axis, 0 on broadcast axes), or a scalar
 * (data == NULL) whose value is `fvalue` for floating dtypes (converted to the
 * dtype on the device exactly as astype does) or `ivalue` for integer and
 * bool dtypes. */
typedef struct cl_ew_operand {
    const void *data;
    const int64_t *strides;
    double fvalue;
    int64_t ivalue;
} cl_ew_operand;

/* out = op(in[0], in[1]) for every index of `shape` (rank <= 8; ndim 0 is one
 * element). Every array has dtype `dtype`: callers cast mixed operands first.
 * `alpha` is read only by CL_EW_AXPY (a scalar operand, may be NULL
 * otherwise). `out` may be exactly in[k] (same pointer and strides); any
 * other overlap is the caller's to avoid. Contiguous operands with 16-byte
 * aligned pointers take the vectorized path; everything else the strided
 * one. cudaErrorInvalidValue for an op the dtype does not support. */
cudaError_t cl_elementwise(cl_ew_op op, cl_dtype dtype, void *out, const int64_t *out_strides,
                           int ndim, const int64_t *shape, const cl_ew_operand *in,
                           const cl_ew_operand *alpha, cudaStream_t stream);

/* ---- reduce.cu ----------------------------------------------------------- */

/* ---- transpose.cu -------------------------------------------------------- */

/* ---- random.cu ----------------------------------------------------------- */

#ifdef __cplusplus
}
#endif

#endif /* CUDALAB_KERNELS_H */
