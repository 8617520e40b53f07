/* The cuBLAS / cuBLASLt side of matmul (ops/matmul.h): handles, workspaces,
 * plans, and the GEMM call.
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
 * Lt descriptors, keyed by cl_mm_key (device, dtype, compute type, ops, m, n,
 * k, leading dimensions, batch count and strides, pointer alignments), in a
 * small table with round-robin eviction. When cuBLASLt offers no algorithm
 * (or refuses the chosen one), the plan falls back to
 * cublasGemmStridedBatchedEx_64; so does a key whose `lt` is 0.
 *
 * Epilogues (ops/linear.c). A key with an epilogue also carries the aux
 * leading dimension and the alignments of the bias and aux pointers; the
 * heuristic sees stand-in pointers of exactly those alignments (it reads
 * only their values), and each call sets the real ones on the cached
 * descriptor (host-side attributes, so capture in a graph is unaffected).
 * Such a plan never falls back to cuBLAS: cl_mm_uses_lt says whether
 * cuBLASLt took it, and cl_mm_run_args refuses to drop the epilogue. */
#include "ops/matmul.h"
#include "runtime/runtime.h"
#include "core/core.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define WORKSPACE_BYTES ((size_t)32 << 20)
#define PLAN_CACHE_SIZE 32

/* ---- errors ------------------------------------------------------------------ */

int
cl_raise_cublas(cl_state *st, cublasStatus_t status, const char *expr, const char *file, int line)
{
    return cl_raise_status(st->CublasError, (int)status, cublasGetStatusName(status),
                           cublasGetStatusString(status), expr, file, line);
}

/* ---- per-thread, per-device handles and plans ---------------------------------- */

typedef struct mm_plan {
    bool used;
    bool use_lt;
    cl_mm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t lx, ly, lc;
    cublasLtMatmulAlgo_t algo;
} mm_plan;

typedef struct mm_handle {
    bool ready;
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    void *workspace;
    cudaStream_t stream;     /* the stream the handle (and workspace) was last used on */
    bool blas_stream_set;    /* cublasSetStream(blas, stream) done */
    cudaEvent_t switch_event;
} mm_handle;

typedef struct mm_thread {
    mm_handle dev[CL_MAX_DEVICES];
    mm_plan plans[PLAN_CACHE_SIZE];
    int next_victim;
    struct mm_thread *next; /* graveyard link */
} mm_thread;

static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;
static int thread_key_error = 0;
static pthread_mutex_t graveyard_lock = PTHREAD_MUTEX_INITIALIZER;
static mm_thread *graveyard = NULL;
static _Atomic int graveyard_nonempty = 0;

/* Destroy whichever Lt objects exist (NULL: not made). */
static void
lt_objects_destroy(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t lx,
                   cublasLtMatrixLayout_t ly, cublasLtMatrixLayout_t lc)
{
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
}

static void
plan_release(mm_plan *p)
{
    if (p->used && p->use_lt) {
        lt_objects_destroy(p->desc, p->lx, p->ly, p->lc);
    }
    p->used = false;
    p->use_lt = false;
}

/* Thread exit (no GIL here, maybe no Python thread state): free the host-side
 * plans, and hand the device resources to the graveyard. */
