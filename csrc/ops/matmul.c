/* matmul through cuBLASLt (main path) and cuBLAS (fallback, and float64).
 *
 *   matmul(a, b, out=None, precision=None), a @ b
 *   set_float32_matmul_precision("highest" | "high"), get_float32_matmul_precision()
 *
 * Semantics follow np.matmul: the last two axes are the matrices, the leading
 * axes are batch axes broadcast against each other; a 1-D first operand is a
 * row vector and a 1-D second operand a column vector, and the added axis is
 * dropped from the result (1-D @ 1-D gives a 0-d array). Supported dtypes:
 * float64, float32, float16, bfloat16; both operands must have the same one,
 * and the result has it too. float16/bfloat16 accumulate in float32 (split-K
 * reductions in the output type are excluded). float32 runs in true fp32
 * ("highest", the default) or TF32 ("high").
 *
 * Column-major mapping. cuBLAS is column-major; a row-major C (M x N) is a
 * column-major C^T (N x M), so we compute C^T = B^T A^T: cuBLAS's first
 * operand ("X") is our b, its second ("Y") our a, m = N, n = M, k = K. A
 * matrix operand of shape (R, C) with element strides (rs, cs) is passed
 * without any copy when it is
 *   row-major with a leading dimension: cs == 1, rs >= C  -> CUBLAS_OP_N, ld = rs
 *   column-major (e.g. x.T):            rs == 1, cs >= R  -> CUBLAS_OP_T, ld = cs
 * (axes of extent 1 impose nothing). Any other layout is first made
 * C-contiguous with cl_array_contiguous_copy.
 *
 * Batches. The output's batch axes of extent > 1 are split into an inner run
 * that every operand addresses with one constant stride (0 for a broadcast
 * operand) -- one strided-batched call -- and an outer rest, looped over in C
 * (at most MAX_OUTER_CALLS calls; beyond that the operands that cannot use one
 * stride are materialized C-contiguous at the full batch shape first).
 *
 * Handles. Each thread has its own cuBLAS and cuBLASLt handle per device,
 * created lazily (pthread key), plus a 32 MiB workspace allocated from our
 * stream-ordered pool when the handle is made and kept for its lifetime, so a
 * matmul never allocates anything but its output and can be captured in a
 * CUDA graph. (It shows in memory_stats() as one allocation per thread and
 * device.) The same workspace serves cublasLtMatmul and the cuBLAS fallback
 * (cublasSetWorkspace). When a thread ends, its handles go to a graveyard
 * list that the next matmul call (holding the GIL) releases. If a handle is
 * used on a different stream than last time, the new stream first waits for
 * the old one, since the workspace is shared.
 *
 * Plans. cublasLtMatmulAlgoGetHeuristic's choice is cached per thread with the
 * Lt descriptors, keyed by (device, dtype, compute type, ops, m, n, k, leading
 * dimensions, batch count and strides, pointer alignments), in a small table
 * with round-robin eviction. When cuBLASLt offers no algorithm (or refuses
 * the chosen one), the plan falls back to cublasGemmStridedBatchedEx_64.
 * float64 goes to cublasGemmStridedBatchedEx_64 directly (see use_lt): that
 * is the library path torch.mm takes for doubles; the private
 * _set_matmul_backend(dtype, 'lt'|'cublas') switches a dtype for benchmarks.
 *
 * Every cuBLAS/cuBLASLt status goes through CL_CUBLAS_CHECK, which raises
 * CublasError (code, name, expression, file, line) and jumps to `fail`. */
#include "cudalab.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include <cublasLt.h>
#include <cublas_v2.h>

#define WORKSPACE_BYTES ((size_t)32 << 20)
#define PLAN_CACHE_SIZE 32
#define MAX_OUTER_CALLS 16

/* Whether dtype's main path is cuBLASLt (1) or cublasGemmStridedBatchedEx (0).
 * Process-wide; _set_matmul_backend (private, for benchmarks) changes it. */
static _Atomic int use_lt[CL_NUM_DTYPES] = {
    [CL_FLOAT16] = 1, [CL_BFLOAT16] = 1, [CL_FLOAT32] = 1, [CL_FLOAT64] = 0,
};

enum { PREC_HIGHEST = 0, PREC_HIGH = 1 };
static const char *const precision_names[] = {"highest", "high"};

/* Process-wide, like torch.set_float32_matmul_precision. */
static _Atomic int float32_precision = PREC_HIGHEST;

/* ---- errors ------------------------------------------------------------------ */

static int
raise_cublas(cl_state *st, cublasStatus_t status, const char *expr, const char *file, int line)
{
    return cl_raise_status(st->CublasError, (int)status, cublasGetStatusName(status),
                           cublasGetStatusString(status), expr, file, line);
}

