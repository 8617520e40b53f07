/* runtime/: devices and the execution state operations run in.
 *
 *   device.c    device query and selection
 *   memory.c    the stream-ordered pool, its counters and statistics
 *   stream.c    Stream and Event, the current stream every op is enqueued on
 *   graph.c     CUDAGraph capture and replay
 *   peer.c      peer access between devices (the copies: ops/copy.c)
 */
#ifndef CUDALAB_RUNTIME_RUNTIME_H
#define CUDALAB_RUNTIME_RUNTIME_H

#include "core/core.h"

/* ---- devices (device.c) -------------------------------------------------- */

extern PyMethodDef cl_device_methods[];
/* 0 when a device exists, else raises NoDeviceError naming func. */
int cl_require_device(cl_state *st, const char *func);
/* Parse an optional `device` argument (None = current). Validates before
 * touching the GPU, then requires one. Returns -1 with an exception set. */
int cl_parse_device(cl_state *st, PyObject *obj, const char *func, int *device);
/* The same for a FASTCALL function whose only argument is `device`
 * (optional unless `required`). */
/* A target device as torch users write it: an int, "cuda" (the current
 * device) or "cuda:N"; None refused. Spelling errors need no GPU. */
int cl_parse_device_spec(cl_state *st, PyObject *obj, const char *func, int *device);
int cl_parse_device_arg(cl_state *st, const char *func, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames, bool required, int *device);
int cl_current_device(cl_state *st, int *device);
/* Make `device` current for an operation on its arrays; cl_device_exit puts
 * the caller's device back (a no-op when they were the same). */
int cl_device_enter(cl_state *st, int device, int *previous);
void cl_device_exit(int device, int previous);
/* cl_device_enter for code that cannot raise (deallocators, threads without
 * the GIL): errors are cleared, and the result goes to cl_device_exit. */
int cl_device_enter_quiet(int device);

/* ---- streams (stream.c) -------------------------------------------------- */

/* The calling thread's current stream on the current device (the legacy
 * default stream, 0, unless a `with Stream:` block set one). */
cudaStream_t cl_current_stream(cl_state *st);
/* The same for `device`, whichever device is current. */
cudaStream_t cl_current_stream_of(int device);
int cl_stream_init(PyObject *module, cl_state *st);
/* `stream` waits for all work enqueued so far on `other` (of `other_device`;
 * the two may be on different devices: the event is made and recorded on
 * other's, and a stream may wait for an event of any device). The caller's
 * current device is kept. Returns 0 or -1. */
int cl_stream_wait_stream(cl_state *st, cudaStream_t stream, cudaStream_t other,
                          int other_device);
/* A Stream's handle and device; TypeError naming func/param otherwise. */
int cl_stream_handle(cl_state *st, PyObject *obj, const char *func, const char *param,
                     cudaStream_t *handle, int *device);

/* ---- CUDA graphs (graph.c) ------------------------------------------------- */

/* The CUDAGraph type; `replay` is its replay() method, an op (ops/graph.c)
 * that module.c hands down, built on these two: */
int cl_graph_init(PyObject *module, cl_state *st, PyCFunction replay);
/* The device `graph` (a CUDAGraph) replays on, or -1 with CudalabError
 * when it holds no captured graph. */
int cl_graph_replay_device(PyObject *graph, int *device);
/* Launch it on `stream` (its device current), which then frees its memory
 * after the launch. Returns 0, or -1 with CudaError. */
int cl_graph_launch(PyObject *graph, cudaStream_t stream);
/* The CUDAGraph capturing on `s` in this thread, or NULL (borrowed). */
PyObject *cl_graph_capturing(cudaStream_t s);
/* Memory `ptr` was just allocated on `s`: during capture the graph owns it;
 * returns a new reference to the graph then, else NULL. Never raises. */
PyObject *cl_graph_adopt(cudaStream_t s, void *ptr);
/* An array whose memory a graph owns dies (from dealloc). Never raises. */
void cl_graph_release(PyObject *graph, void *ptr);

/* True while this thread is capturing a CUDA graph (any stream). */
bool cl_graph_thread_capturing(void);
/* 0, or -1 with CudalabError when this thread is capturing a CUDA graph:
 * `what` (e.g. "synchronizing the device") would invalidate the capture.
 * Call it before the CUDA call that would. */
int cl_refuse_while_capturing(cl_state *st, const char *func, const char *what);
extern PyMethodDef cl_graph_methods[]; /* is_current_stream_capturing */

/* ---- several devices (peer.c) --------------------------------------------- */

extern PyMethodDef cl_peer_methods[]; /* can_access_peer, enable/disable_peer_access */
/* Before the first copy from `peer` on `device`: turn access on where the
 * hardware allows it and nobody turned it off. Never raises: a copy that
 * cannot go direct is staged. */
void cl_peer_first_copy(cl_state *st, int device, int peer);

/* ---- memory (memory.c) --------------------------------------------------- */

extern PyMethodDef cl_memory_methods[];
/* Allocate from the device's pool on `stream`. nbytes == 0 gives NULL.
 * Enforces the per-process limit; on failure trims the pool, retries once,
 * then raises OutOfMemoryError. Returns 0 or -1. */
int cl_malloc(cl_state *st, const char *func, int device, size_t nbytes, cudaStream_t stream,
              void **out);
/* Stream-ordered free; never raises (called from dealloc). */
void cl_free(cl_state *st, int device, void *ptr, size_t nbytes, cudaStream_t stream);
/* cl_free after making `stream` wait for the work on `used` streams (or the
 * whole device when `overflow`). Never raises. */
void cl_free_after(cl_state *st, int device, void *ptr, size_t nbytes, cudaStream_t stream,
                   const cudaStream_t *used, int num_used, bool overflow);

/* `device`'s pool (created on first use, whatever device is current). */
int cl_device_pool(cl_state *st, int device, cudaMemPool_t *pool);

/* True when `ptr` lies in page-locked host memory (cudaHostAlloc or
 * registered); never raises. */
bool cl_host_is_pinned(const void *ptr);

#endif /* CUDALAB_RUNTIME_RUNTIME_H */
