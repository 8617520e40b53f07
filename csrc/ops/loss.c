/* Losses for training (the nn primitives): the fused softmax cross-entropy,
 * forward and backward in one kernel (cuda/ops/cross_entropy.cu).
 *
 *   _nn_cross_entropy(logits, labels, grad=None, reduction='mean',
 *                     loss_scale=None, out=None, ignore_index=-100)
 *
 * parse (the arguments that need no array first, so that their errors can
 * be tested without a device; then every array: dtype, shape, layout,
 * device, overlap) -> run (on the op frame: the result, a scratch buffer
 * for the per-row losses of a reduced loss, one launcher call). Nothing
 * here reads device memory: a bad label is found on the device and gives a
 * NaN loss, so the call never synchronizes and can be captured in a graph. */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "core/core.h"

typedef struct ce_call {
    cl_op op;
    cl_loss_reduction reduction;
    long long ignore_index;
    bool has_ignore;
    DeviceArray *logits, *labels, *grad, *loss_scale, *out;
    Py_ssize_t rows, cols;
} ce_call;

/* ---- parse: the arguments that need no array ------------------------------ */

static int
parse_reduction(ce_call *c, PyObject *obj)
{
    static const char *const names[] = {"none", "mean", "sum"};
    if (obj == NULL) {
        c->reduction = CL_LOSS_MEAN;
        return 0;
    }
    if (!PyUnicode_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, c->op.func, "reduction",
                            "expected 'mean', 'sum' or 'none', got %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    for (int r = 0; r < 3; r++) {
        if (PyUnicode_CompareWithASCIIString(obj, names[r]) == 0) {
            c->reduction = (cl_loss_reduction)r; /* the order of cl_loss_reduction */
            return 0;
        }
    }
    return cl_arg_error(PyExc_ValueError, c->op.func, "reduction",
                        "expected 'mean', 'sum' or 'none', got %R", obj);
}

static int
parse_ignore_index(ce_call *c, PyObject *obj)
{
    c->has_ignore = obj != Py_None;
    c->ignore_index = -100; /* torch's default */
    if (obj == NULL || obj == Py_None) {
        return 0;
    }
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        return cl_expected_type_error(c->op.func, "ignore_index", "an int or None", obj);
    }
    int overflow = 0;
    c->ignore_index = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow != 0) {
        return cl_arg_error(PyExc_OverflowError, c->op.func, "ignore_index",
                            "%R does not fit in int64", obj);
    }
    return c->ignore_index == -1 && PyErr_Occurred() ? -1 : 0;
}

/* An optional array argument: None or absent gives NULL; anything but a
 * DeviceArray is refused before any array is looked at. */
static int
optional_array_type(ce_call *c, PyObject *obj, const char *param)
{
    if (obj == NULL || obj == Py_None || CL_IS_DEVICEARRAY(c->op.st, obj)) {
        return 0;
    }
    return cl_expected_array_error(c->op.func, param, obj, true);
}

/* ---- parse: the arrays --------------------------------------------------- */

static bool
rows_contiguous(const DeviceArray *a)
{
    /* An empty array has no row to read, whatever strides it was given. */
    return a->shape[0] == 0 || a->shape[1] <= 1
           || a->strides[1] == (Py_ssize_t)cl_itemsize(a->dtype);
}

static int
check_logits_labels(ce_call *c)
{
    const char *func = c->op.func;
    const DeviceArray *x = c->logits, *y = c->labels;
    if (x->dtype != CL_FLOAT16 && x->dtype != CL_BFLOAT16 && x->dtype != CL_FLOAT32) {
        return cl_arg_error(PyExc_TypeError, func, "logits",
                            "expected a float16, bfloat16 or float32 array, got %s",
                            cl_dtype_name(x->dtype));
    }
    if (x->ndim != 2 || x->shape[1] < 1) {
        PyObject *shape = cl_shape_tuple(x->ndim, x->shape);
        if (shape != NULL) {
            cl_arg_error(PyExc_ValueError, func, "logits",
                         "expected shape (N, C) with C >= 1, got %R", shape);
        }
        Py_XDECREF(shape);
        return -1;
    }
    if (!rows_contiguous(x)) {
        return cl_arg_error(PyExc_ValueError, func, "logits",
                            "each row must be contiguous (unit stride along axis 1)");
    }
    c->rows = x->shape[0];
    c->cols = x->shape[1];
    if (y->dtype != CL_INT32 && y->dtype != CL_INT64) {
        return cl_arg_error(PyExc_TypeError, func, "labels",
                            "expected an int32 or int64 array of class indices, got %s",
                            cl_dtype_name(y->dtype));
    }
    if (y->ndim != 1 || y->shape[0] != c->rows) {
        PyObject *shape = cl_shape_tuple(y->ndim, y->shape);
        if (shape != NULL) {
            cl_arg_error(PyExc_ValueError, func, "labels",
                         "expected shape (%zd,), one label per row of logits, got %R", c->rows,
                         shape);
        }
        Py_XDECREF(shape);
        return -1;
    }
    return 0;
}

