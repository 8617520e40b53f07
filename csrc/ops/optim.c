/* Fused multi-tensor kernels for mixed-precision training: the private
 * entry points cudalab.nn's GradScaler and optimizers call.
 *
 *   _nn_unscale_(grads, inv_scale, found_inf)
 *   _nn_update_scale_(scale, growth_tracker, found_inf, growth_factor=2.0,
 *                     backoff_factor=0.5, growth_interval=2000)
 *   _nn_sgd_(params, grads, momentum_buffers, lr, momentum=0.0, dampening=0.0,
 *            weight_decay=0.0, nesterov=False, found_inf=None, grad_scale=None,
 *            first_step=False)
 *   _nn_adamw_(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1=0.9,
 *              beta2=0.999, eps=1e-8, weight_decay=0.01, found_inf=None,
 *              grad_scale=None)
 *
 * Each works in place, on the current stream of the arrays' device, and
 * never waits for the device: found_inf and the step count stay there, so a
 * training step needs no host synchronization and can be captured in a CUDA
 * graph. A list of tensors is one role (params, grads, a state); the lists
 * of one call are equally long and element i of each has one shape.
 * Checks, all before the GPU is touched, in this order: hyper-parameters,
 * the lists (type, then lengths), the device scalars, then every array. */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "core/core.h"

#include <limits.h>

/* ---- hyper-parameters ---------------------------------------------------- */

typedef enum range { ANY, NONNEG, UNIT, ABOVE_ONE, OPEN_UNIT } range;

static const char *const range_text[] = {
    [NONNEG] = "must be >= 0",
    [UNIT] = "must be in [0, 1)",
    [ABOVE_ONE] = "must be > 1",
    [OPEN_UNIT] = "must be in (0, 1)",
};

static bool
in_range(double v, range r)
{
    switch (r) {
    case NONNEG: return v >= 0.0;
    case UNIT: return v >= 0.0 && v < 1.0;
    case ABOVE_ONE: return v > 1.0;
    case OPEN_UNIT: return v > 0.0 && v < 1.0;
    default: return true;
    }
}

/* `obj` (absent: *out keeps its default) as a finite real within `r`. */
static int
parse_hyper(const char *func, PyObject *obj, const char *param, range r, double *out)
{
    if (obj == NULL) {
        return 0;
    }
    if (cl_parse_real(obj, func, param, out) < 0) {
        return -1;
    }
    if (!in_range(*out, r)) {
        return cl_arg_error(PyExc_ValueError, func, param, "%s, got %R", range_text[r], obj);
    }
    return 0;
}

/* lr: a real number >= 0 here, or a DeviceArray, which lr_scalar checks
 * with the other device scalars. */
static int
parse_lr(cl_state *st, const char *func, PyObject *obj, double *out)
{
    return CL_IS_DEVICEARRAY(st, obj) ? 0 : parse_hyper(func, obj, "lr", NONNEG, out);
}

/* A truth value (absent: false). */
static int
parse_flag(PyObject *obj, bool *out)
{
    int t = obj == NULL ? 0 : PyObject_IsTrue(obj);
    *out = t > 0;
    return t < 0 ? -1 : 0;
}

/* ---- a call: its lists of arrays and its device scalars -------------------- */

enum { MAX_ROLES = CL_MT_ROLES };

typedef struct mt_call {
    cl_op op;
    char first_param[64];            /* the array that fixed the device */
    int nroles, grad_role;
    const char *names[MAX_ROLES];    /* the lists' parameter names */
    PyObject *lists[MAX_ROLES];      /* tuples (new references); NULL: role unused */
    Py_ssize_t n;
    bool have_grad_dtype;
    cl_dtype grad_dtype;             /* of every array of the grad role */
    cl_mt_tensor *tensors;           /* n entries */
    int64_t elements;                /* over all tensors, for the profiler */
} mt_call;

/* Errors name `func`, the private entry point called; the profiler records
 * the op as `record`, its public name. */
static void
mt_init(mt_call *c, PyObject *module, const char *func, const char *record, int grad_role)
{
    memset(c, 0, sizeof *c);
    cl_op_init(&c->op, cl_state_from_module(module), func);
    cl_op_record_as(&c->op, record);
    c->grad_role = grad_role;
    c->grad_dtype = CL_FLOAT32;
}

