/* Device query and selection: is_available, device_count, current_device,
 * set_device, synchronize, runtime/driver versions and the raw properties
 * behind cudalab.get_device_properties. Nothing here raises without a GPU
 * except the calls that need one (NoDeviceError). */
#include "runtime/runtime.h"
#include "core/core.h"

int
cl_require_device(cl_state *st, const char *func)
{
    return cl_device_count(st) > 0 ? 0 : cl_raise_no_device(st, func);
}

int
cl_current_device(cl_state *st, int *device)
{
    CL_CUDA_CHECK(st, cudaGetDevice(device));
    return 0;
fail:
    return -1;
}

int
cl_device_enter(cl_state *st, int device, int *previous)
{
    CL_CUDA_CHECK(st, cudaGetDevice(previous));
    if (*previous != device) {
        CL_CUDA_CHECK(st, cudaSetDevice(device));
    }
    return 0;
fail:
    return -1;
}

int
cl_device_enter_quiet(int device)
{
    int previous = device;
    if (cudaGetDevice(&previous) != cudaSuccess) {
        (void)cudaGetLastError();
        return device;
    }
    if (previous != device && cudaSetDevice(device) != cudaSuccess) {
        (void)cudaGetLastError();
    }
    return previous;
}

void
cl_device_exit(int device, int previous)
{
    if (device != previous) {
        (void)cudaSetDevice(previous);
    }
}

/* The checks of a device index that need no GPU: an int (not a bool), >= 0. */
static int
check_device_index(PyObject *obj, const char *func, Py_ssize_t *index)
{
    if (cl_parse_index(obj, func, "device", index) < 0) {
        return -1;
    }
    if (*index < 0) {
        return cl_arg_error(PyExc_ValueError, func, "device",
                            "must be a non-negative device index, got %zd", *index);
    }
    return 0;
}

int
cl_parse_device(cl_state *st, PyObject *obj, const char *func, int *device)
{
    if (obj == NULL || obj == Py_None) {
        if (cl_require_device(st, func) < 0) {
            return -1;
        }
        return cl_current_device(st, device);
    }
    Py_ssize_t index;
    if (check_device_index(obj, func, &index) < 0 || cl_require_device(st, func) < 0) {
        return -1;
    }
    if (index >= st->device_count) {
        return cl_arg_error(PyExc_ValueError, func, "device",
                            "device %zd does not exist (%d device%s visible)", index,
                            st->device_count, st->device_count == 1 ? "" : "s");
    }
    *device = (int)index;
    return 0;
}

int
cl_parse_device_spec(cl_state *st, PyObject *obj, const char *func, int *device)
{
    if (!PyUnicode_Check(obj)) {
        if (obj == Py_None) {
            return cl_expected_type_error(func, "device", "an int or 'cuda:N'", obj);
        }
        return cl_parse_device(st, obj, func, device);
    }
    const char *text = PyUnicode_AsUTF8(obj);
    if (text == NULL) {
        return -1;
    }
    if (strcmp(text, "cuda") == 0) {
        return cl_parse_device(st, Py_None, func, device);
    }
    /* "cuda:" and then decimal digits only (no sign, no spaces). */
    const char *digits = strncmp(text, "cuda:", 5) == 0 ? text + 5 : "";
    size_t n = strspn(digits, "0123456789");
    if (n == 0 || n > 4 || digits[n] != '\0') {
        return cl_arg_error(PyExc_ValueError, func, "device",
                            "expected a device index, 'cuda' or 'cuda:N', got %R", obj);
    }
    PyObject *as_int = PyLong_FromString(digits, NULL, 10);
    int rc = as_int == NULL ? -1 : cl_parse_device(st, as_int, func, device);
    Py_XDECREF(as_int);
    return rc;
}

int
cl_parse_device_arg(cl_state *st, const char *func, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames, bool required, int *device)
{
    static const char *const names[] = {"device", NULL};
    PyObject *argv[1];
    if (cl_parse_args(func, args, nargs, kwnames, names, required ? 1 : 0, argv) < 0) {
        return -1;
    }
    return cl_parse_device(st, argv[0], func, device);
}