static int
check_grad(ce_call *c)
{
    const char *func = c->op.func;
    const DeviceArray *g = c->grad, *x = c->logits;
    if (g == NULL) {
        return 0;
    }
    if (cl_op_same_device(&c->op, g, "grad") < 0) {
        return -1;
    }
    if (g->dtype != x->dtype) {
        return cl_arg_error(PyExc_TypeError, func, "grad",
                            "has dtype %s but logits have dtype %s", cl_dtype_name(g->dtype),
                            cl_dtype_name(x->dtype));
    }
    if (g->ndim != 2 || g->shape[0] != x->shape[0] || g->shape[1] != x->shape[1]) {
        PyObject *got = cl_shape_tuple(g->ndim, g->shape);
        PyObject *want = cl_shape_tuple(x->ndim, x->shape);
        if (got != NULL && want != NULL) {
            cl_arg_error(PyExc_ValueError, func, "grad",
                         "has shape %R but logits have shape %R", got, want);
        }
        Py_XDECREF(got);
        Py_XDECREF(want);
        return -1;
    }
    Py_ssize_t row_bytes = g->shape[1] * (Py_ssize_t)cl_itemsize(g->dtype);
    Py_ssize_t step = g->strides[0] < 0 ? -g->strides[0] : g->strides[0];
    if (!rows_contiguous(g) || (g->shape[0] > 1 && step < row_bytes)) {
        return cl_arg_error(PyExc_ValueError, func, "grad",
                            "each row must be contiguous (unit stride along axis 1) and rows "
                            "must not overlap");
    }
    return 0;
}

static int
check_loss_scale_out(ce_call *c, PyObject *out_obj)
{
    const char *func = c->op.func;
    const DeviceArray *s = c->loss_scale;
    if (s != NULL && (cl_op_same_device(&c->op, s, "loss_scale") < 0)) {
        return -1;
    }
    if (s != NULL && (s->dtype != CL_FLOAT32 || cl_array_size(s) != 1)) {
        return cl_arg_error(s->dtype != CL_FLOAT32 ? PyExc_TypeError : PyExc_ValueError, func,
                            "loss_scale", "expected a float32 array of one element, got %s "
                            "with %zd elements", cl_dtype_name(s->dtype), cl_array_size(s));
    }
    if (c->reduction == CL_LOSS_NONE) {
        return cl_op_out(&c->op, out_obj, 1, &c->rows, &c->out) < 0 ||
                       cl_op_out_dtype(&c->op, c->out, CL_FLOAT32) < 0
                   ? -1
                   : 0;
    }
    if (out_obj == NULL || out_obj == Py_None) {
        return 0;
    }
    c->out = (DeviceArray *)out_obj; /* a DeviceArray: optional_array_type checked it */
    if (cl_array_size(c->out) != 1) {
        PyObject *shape = cl_shape_tuple(c->out->ndim, c->out->shape);
        if (shape != NULL) {
            cl_arg_error(PyExc_ValueError, func, "out",
                         "expected one element for the reduced loss, got shape %R", shape);
        }
        Py_XDECREF(shape);
        return -1;
    }
    return cl_op_same_device(&c->op, c->out, "out") < 0 ||
                   cl_op_out_dtype(&c->op, c->out, CL_FLOAT32) < 0
               ? -1
               : 0;
}

/* grad may be exactly logits (the gradient written over them); no other
 * pair of operands may share memory. */
static int
check_overlap(ce_call *c)
{
    const DeviceArray *inputs[3] = {c->logits, c->labels, c->loss_scale};
    const char *names[3] = {"logits", "labels", "loss_scale"};
    const DeviceArray *outputs[2] = {c->grad, c->out};
    const char *out_names[2] = {"grad", "out"};
    for (int o = 0; o < 2; o++) {
        for (int i = 0; outputs[o] != NULL && i < 3; i++) {
            const DeviceArray *a = inputs[i];
            bool same = o == 0 && i == 0 && !cl_out_needs_copy(c->grad, c->logits);
            if (a != NULL && cl_arrays_overlap(outputs[o], a) && !same) {
                return cl_arg_error(PyExc_ValueError, c->op.func, out_names[o],
                                    "shares memory with '%s'%s", names[i],
                                    o == 0 && i == 0 ? " (only grad=logits itself is allowed)"
                                                     : "");
            }
        }
    }
    if (c->grad != NULL && c->out != NULL && cl_arrays_overlap(c->grad, c->out)) {
        return cl_arg_error(PyExc_ValueError, c->op.func, "out", "shares memory with 'grad'");
    }
    return 0;
}

