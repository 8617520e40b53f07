/* The DeviceArray type as Python sees it: its attributes, methods, indexing
 * and number protocol, gathered from every layer below. The object itself
 * (layout, allocation, views, lifetime) is array/array.c's; copies (get, to,
 * copy, astype) are ops (ops/copy.c), the number protocol is
 * ops/elementwise.c's and ops/matmul.c's, DLPack and the CUDA Array
 * Interface ops/interop.c's. module.c makes the type from
 * cl_DeviceArray_spec. */
#include "cudalab.h"
#include <structmember.h> /* T_PYSSIZET, READONLY on Python < 3.12 */

/* ---- type slots ------------------------------------------------------------ */

static PyObject *
DeviceArray_repr(DeviceArray *self)
{
    PyObject *shape = cl_shape_tuple(self->ndim, self->shape);
    if (shape == NULL) {
        return NULL;
    }
    PyObject *r = PyUnicode_FromFormat("DeviceArray(shape=%R, dtype=%s, device=%d)", shape,
                                       cl_dtype_name(self->dtype), self->device);
    Py_DECREF(shape);
    return r;
}

static Py_ssize_t
DeviceArray_length(DeviceArray *self)
{
    if (self->ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "len() of a 0-d DeviceArray");
        return -1;
    }
    return self->shape[0];
}

/* ---- attributes ------------------------------------------------------------ */

static PyObject *
get_shape(DeviceArray *self, void *closure)
{
    return cl_shape_tuple(self->ndim, self->shape);
}

static PyObject *
get_strides(DeviceArray *self, void *closure)
{
    return cl_shape_tuple(self->ndim, self->strides);
}

static PyObject *
get_dtype(DeviceArray *self, void *closure)
{
    cl_state *st = cl_state_from_type(Py_TYPE(self));
    return Py_NewRef((PyObject *)st->descr[self->dtype]);
}

static PyObject *
get_ndim(DeviceArray *self, void *closure)
{
    return PyLong_FromLong(self->ndim);
}

static PyObject *
get_size(DeviceArray *self, void *closure)
{
    return PyLong_FromSsize_t(cl_array_size(self));
}

static PyObject *
get_itemsize(DeviceArray *self, void *closure)
{
    return PyLong_FromSize_t(cl_itemsize(self->dtype));
}

static PyObject *
get_nbytes(DeviceArray *self, void *closure)
{
    return PyLong_FromSsize_t(cl_array_size(self) * (Py_ssize_t)cl_itemsize(self->dtype));
}

static PyObject *
get_device(DeviceArray *self, void *closure)
{
    return PyLong_FromLong(self->device);
}

static PyObject *
get_data_ptr(DeviceArray *self, void *closure)
{
    return PyLong_FromVoidPtr(cl_array_size(self) == 0 ? NULL : self->data);
}

static PyObject *
get_is_contiguous(DeviceArray *self, void *closure)
{
    return PyBool_FromLong(cl_is_c_contiguous(self));
}

static PyObject *
get_is_f_contiguous(DeviceArray *self, void *closure)
{
    return PyBool_FromLong(cl_is_f_contiguous(self));
}

static PyObject *
get_base(DeviceArray *self, void *closure)
{
    return Py_NewRef(self->base != NULL ? self->base : Py_None);
}

static DeviceArray *
permuted_view(DeviceArray *self, const int *perm)
{
    Py_ssize_t shape[CL_MAX_NDIM], strides[CL_MAX_NDIM];
    for (int i = 0; i < self->ndim; i++) {
        shape[i] = self->shape[perm[i]];
        strides[i] = self->strides[perm[i]];
    }
    return cl_array_view(cl_state_from_type(Py_TYPE(self)), self, self->data, self->ndim, shape,
                         strides);
}

static PyObject *
get_T(DeviceArray *self, void *closure)
{
    int perm[CL_MAX_NDIM];
    for (int i = 0; i < self->ndim; i++) {
        perm[i] = self->ndim - 1 - i;
    }
    return (PyObject *)permuted_view(self, perm);
}

