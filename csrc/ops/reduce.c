/* Reductions over all elements or one axis (sum, mean, max, min, argmax: the
 * CL_REDUCE_OPS table of cuda/kernels.h), and softmax / log_softmax along one
 * axis.
 *
 * Every entry point runs on the op frame (frame/frame.h) in three steps:
 * parse (every argument checked before the GPU is touched, the non-array
 * ones first, so that their errors can be tested without a device), plan
 * (result shape and dtypes, out=), run (on the device).
 *
 * A reduction is described to cuda/reduce.cu as a 3-D problem (outer,
 * reduced, inner; see cl_reduce_desc): a reduction over one axis of a
 * C-contiguous array, along any axis, and of most views (.T, slices) maps
 * onto it without a copy; other layouts are first made C-contiguous.
 *
 * Result dtypes follow NumPy 2 where we can: sum of bool and integers ->
 * int64 (NumPy gives uint64 for uint8; we have no uint64 and give int64), mean
 * of bool and integers -> float64, float16/bfloat16 accumulate in float32 and
 * return their own dtype. `dtype=` casts the input to that dtype first and
 * returns that dtype, as NumPy does. out= takes the result cast to its dtype. */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "core/core.h"

#define AXIS_ALL (-1)

/* ---- layout helpers shared by the reductions and softmax ------------------- */

static void
element_strides(const DeviceArray *a, Py_ssize_t *strides)
{
    Py_ssize_t item = (Py_ssize_t)cl_itemsize(a->dtype);
    for (int i = 0; i < a->ndim; i++) {
        strides[i] = a->strides[i] / item;
    }
}

static int
normalize_axis(const char *func, Py_ssize_t value, int ndim, int *axis)
{
    if (value < -ndim || value >= ndim) {
        return cl_arg_error(PyExc_ValueError, func, "axis",
                            "axis %zd is out of bounds for array of dimension %d", value, ndim);
    }
    *axis = (int)(value < 0 ? value + ndim : value);
    return 0;
}

/* The axes other than the one an op runs along, as at most two groups
 * (outer, inner) of one or two arrays of the same shape. */
typedef struct axis_groups {
    int n;
    Py_ssize_t shape[CL_MAX_NDIM];
    Py_ssize_t stride[2][CL_MAX_NDIM]; /* elements, per array */
} axis_groups;

/* Axes of `shape` other than `skip`, in order, unit extents dropped and
 * neighbours merged where the outer steps exactly over the inner in each of
 * the `nsets` stride sets (elements). A zero extent gives one empty group. */
static void
group_axes(int ndim, const Py_ssize_t *shape, int skip, int nsets,
           Py_ssize_t strides[][CL_MAX_NDIM], axis_groups *g)
{
    g->n = 0;
    for (int i = 0; i < ndim; i++) {
        if (i == skip || shape[i] == 1) {
            continue;
        }
        if (shape[i] == 0) { /* nothing will be read */
            g->n = 1;
            g->shape[0] = 0;
            g->stride[0][0] = g->stride[1][0] = 0;
            return;
        }
        bool merge = g->n > 0;
        for (int s = 0; merge && s < nsets; s++) {
            merge = g->stride[s][g->n - 1] == strides[s][i] * shape[i];
        }
        int k = merge ? g->n - 1 : g->n++;
        g->shape[k] = merge ? g->shape[k] * shape[i] : shape[i];
        for (int s = 0; s < nsets; s++) {
            g->stride[s][k] = strides[s][i];
        }
    }
}

/* outer x inner (with set `s`'s strides) from at most two groups. */
static bool
groups_2d(const axis_groups *g, int s, int64_t *outer, int64_t *outer_stride, int64_t *inner,
          int64_t *inner_stride)
{
    *outer = *inner = 1;
    *outer_stride = 0;
    *inner_stride = 1;
    if (g->n > 2) {
        return false;
    }
    if (g->n >= 1) {
        *inner = g->shape[g->n - 1];
        *inner_stride = g->stride[s][g->n - 1];
    }
    if (g->n == 2) {
        *outer = g->shape[0];
        *outer_stride = g->stride[s][0];
    }
    return true;
}

