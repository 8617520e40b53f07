/* Private kernels for the measurement harness (python/cudalab/bench):
 * _spin(cycles) and _empty_kernel(count=1), both on the current stream.
 * See cuda/prof/timing.cu for why each exists. Both go through the op frame,
 * so the profiler and NVTX see them like any op. */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "core/core.h"

/* `count` launches of the spin kernel (cycles >= 0) or of the empty kernel
 * (cycles < 0) on the current stream of the current device. */
static PyObject *
launch_on_current_stream(cl_state *st, const char *func, Py_ssize_t cycles, Py_ssize_t count)
{
    cl_op op;
    cl_op_init(&op, st, func);
    if (cl_op_begin(&op) < 0) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        CL_CUDA_CHECK(st, cycles >= 0 ? cl_spin((long long)cycles, op.stream)
                                      : cl_empty_kernel(op.stream));
    }
    /* No data: the record only says when the kernels ran. */
    cl_prof_info info = {.dtype = -1, .bytes = 0, .flops = 0, .out_ndim = -1};
    return cl_op_end(&op, Py_NewRef(Py_None), CL_OP_PROFILING(&op) ? &info : NULL);
fail:
    return cl_op_end(&op, NULL, NULL);
}

PyDoc_STRVAR(spin_doc,
"_spin(cycles)\n--\n\n"
"Enqueue a one-thread kernel that busy-waits `cycles` SM clock cycles on the\n"
"current stream (private: cudalab.bench uses it as a timer reference and to\n"
"hold a stream while a batch of short ops is enqueued).\n\n"
"Parameters\n----------\n"
"cycles : int\n    Clock cycles to spin, 0 <= cycles < 2**62.\n\n"
"Raises\n------\n"
"TypeError\n    `cycles` is not an int.\n"
"ValueError\n    `cycles` is negative or too large.\n"
"NoDeviceError\n    No CUDA device is available.");

static PyObject *
spin(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"cycles", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[1];
    Py_ssize_t cycles;
    if (cl_parse_args("_spin", args, nargs, kwnames, names, 1, argv) < 0 ||
        cl_parse_index(argv[0], "_spin", "cycles", &cycles) < 0) {
        return NULL;
    }
    if (cycles < 0 || (long long)cycles >= (1LL << 62)) {
        return cl_arg_error(PyExc_ValueError, "_spin", "cycles",
                            "expected 0 <= cycles < 2**62, got %zd", cycles),
               NULL;
    }
    return launch_on_current_stream(st, "_spin", cycles, 1);
}

PyDoc_STRVAR(empty_kernel_doc,
"_empty_kernel(count=1)\n--\n\n"
"Launch a kernel that does nothing `count` times back to back on the current\n"
"stream, from one C loop (private: cudalab.bench.ceilings() measures launch\n"
"latency with it, free of Python call overhead).\n\n"
"Parameters\n----------\n"
"count : int, optional\n    Number of launches, 0 <= count <= 10**7.\n\n"
"Raises\n------\n"
"TypeError\n    `count` is not an int.\n"
"ValueError\n    `count` is out of range.\n"
"NoDeviceError\n    No CUDA device is available.");

static PyObject *
empty_kernel(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"count", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[1];
    Py_ssize_t count = 1;
    if (cl_parse_args("_empty_kernel", args, nargs, kwnames, names, 0, argv) < 0) {
        return NULL;
    }
    if (argv[0] != NULL && cl_parse_index(argv[0], "_empty_kernel", "count", &count) < 0) {
        return NULL;
    }
    if (count < 0 || count > 10000000) {
        return cl_arg_error(PyExc_ValueError, "_empty_kernel", "count",
                            "expected 0 <= count <= 10**7, got %zd", count),
               NULL;
    }
    return launch_on_current_stream(st, "_empty_kernel", -1, count);
}

PyMethodDef cl_timing_methods[] = {
    {"_spin", (PyCFunction)(void (*)(void))spin, METH_FASTCALL | METH_KEYWORDS, spin_doc},
    {"_empty_kernel", (PyCFunction)(void (*)(void))empty_kernel, METH_FASTCALL | METH_KEYWORDS,
     empty_kernel_doc},
    {NULL, NULL, 0, NULL},
};