static PyGetSetDef DeviceArray_getset[] = {
    {"shape", (getter)get_shape, NULL, "Tuple of dimensions.", NULL},
    {"strides", (getter)get_strides, NULL,
     "Tuple of byte steps per dimension (negative along a reversed axis).", NULL},
    {"dtype", (getter)get_dtype, NULL, "Element type, a numpy.dtype.", NULL},
    {"ndim", (getter)get_ndim, NULL, "Number of dimensions.", NULL},
    {"size", (getter)get_size, NULL, "Number of elements.", NULL},
    {"itemsize", (getter)get_itemsize, NULL, "Bytes per element.", NULL},
    {"nbytes", (getter)get_nbytes, NULL, "size * itemsize.", NULL},
    {"device", (getter)get_device, NULL, "Index of the device holding the data.", NULL},
    {"data_ptr", (getter)get_data_ptr, NULL,
     "Device address of element [0, ..., 0] (0 for an empty array).", NULL},
    {"is_contiguous", (getter)get_is_contiguous, NULL, "True when laid out in C order.", NULL},
    {"is_f_contiguous", (getter)get_is_f_contiguous, NULL, "True when laid out in Fortran order.",
     NULL},
    {"base", (getter)get_base, NULL, "The array owning the memory of a view; None for an owner.",
     NULL},
    {"T", (getter)get_T, NULL, "View with the axes reversed.", NULL},
    {"__cuda_array_interface__", (getter)cl_array_cuda_array_interface, NULL,
     "CUDA Array Interface v3 (zero-copy export, strides as they are, negative ones\n"
     "too; see interop.c). Not for bfloat16.", NULL},
    {NULL},
};

/* ---- methods --------------------------------------------------------------- */

PyDoc_STRVAR(get_doc,
"get(out=None, non_blocking=False)\n--\n\n"
"Copy to the host: a new NumPy array, or into `out`.\n\n"
"A dense array (C, Fortran or any axis order) arrives with the same strides;\n"
"any other view (with gaps or negative strides) is compacted on the device\n"
"first and arrives in C order. bfloat16 arrives as ml_dtypes.bfloat16. The\n"
"copy is ordered on the current stream.\n\n"
"Parameters\n----------\n"
"out : numpy.ndarray, optional\n"
"    Writable, same shape and dtype, any strides (as np.copyto takes). Into\n"
"    a dense `out` (C, Fortran or any axis order) the bytes cross as one\n"
"    block, laid out in out's order on the device first where they differ;\n"
"    any other `out` (a view with gaps or negative strides) is filled from a\n"
"    host staging copy. Returned.\n"
"non_blocking : bool, optional\n"
"    With a pinned, dense `out` (pinned_empty), enqueue the copy and return\n"
"    at once: synchronize (cudalab.synchronize() or the stream) before\n"
"    reading `out`. Otherwise ignored: the copy is synchronous (the GIL is\n"
"    released while waiting).");

static PyObject *
DeviceArray_get(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"out", "non_blocking", NULL};
    PyObject *argv[2];
    int non_blocking = 0;
    if (cl_parse_args("get", args, nargs, kwnames, names, 0, argv) < 0 ||
        (argv[1] != NULL && (non_blocking = PyObject_IsTrue(argv[1])) < 0)) {
        return NULL;
    }
    return cl_array_to_host(cl_state_from_type(Py_TYPE(self)), "get", self,
                            argv[0] == Py_None ? NULL : argv[0], non_blocking != 0);
}

PyDoc_STRVAR(to_doc,
"to(device, copy=False)\n--\n\n"
"The same values on `device` (an index, or 'cuda:N' / 'cuda' as torch\n"
"spells it): this array itself when it is there already (a copy with\n"
"copy=True), else a new C-contiguous array filled by one peer copy, direct\n"
"over NVLink or PCIe when peer access is on (enable_peer_access), staged\n"
"through host memory by the driver otherwise. Asynchronous like every op:\n"
"ordered after the work on this array's device, and the work enqueued later\n"
"on either device's current stream waits for it.");

