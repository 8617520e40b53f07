/* Zero-copy interop with the GPU Python ecosystem: DLPack and the CUDA Array
 * Interface (version 3), both directions.
 *
 * Export
 *   DeviceArray.__dlpack__(stream=None, max_version=None, dl_device=None, copy=None)
 *   DeviceArray.__dlpack_device__()  -> (kDLCUDA = 2, device)
 *   DeviceArray.__cuda_array_interface__
 * Import
 *   from_dlpack(obj), and asarray(obj) for foreign device arrays: a DLPack
 *   producer whose __dlpack_device__ is a CUDA device first (PyTorch, CuPy,
 *   JAX), else __cuda_array_interface__ (Numba, CuPy, PyTorch). DLPack goes
 *   first because it carries bfloat16 and an explicit lifetime (a deleter).
 *
 * Lifetimes. An exported DLPack tensor holds a strong reference to the
 * DeviceArray; the consumer's call of the deleter drops it (taking the GIL).
 * An imported tensor becomes a DeviceArray whose base is a small owner
 * capsule: when the last view dies the owner calls the producer's deleter.
 * A CUDA Array Interface import keeps the producing object itself as base.
 *
 * Streams. Producer and consumer name streams by integers: 1 is the legacy
 * default stream, 2 the per-thread default stream, anything else a
 * cudaStream_t; 0 is ambiguous and refused. Our current stream is reported
 * as 1 while it is the legacy default stream. A consumer's stream is made to
 * wait on our current stream with an event (DLPack export); on import our
 * current stream waits on the producer's (DLPack: the producer does it when
 * we pass our stream; CAI: we do it from the "stream" entry).
 *
 * Negative strides (views such as a[::-1]) cross both interfaces as they
 * are, both ways, with the data pointer at element [0, ..., 0]: DLPack's
 * strides are signed int64 element counts that dlpack.h and the Python
 * specification do not restrict (NumPy and CuPy export and import them), and
 * the CUDA Array Interface's strides are "the number of bytes to skip to
 * access the next element at each dimension", the NumPy array interface's
 * definition, whose producers (NumPy, Numba) report negative ones. Some
 * consumers refuse them (PyTorch, TensorFlow): pass such a view's copy().
 *
 * The DLPack structs follow the published dlpack.h layout (v1.0); they are
 * written out here rather than vendored. */
#include "ops/ops.h"
#include "array/array.h"
#include "runtime/runtime.h"
#include "core/core.h"

/* ---- the DLPack ABI (dlpack.h, v1.0) --------------------------------------- */

enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 };

typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* elements; NULL = compact row-major */
    uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1ULL << 0)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1ULL << 1)

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#define CAPSULE_PLAIN "dltensor"
#define CAPSULE_VERSIONED "dltensor_versioned"
#define CAPSULE_PLAIN_USED "used_dltensor"
#define CAPSULE_VERSIONED_USED "used_dltensor_versioned"
#define OWNER_PLAIN "cudalab.dlpack_owner"
#define OWNER_VERSIONED "cudalab.dlpack_owner_versioned"

/* ---- dtypes ---------------------------------------------------------------- */

static DLDataType
dl_dtype_of(cl_dtype dtype)
{
    DLDataType t = {kDLFloat, 32, 1};
    switch (dtype) {
    case CL_BOOL: t.code = kDLBool; t.bits = 8; break;
    case CL_INT8: t.code = kDLInt; t.bits = 8; break;
    case CL_UINT8: t.code = kDLUInt; t.bits = 8; break;
    case CL_INT32: t.code = kDLInt; t.bits = 32; break;
    case CL_INT64: t.code = kDLInt; t.bits = 64; break;
    case CL_FLOAT16: t.code = kDLFloat; t.bits = 16; break;
    case CL_BFLOAT16: t.code = kDLBfloat; t.bits = 16; break;
    case CL_FLOAT32: t.code = kDLFloat; t.bits = 32; break;
    case CL_FLOAT64: t.code = kDLFloat; t.bits = 64; break;
    default: break;
    }
    return t;
}

/* -1 when cudalab has no such dtype. */
static int
cl_dtype_of_dl(DLDataType t)
{
    if (t.lanes != 1) {
        return -1;
    }
    for (int d = 0; d < CL_NUM_DTYPES; d++) {
        DLDataType u = dl_dtype_of((cl_dtype)d);
        if (u.code == t.code && u.bits == t.bits) {
            return d;
        }
    }
    return -1;
}

