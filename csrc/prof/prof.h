/* prof/: measuring what the extension does.
 *
 *   profiler.c  the op profiler (cudalab.profiler) and NVTX ranges
 *
 * (The measurement harness's kernels, spin and empty launch, are ops:
 * ops/timing.c.) */
#ifndef CUDALAB_PROF_PROF_H
#define CUDALAB_PROF_PROF_H

#include "array/array.h"

/* ---- profiler (profiler.c) ---------------------------------------------------
 *
 * Every op entry point brackets its work so cudalab.profiler can record it and
 * Nsight Systems sees it as an NVTX range:
 *
 *     cl_prof_scope ps;
 *     cl_prof_begin(st, &ps, "add", device);   // device: the op's, or CL_PROF_CURRENT_DEVICE
 *     ... enqueue the work on the current stream of `device` ...
 *     if (CL_PROF_ACTIVE(&ps)) {
 *         cl_prof_info info = {...};            // built only when someone listens
 *         cl_prof_end(st, &ps, ok ? &info : NULL);   // NULL: the op failed
 *     }
 *
 * With the profiler off and no NVTX tool attached, that is a copy of one int
 * and two well-predicted branches: no calls, no allocation. cl_prof_end must
 * run on every path after cl_prof_begin (it pops the NVTX range). */

#define CL_PROF_RECORD 1          /* a cudalab.profiler.profile() is recording */
#define CL_PROF_NVTX 2            /* NVTX ranges are emitted */
#define CL_PROF_CURRENT_DEVICE (-2) /* cl_prof_begin: the current device */
#define CL_PROF_MAX_INPUTS 3

typedef struct cl_prof_scope {
    int flags;          /* st->prof_flags when the op began; 0: nothing to do */
    int session;        /* the profile it began in */
    const char *name;
    int device;         /* -1: none (host-only) */
    cudaStream_t stream;
    int ev_start;       /* index in the device's event pool, -1: no GPU time */
    int ev_end;         /* recorded early by cl_prof_gpu_done, else -1 */
    bool capturing;     /* the stream was being captured into a CUDA graph */
    int64_t host_start_ns;
} cl_prof_scope;

/* What the record says about the op (only built when CL_PROF_ACTIVE). */
typedef struct cl_prof_info {
    int dtype;        /* the cl_dtype the op works in, -1 unknown */
    int64_t bytes;    /* bytes moved (read + written), -1 unknown */
    int64_t flops;    /* floating-point operations, -1 unknown */
    int ninputs;      /* array operands whose shapes are recorded */
    const DeviceArray *inputs[CL_PROF_MAX_INPUTS];
    int out_ndim;     /* result shape; -1 unknown */
    const Py_ssize_t *out_shape;
} cl_prof_info;

void cl_prof_begin_slow(cl_state *st, cl_prof_scope *s, const char *name, int device);
void cl_prof_gpu_done_slow(cl_state *st, cl_prof_scope *s);
void cl_prof_end_slow(cl_state *st, cl_prof_scope *s, const cl_prof_info *info);

#define CL_PROF_ACTIVE(s) __builtin_expect((s)->flags != 0, 0)

static inline void
cl_prof_begin(cl_state *st, cl_prof_scope *s, const char *name, int device)
{
    s->flags = st->prof_flags;
    if (CL_PROF_ACTIVE(s)) {
        cl_prof_begin_slow(st, s, name, device);
    }
}

/* The op's GPU work is all enqueued: record the end event now, before the
 * op waits for it on the host (get, asarray), so the wait is not GPU time. */
static inline void
cl_prof_gpu_done(cl_state *st, cl_prof_scope *s)
{
    if (CL_PROF_ACTIVE(s)) {
        cl_prof_gpu_done_slow(st, s);
    }
}

static inline void
cl_prof_end(cl_state *st, cl_prof_scope *s, const cl_prof_info *info)
{
    if (CL_PROF_ACTIVE(s)) {
        cl_prof_end_slow(st, s, info);
    }
}

/* Bytes of an array's elements (size x itemsize). */
static inline int64_t
cl_prof_nbytes(const DeviceArray *a)
{
    return (int64_t)cl_array_size(a) * (int64_t)cl_itemsize(a->dtype);
}

int cl_profiler_init(PyObject *module, cl_state *st);
void cl_profiler_free(cl_state *st);

#endif /* CUDALAB_PROF_PROF_H */