static PyObject *
DeviceArray_to(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"device", "copy", NULL};
    cl_state *st = cl_state_from_type(Py_TYPE(self));
    PyObject *argv[2];
    int device, copy = 0;
    if (cl_parse_args("to", args, nargs, kwnames, names, 1, argv) < 0 ||
        (argv[1] != NULL && (copy = PyObject_IsTrue(argv[1])) < 0) ||
        cl_parse_device_spec(st, argv[0], "to", &device) < 0) {
        return NULL;
    }
    if (device == self->device) {
        return copy ? (PyObject *)cl_array_copy_op(st, "to", self, self->dtype)
                    : Py_NewRef((PyObject *)self);
    }
    return (PyObject *)cl_array_to_device(st, "to", self, device, NULL);
}

PyDoc_STRVAR(copy_doc,
"copy()\n--\n\n"
"A new C-contiguous array with the same values, on the same device.");

static PyObject *
DeviceArray_copy(DeviceArray *self, PyObject *unused)
{
    return (PyObject *)cl_array_copy_op(cl_state_from_type(Py_TYPE(self)), "copy", self,
                                        self->dtype);
}

PyDoc_STRVAR(astype_doc,
"astype(dtype, copy=True)\n--\n\n"
"The values converted to `dtype` as NumPy's astype does, in a new\n"
"C-contiguous array. With copy=False and the same dtype, returns self.\n\n"
"Notes\n-----\n"
"Float to integer truncates toward zero and saturates where NumPy's result\n"
"is undefined (platform-dependent): values beyond the target's range clamp\n"
"to its min or max, NaN becomes 0, +inf max and -inf min (float32 -> uint8:\n"
"300.7 -> 255, -1.5 -> 0, 255.9 -> 255). In-range values match NumPy.\n"
"Anything to bool is `!= 0` (NaN is True); integer to integer wraps, as in\n"
"NumPy. The same rule applies wherever cudalab converts float to integer:\n"
"reductions with an integer dtype= or out=, and full() with a float\n"
"fill_value.");

static PyObject *
DeviceArray_astype(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs,
                   PyObject *kwnames)
{
    static const char *const names[] = {"dtype", "copy", NULL};
    cl_state *st = cl_state_from_type(Py_TYPE(self));
    PyObject *argv[2];
    cl_dtype dtype;
    if (cl_parse_args("astype", args, nargs, kwnames, names, 1, argv) < 0 ||
        cl_dtype_converter(st, argv[0], "astype", "dtype", &dtype) < 0) {
        return NULL;
    }
    int copy = argv[1] == NULL ? 1 : PyObject_IsTrue(argv[1]);
    if (copy < 0) {
        return NULL;
    }
    if (!copy && dtype == self->dtype) {
        return Py_NewRef((PyObject *)self);
    }
    return (PyObject *)cl_array_copy_op(st, "astype", self, dtype);
}

/* Axis argument in [-ndim, ndim) -> [0, ndim). */
static int
normalize_axis(PyObject *obj, int ndim, const char *func, int *axis)
{
    Py_ssize_t value;
    if (cl_parse_index(obj, func, "axes", &value) < 0) {
        return -1;
    }
    if (value < -ndim || value >= ndim) {
        return cl_arg_error(PyExc_ValueError, func, "axes",
                            "axis %zd is out of bounds for an array of dimension %d", value,
                            ndim);
    }
    *axis = (int)(value < 0 ? value + ndim : value);
    return 0;
}

PyDoc_STRVAR(transpose_doc,
"transpose(*axes)\n--\n\n"
"A view with the axes permuted (reversed when no axes are given); no data moves.");

static PyObject *
DeviceArray_transpose(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs)
{
    int perm[CL_MAX_NDIM];
    bool seen[CL_MAX_NDIM] = {false};
    PyObject *const *items = args;
    Py_ssize_t n = nargs;
    if (nargs == 1 && (PyTuple_Check(args[0]) || PyList_Check(args[0]))) {
        items = PySequence_Fast_ITEMS(args[0]);
        n = PySequence_Fast_GET_SIZE(args[0]);
    }
    if (n == 0 || (nargs == 1 && args[0] == Py_None)) {
        return get_T(self, NULL);
    }
    if (n != self->ndim) {
        return cl_arg_error(PyExc_ValueError, "transpose", "axes",
                            "%zd axes given for an array of dimension %d", n, self->ndim),
               NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (normalize_axis(items[i], self->ndim, "transpose", &perm[i]) < 0) {
            return NULL;
        }
        if (seen[perm[i]]) {
            return cl_arg_error(PyExc_ValueError, "transpose", "axes", "repeated axis %d",
                                perm[i]),
                   NULL;
        }
        seen[perm[i]] = true;
    }
    return (PyObject *)permuted_view(self, perm);
}