static void
thread_state_exit(void *ptr)
{
    mm_thread *t = ptr;
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

/* Destroy a dead thread's handle on device `d` and free its workspace. */
static void
handle_destroy(cl_state *st, mm_handle *h, int d)
{
    int previous = cl_device_enter_quiet(d);
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

void
cl_mm_drain_graveyard(cl_state *st)
{
    if (!atomic_load(&graveyard_nonempty)) {
        return;
    }
    pthread_mutex_lock(&graveyard_lock);
    mm_thread *list = graveyard;
    graveyard = NULL;
    atomic_store(&graveyard_nonempty, 0);
    pthread_mutex_unlock(&graveyard_lock);
    while (list != NULL) {
        mm_thread *t = list;
        list = t->next;
        for (int d = 0; d < CL_MAX_DEVICES; d++) {
            if (t->dev[d].ready) {
                handle_destroy(st, &t->dev[d], d);
            }
        }
        free(t);
    }
}

static mm_thread *
get_thread_state(void)
{
    if (pthread_once(&thread_key_once, make_thread_key) != 0 || thread_key_error != 0) {
        PyErr_SetString(PyExc_RuntimeError, "matmul(): could not create a thread-local key");
        return NULL;
    }
    mm_thread *t = pthread_getspecific(thread_key);
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
create_handle(cl_state *st, mm_handle *h, int device, cudaStream_t stream)
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
static mm_handle *
get_handle(cl_state *st, mm_thread *t, int device, cudaStream_t stream)
{
    mm_handle *h = &t->dev[device];
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
prepare_blas(cl_state *st, mm_handle *h)
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

/* Set the epilogue's pointers on a descriptor (NULL: leave as is). */
static int
lt_desc_pointers(cl_state *st, cublasLtMatmulDesc_t desc, const void *bias, const void *aux)
{
    if (bias != NULL) {
        CL_CUBLAS_CHECK(st, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                           &bias, sizeof bias));
    }
    if (aux != NULL) {
        CL_CUBLAS_CHECK(st, cublasLtMatmulDescSetAttribute(
                                desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    }
    return 0;
fail:
    return -1;
}

/* The epilogue, its aux leading dimension, and stand-in pointers with the
 * key's alignments for the heuristic (the real ones are set per call). */
static int
lt_desc_epilogue(cl_state *st, const cl_mm_key *key, cublasLtMatmulDesc_t desc)
{
    uint32_t epilogue = (uint32_t)key->epilogue;
    CL_CUBLAS_CHECK(st, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                       &epilogue, sizeof epilogue));
    if (key->align_aux != 0) {
        int64_t ld = key->aux_ld;
        CL_CUBLAS_CHECK(st, cublasLtMatmulDescSetAttribute(
                                desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    return lt_desc_pointers(st, desc, (const void *)(uintptr_t)key->align_bias,
                            (const void *)(uintptr_t)key->align_aux);
fail:
    return -1;
}

/* The operation descriptor: compute and scale types, the two operations. */
static int
lt_desc_create(cl_state *st, const cl_mm_key *key, cublasLtMatmulDesc_t *desc)
{
    cudaDataType scale = key->dtype == CL_FLOAT64 ? CUDA_R_64F : CUDA_R_32F;
    int32_t opx = key->opx, opy = key->opy;
    CL_CUBLAS_CHECK(st, cublasLtMatmulDescCreate(desc, (cublasComputeType_t)key->compute, scale));
    CL_CUBLAS_CHECK(st, cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSA, &opx,
                                                       sizeof opx));
    CL_CUBLAS_CHECK(st, cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSB, &opy,
                                                       sizeof opy));
    return key->epilogue != 0 ? lt_desc_epilogue(st, key, *desc) : 0;
fail:
    return -1;
}

/* The layouts of X, Y and C (with their batch count and strides). */
static int
lt_layouts_create(cl_state *st, const cl_mm_key *key, cublasLtMatrixLayout_t *lx,
                  cublasLtMatrixLayout_t *ly, cublasLtMatrixLayout_t *lc)
{
    cudaDataType type = cuda_type((cl_dtype)key->dtype);
    /* Stored shapes: X is m x k (op N) or k x m (op T); Y is k x n or n x k. */
    bool xn = key->opx == CUBLAS_OP_N, yn = key->opy == CUBLAS_OP_N;
    CL_CUBLAS_CHECK(st, cublasLtMatrixLayoutCreate(lx, type, (uint64_t)(xn ? key->m : key->k),
                                                   (uint64_t)(xn ? key->k : key->m), key->ldx));
    CL_CUBLAS_CHECK(st, cublasLtMatrixLayoutCreate(ly, type, (uint64_t)(yn ? key->k : key->n),
                                                   (uint64_t)(yn ? key->n : key->k), key->ldy));
    cudaDataType ctype = key->out_f32 ? CUDA_R_32F : type;
    CL_CUBLAS_CHECK(st, cublasLtMatrixLayoutCreate(lc, ctype, (uint64_t)key->m,
                                                   (uint64_t)key->n, key->ldc));
    if (key->batch > 1) {
        if (set_layout_batch(st, *lx, key->batch, key->sx) < 0 ||
            set_layout_batch(st, *ly, key->batch, key->sy) < 0 ||
            set_layout_batch(st, *lc, key->batch, key->sc) < 0) {
            return -1;
        }
    }
    return 0;
fail:
    return -1;
}

/* The heuristic's constraints: our workspace, the pointers' alignments, and
 * for half types no split-K reduction in the output type. */
static int
lt_pref_create(cl_state *st, const cl_mm_key *key, cublasLtMatmulPreference_t *pref)
{
    uint64_t ws = WORKSPACE_BYTES;
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceCreate(pref));
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                            *pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                            *pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->align_x,
                            sizeof key->align_x));
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                            *pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->align_y,
                            sizeof key->align_y));
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                            *pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->align_c,
                            sizeof key->align_c));
    CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                            *pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->align_c,
                            sizeof key->align_c));
    if ((key->dtype == CL_FLOAT16 || key->dtype == CL_BFLOAT16) && !key->out_f32) {
        /* Split-K partial sums stay in fp32: no reduction in the output type
         * (INPLACE reduces through the output buffer, hence its type too). */
        uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        CL_CUBLAS_CHECK(st, cublasLtMatmulPreferenceSetAttribute(
                                *pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask,
                                sizeof mask));
    }
    return 0;
