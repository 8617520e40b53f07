/* NCCL loaded at run time: the library, its function table, its errors.
 *
 * cudalab.distributed.library decides where to look (CUDALAB_NCCL_LIBRARY,
 * then the nvidia-nccl-cu13 wheel) and passes the candidates to
 * _nccl_load(), which dlopens the first that resolves every symbol and
 * falls back to the system's libnccl.so.2. The table is process-wide, like
 * the library itself: one process loads NCCL once, whatever the number of
 * communicators (and the module is single-interpreter, module.c). */
#include "dist/dist.h"
#include "core/core.h"
#include <dlfcn.h>
#include <limits.h>
#include <string.h>

static cl_nccl_api nccl_api;
static void *nccl_handle;           /* NULL until loaded */
static char nccl_path[PATH_MAX];

const cl_nccl_api *
cl_nccl_require(cl_state *st, const char *func)
{
    if (nccl_handle == NULL) {
        PyErr_Format(st->DistributedError,
                     "%s(): NCCL is not loaded; cudalab.distributed.init() (or "
                     "cudalab.distributed.library.load()) loads it first", func);
        return NULL;
    }
    return &nccl_api;
}

/* ncclResult_t names, for messages and NcclError.name. */
static const char *
result_name(int result)
{
    static const char *names[] = {"ncclSuccess",         "ncclUnhandledCudaError",
                                  "ncclSystemError",     "ncclInternalError",
                                  "ncclInvalidArgument", "ncclInvalidUsage",
                                  "ncclRemoteError",     "ncclInProgress"};
    return result >= 0 && result < (int)(sizeof names / sizeof names[0]) ? names[result]
                                                                           : "ncclUnknownError";
}

int
cl_raise_nccl(cl_state *st, int result, cl_nccl_comm_t comm, const char *expr, const char *file,
              int line)
{
    const char *text = nccl_handle != NULL ? nccl_api.GetErrorString(result) : NULL;
    const char *last = comm != NULL && nccl_api.GetLastError != NULL
                           ? nccl_api.GetLastError(comm) : NULL;
    char message[1024];
    snprintf(message, sizeof message, "%s%s%s", text != NULL ? text : "NCCL error",
             last != NULL && last[0] != '\0' ? ": " : "",
             last != NULL ? last : "");
    return cl_raise_status(st->NcclError, result, result_name(result), message, expr, file,
                           line);
}

int
cl_nccl_dtype(cl_dtype dtype)
{
    switch (dtype) {
    case CL_BOOL:
    case CL_UINT8: return CL_NCCL_UINT8;
    case CL_INT8: return CL_NCCL_INT8;
    case CL_INT32: return CL_NCCL_INT32;
    case CL_INT64: return CL_NCCL_INT64;
    case CL_FLOAT16: return CL_NCCL_FLOAT16;
    case CL_BFLOAT16: return CL_NCCL_BFLOAT16;
    case CL_FLOAT32: return CL_NCCL_FLOAT32;
    case CL_FLOAT64: return CL_NCCL_FLOAT64;
    default: return -1;
    }
}

/* Every symbol of the table from `handle`; the name of the first missing
 * one, or NULL when all resolved. */
static const char *
resolve_symbols(void *handle, cl_nccl_api *api)
{
#define SYM(field, name)                                     \
    do {                                                     \
        *(void **)&api->field = dlsym(handle, name);         \
        if (api->field == NULL) {                            \
            return name;                                     \
        }                                                    \
    } while (0)
    SYM(GetVersion, "ncclGetVersion");
    SYM(GetUniqueId, "ncclGetUniqueId");
    SYM(CommInitRank, "ncclCommInitRank");
    SYM(CommInitAll, "ncclCommInitAll");
    SYM(CommDestroy, "ncclCommDestroy");
    SYM(CommAbort, "ncclCommAbort");
    SYM(CommGetAsyncError, "ncclCommGetAsyncError");
    SYM(GetErrorString, "ncclGetErrorString");
    SYM(AllReduce, "ncclAllReduce");
    SYM(Broadcast, "ncclBroadcast");
    SYM(Reduce, "ncclReduce");
    SYM(AllGather, "ncclAllGather");
    SYM(ReduceScatter, "ncclReduceScatter");
    SYM(Send, "ncclSend");
    SYM(Recv, "ncclRecv");
    SYM(GroupStart, "ncclGroupStart");
    SYM(GroupEnd, "ncclGroupEnd");
#undef SYM
    *(void **)&api->GetLastError = dlsym(handle, "ncclGetLastError"); /* optional */
    return NULL;
}