static const char *
cai_typestr(cl_dtype dtype)
{
    switch (dtype) {
    case CL_BOOL: return "|b1";
    case CL_INT8: return "|i1";
    case CL_UINT8: return "|u1";
    case CL_INT32: return "<i4";
    case CL_INT64: return "<i8";
    case CL_FLOAT16: return "<f2";
    case CL_FLOAT32: return "<f4";
    case CL_FLOAT64: return "<f8";
    default: return NULL; /* bfloat16: the interface has no type string for it */
    }
}

/* ---- stream handles -------------------------------------------------------- */

static long long
handle_of_stream(cudaStream_t s)
{
    if (s == (cudaStream_t)0 || s == cudaStreamLegacy) {
        return 1;
    }
    if (s == cudaStreamPerThread) {
        return 2;
    }
    return (long long)(uintptr_t)s;
}

static cudaStream_t
stream_of_handle(long long h)
{
    if (h == 1) {
        return cudaStreamLegacy;
    }
    if (h == 2) {
        return cudaStreamPerThread;
    }
    return (cudaStream_t)(uintptr_t)h;
}

/* Parse a stream integer (None allowed when allow_none; -1 when allow_minus1).
 * *handle = 0 for None. */
static int
parse_stream_handle(PyObject *obj, const char *func, const char *param, bool allow_minus1,
                    long long *handle)
{
    *handle = 0;
    if (obj == NULL || obj == Py_None) {
        return 0;
    }
    if (PyBool_Check(obj) || !PyLong_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, param,
                            "expected None or an int stream handle, got %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    long long h = PyLong_AsLongLong(obj);
    if (h == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        unsigned long long u = PyLong_AsUnsignedLongLong(obj); /* pointers above 2**63 */
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            return -1;
        }
        h = (long long)u;
    }
    if (h == 0) {
        return cl_arg_error(PyExc_ValueError, func, param,
                            "0 is ambiguous and not allowed (use 1 for the legacy default "
                            "stream, 2 for the per-thread default stream)");
    }
    if (h == -1 && !allow_minus1) {
        return cl_arg_error(PyExc_ValueError, func, param, "-1 is not a stream");
    }
    if (h < -1 && h > -(1LL << 40)) { /* small negatives are not pointers */
        return cl_arg_error(PyExc_ValueError, func, param, "invalid stream handle %lld", h);
    }
    *handle = h;
    return 0;
}

/* `waiter` waits (on the device) for the work enqueued so far on `producer`.
 * The current device must be the one both streams belong to. */