fail:
    return -1;
}

/* The heuristic's first algorithm for the descriptors: 1 found, 0 none
 * (cuBLASLt does not support the problem), -1 error. */
static int
lt_heuristic(cl_state *st, mm_handle *h, const cl_mm_key *key, cublasLtMatmulDesc_t desc,
             cublasLtMatrixLayout_t lx, cublasLtMatrixLayout_t ly, cublasLtMatrixLayout_t lc,
             cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatmulPreference_t pref = NULL;
    if (lt_pref_create(st, key, &pref) < 0) {
        goto fail;
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
        return 0;
    }
    CL_CUBLAS_CHECK(st, status);
    *algo = result.algo;
    return 1;
fail:
    if (pref != NULL) {
        (void)cublasLtMatmulPreferenceDestroy(pref);
    }
    return -1;
}

/* Fill `p` for `key`: Lt descriptors and the heuristic's first algorithm, or
 * use_lt = false when cuBLASLt has none (or the dtype does not use it). */
static int
plan_create(cl_state *st, mm_handle *h, mm_plan *p, const cl_mm_key *key)
{
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t lx = NULL, ly = NULL, lc = NULL;
    p->used = true;
    p->use_lt = false;
    p->key = *key;
    if (!key->lt || key->batch > INT32_MAX) {
        return 0;
    }
    int found = -1;
    if (lt_desc_create(st, key, &desc) == 0 && lt_layouts_create(st, key, &lx, &ly, &lc) == 0) {
        found = lt_heuristic(st, h, key, desc, lx, ly, lc, &p->algo);
    }
    if (found <= 0) {
        lt_objects_destroy(desc, lx, ly, lc);
        p->used = found == 0;
        return found;
    }
    p->desc = desc;
    p->lx = lx;
    p->ly = ly;
    p->lc = lc;
    p->use_lt = true;
    return 0;
}

static mm_plan *
plan_get(cl_state *st, mm_thread *t, mm_handle *h, const cl_mm_key *key)
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

int
cl_mm_prepare(cl_state *st, const cl_mm_key *key, cudaStream_t stream, cl_mm_exec *ex)
{
    if (cl_mm_bind(st, key->device, stream, ex) < 0) {
        return -1;
    }
    ex->plan = plan_get(st, pthread_getspecific(thread_key), ex->handle, key);
    return ex->plan == NULL ? -1 : 0;
}