#define CL_CUBLAS_CHECK(st, expr)                                                 \
    do {                                                                          \
        cublasStatus_t cl_status_ = (expr);                                       \
        if (cl_status_ != CUBLAS_STATUS_SUCCESS) {                                \
            raise_cublas((st), cl_status_, #expr, __FILE__, __LINE__);            \
            goto fail;                                                            \
        }                                                                         \
    } while (0)

/* ---- per-thread, per-device handles and plans ---------------------------------- */

typedef struct mm_key {
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
} mm_key;

typedef struct mm_plan {
    bool used;
    bool use_lt;
    mm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lx, ly, lc;
    cublasLtMatmulAlgo_t algo;
} mm_plan;

typedef struct blas_handle {
    bool ready;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *workspace;
    cudaStream_t stream;     /* the stream the handle (and workspace) was last used on */
    bool blas_stream_set;    /* cublasSetStream(blas, stream) done */
    cudaEvent_t switch_event;
} blas_handle;

typedef struct blas_thread {
    blas_handle dev[CL_MAX_DEVICES];
    mm_plan plans[PLAN_CACHE_SIZE];
    int next_victim;
    struct blas_thread *next; /* graveyard link */
} blas_thread;

static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;
static int thread_key_error = 0;
static pthread_mutex_t graveyard_lock = PTHREAD_MUTEX_INITIALIZER;
static blas_thread *graveyard = NULL;
static _Atomic int graveyard_nonempty = 0;

static void
plan_release(mm_plan *p)
{
    if (p->used && p->use_lt) {
        (void)cublasLtMatrixLayoutDestroy(p->lx);
        (void)cublasLtMatrixLayoutDestroy(p->ly);
        (void)cublasLtMatrixLayoutDestroy(p->lc);
        (void)cublasLtMatmulDescDestroy(p->desc);
    }
    p->used = false;
    p->use_lt = false;
}

/* Thread exit (no GIL here, maybe no Python thread state): free the host-side
 * plans, and hand the device resources to the graveyard. */
static void
thread_state_exit(void *ptr)
{
    blas_thread *t = ptr;
    bool any_device = false;
    for (int i = 0; i < PLAN_CACHE_SIZE; i++) {
        plan_release(&t->plans[i]);
    }
    for (int d = 0; d < CL_MAX_DEVICES; d++) {
        any_device = any_device || t->dev[d].ready;
    }
    if (!any_device) {
        free(t);
        return;
    }
    pthread_mutex_lock(&graveyard_lock);
    t->next = graveyard;
    graveyard = t;
    atomic_store(&graveyard_nonempty, 1);
    pthread_mutex_unlock(&graveyard_lock);
}

static void
make_thread_key(void)
{
    thread_key_error = pthread_key_create(&thread_key, thread_state_exit);
}

/* Release what ended threads left: their handles and workspaces. GIL held. */
static void
drain_graveyard(cl_state *st)
{
    if (!atomic_load(&graveyard_nonempty)) {
        return;
    }
    pthread_mutex_lock(&graveyard_lock);
    blas_thread *list = graveyard;
    graveyard = NULL;
    atomic_store(&graveyard_nonempty, 0);
    pthread_mutex_unlock(&graveyard_lock);
    while (list != NULL) {
        blas_thread *t = list;
        list = t->next;
        for (int d = 0; d < CL_MAX_DEVICES; d++) {
            blas_handle *h = &t->dev[d];
            if (!h->ready) {
                continue;
            }
            int previous = d;
            if (cudaGetDevice(&previous) == cudaSuccess && previous != d) {
                (void)cudaSetDevice(d);
            }
            (void)cublasLtDestroy(h->lt);
            (void)cublasDestroy(h->blas);
            if (h->switch_event != NULL) {
                (void)cudaEventDestroy(h->switch_event);
            }
            (void)cudaGetLastError();
            cl_device_exit(d, previous);
            /* The legacy default stream orders after every blocking stream,
             * so the dead thread's queued products finish first. */
            cl_free(st, d, h->workspace, WORKSPACE_BYTES, (cudaStream_t)0);
        }
        free(t);
    }
}

static blas_thread *
get_thread_state(void)
{
    if (pthread_once(&thread_key_once, make_thread_key) != 0 || thread_key_error != 0) {
        PyErr_SetString(PyExc_RuntimeError, "matmul(): could not create a thread-local key");
        return NULL;
    }
    blas_thread *t = pthread_getspecific(thread_key);
    if (t == NULL) {
        t = calloc(1, sizeof *t);
        if (t == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        if (pthread_setspecific(thread_key, t) != 0) {
            free(t);
            PyErr_SetString(PyExc_RuntimeError, "matmul(): could not set thread-local state");
            return NULL;
        }
    }
    return t;
}

/* Create the handles and workspace of `h` for `device` (which is current). */
static int
create_handle(cl_state *st, blas_handle *h, int device, cudaStream_t stream)
{
    cublasHandle_t blas = NULL;
    cublasLtHandle_t lt = NULL;
    void *ws = NULL;
    CL_CUBLAS_CHECK(st, cublasCreate(&blas));
    CL_CUBLAS_CHECK(st, cublasLtCreate(&lt));
    /* fp32 accumulation for half types in the fallback too. */
    CL_CUBLAS_CHECK(st, cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH |
                                                    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (cl_malloc(st, "matmul", device, WORKSPACE_BYTES, stream, &ws) < 0) {
        goto fail;
    }
    h->blas = blas;
    h->lt = lt;
    h->workspace = ws;
    h->stream = stream;
    h->blas_stream_set = false;
    h->switch_event = NULL;
    h->ready = true;
    return 0;
fail:
    if (lt != NULL) {
        (void)cublasLtDestroy(lt);
    }
    if (blas != NULL) {
        (void)cublasDestroy(blas);
    }
    return -1;
}

/* This thread's handles for `device` (which must be current), ready for work
 * on `stream`. */
static blas_handle *
get_handle(cl_state *st, blas_thread *t, int device, cudaStream_t stream)
{
    blas_handle *h = &t->dev[device];
    if (!h->ready) {
        return create_handle(st, h, device, stream) < 0 ? NULL : h;
    }
    if (h->stream != stream) {
        /* The workspace was last used on another stream: order after it.
         * (A stream being captured into a graph cannot wait on an event
         * recorded outside the capture; capture after warming up on it.) */
        enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        CL_CUDA_CHECK(st, cudaStreamIsCapturing(stream, &capture));
        if (capture == cudaStreamCaptureStatusNone) {
            if (h->switch_event == NULL) {
                CL_CUDA_CHECK(st, cudaEventCreateWithFlags(&h->switch_event,
                                                           cudaEventDisableTiming));
            }
            CL_CUDA_CHECK(st, cudaEventRecord(h->switch_event, h->stream));
            CL_CUDA_CHECK(st, cudaStreamWaitEvent(stream, h->switch_event, 0));
        }
        h->stream = stream;
        h->blas_stream_set = false;
    }
    return h;
fail:
    return NULL;
}

/* The cuBLAS (non-Lt) handle on the handle's stream, with our workspace.
 * cublasSetStream resets the workspace, so both are set together. */
static int
prepare_blas(cl_state *st, blas_handle *h)
{
    if (!h->blas_stream_set) {
        CL_CUBLAS_CHECK(st, cublasSetStream(h->blas, h->stream));
        CL_CUBLAS_CHECK(st, cublasSetWorkspace(h->blas, h->workspace, WORKSPACE_BYTES));
        h->blas_stream_set = true;
    }
    return 0;
fail:
    return -1;
}

/* ---- dtypes and compute types ---------------------------------------------------- */

static cudaDataType
cuda_type(cl_dtype dtype)
{
    switch (dtype) {
    case CL_FLOAT16:
        return CUDA_R_16F;
    case CL_BFLOAT16:
        return CUDA_R_16BF;
    case CL_FLOAT64:
        return CUDA_R_64F;
    default:
        return CUDA_R_32F;
    }
}

static cublasComputeType_t
compute_type(cl_dtype dtype, int precision)
{
    if (dtype == CL_FLOAT64) {
        return CUBLAS_COMPUTE_64F;
    }
    if (dtype == CL_FLOAT32 && precision == PREC_HIGH) {
        return CUBLAS_COMPUTE_32F_FAST_TF32;
    }
    return CUBLAS_COMPUTE_32F;
}

static bool
is_matmul_dtype(cl_dtype dtype)
{
    return dtype == CL_FLOAT16 || dtype == CL_BFLOAT16 || dtype == CL_FLOAT32 ||
           dtype == CL_FLOAT64;
}

/* ---- plans ------------------------------------------------------------------------- */

static int
set_layout_batch(cl_state *st, cublasLtMatrixLayout_t layout, int64_t batch, int64_t stride)
{
    int32_t count = (int32_t)batch;
    CL_CUBLAS_CHECK(st, cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                         &count, sizeof count));
    CL_CUBLAS_CHECK(st, cublasLtMatrixLayoutSetAttribute(
                            layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                            sizeof stride));
    return 0;
fail:
    return -1;
}

/* Fill `p` for `key`: Lt descriptors and the heuristic's first algorithm, or
 * use_lt = false when cuBLASLt has none (or the dtype does not use it). */
static int
plan_create(cl_state *st, blas_handle *h, mm_plan *p, const mm_key *key)
{
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t lx = NULL, ly = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cl_dtype dtype = (cl_dtype)key->dtype;
    cudaDataType type = cuda_type(dtype);
    cudaDataType scale = dtype == CL_FLOAT64 ? CUDA_R_64F : CUDA_R_32F;

    p->used = true;
    p->use_lt = false;
    p->key = *key;
    if (!key->lt || key->batch > INT32_MAX) {
        return 0;
    }
    int32_t opx = key->opx, opy = key->opy;
    CL_CUBLAS_CHECK(st, cublasLtMatmulDescCreate(&desc, (cublasComputeType_t)key->compute, scale));
    CL_CUBLAS_CHECK(st, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opx,
                                                       sizeof opx));
    CL_CUBLAS_CHECK(st, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opy,
                                                       sizeof opy));
    /* Stored shapes: X is m x k (op N) or k x m (op T); Y is k x n or n x k. */
    bool xn = key->opx == CUBLAS_OP_N, yn = key->opy == CUBLAS_OP_N;
    CL_CUBLAS_CHECK(st, cublasLtMatrixLayoutCreate(&lx, type, (uint64_t)(xn ? key->m : key->k),
                                                   (uint64_t)(xn ? key->k : key->m), key->ldx));
    CL_CUBLAS_CHECK(st, cublasLtMatrixLayoutCreate(&ly, type, (uint64_t)(yn ? key->k : key->n),
                                                   (uint64_t)(yn ? key->n : key->k), key->ldy));
    CL_CUBLAS_CHECK(st, cublasLtMatrixLayoutCreate(&lc, type, (uint64_t)key->m,
                                                   (uint64_t)key->n, key->ldc));
    if (key->batch > 1) {
        if (set_layout_batch(st, lx, key->batch, key->sx) < 0 ||
            set_layout_batch(st, ly, key->batch, key->sy) < 0 ||
            set_layout_batch(st, lc, key->batch, key->sc) < 0) {
            goto fail;
        }
    }
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = WORKSPACE_BYTES;
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->align_x,
                            sizeof key->align_x));
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->align_y,
                            sizeof key->align_y));
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->align_c,
                            sizeof key->align_c));
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                            pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->align_c,
                            sizeof key->align_c));
    if (dtype == CL_FLOAT16 || dtype == CL_BFLOAT16) {
        /* Split-K partial sums stay in fp32: no reduction in the output type
         * (INPLACE reduces through the output buffer, hence its type too). */
        uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                                pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                sizeof mask));
    }
    cublasLtMatmulHeuristicResult_t result;
    int returned = 0;
    memset(&result, 0, sizeof result);
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(h->lt, desc, lx, ly, lc, lc, pref, 1,
                                                           &result, &returned);
    (void)cublasLtMatmulPreferenceDestroy(pref);
    pref = NULL;
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS &&
                                                  (returned == 0 ||
                                                   result.state != CUBLAS_STATUS_SUCCESS))) {
        goto no_lt;
    }
    CL_CUBLAS_CHECK(st, status);
    p->desc = desc;
    p->lx = lx;
    p->ly = ly;
    p->lc = lc;
    p->algo = result.algo;
    p->use_lt = true;
    return 0;