static int
stream_wait(cl_state *st, cudaStream_t waiter, cudaStream_t producer)
{
    cudaEvent_t ev = NULL;
    if (handle_of_stream(waiter) == handle_of_stream(producer)) {
        return 0;
    }
    CL_CUDA_CHECK(st, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CL_CUDA_CHECK(st, cudaEventRecord(ev, producer));
    CL_CUDA_CHECK(st, cudaStreamWaitEvent(waiter, ev, 0));
    CL_CUDA_CHECK(st, cudaEventDestroy(ev)); /* released once the wait is done */
    return 0;
fail:
    if (ev != NULL) {
        (void)cudaEventDestroy(ev);
    }
    return -1;
}

/* ---- CUDA Array Interface export -------------------------------------------- */

PyObject *
cl_array_cuda_array_interface(DeviceArray *self, void *closure)
{
    cl_state *st = cl_state_from_type(Py_TYPE(self));
    const char *typestr = cai_typestr(self->dtype);
    if (typestr == NULL) {
        /* AttributeError, so hasattr() is False and consumers (CuPy, Numba)
         * move on to DLPack, which does carry bfloat16. CuPy refuses too. */
        PyErr_SetString(PyExc_AttributeError,
                        "__cuda_array_interface__: bfloat16 has no type string in the CUDA "
                        "Array Interface; export through DLPack instead "
                        "(torch.from_dlpack(a), cupy.from_dlpack(a))");
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *shape = cl_shape_tuple(self->ndim, self->shape);
    PyObject *strides = cl_is_c_contiguous(self) ? Py_NewRef(Py_None)
                                                 : cl_shape_tuple(self->ndim, self->strides);
    PyObject *descr = Py_BuildValue("[(ss)]", "", typestr);
    PyObject *data = Py_BuildValue(
        "(NO)", PyLong_FromVoidPtr(cl_array_size(self) == 0 ? NULL : self->data), Py_False);
    if (shape == NULL || strides == NULL || descr == NULL || data == NULL) {
        goto done;
    }
    /* Our work on the array is ordered on the current stream. */
    result = Py_BuildValue("{s:O,s:s,s:O,s:O,s:O,s:i,s:L}", "shape", shape, "typestr", typestr,
                           "descr", descr, "data", data, "strides", strides, "version", 3,
                           "stream", handle_of_stream(cl_current_stream(st)));
done:
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    Py_XDECREF(descr);
    Py_XDECREF(data);
    return result;
}

/* ---- CUDA Array Interface import -------------------------------------------- */

static int
int_tuple(PyObject *obj, const char *func, const char *what, int max_len, Py_ssize_t *out,
          int *len)
{
    if (!PyTuple_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "__cuda_array_interface__['%s'] must be a tuple, got %.100s", what,
                            Py_TYPE(obj)->tp_name);
    }
    Py_ssize_t n = PyTuple_GET_SIZE(obj);
    if (n > max_len) {
        return cl_arg_error(PyExc_ValueError, func, "obj",
                            "%zd dimensions exceed the maximum of %d", n, max_len);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(obj, i);
        if (PyBool_Check(v) || !PyLong_Check(v)) {
            return cl_arg_error(PyExc_TypeError, func, "obj",
                                "__cuda_array_interface__['%s'] must hold ints", what);
        }
        out[i] = PyLong_AsSsize_t(v);
        if (out[i] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    *len = (int)n;
    return 0;
}

/* Device that owns `ptr` (device or managed memory), else raise. */
static int
pointer_device(cl_state *st, void *ptr, const char *func, int *device)
{
    struct cudaPointerAttributes attr;
    cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
    if (err == cudaErrorInvalidValue) {
        (void)cudaGetLastError();
        attr.type = cudaMemoryTypeUnregistered;
    }
    else {
        CL_CUDA_CHECK(st, err);
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "__cuda_array_interface__ points at host memory, not device "
                            "memory; use cudalab.asarray(numpy.asarray(obj)) to copy it");
    }
    *device = attr.device;
    return 0;
fail:
    return -1;
}

/* What a __cuda_array_interface__ dict describes, checked. */
typedef struct cai_view {
    int ndim;
    Py_ssize_t shape[CL_MAX_NDIM], strides[CL_MAX_NDIM];
    cl_dtype dtype;
    void *ptr;
    long long stream; /* 0: none given */
} cai_view;

/* 'typestr' -> *dtype; TypeError naming the typestr when unsupported. */
static int
cai_dtype(cl_state *st, PyObject *typestr, const char *func, cl_dtype *dtype)
{
    if (PyUnicode_Check(typestr) && cl_dtype_converter(st, typestr, func, "obj", dtype) == 0) {
        return 0;
    }
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_TypeError)) {
        return -1;
    }
    PyErr_Clear();
    return cl_arg_error(PyExc_TypeError, func, "obj",
                        "unsupported __cuda_array_interface__ typestr %R", typestr);
}

/* 'strides' (absent or None: C order) -> v->strides, in bytes, of either
 * sign (the producer's data pointer is element [0, ..., 0]). */
static int
cai_strides(PyObject *strides_obj, const char *func, cai_view *v)
{
    Py_ssize_t itemsize = (Py_ssize_t)cl_itemsize(v->dtype);
    int nstrides;
    if (strides_obj == NULL || strides_obj == Py_None) {
        cl_c_strides(v->ndim, v->shape, (size_t)itemsize, v->strides);
        return 0;
    }
    if (int_tuple(strides_obj, func, "strides", CL_MAX_NDIM, v->strides, &nstrides) < 0) {
        return -1;
    }
    if (nstrides != v->ndim) {
        return cl_arg_error(PyExc_ValueError, func, "obj",
                            "'strides' has %d entries for %d dimensions", nstrides, v->ndim);
    }
    for (int i = 0; i < v->ndim; i++) {
        if (v->strides[i] % itemsize != 0) {
            return cl_arg_error(PyExc_ValueError, func, "obj",
                                "strides %R are not supported (they must be multiples of the "
                                "item size)", strides_obj);
        }
    }
    return 0;
}