static void
mt_free(mt_call *c)
{
    for (int r = 0; r < MAX_ROLES; r++) {
        Py_CLEAR(c->lists[r]);
    }
    PyMem_Free(c->tensors);
    c->tensors = NULL;
}

/* The next role: `obj` must be a list or tuple (None only when `optional`,
 * which leaves the role unused) as long as the first role's. */
static int
mt_list(mt_call *c, PyObject *obj, const char *param, bool optional)
{
    const char *func = c->op.func;
    int r = c->nroles++;
    c->names[r] = param;
    if (optional && obj == Py_None) {
        return 0;
    }
    if (!PyList_Check(obj) && !PyTuple_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, param,
                            "expected a list or tuple of DeviceArrays%s, got %.100s",
                            optional ? " or None" : "", Py_TYPE(obj)->tp_name);
    }
    c->lists[r] = PySequence_Tuple(obj); /* a snapshot no other code can change */
    if (c->lists[r] == NULL) {
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(c->lists[r]);
    if (r == 0) {
        c->n = n;
        if (n > INT_MAX) {
            return cl_arg_error(PyExc_ValueError, func, param, "holds more than %d arrays",
                                INT_MAX);
        }
    }
    else if (n != c->n) {
        return cl_arg_error(PyExc_ValueError, func, param, "has %zd arrays but '%s' has %zd",
                            n, c->names[0], c->n);
    }
    return 0;
}

/* The device check, remembering the first array's name for later messages
 * (the frame keeps the pointer, so the name must outlive this call). */
static int
mt_device(mt_call *c, const DeviceArray *a, const char *param)
{
    if (c->op.device < 0) {
        snprintf(c->first_param, sizeof c->first_param, "%s", param);
        param = c->first_param;
    }
    return cl_op_same_device(&c->op, a, param);
}

/* A one-element device scalar of `dtype` (or of `alt`, when alt >= 0);
 * None or absent gives NULL when `optional`. */
static int
mt_scalar(mt_call *c, PyObject *obj, const char *param, bool optional, cl_dtype dtype, int alt,
          DeviceArray **out)
{
    const char *func = c->op.func;
    *out = NULL;
    if (optional && (obj == NULL || obj == Py_None)) {
        return 0;
    }
    if (!CL_IS_DEVICEARRAY(c->op.st, obj)) {
        return cl_expected_array_error(func, param, obj, optional);
    }
    DeviceArray *a = (DeviceArray *)obj;
    if (mt_device(c, a, param) < 0) {
        return -1;
    }
    if (cl_array_size(a) != 1) {
        return cl_arg_error(PyExc_ValueError, func, param,
                            "must hold exactly one element, got %zd", cl_array_size(a));
    }
    if (a->dtype != dtype && (alt < 0 || a->dtype != (cl_dtype)alt)) {
        return cl_arg_error(PyExc_TypeError, func, param, "must have dtype %s%s%s, got %s",
                            cl_dtype_name(dtype), alt >= 0 ? " or " : "",
                            alt >= 0 ? cl_dtype_name((cl_dtype)alt) : "",
                            cl_dtype_name(a->dtype));
    }
    *out = a;
    return 0;
}

/* lr given as a DeviceArray: one float32 element, read on the device. */
static int
lr_scalar(mt_call *c, PyObject *obj, DeviceArray **out)
{
    *out = NULL;
    if (!CL_IS_DEVICEARRAY(c->op.st, obj)) {
        return 0;
    }
    return mt_scalar(c, obj, "lr", false, CL_FLOAT32, -1, out);
}

/* Element i of role r: a C-contiguous DeviceArray on the call's device,
 * float32 (the grad role: float16, bfloat16 or float32, one dtype for all),
 * of the shape of the first role's element i. */
