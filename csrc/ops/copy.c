/* Copies as ops, each in its own op frame: an array into a new one on its
 * device in any dtype (copy, astype, reshape's copy, asarray of a device
 * array), to the host (get, asnumpy), and to another device (to, copyto
 * between devices).
 *
 * A copy between devices is one cudaMemcpyPeerAsync. With peer access on
 * (runtime/peer.c, which the first copy between two devices turns on), the
 * copy engines move the bytes over NVLink or PCIe directly; without it the
 * driver stages them through host memory. Either way it must be ordered
 * against both devices' work: it runs on the destination's current stream
 * after an event recorded on the source's current stream, and the source's
 * current stream then waits for the copy, so neither a later write of the
 * source nor its free can overtake the read (the same two-way ordering
 * torch's cross-device copy_ does). */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "runtime/runtime.h"
#include "core/core.h"

/* ---- on the device --------------------------------------------------------- */

DeviceArray *
cl_array_copy_op(cl_state *st, const char *func, DeviceArray *a, cl_dtype dtype)
{
    cl_op op;
    cl_op_init(&op, st, func);
    if (cl_op_same_device(&op, a, "a") < 0 || cl_op_begin(&op) < 0) {
        return NULL;
    }
    cl_op_use(&op, a);
    DeviceArray *out = cl_op_new(&op, a->ndim, a->shape, NULL, dtype);
    if (out != NULL && cl_op_copy_into(&op, out, a) < 0) {
        Py_CLEAR(out);
    }
    /* Read once in a's dtype, written once in `dtype`. */
    cl_prof_info info = {
        .dtype = (int)dtype,
        .bytes = (int64_t)cl_array_size(a) * (int64_t)(cl_itemsize(a->dtype) + cl_itemsize(dtype)),
        .flops = -1,
        .ninputs = 1,
        .inputs = {a},
        .out_ndim = a->ndim,
        .out_shape = a->shape,
    };
    return (DeviceArray *)cl_op_end(&op, (PyObject *)out, CL_OP_PROFILING(&op) ? &info : NULL);
}

/* ---- to the host ----------------------------------------------------------- */

/* `out` can take the bytes of `a` (dense) as one block. */
static bool
same_dense_layout(const DeviceArray *a, PyArrayObject *out)
{
    if (!cl_is_dense(a)) {
        return false;
    }
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] > 1 && a->strides[i] != PyArray_STRIDES(out)[i]) {
            return false;
        }
    }
    return true;
}

/* The host copy's `out`: checked before any GPU call. */
static int
check_host_out(cl_state *st, const char *func, const DeviceArray *a, PyObject *obj)
{
    if (!PyArray_Check(obj)) {
        return cl_expected_type_error(func, "out", "a numpy.ndarray", obj);
    }
    PyArrayObject *out = (PyArrayObject *)obj;
    if (!PyArray_EquivTypes(PyArray_DESCR(out), st->descr[a->dtype])) {
        return cl_arg_error(PyExc_TypeError, func, "out",
                            "dtype %R does not match the array's dtype %s",
                            (PyObject *)PyArray_DESCR(out), cl_dtype_name(a->dtype));
    }
    bool same_shape = PyArray_NDIM(out) == a->ndim;
    for (int i = 0; same_shape && i < a->ndim; i++) {
        same_shape = PyArray_DIMS(out)[i] == a->shape[i];
    }
    if (!same_shape) {
        PyObject *want = cl_shape_tuple(a->ndim, a->shape);
        PyObject *got = cl_shape_tuple(PyArray_NDIM(out), PyArray_DIMS(out));
        if (want != NULL && got != NULL) {
            cl_arg_error(PyExc_ValueError, func, "out",
                         "shape %R does not match the array's shape %R", got, want);
        }
        Py_XDECREF(want);
        Py_XDECREF(got);
        return -1;
    }
    if (!PyArray_ISWRITEABLE(out)) {
        return cl_arg_error(PyExc_ValueError, func, "out", "is read-only");
    }
    return 0;
}