no_lt:
    (void)cublasLtMatrixLayoutDestroy(lx);
    (void)cublasLtMatrixLayoutDestroy(ly);
    (void)cublasLtMatrixLayoutDestroy(lc);
    (void)cublasLtMatmulDescDestroy(desc);
    return 0;
fail:
    if (pref != NULL) {
        (void)cublasLtMatmulPreferenceDestroy(pref);
    }
    if (lx != NULL) {
        (void)cublasLtMatrixLayoutDestroy(lx);
    }
    if (ly != NULL) {
        (void)cublasLtMatrixLayoutDestroy(ly);
    }
    if (lc != NULL) {
        (void)cublasLtMatrixLayoutDestroy(lc);
    }
    if (desc != NULL) {
        (void)cublasLtMatmulDescDestroy(desc);
    }
    p->used = false;
    return -1;
}

static mm_plan *
plan_get(cl_state *st, blas_thread *t, blas_handle *h, const mm_key *key)
{
    for (int i = 0; i < PLAN_CACHE_SIZE; i++) {
        mm_plan *p = &t->plans[i];
        if (p->used && memcmp(&p->key, key, sizeof *key) == 0) {
            return p;
        }
    }
    mm_plan *p = NULL;
    for (int i = 0; i < PLAN_CACHE_SIZE && p == NULL; i++) {
        if (!t->plans[i].used) {
            p = &t->plans[i];
        }
    }
    if (p == NULL) {
        p = &t->plans[t->next_victim];
        t->next_victim = (t->next_victim + 1) % PLAN_CACHE_SIZE;
        plan_release(p);
    }
    return plan_create(st, h, p, key) < 0 ? NULL : p;
}