static int
mt_element(mt_call *c, int r, Py_ssize_t i, DeviceArray **out)
{
    const char *func = c->op.func;
    char name[64];
    snprintf(name, sizeof name, "%s[%zd]", c->names[r], i);
    PyObject *obj = PyTuple_GET_ITEM(c->lists[r], i);
    if (!CL_IS_DEVICEARRAY(c->op.st, obj)) {
        return cl_expected_array_error(func, name, obj, false);
    }
    DeviceArray *a = (DeviceArray *)obj;
    if (mt_device(c, a, name) < 0) {
        return -1;
    }
    if (!cl_is_c_contiguous(a)) {
        return cl_arg_error(PyExc_ValueError, func, name, "must be C-contiguous");
    }
    if (r != c->grad_role && a->dtype != CL_FLOAT32) {
        return cl_arg_error(PyExc_TypeError, func, name, "must have dtype float32, got %s",
                            cl_dtype_name(a->dtype));
    }
    if (r == c->grad_role && a->dtype != CL_FLOAT16 && a->dtype != CL_BFLOAT16 &&
        a->dtype != CL_FLOAT32) {
        return cl_arg_error(PyExc_TypeError, func, name,
                            "must have dtype float16, bfloat16 or float32, got %s",
                            cl_dtype_name(a->dtype));
    }
    if (r == c->grad_role && c->have_grad_dtype && a->dtype != c->grad_dtype) {
        return cl_arg_error(PyExc_TypeError, func, name,
                            "has dtype %s but '%s[0]' has dtype %s (one grad dtype per call)",
                            cl_dtype_name(a->dtype), c->names[r], cl_dtype_name(c->grad_dtype));
    }
    if (r == c->grad_role && !c->have_grad_dtype) {
        c->have_grad_dtype = true;
        c->grad_dtype = a->dtype;
    }
    *out = a;
    return 0;
}

/* Element i of role r against the earlier roles' element i (a0 first): one
 * shape, and no overlap (the kernel reads and writes them together). */
static int
mt_match(mt_call *c, int r, Py_ssize_t i, DeviceArray *const *arr)
{
    const DeviceArray *a = arr[r], *a0 = arr[0];
    char name[64];
    snprintf(name, sizeof name, "%s[%zd]", c->names[r], i);
    bool same = a->ndim == a0->ndim;
    for (int d = 0; same && d < a->ndim; d++) {
        same = a->shape[d] == a0->shape[d];
    }
    if (!same) {
        PyObject *got = cl_shape_tuple(a->ndim, a->shape);
        PyObject *want = cl_shape_tuple(a0->ndim, a0->shape);
        if (got != NULL && want != NULL) {
            cl_arg_error(PyExc_ValueError, c->op.func, name, "has shape %R but '%s[%zd]' has "
                         "shape %R", got, c->names[0], i, want);
        }
        Py_XDECREF(got);
        Py_XDECREF(want);
        return -1;
    }
    for (int q = 0; q < r; q++) {
        if (arr[q] != NULL && cl_arrays_overlap(arr[q], a)) {
            return cl_arg_error(PyExc_ValueError, c->op.func, name,
                                "overlaps '%s[%zd]' in memory", c->names[q], i);
        }
    }
    return 0;
}

/* The arrays of index i in every used role, checked, into tensors[i]. */
static int
mt_index(mt_call *c, Py_ssize_t i)
{
    DeviceArray *arr[MAX_ROLES] = {NULL};
    for (int r = 0; r < c->nroles; r++) {
        if (c->lists[r] == NULL) {
            continue;
        }
        if (mt_element(c, r, i, &arr[r]) < 0 || mt_match(c, r, i, arr) < 0) {
            return -1;
        }
        c->tensors[i].data[r] = arr[r]->data;
    }
    c->tensors[i].numel = (int64_t)cl_array_size(arr[0]);
    c->elements += c->tensors[i].numel;
    return 0;
}