static int
ce_parse(ce_call *c, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"logits",     "labels", "grad",         "reduction",
                                        "loss_scale", "out",    "ignore_index", NULL};
    PyObject *argv[7];
    if (cl_parse_args(c->op.func, args, nargs, kwnames, names, 2, argv) < 0 ||
        parse_reduction(c, argv[3]) < 0 || parse_ignore_index(c, argv[6]) < 0 ||
        optional_array_type(c, argv[2], "grad") < 0 ||
        optional_array_type(c, argv[4], "loss_scale") < 0 ||
        cl_op_out_type(&c->op, argv[5]) < 0 ||
        cl_op_array(&c->op, argv[0], "logits", &c->logits) < 0 ||
        cl_op_array(&c->op, argv[1], "labels", &c->labels) < 0 || check_logits_labels(c) < 0) {
        return -1;
    }
    c->grad = argv[2] == Py_None ? NULL : (DeviceArray *)argv[2];
    c->loss_scale = argv[4] == Py_None ? NULL : (DeviceArray *)argv[4];
    if (check_grad(c) < 0 || check_loss_scale_out(c, argv[5]) < 0) {
        return -1;
    }
    return check_overlap(c);
}

/* ---- run --------------------------------------------------------------------- */

static void
ce_describe(const ce_call *c, DeviceArray *losses, DeviceArray *total, cl_cross_entropy_desc *d)
{
    const Py_ssize_t item = (Py_ssize_t)cl_itemsize(c->logits->dtype);
    *d = (cl_cross_entropy_desc){
        .dtype = c->logits->dtype,
        .label_dtype = c->labels->dtype,
        .reduction = c->reduction,
        .logits = c->logits->data,
        .labels = c->labels->data,
        .grad = c->grad != NULL ? c->grad->data : NULL,
        .losses = (float *)losses->data,
        .losses_stride = losses->strides[0] / (Py_ssize_t)sizeof(float),
        .total = total != NULL ? (float *)total->data : NULL,
        .count = total != NULL ? (float *)losses->data + c->rows : NULL,
        .loss_scale = c->loss_scale != NULL ? (const float *)c->loss_scale->data : NULL,
        .rows = c->rows,
        .cols = c->cols,
        .logits_ld = c->logits->strides[0] / item,
        .grad_ld = c->grad != NULL ? c->grad->strides[0] / item : 0,
        .labels_stride = c->labels->strides[0] / (Py_ssize_t)cl_itemsize(c->labels->dtype),
        .ignore_index = c->ignore_index,
        .has_ignore = c->has_ignore,
    };
}

/* The result (out=, or a new array: (N,) for 'none', else 0-d) and, for a
 * reduced loss, the per-row losses in a scratch buffer (rows + 1 floats:
 * the last holds the count of rows not ignored). */
static PyObject *
ce_run(ce_call *c)
{
    cl_op *op = &c->op;
    const bool reduced = c->reduction != CL_LOSS_NONE;
    Py_ssize_t scratch_len = c->rows + 1;
    DeviceArray *result = c->out != NULL ? (DeviceArray *)Py_NewRef(c->out)
                                         : cl_op_new(op, reduced ? 0 : 1, &c->rows, NULL,
                                                     CL_FLOAT32);
    DeviceArray *scratch = result != NULL && reduced
                               ? cl_op_new(op, 1, &scratch_len, NULL, CL_FLOAT32)
                               : NULL;
    if (result == NULL || (reduced && scratch == NULL)) {
        goto fail;
    }
    const DeviceArray *used[6] = {c->logits, c->labels, c->grad, c->loss_scale, result, scratch};
    for (int k = 0; k < 6; k++) {
        cl_op_use(op, used[k]);
    }
    if (reduced || c->rows > 0) {
        cl_cross_entropy_desc d;
        ce_describe(c, reduced ? scratch : result, reduced ? result : NULL, &d);
        CL_CUDA_CHECK(op->st, cl_cross_entropy(&d, op->stream));
    }
    Py_XDECREF(scratch); /* freed on the stream, after the kernels that use it */
    return (PyObject *)result;
fail:
    Py_XDECREF(scratch);
    Py_XDECREF(result);
    return NULL;
}

