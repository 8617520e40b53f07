/* Reductions: sum, mean, max, min, argmax over all elements or one axis.
 *
 * Arguments are checked in full before the GPU is touched (the non-array
 * arguments first, so that their errors can be tested without a device).
 * The reduction is then described to cuda/reduce.cu as a 3-D problem
 * (outer, reduced, inner; see cl_reduce_desc): a reduction over one axis of a
 * C-contiguous array, along any axis, and of most views (.T, slices) maps
 * onto it without a copy; other layouts are first made C-contiguous.
 *
 * Result dtypes follow NumPy 2 where we can: sum of bool and integers ->
 * int64 (NumPy gives uint64 for uint8; we have no uint64 and give int64), mean
 * of bool and integers -> float64, float16/bfloat16 accumulate in float32 and
 * return their own dtype. `dtype=` casts the input to that dtype first and
 * returns that dtype, as NumPy does. */
#include "cudalab.h"

typedef struct reduce_spec {
    const char *func;       /* public name, for messages */
    cl_reduce_op op;
    bool has_dtype;         /* takes dtype= */
    const char *empty_text; /* the ValueError for an empty reduction, NULL if it has an identity */
} reduce_spec;

static const reduce_spec SPEC_SUM = {"sum", CL_REDUCE_SUM, true, NULL};
static const reduce_spec SPEC_MEAN = {"mean", CL_REDUCE_MEAN, true, NULL};
static const reduce_spec SPEC_MAX = {
    "max", CL_REDUCE_MAX, false, "zero-size array to reduction operation maximum which has no identity"};
static const reduce_spec SPEC_MIN = {
    "min", CL_REDUCE_MIN, false, "zero-size array to reduction operation minimum which has no identity"};
static const reduce_spec SPEC_ARGMAX = {"argmax", CL_REDUCE_ARGMAX, false,
                                        "attempt to get argmax of an empty sequence"};

#define AXIS_ALL (-1)

/* axis: None, an int, or a 1-tuple/list holding an int. Range is checked later. */
static int
parse_axis(PyObject *obj, const char *func, bool *all, Py_ssize_t *axis)
{
    *all = obj == NULL || obj == Py_None;
    if (*all) {
        return 0;
    }
    if (PyTuple_Check(obj) || PyList_Check(obj)) {
        if (PySequence_Fast_GET_SIZE(obj) != 1) {
            return cl_arg_error(PyExc_TypeError, func, "axis",
                                "expected None or one int; a sequence of %zd axes is not "
                                "supported (reduce one axis at a time)",
                                PySequence_Fast_GET_SIZE(obj));
        }
        obj = PySequence_Fast_GET_ITEM(obj, 0);
    }
    return cl_parse_index(obj, func, "axis", axis);
}

/* Lowest and one-past-highest byte of an array's elements (size > 0). */
static void
byte_extent(const DeviceArray *a, uintptr_t *lo, uintptr_t *hi)
{
    intptr_t min_off = 0, max_off = 0;
    for (int i = 0; i < a->ndim; i++) {
        intptr_t span = (intptr_t)(a->shape[i] - 1) * (intptr_t)a->strides[i];
        if (span < 0) {
            min_off += span;
        }
        else {
            max_off += span;
        }
    }
    *lo = (uintptr_t)a->data + (uintptr_t)min_off;
    *hi = (uintptr_t)a->data + (uintptr_t)max_off + cl_itemsize(a->dtype);
}