/* Check the dict and fill `v`; touches no GPU. */
static int
parse_cai(cl_state *st, PyObject *cai, const char *func, cai_view *v)
{
    if (!PyDict_Check(cai)) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "__cuda_array_interface__ must be a dict, got %.100s",
                            Py_TYPE(cai)->tp_name);
    }
    PyObject *shape = PyDict_GetItemString(cai, "shape");
    PyObject *typestr = PyDict_GetItemString(cai, "typestr");
    PyObject *data = PyDict_GetItemString(cai, "data");
    PyObject *mask = PyDict_GetItemString(cai, "mask");
    if (shape == NULL || typestr == NULL || data == NULL) {
        return cl_arg_error(PyExc_ValueError, func, "obj",
                            "__cuda_array_interface__ lacks 'shape', 'typestr' or 'data'");
    }
    if (int_tuple(shape, func, "shape", CL_MAX_NDIM, v->shape, &v->ndim) < 0) {
        return -1;
    }
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] < 0) {
            return cl_arg_error(PyExc_ValueError, func, "obj", "negative extent in 'shape'");
        }
    }
    if (cai_dtype(st, typestr, func, &v->dtype) < 0) {
        return -1;
    }
    if (!PyTuple_Check(data) || PyTuple_GET_SIZE(data) != 2 ||
        !PyLong_Check(PyTuple_GET_ITEM(data, 0))) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "__cuda_array_interface__['data'] must be (int, bool)");
    }
    v->ptr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0));
    if ((v->ptr == NULL && PyErr_Occurred()) ||
        cai_strides(PyDict_GetItemString(cai, "strides"), func, v) < 0) {
        return -1;
    }
    if (mask != NULL && mask != Py_None) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "masked arrays (__cuda_array_interface__['mask']) are not "
                            "supported");
    }
    return parse_stream_handle(PyDict_GetItemString(cai, "stream"), func, "obj", false,
                               &v->stream);
}

static PyObject *
import_cai(cl_state *st, PyObject *obj, PyObject *cai, const char *func)
{
    cai_view v;
    int device;
    if (parse_cai(st, cai, func, &v) < 0 || cl_require_device(st, func) < 0) {
        return NULL;
    }
    Py_ssize_t size = 1;
    for (int i = 0; i < v.ndim; i++) {
        size *= v.shape[i];
    }
    if (size != 0 && v.ptr == NULL) {
        return cl_arg_error(PyExc_ValueError, func, "obj",
                            "__cuda_array_interface__ has a NULL pointer"), NULL;
    }
    if (size == 0 ? cl_current_device(st, &device) < 0
                  : pointer_device(st, v.ptr, func, &device) < 0) {
        return NULL;
    }
    if (v.stream != 0 && size != 0) {
        /* The producer's work on the data is ordered on its stream: ours
         * waits for it before any of our work on the view. */
        int previous, rc;
        if (cl_device_enter(st, device, &previous) < 0) {
            return NULL;
        }
        rc = stream_wait(st, cl_current_stream(st), stream_of_handle(v.stream));
        cl_device_exit(device, previous);
        if (rc < 0) {
            return NULL;
        }
    }
    return (PyObject *)cl_array_wrap(st, obj, (char *)v.ptr, device, v.dtype, v.ndim, v.shape,
                                     v.strides);
}

/* ---- DLPack export ----------------------------------------------------------- */

typedef struct export_ctx {
    PyObject *array; /* strong reference to the exported DeviceArray */
    int64_t shape[CL_MAX_NDIM];
    int64_t strides[CL_MAX_NDIM];
    DLManagedTensor plain;
    DLManagedTensorVersioned versioned;
} export_ctx;

static void
export_release(export_ctx *ctx)
{
    /* Consumers may call the deleter from any thread, with or without the
     * GIL; at interpreter exit there is no Python left to release into. */
    if (Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_XDECREF(ctx->array);
        PyGILState_Release(g);
    }
    free(ctx);
}

static void
export_deleter_plain(DLManagedTensor *self)
{
    export_release((export_ctx *)self->manager_ctx);
}

static void
export_deleter_versioned(DLManagedTensorVersioned *self)
{
    export_release((export_ctx *)self->manager_ctx);
}

/* Runs when the capsule dies: the tensor is ours to delete unless a consumer
 * renamed the capsule ("used_..."), taking over that duty. */
static void
export_capsule_destructor(PyObject *capsule)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyCapsule_IsValid(capsule, CAPSULE_PLAIN)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, CAPSULE_PLAIN);
        if (m != NULL && m->deleter != NULL) {
            m->deleter(m);
        }
    }
    else if (PyCapsule_IsValid(capsule, CAPSULE_VERSIONED)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, CAPSULE_VERSIONED);
        if (m != NULL && m->deleter != NULL) {
            m->deleter(m);
        }
    }
    PyErr_Restore(type, value, tb);
}

