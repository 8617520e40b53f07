/* Array constructors and host <-> device copies: asarray, asnumpy,
 * ascontiguousarray, empty/zeros/ones/full and their *_like forms.
 *
 * Every argument is checked before the GPU is touched, so argument errors
 * are the same with or without a device; then cl_require_device raises
 * NoDeviceError on a machine without one. */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "runtime/runtime.h"
#include "core/core.h"

#define DEFAULT_DTYPE CL_FLOAT32 /* like torch: float32 unless asked otherwise */

/* The `a` argument of *_like, asnumpy, ascontiguousarray. */
static DeviceArray *
expect_array(cl_state *st, PyObject *obj, const char *func)
{
    if (!CL_IS_DEVICEARRAY(st, obj)) {
        cl_expected_array_error(func, "a", obj, false);
        return NULL;
    }
    return (DeviceArray *)obj;
}

/* Whether `value` (a Python, NumPy or ml_dtypes scalar, or a 0-d array) is a
 * floating-point number. */
static bool
is_float_value(cl_state *st, PyObject *value)
{
    if (PyFloat_Check(value)) {
        return true;
    }
    if (PyBool_Check(value) || PyLong_Check(value)) {
        return false;
    }
    PyArray_Descr *descr = PyArray_Check(value) ? PyArray_DESCR((PyArrayObject *)value)
                                                : PyArray_DescrFromScalar(value);
    if (descr == NULL) {
        PyErr_Clear();
        return false;
    }
    int code = cl_dtype_from_descr(st, descr);
    if (!PyArray_Check(value)) {
        Py_DECREF(descr);
    }
    return code >= 0 && cl_dtype_is_float((cl_dtype)code);
}

/* fill_value converted to one element of `dtype`, as host bytes. NumPy does
 * the conversion so the result is exactly what np.full would store, except
 * for a float into an integer dtype: that saturates as astype does on the
 * device (NumPy leaves out-of-range values undefined). */
static int
scalar_bytes(cl_state *st, PyObject *value, cl_dtype dtype, const char *func, char *out)
{
    if (cl_dtype_is_int(dtype) && is_float_value(st, value)) {
        double x = PyFloat_AsDouble(value);
        if (x == -1.0 && PyErr_Occurred()) {
            return -1;
        }
        cl_float_to_int_bytes(x, dtype, out);
        return 0;
    }
    PyArray_Descr *descr = st->descr[dtype];
    Py_INCREF(descr); /* stolen */
    PyArrayObject *arr = (PyArrayObject *)PyArray_FromAny(value, descr, 0, 0,
                                                          NPY_ARRAY_FORCECAST, NULL);
    if (arr == NULL) {
        return -1;
    }
    if (PyArray_NDIM(arr) != 0) {
        Py_DECREF(arr);
        return cl_arg_error(PyExc_ValueError, func, "fill_value", "must be a scalar");
    }
    memcpy(out, PyArray_DATA(arr), cl_itemsize(dtype));
    Py_DECREF(arr);
    return 0;
}

/* Reject what np.full would turn into strings, objects or complex numbers. */
static int
check_fill_value(cl_state *st, PyObject *value, const char *func)
{
    if (PyBool_Check(value) || PyLong_Check(value) || PyFloat_Check(value)) {
        return 0;
    }
    if (PyArray_IsScalar(value, Generic) || (PyArray_Check(value) &&
                                             PyArray_NDIM((PyArrayObject *)value) == 0)) {
        PyArray_Descr *descr = PyArray_DescrFromScalar(value);
        int code = descr == NULL ? -1 : cl_dtype_from_descr(st, descr);
        Py_XDECREF(descr);
        if (code >= 0) {
            return 0;
        }
    }
    return cl_expected_type_error(func, "fill_value", "a real number or bool", value);
}

/* dtype=None for full(): bool -> bool, int -> int64, float -> float32 (as
 * torch.full infers), a NumPy scalar -> its own dtype. */
static cl_dtype
infer_fill_dtype(cl_state *st, PyObject *value)
{
    if (PyBool_Check(value)) {
        return CL_BOOL;
    }
    if (PyLong_Check(value)) {
        return CL_INT64;
    }
    if (PyFloat_Check(value)) {
        return CL_FLOAT32;
    }
    PyArray_Descr *descr = PyArray_DescrFromScalar(value);
    int code = descr == NULL ? DEFAULT_DTYPE : cl_dtype_from_descr(st, descr);
    Py_XDECREF(descr);
    PyErr_Clear();
    return code < 0 ? DEFAULT_DTYPE : (cl_dtype)code;
}

