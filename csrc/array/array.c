/* DeviceArray: an n-dimensional strided view of device memory (rank <= 8).
 *
 * Layout: `data` points at element [0, ..., 0]; strides are in bytes and of
 * either sign, as in NumPy: a negative slice step (a[::-1]) gives a view whose
 * `data` is the last element in memory of that axis and whose stride is
 * negative, so `data` is not the lowest address a view touches
 * (cl_array_extent gives the byte range). Code that moves bytes as one block
 * (memcpy, cuBLAS, NCCL) only takes C-contiguous or dense arrays, whose
 * strides are positive; everything else goes through the strided kernels,
 * which take signed element strides. An owner array (base == NULL) returns
 * its pool allocation on its stream when it dies; a view holds a reference to
 * the root owner, so views of views never form chains. */
#include "array/array.h"
#include "runtime/runtime.h"
#include "core/core.h"

/* ---- layout helpers -------------------------------------------------------- */

Py_ssize_t
cl_array_size(const DeviceArray *a)
{
    Py_ssize_t size = 1;
    for (int i = 0; i < a->ndim; i++) {
        size *= a->shape[i];
    }
    return size;
}

void
cl_c_strides(int ndim, const Py_ssize_t *shape, size_t itemsize, Py_ssize_t *strides)
{
    Py_ssize_t stride = (Py_ssize_t)itemsize;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = stride;
        stride *= shape[i] > 1 ? shape[i] : 1;
    }
}

/* Contiguous with the last axis varying fastest (C order) or the first
 * (Fortran order). Extent-1 axes take any stride; an empty array is both,
 * whatever its strides (NumPy's rule: it holds no byte to lay out). */
static bool
is_contiguous_in(const DeviceArray *a, bool c_order)
{
    if (cl_array_size(a) == 0) {
        return true;
    }
    Py_ssize_t expected = (Py_ssize_t)cl_itemsize(a->dtype);
    for (int k = 0; k < a->ndim; k++) {
        int i = c_order ? a->ndim - 1 - k : k;
        if (a->shape[i] != 1 && a->strides[i] != expected) {
            return false;
        }
        expected *= a->shape[i];
    }
    return true;
}

bool
cl_is_c_contiguous(const DeviceArray *a)
{
    return is_contiguous_in(a, true);
}

bool
cl_is_f_contiguous(const DeviceArray *a)
{
    return is_contiguous_in(a, false);
}

bool
cl_layout_is_dense(int ndim, const Py_ssize_t *shape, const Py_ssize_t *strides,
                   size_t itemsize)
{
    /* Sort the axes that matter (extent > 1) by stride; dense means they tile
     * [0, nbytes) exactly: smallest stride == itemsize, each next one the
     * previous stride times the previous extent. A negative stride is not
     * dense here: the block would start below `data`. An empty array is
     * dense whatever its strides. */
    int axes[CL_MAX_NDIM];
    int n = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            return true;
        }
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] > 1) {
            if (strides[i] <= 0) {
                return false;
            }
            int j = n++;
            while (j > 0 && strides[axes[j - 1]] > strides[i]) {
                axes[j] = axes[j - 1];
                j--;
            }
            axes[j] = i;
        }
    }
    Py_ssize_t expected = (Py_ssize_t)itemsize;
    for (int k = 0; k < n; k++) {
        if (strides[axes[k]] != expected) {
            return false;
        }
        expected *= shape[axes[k]];
    }
    return true;
}

bool
cl_is_dense(const DeviceArray *a)
{
    return cl_layout_is_dense(a->ndim, a->shape, a->strides, cl_itemsize(a->dtype));
}

bool
cl_has_negative_stride(const DeviceArray *a)
{
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] > 1 && a->strides[i] < 0) {
            return true;
        }
    }
    return false;
}

/* ---- construction ---------------------------------------------------------- */

static DeviceArray *
alloc_object(cl_state *st)
{
    DeviceArray *a = PyObject_GC_New(DeviceArray, st->DeviceArray_Type);
    if (a == NULL) {
        return NULL;
    }
    a->data = NULL;
    a->ndim = 0;
    a->dtype = CL_FLOAT32;
    a->device = 0;
    a->base = NULL;
    a->alloc = NULL;
    a->alloc_bytes = 0;
    a->alloc_stream = NULL;
    a->weakreflist = NULL;
    a->num_used_streams = 0;
    a->used_streams_overflow = false;
    a->graph = NULL;
    a->host_keepalive = NULL;
    PyObject_GC_Track((PyObject *)a);
    return a;
}

