/* Private to ops/matmul.c, ops/matmul_plan.c and ops/linear.c.
 *
 *   matmul.c       the entry points: validate the arguments, lay the product
 *                  out for cuBLAS (operation flags, leading dimensions,
 *                  batch strides), run it, copy back
 *   matmul_plan.c  per-thread cuBLAS / cuBLASLt handles and workspaces, the
 *                  plan cache (cuBLASLt descriptors and heuristic choice),
 *                  and the GEMM call itself
 *   linear.c       the nn Linear layer's GEMMs: plans with a fused epilogue
 *   conv.c         convolution as GEMM and the network forward (owned plans)
 */
#ifndef CUDALAB_OPS_MATMUL_H
#define CUDALAB_OPS_MATMUL_H

#include "core/core.h"

#include <cublasLt.h>
#include <cublas_v2.h>

/* Raise CublasError for a failed cuBLAS/cuBLASLt status. Returns -1. */
int cl_raise_cublas(cl_state *st, cublasStatus_t status, const char *expr, const char *file,
                    int line);

/* Every cuBLAS/cuBLASLt status goes through this: on failure it raises
 * CublasError (code, name, expression, file, line) and jumps to `fail`. */
#define CL_CUBLAS_CHECK(st, expr)                                                 \
    do {                                                                          \
        cublasStatus_t cl_status_ = (expr);                                       \
        if (cl_status_ != CUBLAS_STATUS_SUCCESS) {                                \
            cl_raise_cublas((st), cl_status_, #expr, __FILE__, __LINE__);         \
            goto fail;                                                            \
        }                                                                         \
    } while (0)

/* One GEMM problem in cuBLAS's column-major terms: C (m x n) = op(X) op(Y),
 * batched with constant strides. It is also the plan cache's key (compared
 * with memcmp: zero it before filling). */
typedef struct cl_mm_key {
    int device;
    int dtype;
    int compute;          /* cublasComputeType_t */
    int lt;               /* try cuBLASLt first */
    int opx, opy;         /* cublasOperation_t of X (our b) and Y (our a) */
    int64_t m, n, k;
    int64_t ldx, ldy, ldc;
    int64_t batch;
    int64_t sx, sy, sc;   /* batch strides in elements */
    uint32_t align_x, align_y, align_c;
    /* Fused epilogue (all zero for a plain product). The bias and aux
     * pointers are given per call (cl_mm_args); the plan knows only their
     * alignments, 0 when the epilogue does not use them. A plan with an
     * epilogue never falls back to cuBLAS, which has none. */
    int epilogue;         /* cublasLtEpilogue_t; 0: CUBLASLT_EPILOGUE_DEFAULT */
    int64_t aux_ld;       /* EPILOGUE_AUX_LD: elements, bits for a ReLU mask */
    uint32_t align_bias, align_aux;
    int out_f32;          /* C and D float32 with half X and Y (float32 accumulate) */
} cl_mm_key;

/* Per-call extras of a product: the epilogue's pointers and beta. */
typedef struct cl_mm_args {
    const void *bias;     /* BIAS_POINTER: a bias read, or a bias gradient written */
    const void *aux;      /* EPILOGUE_AUX_POINTER: written (forward) or read (backward) */
    bool accumulate;      /* beta = 1: C += X Y instead of C = X Y */
} cl_mm_args;

/* What running a key needs: this thread's handle on the device and the plan. */
typedef struct cl_mm_exec {
    struct mm_handle *handle;
    struct mm_plan *plan;
} cl_mm_exec;

/* Release the handles and workspaces of threads that ended. GIL held, the
 * op's device current. */
void cl_mm_drain_graveyard(cl_state *st);
/* This thread's handle for key->device (current), ready for work on
 * `stream`, and the plan for `key` (cached, or made now). */
int cl_mm_prepare(cl_state *st, const cl_mm_key *key, cudaStream_t stream, cl_mm_exec *ex);
/* One (strided-batched) product with the plan's shape: X, Y, C pointers. */
int cl_mm_run(cl_state *st, const cl_mm_exec *ex, const void *x, const void *y, void *c);
/* The same with an epilogue's pointers and beta (`args` NULL: none, beta 0). */
int cl_mm_run_args(cl_state *st, const cl_mm_exec *ex, const void *x, const void *y, void *c,
                   const cl_mm_args *args);
/* A plan the caller owns (not in the per-thread cache), with this thread's
 * handle for `stream` in ex->handle. Free it with cl_mm_plan_free. */
int cl_mm_plan_new(cl_state *st, const cl_mm_key *key, cudaStream_t stream, cl_mm_exec *ex);
void cl_mm_plan_free(struct mm_plan *plan);
/* This thread's handle for `device` (current), ready for work on `stream`
 * (ex->plan untouched): to run an owned plan from another call. */
int cl_mm_bind(cl_state *st, int device, cudaStream_t stream, cl_mm_exec *ex);
/* Whether the prepared plan runs on cuBLASLt (false: cuBLAS fallback, which
 * a plan with an epilogue cannot use). */
bool cl_mm_uses_lt(const cl_mm_exec *ex);

/* ---- shared with linear.c (defined in matmul.c) ---- */

/* The largest power of two dividing `value` (a pointer or a byte count),
 * at most 256; 256 for 0. */
uint32_t cl_mm_alignment_of(uint64_t value);
/* 'highest' -> 0, 'high' -> 1 (TypeError / ValueError naming func/param). */
int cl_mm_parse_precision(PyObject *obj, const char *func, const char *param, int *out);
/* The process-wide float32 precision (set_float32_matmul_precision). */
int cl_mm_default_precision(void);
/* The cublasComputeType_t of a product in `dtype` under `precision`. */
cublasComputeType_t cl_mm_compute_type(cl_dtype dtype, int precision);

#endif /* CUDALAB_OPS_MATMUL_H */
