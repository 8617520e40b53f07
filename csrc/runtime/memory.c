/* Device memory: one stream-ordered pool per device (cudaMemPoolCreate),
 * allocations with cudaMallocFromPoolAsync, frees with cudaFreeAsync on the
 * array's stream. The release threshold is UINT64_MAX, so freed memory stays
 * in the pool (like PyTorch's caching allocator) until empty_cache() trims it.
 *
 * allocated/reserved and their peaks are the pool's own attributes; the
 * driver does not count allocations, frees, OOMs or the bytes callers asked
 * for, so cl_device_state keeps those, and the per-process limit is enforced
 * on the requested bytes before the driver is asked. */
#include "runtime/runtime.h"
#include "core/core.h"

/* Create the device's pool on first use. The device must be current. */
static int
ensure_pool(cl_state *st, int device)
{
    cl_device_state *ds = &st->devices[device];
    if (ds->pool_ready) {
        return 0;
    }
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    uint64_t keep_everything = UINT64_MAX;
    size_t free_bytes = 0;
    CL_CUDA_CHECK(st, cudaMemPoolCreate(&ds->pool, &props));
    CL_CUDA_CHECK(st, cudaMemPoolSetAttribute(ds->pool, cudaMemPoolAttrReleaseThreshold,
                                              &keep_everything));
    CL_CUDA_CHECK(st, cudaMemGetInfo(&free_bytes, &ds->total_memory));
    ds->pool_ready = true;
    return 0;
fail:
    return -1;
}

int
cl_device_pool(cl_state *st, int device, cudaMemPool_t *pool)
{
    int previous;
    if (cl_device_enter(st, device, &previous) < 0) {
        return -1;
    }
    int rc = ensure_pool(st, device);
    cl_device_exit(device, previous);
    *pool = st->devices[device].pool;
    return rc;
}

static size_t
pool_attr(cl_device_state *ds, enum cudaMemPoolAttr attr)
{
    uint64_t value = 0;
    if (!ds->pool_ready || cudaMemPoolGetAttribute(ds->pool, attr, &value) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return (size_t)value;
}

static size_t
limit_bytes(const cl_device_state *ds)
{
    return ds->fraction >= 1.0 ? ds->total_memory : (size_t)(ds->fraction * ds->total_memory);
}

static int
raise_oom(cl_state *st, int device, size_t nbytes, int limit_reason)
{
    cl_device_state *ds = &st->devices[device];
    size_t free_bytes = 0, total = ds->total_memory;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        (void)cudaGetLastError();
    }
    ds->num_ooms++;
    return cl_raise_oom(st, device, nbytes, pool_attr(ds, cudaMemPoolAttrUsedMemCurrent),
                        pool_attr(ds, cudaMemPoolAttrReservedMemCurrent), free_bytes, total,
                        limit_bytes(ds), limit_reason);
}

int
cl_malloc(cl_state *st, const char *func, int device, size_t nbytes, cudaStream_t stream,
          void **out)
{
    *out = NULL;
    if (nbytes == 0) {
        return 0;
    }
    if (ensure_pool(st, device) < 0) {
        return -1;
    }
    cl_device_state *ds = &st->devices[device];
    if (ds->fraction < 1.0 && ds->requested_current + nbytes > limit_bytes(ds)) {
        return raise_oom(st, device, nbytes, 1);
    }
    cudaError_t err = cudaMallocFromPoolAsync(out, nbytes, ds->pool, stream);
    if (err == cudaErrorMemoryAllocation && cl_graph_thread_capturing()) {
        /* The retry below synchronizes the device, which would invalidate the
         * capture: report the failure as it is. */
        (void)cudaGetLastError();
        *out = NULL;
        return raise_oom(st, device, nbytes, 0);
    }
    if (err == cudaErrorMemoryAllocation) {
        /* Let pending stream-ordered frees finish, hand the pool's cached
         * memory back to the driver, and try once more. */
        (void)cudaGetLastError();
        ds->num_alloc_retries++;
        Py_BEGIN_ALLOW_THREADS
        err = cudaDeviceSynchronize();
        Py_END_ALLOW_THREADS
        CL_CUDA_CHECK(st, err);
        CL_CUDA_CHECK(st, cudaMemPoolTrimTo(ds->pool, 0));
        err = cudaMallocFromPoolAsync(out, nbytes, ds->pool, stream);
        if (err == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            *out = NULL;
            return raise_oom(st, device, nbytes, 0);
        }
    }
    CL_CUDA_CHECK(st, err);
    ds->requested_current += nbytes;
    if (ds->requested_current > ds->requested_peak) {
        ds->requested_peak = ds->requested_current;
    }
    ds->num_allocs++;
    return 0;
fail:
    *out = NULL;
    return -1;
}

