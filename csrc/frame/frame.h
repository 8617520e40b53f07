/* frame/: the op frame, the steps every op entry point shares, written once
 * (op_frame.c), with the copies an op makes inside it.
 *
 *     cl_op op;
 *     cl_op_init(&op, st, "add");
 *     DeviceArray *a, *out;
 *     if (cl_op_array(&op, a_obj, "a", &a) < 0 ||              // type + device
 *         cl_op_out(&op, out_obj, nd, shape, &out) < 0 ||       // out= (shape, device)
 *         cl_op_begin(&op) < 0) {                               // require a GPU, enter
 *         return NULL;                                          // its device, profiler
 *     }
 *     ... cl_op_new() results, cl_op_use() every array read or written,
 *         enqueue on op.stream; CL_CUDA_CHECK(op.st, ...) jumps to fail ...
 *     return cl_op_end(&op, result, CL_OP_PROFILING(&op) ? &info : NULL);
 *
 * Everything before cl_op_begin is validation: no CUDA call, so every bad
 * argument raises the same way on a machine without a GPU. After a
 * successful cl_op_begin, cl_op_end must run on every path (it closes the
 * profiler record and puts the caller's device back). */
#ifndef CUDALAB_FRAME_FRAME_H
#define CUDALAB_FRAME_FRAME_H

#include "array/array.h"
#include "prof/prof.h"

typedef struct cl_op {
    cl_state *st;
    const char *func;         /* the function called, for messages (and the profiler) */
    const char *record;       /* the profiler's name for the op: func, or the public
                                 name set by cl_op_record_as where func is private */
    int device;               /* fixed by the first array operand; -1 until then */
    const char *device_param; /* the parameter that fixed it */
    int previous;             /* the caller's device, restored by cl_op_end */
    bool begun;
    cudaStream_t stream;      /* the current stream of `device`, set by cl_op_begin */
    cl_prof_scope prof;
} cl_op;

void cl_op_init(cl_op *op, cl_state *st, const char *func);
/* A private entry point (_nn_linear) still names itself in its errors, but
 * the profiler records the op under the public name (linear); call before
 * cl_op_begin. */
static inline void
cl_op_record_as(cl_op *op, const char *name)
{
    op->record = name;
}

/* `obj` must be a DeviceArray (TypeError with the asarray() hint otherwise)
 * on the op's device (ValueError naming both parameters otherwise). */
int cl_op_array(cl_op *op, PyObject *obj, const char *param, DeviceArray **arr);
/* The device check alone, for an operand already known to be an array. */
int cl_op_same_device(cl_op *op, const DeviceArray *a, const char *param);

/* out=: absent or None gives *out = NULL. Otherwise a DeviceArray of exactly
 * `shape`, on the op's device; the caller checks its dtype with
 * cl_op_out_dtype (exact) or its own casting rule plus cl_op_out_cast_error. */
int cl_op_out(cl_op *op, PyObject *obj, int ndim, const Py_ssize_t *shape, DeviceArray **out);
/* The type check of out= alone (absent, None or a DeviceArray), for an op
 * that checks out= before the operand its shape comes from, so that the
 * error needs no array; cl_op_out repeats it. */
int cl_op_out_type(cl_op *op, PyObject *obj);
int cl_op_out_dtype(cl_op *op, const DeviceArray *out, cl_dtype result);
int cl_op_out_cast_error(cl_op *op, cl_dtype result, cl_dtype out_dtype);

/* Require a GPU, make the op's device current (the current device when no
 * array fixed one), start the profiler record and set op->stream. */
int cl_op_begin(cl_op *op);
/* The op reads or writes `a` on op->stream: its free waits for that work. */
static inline void
cl_op_use(cl_op *op, const DeviceArray *a)
{
    if (a != NULL) {
        cl_array_note_stream(a, op->stream);
    }
}
/* A new result array on the op's device (see cl_array_new). */
DeviceArray *cl_op_new(cl_op *op, int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
                       cl_dtype dtype);
/* Copies an op makes inside its frame (after cl_op_begin), on op->stream,
 * of arrays on the op's device (every array it checked or made is): no
 * device to enter, and both arrays are noted as used on the stream.
 * dst (any layout, src's shape) <- src, converting the dtype: */
int cl_op_copy_into(cl_op *op, DeviceArray *dst, const DeviceArray *src);
/* A new C-contiguous copy of `a` in `dtype`. */
DeviceArray *cl_op_contiguous_copy(cl_op *op, DeviceArray *a, cl_dtype dtype);
#define CL_OP_PROFILING(op) CL_PROF_ACTIVE(&(op)->prof)
/* Close the profiler record (`info` NULL or `result` NULL: the op failed or
 * nothing to say) and restore the caller's device. Returns `result`. */
PyObject *cl_op_end(cl_op *op, PyObject *result, const cl_prof_info *info);

/* ---- memory overlap ----------------------------------------------------- */

/* Byte range [lo, hi) an array's elements occupy, for strides of any sign. */
void cl_array_extent(const DeviceArray *a, uintptr_t *lo, uintptr_t *hi);
/* Whether two arrays share any byte (empty arrays share none). */
bool cl_arrays_overlap(const DeviceArray *a, const DeviceArray *b);
/* Whether writing `out` element-wise while reading `a` (broadcast to out's
 * shape) may read an element already overwritten: they overlap and `a` is
 * not exactly `out`, element for element. */
bool cl_out_needs_copy(const DeviceArray *out, const DeviceArray *a);

#endif /* CUDALAB_FRAME_FRAME_H */