/* ---- Python functions ------------------------------------------------------ */

PyDoc_STRVAR(is_available_doc,
"is_available()\n--\n\n"
"Whether a CUDA device and a working driver are present.\n\n"
"Never raises: without a GPU or driver it returns False.");

static PyObject *
is_available(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(cl_device_count(cl_state_from_module(module)) > 0);
}

PyDoc_STRVAR(device_count_doc,
"device_count()\n--\n\n"
"Number of visible CUDA devices (0 without a GPU or driver; never raises).");

static PyObject *
device_count(PyObject *module, PyObject *unused)
{
    return PyLong_FromLong(cl_device_count(cl_state_from_module(module)));
}

PyDoc_STRVAR(current_device_doc,
"current_device()\n--\n\n"
"Index of the calling thread's current device.");

static PyObject *
current_device(PyObject *module, PyObject *unused)
{
    cl_state *st = cl_state_from_module(module);
    int device;
    if (cl_require_device(st, "current_device") < 0 || cl_current_device(st, &device) < 0) {
        return NULL;
    }
    return PyLong_FromLong(device);
}

PyDoc_STRVAR(set_device_doc,
"set_device(device)\n--\n\n"
"Make `device` the calling thread's current device.\n\n"
"Parameters\n----------\n"
"device : int\n    Index in ``range(device_count())``.");

static PyObject *
set_device(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"device", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[1];
    int device;
    if (cl_parse_args("set_device", args, nargs, kwnames, names, 1, argv) < 0) {
        return NULL;
    }
    if (argv[0] == Py_None) {
        return cl_expected_type_error("set_device", "device", "an int", argv[0]), NULL;
    }
    if (cl_parse_device(st, argv[0], "set_device", &device) < 0) {
        return NULL;
    }
    CL_CUDA_CHECK(st, cudaSetDevice(device));
    Py_RETURN_NONE;
fail:
    return NULL;
}

PyDoc_STRVAR(synchronize_doc,
"synchronize(device=None)\n--\n\n"
"Wait for all work on `device` (default: the current one) to finish.\n\n"
"The GIL is released while waiting.");

