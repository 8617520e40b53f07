/* Private to ops/matmul.c and ops/matmul_plan.c.
 *
 *   matmul.c       the entry points: validate the arguments, lay the product
 *                  out for cuBLAS (operation flags, leading dimensions,
 *                  batch strides), run it, copy back
 *   matmul_plan.c  per-thread cuBLAS / cuBLASLt handles and workspaces, the
 *                  plan cache (cuBLASLt descriptors and heuristic choice),
 *                  and the GEMM call itself
 */
#ifndef CUDALAB_OPS_MATMUL_H
#define CUDALAB_OPS_MATMUL_H

#include "cudalab.h"

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
} cl_mm_key;

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

#endif /* CUDALAB_OPS_MATMUL_H */
