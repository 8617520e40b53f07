/* Shared declarations of the cudalab._core extension (plain C11).
 *
 * One file per concern:
 *   module.c    init (PEP 489 multi-phase), module state, the function table
 *   args.c      FASTCALL argument parsing
 *   errors.c    the exception hierarchy and the helpers that raise it
 *   dtype.c     NumPy dtype <-> cl_dtype
 *   device.c    device query and selection
 *   stream.c    the stream every operation is enqueued on
 *   memory.c    the stream-ordered pool, its counters and statistics
 *   array.c     the DeviceArray type: attributes, views, indexing, reshape
 *   creation.c  constructors and host <-> device copies
 *   profiler.c  the op profiler (cudalab.profiler) and NVTX ranges
 */
#ifndef CUDALAB_CORE_H
#define CUDALAB_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stdint.h>

/* Every translation unit shares the one NumPy API table that module.c imports. */
#define PY_ARRAY_UNIQUE_SYMBOL cudalab_ARRAY_API
#ifndef CUDALAB_IMPORTS_NUMPY
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include <cuda_runtime_api.h>
#include "kernels.h"

#define CL_MAX_DEVICES 64

/* ---- per-device state, owned by the module state ------------------------ */

typedef struct cl_device_state {
    bool pool_ready;          /* pool created and configured */
    cudaMemPool_t pool;       /* our own pool (not the device default pool) */
    size_t total_memory;      /* cudaMemGetInfo total, read once */
    double fraction;          /* set_per_process_memory_fraction, 1.0 = no limit */
    /* Counters the driver does not keep. requested_* are the bytes callers
     * asked for (the per-process limit is enforced on these). */
    size_t requested_current;
    size_t requested_peak;
    long long num_allocs;
    long long num_frees;
    long long num_ooms;
    long long num_alloc_retries;
    /* Streams of dead Stream objects, kept for reuse instead of destroyed:
     * arrays may still free their memory on them (stream.c). */
    cudaStream_t *spare_streams;
    int *spare_priorities;
    int num_spare_streams, cap_spare_streams;
} cl_device_state;

typedef struct cl_state {
    PyTypeObject *DeviceArray_Type;
    PyTypeObject *Stream_Type;   /* stream.c */
    PyTypeObject *Event_Type;    /* stream.c */
    PyTypeObject *CUDAGraph_Type; /* graph.c */
    PyObject *CudalabError;
    PyObject *CudaError;
    PyObject *CublasError;
    PyObject *OutOfMemoryError;
    PyObject *NoDeviceError;
    PyArray_Descr *descr[CL_NUM_DTYPES]; /* canonical NumPy dtype of each cl_dtype */
    PyObject *bfloat16_type;             /* ml_dtypes.bfloat16 */
    int device_count;                    /* -1 until first asked */
    cudaError_t device_count_error;      /* why device_count is 0, if it is */
    cl_device_state devices[CL_MAX_DEVICES];
    /* Profiler (profiler.c): CL_PROF_* bits every op tests, and the state
     * behind them (allocated on first use). */
    int prof_flags;
    struct cl_prof_state *prof;
} cl_state;

cl_state *cl_state_from_module(PyObject *module);
cl_state *cl_state_from_type(PyTypeObject *type);

/* ---- DeviceArray --------------------------------------------------------- */

/* A shape (or strides) as a Python tuple of ints, for attributes and messages. */
PyObject *cl_shape_tuple(int ndim, const Py_ssize_t *values);

#define CL_MAX_USED_STREAMS 4

