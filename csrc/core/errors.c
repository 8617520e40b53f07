/* The exception hierarchy (DESIGN.md) and the helpers every file raises with.
 *
 *   CudalabError(RuntimeError)          base of CUDA-side failures
 *     CudaError                         a cudaError_t: .code .name .expression .file .line
 *     CublasError                       a cublasStatus_t, same attributes
 *     OutOfMemoryError(.., MemoryError) .requested .allocated .reserved .free .total .limit
 *     NoDeviceError                     no GPU or no driver
 *     DistributedError                  rendezvous, timeouts, an aborted communicator
 *       NcclError                       an ncclResult_t, same attributes as CudaError
 *
 * Bad arguments are plain TypeError/ValueError whose message starts with
 * "<func>() argument '<param>': ". */
#include "core/core.h"
#include <stdarg.h>
#include <stdlib.h>

static PyObject *
new_exception(PyObject *module, const char *name, const char *doc, PyObject *bases)
{
    char qualified[64];
    snprintf(qualified, sizeof(qualified), "cudalab.%s", name);
    PyObject *exc = PyErr_NewExceptionWithDoc(qualified, doc, bases, NULL);
    if (exc == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, name, exc) < 0) {
        Py_DECREF(exc);
        return NULL;
    }
    return exc;
}

int
cl_errors_init(PyObject *module, cl_state *st)
{
    st->CudalabError = new_exception(module, "CudalabError",
        "Base class of the errors cudalab raises for CUDA-side failures.", PyExc_RuntimeError);
    if (st->CudalabError == NULL) {
        return -1;
    }
    st->CudaError = new_exception(module, "CudaError",
        "A CUDA runtime call failed.\n\nAttributes: code (the cudaError_t value), name\n"
        "(e.g. 'cudaErrorInvalidValue'), expression, file, line.", st->CudalabError);
    st->CublasError = new_exception(module, "CublasError",
        "A cuBLAS or cuBLASLt call failed.\n\nAttributes: code (the cublasStatus_t value),\n"
        "name, expression, file, line.", st->CudalabError);
    st->NoDeviceError = new_exception(module, "NoDeviceError",
        "No CUDA device (or no driver) is available for a call that needs one.",
        st->CudalabError);
    if (st->CudaError == NULL || st->CublasError == NULL || st->NoDeviceError == NULL) {
        return -1;
    }
    st->DistributedError = new_exception(module, "DistributedError",
        "A multi-process or multi-GPU operation failed: the rendezvous, a peer that\n"
        "died or hung (the watchdog's timeout), a communicator that was aborted.",
        st->CudalabError);
    if (st->DistributedError == NULL) {
        return -1;
    }
    st->NcclError = new_exception(module, "NcclError",
        "An NCCL call failed.\n\nAttributes: code (the ncclResult_t value), name\n"
        "(e.g. 'ncclInvalidUsage'), expression, file, line.", st->DistributedError);
    if (st->NcclError == NULL) {
        return -1;
    }
    PyObject *bases = PyTuple_Pack(2, st->CudalabError, PyExc_MemoryError);
    if (bases == NULL) {
        return -1;
    }
    st->OutOfMemoryError = new_exception(module, "OutOfMemoryError",
        "The device (or the per-process limit) could not satisfy an allocation.\n\n"
        "Also a MemoryError. Attributes, in bytes: requested, allocated, reserved,\n"
        "free, total, limit; and device.", bases);
    Py_DECREF(bases);
    return st->OutOfMemoryError == NULL ? -1 : 0;
}

/* Raise `type(message)` with integer/string attributes set from `attrs`. */
static int
raise_with_attrs(PyObject *type, PyObject *message, PyObject *attrs)
{
    if (message == NULL || attrs == NULL) {
        Py_XDECREF(message);
        Py_XDECREF(attrs);
        return -1;
    }
    PyObject *exc = PyObject_CallOneArg(type, message);
    Py_DECREF(message);
    if (exc == NULL) {
        Py_DECREF(attrs);
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(attrs, &pos, &key, &value)) {
        if (PyObject_SetAttr(exc, key, value) < 0) {
            Py_DECREF(attrs);
            Py_DECREF(exc);
            return -1;
        }
    }
    Py_DECREF(attrs);
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
    return -1;
}

int
cl_raise_cuda(cl_state *st, cudaError_t err, const char *expr, const char *file, int line)
{
    /* Non-sticky errors stay in the runtime's "last error" slot; clear it so
     * the next, unrelated check does not see it again. */
    (void)cudaGetLastError();
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
        return cl_raise_no_device(st, NULL);
    }
    if (err == cudaErrorMemoryAllocation) {
        /* Reaching here means an allocation outside the pool path failed. */
        PyErr_Format(st->OutOfMemoryError, "CUDA out of memory in %s (%s:%d)", expr, file, line);
        return -1;
    }
    return cl_raise_status(st->CudaError, (int)err, cudaGetErrorName(err),
                           cudaGetErrorString(err), expr, file, line);
}

int
cl_raise_status(PyObject *type, int code, const char *name, const char *text, const char *expr,
                const char *file, int line)
{
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    PyObject *message = PyUnicode_FromFormat("%s (%d): %s\n  in %s at %s:%d", name, code, text,
                                             expr, base, line);
    PyObject *attrs = Py_BuildValue("{s:i,s:s,s:s,s:s,s:i}", "code", code, "name", name,
                                    "expression", expr, "file", base, "line", line);
    return raise_with_attrs(type, message, attrs);
}