PyObject *
cl_array_dlpack_device(DeviceArray *self, PyObject *unused)
{
    return Py_BuildValue("(ii)", kDLCUDA, self->device);
}

/* __dlpack__'s max_version and dl_device: whether the consumer takes a
 * versioned capsule, and that it asks for the array where it lives. */
static int
parse_dlpack_request(DeviceArray *self, PyObject *max_version, PyObject *dl_device,
                     bool *versioned)
{
    static const char *func = "__dlpack__";
    *versioned = false;
    if (max_version != NULL && max_version != Py_None) {
        long major;
        if (!PyTuple_Check(max_version) || PyTuple_GET_SIZE(max_version) != 2 ||
            (major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0))) == -1) {
            PyErr_Clear();
            return cl_arg_error(PyExc_TypeError, func, "max_version",
                                "expected None or a (major, minor) tuple of ints");
        }
        *versioned = major >= 1;
    }
    if (dl_device != NULL && dl_device != Py_None) {
        long type = -1, id = -1;
        if (PyTuple_Check(dl_device) && PyTuple_GET_SIZE(dl_device) == 2) {
            type = PyLong_AsLong(PyTuple_GET_ITEM(dl_device, 0));
            id = PyLong_AsLong(PyTuple_GET_ITEM(dl_device, 1));
            PyErr_Clear();
        }
        if (type != kDLCUDA || id != self->device) {
            PyErr_Format(PyExc_BufferError,
                         "__dlpack__(): dl_device %R is not supported: the array lives on "
                         "(kDLCUDA=2, %d) and is only exported there", dl_device, self->device);
            return -1;
        }
    }
    return 0;
}

/* The capsule handing `a` (a new reference, which moves into it) to a consumer. */
static PyObject *
export_capsule(DeviceArray *a, bool versioned, bool copied)
{
    export_ctx *ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL) {
        Py_DECREF(a);
        return PyErr_NoMemory();
    }
    ctx->array = (PyObject *)a;
    Py_ssize_t itemsize = (Py_ssize_t)cl_itemsize(a->dtype);
    for (int i = 0; i < a->ndim; i++) {
        ctx->shape[i] = a->shape[i];
        ctx->strides[i] = a->strides[i] / itemsize;
    }
    DLTensor t = {
        .data = cl_array_size(a) == 0 ? NULL : a->data,
        .device = {kDLCUDA, a->device},
        .ndim = a->ndim,
        .dtype = dl_dtype_of(a->dtype),
        .shape = ctx->shape,
        .strides = ctx->strides,
        .byte_offset = 0,
    };
    PyObject *capsule;
    if (versioned) {
        ctx->versioned.version.major = 1;
        ctx->versioned.version.minor = 0;
        ctx->versioned.manager_ctx = ctx;
        ctx->versioned.deleter = export_deleter_versioned;
        ctx->versioned.flags = copied ? DLPACK_FLAG_BITMASK_IS_COPIED : 0;
        ctx->versioned.dl_tensor = t;
        capsule = PyCapsule_New(&ctx->versioned, CAPSULE_VERSIONED, export_capsule_destructor);
    }
    else {
        ctx->plain.dl_tensor = t;
        ctx->plain.manager_ctx = ctx;
        ctx->plain.deleter = export_deleter_plain;
        capsule = PyCapsule_New(&ctx->plain, CAPSULE_PLAIN, export_capsule_destructor);
    }
    if (capsule == NULL) {
        export_release(ctx);
    }
    return capsule;
}

PyObject *
cl_array_dlpack(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"stream", "max_version", "dl_device", "copy", NULL};
    static const char *func = "__dlpack__";
    cl_state *st = cl_state_from_type(Py_TYPE(self));
    PyObject *argv[4];
    long long consumer = 0;
    bool versioned;
    int copy = 0, previous;
    if (cl_parse_args(func, args, nargs, kwnames, names, 0, argv) < 0 ||
        parse_stream_handle(argv[0], func, "stream", true, &consumer) < 0 ||
        parse_dlpack_request(self, argv[1], argv[2], &versioned) < 0 ||
        (argv[3] != NULL && argv[3] != Py_None && (copy = PyObject_IsTrue(argv[3])) < 0) ||
        cl_device_enter(st, self->device, &previous) < 0) {
        return NULL;
    }
    DeviceArray *a = copy ? cl_array_copy_op(st, func, self, self->dtype)
                          : (DeviceArray *)Py_NewRef(self);
    /* The consumer's stream waits for our work on the array; -1: no sync. */
    if (a != NULL && consumer != -1 && cl_array_size(a) > 0) {
        cudaStream_t theirs = consumer == 0 ? cudaStreamLegacy : stream_of_handle(consumer);
        if (stream_wait(st, theirs, cl_current_stream(st)) < 0) {
            Py_CLEAR(a);
        }
    }
    cl_device_exit(self->device, previous);
    return a == NULL ? NULL : export_capsule(a, versioned, copy != 0);
}

