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

#include "ops/elementwise_ops.h"

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

/* The element-wise operations, one per line of the op table (elementwise_ops.h:
 * arity, dtype rule, device expression). The order is part of the ABI:
 * the table only ever grows at its end. */
typedef enum cl_ew_op {
#define CL_EW_ENUM_(ENUM, ...) CL_EW_##ENUM,
    CL_EW_OPS(CL_EW_ENUM_)
#undef CL_EW_ENUM_
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

/* out = op(in[0], ..., in[nin - 1]) for every index of `shape` (rank <= 8;
 * ndim 0 is one element), nin being the op's arity in the table (1 to 3).
 * Every array has dtype `dtype` (callers cast mixed operands first) except
 * CL_EW_WHERE's in[0], the condition, which is bool. At least one operand is
 * an array; in[0] may be a scalar only for ops of two operands. `alpha` is
 * read only by CL_EW_AXPY (alpha * in[0] + in[1], one rounding; may be NULL
 * otherwise). `out` may be exactly in[k] (same pointer and strides); any
 * other overlap is the caller's to avoid. Contiguous operands with 16-byte
 * aligned pointers take the vectorized path; everything else the strided
 * one. cudaErrorInvalidValue for an op the dtype does not support. */
cudaError_t cl_elementwise(cl_ew_op op, cl_dtype dtype, void *out, const int64_t *out_strides,
                           int ndim, const int64_t *shape, const cl_ew_operand *in,
                           const cl_ew_operand *alpha, cudaStream_t stream);

/* ---- reduce.cu ----------------------------------------------------------- */

#include "ops/reduce_ops.h" /* CL_REDUCE_OPS: the table of reductions */

/* Output element (o, i), stored C-contiguously at dst[o * inner + i], combines
 * the `len` elements src[o * outer_stride + r * len_stride + i * inner_stride]
 * (element strides), r = 0 .. len-1. A reduction over everything of a dense
 * array is outer = inner = 1, len = size, len_stride = 1. len may be 0 for
 * SUM (gives 0) and MEAN (gives NaN); MAX/MIN/ARGMAX need len > 0 (checked by
 * the caller, as NumPy raises). ARGMAX gives the index along the reduced axis
 * (first occurrence on ties, first NaN if any). Results are bit-identical run
 * to run: no atomics, and the plan depends only on the layout and device. */
#define CL_REDUCE_ENUM_(ID, ...) CL_REDUCE_##ID,
typedef enum cl_reduce_op { CL_REDUCE_OPS(CL_REDUCE_ENUM_) CL_REDUCE_NUM_OPS } cl_reduce_op;
#undef CL_REDUCE_ENUM_

typedef struct cl_reduce_desc {
    cl_reduce_op op;
    cl_dtype src_dtype;
    cl_dtype dst_dtype; /* must be cl_reduce_result_dtype(op, src_dtype) */
    const void *src;
    void *dst;
    int64_t outer, outer_stride;
    int64_t inner, inner_stride;
    int64_t len, len_stride;
} cl_reduce_desc;

/* The dtype the kernels produce for `op` on `src` (CL_REDUCE_OPS' on_float /
 * on_int). -1 for an invalid op or dtype. Pure host code, no CUDA call. */
int cl_reduce_result_dtype(cl_reduce_op op, cl_dtype src);

/* Bytes of scratch cl_reduce needs for `desc` on the current device (0 when
 * one pass suffices); queries the device's SM count and kernel occupancy. */
cudaError_t cl_reduce_workspace(const cl_reduce_desc *desc, size_t *bytes);

/* Enqueue the reduction; `workspace` (from cl_reduce_workspace, aligned to 16
 * bytes) holds per-block partials that a second kernel combines in order. */
cudaError_t cl_reduce(const cl_reduce_desc *desc, void *workspace, size_t workspace_bytes,
                      cudaStream_t stream);

/* ---- transpose.cu -------------------------------------------------------- */

/* The teaching versions of the 2-D transpose (described in transpose.cu). */
typedef enum cl_transpose_method {
    CL_TRANSPOSE_NAIVE = 0,          /* v1: coalesced reads, strided writes */
    CL_TRANSPOSE_COALESCED_WRITE,    /* v2: strided reads, coalesced writes */
    CL_TRANSPOSE_TILED,              /* v3: 32x32 shared tile, bank conflicts */
    CL_TRANSPOSE_TILED_PADDED,       /* v4: 32x33 shared tile */
    CL_TRANSPOSE_BEST,               /* v5: 64x64 padded tile, 16 elements/thread */
    CL_TRANSPOSE_NUM_METHODS
} cl_transpose_method;

/* B = A.T as raw bits of `dtype`'s size: A is rows x cols with element
 * strides (src_stride0, src_stride1) (any sign), B is cols x rows with
 * B[j][i] at dst[j * ld_dst + i]. `method` is a cl_transpose_method. */
cudaError_t cl_transpose_2d(void *dst, int64_t ld_dst, const void *src, int64_t src_stride0,
                            int64_t src_stride1, int64_t rows, int64_t cols, cl_dtype dtype,
                            int method, cudaStream_t stream);

/* ---- pad.cu --------------------------------------------------------------- */

/* depth row-major matrices into the contiguous dst (depth x dst_rows x
 * dst_cols): dst[b][r][c] = src[b * src_batch + r * src_row + c] (element
 * strides) for r < rows, c < cols, and 0 elsewhere. Pads with zeros when dst
 * is larger, crops when dst_cols < src_row. Raw bits of `itemsize` (2 or 4)
 * bytes; requires rows <= dst_rows, cols <= dst_cols and both pointers
 * aligned to the element size. */
cudaError_t cl_pad_matrices(void *dst, int64_t dst_rows, int64_t dst_cols, const void *src,
                            int64_t src_batch, int64_t src_row, int64_t rows, int64_t cols,
                            int64_t depth, size_t itemsize, cudaStream_t stream);

/* ---- softmax.cu ---------------------------------------------------------- */

/* softmax (log = 0) or log_softmax (log = 1) along one axis of a float array
 * (float16, bfloat16, float32, float64; src and dst of that one dtype). Row
 * (o, i) is the `len` elements src[o * src_outer + r * src_len + i * src_inner],
 * r = 0 .. len-1 (element strides, any sign), written to dst through the dst_*
 * strides the same way. Numerically stable (the row maximum is subtracted);
 * float16/bfloat16 accumulate in float32. A row holding +inf or NaN, or only
 * -inf, gives NaN, as PyTorch does. dst may be exactly src (same pointer and
 * strides: each row is read in full before it is written); any other overlap
 * is the caller's to avoid. Unit len strides take the row kernels (a warp per
 * row up to 1024 elements, else a block per row; 16-byte vector loads when
 * every row is aligned); other layouts take the column kernel, which
 * coalesces when the inner strides are 1. */
typedef struct cl_softmax_desc {
    int log;
    cl_dtype dtype;
    const void *src;
    void *dst;
    int64_t outer, inner, len;
    int64_t src_outer, src_inner, src_len;
    int64_t dst_outer, dst_inner, dst_len;
} cl_softmax_desc;

cudaError_t cl_softmax(const cl_softmax_desc *desc, cudaStream_t stream);

/* ---- cross_entropy.cu ----------------------------------------------------- */

/* Fused softmax cross-entropy over the rows of an N x C matrix of logits
 * (float16, bfloat16 or float32; row r at logits + r * logits_ld elements,
 * unit column stride), with class indices `labels` (int32 or int64, row r at
 * labels + r * labels_stride). Per row, in float32 with the row maximum
 * subtracted: loss = log(sum(exp(x))) - x[label]. A label equal to
 * ignore_index (when has_ignore) gives loss 0 and a zero gradient row and is
 * left out of the mean; any other label outside [0, C) gives NaN for the
 * row's loss and gradient (nothing out of bounds is read).
 *
 * The per-row losses go to `losses` (rows float32, losses_stride elements
 * apart). MEAN and SUM
 * also write their deterministic single-block reduction to *total (MEAN
 * divides by the rows not ignored: 0 of them gives NaN). With `grad` (rows x
 * C of dtype, row r at grad + r * grad_ld; may be exactly `logits`),
 * grad = (softmax(x) - onehot(label)) * g * (*loss_scale when not NULL), g
 * being 1 / (rows not ignored) for MEAN and 1 otherwise. `count` is 1 float32
 * of scratch, used for MEAN with grad and has_ignore. One read of each row
 * for the loss and the gradient (a warp per row up to 1024 classes, else a
 * block per row). No atomics: results are bit-identical run to run. */
typedef enum cl_loss_reduction {
    CL_LOSS_NONE = 0,
    CL_LOSS_MEAN,
    CL_LOSS_SUM,
} cl_loss_reduction;

typedef struct cl_cross_entropy_desc {
    cl_dtype dtype;       /* logits and grad */
    cl_dtype label_dtype; /* CL_INT32 or CL_INT64 */
    cl_loss_reduction reduction;
    const void *logits;
    const void *labels;
    void *grad;              /* NULL: the loss only */
    float *losses;           /* rows, losses_stride elements apart */
    float *total;            /* MEAN, SUM: 1 element; NULL for NONE */
    float *count;            /* scratch: 1 element */
    const float *loss_scale; /* NULL or 1 element */
    int64_t rows, cols;
    int64_t logits_ld, grad_ld, labels_stride, losses_stride; /* elements */
    int64_t ignore_index;
    int has_ignore;
} cl_cross_entropy_desc;

cudaError_t cl_cross_entropy(const cl_cross_entropy_desc *desc, cudaStream_t stream);

/* ---- random.cu ----------------------------------------------------------- */

/* Counter-based Philox4x32-10 streams (described in random.cu). Element
 * group g of a call uses counter (g_lo, g_hi, offset_lo, offset_hi) and key
 * (key_lo, key_hi), so results depend only on (key, offset, index), never on
 * the grid. `out` is a contiguous, 16-byte aligned buffer of n elements of
 * `dtype` (a pool allocation is); n < 0, a misaligned `out` or a dtype of the
 * wrong kind gives cudaErrorInvalidValue. */
/* float16/bfloat16/float32/float64: mean + std * N(0, 1) (Box-Muller). */
cudaError_t cl_random_normal(void *out, cl_dtype dtype, int64_t n, double mean, double std,
                             uint64_t key, uint64_t offset, cudaStream_t stream);
/* float types: uniform in [low, high); low and high must be exactly
 * representable in dtype and low < high. */
cudaError_t cl_random_uniform(void *out, cl_dtype dtype, int64_t n, double low, double high,
                              uint64_t key, uint64_t offset, cudaStream_t stream);
/* int8/uint8/int32/int64: low + k with k uniform in [0, span] (inclusive;
 * span = high - 1 - low as an unsigned 64-bit number), unbiased (Lemire's
 * multiply-shift with rejection). */
cudaError_t cl_random_integers(void *out, cl_dtype dtype, int64_t n, int64_t low, uint64_t span,
                               uint64_t key, uint64_t offset, cudaStream_t stream);
/* One Philox4x32-10 block in a one-thread kernel, for known-answer tests:
 * out (device, 4 words) = philox(counter, key). */
cudaError_t cl_philox4x32_10(uint32_t *out, const uint32_t counter[4], const uint32_t key[2],
                             cudaStream_t stream);

/* ---- multi_tensor.cu: fused kernels for mixed-precision training ---------- */

/* One tensor of a multi-tensor call: a contiguous array of `numel` elements
 * per role (each launcher lists its roles; unused roles may be NULL). Any
 * number of tensors goes into one or a few launches; tensors with numel 0
 * are skipped. Arrays of one tensor must not overlap each other. */
#define CL_MT_ROLES 4
typedef struct cl_mt_tensor {
    void *data[CL_MT_ROLES];
    int64_t numel;
} cl_mt_tensor;

/* Role 0: a grad of `dtype` (float16, bfloat16, float32). Every element g
 * becomes g * *inv_scale (float32 arithmetic); *found_inf is set to 1.0 when
 * any element was inf or NaN before scaling, and is never cleared here. */
cudaError_t cl_mt_unscale(const cl_mt_tensor *tensors, int n, cl_dtype dtype,
                          const float *inv_scale, float *found_inf, cudaStream_t stream);

/* One thread, PyTorch's dynamic loss-scale rule: if *found_inf != 0, scale
 * *= backoff_factor and tracker = 0; else tracker + 1 reaching growth_interval
 * multiplies scale by growth_factor (unless that overflows float32) and
 * resets tracker to 0, otherwise tracker is incremented. */
cudaError_t cl_amp_update_scale(float *scale, int32_t *growth_tracker, const float *found_inf,
                                double growth_factor, double backoff_factor,
                                int32_t growth_interval, cudaStream_t stream);

/* Device scalars shared by the optimizers (NULL: absent): found_inf
 * (nonzero: the launch changes nothing), grad_scale (grads are divided by
 * it) and lr_device (the learning rate, read on the device instead of lr). */
typedef struct cl_sgd_args {
    double lr, momentum, dampening, weight_decay;
    int nesterov, first_step;
    const float *found_inf, *grad_scale, *lr_device;
} cl_sgd_args;

/* Roles: 0 param (float32), 1 grad (grad_dtype: float16, bfloat16, float32),
 * 2 momentum buffer (float32; unused when momentum == 0; written, not read,
 * on the first step). torch.optim.SGD's rule in float32. */
cudaError_t cl_mt_sgd(const cl_mt_tensor *tensors, int n, cl_dtype grad_dtype,
                      const cl_sgd_args *args, cudaStream_t stream);

typedef struct cl_adamw_args {
    double lr, beta1, beta2, eps, weight_decay;
    const float *found_inf, *grad_scale, *lr_device;
    void *step;         /* one element, float32 or int32: incremented unless skipped */
    cl_dtype step_dtype;
} cl_adamw_args;

/* Roles: 0 param, 1 grad (grad_dtype), 2 exp_avg, 3 exp_avg_sq (float32).
 * A one-thread kernel first adds 1 to *step (unless *found_inf != 0), then
 * torch.optim.AdamW's rule runs with the new step for bias corrections. */
cudaError_t cl_mt_adamw(const cl_mt_tensor *tensors, int n, cl_dtype grad_dtype,
                        const cl_adamw_args *args, cudaStream_t stream);

/* ---- conv.cu ---------------------------------------------------------------- */

/* One NHWC convolution or pooling window: input (n, h, w, c), output (n, oh,
 * ow, ...), a kh x kw window with square stride and symmetric zero padding.
 * k_padded (im2col only) is the output row length, >= kh * kw * c. */
typedef struct cl_conv_geometry {
    int n, h, w, c;
    int oh, ow;
    int kh, kw, stride, padding;
    int k_padded;
} cl_conv_geometry;

/* dst (n*oh*ow, k_padded) = the im2col matrix of contiguous NHWC src: row
 * (n, oh, ow), columns (ky, kx, c), zeros over the padding and past K.
 * dst_dtype == src_dtype, or src float32 and dst any float type (cast on
 * store). Floating types only. */
cudaError_t cl_im2col(void *dst, cl_dtype dst_dtype, const void *src, cl_dtype src_dtype,
                      const cl_conv_geometry *g, cudaStream_t stream);
/* dst (n, oh, ow, c) = max over each kh x kw window of contiguous NHWC src. */
cudaError_t cl_max_pool_nhwc(void *dst, const void *src, cl_dtype dtype,
                             const cl_conv_geometry *g, cudaStream_t stream);
/* dst (pixels, c_padded) = src (pixels, c) cast to dst_dtype, zeros in the
 * channels c..c_padded-1 (c_padded <= 64): images widened to whole vectors
 * for the implicit-GEMM stem. src float32 or dst_dtype; floating types. */
cudaError_t cl_pad_channels(void *dst, cl_dtype dst_dtype, const void *src, cl_dtype src_dtype,
                            int64_t pixels, int c, int c_padded, cudaStream_t stream);
/* dst (n, c) = mean over the hw pixels of contiguous src (n, hw, c). */
cudaError_t cl_avg_pool_nhwc(void *dst, const void *src, cl_dtype dtype, int64_t n, int64_t hw,
                             int64_t c, cudaStream_t stream);

/* ---- ops/implicit: implicit-GEMM convolution (CUTLASS, SM80 and newer) ------ */

/* What the epilogue adds to the convolution before the optional ReLU: nothing,
 * a bias vector (cout,), or a residual tensor shaped like the output. */
typedef enum cl_conv_epilogue {
    CL_CONV_EPILOGUE_NONE,
    CL_CONV_EPILOGUE_BIAS,
    CL_CONV_EPILOGUE_RESIDUAL
} cl_conv_epilogue;

/* One convolution: contiguous NHWC x (n, h, w, c), KRSC weights (cout, kh, kw,
 * c), NHWC out (n, oh, ow, cout), all of `dtype`: float16 or bfloat16
 * (float32 accumulation) or float32 (TF32 tensor cores). g.k_padded is not
 * used. c and cout must be multiples of cl_conv_implicit_alignment(dtype). */
typedef struct cl_conv_implicit_desc {
    cl_dtype dtype;
    cl_conv_geometry g;
    int cout;
    cl_conv_epilogue epilogue;
    int relu;
} cl_conv_implicit_desc;

typedef struct cl_conv_implicit cl_conv_implicit;

/* Tile shapes built for a dtype: 0 when this build has no implicit-GEMM
 * kernels (no SM80+ architecture in its list) or none for the dtype. */
int cl_conv_implicit_tiles(cl_dtype dtype);
const char *cl_conv_implicit_tile_name(cl_dtype dtype, int tile);
/* Elements per 16-byte vector: what c and cout must be multiples of, except
 * that c may be exactly CL_CONV_FIXED_CHANNELS (the widened RGB of a stem),
 * which one tile shape of each dtype serves. */
int cl_conv_implicit_alignment(cl_dtype dtype);
#define CL_CONV_FIXED_CHANNELS 4
/* Prepares one convolution for the current device with tile shape `tile`
 * (-1: chosen by cout). cudaErrorNotSupported when the device is older than
 * SM80, the build has no kernels, or the kernel cannot do this shape;
 * cudaErrorInvalidValue for a bad descriptor. Host work only. */
cudaError_t cl_conv_implicit_create(cl_conv_implicit **out, const cl_conv_implicit_desc *d,
                                    int tile);
/* One launch on `stream`: out = relu?(conv(x, w) + c), c as the epilogue says
 * (NULL for none). Every pointer 16-byte aligned (else
 * cudaErrorMisalignedAddress). Safe to call from several threads at once. */
cudaError_t cl_conv_implicit_run(const cl_conv_implicit *op, void *out, const void *x,
                                 const void *w, const void *c, cudaStream_t stream);
void cl_conv_implicit_destroy(cl_conv_implicit *op);

/* ---- timing.cu ------------------------------------------------------------ */
/* One thread spins `cycles` SM clock cycles (clock64); cycles >= 0. */
cudaError_t cl_spin(long long cycles, cudaStream_t stream);
/* A kernel that does nothing: for launch-latency measurements. */
cudaError_t cl_empty_kernel(cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* CUDALAB_KERNELS_H */