/* Strides for viewing `a` with `new_shape` without moving data, or false
 * when the layout does not allow it. Groups of old axes whose product
 * matches a group of new axes must be laid out as one contiguous run. */
static bool
reshape_strides(const DeviceArray *a, int new_ndim, const Py_ssize_t *new_shape,
                Py_ssize_t *new_strides)
{
    Py_ssize_t old_shape[CL_MAX_NDIM], old_strides[CL_MAX_NDIM];
    int old_ndim = 0;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] != 1) { /* extent-1 axes carry no layout */
            old_shape[old_ndim] = a->shape[i];
            old_strides[old_ndim] = a->strides[i];
            old_ndim++;
        }
    }
    int oi = 0, ni = 0;
    while (oi < old_ndim && ni < new_ndim) {
        int oj = oi + 1, nj = ni + 1;
        Py_ssize_t old_prod = old_shape[oi], new_prod = new_shape[ni];
        while (old_prod != new_prod) {
            if (new_prod < old_prod) {
                new_prod *= new_shape[nj++];
            }
            else {
                old_prod *= old_shape[oj++];
            }
        }
        for (int k = oi; k < oj - 1; k++) {
            if (old_strides[k] != old_strides[k + 1] * old_shape[k + 1]) {
                return false;
            }
        }
        new_strides[nj - 1] = old_strides[oj - 1];
        for (int k = nj - 1; k > ni; k--) {
            new_strides[k - 1] = new_strides[k] * new_shape[k];
        }
        oi = oj;
        ni = nj;
    }
    for (; ni < new_ndim; ni++) { /* trailing extent-1 axes */
        new_strides[ni] = (Py_ssize_t)cl_itemsize(a->dtype);
    }
    return true;
}

PyDoc_STRVAR(reshape_doc,
"reshape(*shape)\n--\n\n"
"The same elements (C order) with a new shape; one entry may be -1.\n\n"
"Returns a view when the layout allows it (as NumPy does), otherwise a\n"
"C-contiguous copy.");

/* reshape()'s arguments as a tuple: several ints, or one int or sequence. */
static PyObject *
reshape_items(PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *seq;
    if (nargs != 1) {
        seq = PyTuple_New(nargs);
        for (Py_ssize_t i = 0; seq != NULL && i < nargs; i++) {
            PyTuple_SET_ITEM(seq, i, Py_NewRef(args[i]));
        }
        return seq;
    }
    seq = PyIndex_Check(args[0]) ? PyTuple_Pack(1, args[0]) : PySequence_Tuple(args[0]);
    if (seq == NULL) {
        PyErr_Clear();
        cl_arg_error(PyExc_TypeError, "reshape", "shape", "expected an int or a sequence of ints");
    }
    return seq;
}

/* The new shape, with a -1 entry resolved against `size` elements. -1 is
 * allowed once here, so this does not use cl_parse_shape. */