/* ---- DLPack import ------------------------------------------------------------ */

/* A producer's tensor, plain or versioned (DLPack 1.x). */
typedef struct dl_import {
    bool versioned;
    void *managed; /* DLManagedTensor or DLManagedTensorVersioned */
    DLTensor *t;
} dl_import;

static void
call_deleter(const dl_import *m)
{
    if (m->versioned) {
        DLManagedTensorVersioned *v = m->managed;
        if (v->deleter != NULL) {
            v->deleter(v);
        }
    }
    else {
        DLManagedTensor *p = m->managed;
        if (p->deleter != NULL) {
            p->deleter(p);
        }
    }
}

/* The owner capsule of an imported tensor dies with the last view of it. */
static void
owner_destructor(PyObject *capsule)
{
    dl_import m = {.versioned = PyCapsule_IsValid(capsule, OWNER_VERSIONED)};
    m.managed = PyCapsule_GetPointer(capsule, m.versioned ? OWNER_VERSIONED : OWNER_PLAIN);
    if (m.managed == NULL) {
        PyErr_Clear();
        return;
    }
    call_deleter(&m);
}

/* The tensor inside a "dltensor" or "dltensor_versioned" capsule. */
static int
open_capsule(PyObject *capsule, const char *func, dl_import *m)
{
    const char *name = PyCapsule_GetName(capsule);
    if (name == NULL) {
        return -1;
    }
    if (strcmp(name, CAPSULE_PLAIN_USED) == 0 || strcmp(name, CAPSULE_VERSIONED_USED) == 0) {
        return cl_arg_error(PyExc_ValueError, func, "obj",
                            "DLPack capsule was already consumed (a capsule can be imported "
                            "only once; call __dlpack__() again for a new one)");
    }
    if (strcmp(name, CAPSULE_PLAIN) != 0 && strcmp(name, CAPSULE_VERSIONED) != 0) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "expected a DLPack capsule, got a capsule named '%s'", name);
    }
    m->versioned = strcmp(name, CAPSULE_VERSIONED) == 0;
    m->managed = PyCapsule_GetPointer(capsule, name);
    if (m->managed == NULL) {
        return -1;
    }
    if (!m->versioned) {
        m->t = &((DLManagedTensor *)m->managed)->dl_tensor;
        return 0;
    }
    DLManagedTensorVersioned *v = m->managed;
    if (v->version.major != 1) {
        PyErr_Format(PyExc_BufferError, "%s(): DLPack version %u.%u is not supported (1.x is)",
                     func, (unsigned)v->version.major, (unsigned)v->version.minor);
        return -1;
    }
    m->t = &v->dl_tensor;
    return 0;
}

/* The tensor's device and dtype: a CUDA device, a dtype of ours. */
static int
check_dl_kind(const DLTensor *t, const char *func, cl_dtype *dtype)
{
    if (t->device.device_type == kDLCPU || t->device.device_type == kDLCUDAHost) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "the DLPack tensor is in host memory; use cudalab.asarray() to "
                            "copy it to the device");
    }
    if (t->device.device_type != kDLCUDA && t->device.device_type != kDLCUDAManaged) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "DLPack device type %d is not a CUDA device",
                            (int)t->device.device_type);
    }
    int code = cl_dtype_of_dl(t->dtype);
    if (code < 0) {
        PyObject *supported = cl_supported_dtypes_text();
        cl_arg_error(PyExc_TypeError, func, "obj",
                     "unsupported DLPack dtype (code %d, %d bits, %d lanes; supported: %U)",
                     (int)t->dtype.code, (int)t->dtype.bits, (int)t->dtype.lanes, supported);
        Py_XDECREF(supported);
        return -1;
    }
    *dtype = (cl_dtype)code;
    return 0;
}

