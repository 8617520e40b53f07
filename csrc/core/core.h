/* core/: what every other part of the extension stands on.
 *
 *   state.c     the module state's accessors and its device count
 *   errors.c    the exception hierarchy and the helpers that raise it
 *   args.c      FASTCALL argument parsing, ints, reals and shapes
 *   dtype.c     NumPy dtype <-> cl_dtype, item sizes, the casting table
 */
#ifndef CUDALAB_CORE_CORE_H
#define CUDALAB_CORE_CORE_H

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
    /* Access from this device to another's memory (runtime/peer.c):
     * CL_PEER_* by peer device index. */
    signed char peer_access[CL_MAX_DEVICES];
} cl_device_state;

#define CL_PEER_UNTOUCHED 0  /* the first copy between the two turns it on, as torch does */
#define CL_PEER_ON 1
#define CL_PEER_OFF (-1)     /* disable_peer_access(): copies stay staged */
#define CL_PEER_NONE (-2)    /* the hardware cannot */

typedef struct cl_state {
    PyTypeObject *DeviceArray_Type;
    PyTypeObject *Stream_Type;   /* runtime/stream.c */
    PyTypeObject *Event_Type;    /* runtime/stream.c */
    PyTypeObject *CUDAGraph_Type; /* runtime/graph.c */
    PyTypeObject *NcclComm_Type;  /* dist/comm.c */
    PyObject *CudalabError;
    PyObject *CudaError;
    PyObject *CublasError;
    PyObject *OutOfMemoryError;
    PyObject *NoDeviceError;
    PyObject *DistributedError;
    PyObject *NcclError;
    PyArray_Descr *descr[CL_NUM_DTYPES]; /* canonical NumPy dtype of each cl_dtype */
    PyObject *bfloat16_type;             /* ml_dtypes.bfloat16 */
    int device_count;                    /* -1 until first asked */
    cudaError_t device_count_error;      /* why device_count is 0, if it is */
    cl_device_state devices[CL_MAX_DEVICES];
    /* Profiler (prof/profiler.c): CL_PROF_* bits every op tests, and the state
     * behind them (allocated on first use). */
    int prof_flags;
    struct cl_prof_state *prof;
} cl_state;

/* state.c (module.c creates and fills the state) */
cl_state *cl_state_from_module(PyObject *module);
cl_state *cl_state_from_type(PyTypeObject *type);
/* Number of usable devices (0 without GPU or driver), asked once; never raises. */
int cl_device_count(cl_state *st);

/* ---- errors (errors.c) --------------------------------------------------- */

int cl_errors_init(PyObject *module, cl_state *st);
/* Raise CudaError for `err` (which is cleared from the runtime). Returns -1. */
int cl_raise_cuda(cl_state *st, cudaError_t err, const char *expr, const char *file, int line);
/* Raise `type` (CudaError, CublasError) for a failed library call; the
 * exception carries code, name, expression, file and line. Returns -1. */
int cl_raise_status(PyObject *type, int code, const char *name, const char *text, const char *expr,
                    const char *file, int line);
/* NoDeviceError "<func>(): no CUDA device is available: <why>", why in the
 * words `cudalab check` uses (no driver, the toolkit's stub, a driver too old,
 * no device visible). func NULL: no prefix. Returns -1. */
int cl_raise_no_device(cl_state *st, const char *func);
/* OutOfMemoryError with a message a PyTorch user recognizes; `limit_reason`
 * non-zero when our per-process limit (not the driver) refused. */
int cl_raise_oom(cl_state *st, int device, size_t requested, size_t allocated, size_t reserved,
                 size_t free_bytes, size_t total, size_t limit, int limit_reason);
/* TypeError/ValueError with the "<func>() argument '<param>': ..." prefix. */
int cl_arg_error(PyObject *exc_type, const char *func, const char *param, const char *fmt, ...);
/* TypeError "<func>() argument '<param>': expected <expected>, got <type>";
 * `expected` reads like "an int" or "a Stream". Returns -1. */
int cl_expected_type_error(const char *func, const char *param, const char *expected,
                           PyObject *obj);
/* TypeError for an argument that must be a DeviceArray (or None), with the
 * asarray() hint every such message carries. Returns -1. */
int cl_expected_array_error(const char *func, const char *param, PyObject *obj, bool or_none);

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

/* ---- helpers --------------------------------------------------------------- */

/* Map FASTCALL positional + keyword arguments onto `names` (NULL-terminated);
 * the first `nrequired` must be given, the others come back NULL when absent. */
int cl_parse_args(const char *func, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                  const char *const *names, int nrequired, PyObject **out);

/* A finite real number (int, float, NumPy real scalar; not complex or str):
 * TypeError or ValueError naming func and param otherwise. */
int cl_parse_real(PyObject *obj, const char *func, const char *param, double *out);
/* Parse an index argument: Python int (not bool), returned as Py_ssize_t. */
int cl_parse_index(PyObject *obj, const char *func, const char *param, Py_ssize_t *out);
/* Parse a shape argument (int or sequence of ints). */
int cl_parse_shape(PyObject *obj, const char *func, const char *param, int *ndim,
                   Py_ssize_t *shape);

/* A METH_FASTCALL | METH_KEYWORDS table entry for function `name` with docstring `name##_doc`. */
#define CL_FASTCALL(name) \
    {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL | METH_KEYWORDS, name##_doc}

/* Run `stmt` with the GIL released (for anything that may block). */
#define CL_WITHOUT_GIL(stmt)                                                      \
    do {                                                                          \
        Py_BEGIN_ALLOW_THREADS stmt;                                              \
        Py_END_ALLOW_THREADS                                                      \
    } while (0)

/* ---- dtype (dtype.c) ----------------------------------------------------- */

int cl_dtype_init(PyObject *module, cl_state *st);
/* NumPy descr -> cl_dtype; -1 if unsupported (no exception set). */
int cl_dtype_from_descr(cl_state *st, PyArray_Descr *descr);
/* Any dtype-like object -> cl_dtype; raises TypeError naming func/param. */
int cl_dtype_converter(cl_state *st, PyObject *obj, const char *func, const char *param,
                       cl_dtype *out);
const char *cl_dtype_name(cl_dtype dtype);
size_t cl_itemsize(cl_dtype dtype);
/* np.can_cast(from, to, "same_kind"). */
bool cl_can_cast_same_kind(cl_dtype from, cl_dtype to);
PyObject *cl_supported_dtypes_text(void);
/* `x` as one element of integer dtype `dtype` (int8 .. int64, not bool),
 * written to `out`, by the device's saturating rule (cuda/dtype_convert.cuh):
 * truncate toward zero, clamp to the dtype's range, NaN -> 0. */
void cl_float_to_int_bytes(double x, cl_dtype dtype, void *out);

/* Dtype classes, one definition for every file. */
static inline bool
cl_dtype_is_float(cl_dtype d)
{
    return d == CL_FLOAT16 || d == CL_BFLOAT16 || d == CL_FLOAT32 || d == CL_FLOAT64;
}

static inline bool
cl_dtype_is_int(cl_dtype d)
{
    return d == CL_INT8 || d == CL_UINT8 || d == CL_INT32 || d == CL_INT64;
}

#endif /* CUDALAB_CORE_CORE_H */