static int
parse_new_shape(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t size, int *ndim,
                Py_ssize_t *shape)
{
    PyObject *seq = reshape_items(args, nargs);
    if (seq == NULL) {
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    int unknown = -1, rc = 0;
    Py_ssize_t known = 1;
    if (n > CL_MAX_NDIM) {
        rc = cl_arg_error(PyExc_ValueError, "reshape", "shape",
                          "%zd dimensions exceed the maximum of %d", n, CL_MAX_NDIM);
    }
    for (int i = 0; rc == 0 && i < n; i++) {
        rc = cl_parse_index(PyTuple_GET_ITEM(seq, i), "reshape", "shape", &shape[i]);
        if (rc == 0 && shape[i] == -1 && unknown >= 0) {
            rc = cl_arg_error(PyExc_ValueError, "reshape", "shape",
                              "can only specify one unknown dimension");
        }
        else if (rc == 0 && shape[i] < -1) {
            rc = cl_arg_error(PyExc_ValueError, "reshape", "shape", "negative dimension %zd",
                              shape[i]);
        }
        unknown = rc == 0 && shape[i] == -1 ? i : unknown;
        known *= rc == 0 && shape[i] >= 0 ? shape[i] : 1;
    }
    Py_DECREF(seq);
    if (rc < 0) {
        return -1;
    }
    *ndim = (int)n;
    if (unknown >= 0 && known != 0 && size % known == 0) {
        shape[unknown] = size / known;
    }
    else if (unknown >= 0 || known != size) {
        PyObject *t = cl_shape_tuple(*ndim, shape);
        if (t != NULL) {
            cl_arg_error(PyExc_ValueError, "reshape", "shape",
                         "cannot reshape array of size %zd into shape %R", size, t);
            Py_DECREF(t);
        }
        return -1;
    }
    return 0;
}

static PyObject *
DeviceArray_reshape(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs)
{
    cl_state *st = cl_state_from_type(Py_TYPE(self));
    Py_ssize_t shape[CL_MAX_NDIM], strides[CL_MAX_NDIM];
    int ndim;
    Py_ssize_t size = cl_array_size(self);
    if (parse_new_shape(args, nargs, size, &ndim, shape) < 0) {
        return NULL;
    }
    if (size == 0) {
        cl_c_strides(ndim, shape, cl_itemsize(self->dtype), strides);
        return (PyObject *)cl_array_view(st, self, self->data, ndim, shape, strides);
    }
    if (reshape_strides(self, ndim, shape, strides)) {
        return (PyObject *)cl_array_view(st, self, self->data, ndim, shape, strides);
    }
    DeviceArray *c = cl_array_copy_op(st, "reshape", self, self->dtype);
    if (c == NULL) {
        return NULL;
    }
    /* The copy is a fresh owner: give it the new shape in place. */
    c->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        c->shape[i] = shape[i];
    }
    cl_c_strides(ndim, shape, cl_itemsize(c->dtype), c->strides);
    return (PyObject *)c;
}

PyDoc_STRVAR(array_doc,
"__array__(dtype=None, copy=None)\n--\n\n"
"Always raises TypeError: a device-to-host copy is never implicit.\n"
"Use .get() or cudalab.asnumpy().");

static PyObject *
DeviceArray_array(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kw)
{
    PyErr_SetString(PyExc_TypeError,
                    "implicit conversion of a cudalab.DeviceArray to a NumPy array is not "
                    "allowed; use .get() or cudalab.asnumpy() to copy it to the host");
    return NULL;
}

/* ---- indexing -------------------------------------------------------------- */

/* The view an index builds, axis by axis. */
typedef struct view_builder {
    const DeviceArray *src;
    char *data;
    int ndim;  /* axes of the view so far */
    int dim;   /* next axis of src to index */
    Py_ssize_t shape[CL_MAX_NDIM], strides[CL_MAX_NDIM];
} view_builder;

static int
view_push(view_builder *v, Py_ssize_t extent, Py_ssize_t stride)
{
    if (v->ndim >= CL_MAX_NDIM) {
        PyErr_Format(PyExc_IndexError, "the result would have more than %d dimensions",
                     CL_MAX_NDIM);
        return -1;
    }
    v->shape[v->ndim] = extent;
    v->strides[v->ndim++] = stride;
    return 0;
}

/* src's next axis, unindexed. */
static int
view_keep_axis(view_builder *v)
{
    int d = v->dim++;
    return view_push(v, v->src->shape[d], v->src->strides[d]);
}

static int
view_slice(view_builder *v, PyObject *item)
{
    Py_ssize_t start, stop, step;
    int d = v->dim++;
    if (PySlice_Unpack(item, &start, &stop, &step) < 0) {
        return -1; /* step 0: ValueError from Python */
    }
    /* Any step, as NumPy: `start` is the view's first element (the last one
     * in memory order for a negative step, whose stride then is negative). */
    Py_ssize_t count = PySlice_AdjustIndices(v->src->shape[d], &start, &stop, step);
    if (count > 0) {
        v->data += start * v->src->strides[d];
    }
    return view_push(v, count, v->src->strides[d] * step);
}