/* The tensor's shape and byte strides. */
static int
dl_layout(const DLTensor *t, cl_dtype dtype, const char *func, Py_ssize_t *shape,
          Py_ssize_t *strides)
{
    Py_ssize_t itemsize = (Py_ssize_t)cl_itemsize(dtype);
    if (t->ndim < 0 || t->ndim > CL_MAX_NDIM) {
        return cl_arg_error(PyExc_ValueError, func, "obj",
                            "%d dimensions exceed the maximum of %d", (int)t->ndim,
                            CL_MAX_NDIM);
    }
    for (int i = 0; i < t->ndim; i++) {
        shape[i] = (Py_ssize_t)t->shape[i];
        if (shape[i] < 0) {
            return cl_arg_error(PyExc_ValueError, func, "obj",
                                "negative extent in the DLPack shape");
        }
    }
    if (t->strides == NULL) {
        cl_c_strides(t->ndim, shape, (size_t)itemsize, strides);
        return 0;
    }
    /* Element strides of any sign, as the producer's views have them. */
    for (int i = 0; i < t->ndim; i++) {
        strides[i] = (Py_ssize_t)t->strides[i] * itemsize;
    }
    return 0;
}

/* Take over a DLPack capsule: check the tensor, rename the capsule so its
 * producer will not delete it, and wrap it in a DeviceArray whose owner
 * calls the deleter. Checks fail before the rename, leaving the capsule to
 * its producer's destructor. */
static PyObject *
consume_capsule(cl_state *st, PyObject *capsule, const char *func)
{
    dl_import m = {.versioned = false, .managed = NULL, .t = NULL};
    cl_dtype dtype = CL_FLOAT32;
    Py_ssize_t shape[CL_MAX_NDIM], strides[CL_MAX_NDIM];
    if (open_capsule(capsule, func, &m) < 0 || check_dl_kind(m.t, func, &dtype) < 0 ||
        dl_layout(m.t, dtype, func, shape, strides) < 0) {
        return NULL;
    }
    /* From here on the tensor is ours. */
    if (PyCapsule_SetName(capsule, m.versioned ? CAPSULE_VERSIONED_USED : CAPSULE_PLAIN_USED) <
        0) {
        return NULL;
    }
    PyObject *owner = PyCapsule_New(m.managed, m.versioned ? OWNER_VERSIONED : OWNER_PLAIN,
                                    owner_destructor);
    if (owner == NULL) {
        call_deleter(&m);
        return NULL;
    }
    const DLTensor *t = m.t;
    char *data = t->data == NULL ? NULL : (char *)t->data + t->byte_offset;
    PyObject *out = (PyObject *)cl_array_wrap(st, owner, data, t->device.device_id, dtype,
                                              t->ndim, shape, strides);
    Py_DECREF(owner); /* the array holds it now (or, on failure, the deleter ran) */
    return out;
}

/* obj.__dlpack_device__() -> device type, or -1 with an exception set.
 * Objects without the method report -2 (nothing raised). */
static int
dlpack_device_type(PyObject *obj, int *device_id)
{
    PyObject *dev = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (dev == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Clear();
            return -2;
        }
        return -1;
    }
    long type = -1, id = 0;
    if (PyTuple_Check(dev) && PyTuple_GET_SIZE(dev) == 2) {
        type = PyLong_AsLong(PyTuple_GET_ITEM(dev, 0));
        id = PyLong_AsLong(PyTuple_GET_ITEM(dev, 1));
    }
    Py_DECREF(dev);
    if (PyErr_Occurred() || type < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "__dlpack_device__() must return (int, int)");
        return -1;
    }
    *device_id = (int)id;
    return (int)type;
}

/* Ask the producer for a capsule, passing our current stream so that it
 * orders its pending work before ours; newer producers get max_version. */
static PyObject *
import_dlpack(cl_state *st, PyObject *obj, const char *func)
{
    PyObject *capsule = NULL;
    long long handle = handle_of_stream(cl_current_stream(st));
    PyObject *stream = PyLong_FromLongLong(handle);
    PyObject *meth = PyObject_GetAttrString(obj, "__dlpack__");
    PyObject *kwargs = NULL;
    if (stream == NULL || meth == NULL) {
        goto done;
    }
    kwargs = Py_BuildValue("{s:O,s:(ii)}", "stream", stream, "max_version", 1, 0);
    if (kwargs == NULL) {
        goto done;
    }
    PyObject *empty = PyTuple_New(0);
    if (empty == NULL) {
        goto done;
    }
    capsule = PyObject_Call(meth, empty, kwargs);
    if (capsule == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
        /* A producer from before DLPack 1.0 knows no max_version. */
        PyErr_Clear();
        Py_CLEAR(kwargs);
        kwargs = Py_BuildValue("{s:O}", "stream", stream);
        if (kwargs != NULL) {
            capsule = PyObject_Call(meth, empty, kwargs);
        }
    }
    Py_DECREF(empty);
done:
    Py_XDECREF(stream);
    Py_XDECREF(meth);
    Py_XDECREF(kwargs);
    if (capsule == NULL) {
        return NULL;
    }
    if (!PyCapsule_CheckExact(capsule)) {
        cl_arg_error(PyExc_TypeError, func, "obj", "__dlpack__() returned %.100s, not a capsule",
                     Py_TYPE(capsule)->tp_name);
        Py_DECREF(capsule);
        return NULL;
    }
    PyObject *out = consume_capsule(st, capsule, func);
    Py_DECREF(capsule);
    return out;
}