/* `out` is dense with positive strides: it takes one block of bytes laid
 * out as its own strides say. */
static bool
host_out_is_dense(const DeviceArray *a, PyArrayObject *out)
{
    return cl_layout_is_dense(a->ndim, PyArray_DIMS(out), PyArray_STRIDES(out),
                              cl_itemsize(a->dtype));
}

/* The NumPy array the bytes of `src` (dense) land in: `out_obj`, or a new
 * one with src's layout. New reference. */
static PyArrayObject *
host_destination(cl_state *st, const DeviceArray *src, PyObject *out_obj)
{
    if (out_obj != NULL) {
        return (PyArrayObject *)Py_NewRef(out_obj);
    }
    PyArray_Descr *descr = st->descr[src->dtype];
    Py_INCREF(descr); /* stolen below */
    return (PyArrayObject *)PyArray_NewFromDescr(&PyArray_Type, descr, src->ndim, src->shape,
                                                 src->strides, NULL, NPY_ARRAY_WRITEABLE, NULL);
}

/* The bytes that cross to the host: `a` itself when they already have the
 * destination's layout (out NULL: any dense layout), else a device copy of
 * `a` (on the op's device) laid out as the dense `out` (C order without
 * out), on op->stream. New reference. */
static DeviceArray *
device_source(cl_op *op, DeviceArray *a, PyArrayObject *out)
{
    if (out == NULL ? cl_is_dense(a)
                    : same_dense_layout(a, out) ||
                          (cl_is_c_contiguous(a) && PyArray_IS_C_CONTIGUOUS(out))) {
        return (DeviceArray *)Py_NewRef(a);
    }
    if (out == NULL || PyArray_IS_C_CONTIGUOUS(out)) {
        return cl_op_contiguous_copy(op, a, a->dtype);
    }
    DeviceArray *c =
        cl_array_new(op->st, op->func, a->ndim, a->shape, PyArray_STRIDES(out), a->dtype);
    if (c != NULL && cl_op_copy_into(op, c, a) < 0) {
        Py_CLEAR(c);
    }
    return c;
}

/* Copy dense `src` into `out` on the op's stream; wait for it unless `async`. */
static int
copy_to_host(cl_op *op, PyArrayObject *out, const DeviceArray *src, bool async)
{
    size_t nbytes = (size_t)cl_array_size(src) * cl_itemsize(src->dtype);
    cudaError_t err = cudaSuccess;
    if (nbytes > 0) {
        /* Into pageable memory the call returns only when the copy is done
         * (and after everything before it on the stream): without the GIL. */
        CL_WITHOUT_GIL(err = cudaMemcpyAsync(PyArray_DATA(out), src->data, nbytes,
                                             cudaMemcpyDeviceToHost, op->stream));
    }
    cl_prof_gpu_done(op->st, &op->prof);
    if (err == cudaSuccess && nbytes > 0 && !async) {
        /* Pageable (or blocking) destination: wait for the stream. */
        CL_WITHOUT_GIL(err = cudaStreamSynchronize(op->stream));
    }
    CL_CUDA_CHECK(op->st, err);
    return 0;
fail:
    return -1;
}