/* Every element of every list, checked and packed into c->tensors. */
static int
mt_arrays(mt_call *c)
{
    c->tensors = PyMem_Calloc(c->n > 0 ? (size_t)c->n : 1, sizeof(cl_mt_tensor));
    if (c->tensors == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < c->n; i++) {
        if (mt_index(c, i) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Start the GPU part: the device, the profiler, and every array noted as
 * used on the op's stream. */
static int
mt_begin(mt_call *c, DeviceArray *const *scalars, int nscalars)
{
    if (cl_op_begin(&c->op) < 0) {
        return -1;
    }
    for (int r = 0; r < c->nroles; r++) {
        for (Py_ssize_t i = 0; c->lists[r] != NULL && i < c->n; i++) {
            cl_op_use(&c->op, (DeviceArray *)PyTuple_GET_ITEM(c->lists[r], i));
        }
    }
    for (int k = 0; k < nscalars; k++) {
        cl_op_use(&c->op, scalars[k]);
    }
    return 0;
}

/* Close the call: None when `ok`, NULL with the exception set otherwise;
 * `bytes` moved per element, for the profiler. */
static PyObject *
mt_end(mt_call *c, bool ok, int64_t bytes_per_element)
{
    cl_prof_info info = {.dtype = (int)c->grad_dtype, .flops = -1, .out_ndim = -1,
                         .bytes = c->elements * bytes_per_element};
    mt_free(c);
    return cl_op_end(&c->op, ok ? Py_NewRef(Py_None) : NULL,
                     CL_OP_PROFILING(&c->op) ? &info : NULL);
}

/* ---- _nn_unscale_ ------------------------------------------------------------ */

PyDoc_STRVAR(_nn_unscale__doc,
"_nn_unscale_(grads, inv_scale, found_inf)\n--\n\n"
"Private: GradScaler's unscale and non-finite check, fused, in place.\n\n"
"Every element g of every grad becomes ``g * inv_scale`` (float32\n"
"arithmetic, rounded back to the grad's dtype); if any element was inf or\n"
"NaN before scaling, found_inf is set to 1.0. found_inf is never cleared\n"
"here: the caller zeroes it before the first call of a step. All grads go\n"
"through one or a few launches (torch._amp_foreach_non_finite_check_and_\n"
"unscale_'s contract). Bytes moved: 2 * itemsize per element.\n\n"
"Parameters\n----------\n"
"grads : list or tuple of DeviceArray\n"
"    C-contiguous, all float16, all bfloat16 or all float32, on one device.\n"
"inv_scale : DeviceArray\n    One float32 element, read on the device.\n"
"found_inf : DeviceArray\n    One float32 element, written on the device.\n\n"
"Returns\n-------\nNone\n\n"
"Raises\n------\nTypeError, ValueError\n    A bad argument (before any GPU work).");

static PyObject *
_nn_unscale_(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"grads", "inv_scale", "found_inf", NULL};
    mt_call c;
    mt_init(&c, module, "_nn_unscale_", "unscale", 0);
    PyObject *argv[3];
    DeviceArray *s[2];
    if (cl_parse_args(c.op.func, args, nargs, kwnames, names, 3, argv) < 0 ||
        mt_list(&c, argv[0], "grads", false) < 0 ||
        mt_scalar(&c, argv[1], "inv_scale", false, CL_FLOAT32, -1, &s[0]) < 0 ||
        mt_scalar(&c, argv[2], "found_inf", false, CL_FLOAT32, -1, &s[1]) < 0 ||
        mt_arrays(&c) < 0 || mt_begin(&c, s, 2) < 0) {
        goto fail;
    }
    CL_CUDA_CHECK(c.op.st, cl_mt_unscale(c.tensors, (int)c.n, c.grad_dtype,
                                         (const float *)s[0]->data, (float *)s[1]->data,
                                         c.op.stream));
    return mt_end(&c, true, 2 * (int64_t)cl_itemsize(c.grad_dtype));
fail:
    return mt_end(&c, false, 0);
}

/* ---- _nn_update_scale_ --------------------------------------------------------- */

PyDoc_STRVAR(_nn_update_scale__doc,
"_nn_update_scale_(scale, growth_tracker, found_inf, growth_factor=2.0, "
"backoff_factor=0.5, growth_interval=2000)\n--\n\n"
"Private: GradScaler's dynamic loss-scale update, one device thread.\n\n"
"PyTorch's rule (torch._amp_update_scale_): if found_inf is nonzero, scale\n"
"*= backoff_factor and growth_tracker = 0; otherwise growth_tracker + 1\n"
"counts the successful step, and when it equals growth_interval scale *=\n"
"growth_factor (kept unchanged if that overflows float32) and the tracker\n"
"goes back to 0, else the tracker keeps the count. The products are\n"
"computed in double and rounded to float32, as PyTorch does.\n\n"
"Parameters\n----------\n"
"scale : DeviceArray\n    One float32 element, updated in place.\n"
"growth_tracker : DeviceArray\n    One int32 element, updated in place.\n"
"found_inf : DeviceArray\n    One float32 element (read only).\n"
"growth_factor : float\n    > 1.\nbackoff_factor : float\n    In (0, 1).\n"
"growth_interval : int\n    In [1, 2**31 - 1].\n\n"
"Returns\n-------\nNone\n\n"
"Raises\n------\nTypeError, ValueError\n    A bad argument (before any GPU work).");

/* growth_interval: an int (not bool) in [1, 2**31 - 1]. */
static int
parse_interval(const char *func, PyObject *obj, int32_t *out)
{
    if (obj == NULL) {
        return 0;
    }
    if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, "growth_interval",
                            "expected an int, got %.100s", Py_TYPE(obj)->tp_name);
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow != 0 || v < 1 || v > INT32_MAX) {
        return cl_arg_error(PyExc_ValueError, func, "growth_interval",
                            "must be in [1, 2**31 - 1], got %R", obj);
    }
    *out = (int32_t)v;
    return 0;
}

