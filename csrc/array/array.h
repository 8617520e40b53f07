/* array/: the DeviceArray object, below everything that computes with it.
 *
 *   array.c     its layout, allocation from the pool, views and wrappers of
 *               foreign memory, the streams it was used on, its lifetime
 *
 * The Python type built on it (attributes, methods, indexing, the number
 * protocol) is ../devicearray.c, at the top; the copies and constructors
 * that run as ops are in ops/. */
#ifndef CUDALAB_ARRAY_ARRAY_H
#define CUDALAB_ARRAY_ARRAY_H

#include "core/core.h"

/* ---- DeviceArray --------------------------------------------------------- */

/* A shape (or strides) as a Python tuple of ints, for attributes and messages. */
PyObject *cl_shape_tuple(int ndim, const Py_ssize_t *values);

#define CL_MAX_USED_STREAMS 4

typedef struct DeviceArray {
    PyObject_HEAD
    char *data;                       /* first element (NULL when size == 0) */
    int ndim;
    cl_dtype dtype;
    int device;
    Py_ssize_t shape[CL_MAX_NDIM];
    Py_ssize_t strides[CL_MAX_NDIM]; /* bytes */
    /* Ownership: an owner has base == NULL and frees `alloc` on `alloc_stream`
     * when it dies; a view holds a strong reference to its (root) owner. */
    PyObject *base;
    void *alloc;
    size_t alloc_bytes;               /* bytes the caller asked for */
    cudaStream_t alloc_stream;
    PyObject *weakreflist;
    /* Streams other than alloc_stream that used the memory (record_stream);
     * the free waits for them. Overflow: the free synchronizes the device. */
    cudaStream_t used_streams[CL_MAX_USED_STREAMS];
    int num_used_streams;
    bool used_streams_overflow;
    /* Set when the memory was allocated during CUDA graph capture: the graph
     * (a CUDAGraph) owns the memory and is kept alive by this reference. */
    PyObject *graph;
    /* Host array an asynchronous upload reads from (asarray(pinned,
     * non_blocking=True)): kept alive until this owner dies. Usually NULL. */
    PyObject *host_keepalive;
} DeviceArray;

#define CL_IS_DEVICEARRAY(state, obj) (Py_TYPE(obj) == (state)->DeviceArray_Type)

Py_ssize_t cl_array_size(const DeviceArray *a);
bool cl_is_c_contiguous(const DeviceArray *a);
bool cl_is_f_contiguous(const DeviceArray *a);
/* Dense with positive strides in some axis order: its bytes are exactly
 * [data, data + nbytes), so it can be copied as one block. */
bool cl_is_dense(const DeviceArray *a);
/* Some axis of extent > 1 steps backwards (a view sliced with a negative step). */
bool cl_has_negative_stride(const DeviceArray *a);
void cl_c_strides(int ndim, const Py_ssize_t *shape, size_t itemsize, Py_ssize_t *strides);

bool cl_layout_is_dense(int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
                        size_t itemsize);
/* New owner array on the current device, memory from its pool. With
 * strides == NULL it is C-contiguous; explicit byte strides must describe a
 * dense layout. `func` names the public function for error messages. */
DeviceArray *cl_array_new(cl_state *st, const char *func, int ndim, const Py_ssize_t *shape,
                          const Py_ssize_t *strides, cl_dtype dtype);
/* New view of `src`'s memory; keeps the root owner alive. */
DeviceArray *cl_array_view(cl_state *st, DeviceArray *src, char *data, int ndim,
                           const Py_ssize_t *shape, const Py_ssize_t *strides);
/* Zero-copy array over foreign device memory at `data` (interop.c's
 * imports); keeps `base` alive and never frees the memory itself. */
DeviceArray *cl_array_wrap(cl_state *st, PyObject *base, char *data, int device, cl_dtype dtype,
                           int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides);

/* Record that `a`'s memory is used on `s` (on its root owner), so its free
 * waits for `s`'s work. Never raises. */
void cl_array_note_stream(const DeviceArray *a, cudaStream_t s);

/* The type's tp_traverse, tp_clear and tp_dealloc: an owner's memory goes
 * back to the pool on its stream after the streams it was used on (or to
 * the CUDA graph that owns it). */
int cl_array_traverse(DeviceArray *self, visitproc visit, void *arg);
int cl_array_clear(DeviceArray *self);
void cl_array_dealloc(DeviceArray *self);

#endif /* CUDALAB_ARRAY_ARRAY_H */