void
cl_free(cl_state *st, int device, void *ptr, size_t nbytes, cudaStream_t stream)
{
    if (ptr == NULL) {
        return;
    }
    cl_device_state *ds = &st->devices[device];
    ds->requested_current -= nbytes;
    ds->num_frees++;
    int previous = cl_device_enter_quiet(device);
    /* Errors cannot be raised from a destructor; at interpreter exit the
     * runtime may already be unloading (cudaErrorCudartUnloading). */
    if (cudaFreeAsync(ptr, stream) != cudaSuccess) {
        (void)cudaGetLastError();
    }
    cl_device_exit(device, previous);
}

void
cl_free_after(cl_state *st, int device, void *ptr, size_t nbytes, cudaStream_t stream,
              const cudaStream_t *used, int num_used, bool overflow)
{
    if (ptr != NULL && (num_used > 0 || overflow)) {
        /* Stream-safe free (record_stream): the memory goes back to the pool
         * on `stream` only after the other streams' work enqueued so far. */
        int previous = cl_device_enter_quiet(device);
        if (overflow) {
            /* Called from a DeviceArray's dealloc, which holds the GIL. */
            cudaError_t err;
            CL_WITHOUT_GIL(err = cudaDeviceSynchronize());
            if (err != cudaSuccess) {
                (void)cudaGetLastError();
            }
        }
        else {
            for (int i = 0; i < num_used; i++) {
                cudaEvent_t ev = NULL;
                if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess ||
                    cudaEventRecord(ev, used[i]) != cudaSuccess ||
                    cudaStreamWaitEvent(stream, ev, 0) != cudaSuccess) {
                    /* Cannot order the free: wait for the device instead. */
                    (void)cudaGetLastError();
                    cudaError_t err;
                    CL_WITHOUT_GIL(err = cudaDeviceSynchronize());
                    if (err != cudaSuccess) {
                        (void)cudaGetLastError();
                    }
                }
                if (ev != NULL) {
                    (void)cudaEventDestroy(ev);
                }
            }
        }
        cl_device_exit(device, previous);
    }
    cl_free(st, device, ptr, nbytes, stream);
}

/* ---- Python functions ------------------------------------------------------ */

/* Parse the optional `device` argument of a memory query and make sure the
 * device's pool exists so its attributes can be read. */
static int
parse_memory_device(cl_state *st, const char *func, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames, int *device)
{
    int previous, rc;
    if (cl_parse_device_arg(st, func, args, nargs, kwnames, false, device) < 0 ||
        cl_device_enter(st, *device, &previous) < 0) {
        return -1;
    }
    rc = ensure_pool(st, *device);
    cl_device_exit(*device, previous);
    return rc;
}