PyDoc_STRVAR(
    _nn_cross_entropy_doc,
    "_nn_cross_entropy(logits, labels, grad=None, reduction='mean', loss_scale=None, out=None, "
    "ignore_index=-100)\n--\n\n"
    "Softmax cross-entropy of class logits, and its gradient, in one kernel.\n\n"
    "Per row: ``loss = logsumexp(logits[i]) - logits[i, labels[i]]``, computed in\n"
    "float32 with the row maximum subtracted (no overflow for large logits), as\n"
    "torch.nn.functional.cross_entropy without label smoothing or class weights.\n\n"
    "Parameters\n----------\n"
    "logits : DeviceArray\n"
    "    (N, C), float16, bfloat16 or float32; each row contiguous (any row\n"
    "    stride); C >= 1.\n"
    "labels : DeviceArray\n"
    "    (N,), int32 or int64 class indices in [0, C), any stride.\n"
    "grad : DeviceArray, optional\n"
    "    (N, C) of logits' dtype, each row contiguous, rows not overlapping; may\n"
    "    be `logits` itself. Receives ``(softmax(logits) - onehot(labels)) * g``,\n"
    "    g being 1/(rows not ignored) for 'mean' and 1 otherwise, times\n"
    "    `loss_scale`: the gradient of the (scaled) reduced loss, or of the sum of\n"
    "    the per-row losses for 'none'.\n"
    "reduction : {'mean', 'sum', 'none'}, optional\n"
    "loss_scale : DeviceArray, optional\n"
    "    One float32 element, read on the device: the gradient is that of\n"
    "    ``loss * loss_scale`` (a dynamic loss scaler's scaled loss). The loss\n"
    "    returned is not scaled.\n"
    "out : DeviceArray, optional\n"
    "    Float32: one element (any shape) for 'mean'/'sum', shape (N,) for 'none'.\n"
    "ignore_index : int or None, optional\n"
    "    Rows whose label equals it have loss 0 and a zero gradient and are left\n"
    "    out of the mean (torch's default -100). None: every label is a class.\n\n"
    "Returns\n-------\nDeviceArray\n"
    "    `out`, or a new float32 array: 0-d for 'mean' and 'sum', (N,) for 'none'.\n\n"
    "Raises\n------\n"
    "TypeError\n"
    "    An argument of the wrong type, or a dtype other than those above.\n"
    "ValueError\n"
    "    A bad reduction name, shape or row layout, arrays on different devices,\n"
    "    or outputs sharing memory with inputs (other than ``grad=logits``).\n\n"
    "Notes\n-----\n"
    "Labels are checked on the device, never read back: a label outside\n"
    "[0, C) (and not `ignore_index`) makes its row's loss and gradient NaN, and\n"
    "so the reduced loss NaN, instead of reading out of bounds; a loss scaler\n"
    "then skips the step. 'mean' over no counted rows is NaN, as in PyTorch.\n"
    "One read of the logits gives the loss and the gradient (a warp per row up\n"
    "to C = 1024, else a block per row, which reads the row again from L2 for\n"
    "the gradient). The reduction is a fixed-order single-block sum without\n"
    "atomics, so results are bit-identical run to run; it counts rows in float32\n"
    "(exact below 2**24 rows). Asynchronous on the current stream of logits'\n"
    "device; no host synchronization, so it can be captured in a CUDA graph.");

static PyObject *
_nn_cross_entropy(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    ce_call c = {0};
    cl_op_init(&c.op, cl_state_from_module(module), "_nn_cross_entropy");
    cl_op_record_as(&c.op, "cross_entropy"); /* errors name _nn_cross_entropy */
    if (ce_parse(&c, args, nargs, kwnames) < 0 || cl_op_begin(&c.op) < 0) {
        return NULL;
    }
    PyObject *result = ce_run(&c);
    if (!CL_OP_PROFILING(&c.op)) {
        return cl_op_end(&c.op, result, NULL);
    }
    /* Bytes: logits and labels read, the gradient written (the row kernels'
     * traffic; the per-row losses are small beside them). */
    cl_prof_info info = {
        .dtype = (int)c.logits->dtype,
        .bytes = cl_prof_nbytes(c.logits) + cl_prof_nbytes(c.labels) +
                 (c.grad != NULL ? cl_prof_nbytes(c.grad) : 0),
        .flops = -1,
        .ninputs = 2,
        .inputs = {c.logits, c.labels},
        .out_ndim = c.reduction == CL_LOSS_NONE ? 1 : 0,
        .out_shape = &c.rows,
    };
    return cl_op_end(&c.op, result, &info);
}

PyMethodDef cl_loss_methods[] = {
    CL_FASTCALL(_nn_cross_entropy),
    {NULL, NULL, 0, NULL},
};