/* One (strided-batched) product with the plan's shape. */
static int
plan_run(cl_state *st, blas_handle *h, mm_plan *p, const void *x, const void *y, void *c)
{
    const mm_key *k = &p->key;
    double alpha64 = 1.0, beta64 = 0.0;
    float alpha32 = 1.0f, beta32 = 0.0f;
    bool f64 = k->dtype == CL_FLOAT64;
    const void *alpha = f64 ? (const void *)&alpha64 : (const void *)&alpha32;
    const void *beta = f64 ? (const void *)&beta64 : (const void *)&beta32;
    if (p->use_lt) {
        cublasStatus_t status =
            cublasLtMatmul(h->lt, p->desc, alpha, x, p->lx, y, p->ly, beta, c, p->lc, c, p->lc,
                           &p->algo, h->workspace, WORKSPACE_BYTES, h->stream);
        if (status != CUBLAS_STATUS_NOT_SUPPORTED) {
            CL_CUBLAS_CHECK(st, status);
            return 0;
        }
        /* The algorithm refused this problem after all: use cuBLAS from now on. */
        plan_release(p);
        p->used = true;
    }
    cudaDataType type = cuda_type((cl_dtype)k->dtype);
    if (prepare_blas(st, h) < 0) {
        return -1;
    }
    CL_CUBLAS_CHECK(st, cublasGemmStridedBatchedEx_64(
                            h->blas, (cublasOperation_t)k->opx, (cublasOperation_t)k->opy, k->m,
                            k->n, k->k, alpha, x, type, k->ldx, k->sx, y, type, k->ldy, k->sy,
                            beta, c, type, k->ldc, k->sc, k->batch,
                            (cublasComputeType_t)k->compute, CUBLAS_GEMM_DEFAULT));
    return 0;
fail:
    return -1;
}

/* ---- operands ------------------------------------------------------------------------ */

/* A matmul operand as cuBLAS will see it: matrix rows x cols with element
 * strides, batch strides aligned to the output's batch axes. */
typedef struct operand {
    DeviceArray *arr;   /* strong reference (the argument or a copy) */
    bool vector;        /* was 1-D */
    int64_t rows, cols, rs, cs;
    int nbatch;         /* batch axes of arr */
} operand;

/* Read the matrix part of `o->arr`; `first` says whether it is the left
 * operand (a 1-D left operand is a row vector, a right one a column). */
static void
operand_load(operand *o, bool first)
{
    DeviceArray *a = o->arr;
    int64_t item = (int64_t)cl_itemsize(a->dtype);
    int nd = a->ndim;
    o->vector = nd == 1;
    if (nd == 1) {
        o->nbatch = 0;
        if (first) {
            o->rows = 1;
            o->cols = a->shape[0];
            o->rs = a->shape[0];
            o->cs = a->strides[0] / item;
        }
        else {
            o->rows = a->shape[0];
            o->cols = 1;
            o->rs = a->strides[0] / item;
            o->cs = 1;
        }
        return;
    }
    o->nbatch = nd - 2;
    o->rows = a->shape[nd - 2];
    o->cols = a->shape[nd - 1];
    o->rs = a->strides[nd - 2] / item;
    o->cs = a->strides[nd - 1] / item;
}

/* Can the matrix go to cuBLAS as is? Sets op (N: row-major, T: column-major
 * in cuBLAS's terms of our transposed problem) and the leading dimension. */
static bool
matrix_layout(const operand *o, cublasOperation_t *op, int64_t *ld)
{
    const DeviceArray *a = o->arr;
    int64_t item = (int64_t)cl_itemsize(a->dtype);
    for (int i = 0; i < a->ndim; i++) {
        if (a->strides[i] % item != 0) {
            return false;
        }
    }
    int64_t R = o->rows, C = o->cols;
    int64_t rld = R == 1 ? (C > 1 ? C : 1) : o->rs;
    if ((C == 1 || o->cs == 1) && rld >= (C > 1 ? C : 1)) {
        *op = CUBLAS_OP_N;
        *ld = rld;
        return true;
    }
    int64_t cld = C == 1 ? (R > 1 ? R : 1) : o->cs;
    if ((R == 1 || o->rs == 1) && cld >= (R > 1 ? R : 1)) {
        *op = CUBLAS_OP_T;
        *ld = cld;
        return true;
    }
    return false;
}

/* Element strides of `o` along the output's `nb` batch axes (0 where the
 * operand has no such axis or broadcasts it). */
static void
batch_strides(const operand *o, int nb, const Py_ssize_t *bshape, int64_t *out)
{
    const DeviceArray *a = o->arr;
    int64_t item = (int64_t)cl_itemsize(a->dtype);
    for (int i = 0; i < nb; i++) {
        int j = i - (nb - o->nbatch); /* operand axis aligned to output axis i */
        out[i] = (j >= 0 && a->shape[j] == bshape[i] && bshape[i] > 1) ? a->strides[j] / item
                                                                         : 0;
    }
}

static uint32_t
alignment_of(uint64_t value)
{
    if (value == 0) {
        return 256;
    }
    uint64_t a = value & (~value + 1);
    return a > 256 ? 256 : (uint32_t)a;
}

static uint32_t
min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

/* Do a and b's memory ranges touch `out`'s? */
static bool
ranges_overlap(const DeviceArray *x, const DeviceArray *y)
{
    if (cl_array_size(x) == 0 || cl_array_size(y) == 0 || x->device != y->device) {
        return false;
    }
    uintptr_t x0 = (uintptr_t)x->data, y0 = (uintptr_t)y->data;
    uintptr_t x1 = x0 + cl_itemsize(x->dtype), y1 = y0 + cl_itemsize(y->dtype);
    for (int i = 0; i < x->ndim; i++) {
        x1 += (uintptr_t)(x->shape[i] - 1) * (uintptr_t)x->strides[i];
    }
    for (int i = 0; i < y->ndim; i++) {
        y1 += (uintptr_t)(y->shape[i] - 1) * (uintptr_t)y->strides[i];
    }
    return x0 < y1 && y0 < x1;
}

