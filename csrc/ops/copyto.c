/* copyto(dst, src): NumPy's np.copyto on the device.
 *
 * src is broadcast to dst's shape and cast to dst's dtype under NumPy's
 * 'same_kind' rule, in one pass of the copy kernel (cl_copy_cast: a plain
 * memcpy when nothing changes, a flat vectorized loop when both are
 * contiguous, a strided loop otherwise). This is the cheap way to fill a
 * preallocated buffer from another dtype (a float32 master weight into its
 * float16 copy, say): an element-wise op with out= of another dtype computes
 * in its result dtype and casts through a temporary.
 *
 * validate (arrays, device, broadcast, casting; no CUDA call) -> run. */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "core/core.h"

typedef struct {
    cl_op op;
    DeviceArray *dst, *src;
    Py_ssize_t src_strides[CL_MAX_NDIM]; /* src's strides on dst's axes (0: broadcast) */
} copyto_call;

/* src's strides seen with dst's shape, NumPy's broadcasting rule. */
static int
broadcast_src(copyto_call *c)
{
    const DeviceArray *d = c->dst, *s = c->src;
    if (s->ndim > d->ndim) {
        goto mismatch;
    }
    for (int i = 0; i < d->ndim; i++) {
        int j = i - (d->ndim - s->ndim);
        if (j < 0 || s->shape[j] == 1) {
            c->src_strides[i] = 0;
        }
        else if (s->shape[j] == d->shape[i]) {
            c->src_strides[i] = s->strides[j];
        }
        else {
            goto mismatch;
        }
    }
    return 0;
mismatch:;
    PyObject *got = cl_shape_tuple(s->ndim, s->shape);
    PyObject *want = cl_shape_tuple(d->ndim, d->shape);
    if (got != NULL && want != NULL) {
        cl_arg_error(PyExc_ValueError, c->op.func, "src",
                     "has shape %R, which does not broadcast to dst's shape %R", got, want);
    }
    Py_XDECREF(got);
    Py_XDECREF(want);
    return -1;
}

static int
copyto_validate(copyto_call *c, PyObject *dst_obj, PyObject *src_obj)
{
    if (cl_op_array(&c->op, dst_obj, "dst", &c->dst) < 0 ||
        cl_op_array(&c->op, src_obj, "src", &c->src) < 0 || broadcast_src(c) < 0) {
        return -1;
    }
    if (!cl_can_cast_same_kind(c->src->dtype, c->dst->dtype)) {
        return cl_arg_error(PyExc_TypeError, c->op.func, "src",
                            "cannot cast from %s to dst's %s under NumPy's 'same_kind' rule",
                            cl_dtype_name(c->src->dtype), cl_dtype_name(c->dst->dtype));
    }
    return 0;
}

/* Enqueue the copy on op.stream. src overlapping dst (other than being
 * exactly dst) is first copied aside, so no element is read after it was
 * overwritten. */
static int
copyto_run(copyto_call *c)
{
    cl_state *st = c->op.st;
    DeviceArray *src = c->src, *aside = NULL;  /* c->src stays the caller's array */
    int64_t shape[CL_MAX_NDIM], dst_strides[CL_MAX_NDIM], src_strides[CL_MAX_NDIM];
    int rc = -1;
    cl_op_use(&c->op, c->dst);
    cl_op_use(&c->op, src);
    if (cl_out_needs_copy(c->dst, src)) {
        aside = cl_op_contiguous_copy(&c->op, src, src->dtype);
        if (aside == NULL) {
            return -1;
        }
        cl_op_use(&c->op, aside);
        /* The contiguous copy keeps src's shape: recompute the broadcast strides. */
        c->src = aside;
        int bad = broadcast_src(c);
        c->src = src;
        if (bad < 0) {
            goto done;
        }
        src = aside;
    }
    Py_ssize_t dst_item = (Py_ssize_t)cl_itemsize(c->dst->dtype);
    Py_ssize_t src_item = (Py_ssize_t)cl_itemsize(src->dtype);
    for (int i = 0; i < c->dst->ndim; i++) {
        shape[i] = c->dst->shape[i];
        dst_strides[i] = c->dst->strides[i] / dst_item;
        src_strides[i] = c->src_strides[i] / src_item;
    }
    CL_CUDA_CHECK(st, cl_copy_cast(c->dst->data, c->dst->dtype, dst_strides, src->data,
                                   src->dtype, src_strides, c->dst->ndim, shape, c->op.stream));
    rc = 0;
done:
fail:
    Py_XDECREF(aside);
    return rc;
}