/* Allocate and fill on the current device. fill == NULL: leave uninitialized. */
static PyObject *
make_filled(cl_state *st, const char *func, int ndim, const Py_ssize_t *shape, cl_dtype dtype,
            const char *fill)
{
    cl_op op;
    cl_op_init(&op, st, func);
    if (cl_op_begin(&op) < 0) {
        return NULL;
    }
    DeviceArray *a = cl_op_new(&op, ndim, shape, NULL, dtype);
    size_t n = a != NULL ? (size_t)cl_array_size(a) : 0;
    size_t itemsize = cl_itemsize(dtype);
    bool all_zero = true;
    for (size_t i = 0; fill != NULL && i < itemsize; i++) {
        all_zero = all_zero && fill[i] == 0;
    }
    if (fill != NULL && n > 0) {
        CL_CUDA_CHECK(st, all_zero ? cudaMemsetAsync(a->data, 0, n * itemsize, op.stream)
                                   : cl_fill(a->data, n, fill, itemsize, op.stream));
    }
    /* empty() is an allocation with no device work: nothing to profile. */
    cl_prof_info info = {.dtype = (int)dtype, .bytes = (int64_t)(n * itemsize), .flops = -1,
                         .out_ndim = ndim, .out_shape = shape};
    return cl_op_end(&op, (PyObject *)a, CL_OP_PROFILING(&op) && fill != NULL ? &info : NULL);
fail:
    Py_XDECREF(a);
    return cl_op_end(&op, NULL, NULL);
}

enum fill_kind { FILL_EMPTY, FILL_ZEROS, FILL_ONES, FILL_VALUE };

/* empty/zeros/ones/full(shape, [fill_value,] dtype) and the *_like forms
 * (where the first argument is an array giving shape and default dtype). */
static PyObject *
create(PyObject *module, const char *func, enum fill_kind kind, bool like,
       PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const plain_names[] = {"shape", "dtype", NULL};
    static const char *const full_names[] = {"shape", "fill_value", "dtype", NULL};
    static const char *const plain_like[] = {"a", "dtype", NULL};
    static const char *const full_like[] = {"a", "fill_value", "dtype", NULL};
    cl_state *st = cl_state_from_module(module);
    const char *const *names = kind == FILL_VALUE ? (like ? full_like : full_names)
                                                  : (like ? plain_like : plain_names);
    int nrequired = kind == FILL_VALUE ? 2 : 1;
    PyObject *argv[3];
    Py_ssize_t shape[CL_MAX_NDIM];
    int ndim;
    cl_dtype dtype = DEFAULT_DTYPE;
    char fill[8] = {0};

    if (cl_parse_args(func, args, nargs, kwnames, names, nrequired, argv) < 0) {
        return NULL;
    }
    PyObject *dtype_obj = argv[kind == FILL_VALUE ? 2 : 1];
    PyObject *value = kind == FILL_VALUE ? argv[1] : NULL;
    if (like) {
        DeviceArray *a = expect_array(st, argv[0], func);
        if (a == NULL) {
            return NULL;
        }
        ndim = a->ndim;
        memcpy(shape, a->shape, sizeof(Py_ssize_t) * (size_t)ndim);
        dtype = a->dtype;
    }
    else if (cl_parse_shape(argv[0], func, "shape", &ndim, shape) < 0) {
        return NULL;
    }
    if (value != NULL && check_fill_value(st, value, func) < 0) {
        return NULL;
    }
    if (dtype_obj != NULL && dtype_obj != Py_None) {
        if (cl_dtype_converter(st, dtype_obj, func, "dtype", &dtype) < 0) {
            return NULL;
        }
    }
    else if (value != NULL && !like) {
        dtype = infer_fill_dtype(st, value);
    }
    switch (kind) {
    case FILL_EMPTY:
        return make_filled(st, func, ndim, shape, dtype, NULL);
    case FILL_ZEROS:
        return make_filled(st, func, ndim, shape, dtype, fill);
    case FILL_ONES:
        value = PyLong_FromLong(1);
        if (value == NULL || scalar_bytes(st, value, dtype, func, fill) < 0) {
            Py_XDECREF(value);
            return NULL;
        }
        Py_DECREF(value);
        return make_filled(st, func, ndim, shape, dtype, fill);
    case FILL_VALUE:
        if (scalar_bytes(st, value, dtype, func, fill) < 0) {
            return NULL;
        }
        return make_filled(st, func, ndim, shape, dtype, fill);
    }
    return NULL;
}