static bool
overlaps(const DeviceArray *a, const DeviceArray *b)
{
    if (cl_array_size(a) == 0 || cl_array_size(b) == 0) {
        return false;
    }
    uintptr_t alo, ahi, blo, bhi;
    byte_extent(a, &alo, &ahi);
    byte_extent(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

/* Describe reducing `a` over `axis` (AXIS_ALL: everything) as outer x len x
 * inner. Returns false when the layout does not fit (the caller then makes a
 * C-contiguous copy, which always fits). */
static bool
describe(const DeviceArray *a, int axis, bool c_order, cl_reduce_desc *d)
{
    Py_ssize_t item = (Py_ssize_t)cl_itemsize(a->dtype);
    Py_ssize_t n = cl_array_size(a);
    d->src = a->data;
    d->outer = d->inner = 1;
    d->outer_stride = 0;
    d->inner_stride = 1;
    d->len_stride = 1;
    if (axis == AXIS_ALL) {
        d->len = n;
        if (n <= 1) {
            return true;
        }
        /* Any dense layout is one contiguous run, except that argmax's flat
         * index must count in C order. */
        return c_order ? cl_is_c_contiguous(a) : cl_is_dense(a);
    }
    d->len = a->shape[axis];
    if (d->len > 1) {
        d->len_stride = a->strides[axis] / item;
    }
    /* The other axes, in order, unit extents dropped, neighbours merged where
     * one steps exactly over the other. At most two groups fit. */
    Py_ssize_t gshape[CL_MAX_NDIM], gstride[CL_MAX_NDIM];
    int groups = 0;
    for (int i = 0; i < a->ndim; i++) {
        if (i == axis || a->shape[i] == 1) {
            continue;
        }
        if (a->shape[i] == 0) { /* no outputs: nothing will be read */
            d->outer = 0;
            return true;
        }
        Py_ssize_t stride = a->strides[i] / item;
        if (groups > 0 && gstride[groups - 1] == stride * a->shape[i]) {
            gshape[groups - 1] *= a->shape[i];
            gstride[groups - 1] = stride;
            continue;
        }
        gshape[groups] = a->shape[i];
        gstride[groups] = stride;
        groups++;
    }
    if (groups > 2) {
        return false;
    }
    if (groups >= 1) {
        d->inner = gshape[groups - 1];
        d->inner_stride = gstride[groups - 1];
    }
    if (groups == 2) {
        d->outer = gshape[0];
        d->outer_stride = gstride[0];
    }
    return true;
}

static PyObject *
reduce_impl(PyObject *module, const reduce_spec *spec, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames)
{
    static const char *const names_dtype[] = {"a", "axis", "keepdims", "dtype", "out", NULL};
    static const char *const names_plain[] = {"a", "axis", "keepdims", "out", NULL};
    const char *func = spec->func;
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[5];
    if (cl_parse_args(func, args, nargs, kwnames, spec->has_dtype ? names_dtype : names_plain, 1,
                      argv) < 0) {
        return NULL;
    }
    PyObject *axis_obj = argv[1];
    PyObject *keepdims_obj = argv[2];
    PyObject *dtype_obj = spec->has_dtype ? argv[3] : NULL;
    PyObject *out_obj = spec->has_dtype ? argv[4] : argv[3];

    /* ---- arguments that need no array ---- */
    bool all;
    Py_ssize_t axis_value = 0;
    if (parse_axis(axis_obj, func, &all, &axis_value) < 0) {
        return NULL;
    }
    bool keepdims = false;
    if (keepdims_obj != NULL) {
        int truth = PyObject_IsTrue(keepdims_obj);
        if (truth < 0) {
            return NULL;
        }
        keepdims = truth;
    }
    bool have_dtype = dtype_obj != NULL && dtype_obj != Py_None;
    cl_dtype want = CL_FLOAT32;
    if (have_dtype && cl_dtype_converter(st, dtype_obj, func, "dtype", &want) < 0) {
        return NULL;
    }
    DeviceArray *out = NULL;
    if (out_obj != NULL && out_obj != Py_None) {
        if (!CL_IS_DEVICEARRAY(st, out_obj)) {
            return cl_arg_error(PyExc_TypeError, func, "out",
                                "expected None or a cudalab.DeviceArray, got %.100s",
                                Py_TYPE(out_obj)->tp_name),
                   NULL;
        }
        out = (DeviceArray *)out_obj;
    }
    if (!CL_IS_DEVICEARRAY(st, argv[0])) {
        return cl_arg_error(PyExc_TypeError, func, "a", "expected a cudalab.DeviceArray, got %.100s",
                            Py_TYPE(argv[0])->tp_name),
               NULL;
    }
    DeviceArray *a = (DeviceArray *)argv[0];

    /* ---- arguments checked against the array ---- */
    int axis = AXIS_ALL;
    if (!all) {
        if (axis_value < -a->ndim || axis_value >= a->ndim) {
            return cl_arg_error(PyExc_ValueError, func, "axis",
                                "axis %zd is out of bounds for array of dimension %d",
                                axis_value, a->ndim),
                   NULL;
        }
        axis = (int)(axis_value < 0 ? axis_value + a->ndim : axis_value);
    }
    int rndim = 0;
    Py_ssize_t rshape[CL_MAX_NDIM];
    Py_ssize_t routputs = 1, rlen = all ? cl_array_size(a) : a->shape[axis];
    for (int i = 0; i < a->ndim; i++) {
        if (all || i == axis) {
            if (keepdims) {
                rshape[rndim++] = 1;
            }
            continue;
        }
        rshape[rndim++] = a->shape[i];
        routputs *= a->shape[i];
    }
    if (spec->empty_text != NULL && rlen == 0 && routputs > 0) {
        return cl_arg_error(PyExc_ValueError, func, "a", "%s", spec->empty_text), NULL;
    }
    /* The dtype the kernels work in (the input is cast to it when dtype= asks
     * for another result than the natural one) and the final result dtype. */
    cl_dtype kdtype = a->dtype;
    if (have_dtype && cl_reduce_result_dtype(spec->op, a->dtype) != (int)want) {
        kdtype = want;
    }
    cl_dtype nat = (cl_dtype)cl_reduce_result_dtype(spec->op, kdtype);
    cl_dtype final_dtype = have_dtype ? want : nat;
    if (out != NULL) {
        bool same = out->ndim == rndim;
        for (int i = 0; same && i < rndim; i++) {
            same = out->shape[i] == rshape[i];
        }
        if (!same) {
            PyObject *want_shape = cl_shape_tuple(rndim, rshape);
            PyObject *got_shape = cl_shape_tuple(out->ndim, out->shape);
            if (want_shape != NULL && got_shape != NULL) {
                cl_arg_error(PyExc_ValueError, func, "out",
                             "expected shape %R for the result, got %R", want_shape, got_shape);
            }
            Py_XDECREF(want_shape);
            Py_XDECREF(got_shape);
            return NULL;
        }
        if (out->device != a->device) {
            return cl_arg_error(PyExc_ValueError, func, "out",
                                "is on device %d but the input is on device %d", out->device,
                                a->device),
                   NULL;
        }
    }
    if (cl_require_device(st, func) < 0) {
        return NULL;
    }

    /* ---- compute, on a's device ---- */
    int previous;
    if (cl_device_enter(st, a->device, &previous) < 0) {
        return NULL;
    }
    cl_prof_scope ps;
    cl_prof_begin(st, &ps, func, a->device);
    PyObject *result = NULL;
    DeviceArray *src = (DeviceArray *)Py_NewRef(a);
    DeviceArray *tmp = NULL, *ws = NULL, *cast = NULL;
    cl_reduce_desc d;
    cudaStream_t stream = cl_current_stream(st);
    cl_array_note_stream(a, stream); /* stream-safe frees (record_stream) */
    if (out != NULL) cl_array_note_stream(out, stream);
    bool c_order = spec->op == CL_REDUCE_ARGMAX;

    if (kdtype != a->dtype || !describe(src, axis, c_order, &d)) {
        Py_SETREF(src, cl_array_contiguous_copy(st, func, a, kdtype));
        if (src == NULL) {
            goto done;
        }
        (void)describe(src, axis, c_order, &d);
    }
    d.op = spec->op;
    d.src_dtype = kdtype;
    d.dst_dtype = nat;
    /* Write straight into `out` when it is exactly what the kernel produces. */
    if (out != NULL && final_dtype == nat && out->dtype == nat && cl_is_c_contiguous(out) &&
        !overlaps(out, src)) {
        d.dst = out->data;
    }
    else {
        tmp = cl_array_new(st, func, rndim, rshape, NULL, nat);
        if (tmp == NULL) {
            goto done;
        }
        d.dst = tmp->data;
    }
    size_t ws_bytes = 0;
    CL_CUDA_CHECK(st, cl_reduce_workspace(&d, &ws_bytes));
    if (ws_bytes > 0) {
        Py_ssize_t ws_shape[1] = {(Py_ssize_t)ws_bytes};
        ws = cl_array_new(st, func, 1, ws_shape, NULL, CL_UINT8);
        if (ws == NULL) {
            goto done;
        }
    }
    CL_CUDA_CHECK(st, cl_reduce(&d, ws == NULL ? NULL : ws->data, ws_bytes, stream));

    if (tmp == NULL) {
        result = Py_NewRef(out);
        goto done;
    }
    if (final_dtype != nat) {
        cast = cl_array_contiguous_copy(st, func, tmp, final_dtype);
        if (cast == NULL) {
            goto done;
        }
        Py_SETREF(tmp, cast);
        cast = NULL;
    }
    if (out != NULL) {
        if (cl_array_copy_into(st, out, tmp) < 0) {
            goto done;
        }
        result = Py_NewRef(out);
    }
    else {
        result = Py_NewRef(tmp);
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    if (CL_PROF_ACTIVE(&ps)) {
        /* Bytes: the input read once and the result written once. FLOPs:
         * one add per input element for sum and mean of floats. */
        bool adds = spec->op == CL_REDUCE_SUM || spec->op == CL_REDUCE_MEAN;
        bool floats = kdtype == CL_FLOAT16 || kdtype == CL_BFLOAT16 || kdtype == CL_FLOAT32 ||
                      kdtype == CL_FLOAT64;
        cl_prof_info info = {
            .dtype = (int)kdtype,
            .bytes = cl_prof_nbytes(a) + (int64_t)routputs * (int64_t)cl_itemsize(final_dtype),
            .flops = adds && floats ? (int64_t)cl_array_size(a) : -1,
            .ninputs = 1,
            .inputs = {a},
            .out_ndim = rndim,
            .out_shape = rshape,
        };
        cl_prof_end(st, &ps, result != NULL ? &info : NULL);
    }
    /* The pool frees on the stream, after the kernels that use these. */
    Py_XDECREF(ws);
    Py_XDECREF(tmp);
    Py_XDECREF(cast);
    Py_XDECREF(src);
    cl_device_exit(a->device, previous);
    return result;
}

#define REDUCE_FUNC(cname, spec)                                                                \
    static PyObject *cname(PyObject *module, PyObject *const *args, Py_ssize_t nargs,          \
                           PyObject *kwnames)                                                   \
    {                                                                                           \
        return reduce_impl(module, &spec, args, nargs, kwnames);                                \
    }

REDUCE_FUNC(reduce_sum, SPEC_SUM)
REDUCE_FUNC(reduce_mean, SPEC_MEAN)
REDUCE_FUNC(reduce_max, SPEC_MAX)
REDUCE_FUNC(reduce_min, SPEC_MIN)
REDUCE_FUNC(reduce_argmax, SPEC_ARGMAX)

#define COMMON_PARAMS                                                                           \
    "a : DeviceArray\n"                                                                         \
    "axis : int or None, optional\n"                                                            \
    "    The axis to reduce (negative counts from the end; a 1-tuple is accepted).\n"           \
    "    None (default) reduces over all elements.\n"                                           \
    "keepdims : bool, optional\n"                                                               \
    "    Keep reduced axes with extent 1, so the result broadcasts against `a`.\n"

#define OUT_PARAM                                                                               \
    "out : DeviceArray, optional\n"                                                             \
    "    Array of the result's shape to write into (cast to its dtype); returned.\n"

#define DETERMINISM                                                                             \
    "The result is bit-identical from run to run (fixed combination order, no\n"              \
    "atomics). Work is enqueued on the current stream of `a`'s device.\n"

PyDoc_STRVAR(reduce_sum_doc,
"sum(a, axis=None, keepdims=False, dtype=None, out=None)\n--\n\n"
"Sum of array elements over all elements or one axis.\n\n"
"Parameters\n----------\n" COMMON_PARAMS
"dtype : dtype-like, optional\n"
"    Cast the input to this dtype, sum, and return this dtype.\n" OUT_PARAM
"\nReturns\n-------\nDeviceArray\n"
"    0-d for a full reduction without keepdims. dtype: int64 for bool and\n"
"    integer input (NumPy gives uint64 for uint8; cudalab has no uint64),\n"
"    else the input's; float16/bfloat16 accumulate in float32.\n\n"
"Notes\n-----\n"
"float32 is accumulated in float32 along short per-thread chains combined\n"
"by a tree, so the error stays close to pairwise summation. " DETERMINISM);

PyDoc_STRVAR(reduce_mean_doc,
"mean(a, axis=None, keepdims=False, dtype=None, out=None)\n--\n\n"
"Arithmetic mean over all elements or one axis.\n\n"
"Parameters\n----------\n" COMMON_PARAMS
"dtype : dtype-like, optional\n"
"    Cast the input to this dtype, average, and return this dtype.\n" OUT_PARAM
"\nReturns\n-------\nDeviceArray\n"
"    float64 for bool and integer input, else the input's dtype\n"
"    (float16/bfloat16 accumulate in float32). The mean of nothing is NaN\n"
"    (NumPy also warns; cudalab does not).\n\n"
"Notes\n-----\n" DETERMINISM);

PyDoc_STRVAR(reduce_max_doc,
"max(a, axis=None, keepdims=False, out=None)\n--\n\n"
"Maximum over all elements or one axis; NaN propagates, as in NumPy.\n\n"
"Parameters\n----------\n" COMMON_PARAMS OUT_PARAM
"\nReturns\n-------\nDeviceArray\n    Same dtype as `a`.\n\n"
"Raises\n------\nValueError\n    When a reduced slice is empty (there is no identity).\n");

PyDoc_STRVAR(reduce_min_doc,
"min(a, axis=None, keepdims=False, out=None)\n--\n\n"
"Minimum over all elements or one axis; NaN propagates, as in NumPy.\n\n"
"Parameters\n----------\n" COMMON_PARAMS OUT_PARAM
"\nReturns\n-------\nDeviceArray\n    Same dtype as `a`.\n\n"
"Raises\n------\nValueError\n    When a reduced slice is empty (there is no identity).\n");

PyDoc_STRVAR(reduce_argmax_doc,
"argmax(a, axis=None, keepdims=False, out=None)\n--\n\n"
"Index of the maximum, over all elements (flat C-order index) or along one axis.\n\n"
"Parameters\n----------\n" COMMON_PARAMS OUT_PARAM
"\nReturns\n-------\nDeviceArray\n"
"    int64. Ties give the first occurrence; if a NaN is present, the index\n"
"    of the first NaN, as in NumPy.\n\n"
"Raises\n------\nValueError\n    When a reduced slice is empty.\n");

#define REDUCE_ENTRY(pyname, cname)                                                             \
    {pyname, (PyCFunction)(void (*)(void))cname, METH_FASTCALL | METH_KEYWORDS, cname##_doc}

PyMethodDef cl_reduce_methods[] = {
    REDUCE_ENTRY("sum", reduce_sum),
    REDUCE_ENTRY("mean", reduce_mean),
    REDUCE_ENTRY("max", reduce_max),
    REDUCE_ENTRY("min", reduce_min),
    REDUCE_ENTRY("argmax", reduce_argmax),
    {NULL, NULL, 0, NULL},
};