/* dlopen `path` and resolve the table; on failure append why to `tried`. */
static bool
try_load(const char *path, PyObject *tried)
{
    cl_nccl_api api;
    void *handle;
    const char *why = NULL;
    char reason[600];
    Py_BEGIN_ALLOW_THREADS /* a library on a network file system can be slow */
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    Py_END_ALLOW_THREADS
    if (handle == NULL) {
        const char *err = dlerror();
        snprintf(reason, sizeof reason, "%s: %s", path, err != NULL ? err : "dlopen failed");
    }
    else if ((why = resolve_symbols(handle, &api)) != NULL) {
        snprintf(reason, sizeof reason, "%s: has no %s (NCCL too old?)", path, why);
        dlclose(handle);
        handle = NULL;
    }
    if (handle == NULL) {
        PyObject *line = PyUnicode_FromString(reason);
        if (line != NULL) {
            (void)PyList_Append(tried, line);
            Py_DECREF(line);
        }
        return false;
    }
    nccl_api = api;
    nccl_handle = handle;
    /* The file that really loaded, when the loader can tell (a bare soname
     * was found through the search path). */
    Dl_info info;
    const char *where = dladdr(*(void **)&api.GetVersion, &info) && info.dli_fname != NULL
                            ? info.dli_fname : path;
    snprintf(nccl_path, sizeof nccl_path, "%s", where);
    return true;
}

PyDoc_STRVAR(_nccl_load_doc,
"_nccl_load(candidates)\n--\n\n"
"Load NCCL: dlopen each path of `candidates` in order, then the system's\n"
"libnccl.so.2, keeping the first that has every function cudalab uses.\n"
"Returns the loaded file's path (at once, when NCCL is loaded already).\n"
"Raises DistributedError listing each attempt and why it failed.");

static PyObject *
_nccl_load(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"candidates", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[1], *seq = NULL, *tried = NULL;
    if (cl_parse_args("_nccl_load", args, nargs, kwnames, names, 1, argv) < 0) {
        return NULL;
    }
    if (nccl_handle != NULL) {
        return PyUnicode_DecodeFSDefault(nccl_path);
    }
    seq = PySequence_Fast(argv[0], "_nccl_load() argument 'candidates': expected a sequence "
                                   "of paths");
    tried = PyList_New(0);
    if (seq == NULL || tried == NULL) {
        goto fail;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i <= n && nccl_handle == NULL; i++) {
        PyObject *bytes = NULL;
        const char *path = "libnccl.so.2";
        if (i < n) {
            if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &bytes)) {
                goto fail;
            }
            path = PyBytes_AS_STRING(bytes);
        }
        (void)try_load(path, tried);
        Py_XDECREF(bytes);
    }
    if (nccl_handle == NULL) {
        PyObject *sep = PyUnicode_FromString("\n  ");
        PyObject *text = sep != NULL ? PyUnicode_Join(sep, tried) : NULL;
        if (text != NULL) {
            PyErr_Format(st->DistributedError, "could not load NCCL; tried:\n  %U", text);
        }
        Py_XDECREF(sep);
        Py_XDECREF(text);
        goto fail;
    }
    Py_DECREF(seq);
    Py_DECREF(tried);
    return PyUnicode_DecodeFSDefault(nccl_path);
fail:
    Py_XDECREF(seq);
    Py_XDECREF(tried);
    return NULL;
}

PyDoc_STRVAR(_nccl_library_doc,
"_nccl_library()\n--\n\nThe path of the loaded NCCL library, or None before it is loaded.");