static int
view_integer(view_builder *v, PyObject *item)
{
    int d = v->dim++;
    Py_ssize_t index = PyNumber_AsSsize_t(item, PyExc_IndexError);
    if (index == -1 && PyErr_Occurred()) {
        return -1;
    }
    Py_ssize_t extent = v->src->shape[d];
    if (index < -extent || index >= extent) {
        PyErr_Format(PyExc_IndexError, "index %zd is out of bounds for axis %d with size %zd",
                     index, d, extent);
        return -1;
    }
    v->data += (index < 0 ? index + extent : index) * v->src->strides[d];
    return 0;
}

/* One item of the index; `skipped` axes stand for an Ellipsis. */
static int
view_item(view_builder *v, PyObject *item, int skipped)
{
    if (item == Py_Ellipsis) {
        for (int k = 0; k < skipped; k++) {
            if (view_keep_axis(v) < 0) {
                return -1;
            }
        }
        return 0;
    }
    if (item == Py_None) {
        return view_push(v, 1, 0);
    }
    if (PySlice_Check(item)) {
        return view_slice(v, item);
    }
    if (!PyBool_Check(item) && !PyArray_Check(item) && PyIndex_Check(item)) {
        return view_integer(v, item);
    }
    PyErr_Format(PyExc_TypeError,
                 "DeviceArray indices must be integers, slices, Ellipsis or "
                 "None, not %.100s (advanced indexing is not supported)",
                 Py_TYPE(item)->tp_name);
    return -1;
}

/* How many of the array's axes the items index (all but Ellipsis and None),
 * or -1 with IndexError. */
static int
indexed_axes(const DeviceArray *a, PyObject *items)
{
    int consumed = 0, ellipses = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items); i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        ellipses += item == Py_Ellipsis;
        consumed += item != Py_Ellipsis && item != Py_None;
    }
    if (ellipses > 1) {
        PyErr_SetString(PyExc_IndexError, "an index can only have a single ellipsis ('...')");
        return -1;
    }
    if (consumed > a->ndim) {
        PyErr_Format(PyExc_IndexError,
                     "too many indices for DeviceArray: array is %d-dimensional, but %d were "
                     "indexed", a->ndim, consumed);
        return -1;
    }
    return consumed;
}

static PyObject *
DeviceArray_subscript(DeviceArray *self, PyObject *key)
{
    view_builder v = {.src = self, .data = self->data, .ndim = 0, .dim = 0};
    PyObject *items = PyTuple_Check(key) ? Py_NewRef(key) : PyTuple_Pack(1, key);
    if (items == NULL) {
        return NULL;
    }
    int consumed = indexed_axes(self, items);
    int rc = consumed < 0 ? -1 : 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PyTuple_GET_SIZE(items); i++) {
        rc = view_item(&v, PyTuple_GET_ITEM(items, i), self->ndim - consumed);
    }
    while (rc == 0 && v.dim < self->ndim) { /* unindexed trailing axes */
        rc = view_keep_axis(&v);
    }
    Py_DECREF(items);
    if (rc < 0) {
        return NULL;
    }
    return (PyObject *)cl_array_view(cl_state_from_type(Py_TYPE(self)), self, v.data, v.ndim,
                                     v.shape, v.strides);
}

PyDoc_STRVAR(record_stream_doc,
"record_stream(stream)\n--\n\n"
"Mark the memory as used on `stream` (a Stream): its free then waits for the\n"
"work enqueued there so far, like torch's record_stream. Ops record the\n"
"streams they run on automatically.");

static PyObject *
DeviceArray_record_stream(DeviceArray *self, PyObject *stream)
{
    cl_state *st = cl_state_from_type(Py_TYPE(self));
    cudaStream_t handle;
    int device;
    if (cl_stream_handle(st, stream, "record_stream", "stream", &handle, &device) < 0) {
        return NULL;
    }
    cl_array_note_stream(self, handle);
    Py_RETURN_NONE;
}