/* dst and src on two devices: the same dtype and shape, dst C-contiguous;
 * one peer copy on dst's device (ops/copy.c says how it is ordered). */
static PyObject *
copyto_between_devices(cl_state *st, DeviceArray *dst, DeviceArray *src)
{
    static const char *func = "copyto";
    bool same_shape = dst->ndim == src->ndim;
    for (int i = 0; same_shape && i < dst->ndim; i++) {
        same_shape = dst->shape[i] == src->shape[i];
    }
    if (src->dtype != dst->dtype) {
        return cl_arg_error(PyExc_TypeError, func, "src",
                            "is on device %d and dst on device %d: a copy between devices "
                            "keeps the dtype (src %s, dst %s); convert on one device first",
                            src->device, dst->device, cl_dtype_name(src->dtype),
                            cl_dtype_name(dst->dtype)), NULL;
    }
    if (!same_shape) {
        return cl_arg_error(PyExc_ValueError, func, "src",
                            "is on device %d and dst on device %d: a copy between devices "
                            "needs the same shape (no broadcasting)", src->device,
                            dst->device), NULL;
    }
    if (!cl_is_c_contiguous(dst)) {
        return cl_arg_error(PyExc_ValueError, func, "dst",
                            "must be C-contiguous for a copy from another device (src is on "
                            "device %d, dst on device %d)", src->device, dst->device), NULL;
    }
    DeviceArray *done = cl_array_to_device(st, func, src, dst->device, dst);
    if (done == NULL) {
        return NULL;
    }
    Py_DECREF(done);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(copyto_doc,
"copyto(dst, src)\n--\n\n"
"Copy `src` into `dst` on the device, as NumPy's ``np.copyto(dst, src)``.\n\n"
"Parameters\n"
"----------\n"
"dst : DeviceArray\n"
"    Written in place; any layout.\n"
"src : DeviceArray\n"
"    Broadcast to dst's shape and cast to dst's dtype under NumPy's\n"
"    'same_kind' rule (float32 to float16 is allowed, float to int is not).\n"
"    May overlap dst.\n\n"
"Returns\n"
"-------\n"
"None\n\n"
"Notes\n"
"-----\n"
"One kernel (or one cudaMemcpyAsync) on the current stream, reading src\n"
"once and writing dst once; asynchronous like every op.\n\n"
"dst and src may be on different devices when they have the same dtype and\n"
"shape and dst is C-contiguous: one peer copy, as DeviceArray.to() makes.");

static PyObject *
copyto(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"dst", "src", NULL};
    PyObject *argv[2];
    copyto_call c = {0};
    cl_state *st = cl_state_from_module(module);
    cl_op_init(&c.op, st, "copyto");
    if (cl_parse_args("copyto", args, nargs, kwnames, names, 2, argv) < 0) {
        return NULL;
    }
    if (CL_IS_DEVICEARRAY(st, argv[0]) && CL_IS_DEVICEARRAY(st, argv[1]) &&
        ((DeviceArray *)argv[0])->device != ((DeviceArray *)argv[1])->device) {
        return copyto_between_devices(st, (DeviceArray *)argv[0], (DeviceArray *)argv[1]);
    }
    if (copyto_validate(&c, argv[0], argv[1]) < 0 || cl_op_begin(&c.op) < 0) {
        return NULL;
    }
    int rc = copyto_run(&c);
    /* Read once in src's dtype, written once in dst's. */
    int64_t n = cl_array_size(c.dst);
    cl_prof_info info = {
        .dtype = (int)c.dst->dtype,
        .bytes = n * (int64_t)(cl_itemsize(c.src->dtype) + cl_itemsize(c.dst->dtype)),
        .flops = -1,
        .ninputs = 1,
        .inputs = {c.src},
        .out_ndim = c.dst->ndim,
        .out_shape = c.dst->shape,
    };
    PyObject *result = rc < 0 ? NULL : Py_NewRef(Py_None);
    return cl_op_end(&c.op, result, CL_OP_PROFILING(&c.op) && rc == 0 ? &info : NULL);
}

PyMethodDef cl_copyto_methods[] = {
    CL_FASTCALL(copyto),
    {NULL, NULL, 0, NULL},
};