/* Why no device is usable, in the words `cudalab check` uses: a missing
 * driver (libcuda.so.1 absent, or the toolkit's stub in its place) is told
 * apart from a driver too old for the runtime we were built with, which the
 * runtime reports with the same cudaErrorInsufficientDriver. */
static void
no_device_reason(cudaError_t err, char *buf, size_t size)
{
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) {
        (void)cudaGetLastError();
        driver = 0;
    }
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (err == cudaErrorStubLibrary) {
        snprintf(buf, size, "no NVIDIA driver was found (the libcuda.so.1 that was loaded is "
                            "the CUDA toolkit's stub library, not a driver)");
    }
    else if (driver == 0) {
        snprintf(buf, size, "no NVIDIA driver was found (libcuda.so.1 could not be loaded)");
    }
    else if (err == cudaErrorInsufficientDriver && driver < CUDART_VERSION) {
        snprintf(buf, size, "the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d "
                            "runtime cudalab was built with; update the driver",
                 driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000,
                 CUDART_VERSION % 1000 / 10);
    }
    else if (err == cudaErrorNoDevice && visible != NULL) {
        snprintf(buf, size, "the driver sees no CUDA device (CUDA_VISIBLE_DEVICES=%.40s)",
                 visible);
    }
    else if (err == cudaErrorNoDevice || err == cudaSuccess) {
        snprintf(buf, size, "the driver sees no CUDA device");
    }
    else {
        snprintf(buf, size, "%s (%s)", cudaGetErrorString(err), cudaGetErrorName(err));
    }
}

int
cl_raise_no_device(cl_state *st, const char *func)
{
    char why[256];
    (void)cl_device_count(st); /* sets device_count_error on first use */
    no_device_reason(st->device_count_error, why, sizeof why);
    if (func != NULL) {
        PyErr_Format(st->NoDeviceError, "%s(): no CUDA device is available: %s", func, why);
    }
    else {
        PyErr_Format(st->NoDeviceError, "no CUDA device is available: %s", why);
    }
    return -1;
}

/* "1.50 GiB": the unit PyTorch's messages use. */
static void
format_bytes(char *buf, size_t size, size_t n)
{
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    double value = (double)n;
    int unit = 0;
    while (value >= 1024.0 && unit < 4) {
        value /= 1024.0;
        unit++;
    }
    if (unit == 0) {
        snprintf(buf, size, "%zu bytes", n);
    }
    else {
        snprintf(buf, size, "%.2f %s", value, units[unit]);
    }
}

int
cl_raise_oom(cl_state *st, int device, size_t requested, size_t allocated, size_t reserved,
             size_t free_bytes, size_t total, size_t limit, int limit_reason)
{
    char req[32], alloc[32], res[32], fre[32], tot[32], lim[32];
    format_bytes(req, sizeof req, requested);
    format_bytes(alloc, sizeof alloc, allocated);
    format_bytes(res, sizeof res, reserved > allocated ? reserved - allocated : 0);
    format_bytes(fre, sizeof fre, free_bytes);
    format_bytes(tot, sizeof tot, total);
    format_bytes(lim, sizeof lim, limit);
    PyObject *message = PyUnicode_FromFormat(
        "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which "
        "%s is free. Of the allocated memory %s is allocated by cudalab, and %s is reserved by "
        "cudalab but unallocated.%s%s%s",
        req, device, tot, fre, alloc, res,
        limit_reason ? " The per-process memory limit of " : "", limit_reason ? lim : "",
        limit_reason ? " (set_per_process_memory_fraction) would be exceeded." : "");
    PyObject *attrs = Py_BuildValue("{s:i,s:n,s:n,s:n,s:n,s:n,s:n}", "device", device,
                                    "requested", (Py_ssize_t)requested,
                                    "allocated", (Py_ssize_t)allocated,
                                    "reserved", (Py_ssize_t)reserved,
                                    "free", (Py_ssize_t)free_bytes,
                                    "total", (Py_ssize_t)total,
                                    "limit", (Py_ssize_t)limit);
    return raise_with_attrs(st->OutOfMemoryError, message, attrs);
}

int
cl_arg_error(PyObject *exc_type, const char *func, const char *param, const char *fmt, ...)
{
    va_list va;
    va_start(va, fmt);
    PyObject *detail = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (detail == NULL) {
        return -1;
    }
    PyErr_Format(exc_type, "%s() argument '%s': %U", func, param, detail);
    Py_DECREF(detail);
    return -1;
}

int
cl_expected_type_error(const char *func, const char *param, const char *expected, PyObject *obj)
{
    return cl_arg_error(PyExc_TypeError, func, param, "expected %s, got %.100s", expected,
                        Py_TYPE(obj)->tp_name);
}

int
cl_expected_array_error(const char *func, const char *param, PyObject *obj, bool or_none)
{
    return cl_arg_error(PyExc_TypeError, func, param,
                        "expected a cudalab.DeviceArray%s, got %.100s (copy host data to the "
                        "device with cudalab.asarray())",
                        or_none ? " or None" : "", Py_TYPE(obj)->tp_name);
}