DeviceArray *
cl_array_new(cl_state *st, const char *func, int ndim, const Py_ssize_t *shape,
             const Py_ssize_t *strides, cl_dtype dtype)
{
    size_t itemsize = cl_itemsize(dtype);
    size_t nbytes = itemsize;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] != 0 && nbytes > (size_t)PY_SSIZE_T_MAX / (size_t)shape[i]) {
            PyErr_Format(PyExc_ValueError, "%s(): array is too big", func);
            return NULL;
        }
        nbytes *= (size_t)shape[i];
    }
    int device;
    if (cl_current_device(st, &device) < 0) {
        return NULL;
    }
    cudaStream_t stream = cl_current_stream(st);
    void *ptr;
    if (cl_malloc(st, func, device, nbytes, stream, &ptr) < 0) {
        return NULL;
    }
    DeviceArray *a = alloc_object(st);
    if (a == NULL) {
        cl_free(st, device, ptr, nbytes, stream);
        return NULL;
    }
    a->data = ptr;
    a->alloc = ptr;
    a->alloc_bytes = nbytes;
    a->alloc_stream = stream;
    a->graph = cl_graph_adopt(stream, ptr); /* memory captured into a CUDA graph */
    a->device = device;
    a->dtype = dtype;
    a->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        a->shape[i] = shape[i];
    }
    if (strides != NULL) {
        for (int i = 0; i < ndim; i++) {
            a->strides[i] = strides[i];
        }
    }
    else {
        cl_c_strides(ndim, shape, itemsize, a->strides);
    }
    return a;
}

DeviceArray *
cl_array_view(cl_state *st, DeviceArray *src, char *data, int ndim, const Py_ssize_t *shape,
              const Py_ssize_t *strides)
{
    DeviceArray *a = alloc_object(st);
    if (a == NULL) {
        return NULL;
    }
    PyObject *owner = src->base != NULL ? src->base : (PyObject *)src;
    a->base = Py_NewRef(owner);
    a->data = data;
    a->device = src->device;
    a->dtype = src->dtype;
    a->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        a->shape[i] = shape[i];
        a->strides[i] = strides[i];
    }
    return a;
}

DeviceArray *
cl_array_wrap(cl_state *st, PyObject *base, char *data, int device, cl_dtype dtype, int ndim,
              const Py_ssize_t *shape, const Py_ssize_t *strides)
{
    DeviceArray *a = alloc_object(st);
    if (a == NULL) {
        return NULL;
    }
    a->base = Py_NewRef(base);
    a->data = data;
    a->device = device;
    a->dtype = dtype;
    a->ndim = ndim;
    for (int i = 0; i < ndim; i++) {
        a->shape[i] = shape[i];
        a->strides[i] = strides[i];
    }
    return a;
}

/* ---- lifetime (the type's GC and dealloc slots, ../devicearray.c) ---------- */

int
cl_array_traverse(DeviceArray *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->base);
    Py_VISIT(self->graph);
    Py_VISIT(self->host_keepalive);
    return 0;
}

int
cl_array_clear(DeviceArray *self)
{
    Py_CLEAR(self->base);
    Py_CLEAR(self->host_keepalive);
    return 0;
}

void
cl_array_dealloc(DeviceArray *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    if (self->alloc != NULL) {
        cl_state *st = cl_state_from_type(type);
        if (st != NULL && self->graph != NULL) {
            /* The CUDA graph owns this memory (captured allocation). */
            st->devices[self->device].requested_current -= self->alloc_bytes;
            st->devices[self->device].num_frees++;
            cl_graph_release(self->graph, self->alloc);
        }
        else if (st != NULL) {
            cl_free_after(st, self->device, self->alloc, self->alloc_bytes, self->alloc_stream,
                          self->used_streams, self->num_used_streams,
                          self->used_streams_overflow);
        }
        self->alloc = NULL;
    }
    Py_CLEAR(self->graph);
    Py_CLEAR(self->base);
    Py_CLEAR(self->host_keepalive);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

/* ---- the streams an array was used on -------------------------------------- */

void
cl_array_note_stream(const DeviceArray *arr, cudaStream_t s)
{
    DeviceArray *root = (DeviceArray *)arr;
    if (root->base != NULL) {
        if (Py_TYPE(root->base) != Py_TYPE(root)) {
            return; /* memory owned by something else (interop) */
        }
        root = (DeviceArray *)root->base;
    }
    if (root->alloc == NULL || root->graph != NULL || s == root->alloc_stream) {
        return;
    }
    if (cl_graph_capturing(s) != NULL) {
        return; /* captured work runs at replay; nothing to wait for at free */
    }
    for (int i = 0; i < root->num_used_streams; i++) {
        if (root->used_streams[i] == s) {
            return;
        }
    }
    if (root->num_used_streams < CL_MAX_USED_STREAMS) {
        root->used_streams[root->num_used_streams++] = s;
    }
    else {
        root->used_streams_overflow = true;
    }
}

/* ---- helpers --------------------------------------------------------------- */

PyObject *
cl_shape_tuple(int ndim, const Py_ssize_t *values)
{
    PyObject *t = PyTuple_New(ndim);
    if (t == NULL) {
        return NULL;
    }
    for (int i = 0; i < ndim; i++) {
        PyObject *v = PyLong_FromSsize_t(values[i]);
        if (v == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