#define POOL_QUERY(pyname, attr, doc)                                                        \
    PyDoc_STRVAR(pyname##_doc, #pyname "(device=None)\n--\n\n" doc);                          \
    static PyObject *pyname(PyObject *module, PyObject *const *args, Py_ssize_t nargs,         \
                            PyObject *kwnames)                                                \
    {                                                                                         \
        cl_state *st = cl_state_from_module(module);                                          \
        int device;                                                                           \
        if (parse_memory_device(st, #pyname, args, nargs, kwnames, &device) < 0) {            \
            return NULL;                                                                      \
        }                                                                                     \
        return PyLong_FromSize_t(pool_attr(&st->devices[device], attr));                      \
    }

POOL_QUERY(memory_allocated, cudaMemPoolAttrUsedMemCurrent,
           "Bytes of device memory held by live arrays (the pool's used memory).")
POOL_QUERY(memory_reserved, cudaMemPoolAttrReservedMemCurrent,
           "Bytes the pool holds from the driver: used plus cached for reuse.")
POOL_QUERY(max_memory_allocated, cudaMemPoolAttrUsedMemHigh,
           "Peak of memory_allocated() since start or reset_peak_memory_stats().")
POOL_QUERY(max_memory_reserved, cudaMemPoolAttrReservedMemHigh,
           "Peak of memory_reserved() since start or reset_peak_memory_stats().")

PyDoc_STRVAR(reset_peak_memory_stats_doc,
"reset_peak_memory_stats(device=None)\n--\n\n"
"Reset max_memory_allocated() and max_memory_reserved() to the current values.");

static PyObject *
reset_peak_memory_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    int device;
    uint64_t zero = 0;
    if (parse_memory_device(st, "reset_peak_memory_stats", args, nargs, kwnames, &device) < 0) {
        return NULL;
    }
    cl_device_state *ds = &st->devices[device];
    /* Setting a High attribute to zero restarts it from the current value. */
    CL_CUDA_CHECK(st, cudaMemPoolSetAttribute(ds->pool, cudaMemPoolAttrUsedMemHigh, &zero));
    CL_CUDA_CHECK(st, cudaMemPoolSetAttribute(ds->pool, cudaMemPoolAttrReservedMemHigh, &zero));
    ds->requested_peak = ds->requested_current;
    Py_RETURN_NONE;
fail:
    return NULL;
}

PyDoc_STRVAR(empty_cache_doc,
"empty_cache()\n--\n\n"
"Return the pools' cached, unused memory to the driver (every device).\n\n"
"Synchronizes each device first, so memory freed on a stream is included.\n"
"Live arrays are untouched; memory_reserved() falls to about memory_allocated().");

static PyObject *
empty_cache(PyObject *module, PyObject *unused)
{
    cl_state *st = cl_state_from_module(module);
    if (cl_require_device(st, "empty_cache") < 0 ||
        cl_refuse_while_capturing(st, "empty_cache", "synchronizing the device") < 0) {
        return NULL;
    }
    for (int device = 0; device < st->device_count; device++) {
        cl_device_state *ds = &st->devices[device];
        int previous;
        cudaError_t err = cudaSuccess;
        if (!ds->pool_ready) {
            continue;
        }
        if (cl_device_enter(st, device, &previous) < 0) {
            return NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        err = cudaDeviceSynchronize();
        Py_END_ALLOW_THREADS
        if (err == cudaSuccess) {
            err = cudaMemPoolTrimTo(ds->pool, 0);
        }
        cl_device_exit(device, previous);
        CL_CUDA_CHECK(st, err);
    }
    Py_RETURN_NONE;
fail:
    return NULL;
}

static int
parse_fraction(PyObject *obj, const char *func, double *out)
{
    if (PyBool_Check(obj) || !(PyFloat_Check(obj) || PyLong_Check(obj))) {
        return cl_expected_type_error(func, "fraction", "a float", obj);
    }
    double value = PyFloat_AsDouble(obj);
    if (value == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    if (!(value > 0.0 && value <= 1.0)) {
        return cl_arg_error(PyExc_ValueError, func, "fraction",
                            "must be in the interval (0, 1], got %R", obj);
    }
    *out = value;
    return 0;
}

PyDoc_STRVAR(set_per_process_memory_fraction_doc,
"set_per_process_memory_fraction(fraction, device=None)\n--\n\n"
"Limit this process's allocations on `device` to `fraction` of its memory.\n\n"
"An allocation that would take the bytes held by live arrays past\n"
"``fraction * total`` raises OutOfMemoryError before the driver is asked.\n\n"
"Parameters\n----------\n"
"fraction : float\n    In (0, 1]; 1.0 removes the limit.\n"
"device : int, optional\n    Defaults to the current device.");

static PyObject *
set_per_process_memory_fraction(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    static const char *const names[] = {"fraction", "device", NULL};
    static const char *func = "set_per_process_memory_fraction";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    double fraction = 1.0;
    int device, previous, rc;
    if (cl_parse_args(func, args, nargs, kwnames, names, 1, argv) < 0 ||
        parse_fraction(argv[0], func, &fraction) < 0 ||
        cl_parse_device(st, argv[1], func, &device) < 0 ||
        cl_device_enter(st, device, &previous) < 0) {
        return NULL;
    }
    rc = ensure_pool(st, device);
    cl_device_exit(device, previous);
    if (rc < 0) {
        return NULL;
    }
    st->devices[device].fraction = fraction;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(get_per_process_memory_fraction_doc,
"get_per_process_memory_fraction(device=None)\n--\n\n"
"The fraction set by set_per_process_memory_fraction (1.0 when unset).");

static PyObject *
get_per_process_memory_fraction(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    int device;
    if (parse_memory_device(st, "get_per_process_memory_fraction", args, nargs, kwnames,
                            &device) < 0) {
        return NULL;
    }
    return PyFloat_FromDouble(st->devices[device].fraction);
}

/* cudaMemGetInfo on `device`, with the GIL held (it does not block). */
static int
device_mem_info(cl_state *st, int device, size_t *free_bytes, size_t *total)
{
    int previous;
    if (cl_device_enter(st, device, &previous) < 0) {
        return -1;
    }
    cudaError_t err = cudaMemGetInfo(free_bytes, total);
    cl_device_exit(device, previous);
    CL_CUDA_CHECK(st, err);
    return 0;
fail:
    return -1;
}

PyDoc_STRVAR(mem_get_info_doc,
"mem_get_info(device=None)\n--\n\n"
"(free, total) device memory in bytes as the driver reports it, counting\n"
"every process and the pools' cached memory as used.");

static PyObject *
mem_get_info(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    int device;
    size_t free_bytes, total;
    if (cl_parse_device_arg(st, "mem_get_info", args, nargs, kwnames, false, &device) < 0 ||
        device_mem_info(st, device, &free_bytes, &total) < 0) {
        return NULL;
    }
    return Py_BuildValue("(nn)", (Py_ssize_t)free_bytes, (Py_ssize_t)total);
}

PyDoc_STRVAR(memory_stats_doc,
"memory_stats(device=None)\n--\n\n"
"The device's memory statistics as a flat dict (keys as in PyTorch's\n"
"torch.cuda.memory_stats where the meaning is the same):\n\n"
"allocated_bytes.all.current/peak   pool used memory\n"
"reserved_bytes.all.current/peak    pool reserved memory\n"
"requested_bytes.all.current/peak   bytes callers asked for\n"
"allocation.all.current/allocated/freed   live / total / freed allocations\n"
"num_alloc_retries, num_ooms        retries after a failed allocation; OOMs raised\n"
"limit_bytes, fraction              the per-process limit\n"
"device_free_bytes, device_total_bytes   cudaMemGetInfo");

static PyObject *
memory_stats(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    int device;
    size_t free_bytes, total;
    if (parse_memory_device(st, "memory_stats", args, nargs, kwnames, &device) < 0 ||
        device_mem_info(st, device, &free_bytes, &total) < 0) {
        return NULL;
    }
    cl_device_state *ds = &st->devices[device];
    return Py_BuildValue(
        "{s:n,s:n,s:n,s:n,s:n,s:n,s:L,s:L,s:L,s:L,s:L,s:n,s:d,s:n,s:n}",
        "allocated_bytes.all.current", (Py_ssize_t)pool_attr(ds, cudaMemPoolAttrUsedMemCurrent),
        "allocated_bytes.all.peak", (Py_ssize_t)pool_attr(ds, cudaMemPoolAttrUsedMemHigh),
        "reserved_bytes.all.current",
        (Py_ssize_t)pool_attr(ds, cudaMemPoolAttrReservedMemCurrent),
        "reserved_bytes.all.peak", (Py_ssize_t)pool_attr(ds, cudaMemPoolAttrReservedMemHigh),
        "requested_bytes.all.current", (Py_ssize_t)ds->requested_current,
        "requested_bytes.all.peak", (Py_ssize_t)ds->requested_peak,
        "allocation.all.current", ds->num_allocs - ds->num_frees,
        "allocation.all.allocated", ds->num_allocs,
        "allocation.all.freed", ds->num_frees,
        "num_alloc_retries", ds->num_alloc_retries,
        "num_ooms", ds->num_ooms,
        "limit_bytes", (Py_ssize_t)limit_bytes(ds),
        "fraction", ds->fraction,
        "device_free_bytes", (Py_ssize_t)free_bytes,
        "device_total_bytes", (Py_ssize_t)total);
}

/* ---- pinned host memory ----------------------------------------------------- */

bool
cl_host_is_pinned(const void *ptr)
{
    struct cudaPointerAttributes attr;
    if (ptr == NULL) {
        return false;
    }
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        (void)cudaGetLastError(); /* old runtimes: "invalid value" for pageable memory */
        return false;
    }
    return attr.type == cudaMemoryTypeHost;
}

#define PINNED_CAPSULE "cudalab.pinned_host"

/* The base object of a pinned_empty() array: frees the page-locked block
 * when NumPy drops its last reference. */
static void
pinned_capsule_destructor(PyObject *capsule)
{
    void *ptr = PyCapsule_GetPointer(capsule, PINNED_CAPSULE);
    if (ptr == NULL) {
        PyErr_Clear();
        return;
    }
    /* cudaFreeHost waits for copies still reading or writing the block. At
     * interpreter exit the runtime may be unloading: ignore its error. */
    if (cudaFreeHost(ptr) != cudaSuccess) {
        (void)cudaGetLastError();
    }
}

PyDoc_STRVAR(pinned_empty_doc,
"pinned_empty(shape, dtype=float32)\n--\n\n"
"A new uninitialized C-contiguous NumPy array in page-locked (pinned) host\n"
"memory.\n\n"
"Copies between pinned memory and the device run at full PCIe/NVLink speed\n"
"and can be asynchronous: ``asarray(p, non_blocking=True)`` and\n"
"``a.get(out=p, non_blocking=True)``. The memory (cudaHostAlloc) is freed\n"
"when the array and every view of it are gone.\n\n"
"Parameters\n----------\nshape : int or tuple of int\n"
"dtype : dtype-like, optional\n    One of cudalab's dtypes (float32 by default).\n\n"
"Returns\n-------\nnumpy.ndarray\n    ``is_pinned(result)`` is True.");

static PyObject *
pinned_empty(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"shape", "dtype", NULL};
    static const char *func = "pinned_empty";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    Py_ssize_t shape[CL_MAX_NDIM];
    int ndim;
    cl_dtype dtype = CL_FLOAT32;
    void *ptr = NULL;
    if (cl_parse_args(func, args, nargs, kwnames, names, 1, argv) < 0 ||
        cl_parse_shape(argv[0], func, "shape", &ndim, shape) < 0) {
        return NULL;
    }
    if (argv[1] != NULL && argv[1] != Py_None &&
        cl_dtype_converter(st, argv[1], func, "dtype", &dtype) < 0) {
        return NULL;
    }
    size_t nbytes = cl_itemsize(dtype);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] != 0 && nbytes > (size_t)PY_SSIZE_T_MAX / (size_t)shape[i]) {
            return cl_arg_error(PyExc_ValueError, func, "shape", "array is too big"), NULL;
        }
        nbytes *= (size_t)shape[i];
    }
    if (cl_require_device(st, func) < 0 ||
        cl_refuse_while_capturing(st, func, "allocating page-locked host memory") < 0) {
        return NULL;
    }
    cudaError_t err;
    /* At least one byte, so even an empty array has a real pinned address. */
    CL_WITHOUT_GIL(err = cudaHostAlloc(&ptr, nbytes > 0 ? nbytes : 1, cudaHostAllocDefault));
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        PyErr_Format(PyExc_MemoryError,
                     "pinned_empty(): cannot allocate %zu bytes of page-locked host memory",
                     nbytes);
        return NULL;
    }
    CL_CUDA_CHECK(st, err);
    PyObject *capsule = PyCapsule_New(ptr, PINNED_CAPSULE, pinned_capsule_destructor);
    if (capsule == NULL) {
        (void)cudaFreeHost(ptr);
        return NULL;
    }
    PyArray_Descr *descr = st->descr[dtype];
    Py_INCREF(descr); /* stolen */
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, ndim, shape, NULL, ptr,
                                         NPY_ARRAY_CARRAY, NULL);
    if (arr == NULL) {
        Py_DECREF(capsule); /* frees the block */
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)arr, capsule) < 0) { /* steals capsule */
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
fail:
    return NULL;
}