static PyObject *
synchronize(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    int device, previous;
    cudaError_t err = cudaSuccess;
    if (cl_parse_device_arg(st, "synchronize", args, nargs, kwnames, false, &device) < 0 ||
        cl_refuse_while_capturing(st, "synchronize", "synchronizing the device") < 0 ||
        cl_current_device(st, &previous) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    if (device != previous) {
        err = cudaSetDevice(device);
    }
    if (err == cudaSuccess) {
        err = cudaDeviceSynchronize();
    }
    if (device != previous) {
        (void)cudaSetDevice(previous);
    }
    Py_END_ALLOW_THREADS
    CL_CUDA_CHECK(st, err);
    Py_RETURN_NONE;
fail:
    return NULL;
}

PyDoc_STRVAR(runtime_version_doc,
"runtime_version()\n--\n\n"
"The CUDA runtime version cudalab was built with, e.g. 13000 for 13.0.");

/* What `query` reports, or `fallback` when it fails. */
static PyObject *
version_or(cudaError_t (*query)(int *), int fallback)
{
    int version = 0;
    if (query(&version) != cudaSuccess) {
        (void)cudaGetLastError();
        version = fallback;
    }
    return PyLong_FromLong(version);
}

static PyObject *
runtime_version(PyObject *module, PyObject *unused)
{
    return version_or(cudaRuntimeGetVersion, CUDART_VERSION);
}

PyDoc_STRVAR(driver_version_doc,
"driver_version()\n--\n\n"
"The newest CUDA version the installed driver supports, e.g. 13000; 0 when no\n"
"driver is installed.");

static PyObject *
driver_version(PyObject *module, PyObject *unused)
{
    return version_or(cudaDriverGetVersion, 0);
}

PyDoc_STRVAR(device_properties_doc,
"_device_properties(device)\n--\n\n"
"Raw properties of `device` as a dict; cudalab.get_device_properties wraps\n"
"them in a DeviceProperties with derived peak bandwidth and FLOP/s.");

static PyObject *
device_properties(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    int device, clock_khz = 0, mem_clock_khz = 0;
    struct cudaDeviceProp prop;
    char pci[32];
    char uuid[64];
    if (cl_parse_device_arg(st, "_device_properties", args, nargs, kwnames, true, &device) < 0) {
        return NULL;
    }
    CL_CUDA_CHECK(st, cudaGetDeviceProperties(&prop, device));
    /* Clock rates left cudaDeviceProp in CUDA 13; the attributes remain. */
    CL_CUDA_CHECK(st, cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
    CL_CUDA_CHECK(st, cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, device));
    CL_CUDA_CHECK(st, cudaDeviceGetPCIBusId(pci, (int)sizeof pci, device));
    {
        const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
        snprintf(uuid, sizeof uuid,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                 u[12], u[13], u[14], u[15]);
    }
    return Py_BuildValue(
        "{s:s,s:i,s:i,s:n,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:n,s:n,s:n,s:i,s:i,s:s,s:s,s:O,s:O,s:i,s:O}",
        "name", prop.name,
        "major", prop.major,
        "minor", prop.minor,
        "total_memory", (Py_ssize_t)prop.totalGlobalMem,
        "multi_processor_count", prop.multiProcessorCount,
        "l2_cache_size", prop.l2CacheSize,
        "clock_rate_khz", clock_khz,
        "memory_clock_rate_khz", mem_clock_khz,
        "memory_bus_width", prop.memoryBusWidth,
        "max_threads_per_block", prop.maxThreadsPerBlock,
        "max_threads_per_multi_processor", prop.maxThreadsPerMultiProcessor,
        "shared_memory_per_block", (Py_ssize_t)prop.sharedMemPerBlock,
        "shared_memory_per_block_optin", (Py_ssize_t)prop.sharedMemPerBlockOptin,
        "shared_memory_per_multiprocessor", (Py_ssize_t)prop.sharedMemPerMultiprocessor,
        "regs_per_multiprocessor", prop.regsPerMultiprocessor,
        "warp_size", prop.warpSize,
        "pci_bus_id", pci,
        "uuid", uuid,
        "ecc_enabled", prop.ECCEnabled ? Py_True : Py_False,
        "integrated", prop.integrated ? Py_True : Py_False,
        "async_engine_count", prop.asyncEngineCount,
        "concurrent_kernels", prop.concurrentKernels ? Py_True : Py_False);
fail:
    return NULL;
}

/* ---- private helpers for the Python package's wrappers ------------------------
 *
 * A wrapper written in Python (cudalab.device, get_device_properties,
 * memory_summary, ...) passes its own name as `caller`, so every error names
 * the function the user called and is raised from that function's frame. */

/* Arguments (device, caller[, ...]) of the helpers below; `caller` a str. */
static int
parse_helper_args(const char *func, const char *const *names, PyObject *const *args,
                  Py_ssize_t nargs, PyObject *kwnames, PyObject **argv, const char **caller)
{
    if (cl_parse_args(func, args, nargs, kwnames, names, 2, argv) < 0) {
        return -1;
    }
    if (!PyUnicode_Check(argv[1])) {
        return cl_expected_type_error(func, "caller", "a str", argv[1]);
    }
    *caller = PyUnicode_AsUTF8(argv[1]);
    return *caller == NULL ? -1 : 0;
}

PyDoc_STRVAR(_parse_device_doc,
"_parse_device(device, caller, check_only=False)\n--\n\n"
"Check a `device` argument the way every cudalab function does, with errors\n"
"naming `caller`.\n\n"
"Parameters\n----------\n"
"device : int or None\n    None means the current device.\n"
"caller : str\n    The public function the user called.\n"
"check_only : bool, optional\n"
"    Only check the argument's type and sign, touching no GPU; None then\n"
"    comes back as None.\n\n"
"Returns\n-------\nint or None\n    The device index.\n\n"
"Raises\n------\nTypeError, ValueError\n    A bad argument.\n"
"NoDeviceError\n    No device (unless check_only).");

static PyObject *
_parse_device(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"device", "caller", "check_only", NULL};
    PyObject *argv[3];
    const char *caller = NULL;
    int device, check_only = 0;
    if (parse_helper_args("_parse_device", names, args, nargs, kwnames, argv, &caller) < 0 ||
        (argv[2] != NULL && (check_only = PyObject_IsTrue(argv[2])) < 0)) {
        return NULL;
    }
    if (check_only) {
        Py_ssize_t index;
        if (argv[0] == Py_None) {
            Py_RETURN_NONE;
        }
        return check_device_index(argv[0], caller, &index) < 0 ? NULL
                                                                : PyLong_FromSsize_t(index);
    }
    if (cl_parse_device(cl_state_from_module(module), argv[0], caller, &device) < 0) {
        return NULL;
    }
    return PyLong_FromLong(device);
}

