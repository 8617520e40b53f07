/* cudalab._core: module definition, multi-phase init (PEP 489) and module
 * state (PEP 573). The state holds the heap types, the exceptions, NumPy
 * dtypes and the per-device resources (pools, counters, spare streams).
 *
 * What is not in the state, and why:
 *   - NumPy's API table (one per process, as NumPy requires);
 *   - per-thread state, in C11 thread-local storage because it belongs to a
 *     thread, not to the module: the current stream of each device
 *     (runtime/stream.c), the graph being captured (runtime/graph.c), and the
 *     cuBLAS handles and plan cache (ops/matmul.c, a pthread key);
 *   - process-wide settings that mirror CUDA's own process-wide state: the
 *     float32 matmul precision and matmul backend (ops/matmul.c).
 * Since the pools and these settings are per process, the module declares
 * that it does not support several interpreters. */
#define CUDALAB_IMPORTS_NUMPY
#include "cudalab.h"

static struct PyModuleDef cl_module_def;
static int set_module_doc(PyObject *module);

static int
cl_exec(PyObject *module)
{
    cl_state *st = cl_state_from_module(module);
    st->device_count = -1;
    st->device_count_error = cudaSuccess;
    for (int d = 0; d < CL_MAX_DEVICES; d++) {
        st->devices[d].fraction = 1.0;
    }

    if (PyArray_ImportNumPyAPI() < 0) {
        return -1;
    }
    if (cl_errors_init(module, st) < 0 || cl_dtype_init(module, st) < 0) {
        return -1;
    }

    st->DeviceArray_Type =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, &cl_DeviceArray_spec, NULL);
    if (st->DeviceArray_Type == NULL) {
        return -1;
    }
    /* NumPy then defers `ndarray (op) DeviceArray` to our reflected number
     * slots instead of trying (and refusing) an implicit host conversion. */
    if (PyDict_SetItemString(st->DeviceArray_Type->tp_dict, "__array_ufunc__", Py_None) < 0) {
        return -1;
    }
    PyType_Modified(st->DeviceArray_Type);
    if (PyModule_AddObjectRef(module, "DeviceArray", (PyObject *)st->DeviceArray_Type) < 0) {
        return -1;
    }

    if (cl_stream_init(module, st) < 0 || cl_graph_init(module, st, cl_graph_replay) < 0 ||
        cl_dist_init(module, st) < 0) {
        return -1;
    }
    if (PyModule_AddFunctions(module, cl_device_methods) < 0 ||
        PyModule_AddFunctions(module, cl_memory_methods) < 0 ||
        PyModule_AddFunctions(module, cl_creation_methods) < 0 ||
        PyModule_AddFunctions(module, cl_copyto_methods) < 0 ||
        PyModule_AddFunctions(module, cl_elementwise_methods) < 0 ||
        cl_elementwise_init(module) < 0 ||
        PyModule_AddFunctions(module, cl_reduce_methods) < 0 ||
        cl_reduce_init(module) < 0 ||
        PyModule_AddFunctions(module, cl_transpose_methods) < 0 ||
        PyModule_AddFunctions(module, cl_random_methods) < 0 ||
        PyModule_AddFunctions(module, cl_blas_methods) < 0 ||
        PyModule_AddFunctions(module, cl_nn_linear_methods) < 0 ||
        PyModule_AddFunctions(module, cl_optim_methods) < 0 ||
        PyModule_AddFunctions(module, cl_loss_methods) < 0 ||
        PyModule_AddFunctions(module, cl_convnet_methods) < 0 ||
        PyModule_AddFunctions(module, cl_interop_methods) < 0 ||
        PyModule_AddFunctions(module, cl_timing_methods) < 0 ||
        PyModule_AddFunctions(module, cl_graph_methods) < 0 ||
        PyModule_AddFunctions(module, cl_peer_methods) < 0 ||
        cl_profiler_init(module, st) < 0) {
        return -1;
    }
    if (PyModule_AddIntConstant(module, "MAX_NDIM", CL_MAX_NDIM) < 0) {
        return -1;
    }
    return set_module_doc(module);
}

static int
cl_traverse(PyObject *module, visitproc visit, void *arg)
{
    cl_state *st = cl_state_from_module(module);
    Py_VISIT(st->DeviceArray_Type);
    Py_VISIT(st->Stream_Type);
    Py_VISIT(st->Event_Type);
    Py_VISIT(st->CUDAGraph_Type);
    Py_VISIT(st->NcclComm_Type);
    Py_VISIT(st->CudalabError);
    Py_VISIT(st->CudaError);
    Py_VISIT(st->CublasError);
    Py_VISIT(st->OutOfMemoryError);
    Py_VISIT(st->NoDeviceError);
    Py_VISIT(st->DistributedError);
    Py_VISIT(st->NcclError);
    Py_VISIT(st->bfloat16_type);
    for (int i = 0; i < CL_NUM_DTYPES; i++) {
        Py_VISIT(st->descr[i]);
    }
    return 0;
}