static PyObject *
_nn_update_scale_(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"scale", "growth_tracker", "found_inf", "growth_factor",
                                        "backoff_factor", "growth_interval", NULL};
    mt_call c;
    mt_init(&c, module, "_nn_update_scale_", "update_scale", -1);
    PyObject *argv[6];
    DeviceArray *s[3];
    double growth = 2.0, backoff = 0.5;
    int32_t interval = 2000;
    const char *f = c.op.func;
    if (cl_parse_args(f, args, nargs, kwnames, names, 3, argv) < 0 ||
        parse_hyper(f, argv[3], "growth_factor", ABOVE_ONE, &growth) < 0 ||
        parse_hyper(f, argv[4], "backoff_factor", OPEN_UNIT, &backoff) < 0 ||
        parse_interval(f, argv[5], &interval) < 0 ||
        mt_scalar(&c, argv[0], "scale", false, CL_FLOAT32, -1, &s[0]) < 0 ||
        mt_scalar(&c, argv[1], "growth_tracker", false, CL_INT32, -1, &s[1]) < 0 ||
        mt_scalar(&c, argv[2], "found_inf", false, CL_FLOAT32, -1, &s[2]) < 0 ||
        mt_begin(&c, s, 3) < 0) {
        goto fail;
    }
    CL_CUDA_CHECK(c.op.st, cl_amp_update_scale((float *)s[0]->data, (int32_t *)s[1]->data,
                                               (const float *)s[2]->data, growth, backoff,
                                               interval, c.op.stream));
    c.elements = 1;
    return mt_end(&c, true, 20); /* reads 3 scalars, writes 2 */
fail:
    return mt_end(&c, false, 0);
}

/* ---- _nn_sgd_ ------------------------------------------------------------------- */

PyDoc_STRVAR(_nn_sgd__doc,
"_nn_sgd_(params, grads, momentum_buffers, lr, momentum=0.0, dampening=0.0, "
"weight_decay=0.0, nesterov=False, found_inf=None, grad_scale=None, "
"first_step=False)\n--\n\n"
"Private: one fused SGD step over every parameter, in place.\n\n"
"torch.optim.SGD's rule per element, in float32: g = grad / grad_scale\n"
"(when given); g += weight_decay * p (when nonzero); with momentum, buf =\n"
"g on the first step, else momentum * buf + (1 - dampening) * g, and g =\n"
"g + momentum * buf (nesterov) or buf; then p -= lr * g. When found_inf is\n"
"given and nonzero on the device, nothing changes (the skip is decided by\n"
"the kernel: no host synchronization). Grads are read, never written.\n"
"Numbers given as Python floats are baked into the launch: a captured CUDA\n"
"graph replays them unchanged; an lr that must change between replays is\n"
"given as a device scalar.\n\n"
"Bytes moved per element (g = the grad's itemsize): 8 + g without\n"
"momentum; 16 + g with momentum (12 + g on the first step).\n\n"
"Parameters\n----------\n"
"params : list or tuple of DeviceArray\n    float32 master weights, C-contiguous, one device.\n"
"grads : list or tuple of DeviceArray\n"
"    One per param, of its shape: all float16, all bfloat16 or all float32.\n"
"momentum_buffers : list or tuple of DeviceArray, or None\n"
"    float32, one per param; required when momentum > 0, unused otherwise.\n"
"lr : float or DeviceArray\n    >= 0, or one float32 element read on the device when the kernel\n"
"    runs (its sign is then the caller's to keep).\n"
"momentum : float\n    >= 0.\ndampening : float\n"
"weight_decay : float\n    >= 0.\n"
"nesterov : bool\n    Requires momentum > 0 and dampening == 0.\n"
"found_inf, grad_scale : DeviceArray or None\n    One float32 element each.\n"
"first_step : bool\n    The buffers are initialized to g instead of updated.\n\n"
"Returns\n-------\nNone\n\n"
"Raises\n------\nTypeError, ValueError\n    A bad argument (before any GPU work).");

