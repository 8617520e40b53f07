/* cudalab._core: module definition, multi-phase init (PEP 489) and module
 * state (PEP 573). The state holds the heap types, the exceptions, NumPy
 * dtypes and the per-device resources; nothing lives in C globals except
 * NumPy's API table. */
#define CUDALAB_IMPORTS_NUMPY
#include "cudalab.h"

static struct PyModuleDef cl_module_def;

cl_state *
cl_state_from_module(PyObject *module)
{
    return (cl_state *)PyModule_GetState(module);
}

cl_state *
cl_state_from_type(PyTypeObject *type)
{
    /* DeviceArray cannot be subclassed, so its own type always finds us. */
    return (cl_state *)PyType_GetModuleState(type);
}

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

    if (cl_stream_init(module, st) < 0 || cl_graph_init(module, st) < 0) {
        return -1;
    }
    if (PyModule_AddFunctions(module, cl_device_methods) < 0 ||
        PyModule_AddFunctions(module, cl_memory_methods) < 0 ||
        PyModule_AddFunctions(module, cl_creation_methods) < 0 ||
        PyModule_AddFunctions(module, cl_elementwise_methods) < 0 ||
        PyModule_AddFunctions(module, cl_reduce_methods) < 0 ||
        PyModule_AddFunctions(module, cl_transpose_methods) < 0 ||
        PyModule_AddFunctions(module, cl_random_methods) < 0 ||
        PyModule_AddFunctions(module, cl_blas_methods) < 0 ||
        PyModule_AddFunctions(module, cl_interop_methods) < 0 ||
        PyModule_AddFunctions(module, cl_timing_methods) < 0 ||
        cl_profiler_init(module, st) < 0) {
        return -1;
    }
    if (PyModule_AddIntConstant(module, "MAX_NDIM", CL_MAX_NDIM) < 0) {
        return -1;
    }
    return 0;
}

static int
cl_traverse(PyObject *module, visitproc visit, void *arg)
{
    cl_state *st = cl_state_from_module(module);
    Py_VISIT(st->DeviceArray_Type);
    Py_VISIT(st->Stream_Type);
    Py_VISIT(st->Event_Type);
    Py_VISIT(st->CUDAGraph_Type);
    Py_VISIT(st->CudalabError);
    Py_VISIT(st->CudaError);
    Py_VISIT(st->CublasError);
    Py_VISIT(st->OutOfMemoryError);
    Py_VISIT(st->NoDeviceError);
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
    Py_CLEAR(st->CudalabError);
    Py_CLEAR(st->CudaError);
    Py_CLEAR(st->CublasError);
    Py_CLEAR(st->OutOfMemoryError);
    Py_CLEAR(st->NoDeviceError);
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
"cudalab._core: the C extension behind cudalab.\n"
"\n"
"Device arrays backed by CUDA's stream-ordered memory pool, device query,\n"
"memory statistics and the exception hierarchy. Import `cudalab`, not this.");

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