#define CREATOR(name, kind, like, doc)                                                         \
    PyDoc_STRVAR(name##_doc, doc);                                                              \
    static PyObject *name(PyObject *module, PyObject *const *args, Py_ssize_t nargs,            \
                          PyObject *kwnames)                                                    \
    {                                                                                           \
        return create(module, #name, kind, like, args, nargs, kwnames);                         \
    }

CREATOR(empty, FILL_EMPTY, false,
"empty(shape, dtype=float32)\n--\n\n"
"A new C-contiguous array with uninitialized contents.\n\n"
"Parameters\n----------\nshape : int or tuple of int\n    Up to 8 non-negative extents.\n"
"dtype : dtype-like, optional\n    bool, int8, uint8, int32, int64, float16, bfloat16,\n"
"    float32 (default) or float64.")
CREATOR(zeros, FILL_ZEROS, false,
"zeros(shape, dtype=float32)\n--\n\nA new C-contiguous array of zeros.")
CREATOR(ones, FILL_ONES, false,
"ones(shape, dtype=float32)\n--\n\nA new C-contiguous array of ones.")
CREATOR(full, FILL_VALUE, false,
"full(shape, fill_value, dtype=None)\n--\n\n"
"A new C-contiguous array filled with `fill_value`.\n\n"
"With dtype=None the dtype follows torch.full: bool for a bool, int64 for an\n"
"int, float32 for a float, and a NumPy scalar's own dtype. A float into an\n"
"integer dtype saturates as astype does (300.7 -> uint8 255, NaN -> 0).")
CREATOR(empty_like, FILL_EMPTY, true,
"empty_like(a, dtype=None)\n--\n\nAn uninitialized C-contiguous array shaped like `a`.")
CREATOR(zeros_like, FILL_ZEROS, true,
"zeros_like(a, dtype=None)\n--\n\nZeros shaped like `a` (its dtype unless given).")
CREATOR(ones_like, FILL_ONES, true,
"ones_like(a, dtype=None)\n--\n\nOnes shaped like `a` (its dtype unless given).")
CREATOR(full_like, FILL_VALUE, true,
"full_like(a, fill_value, dtype=None)\n--\n\n"
"`fill_value` shaped like `a` (its dtype unless given).")

/* Copy `host` (dense) into `out` on the op's stream. Asynchronous from a
 * pinned `host` that the caller allows (`async`): `out` then keeps `host`
 * alive until it dies. Otherwise wait, so the caller may reuse or free
 * `host` at once. */
static int
copy_from_host(cl_op *op, DeviceArray *out, PyArrayObject *host, bool async)
{
    size_t nbytes = (size_t)PyArray_NBYTES(host);
    cudaError_t err = cudaSuccess;
    if (nbytes > 0) {
        /* From pageable memory the call itself waits while the driver stages
         * the bytes: let other threads run meanwhile. */
        CL_WITHOUT_GIL(err = cudaMemcpyAsync(out->data, PyArray_DATA(host), nbytes,
                                             cudaMemcpyHostToDevice, op->stream));
    }
    cl_prof_gpu_done(op->st, &op->prof);
    if (err == cudaSuccess && async) {
        out->host_keepalive = Py_NewRef((PyObject *)host);
    }
    else if (err == cudaSuccess && nbytes > 0) {
        CL_WITHOUT_GIL(err = cudaStreamSynchronize(op->stream));
    }
    CL_CUDA_CHECK(op->st, err);
    return 0;
fail:
    return -1;
}

/* Upload a NumPy array. Dense layouts (C, Fortran, any axis order) keep their
 * strides and travel as one block; anything else is compacted to C order on
 * the host first, since only its elements, not its extent, should cross PCIe. */
static PyObject *
upload(cl_state *st, PyArrayObject *arr, cl_dtype dtype, bool non_blocking)
{
    int ndim = PyArray_NDIM(arr);
    PyArrayObject *host = arr;
    if (!cl_layout_is_dense(ndim, PyArray_SHAPE(arr), PyArray_STRIDES(arr), cl_itemsize(dtype)) ||
        !PyArray_ISALIGNED(arr)) {
        host = (PyArrayObject *)PyArray_NewCopy(arr, NPY_CORDER);
        if (host == NULL) {
            return NULL;
        }
    }
    else {
        Py_INCREF(host);
    }
    cl_op op;
    DeviceArray *out = NULL;
    cl_op_init(&op, st, "asarray");
    if (cl_op_begin(&op) < 0) {
        Py_DECREF(host);
        return NULL;
    }
    bool async = non_blocking && host == arr && cl_host_is_pinned(PyArray_DATA(host));
    if (async || cl_refuse_while_capturing(st, "asarray", "a copy from pageable host memory") == 0) {
        out = cl_op_new(&op, ndim, PyArray_SHAPE(host), PyArray_STRIDES(host), dtype);
    }
    if (out != NULL && copy_from_host(&op, out, host, async) < 0) {
        Py_CLEAR(out);
    }
    /* Bytes: what crosses from the host (a host-side compaction of a source
     * with gaps happens before the op and is not counted). */
    cl_prof_info info = {.dtype = (int)dtype, .bytes = (int64_t)PyArray_NBYTES(host),
                         .flops = -1, .out_ndim = ndim, .out_shape = PyArray_SHAPE(host)};
    PyObject *result = cl_op_end(&op, (PyObject *)out, CL_OP_PROFILING(&op) ? &info : NULL);
    Py_DECREF(host);
    return result;
}

PyDoc_STRVAR(asarray_doc,
"asarray(obj, dtype=None, non_blocking=False)\n--\n\n"
"A DeviceArray holding `obj`'s values.\n\n"
"A DeviceArray is returned as is (or converted when `dtype` differs).\n"
"A foreign device array is viewed without a copy (then converted when\n"
"`dtype` differs): first a DLPack producer whose __dlpack_device__ is a CUDA\n"
"device (PyTorch, CuPy, JAX), else any object with __cuda_array_interface__\n"
"(Numba, CuPy, PyTorch); see from_dlpack. The view keeps the producer alive.\n"
"Anything NumPy's asarray accepts (arrays of any layout, buffers, nested\n"
"sequences, scalars) is converted on the host by NumPy, then copied to the\n"
"current device: a dense source keeps its strides (C, Fortran, transposed),\n"
"any other arrives C-contiguous.\n\n"
"Parameters\n----------\nobj : array_like, DeviceArray or a device array of another library\n"
"dtype : dtype-like, optional\n    Convert to this dtype (as ``np.asarray(obj, dtype)`` does).\n"
"non_blocking : bool, optional\n"
"    With a NumPy source in pinned memory (pinned_empty) that needs no\n"
"    conversion, enqueue the copy on the current stream and return at once;\n"
"    the source must not be modified until the stream has done the copy\n"
"    (the new array keeps a reference to it, so it cannot be freed early).\n"
"    From pageable memory, or when a host-side conversion was needed, the\n"
"    copy is synchronous regardless: safe, just not overlapped.");

static PyObject *
asarray(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"obj", "dtype", "non_blocking", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[3];
    cl_dtype dtype;
    bool have_dtype = false;
    int non_blocking = 0;
    if (cl_parse_args("asarray", args, nargs, kwnames, names, 1, argv) < 0) {
        return NULL;
    }
    if (argv[2] != NULL && (non_blocking = PyObject_IsTrue(argv[2])) < 0) {
        return NULL;
    }
    PyObject *obj = argv[0];
    if (argv[1] != NULL && argv[1] != Py_None) {
        if (cl_dtype_converter(st, argv[1], "asarray", "dtype", &dtype) < 0) {
            return NULL;
        }
        have_dtype = true;
    }
    if (CL_IS_DEVICEARRAY(st, obj)) {
        DeviceArray *a = (DeviceArray *)obj;
        if (!have_dtype || dtype == a->dtype) {
            return Py_NewRef(obj);
        }
        return (PyObject *)cl_array_copy_op(st, "asarray", a, dtype);
    }
    if (!PyArray_Check(obj)) {
        PyObject *imported = NULL;
        int rc = cl_import_device_object(st, obj, "asarray", &imported);
        if (rc < 0) {
            return NULL;
        }
        if (rc > 0) {
            DeviceArray *a = (DeviceArray *)imported;
            if (!have_dtype || dtype == a->dtype) {
                return imported;
            }
            DeviceArray *c = cl_array_copy_op(st, "asarray", a, dtype);
            Py_DECREF(imported);
            return (PyObject *)c;
        }
    }
    PyArray_Descr *descr = NULL;
    if (have_dtype) {
        descr = st->descr[dtype];
        Py_INCREF(descr); /* stolen */
    }
    PyArrayObject *arr = (PyArrayObject *)PyArray_FromAny(obj, descr, 0, 0,
                                                          have_dtype ? NPY_ARRAY_FORCECAST : 0,
                                                          NULL);
    if (arr == NULL) {
        return NULL; /* NumPy's own error, e.g. for ragged sequences */
    }
    int code = cl_dtype_from_descr(st, PyArray_DESCR(arr));
    if (code < 0) {
        PyObject *supported = cl_supported_dtypes_text();
        cl_arg_error(PyExc_TypeError, "asarray", "obj",
                     "unsupported dtype %R (supported: %U)", (PyObject *)PyArray_DESCR(arr),
                     supported);
        Py_XDECREF(supported);
        Py_DECREF(arr);
        return NULL;
    }
    if (PyArray_NDIM(arr) > CL_MAX_NDIM) {
        cl_arg_error(PyExc_ValueError, "asarray", "obj",
                     "%d dimensions exceed the maximum of %d", PyArray_NDIM(arr), CL_MAX_NDIM);
        Py_DECREF(arr);
        return NULL;
    }
    PyObject *out = NULL;
    if (cl_require_device(st, "asarray") == 0) {
        out = upload(st, arr, (cl_dtype)code, non_blocking != 0);
    }
    Py_DECREF(arr);
    return out;
}

PyDoc_STRVAR(asnumpy_doc,
"asnumpy(a)\n--\n\nCopy a DeviceArray to a new NumPy array; the same as ``a.get()``.");

/* The one argument `a` of asnumpy and ascontiguousarray. */
static DeviceArray *
parse_array_arg(cl_state *st, const char *func, PyObject *const *args, Py_ssize_t nargs,
                PyObject *kwnames)
{
    static const char *const names[] = {"a", NULL};
    PyObject *argv[1];
    if (cl_parse_args(func, args, nargs, kwnames, names, 1, argv) < 0) {
        return NULL;
    }
    return expect_array(st, argv[0], func);
}

static PyObject *
asnumpy(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    DeviceArray *a = parse_array_arg(st, "asnumpy", args, nargs, kwnames);
    return a == NULL ? NULL : cl_array_to_host(st, "asnumpy", a, NULL, false);
}

PyDoc_STRVAR(ascontiguousarray_doc,
"ascontiguousarray(a)\n--\n\n"
"`a` itself when it is C-contiguous, otherwise a C-contiguous copy made on\n"
"the device by the strided-copy kernel (any rank up to 8).");

static PyObject *
ascontiguousarray(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    DeviceArray *a = parse_array_arg(st, "ascontiguousarray", args, nargs, kwnames);
    if (a == NULL) {
        return NULL;
    }
    if (cl_is_c_contiguous(a)) {
        return Py_NewRef((PyObject *)a);
    }
    return (PyObject *)cl_array_copy_op(st, "ascontiguousarray", a, a->dtype);
}

PyDoc_STRVAR(_float_to_int_doc,
"_float_to_int(value, dtype)\n--\n\n"
"A float `value` converted to integer `dtype` as full() converts its\n"
"fill_value: truncated toward zero and saturated to the dtype's range, NaN\n"
"to 0 (the rule of astype on the device). For tests; needs no GPU.");

static PyObject *
_float_to_int(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"value", "dtype", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    cl_dtype dtype;
    if (cl_parse_args("_float_to_int", args, nargs, kwnames, names, 2, argv) < 0 ||
        cl_dtype_converter(st, argv[1], "_float_to_int", "dtype", &dtype) < 0) {
        return NULL;
    }
    if (!cl_dtype_is_int(dtype)) {
        return cl_arg_error(PyExc_TypeError, "_float_to_int", "dtype",
                            "expected an integer dtype, got %s", cl_dtype_name(dtype)), NULL;
    }
    double x = PyFloat_AsDouble(argv[0]);
    if (x == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    char bytes[8];
    cl_float_to_int_bytes(x, dtype, bytes);
    switch (dtype) {
    case CL_INT8: return PyLong_FromLong(*(int8_t *)bytes);
    case CL_UINT8: return PyLong_FromLong(*(uint8_t *)bytes);
    case CL_INT32: {
        int32_t v;
        memcpy(&v, bytes, 4);
        return PyLong_FromLong(v);
    }
    default: {
        int64_t v;
        memcpy(&v, bytes, 8);
        return PyLong_FromLongLong(v);
    }
    }
}

PyMethodDef cl_creation_methods[] = {
    CL_FASTCALL(_float_to_int),
    CL_FASTCALL(asarray),
    CL_FASTCALL(asnumpy),
    CL_FASTCALL(ascontiguousarray),
    CL_FASTCALL(empty),
    CL_FASTCALL(zeros),
    CL_FASTCALL(ones),
    CL_FASTCALL(full),
    CL_FASTCALL(empty_like),
    CL_FASTCALL(zeros_like),
    CL_FASTCALL(ones_like),
    CL_FASTCALL(full_like),
    {NULL, NULL, 0, NULL},
};