/* Plans owned by the caller (ops/conv.c's network forward): made once, outside
 * the per-thread cache, so a network with more distinct GEMMs than the cache
 * holds never re-runs the heuristic per call. Any thread may run one (the
 * descriptors are host objects; the algorithm does not depend on the handle). */
int
cl_mm_plan_new(cl_state *st, const cl_mm_key *key, cudaStream_t stream, cl_mm_exec *ex)
{
    if (cl_mm_bind(st, key->device, stream, ex) < 0) {
        return -1;
    }
    mm_plan *p = calloc(1, sizeof *p);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (plan_create(st, ex->handle, p, key) < 0) {
        free(p);
        return -1;
    }
    ex->plan = p;
    return 0;
}

void
cl_mm_plan_free(struct mm_plan *plan)
{
    if (plan != NULL) {
        plan_release(plan);
        free(plan);
    }
}

int
cl_mm_bind(cl_state *st, int device, cudaStream_t stream, cl_mm_exec *ex)
{
    mm_thread *t = get_thread_state();
    if (t == NULL) {
        return -1;
    }
    ex->handle = get_handle(st, t, device, stream);
    return ex->handle == NULL ? -1 : 0;
}

/* ---- the product ------------------------------------------------------------------- */

bool
cl_mm_uses_lt(const cl_mm_exec *ex)
{
    return ex->plan->use_lt;
}

int
cl_mm_run(cl_state *st, const cl_mm_exec *ex, const void *x, const void *y, void *c)
{
    return cl_mm_run_args(st, ex, x, y, c, NULL);
}

int
cl_mm_run_args(cl_state *st, const cl_mm_exec *ex, const void *x, const void *y, void *c,
               const cl_mm_args *args)
{
    mm_handle *h = ex->handle;
    mm_plan *p = ex->plan;
    const cl_mm_key *k = &p->key;
    bool acc = args != NULL && args->accumulate;
    double alpha64 = 1.0, beta64 = acc ? 1.0 : 0.0;
    float alpha32 = 1.0f, beta32 = acc ? 1.0f : 0.0f;
    bool f64 = k->dtype == CL_FLOAT64;
    const void *alpha = f64 ? (const void *)&alpha64 : (const void *)&alpha32;
    const void *beta = f64 ? (const void *)&beta64 : (const void *)&beta32;
    if (p->use_lt) {
        if (args != NULL && lt_desc_pointers(st, p->desc, args->bias, args->aux) < 0) {
            return -1;
        }
        cublasStatus_t status =
            cublasLtMatmul(h->lt, p->desc, alpha, x, p->lx, y, p->ly, beta, c, p->lc, c, p->lc,
                           &p->algo, h->workspace, WORKSPACE_BYTES, h->stream);
        if (status != CUBLAS_STATUS_NOT_SUPPORTED || k->epilogue != 0) {
            CL_CUBLAS_CHECK(st, status);
            return 0;
        }
        /* The algorithm refused this problem after all: use cuBLAS from now on. */
        plan_release(p);
        p->used = true;
    }
    if (k->epilogue != 0) {
        PyErr_SetString(st->CudalabError,
                        "cuBLASLt has no algorithm for this product with its fused epilogue");
        return -1;
    }
    cudaDataType type = cuda_type((cl_dtype)k->dtype);
    cudaDataType ctype = k->out_f32 ? CUDA_R_32F : type;
    if (prepare_blas(st, h) < 0) {
        return -1;
    }
    CL_CUBLAS_CHECK(st, cublasGemmStridedBatchedEx_64(
                            h->blas, (cublasOperation_t)k->opx, (cublasOperation_t)k->opy, k->m,
                            k->n, k->k, alpha, x, type, k->ldx, k->sx, y, type, k->ldy, k->sy,
                            beta, c, ctype, k->ldc, k->sc, k->batch,
                            (cublasComputeType_t)k->compute, CUBLAS_GEMM_DEFAULT));
    return 0;
fail:
    return -1;
}