PyDoc_STRVAR(_parse_device_spec_doc,
"_parse_device_spec(device, caller)\n--\n\n"
"A target device as torch users write it (an int, 'cuda' for the current\n"
"device, 'cuda:N') as an index, checked as DeviceArray.to checks it; errors\n"
"name `caller`. None is refused: a move needs a target.");

static PyObject *
_parse_device_spec(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"device", "caller", NULL};
    PyObject *argv[2];
    const char *caller = NULL;
    int device;
    if (parse_helper_args("_parse_device_spec", names, args, nargs, kwnames, argv, &caller) < 0 ||
        cl_parse_device_spec(cl_state_from_module(module), argv[0], caller, &device) < 0) {
        return NULL;
    }
    return PyLong_FromLong(device);
}

PyDoc_STRVAR(_exchange_device_doc,
"_exchange_device(device, caller)\n--\n\n"
"Make `device` current and return the device that was current before\n"
"(what the cudalab.device context does on enter and exit). Errors name\n"
"`caller`.");

static PyObject *
_exchange_device(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"device", "caller", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    const char *caller = NULL;
    int device, previous;
    if (parse_helper_args("_exchange_device", names, args, nargs, kwnames, argv, &caller) < 0) {
        return NULL;
    }
    if (argv[0] == Py_None) {
        return cl_expected_type_error(caller, "device", "an int", argv[0]), NULL;
    }
    if (cl_parse_device(st, argv[0], caller, &device) < 0 ||
        cl_current_device(st, &previous) < 0) {
        return NULL;
    }
    if (device != previous) {
        CL_CUDA_CHECK(st, cudaSetDevice(device));
    }
    return PyLong_FromLong(previous);
fail:
    return NULL;
}

PyMethodDef cl_device_methods[] = {
    {"is_available", is_available, METH_NOARGS, is_available_doc},
    {"device_count", device_count, METH_NOARGS, device_count_doc},
    {"current_device", current_device, METH_NOARGS, current_device_doc},
    {"set_device", (PyCFunction)(void (*)(void))set_device, METH_FASTCALL | METH_KEYWORDS,
     set_device_doc},
    {"synchronize", (PyCFunction)(void (*)(void))synchronize, METH_FASTCALL | METH_KEYWORDS,
     synchronize_doc},
    {"runtime_version", runtime_version, METH_NOARGS, runtime_version_doc},
    {"driver_version", driver_version, METH_NOARGS, driver_version_doc},
    {"_device_properties", (PyCFunction)(void (*)(void))device_properties,
     METH_FASTCALL | METH_KEYWORDS, device_properties_doc},
    CL_FASTCALL(_parse_device),
    CL_FASTCALL(_parse_device_spec),
    CL_FASTCALL(_exchange_device),
    {NULL, NULL, 0, NULL},
};