static int
cl_clear(PyObject *module)
{
    cl_state *st = cl_state_from_module(module);
    Py_CLEAR(st->DeviceArray_Type);
    Py_CLEAR(st->Stream_Type);
    Py_CLEAR(st->Event_Type);
    Py_CLEAR(st->CUDAGraph_Type);
    Py_CLEAR(st->NcclComm_Type);
    Py_CLEAR(st->CudalabError);
    Py_CLEAR(st->CudaError);
    Py_CLEAR(st->CublasError);
    Py_CLEAR(st->OutOfMemoryError);
    Py_CLEAR(st->NoDeviceError);
    Py_CLEAR(st->DistributedError);
    Py_CLEAR(st->NcclError);
    Py_CLEAR(st->bfloat16_type);
    for (int i = 0; i < CL_NUM_DTYPES; i++) {
        Py_CLEAR(st->descr[i]);
    }
    return 0;
}

static void
cl_free_module(void *module)
{
    /* The pools are deliberately not destroyed: arrays still alive elsewhere
     * (or the CUDA runtime already unloading at exit) could make that unsafe,
     * and the driver releases everything with the process. */
    cl_profiler_free(cl_state_from_module((PyObject *)module));
    cl_clear((PyObject *)module);
}

static PyModuleDef_Slot cl_slots[] = {
    {Py_mod_exec, cl_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* Per-device pools and counters are process-wide resources. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

PyDoc_STRVAR(cl_module_doc,
"cudalab._core: the C extension behind cudalab. Import `cudalab`, not this.\n"
"\n"
"DeviceArray in memory from CUDA's stream-ordered pool and the functions that\n"
"make, convert and exchange one (DLPack, CUDA Array Interface); device query\n"
"and selection; memory statistics and pinned host memory; streams, events and\n"
"CUDA graphs; element-wise ops, reductions, transpose and matmul on our own\n"
"kernels and cuBLAS; the exception hierarchy. Names starting with an\n"
"underscore serve the Python package (raw device properties, random\n"
"generation, the profiler, the measurement kernels) and may change.");

/* "label: a, b, c." wrapped at 78 columns, as lines appended to `lines`. */
static int
append_names(PyObject *lines, const char *label, PyObject *names)
{
    Py_ssize_t n = PyList_GET_SIZE(names);
    PyObject *line = n > 0 ? PyUnicode_FromFormat("%s:", label) : NULL;
    for (Py_ssize_t i = 0; line != NULL && i < n; i++) {
        PyObject *name = PyList_GET_ITEM(names, i);
        if (PyUnicode_GET_LENGTH(line) + 2 + PyUnicode_GET_LENGTH(name) > 78) {
            if (PyList_Append(lines, line) < 0) {
                Py_CLEAR(line);
                break;
            }
            Py_SETREF(line, PyUnicode_FromString("   "));
            if (line == NULL) {
                break;
            }
        }
        Py_SETREF(line, PyUnicode_FromFormat("%U %U%s", line, name, i + 1 < n ? "," : "."));
    }
    int rc = n == 0 ? 0 : line == NULL ? -1 : PyList_Append(lines, line);
    Py_XDECREF(line);
    return rc;
}

/* The docstring ends with the public names read back from the module, so it
 * lists exactly what the module offers. */
static int
set_module_doc(PyObject *module)
{
    enum { EXCEPTIONS, TYPES, FUNCTIONS, CONSTANTS, NGROUPS };
    static const char *labels[NGROUPS] = {"Exceptions", "Types", "Functions", "Constants"};
    PyObject *groups[NGROUPS] = {PyList_New(0), PyList_New(0), PyList_New(0), PyList_New(0)};
    PyObject *dict = PyModule_GetDict(module); /* borrowed */
    PyObject *keys = PyDict_Keys(dict);
    PyObject *lines = Py_BuildValue("[ss]", cl_module_doc, ""), *doc = NULL;
    int rc = -1;
    if (keys == NULL || lines == NULL || PyList_Sort(keys) < 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        PyObject *value = PyDict_GetItem(dict, key);
        if (!PyUnicode_Check(key) || PyUnicode_READ_CHAR(key, 0) == '_' || value == NULL) {
            continue;
        }
        int g = PyExceptionClass_Check(value) ? EXCEPTIONS
                : PyType_Check(value)         ? TYPES
                : PyCallable_Check(value)     ? FUNCTIONS
                                              : CONSTANTS;
        if (groups[g] == NULL || PyList_Append(groups[g], key) < 0) {
            goto done;
        }
    }
    for (int g = 0; g < NGROUPS; g++) {
        if (groups[g] == NULL || append_names(lines, labels[g], groups[g]) < 0) {
            goto done;
        }
    }
    PyObject *sep = PyUnicode_FromString("\n");
    doc = sep == NULL ? NULL : PyUnicode_Join(sep, lines);
    Py_XDECREF(sep);
    rc = doc == NULL ? -1 : PyObject_SetAttrString(module, "__doc__", doc);
done:
    for (int g = 0; g < NGROUPS; g++) {
        Py_XDECREF(groups[g]);
    }
    Py_XDECREF(keys);
    Py_XDECREF(lines);
    Py_XDECREF(doc);
    return rc;
}

static struct PyModuleDef cl_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cudalab._core",
    .m_doc = cl_module_doc,
    .m_size = sizeof(cl_state),
    .m_slots = cl_slots,
    .m_traverse = cl_traverse,
    .m_clear = cl_clear,
    .m_free = cl_free_module,
};

PyMODINIT_FUNC
PyInit__core(void)
{
    return PyModuleDef_Init(&cl_module_def);
}