/* SGD's numbers, with torch.optim.SGD's checks. */
static int
sgd_hyper(cl_state *st, const char *f, PyObject *const *argv, cl_sgd_args *a)
{
    bool nesterov, first;
    if (parse_lr(st, f, argv[3], &a->lr) < 0 ||
        parse_hyper(f, argv[4], "momentum", NONNEG, &a->momentum) < 0 ||
        parse_hyper(f, argv[5], "dampening", ANY, &a->dampening) < 0 ||
        parse_hyper(f, argv[6], "weight_decay", NONNEG, &a->weight_decay) < 0 ||
        parse_flag(argv[7], &nesterov) < 0 || parse_flag(argv[10], &first) < 0) {
        return -1;
    }
    a->nesterov = nesterov;
    a->first_step = first;
    if (nesterov && (a->momentum <= 0.0 || a->dampening != 0.0)) {
        return cl_arg_error(PyExc_ValueError, f, "nesterov",
                            "requires momentum > 0 and dampening == 0");
    }
    return 0;
}

static PyObject *
_nn_sgd_(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {
        "params", "grads", "momentum_buffers", "lr", "momentum", "dampening", "weight_decay",
        "nesterov", "found_inf", "grad_scale", "first_step", NULL};
    mt_call c;
    mt_init(&c, module, "_nn_sgd_", "sgd", 1);
    PyObject *argv[11];
    DeviceArray *s[3];
    cl_sgd_args a = {0};
    const char *f = c.op.func;
    if (cl_parse_args(f, args, nargs, kwnames, names, 4, argv) < 0 ||
        sgd_hyper(c.op.st, f, argv, &a) < 0 || mt_list(&c, argv[0], "params", false) < 0 ||
        mt_list(&c, argv[1], "grads", false) < 0 ||
        mt_list(&c, argv[2], "momentum_buffers", true) < 0) {
        goto fail;
    }
    if (a.momentum > 0.0 && c.lists[2] == NULL) {
        cl_arg_error(PyExc_ValueError, f, "momentum_buffers", "is required when momentum > 0");
        goto fail;
    }
    if (mt_scalar(&c, argv[8], "found_inf", true, CL_FLOAT32, -1, &s[0]) < 0 ||
        mt_scalar(&c, argv[9], "grad_scale", true, CL_FLOAT32, -1, &s[1]) < 0 ||
        lr_scalar(&c, argv[3], &s[2]) < 0 || mt_arrays(&c) < 0 || mt_begin(&c, s, 3) < 0) {
        goto fail;
    }
    a.found_inf = s[0] != NULL ? (const float *)s[0]->data : NULL;
    a.grad_scale = s[1] != NULL ? (const float *)s[1]->data : NULL;
    a.lr_device = s[2] != NULL ? (const float *)s[2]->data : NULL;
    CL_CUDA_CHECK(c.op.st, cl_mt_sgd(c.tensors, (int)c.n, c.grad_dtype, &a, c.op.stream));
    int64_t g = (int64_t)cl_itemsize(c.grad_dtype);
    int64_t bytes = 8 + g + (a.momentum != 0.0 ? (a.first_step ? 4 : 8) : 0);
    c.grad_dtype = CL_FLOAT32; /* the profiler's dtype: the master weights' */
    return mt_end(&c, true, bytes);
fail:
    return mt_end(&c, false, 0);
}

/* ---- _nn_adamw_ ----------------------------------------------------------------- */