/* ---- reductions ------------------------------------------------------------ */

typedef struct reduce_spec {
    const char *func;  /* public name, for messages */
    cl_reduce_op op;
    bool takes_dtype;  /* has dtype= */
    const char *empty; /* the ValueError for an empty reduction, NULL if it has an identity */
} reduce_spec;

#define REDUCE_SPEC_(ID, name, on_float, on_int, takes_dtype, empty, ...)                       \
    [CL_REDUCE_##ID] = {name, CL_REDUCE_##ID, takes_dtype, empty},
static const reduce_spec reduce_specs[CL_REDUCE_NUM_OPS] = {CL_REDUCE_OPS(REDUCE_SPEC_)};

/* One call: its arguments (parse) and what it computes (plan). */
typedef struct reduce_call {
    const reduce_spec *spec;
    cl_op op;
    DeviceArray *a, *out;
    PyObject *out_obj;
    int axis; /* AXIS_ALL or in [0, a->ndim) */
    bool keepdims;
    bool have_dtype;
    cl_dtype want; /* dtype=, when have_dtype */
    int rndim;     /* the result */
    Py_ssize_t rshape[CL_MAX_NDIM];
    Py_ssize_t outputs, len;
    cl_dtype kdtype; /* what the kernels read (a is cast to it first when it differs) */
    cl_dtype nat;    /* what the kernels write */
    cl_dtype final;  /* the result's dtype */
} reduce_call;

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

static int
reduce_parse(reduce_call *rc, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names_dtype[] = {"a", "axis", "keepdims", "dtype", "out", NULL};
    static const char *const names_plain[] = {"a", "axis", "keepdims", "out", NULL};
    const bool takes_dtype = rc->spec->takes_dtype;
    const char *func = rc->op.func;
    PyObject *argv[5];
    if (cl_parse_args(func, args, nargs, kwnames, takes_dtype ? names_dtype : names_plain, 1,
                      argv) < 0) {
        return -1;
    }
    PyObject *dtype_obj = takes_dtype ? argv[3] : NULL;
    rc->out_obj = takes_dtype ? argv[4] : argv[3];
    bool all;
    Py_ssize_t axis = 0;
    if (parse_axis(argv[1], func, &all, &axis) < 0) {
        return -1;
    }
    rc->keepdims = false;
    if (argv[2] != NULL) {
        int truth = PyObject_IsTrue(argv[2]);
        if (truth < 0) {
            return -1;
        }
        rc->keepdims = truth;
    }
    rc->have_dtype = dtype_obj != NULL && dtype_obj != Py_None;
    if (rc->have_dtype && cl_dtype_converter(rc->op.st, dtype_obj, func, "dtype", &rc->want) < 0) {
        return -1;
    }
    if (cl_op_out_type(&rc->op, rc->out_obj) < 0 ||
        cl_op_array(&rc->op, argv[0], "a", &rc->a) < 0) {
        return -1;
    }
    rc->axis = AXIS_ALL;
    return all ? 0 : normalize_axis(func, axis, rc->a->ndim, &rc->axis);
}

/* Result shape and dtypes, the empty-reduction error, out=. */
static int
reduce_plan(reduce_call *rc)
{
    const DeviceArray *a = rc->a;
    const bool all = rc->axis == AXIS_ALL;
    rc->rndim = 0;
    rc->outputs = 1;
    rc->len = all ? cl_array_size(a) : a->shape[rc->axis];
    for (int i = 0; i < a->ndim; i++) {
        if (all || i == rc->axis) {
            if (rc->keepdims) {
                rc->rshape[rc->rndim++] = 1;
            }
            continue;
        }
        rc->rshape[rc->rndim++] = a->shape[i];
        rc->outputs *= a->shape[i];
    }
    /* NumPy's rule: nothing to reduce raises even when the result is empty
     * too (max over axis 1 of a (0, 0) array). */
    if (rc->spec->empty != NULL && rc->len == 0) {
        return cl_arg_error(PyExc_ValueError, rc->op.func, "a", "%s", rc->spec->empty);
    }
    /* dtype= asking for another result than the natural one casts the input. */
    cl_reduce_op op = rc->spec->op;
    rc->kdtype = a->dtype;
    if (rc->have_dtype && cl_reduce_result_dtype(op, a->dtype) != (int)rc->want) {
        rc->kdtype = rc->want;
    }
    rc->nat = (cl_dtype)cl_reduce_result_dtype(op, rc->kdtype);
    rc->final = rc->have_dtype ? rc->want : rc->nat;
    return cl_op_out(&rc->op, rc->out_obj, rc->rndim, rc->rshape, &rc->out);
}

/* Describe reducing `a` over `axis` (AXIS_ALL: everything) as outer x len x
 * inner. Returns false when the layout does not fit (the caller then makes a
 * C-contiguous copy, which always fits). */
static bool
describe(const DeviceArray *a, int axis, bool c_order, cl_reduce_desc *d)
{
    Py_ssize_t n = cl_array_size(a);
    d->src = a->data;
    d->len_stride = 1;
    if (axis == AXIS_ALL) {
        axis_groups none = {.n = 0};
        (void)groups_2d(&none, 0, &d->outer, &d->outer_stride, &d->inner, &d->inner_stride);
        d->len = n;
        /* Any dense layout is one contiguous run, except that argmax's flat
         * index must count in C order. */
        return n <= 1 || (c_order ? cl_is_c_contiguous(a) : cl_is_dense(a));
    }
    Py_ssize_t strides[1][CL_MAX_NDIM];
    element_strides(a, strides[0]);
    d->len = a->shape[axis];
    if (d->len > 1) {
        d->len_stride = a->strides[axis] / (Py_ssize_t)cl_itemsize(a->dtype);
    }
    axis_groups g;
    group_axes(a->ndim, a->shape, axis, 1, strides, &g);
    return groups_2d(&g, 0, &d->outer, &d->outer_stride, &d->inner, &d->inner_stride);
}

/* Scratch for the partials, then the kernels. */
static int
reduce_launch(cl_op *op, const cl_reduce_desc *d, DeviceArray **ws)
{
    size_t bytes = 0;
    CL_CUDA_CHECK(op->st, cl_reduce_workspace(d, &bytes));
    if (bytes > 0) {
        Py_ssize_t shape[1] = {(Py_ssize_t)bytes};
        *ws = cl_op_new(op, 1, shape, NULL, CL_UINT8);
        if (*ws == NULL) {
            return -1;
        }
    }
    CL_CUDA_CHECK(op->st, cl_reduce(d, *ws != NULL ? (*ws)->data : NULL, bytes, op->stream));
    return 0;
fail:
    return -1;
}

/* The kernels wrote `tmp` (NULL: straight into out): cast it to the result
 * dtype and copy it into out. Returns the result (a new reference). */
static PyObject *
reduce_finish(reduce_call *rc, DeviceArray *tmp)
{
    if (tmp == NULL) {
        return Py_NewRef(rc->out);
    }
    DeviceArray *result = (DeviceArray *)Py_NewRef(tmp);
    if (rc->final != rc->nat) {
        Py_SETREF(result, cl_op_contiguous_copy(&rc->op, tmp, rc->final));
        if (result == NULL) {
            return NULL;
        }
    }
    if (rc->out == NULL) {
        return (PyObject *)result;
    }
    int status = cl_op_copy_into(&rc->op, rc->out, result);
    Py_DECREF(result);
    return status < 0 ? NULL : Py_NewRef(rc->out);
}

static PyObject *
reduce_run(reduce_call *rc)
{
    cl_op *op = &rc->op;
    DeviceArray *a = rc->a, *out = rc->out;
    DeviceArray *copy = NULL, *tmp = NULL, *ws = NULL;
    PyObject *result = NULL;
    cl_op_use(op, a);
    cl_op_use(op, out);
    const bool c_order = rc->spec->op == CL_REDUCE_ARGMAX;
    cl_reduce_desc d;
    if (rc->kdtype != a->dtype || !describe(a, rc->axis, c_order, &d)) {
        copy = cl_op_contiguous_copy(op, a, rc->kdtype);
        if (copy == NULL) {
            goto done;
        }
        (void)describe(copy, rc->axis, c_order, &d);
    }
    d.op = rc->spec->op;
    d.src_dtype = rc->kdtype;
    d.dst_dtype = rc->nat;
    /* Write straight into `out` when it is exactly what the kernels produce. */
    if (out != NULL && rc->final == rc->nat && out->dtype == rc->nat && cl_is_c_contiguous(out) &&
        !cl_arrays_overlap(out, copy != NULL ? copy : a)) {
        d.dst = out->data;
    }
    else {
        tmp = cl_op_new(op, rc->rndim, rc->rshape, NULL, rc->nat);
        if (tmp == NULL) {
            goto done;
        }
        d.dst = tmp->data;
    }
    if (reduce_launch(op, &d, &ws) == 0) {
        result = reduce_finish(rc, tmp);
    }
done:
    /* The pool frees on the stream, after the kernels that use these. */
    Py_XDECREF(ws);
    Py_XDECREF(tmp);
    Py_XDECREF(copy);
    return result;
}

static PyObject *
reduce_impl(PyObject *module, const reduce_spec *spec, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames)
{
    reduce_call rc = {.spec = spec};
    cl_op_init(&rc.op, cl_state_from_module(module), spec->func);
    if (reduce_parse(&rc, args, nargs, kwnames) < 0 || reduce_plan(&rc) < 0 ||
        cl_op_begin(&rc.op) < 0) {
        return NULL;
    }
    PyObject *result = reduce_run(&rc);
    if (!CL_OP_PROFILING(&rc.op)) {
        return cl_op_end(&rc.op, result, NULL);
    }
    /* Bytes: the input read once and the result written once. FLOPs: one add
     * per input element for sum and mean of floats. */
    const bool adds = spec->op == CL_REDUCE_SUM || spec->op == CL_REDUCE_MEAN;
    const cl_prof_info info = {
        .dtype = (int)rc.kdtype,
        .bytes = cl_prof_nbytes(rc.a) + (int64_t)rc.outputs * (int64_t)cl_itemsize(rc.final),
        .flops = adds && cl_dtype_is_float(rc.kdtype) ? (int64_t)cl_array_size(rc.a) : -1,
        .ninputs = 1,
        .inputs = {rc.a},
        .out_ndim = rc.rndim,
        .out_shape = rc.rshape,
    };
    return cl_op_end(&rc.op, result, &info);
}

#define REDUCE_FUNC_(ID, ...)                                                                   \
    static PyObject *reduce_##ID(PyObject *module, PyObject *const *args, Py_ssize_t nargs,    \
                                 PyObject *kwnames)                                             \
    {                                                                                           \
        return reduce_impl(module, &reduce_specs[CL_REDUCE_##ID], args, nargs, kwnames);       \
    }
CL_REDUCE_OPS(REDUCE_FUNC_)

/* Docstrings: the table's pieces around the parameters every reduction shares. */
#define REDUCE_SIG_0 ""
#define REDUCE_SIG_1 ", dtype=None"
#define REDUCE_DTYPE_DOC_0 ""
#define REDUCE_DTYPE_DOC_1                                                                      \
    "dtype : dtype-like, optional\n"                                                            \
    "    Cast the input to this dtype, reduce, and return this dtype (float to\n"               \
    "    integer saturates, as astype does).\n"

#define REDUCE_DOC_(ID, name, on_float, on_int, takes_dtype, empty, summary, returns, tail)    \
    PyDoc_STRVAR(reduce_##ID##_doc,                                                            \
        name "(a, axis=None, keepdims=False" REDUCE_SIG_##takes_dtype ", out=None)\n--\n\n"    \
        summary "\n\n"                                                                          \
        "Parameters\n----------\n"                                                              \
        "a : DeviceArray\n"                                                                     \
        "axis : int or None, optional\n"                                                        \
        "    The axis to reduce (negative counts from the end; a 1-tuple is accepted).\n"       \
        "    None (default) reduces over all elements.\n"                                       \
        "keepdims : bool, optional\n"                                                           \
        "    Keep reduced axes with extent 1, so the result broadcasts against `a`.\n"          \
        REDUCE_DTYPE_DOC_##takes_dtype                                                          \
        "out : DeviceArray, optional\n"                                                         \
        "    Array of the result's shape to write into (cast to its dtype as astype\n"          \
        "    casts); returned.\n"                                                               \
        "\nReturns\n-------\nDeviceArray\n" returns "\n" tail);
CL_REDUCE_OPS(REDUCE_DOC_)

/* ---- softmax, log_softmax ---------------------------------------------------
 *
 * Along one axis of a float array, through cuda/softmax.cu. The kernels read
 * the array through its strides when the other axes fold into (outer, inner)
 * for both the input and the result and the layout suits a kernel (the axis
 * contiguous, or the inner axes contiguous and at least a warp wide); any
 * other layout, and an out= overlapping `a` other than exactly, goes through
 * a C-contiguous copy with the axis last, computed in place and copied back. */

typedef struct softmax_call {
    cl_op op;
    bool log;
    DeviceArray *a, *out;
    int axis;
} softmax_call;

static int
softmax_parse(softmax_call *sc, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"a", "axis", "out", NULL};
    const char *func = sc->op.func;
    PyObject *argv[3];
    Py_ssize_t axis = -1;
    if (cl_parse_args(func, args, nargs, kwnames, names, 1, argv) < 0 ||
        (argv[1] != NULL && cl_parse_index(argv[1], func, "axis", &axis) < 0) ||
        cl_op_out_type(&sc->op, argv[2]) < 0 || cl_op_array(&sc->op, argv[0], "a", &sc->a) < 0) {
        return -1;
    }
    const DeviceArray *a = sc->a;
    if (!cl_dtype_is_float(a->dtype)) {
        return cl_arg_error(PyExc_TypeError, func, "a",
                            "expected a float16, bfloat16, float32 or float64 array, got %s",
                            cl_dtype_name(a->dtype));
    }
    if (normalize_axis(func, axis, a->ndim, &sc->axis) < 0 ||
        cl_op_out(&sc->op, argv[2], a->ndim, a->shape, &sc->out) < 0) {
        return -1;
    }
    return cl_op_out_dtype(&sc->op, sc->out, a->dtype);
}

/* Fill `d` for reading `a` and writing `dst` directly; false when their
 * layouts do not fold into (outer, len, inner) together or suit no kernel. */
static bool
softmax_describe(const DeviceArray *a, const DeviceArray *dst, int axis, cl_softmax_desc *d)
{
    Py_ssize_t strides[2][CL_MAX_NDIM];
    element_strides(a, strides[0]);
    element_strides(dst, strides[1]);
    axis_groups g;
    group_axes(a->ndim, a->shape, axis, 2, strides, &g);
    if (!groups_2d(&g, 0, &d->outer, &d->src_outer, &d->inner, &d->src_inner) ||
        !groups_2d(&g, 1, &d->outer, &d->dst_outer, &d->inner, &d->dst_inner)) {
        return false;
    }
    d->src = a->data;
    d->dst = dst->data;
    d->len = a->shape[axis];
    d->src_len = d->len > 1 ? strides[0][axis] : 1;
    d->dst_len = d->len > 1 ? strides[1][axis] : 1;
    if (d->src_len == 1 && d->dst_len == 1) {
        return true; /* the row kernels */
    }
    /* The column kernel: a warp reads 32 neighbouring rows at each position. */
    return d->src_inner == 1 && d->dst_inner == 1 && d->inner >= 32;
}

/* `a` copied C-contiguously with `axis` last, softmax in place, copied into dst. */
static int
softmax_axis_last(cl_op *op, const DeviceArray *a, int axis, DeviceArray *dst,
                  cl_softmax_desc *d)
{
    const int nd = a->ndim;
    Py_ssize_t shape[CL_MAX_NDIM], strides[CL_MAX_NDIM], back[CL_MAX_NDIM];
    int k = 0;
    for (int i = 0; i <= nd; i++) {
        int from = i < nd ? i : axis; /* the other axes in order, then the axis */
        if (i < nd && i == axis) {
            continue;
        }
        shape[k] = a->shape[from];
        strides[k++] = a->strides[from];
    }
    DeviceArray *view = cl_array_view(op->st, (DeviceArray *)a, a->data, nd, shape, strides);
    DeviceArray *tmp = view == NULL ? NULL : cl_op_contiguous_copy(op, view, a->dtype);
    Py_XDECREF(view);
    if (tmp == NULL) {
        return -1;
    }
    for (int i = 0, j = 0; i < nd; i++) { /* tmp's strides in a's axis order */
        back[i] = i == axis ? tmp->strides[nd - 1] : tmp->strides[j++];
    }
    d->src = d->dst = tmp->data;
    d->len = a->shape[axis];
    d->outer = 1;
    d->inner = cl_array_size(a) / d->len;
    d->src_outer = d->dst_outer = 0;
    d->src_inner = d->dst_inner = d->len;
    d->src_len = d->dst_len = 1;
    int status = -1;
    CL_CUDA_CHECK(op->st, cl_softmax(d, op->stream));
    view = cl_array_view(op->st, tmp, tmp->data, nd, a->shape, back);
    status = view == NULL ? -1 : cl_op_copy_into(op, dst, view);
    Py_XDECREF(view);
fail:
    Py_DECREF(tmp); /* freed on the stream, after the work that reads it */
    return status;
}

static PyObject *
softmax_run(softmax_call *sc)
{
    cl_op *op = &sc->op;
    const DeviceArray *a = sc->a;
    DeviceArray *result = sc->out != NULL
                              ? (DeviceArray *)Py_NewRef(sc->out)
                              : cl_op_new(op, a->ndim, a->shape, NULL, a->dtype);
    if (result == NULL || cl_array_size(a) == 0) {
        return (PyObject *)result;
    }
    cl_op_use(op, a);
    cl_op_use(op, result);
    cl_softmax_desc d = {.log = sc->log, .dtype = a->dtype};
    if (!cl_out_needs_copy(result, a) && softmax_describe(a, result, sc->axis, &d)) {
        CL_CUDA_CHECK(op->st, cl_softmax(&d, op->stream));
    }
    else if (softmax_axis_last(op, a, sc->axis, result, &d) < 0) {
        goto fail;
    }
    return (PyObject *)result;
fail:
    Py_DECREF(result);
    return NULL;
}

static PyObject *
softmax_impl(PyObject *module, bool log, PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames)
{
    softmax_call sc = {.log = log};
    cl_op_init(&sc.op, cl_state_from_module(module), log ? "log_softmax" : "softmax");
    if (softmax_parse(&sc, args, nargs, kwnames) < 0 || cl_op_begin(&sc.op) < 0) {
        return NULL;
    }
    PyObject *result = softmax_run(&sc);
    if (!CL_OP_PROFILING(&sc.op)) {
        return cl_op_end(&sc.op, result, NULL);
    }
    /* Bytes: the input read once and the result written once (what the row
     * kernels move; a layout that needs the axis-last copy moves more). */
    const cl_prof_info info = {
        .dtype = (int)sc.a->dtype,
        .bytes = 2 * cl_prof_nbytes(sc.a),
        .flops = -1,
        .ninputs = 1,
        .inputs = {sc.a},
        .out_ndim = sc.a->ndim,
        .out_shape = sc.a->shape,
    };
    return cl_op_end(&sc.op, result, &info);
}

static PyObject *
softmax(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return softmax_impl(module, false, args, nargs, kwnames);
}

static PyObject *
log_softmax(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return softmax_impl(module, true, args, nargs, kwnames);
}

#define SOFTMAX_DOC(name, formula, returns)                                                     \
    name "(a, axis=-1, out=None)\n--\n\n"                                                       \
    formula "\n\n"                                                                              \
    "Parameters\n----------\n"                                                                  \
    "a : DeviceArray\n"                                                                         \
    "    float16, bfloat16, float32 or float64; any shape and strides.\n"                       \
    "axis : int, optional\n"                                                                    \
    "    The axis the slices run along (negative counts from the end); default\n"              \
    "    the last.\n"                                                                           \
    "out : DeviceArray, optional\n"                                                             \
    "    Array of `a`'s shape and dtype to write into (may be `a` itself); returned.\n"        \
    "\nReturns\n-------\nDeviceArray\n"                                                         \
    "    `a`'s shape and dtype (C-contiguous unless `out` is given).\n    " returns "\n"        \
    "\nRaises\n------\n"                                                                        \
    "TypeError\n"                                                                               \
    "    `a` or `out` is not a DeviceArray, `a` is not a float array, `out` has\n"             \
    "    another dtype, or `axis` is not an int.\n"                                             \
    "ValueError\n"                                                                              \
    "    `axis` is out of bounds, or `out` has another shape or device.\n"                      \
    "\nNotes\n-----\n"                                                                          \
    "Numerically stable: each slice's maximum is subtracted before exp, so large\n"            \
    "values do not overflow. float16/bfloat16 are computed in float32, float64\n"              \
    "in float64. A slice holding NaN or +inf, or only -inf, gives NaN (as\n"                   \
    "PyTorch does); an empty slice gives an empty result. Work is enqueued on\n"               \
    "the current stream of `a`'s device.\n"

PyDoc_STRVAR(softmax_doc,
             SOFTMAX_DOC("softmax", "Softmax along one axis: ``exp(a - max) / sum(exp(a - max))``.",
                         "Every slice along `axis` sums to 1."));
PyDoc_STRVAR(log_softmax_doc,
             SOFTMAX_DOC("log_softmax",
                         "Log of the softmax along one axis: ``a - max - log(sum(exp(a - max)))``.",
                         "Computed directly, not as the log of softmax, so\n"
                         "    tiny probabilities keep their precision."));

/* _REDUCTIONS: the names of the table's reductions, in its order (the
 * package re-exports each, the profiler files them as reductions). */
#define REDUCE_NAME_(ID, name, ...) name,
static const char *const reduce_names[] = {CL_REDUCE_OPS(REDUCE_NAME_)};
#undef REDUCE_NAME_

int
cl_reduce_init(PyObject *module)
{
    PyObject *names = PyTuple_New(CL_REDUCE_NUM_OPS);
    for (Py_ssize_t i = 0; names != NULL && i < CL_REDUCE_NUM_OPS; i++) {
        PyObject *name = PyUnicode_InternFromString(reduce_names[i]);
        if (name == NULL) {
            Py_CLEAR(names);
            break;
        }
        PyTuple_SET_ITEM(names, i, name);
    }
    int r = names != NULL ? PyModule_AddObjectRef(module, "_REDUCTIONS", names) : -1;
    Py_XDECREF(names);
    return r;
}

#define REDUCE_ENTRY_(ID, name, ...)                                                            \
    {name, (PyCFunction)(void (*)(void))reduce_##ID, METH_FASTCALL | METH_KEYWORDS,             \
     reduce_##ID##_doc},

PyMethodDef cl_reduce_methods[] = {
    CL_REDUCE_OPS(REDUCE_ENTRY_)
    CL_FASTCALL(softmax),
    CL_FASTCALL(log_softmax),
    {NULL, NULL, 0, NULL},
};