/* Replace o->arr with a C-contiguous copy (of a broadcast view at the full
 * batch shape when `bshape` is given). */
static int
operand_make_contiguous(cl_state *st, operand *o, int nb, const Py_ssize_t *bshape, bool first)
{
    DeviceArray *src = o->arr;
    DeviceArray *view = NULL;
    if (bshape != NULL) {
        /* shape: bshape + the operand's own matrix axes (1-D operands never
         * reach here: they have no batch axes to broadcast). */
        Py_ssize_t shape[CL_MAX_NDIM], strides[CL_MAX_NDIM];
        int64_t bs[CL_MAX_NDIM];
        batch_strides(o, nb, bshape, bs);
        int64_t item = (int64_t)cl_itemsize(src->dtype);
        for (int i = 0; i < nb; i++) {
            shape[i] = bshape[i];
            strides[i] = (Py_ssize_t)(bs[i] * item);
        }
        shape[nb] = src->shape[src->ndim - 2];
        shape[nb + 1] = src->shape[src->ndim - 1];
        strides[nb] = src->strides[src->ndim - 2];
        strides[nb + 1] = src->strides[src->ndim - 1];
        view = cl_array_view(st, src, src->data, nb + 2, shape, strides);
        if (view == NULL) {
            return -1;
        }
        src = view;
    }
    DeviceArray *copy = cl_array_contiguous_copy(st, "matmul", src, src->dtype);
    Py_XDECREF(view);
    if (copy == NULL) {
        return -1;
    }
    Py_SETREF(o->arr, copy);
    operand_load(o, first);
    return 0;
}

/* ---- argument checking ----------------------------------------------------------------- */

