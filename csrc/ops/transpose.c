/* transpose(a, method="best"): a new C-contiguous array holding a.T for a
 * 2-D array, through one of the teaching kernels of cuda/transpose.cu.
 *
 * On the op frame (frame/frame.h): the arguments are checked before the
 * GPU is touched, `method` first (it needs no array). The input may be any
 * 2-D view (strides of any sign): the kernels address it through its own
 * strides, so no intermediate contiguous copy is made. */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "core/core.h"

/* The fixed, documented set of methods, in cl_transpose_method order. */
static const char *const method_names[CL_TRANSPOSE_NUM_METHODS] = {
    "naive", "coalesced_write", "tiled", "tiled_padded", "best",
};

static int
parse_method(PyObject *obj, int *method)
{
    if (obj == NULL) {
        *method = CL_TRANSPOSE_BEST;
        return 0;
    }
    if (!PyUnicode_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, "transpose", "method", "expected a str, got %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    const char *name = PyUnicode_AsUTF8(obj);
    if (name == NULL) {
        return -1;
    }
    for (int i = 0; i < CL_TRANSPOSE_NUM_METHODS; i++) {
        if (strcmp(name, method_names[i]) == 0) {
            *method = i;
            return 0;
        }
    }
    return cl_arg_error(PyExc_ValueError, "transpose", "method",
                        "unknown method %R (expected one of 'naive', 'coalesced_write', "
                        "'tiled', 'tiled_padded', 'best')",
                        obj);
}

PyDoc_STRVAR(transpose_doc,
"transpose(a, method='best')\n--\n\n"
"A new C-contiguous array equal to ``a.T`` for a 2-D array `a`.\n\n"
"Unlike ``a.T`` (a view, no data moves), this moves the data on the device\n"
"with one of the kernels of the transpose lesson.\n\n"
"Parameters\n----------\n"
"a : DeviceArray\n    A 2-D array of any dtype and any strides (views such as\n"
"    ``x[::2, 1:]`` or ``x.T`` are read through their strides).\n"
"method : str, optional\n"
"    Which kernel moves the data (cuda/transpose.cu describes each):\n\n"
"    - ``'naive'``: v1, one thread per element, coalesced reads, strided writes\n"
"    - ``'coalesced_write'``: v2, strided reads, coalesced writes\n"
"    - ``'tiled'``: v3, 32x32 shared-memory tile, 32-way bank conflicts\n"
"    - ``'tiled_padded'``: v4, 32x33 tile, conflict-free\n"
"    - ``'best'`` (default): v5, 64x64 padded tile, 16 elements per thread\n\n"
"Returns\n-------\nDeviceArray\n"
"    Shape ``(a.shape[1], a.shape[0])``, C-contiguous, `a`'s dtype and device.\n\n"
"Raises\n------\n"
"TypeError\n    `a` is not a DeviceArray, or `method` is not a str.\n"
"ValueError\n    `a` is not 2-D, or `method` is not one of the names above.");

/* The method (checked first: it needs no array), then `a`. */
static int
transpose_parse(cl_op *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                DeviceArray **a, int *method)
{
    static const char *const names[] = {"a", "method", NULL};
    PyObject *argv[2];
    if (cl_parse_args(op->func, args, nargs, kwnames, names, 1, argv) < 0 ||
        parse_method(argv[1], method) < 0 || cl_op_array(op, argv[0], "a", a) < 0) {
        return -1;
    }
    if ((*a)->ndim != 2) {
        return cl_arg_error(PyExc_ValueError, op->func, "a",
                            "expected a 2-D array, got %d dimension%s", (*a)->ndim,
                            (*a)->ndim == 1 ? "" : "s");
    }
    return 0;
}

static PyObject *
transpose(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    cl_op op;
    cl_op_init(&op, cl_state_from_module(module), "transpose");
    DeviceArray *a;
    int method = CL_TRANSPOSE_BEST;
    if (transpose_parse(&op, args, nargs, kwnames, &a, &method) < 0 || cl_op_begin(&op) < 0) {
        return NULL;
    }
    const Py_ssize_t shape[2] = {a->shape[1], a->shape[0]};
    DeviceArray *out = cl_op_new(&op, 2, shape, NULL, a->dtype);
    if (out != NULL && a->shape[0] > 0 && a->shape[1] > 0) {
        const int64_t item = (int64_t)cl_itemsize(a->dtype);
        cl_op_use(&op, a);
        CL_CUDA_CHECK(op.st, cl_transpose_2d(out->data, (int64_t)a->shape[0], a->data,
                                             (int64_t)a->strides[0] / item,
                                             (int64_t)a->strides[1] / item, (int64_t)a->shape[0],
                                             (int64_t)a->shape[1], a->dtype, method, op.stream));
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    if (!CL_OP_PROFILING(&op)) {
        return cl_op_end(&op, (PyObject *)out, NULL);
    }
    /* Bytes: every element read once and written once. */
    const cl_prof_info info = {.dtype = (int)a->dtype, .bytes = 2 * cl_prof_nbytes(a),
                               .flops = -1, .ninputs = 1, .inputs = {a}, .out_ndim = 2,
                               .out_shape = shape};
    return cl_op_end(&op, (PyObject *)out, &info);
}

PyMethodDef cl_transpose_methods[] = {
    CL_FASTCALL(transpose),
    {NULL, NULL, 0, NULL},
};