PyDoc_STRVAR(is_pinned_doc,
"is_pinned(a)\n--\n\n"
"True when NumPy array `a`'s data lies in page-locked host memory (from\n"
"pinned_empty, torch's pin_memory, cudaHostAlloc or cudaHostRegister).\n\n"
"Parameters\n----------\na : numpy.ndarray\n\n"
"Returns\n-------\nbool\n    False for ordinary (pageable) memory.");

static PyObject *
is_pinned(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"a", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[1];
    if (cl_parse_args("is_pinned", args, nargs, kwnames, names, 1, argv) < 0) {
        return NULL;
    }
    if (!PyArray_Check(argv[0])) {
        return cl_expected_type_error("is_pinned", "a", "a numpy.ndarray", argv[0]), NULL;
    }
    if (cl_require_device(st, "is_pinned") < 0) {
        return NULL;
    }
    return PyBool_FromLong(cl_host_is_pinned(PyArray_DATA((PyArrayObject *)argv[0])));
}

PyMethodDef cl_memory_methods[] = {
    CL_FASTCALL(pinned_empty),
    CL_FASTCALL(is_pinned),
    CL_FASTCALL(memory_allocated),
    CL_FASTCALL(memory_reserved),
    CL_FASTCALL(max_memory_allocated),
    CL_FASTCALL(max_memory_reserved),
    CL_FASTCALL(reset_peak_memory_stats),
    {"empty_cache", empty_cache, METH_NOARGS, empty_cache_doc},
    CL_FASTCALL(set_per_process_memory_fraction),
    CL_FASTCALL(get_per_process_memory_fraction),
    CL_FASTCALL(mem_get_info),
    CL_FASTCALL(memory_stats),
    {NULL, NULL, 0, NULL},
};
