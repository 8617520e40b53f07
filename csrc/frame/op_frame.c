/* The op frame (frame.h): argument checks shared by every op, and the
 * enter / profile / leave bracket around its GPU work. */
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "runtime/runtime.h"
#include "core/core.h"

void
cl_op_init(cl_op *op, cl_state *st, const char *func)
{
    op->st = st;
    op->func = func;
    op->record = func;
    op->device = -1;
    op->device_param = NULL;
    op->previous = -1;
    op->begun = false;
    op->stream = NULL;
    op->prof.flags = 0;
}

int
cl_op_same_device(cl_op *op, const DeviceArray *a, const char *param)
{
    if (op->device < 0) {
        op->device = a->device;
        op->device_param = param;
        return 0;
    }
    if (a->device != op->device) {
        return cl_arg_error(PyExc_ValueError, op->func, param,
                            "is on device %d but '%s' is on device %d", a->device,
                            op->device_param, op->device);
    }
    return 0;
}

int
cl_op_array(cl_op *op, PyObject *obj, const char *param, DeviceArray **arr)
{
    if (!CL_IS_DEVICEARRAY(op->st, obj)) {
        return cl_expected_array_error(op->func, param, obj, false);
    }
    *arr = (DeviceArray *)obj;
    return cl_op_same_device(op, *arr, param);
}

int
cl_op_out_type(cl_op *op, PyObject *obj)
{
    if (obj == NULL || obj == Py_None || CL_IS_DEVICEARRAY(op->st, obj)) {
        return 0;
    }
    return cl_expected_array_error(op->func, "out", obj, true);
}

int
cl_op_out(cl_op *op, PyObject *obj, int ndim, const Py_ssize_t *shape, DeviceArray **out)
{
    *out = NULL;
    if (cl_op_out_type(op, obj) < 0) {
        return -1;
    }
    if (obj == NULL || obj == Py_None) {
        return 0;
    }
    DeviceArray *o = (DeviceArray *)obj;
    bool same = o->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) {
        same = o->shape[i] == shape[i];
    }
    if (!same) {
        PyObject *got = cl_shape_tuple(o->ndim, o->shape);
        PyObject *want = cl_shape_tuple(ndim, shape);
        if (got != NULL && want != NULL) {
            cl_arg_error(PyExc_ValueError, op->func, "out",
                         "has shape %R but the result has shape %R", got, want);
        }
        Py_XDECREF(got);
        Py_XDECREF(want);
        return -1;
    }
    if (cl_op_same_device(op, o, "out") < 0) {
        return -1;
    }
    *out = o;
    return 0;
}

int
cl_op_out_dtype(cl_op *op, const DeviceArray *out, cl_dtype result)
{
    if (out != NULL && out->dtype != result) {
        return cl_arg_error(PyExc_TypeError, op->func, "out",
                            "has dtype %s but the result has dtype %s",
                            cl_dtype_name(out->dtype), cl_dtype_name(result));
    }
    return 0;
}

int
cl_op_out_cast_error(cl_op *op, cl_dtype result, cl_dtype out_dtype)
{
    return cl_arg_error(PyExc_TypeError, op->func, "out",
                        "has dtype %s but the result has dtype %s, which does not cast to it "
                        "under NumPy's 'same_kind' rule",
                        cl_dtype_name(out_dtype), cl_dtype_name(result));
}

int
cl_op_begin(cl_op *op)
{
    if (cl_require_device(op->st, op->func) < 0) {
        return -1;
    }
    if (op->device < 0 && cl_current_device(op->st, &op->device) < 0) {
        return -1;
    }
    if (cl_device_enter(op->st, op->device, &op->previous) < 0) {
        return -1;
    }
    op->begun = true;
    op->stream = cl_current_stream(op->st);
    cl_prof_begin(op->st, &op->prof, op->record, op->device);
    return 0;
}

DeviceArray *
cl_op_new(cl_op *op, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides, cl_dtype dtype)
{
    DeviceArray *a = cl_array_new(op->st, op->func, ndim, shape, strides, dtype);
    if (a != NULL) {
        cl_op_use(op, a);
    }
    return a;
}

int
cl_op_copy_into(cl_op *op, DeviceArray *dst, const DeviceArray *src)
{
    int64_t shape[CL_MAX_NDIM], dst_strides[CL_MAX_NDIM], src_strides[CL_MAX_NDIM];
    if (cl_array_size(src) == 0) {
        return 0;
    }
    Py_ssize_t dst_item = (Py_ssize_t)cl_itemsize(dst->dtype);
    Py_ssize_t src_item = (Py_ssize_t)cl_itemsize(src->dtype);
    for (int i = 0; i < src->ndim; i++) {
        shape[i] = src->shape[i];
        dst_strides[i] = dst->strides[i] / dst_item;
        src_strides[i] = src->strides[i] / src_item;
    }
    cl_op_use(op, dst);
    cl_op_use(op, src);
    cudaError_t err = cl_copy_cast(dst->data, dst->dtype, dst_strides, src->data, src->dtype,
                                   src_strides, src->ndim, shape, op->stream);
    CL_CUDA_CHECK(op->st, err);
    return 0;
fail:
    return -1;
}

DeviceArray *
cl_op_contiguous_copy(cl_op *op, DeviceArray *a, cl_dtype dtype)
{
    DeviceArray *out = cl_array_new(op->st, op->func, a->ndim, a->shape, NULL, dtype);
    if (out == NULL) {
        return NULL;
    }
    if (cl_op_copy_into(op, out, a) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

PyObject *
cl_op_end(cl_op *op, PyObject *result, const cl_prof_info *info)
{
    if (!op->begun) {
        return result;
    }
    cl_prof_end(op->st, &op->prof, result != NULL ? info : NULL);
    cl_device_exit(op->device, op->previous);
    op->begun = false;
    return result;
}

/* ---- memory overlap ----------------------------------------------------- */

void
cl_array_extent(const DeviceArray *a, uintptr_t *lo, uintptr_t *hi)
{
    intptr_t low = 0, high = 0;
    for (int i = 0; i < a->ndim; i++) {
        intptr_t span = (intptr_t)(a->shape[i] - 1) * (intptr_t)a->strides[i];
        if (span < 0) {
            low += span;
        }
        else {
            high += span;
        }
    }
    *lo = (uintptr_t)a->data + (uintptr_t)low;
    *hi = (uintptr_t)a->data + (uintptr_t)high + cl_itemsize(a->dtype);
}

bool
cl_arrays_overlap(const DeviceArray *a, const DeviceArray *b)
{
    if (cl_array_size(a) == 0 || cl_array_size(b) == 0 || a->device != b->device) {
        return false;
    }
    uintptr_t alo, ahi, blo, bhi;
    cl_array_extent(a, &alo, &ahi);
    cl_array_extent(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

bool
cl_out_needs_copy(const DeviceArray *out, const DeviceArray *a)
{
    if (!cl_arrays_overlap(out, a)) {
        return false;
    }
    if (a->data != out->data || a->dtype != out->dtype) {
        return true;
    }
    int off = out->ndim - a->ndim;
    for (int i = 0; i < out->ndim; i++) {
        if (out->shape[i] == 1) {
            continue;
        }
        Py_ssize_t s = (i < off || a->shape[i - off] == 1) ? 0 : a->strides[i - off];
        if (s != out->strides[i]) {
            return true;
        }
    }
    return false;
}