PyDoc_STRVAR(from_dlpack_doc,
"from_dlpack(obj)\n--\n\n"
"A zero-copy DeviceArray view of another library's CUDA array (DLPack).\n\n"
"`obj` is any DLPack producer on a CUDA device (torch.Tensor, cupy.ndarray,\n"
"jax.Array, ...) or a DLPack capsule. The producer is asked for its data\n"
"with our current stream, so its pending work is ordered before ours. The\n"
"memory stays valid as long as the returned array (or any view of it)\n"
"lives, even after the producer object is gone. Writes through either side\n"
"are seen by the other (after the usual stream ordering). Any strides are\n"
"kept, negative ones (a reversed view) included.\n\n"
"Parameters\n----------\nobj : object with __dlpack__, or a DLPack capsule\n"
"    A capsule can be imported only once.\n\n"
"Returns\n-------\nDeviceArray\n\n"
"Raises\n------\nTypeError\n"
"    For host (CPU) tensors: use cudalab.asarray() to copy those.\n"
"ValueError\n    For a capsule that was already consumed.");

static PyObject *
from_dlpack(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"obj", NULL};
    static const char *func = "from_dlpack";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[1];
    if (cl_parse_args(func, args, nargs, kwnames, names, 1, argv) < 0) {
        return NULL;
    }
    PyObject *obj = argv[0];
    if (CL_IS_DEVICEARRAY(st, obj)) {
        return Py_NewRef(obj);
    }
    if (PyCapsule_CheckExact(obj)) {
        if (cl_require_device(st, func) < 0) {
            return NULL;
        }
        return consume_capsule(st, obj, func);
    }
    if (!PyObject_HasAttrString(obj, "__dlpack__")) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "expected an object with __dlpack__ (a DLPack producer such as a "
                            "CUDA torch.Tensor or cupy.ndarray), got %.100s",
                            Py_TYPE(obj)->tp_name), NULL;
    }
    int device_id = 0;
    int type = dlpack_device_type(obj, &device_id);
    if (type == -1) {
        return NULL;
    }
    if (type == kDLCPU || type == kDLCUDAHost) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "%.100s is in host memory (DLPack device type %d); use "
                            "cudalab.asarray() to copy it to the device",
                            Py_TYPE(obj)->tp_name, type), NULL;
    }
    if (type >= 0 && type != kDLCUDA && type != kDLCUDAManaged) {
        return cl_arg_error(PyExc_TypeError, func, "obj",
                            "%.100s is on DLPack device type %d, not a CUDA device",
                            Py_TYPE(obj)->tp_name, type), NULL;
    }
    if (cl_require_device(st, func) < 0) {
        return NULL;
    }
    return import_dlpack(st, obj, func);
}

int
cl_import_device_object(cl_state *st, PyObject *obj, const char *func, PyObject **out)
{
    *out = NULL;
    if (PyObject_HasAttrString(obj, "__dlpack__")) {
        int device_id = 0;
        int type = dlpack_device_type(obj, &device_id);
        if (type == -1) {
            return -1;
        }
        if (type == kDLCUDA || type == kDLCUDAManaged) {
            if (cl_require_device(st, func) < 0) {
                return -1;
            }
            *out = import_dlpack(st, obj, func);
            return *out == NULL ? -1 : 1;
        }
    }
    /* hasattr() semantics: a property that raises (a CPU torch tensor, our
     * own bfloat16 arrays) means "no interface". */
    PyObject *cai = PyObject_GetAttrString(obj, "__cuda_array_interface__");
    if (cai == NULL) {
        PyErr_Clear();
        return 0;
    }
    *out = import_cai(st, obj, cai, func);
    Py_DECREF(cai);
    return *out == NULL ? -1 : 1;
}

PyMethodDef cl_interop_methods[] = {
    CL_FASTCALL(from_dlpack),
    {NULL, NULL, 0, NULL},
};