typedef struct DeviceArray {
    PyObject_HEAD
    char *data;                       /* first element (NULL when size == 0) */
    int ndim;
    cl_dtype dtype;
    int device;
    Py_ssize_t shape[CL_MAX_NDIM];
    Py_ssize_t strides[CL_MAX_NDIM]; /* bytes */
    /* Ownership: an owner has base == NULL and frees `alloc` on `alloc_stream`
     * when it dies; a view holds a strong reference to its (root) owner. */
    PyObject *base;
    void *alloc;
    size_t alloc_bytes;               /* bytes the caller asked for */
    cudaStream_t alloc_stream;
    PyObject *weakreflist;
    /* Streams other than alloc_stream that used the memory (record_stream);
     * the free waits for them. Overflow: the free synchronizes the device. */
    cudaStream_t used_streams[CL_MAX_USED_STREAMS];
    int num_used_streams;
    bool used_streams_overflow;
    /* Set when the memory was allocated during CUDA graph capture: the graph
     * (a CUDAGraph) owns the memory and is kept alive by this reference. */
    PyObject *graph;
    /* Host array an asynchronous upload reads from (asarray(pinned,
     * non_blocking=True)): kept alive until this owner dies. Usually NULL. */
    PyObject *host_keepalive;
} DeviceArray;

extern PyType_Spec cl_DeviceArray_spec;

#define CL_IS_DEVICEARRAY(state, obj) (Py_TYPE(obj) == (state)->DeviceArray_Type)

Py_ssize_t cl_array_size(const DeviceArray *a);
size_t cl_itemsize(cl_dtype dtype);
bool cl_is_c_contiguous(const DeviceArray *a);
bool cl_is_f_contiguous(const DeviceArray *a);
/* Dense with positive strides in some axis order: its bytes are exactly
 * [data, data + nbytes), so it can be copied as one block. */
bool cl_is_dense(const DeviceArray *a);
void cl_c_strides(int ndim, const Py_ssize_t *shape, size_t itemsize, Py_ssize_t *strides);

bool cl_layout_is_dense(int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
                        size_t itemsize);
/* New owner array on the current device, memory from its pool. With
 * strides == NULL it is C-contiguous; explicit byte strides must describe a
 * dense layout. `func` names the public function for error messages. */
DeviceArray *cl_array_new(cl_state *st, const char *func, int ndim, const Py_ssize_t *shape,
                          const Py_ssize_t *strides, cl_dtype dtype);
/* New view of `src`'s memory; keeps the root owner alive. */
DeviceArray *cl_array_view(cl_state *st, DeviceArray *src, char *data, int ndim,
                           const Py_ssize_t *shape, const Py_ssize_t *strides);
/* Zero-copy array over foreign device memory at `data` (interop.c's
 * imports); keeps `base` alive and never frees the memory itself. */
DeviceArray *cl_array_wrap(cl_state *st, PyObject *base, char *data, int device, cl_dtype dtype,
                           int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides);
/* dst (any layout, same shape) <- src with dtype conversion, on the current stream. */
int cl_array_copy_into(cl_state *st, DeviceArray *dst, const DeviceArray *src);
/* C-contiguous copy of `a` in `dtype`, on a's device. */
DeviceArray *cl_array_contiguous_copy(cl_state *st, const char *func, DeviceArray *a,
                                      cl_dtype dtype);
/* The same as a user-visible op (copy, astype, ascontiguousarray, asarray of a
 * device array to another dtype): profiled and NVTX-marked as `func`. */
DeviceArray *cl_array_copy_op(cl_state *st, const char *func, DeviceArray *a, cl_dtype dtype);

/* ---- dtype (dtype.c) ----------------------------------------------------- */

int cl_dtype_init(PyObject *module, cl_state *st);
/* NumPy descr -> cl_dtype; -1 if unsupported (no exception set). */
int cl_dtype_from_descr(cl_state *st, PyArray_Descr *descr);
/* Any dtype-like object -> cl_dtype; raises TypeError naming func/param. */
int cl_dtype_converter(cl_state *st, PyObject *obj, const char *func, const char *param,
                       cl_dtype *out);
const char *cl_dtype_name(cl_dtype dtype);
PyObject *cl_supported_dtypes_text(void);

/* ---- errors (errors.c) --------------------------------------------------- */

int cl_errors_init(PyObject *module, cl_state *st);
/* Raise CudaError for `err` (which is cleared from the runtime). Returns -1. */
int cl_raise_cuda(cl_state *st, cudaError_t err, const char *expr, const char *file, int line);
/* Raise `type` (CudaError, CublasError) for a failed library call; the
 * exception carries code, name, expression, file and line. Returns -1. */
