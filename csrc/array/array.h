/* array/: the DeviceArray type and everything that makes or converts one.
 *
 *   array.c     the type: attributes, views, indexing, reshape, copies
 *   creation.c  constructors and host <-> device copies
 *   interop.c   DLPack and the CUDA Array Interface, both ways
 */
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

extern PyType_Spec cl_DeviceArray_spec;

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
/* The same as a user-visible op (copy, astype, ascontiguousarray, asarray of a
 * device array to another dtype): profiled and NVTX-marked as `func`. */
DeviceArray *cl_array_copy_op(cl_state *st, const char *func, DeviceArray *a, cl_dtype dtype);
/* get() and asnumpy(): `a` copied to a new NumPy array, or into `out` (NULL:
 * none), checked and named as `func`. Asynchronous only with non_blocking and
 * a pinned `out`; a copy that must wait is refused during graph capture. */
PyObject *cl_array_to_host(cl_state *st, const char *func, DeviceArray *a, PyObject *out,
                           bool non_blocking);

/* ---- creation (creation.c) ----------------------------------------------- */

extern PyMethodDef cl_creation_methods[];
extern PyMethodDef cl_copyto_methods[]; /* array/copyto.c */

/* ---- interop (interop.c): DLPack and the CUDA Array Interface -------------- */

/* DeviceArray.__cuda_array_interface__, __dlpack__, __dlpack_device__. */
PyObject *cl_array_cuda_array_interface(DeviceArray *self, void *closure);
PyObject *cl_array_dlpack(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames);
PyObject *cl_array_dlpack_device(DeviceArray *self, PyObject *unused);
/* asarray's import of a foreign device array (DLPack producer on a CUDA
 * device, else __cuda_array_interface__): 1 with *out set, 0 when `obj` is
 * neither (nothing raised), -1 on error. */
int cl_import_device_object(cl_state *st, PyObject *obj, const char *func, PyObject **out);
extern PyMethodDef cl_interop_methods[]; /* array/interop.c */

#endif /* CUDALAB_ARRAY_ARRAY_H */