static int
parse_precision(PyObject *obj, const char *func, const char *param, int *out)
{
    if (!PyUnicode_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, param,
                            "expected 'highest' or 'high', got %.100s", Py_TYPE(obj)->tp_name);
    }
    for (int i = 0; i < 2; i++) {
        if (PyUnicode_CompareWithASCIIString(obj, precision_names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return cl_arg_error(PyExc_ValueError, func, param, "expected 'highest' or 'high', got %R",
                        obj);
}

/* Raise with the two shapes in the message: "<detail>: 'a' has shape (..)
 * and 'b' has shape (..)". */
static int
shape_error(const char *func, const char *param, const char *detail, const DeviceArray *a,
            const DeviceArray *b)
{
    PyObject *sa = cl_shape_tuple(a->ndim, a->shape);
    PyObject *sb = cl_shape_tuple(b->ndim, b->shape);
    if (sa != NULL && sb != NULL) {
        cl_arg_error(PyExc_ValueError, func, param, "%s: 'a' has shape %R and 'b' has shape %R",
                     detail, sa, sb);
    }
    Py_XDECREF(sa);
    Py_XDECREF(sb);
    return -1;
}

static int
check_operand(PyObject *obj, cl_state *st, const char *func, const char *param)
{
    if (!CL_IS_DEVICEARRAY(st, obj)) {
        return cl_arg_error(PyExc_TypeError, func, param, "expected a cudalab.DeviceArray, got %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    DeviceArray *a = (DeviceArray *)obj;
    if (!is_matmul_dtype(a->dtype)) {
        return cl_arg_error(PyExc_TypeError, func, param,
                            "unsupported dtype %s (matmul supports float16, bfloat16, float32 "
                            "and float64)", cl_dtype_name(a->dtype));
    }
    if (a->ndim == 0) {
        return cl_arg_error(PyExc_ValueError, func, param,
                            "a 0-d array has no matrix dimensions (use multiply for scalars)");
    }
    return 0;
}

/* ---- the product ----------------------------------------------------------------------- */

/* The profiler's record of one product (result NULL: it failed). Bytes: a, b
 * and the result once each; FLOPs: 2 M N K per matrix product. */
static inline void
profile_matmul(cl_state *st, cl_prof_scope *ps, const DeviceArray *a, const DeviceArray *b,
               const DeviceArray *result, cl_dtype dtype, int64_t M, int64_t N, int64_t K,
               int nb, const Py_ssize_t *bshape, int rnd, const Py_ssize_t *rshape)
{
    if (!CL_PROF_ACTIVE(ps)) {
        return;
    }
    int64_t batch = 1;
    for (int i = 0; i < nb; i++) {
        batch *= bshape[i];
    }
    cl_prof_info info = {
        .dtype = (int)dtype,
        .bytes = cl_prof_nbytes(a) + cl_prof_nbytes(b) + (result ? cl_prof_nbytes(result) : 0),
        .flops = 2 * M * N * K * batch,
        .ninputs = 2,
        .inputs = {a, b},
        .out_ndim = rnd,
        .out_shape = rshape,
    };
    cl_prof_end_slow(st, ps, result != NULL ? &info : NULL);
}

static PyObject *
do_matmul(cl_state *st, const char *func, PyObject *a_obj, PyObject *b_obj, PyObject *out_obj,
          PyObject *precision_obj)
{
    /* The scalar option first, so it is checked even without arrays (CPU tier). */
    int precision = atomic_load(&float32_precision);
    if (precision_obj != NULL && precision_obj != Py_None &&
        parse_precision(precision_obj, func, "precision", &precision) < 0) {
        return NULL;
    }
    if (check_operand(a_obj, st, func, "a") < 0 || check_operand(b_obj, st, func, "b") < 0) {
        return NULL;
    }
    DeviceArray *a = (DeviceArray *)a_obj, *b = (DeviceArray *)b_obj;
    if (a->dtype != b->dtype) {
        return cl_arg_error(PyExc_TypeError, func, "b",
                            "dtype %s differs from 'a''s dtype %s (convert one with astype())",
                            cl_dtype_name(b->dtype), cl_dtype_name(a->dtype)), NULL;
    }
    if (a->device != b->device) {
        return cl_arg_error(PyExc_ValueError, func, "b", "is on device %d but 'a' is on device %d",
                            b->device, a->device), NULL;
    }
    cl_dtype dtype = a->dtype;

    /* Shapes: contracted axis, batch broadcast, result shape. */
    operand oa = {.arr = a}, ob = {.arr = b};
    operand_load(&oa, true);
    operand_load(&ob, false);
    int64_t M = oa.rows, K = oa.cols, N = ob.cols;
    if (ob.rows != K) {
        char detail[160];
        snprintf(detail, sizeof detail,
                 "the contracted dimensions differ (%lld in 'a', %lld in 'b')", (long long)K,
                 (long long)ob.rows);
        return shape_error(func, "b", detail, a, b), NULL;
    }
    int nb = oa.nbatch > ob.nbatch ? oa.nbatch : ob.nbatch;
    Py_ssize_t bshape[CL_MAX_NDIM];
    for (int i = 0; i < nb; i++) {
        int ia = i - (nb - oa.nbatch), ib = i - (nb - ob.nbatch);
        Py_ssize_t ea = ia >= 0 ? a->shape[ia] : 1, eb = ib >= 0 ? b->shape[ib] : 1;
        if (ea != eb && ea != 1 && eb != 1) {
            return shape_error(func, "b", "the batch dimensions cannot be broadcast together", a,
                               b), NULL;
        }
        bshape[i] = ea == 1 ? eb : ea;
    }
    Py_ssize_t rshape[CL_MAX_NDIM];
    int rnd = 0;
    for (int i = 0; i < nb; i++) {
        rshape[rnd++] = bshape[i];
    }
    if (!oa.vector) {
        rshape[rnd++] = (Py_ssize_t)M;
    }
    if (!ob.vector) {
        rshape[rnd++] = (Py_ssize_t)N;
    }

    DeviceArray *out = NULL;
    if (out_obj != NULL && out_obj != Py_None) {
        if (!CL_IS_DEVICEARRAY(st, out_obj)) {
            return cl_arg_error(PyExc_TypeError, func, "out",
                                "expected a cudalab.DeviceArray or None, got %.100s",
                                Py_TYPE(out_obj)->tp_name), NULL;
        }
        out = (DeviceArray *)out_obj;
        if (out->dtype != dtype) {
            return cl_arg_error(PyExc_TypeError, func, "out",
                                "dtype %s differs from the result's dtype %s",
                                cl_dtype_name(out->dtype), cl_dtype_name(dtype)), NULL;
        }
        bool same = out->ndim == rnd;
        for (int i = 0; same && i < rnd; i++) {
            same = out->shape[i] == rshape[i];
        }
        if (!same) {
            PyObject *want = cl_shape_tuple(rnd, rshape), *got = cl_shape_tuple(out->ndim, out->shape);
            if (want != NULL && got != NULL) {
                cl_arg_error(PyExc_ValueError, func, "out",
                             "has shape %R but the result has shape %R", got, want);
            }
            Py_XDECREF(want);
            Py_XDECREF(got);
            return NULL;
        }
        if (!cl_is_c_contiguous(out)) {
            return cl_arg_error(PyExc_ValueError, func, "out", "must be C-contiguous"), NULL;
        }
        if (out->device != a->device) {
            return cl_arg_error(PyExc_ValueError, func, "out",
                                "is on device %d but the operands are on device %d",
                                out->device, a->device), NULL;
        }
    }
    if (cl_require_device(st, func) < 0) {
        return NULL;
    }

    /* From here on: GPU work on the operands' device. */
    int device = a->device, previous;
    DeviceArray *result = NULL; /* what we return (new reference) */
    DeviceArray *target = NULL; /* where the product is written */
    Py_INCREF(oa.arr);
    Py_INCREF(ob.arr);
    if (cl_device_enter(st, device, &previous) < 0) {
        Py_DECREF(oa.arr);
        Py_DECREF(ob.arr);
        return NULL;
    }
    drain_graveyard(st);
    cl_prof_scope ps;
    cl_prof_begin(st, &ps, func, device);
    cudaStream_t stream = cl_current_stream(st);
    cl_array_note_stream(oa.arr, stream); /* stream-safe frees (record_stream) */
    cl_array_note_stream(ob.arr, stream);
    if (out != NULL) cl_array_note_stream(out, stream);

    if (out != NULL) {
        result = (DeviceArray *)Py_NewRef(out);
        if (ranges_overlap(out, a) || ranges_overlap(out, b)) {
            target = cl_array_new(st, func, rnd, rshape, NULL, dtype);
        }
        else {
            target = (DeviceArray *)Py_NewRef(out);
        }
    }
    else {
        result = cl_array_new(st, func, rnd, rshape, NULL, dtype);
        target = (DeviceArray *)Py_XNewRef(result);
    }
    if (result == NULL || target == NULL) {
        goto fail;
    }
    int64_t batch_total = 1;
    for (int i = 0; i < nb; i++) {
        batch_total *= bshape[i];
    }
    if (batch_total == 0 || M == 0 || N == 0) {
        goto done;
    }
    if (K == 0) {
        CL_CUDA_CHECK(st, cudaMemsetAsync(target->data, 0,
                                          (size_t)cl_array_size(target) * cl_itemsize(dtype),
                                          stream));
        goto copy_back;
    }

    /* Matrix layouts cuBLAS cannot take as they are become contiguous. */
    cublasOperation_t op_a, op_b;
    int64_t ld_a, ld_b;
    if (!matrix_layout(&oa, &op_a, &ld_a)) {
        if (operand_make_contiguous(st, &oa, nb, NULL, true) < 0) {
            goto fail;
        }
        (void)matrix_layout(&oa, &op_a, &ld_a);
    }
    if (!matrix_layout(&ob, &op_b, &ld_b)) {
        if (operand_make_contiguous(st, &ob, nb, NULL, false) < 0) {
            goto fail;
        }
        (void)matrix_layout(&ob, &op_b, &ld_b);
    }

    /* Batch axes of extent > 1; split into an inner run with one stride per
     * operand and an outer rest. */
    int64_t sa_all[CL_MAX_NDIM], sb_all[CL_MAX_NDIM];
    int64_t ext[CL_MAX_NDIM], sa[CL_MAX_NDIM], sb[CL_MAX_NDIM], sc[CL_MAX_NDIM];
    int n_axes, split;
    int64_t outer, inner;
    for (int attempt = 0;; attempt++) {
        batch_strides(&oa, nb, bshape, sa_all);
        batch_strides(&ob, nb, bshape, sb_all);
        n_axes = 0;
        for (int i = 0; i < nb; i++) {
            if (bshape[i] > 1) {
                ext[n_axes] = bshape[i];
                sa[n_axes] = sa_all[i];
                sb[n_axes] = sb_all[i];
                n_axes++;
            }
        }
        int64_t stride_c = M * N;
        for (int i = n_axes - 1; i >= 0; i--) {
            sc[i] = stride_c;
            stride_c *= ext[i];
        }
        split = n_axes > 0 ? n_axes - 1 : 0; /* inner axes: split .. n_axes-1 */
        while (split > 0 && sa[split - 1] == sa[split] * ext[split] &&
               sb[split - 1] == sb[split] * ext[split]) {
            split--;
        }
        outer = 1;
        inner = 1;
        for (int i = 0; i < n_axes; i++) {
            if (i < split) {
                outer *= ext[i];
            }
            else {
                inner *= ext[i];
            }
        }
        if (outer <= MAX_OUTER_CALLS || attempt > 0) {
            break;
        }
        /* Too many calls: materialize the operands that need them. */
        bool a_ok = true, b_ok = true;
        for (int i = 0; i + 1 < n_axes; i++) {
            a_ok = a_ok && sa[i] == sa[i + 1] * ext[i + 1];
            b_ok = b_ok && sb[i] == sb[i + 1] * ext[i + 1];
        }
        if (!a_ok && operand_make_contiguous(st, &oa, nb, bshape, true) < 0) {
            goto fail;
        }
        if (!b_ok && operand_make_contiguous(st, &ob, nb, bshape, false) < 0) {
            goto fail;
        }
        (void)matrix_layout(&oa, &op_a, &ld_a);
        (void)matrix_layout(&ob, &op_b, &ld_b);
        oa.nbatch = oa.arr->ndim - 2 < 0 ? 0 : oa.arr->ndim - 2;
        ob.nbatch = ob.arr->ndim - 2 < 0 ? 0 : ob.arr->ndim - 2;
    }

    /* The plan: cuBLAS's X = our b (m = N, k = K), Y = our a (k = K, n = M). */
    int64_t item = (int64_t)cl_itemsize(dtype);
    int64_t in_sa = n_axes > 0 ? sa[n_axes - 1] : 0, in_sb = n_axes > 0 ? sb[n_axes - 1] : 0;
    int64_t in_sc = n_axes > 0 ? sc[n_axes - 1] : 0;
    uint32_t al_a = alignment_of((uintptr_t)oa.arr->data);
    uint32_t al_b = alignment_of((uintptr_t)ob.arr->data);
    uint32_t al_c = alignment_of((uintptr_t)target->data);
    for (int i = 0; i < n_axes; i++) {
        al_a = min_u32(al_a, alignment_of((uint64_t)(sa[i] * item)));
        al_b = min_u32(al_b, alignment_of((uint64_t)(sb[i] * item)));
        al_c = min_u32(al_c, alignment_of((uint64_t)(sc[i] * item)));
    }
    mm_key key;
    memset(&key, 0, sizeof key);
    key.device = device;
    key.dtype = (int)dtype;
    key.compute = (int)compute_type(dtype, precision);
    key.lt = atomic_load(&use_lt[dtype]);
    key.opx = (int)op_b;
    key.opy = (int)op_a;
    key.m = N;
    key.n = M;
    key.k = K;
    key.ldx = ld_b;
    key.ldy = ld_a;
    key.ldc = N;
    key.batch = inner;
    key.sx = inner > 1 ? in_sb : 0;
    key.sy = inner > 1 ? in_sa : 0;
    key.sc = inner > 1 ? in_sc : 0;
    key.align_x = al_b;
    key.align_y = al_a;
    key.align_c = al_c;

    blas_thread *t = get_thread_state();
    if (t == NULL) {
        goto fail;
    }
    blas_handle *h = get_handle(st, t, device, stream);
    if (h == NULL) {
        goto fail;
    }
    mm_plan *plan = plan_get(st, t, h, &key);
    if (plan == NULL) {
        goto fail;
    }
    int64_t idx[CL_MAX_NDIM] = {0};
    for (int64_t call = 0; call < outer; call++) {
        int64_t off_a = 0, off_b = 0, off_c = 0;
        for (int i = 0; i < split; i++) {
            off_a += idx[i] * sa[i];
            off_b += idx[i] * sb[i];
            off_c += idx[i] * sc[i];
        }
        if (plan_run(st, h, plan, ob.arr->data + off_b * item, oa.arr->data + off_a * item,
                     target->data + off_c * item) < 0) {
            goto fail;
        }
        for (int i = split - 1; i >= 0; i--) {
            if (++idx[i] < ext[i]) {
                break;
            }
            idx[i] = 0;
        }
    }
copy_back:
    if (target != result && cl_array_copy_into(st, result, target) < 0) {
        goto fail;
    }
done:
    profile_matmul(st, &ps, a, b, result, dtype, M, N, K, nb, bshape, rnd, rshape);
    cl_device_exit(device, previous);
    Py_DECREF(oa.arr);
    Py_DECREF(ob.arr);
    Py_XDECREF(target);
    return (PyObject *)result;
fail:
    profile_matmul(st, &ps, a, b, NULL, dtype, M, N, K, nb, bshape, rnd, rshape);
    cl_device_exit(device, previous);
    Py_DECREF(oa.arr);
    Py_DECREF(ob.arr);
    Py_XDECREF(target);
    Py_XDECREF(result);
    return NULL;
}

/* ---- Python functions ------------------------------------------------------------------- */

PyDoc_STRVAR(matmul_doc,
"matmul(a, b, out=None, precision=None)\n--\n\n"
"Matrix product of two DeviceArrays, with np.matmul's semantics, on cuBLASLt.\n\n"
"The last two axes are the matrices; leading (batch) axes broadcast against\n"
"each other. A 1-D `a` is a row vector and a 1-D `b` a column vector; the\n"
"added axis is dropped from the result (1-D @ 1-D gives a 0-d array).\n"
"Transposed and column-major views (``x.T``) and row-major views with a\n"
"leading dimension (``x[:, :n]``) reach cuBLAS as operation flags and leading\n"
"dimensions, without a copy; other layouts are copied C-contiguous first.\n"
"The work is enqueued on the current stream of the operands' device.\n\n"
"Parameters\n----------\n"
"a, b : DeviceArray\n"
"    float64, float32, float16 or bfloat16, both of the same dtype and on\n"
"    the same device. float16/bfloat16 accumulate in float32.\n"
"out : DeviceArray, optional\n"
"    C-contiguous array of exactly the result's shape and dtype to write\n"
"    into (it may overlap the operands).\n"
"precision : {'highest', 'high'}, optional\n"
"    For float32 only: 'highest' computes in true fp32, 'high' lets the\n"
"    tensor cores use TF32. Defaults to get_float32_matmul_precision().\n\n"
"Returns\n-------\nDeviceArray\n    `out` if given, else a new C-contiguous array.\n\n"
"Raises\n------\n"
"TypeError\n    Non-DeviceArray operands, unsupported or mixed dtypes.\n"
"ValueError\n    Mismatched shapes, a bad `out` or `precision`.\n"
"CublasError\n    A cuBLAS/cuBLASLt call failed.");

static PyObject *
matmul(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"a", "b", "out", "precision", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[4];
    if (cl_parse_args("matmul", args, nargs, kwnames, names, 2, argv) < 0) {
        return NULL;
    }
    return do_matmul(st, "matmul", argv[0], argv[1], argv[2], argv[3]);
}

PyDoc_STRVAR(set_float32_matmul_precision_doc,
"set_float32_matmul_precision(precision)\n--\n\n"
"Choose how float32 matmul computes, for the whole process.\n\n"
"Parameters\n----------\n"
"precision : {'highest', 'high'}\n"
"    'highest' (the default): true fp32 (CUBLAS_COMPUTE_32F). 'high': TF32 on\n"
"    the tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32), about 1e-3 relative\n"
"    error and several times faster. A matmul's own `precision` argument\n"
"    overrides this setting for that call.");

static PyObject *
set_float32_matmul_precision(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    static const char *const names[] = {"precision", NULL};
    PyObject *argv[1];
    int precision;
    if (cl_parse_args("set_float32_matmul_precision", args, nargs, kwnames, names, 1, argv) <
            0 ||
        parse_precision(argv[0], "set_float32_matmul_precision", "precision", &precision) < 0) {
        return NULL;
    }
    atomic_store(&float32_precision, precision);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(get_float32_matmul_precision_doc,
"get_float32_matmul_precision()\n--\n\n"
"The process-wide float32 matmul precision: 'highest' or 'high'.");

static PyObject *
get_float32_matmul_precision(PyObject *module, PyObject *unused)
{
    return PyUnicode_FromString(precision_names[atomic_load(&float32_precision)]);
}

PyDoc_STRVAR(_set_matmul_backend_doc,
"_set_matmul_backend(dtype, backend)\n--\n\n"
"Private, for benchmarks: route `dtype`'s matmuls to 'lt' (cuBLASLt with a\n"
"cached heuristic choice, the default except for float64) or 'cublas'\n"
"(cublasGemmStridedBatchedEx). Returns the previous backend.");

static PyObject *
_set_matmul_backend(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames)
{
    static const char *const names[] = {"dtype", "backend", NULL};
    static const char *func = "_set_matmul_backend";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    cl_dtype dtype;
    if (cl_parse_args(func, args, nargs, kwnames, names, 2, argv) < 0 ||
        cl_dtype_converter(st, argv[0], func, "dtype", &dtype) < 0) {
        return NULL;
    }
    if (!is_matmul_dtype(dtype)) {
        return cl_arg_error(PyExc_TypeError, func, "dtype", "unsupported dtype %s",
                            cl_dtype_name(dtype)), NULL;
    }
    int lt;
    if (PyUnicode_Check(argv[1]) && PyUnicode_CompareWithASCIIString(argv[1], "lt") == 0) {
        lt = 1;
    }
    else if (PyUnicode_Check(argv[1]) &&
             PyUnicode_CompareWithASCIIString(argv[1], "cublas") == 0) {
        lt = 0;
    }
    else {
        return cl_arg_error(PyExc_ValueError, func, "backend", "expected 'lt' or 'cublas', got %R",
                            argv[1]), NULL;
    }
    int before = atomic_exchange(&use_lt[dtype], lt);
    return PyUnicode_FromString(before ? "lt" : "cublas");
}

PyMethodDef cl_blas_methods[] = {
    CL_FASTCALL(matmul),
    CL_FASTCALL(_set_matmul_backend),
    CL_FASTCALL(set_float32_matmul_precision),
    {"get_float32_matmul_precision", get_float32_matmul_precision, METH_NOARGS,
     get_float32_matmul_precision_doc},
    {NULL, NULL, 0, NULL},
};

/* a @ b: DeviceArray's nb_matrix_multiply slot (either operand may be ours). */
PyObject *
cl_nb_matrix_multiply(PyObject *a, PyObject *b)
{
    PyTypeObject *ours = NULL;
    if (PyType_GetSlot(Py_TYPE(a), Py_nb_matrix_multiply) == (void *)cl_nb_matrix_multiply) {
        ours = Py_TYPE(a);
    }
    else if (PyType_GetSlot(Py_TYPE(b), Py_nb_matrix_multiply) ==
             (void *)cl_nb_matrix_multiply) {
        ours = Py_TYPE(b);
    }
    if (ours == NULL) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    cl_state *st = cl_state_from_type(ours);
    if (st == NULL) {
        return NULL;
    }
    if (!CL_IS_DEVICEARRAY(st, a) || !CL_IS_DEVICEARRAY(st, b)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    return do_matmul(st, "matmul", a, b, NULL, NULL);
}