int cl_raise_status(PyObject *type, int code, const char *name, const char *text, const char *expr,
                    const char *file, int line);
int cl_raise_no_device(cl_state *st, const char *func);
/* OutOfMemoryError with a message a PyTorch user recognizes; `limit_reason`
 * non-zero when our per-process limit (not the driver) refused. */
int cl_raise_oom(cl_state *st, int device, size_t requested, size_t allocated, size_t reserved,
                 size_t free_bytes, size_t total, size_t limit, int limit_reason);
/* TypeError/ValueError with the "<func>() argument '<param>': ..." prefix. */
int cl_arg_error(PyObject *exc_type, const char *func, const char *param, const char *fmt, ...);

/* Every CUDA call goes through this: on failure it raises CudaError carrying
 * the expression, file and line and jumps to the function's `fail` label. */
#define CL_CUDA_CHECK(st, expr)                                                   \
    do {                                                                          \
        cudaError_t cl_err_ = (expr);                                             \
        if (cl_err_ != cudaSuccess) {                                             \
            cl_raise_cuda((st), cl_err_, #expr, __FILE__, __LINE__);              \
            goto fail;                                                            \
        }                                                                         \
    } while (0)

/* ---- devices (device.c) -------------------------------------------------- */

extern PyMethodDef cl_device_methods[];
/* Number of usable devices (0 without GPU or driver); never raises. */
int cl_device_count(cl_state *st);
/* 0 when a device exists, else raises NoDeviceError naming func. */
int cl_require_device(cl_state *st, const char *func);
/* Parse an optional `device` argument (None = current). Validates before
 * touching the GPU, then requires one. Returns -1 with an exception set. */
int cl_parse_device(cl_state *st, PyObject *obj, const char *func, int *device);
int cl_current_device(cl_state *st, int *device);
/* Make `device` current for an operation on its arrays; cl_device_exit puts
 * the caller's device back (a no-op when they were the same). */
int cl_device_enter(cl_state *st, int device, int *previous);
void cl_device_exit(int device, int previous);
/* Parse an index argument: Python int (not bool), returned as Py_ssize_t. */
int cl_parse_index(PyObject *obj, const char *func, const char *param, Py_ssize_t *out);

/* ---- streams (stream.c) -------------------------------------------------- */

/* The calling thread's current stream on the current device (the legacy
 * default stream, 0, unless a `with Stream:` block set one). */
cudaStream_t cl_current_stream(cl_state *st);
int cl_stream_init(PyObject *module, cl_state *st);
/* Record that `a`'s memory is used on `s` (on its root owner), so its free
 * waits for `s`'s work. Never raises. */
void cl_array_note_stream(const DeviceArray *a, cudaStream_t s);
/* DeviceArray.record_stream (array.c's method table points here). */
PyObject *cl_array_record_stream(PyObject *self, PyObject *stream);
/* A Stream's handle and device; TypeError naming func/param otherwise. */
int cl_stream_handle(cl_state *st, PyObject *obj, const char *func, const char *param,
                     cudaStream_t *handle, int *device);

/* ---- CUDA graphs (graph.c) ------------------------------------------------- */

int cl_graph_init(PyObject *module, cl_state *st);
/* The CUDAGraph capturing on `s` in this thread, or NULL (borrowed). */
PyObject *cl_graph_capturing(cudaStream_t s);
/* Memory `ptr` was just allocated on `s`: during capture the graph owns it;
 * returns a new reference to the graph then, else NULL. Never raises. */
PyObject *cl_graph_adopt(cudaStream_t s, void *ptr);
/* An array whose memory a graph owns dies (from dealloc). Never raises. */
void cl_graph_release(PyObject *graph, void *ptr);

/* True while this thread is capturing a CUDA graph (any stream). */
bool cl_graph_thread_capturing(void);

/* ---- memory (memory.c) --------------------------------------------------- */

extern PyMethodDef cl_memory_methods[];
/* Allocate from the device's pool on `stream`. nbytes == 0 gives NULL.
 * Enforces the per-process limit; on failure trims the pool, retries once,
 * then raises OutOfMemoryError. Returns 0 or -1. */
int cl_malloc(cl_state *st, const char *func, int device, size_t nbytes, cudaStream_t stream,
              void **out);
/* Stream-ordered free; never raises (called from dealloc). */
void cl_free(cl_state *st, int device, void *ptr, size_t nbytes, cudaStream_t stream);
/* cl_free after making `stream` wait for the work on `used` streams (or the
 * whole device when `overflow`). Never raises. */
void cl_free_after(cl_state *st, int device, void *ptr, size_t nbytes, cudaStream_t stream,
                   const cudaStream_t *used, int num_used, bool overflow);

/* True when `ptr` lies in page-locked host memory (cudaHostAlloc or
 * registered); never raises. */
bool cl_host_is_pinned(const void *ptr);

/* ---- creation (creation.c) ----------------------------------------------- */

extern PyMethodDef cl_creation_methods[];
/* Parse a shape argument (int or sequence of ints). */
int cl_parse_shape(PyObject *obj, const char *func, const char *param, int *ndim,
                   Py_ssize_t *shape);

/* ---- profiler (profiler.c) ---------------------------------------------------
 *
 * Every op entry point brackets its work so cudalab.profiler can record it and
 * Nsight Systems sees it as an NVTX range:
 *
 *     cl_prof_scope ps;
 *     cl_prof_begin(st, &ps, "add", device);   // device: the op's, or CL_PROF_CURRENT_DEVICE
 *     ... enqueue the work on the current stream of `device` ...
 *     if (CL_PROF_ACTIVE(&ps)) {
 *         cl_prof_info info = {...};            // built only when someone listens
 *         cl_prof_end(st, &ps, ok ? &info : NULL);   // NULL: the op failed
 *     }
 *
 * With the profiler off and no NVTX tool attached, that is a copy of one int
 * and two well-predicted branches: no calls, no allocation. cl_prof_end must
 * run on every path after cl_prof_begin (it pops the NVTX range). */

#define CL_PROF_RECORD 1          /* a cudalab.profiler.profile() is recording */
#define CL_PROF_NVTX 2            /* NVTX ranges are emitted */
#define CL_PROF_CURRENT_DEVICE (-2) /* cl_prof_begin: the current device */
#define CL_PROF_MAX_INPUTS 3

typedef struct cl_prof_scope {
    int flags;          /* st->prof_flags when the op began; 0: nothing to do */
    int session;        /* the profile it began in */
    const char *name;
    int device;         /* -1: none (host-only) */
    cudaStream_t stream;
    int ev_start;       /* index in the device's event pool, -1: no GPU time */
    int ev_end;         /* recorded early by cl_prof_gpu_done, else -1 */
    bool capturing;     /* the stream was being captured into a CUDA graph */
    int64_t host_start_ns;
} cl_prof_scope;

/* What the record says about the op (only built when CL_PROF_ACTIVE). */
typedef struct cl_prof_info {
    int dtype;        /* the cl_dtype the op works in, -1 unknown */
    int64_t bytes;    /* bytes moved (read + written), -1 unknown */
    int64_t flops;    /* floating-point operations, -1 unknown */
    int ninputs;      /* array operands whose shapes are recorded */
    const DeviceArray *inputs[CL_PROF_MAX_INPUTS];
    int out_ndim;     /* result shape; -1 unknown */
    const Py_ssize_t *out_shape;
} cl_prof_info;

void cl_prof_begin_slow(cl_state *st, cl_prof_scope *s, const char *name, int device);
void cl_prof_gpu_done_slow(cl_state *st, cl_prof_scope *s);
void cl_prof_end_slow(cl_state *st, cl_prof_scope *s, const cl_prof_info *info);

#define CL_PROF_ACTIVE(s) __builtin_expect((s)->flags != 0, 0)

static inline void
cl_prof_begin(cl_state *st, cl_prof_scope *s, const char *name, int device)
{
    s->flags = st->prof_flags;
    if (CL_PROF_ACTIVE(s)) {
        cl_prof_begin_slow(st, s, name, device);
    }
}

/* The op's GPU work is all enqueued: record the end event now, before the
 * op waits for it on the host (get, asarray), so the wait is not GPU time. */
static inline void
cl_prof_gpu_done(cl_state *st, cl_prof_scope *s)
{
    if (CL_PROF_ACTIVE(s)) {
        cl_prof_gpu_done_slow(st, s);
    }
}

static inline void
cl_prof_end(cl_state *st, cl_prof_scope *s, const cl_prof_info *info)
{
    if (CL_PROF_ACTIVE(s)) {
        cl_prof_end_slow(st, s, info);
    }
}

/* Bytes of an array's elements (size x itemsize). */
static inline int64_t
cl_prof_nbytes(const DeviceArray *a)
{
    return (int64_t)cl_array_size(a) * (int64_t)cl_itemsize(a->dtype);
}

int cl_profiler_init(PyObject *module, cl_state *st);
void cl_profiler_free(cl_state *st);

/* ---- compute ops (one file each; module.c adds every table) ---------------- */

extern PyMethodDef cl_elementwise_methods[]; /* ops_elementwise.c */
extern PyMethodDef cl_reduce_methods[];      /* ops_reduce.c */
extern PyMethodDef cl_transpose_methods[];   /* ops_transpose.c */
extern PyMethodDef cl_random_methods[];      /* ops_random.c */
extern PyMethodDef cl_blas_methods[];        /* blas.c */
extern PyMethodDef cl_interop_methods[];     /* interop.c */
extern PyMethodDef cl_timing_methods[];      /* ops_timing.c */

/* ---- interop (interop.c): DLPack and the CUDA Array Interface -------------- */

/* DeviceArray.__cuda_array_interface__, __dlpack__, __dlpack_device__. */
PyObject *cl_array_cuda_array_interface(DeviceArray *self, void *closure);
PyObject *cl_array_dlpack(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames);
PyObject *cl_array_dlpack_device(DeviceArray *self, PyObject *unused);
/* asarray's import of a foreign device array (DLPack producer on a CUDA
 * device, else __cuda_array_interface__): 1 with *out set, 0 when `obj` is
 * neither (nothing raised), -1 on error. */
int cl_import_device_object(cl_state *st, PyObject *obj, const char *func, PyObject **out);

/* DeviceArray's number protocol (array.c's slots point here). Binary slots
 * receive operands in either order and return Py_NotImplemented for types
 * they do not handle. ops_elementwise.c: */
PyObject *cl_nb_add(PyObject *a, PyObject *b);
PyObject *cl_nb_subtract(PyObject *a, PyObject *b);
PyObject *cl_nb_multiply(PyObject *a, PyObject *b);
PyObject *cl_nb_true_divide(PyObject *a, PyObject *b);
PyObject *cl_nb_inplace_add(PyObject *a, PyObject *b);
PyObject *cl_nb_inplace_subtract(PyObject *a, PyObject *b);
PyObject *cl_nb_inplace_multiply(PyObject *a, PyObject *b);
PyObject *cl_nb_inplace_true_divide(PyObject *a, PyObject *b);
PyObject *cl_nb_negative(PyObject *a);
PyObject *cl_nb_absolute(PyObject *a);
/* blas.c: */
PyObject *cl_nb_matrix_multiply(PyObject *a, PyObject *b);

/* ---- helpers --------------------------------------------------------------- */

/* Map FASTCALL positional + keyword arguments onto `names` (NULL-terminated);
 * the first `nrequired` must be given, the others come back NULL when absent. */
int cl_parse_args(const char *func, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                  const char *const *names, int nrequired, PyObject **out);

/* A METH_FASTCALL | METH_KEYWORDS table entry for function `name` with docstring `name##_doc`. */
#define CL_FASTCALL(name) \
    {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL | METH_KEYWORDS, name##_doc}

/* Run `stmt` with the GIL released (for anything that may block). */
#define CL_WITHOUT_GIL(stmt)                                                      \
    do {                                                                          \
        Py_BEGIN_ALLOW_THREADS stmt;                                              \
        Py_END_ALLOW_THREADS                                                      \
    } while (0)

#endif /* CUDALAB_CORE_H */