PyDoc_STRVAR(_nn_adamw__doc,
"_nn_adamw_(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1=0.9, beta2=0.999, "
"eps=1e-8, weight_decay=0.01, found_inf=None, grad_scale=None)\n--\n\n"
"Private: one fused AdamW step over every parameter, in place.\n\n"
"First step += 1 on the device (unless skipped), then per element, in\n"
"float32 with the bias corrections in float64 from that new step t:\n"
"g = grad / grad_scale (when given); p *= 1 - lr * weight_decay;\n"
"m = beta1 * m + (1 - beta1) * g; v = beta2 * v + (1 - beta2) * g * g;\n"
"p -= (lr / (1 - beta1**t)) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)\n"
"(torch.optim.AdamW's rule). When found_inf is given and nonzero on the\n"
"device, nothing changes, the step count included, as torch's fused AdamW\n"
"driven by a GradScaler leaves it. Grads are read, never written. Numbers\n"
"given as Python floats are baked into the launch: a captured CUDA graph\n"
"replays them unchanged (the step count still advances on the device); an\n"
"lr that must change between replays is given as a device scalar.\n\n"
"Bytes moved per element (g = the grad's itemsize): 24 + g (params and\n"
"both moments read and written once, the grad read once): 28 for float32\n"
"grads, so GB/s = 28 * numel / time.\n\n"
"Parameters\n----------\n"
"params : list or tuple of DeviceArray\n    float32 master weights, C-contiguous, one device.\n"
"grads : list or tuple of DeviceArray\n"
"    One per param, of its shape: all float16, all bfloat16 or all float32.\n"
"exp_avgs, exp_avg_sqs : list or tuple of DeviceArray\n    float32 moments, one per param.\n"
"step : DeviceArray\n    One float32 or int32 element: the steps taken so far.\n"
"lr : float or DeviceArray\n    >= 0, or one float32 element read on the device when the kernel\n"
"    runs (its sign is then the caller's to keep).\n"
"beta1, beta2 : float\n    In [0, 1).\neps : float\n    >= 0.\n"
"weight_decay : float\n    >= 0.\n"
"found_inf, grad_scale : DeviceArray or None\n    One float32 element each.\n\n"
"Returns\n-------\nNone\n\n"
"Raises\n------\nTypeError, ValueError\n    A bad argument (before any GPU work).");

static PyObject *
_nn_adamw_(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {
        "params", "grads", "exp_avgs", "exp_avg_sqs", "step", "lr", "beta1", "beta2", "eps",
        "weight_decay", "found_inf", "grad_scale", NULL};
    mt_call c;
    mt_init(&c, module, "_nn_adamw_", "adamw", 1);
    PyObject *argv[12];
    DeviceArray *s[4];
    cl_adamw_args a = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
    const char *f = c.op.func;
    if (cl_parse_args(f, args, nargs, kwnames, names, 6, argv) < 0 ||
        parse_lr(c.op.st, f, argv[5], &a.lr) < 0 ||
        parse_hyper(f, argv[6], "beta1", UNIT, &a.beta1) < 0 ||
        parse_hyper(f, argv[7], "beta2", UNIT, &a.beta2) < 0 ||
        parse_hyper(f, argv[8], "eps", NONNEG, &a.eps) < 0 ||
        parse_hyper(f, argv[9], "weight_decay", NONNEG, &a.weight_decay) < 0 ||
        mt_list(&c, argv[0], "params", false) < 0 || mt_list(&c, argv[1], "grads", false) < 0 ||
        mt_list(&c, argv[2], "exp_avgs", false) < 0 ||
        mt_list(&c, argv[3], "exp_avg_sqs", false) < 0 ||
        mt_scalar(&c, argv[4], "step", false, CL_FLOAT32, CL_INT32, &s[0]) < 0 ||
        mt_scalar(&c, argv[10], "found_inf", true, CL_FLOAT32, -1, &s[1]) < 0 ||
        mt_scalar(&c, argv[11], "grad_scale", true, CL_FLOAT32, -1, &s[2]) < 0 ||
        lr_scalar(&c, argv[5], &s[3]) < 0 || mt_arrays(&c) < 0 || mt_begin(&c, s, 4) < 0) {
        goto fail;
    }
    a.step = s[0]->data;
    a.step_dtype = s[0]->dtype;
    a.found_inf = s[1] != NULL ? (const float *)s[1]->data : NULL;
    a.grad_scale = s[2] != NULL ? (const float *)s[2]->data : NULL;
    a.lr_device = s[3] != NULL ? (const float *)s[3]->data : NULL;
    CL_CUDA_CHECK(c.op.st, cl_mt_adamw(c.tensors, (int)c.n, c.grad_dtype, &a, c.op.stream));
    int64_t bytes = 24 + (int64_t)cl_itemsize(c.grad_dtype);
    c.grad_dtype = CL_FLOAT32;
    return mt_end(&c, true, bytes);
fail:
    return mt_end(&c, false, 0);
}

PyMethodDef cl_optim_methods[] = {
    CL_FASTCALL(_nn_unscale_),
    CL_FASTCALL(_nn_update_scale_),
    CL_FASTCALL(_nn_sgd_),
    CL_FASTCALL(_nn_adamw_),
    {NULL, NULL, 0, NULL},
};