static PyMethodDef DeviceArray_methods[] = {
    {"get", (PyCFunction)(void (*)(void))DeviceArray_get, METH_FASTCALL | METH_KEYWORDS,
     get_doc},
    {"record_stream", (PyCFunction)DeviceArray_record_stream, METH_O, record_stream_doc},
    {"__dlpack__", (PyCFunction)(void (*)(void))cl_array_dlpack, METH_FASTCALL | METH_KEYWORDS,
     "__dlpack__(stream=None, max_version=None, dl_device=None, copy=None)\n--\n\n"
     "Export as a DLPack capsule (zero-copy); see cudalab.from_dlpack. Strides\n"
     "go as they are, negative ones too (DLPack allows them; PyTorch does not\n"
     "take them: export a reversed view's copy() there)."},
    {"__dlpack_device__", (PyCFunction)cl_array_dlpack_device, METH_NOARGS,
     "__dlpack_device__()\n--\n\n(2, device): kDLCUDA and the device index."},
    {"copy", (PyCFunction)DeviceArray_copy, METH_NOARGS, copy_doc},
    {"to", (PyCFunction)(void (*)(void))DeviceArray_to, METH_FASTCALL | METH_KEYWORDS, to_doc},
    {"astype", (PyCFunction)(void (*)(void))DeviceArray_astype, METH_FASTCALL | METH_KEYWORDS,
     astype_doc},
    {"transpose", (PyCFunction)(void (*)(void))DeviceArray_transpose, METH_FASTCALL,
     transpose_doc},
    {"reshape", (PyCFunction)(void (*)(void))DeviceArray_reshape, METH_FASTCALL, reshape_doc},
    {"__array__", (PyCFunction)(void (*)(void))DeviceArray_array, METH_FASTCALL | METH_KEYWORDS,
     array_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef DeviceArray_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(DeviceArray, weakreflist), READONLY},
    {NULL},
};

PyDoc_STRVAR(DeviceArray_doc,
"An n-dimensional array in GPU memory (rank <= 8).\n\n"
"Create one with cudalab.asarray, empty, zeros, ones, full or their *_like\n"
"forms; it cannot be constructed directly. Strides are in bytes, and\n"
"negative for an axis sliced with a negative step. Slicing (any step, as\n"
"NumPy: a[::-1] is a view), .T, transpose() and most reshape() calls return\n"
"views that keep the owning array alive. Memory comes from the device's\n"
"stream-ordered pool and goes back to it when the last reference dies.");

static PyType_Slot DeviceArray_slots[] = {
    {Py_tp_doc, (void *)DeviceArray_doc},
    {Py_tp_dealloc, cl_array_dealloc},
    {Py_tp_traverse, cl_array_traverse},
    {Py_tp_clear, cl_array_clear},
    {Py_tp_repr, DeviceArray_repr},
    {Py_tp_getset, DeviceArray_getset},
    {Py_tp_methods, DeviceArray_methods},
    {Py_tp_members, DeviceArray_members},
    {Py_mp_subscript, DeviceArray_subscript},
    {Py_nb_add, cl_nb_add},
    {Py_nb_subtract, cl_nb_subtract},
    {Py_nb_multiply, cl_nb_multiply},
    {Py_nb_true_divide, cl_nb_true_divide},
    {Py_nb_inplace_add, cl_nb_inplace_add},
    {Py_nb_inplace_subtract, cl_nb_inplace_subtract},
    {Py_nb_inplace_multiply, cl_nb_inplace_multiply},
    {Py_nb_inplace_true_divide, cl_nb_inplace_true_divide},
    {Py_nb_negative, cl_nb_negative},
    {Py_nb_absolute, cl_nb_absolute},
    {Py_nb_matrix_multiply, cl_nb_matrix_multiply},
    {Py_mp_length, DeviceArray_length},
    {Py_sq_length, DeviceArray_length},
    {0, NULL},
};

PyType_Spec cl_DeviceArray_spec = {
    .name = "cudalab.DeviceArray",
    .basicsize = sizeof(DeviceArray),
    /* Not a base type: module state is found through the exact type. No
     * tp_new: arrays come only from the module's constructors. */
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = DeviceArray_slots,
};