PyObject *
cl_array_to_host(cl_state *st, const char *func, DeviceArray *a, PyObject *out_obj,
                 bool non_blocking)
{
    cl_op op;
    PyArrayObject *out = NULL;
    cl_op_init(&op, st, func);
    if ((out_obj != NULL && check_host_out(st, func, a, out_obj) < 0) ||
        cl_op_same_device(&op, a, "a") < 0 || cl_op_begin(&op) < 0) {
        return NULL;
    }
    /* An out= that cannot take one block (gaps, negative strides) is filled
     * on the host from a staging array: np.copyto's job, after the wait. */
    PyObject *staged_for = NULL;
    if (out_obj != NULL && !host_out_is_dense(a, (PyArrayObject *)out_obj)) {
        staged_for = out_obj;
        out_obj = NULL;
    }
    bool async = non_blocking && out_obj != NULL &&
                 cl_host_is_pinned(PyArray_DATA((PyArrayObject *)out_obj));
    if (!async && cl_refuse_while_capturing(st, func, "a copy to pageable host memory") < 0) {
        return cl_op_end(&op, NULL, NULL);
    }
    cl_op_use(&op, a);
    DeviceArray *src = device_source(&op, a, (PyArrayObject *)out_obj);
    if (src != NULL) {
        out = host_destination(st, src, out_obj);
        if (out != NULL && copy_to_host(&op, out, src, async) < 0) {
            Py_CLEAR(out);
        }
    }
    if (out != NULL && staged_for != NULL) {
        int rc = PyArray_CopyInto((PyArrayObject *)staged_for, out);
        Py_SETREF(out, rc < 0 ? NULL : (PyArrayObject *)Py_NewRef(staged_for));
    }
    /* Bytes: what crosses to the host (a compaction on the device first, for
     * views with gaps, is not counted). */
    cl_prof_info info = {.dtype = (int)a->dtype, .bytes = cl_prof_nbytes(a), .flops = -1,
                         .ninputs = 1, .inputs = {a}, .out_ndim = a->ndim,
                         .out_shape = a->shape};
    Py_XDECREF(src);
    return cl_op_end(&op, (PyObject *)out, CL_OP_PROFILING(&op) ? &info : NULL);
}

/* ---- to another device ----------------------------------------------------- */

int
cl_copy_between_devices(cl_state *st, DeviceArray *dst, cudaStream_t dst_stream,
                        const DeviceArray *src)
{
    size_t nbytes = (size_t)cl_array_size(src) * cl_itemsize(src->dtype);
    cudaStream_t src_stream = cl_current_stream_of(src->device);
    int previous;
    if (nbytes == 0) {
        return 0;
    }
    /* The copy runs on dst's device, its engines reading src's memory. */
    cl_peer_first_copy(st, dst->device, src->device);
    if (cl_stream_wait_stream(st, dst_stream, src_stream, src->device) < 0 ||
        cl_device_enter(st, dst->device, &previous) < 0) {
        return -1;
    }
    cudaError_t err = cudaMemcpyPeerAsync(dst->data, dst->device, src->data, src->device, nbytes,
                                          dst_stream);
    cl_device_exit(dst->device, previous);
    CL_CUDA_CHECK(st, err);
    if (cl_stream_wait_stream(st, src_stream, dst_stream, dst->device) < 0) {
        return -1;
    }
    cl_array_note_stream(src, src_stream);
    cl_array_note_stream(dst, dst_stream);
    return 0;
fail:
    return -1;
}

DeviceArray *
cl_array_to_device(cl_state *st, const char *func, DeviceArray *a, int device, DeviceArray *dst)
{
    DeviceArray *src = a, *out = NULL;
    cl_op op;
    /* NCCL and peer copies read one block: compact a view with gaps first,
     * on its own device (a profiled copy of its own). */
    if (!cl_is_c_contiguous(a)) {
        src = cl_array_copy_op(st, func, a, a->dtype);
        if (src == NULL) {
            return NULL;
        }
    }
    else {
        Py_INCREF(src);
    }
    cl_op_init(&op, st, func);
    op.device = device;
    if (cl_op_begin(&op) < 0) {
        Py_DECREF(src);
        return NULL;
    }
    out = dst != NULL ? (DeviceArray *)Py_NewRef((PyObject *)dst)
                      : cl_op_new(&op, a->ndim, a->shape, NULL, a->dtype);
    if (out != NULL && cl_copy_between_devices(st, out, op.stream, src) < 0) {
        Py_CLEAR(out);
    }
    cl_prof_info info = {
        .dtype = (int)a->dtype,
        .bytes = cl_prof_nbytes(a),
        .flops = -1,
        .ninputs = 1,
        .inputs = {a},
        .out_ndim = a->ndim,
        .out_shape = a->shape,
    };
    Py_DECREF(src);
    return (DeviceArray *)cl_op_end(&op, (PyObject *)out, CL_OP_PROFILING(&op) ? &info : NULL);
}