static PyObject *
_nccl_library(PyObject *module, PyObject *unused)
{
    if (nccl_handle == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_DecodeFSDefault(nccl_path);
}

PyDoc_STRVAR(_nccl_version_doc,
"_nccl_version()\n--\n\n"
"The loaded NCCL's version code, major * 10000 + minor * 100 + patch\n"
"(22809 for 2.28.9).");

static PyObject *
_nccl_version(PyObject *module, PyObject *unused)
{
    cl_state *st = cl_state_from_module(module);
    const cl_nccl_api *api = cl_nccl_require(st, "_nccl_version");
    int version = 0, r;
    if (api == NULL) {
        return NULL;
    }
    if ((r = api->GetVersion(&version)) != CL_NCCL_SUCCESS) {
        return CL_NCCL_RAISE(st, r, NULL, "ncclGetVersion"), NULL;
    }
    return PyLong_FromLong(version);
}

PyDoc_STRVAR(_nccl_unique_id_doc,
"_nccl_unique_id()\n--\n\n"
"A new NCCL unique id (128 bytes): rank 0 makes it and the rendezvous hands it\n"
"to every rank before they create their communicators.");

static PyObject *
_nccl_unique_id(PyObject *module, PyObject *unused)
{
    cl_state *st = cl_state_from_module(module);
    const cl_nccl_api *api = cl_nccl_require(st, "_nccl_unique_id");
    cl_nccl_unique_id id;
    int r;
    if (api == NULL) {
        return NULL;
    }
    /* Starts NCCL's bootstrap listener: network set-up, may take a while. */
    Py_BEGIN_ALLOW_THREADS
    r = api->GetUniqueId(&id);
    Py_END_ALLOW_THREADS
    if (r != CL_NCCL_SUCCESS) {
        return CL_NCCL_RAISE(st, r, NULL, "ncclGetUniqueId"), NULL;
    }
    return PyBytes_FromStringAndSize(id.internal, sizeof id.internal);
}

PyDoc_STRVAR(_nccl_group_start_doc,
"_nccl_group_start()\n--\n\n"
"ncclGroupStart: the collectives issued until _nccl_group_end() are launched\n"
"together (needed when one thread drives several communicators of one\n"
"process, one per device).");

static PyObject *
_nccl_group_start(PyObject *module, PyObject *unused)
{
    cl_state *st = cl_state_from_module(module);
    const cl_nccl_api *api = cl_nccl_require(st, "_nccl_group_start");
    int r;
    if (api == NULL) {
        return NULL;
    }
    if ((r = api->GroupStart()) != CL_NCCL_SUCCESS) {
        return CL_NCCL_RAISE(st, r, NULL, "ncclGroupStart"), NULL;
    }
    cl_nccl_group_begin();
    Py_RETURN_NONE;
}

PyDoc_STRVAR(_nccl_group_end_doc,
"_nccl_group_end()\n--\n\n"
"ncclGroupEnd: launch the collectives issued since _nccl_group_start() (the\n"
"GIL is released meanwhile).");

static PyObject *
_nccl_group_end(PyObject *module, PyObject *unused)
{
    cl_state *st = cl_state_from_module(module);
    const cl_nccl_api *api = cl_nccl_require(st, "_nccl_group_end");
    int r;
    if (api == NULL) {
        return NULL;
    }
    if (cl_nccl_group_depth() == 0) {
        PyErr_SetString(st->DistributedError,
                        "_nccl_group_end(): no group is open (_nccl_group_start() first)");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    r = api->GroupEnd();
    Py_END_ALLOW_THREADS
    cl_nccl_group_finish(r == CL_NCCL_SUCCESS);
    if (r != CL_NCCL_SUCCESS) {
        return CL_NCCL_RAISE(st, r, NULL, "ncclGroupEnd"), NULL;
    }
    Py_RETURN_NONE;
}

PyMethodDef cl_nccl_methods[] = {
    CL_FASTCALL(_nccl_load),
    {"_nccl_library", _nccl_library, METH_NOARGS, _nccl_library_doc},
    {"_nccl_version", _nccl_version, METH_NOARGS, _nccl_version_doc},
    {"_nccl_unique_id", _nccl_unique_id, METH_NOARGS, _nccl_unique_id_doc},
    {"_nccl_group_start", _nccl_group_start, METH_NOARGS, _nccl_group_start_doc},
    {"_nccl_group_end", _nccl_group_end, METH_NOARGS, _nccl_group_end_doc},
    {NULL, NULL, 0, NULL},
};
