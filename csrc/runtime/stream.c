/* Streams and events: the Stream and Event types and the calling thread's
 * current stream. (Stream-safe frees: the streams an array was used on,
 * record_stream, are array/array.c's.)
 *
 * Current stream: each thread has, per device, an optional current Stream
 * object, held in C11 thread-local storage with a strong reference (so its
 * handle stays valid while it is current). `with stream:` pushes the previous
 * one on a per-thread stack and restores it on exit. When no thread-local
 * stream is set at all (the common case) cl_current_stream() is a single
 * thread-local read returning CUDA's legacy default stream (0), the stream
 * PyTorch uses by default.
 *
 * Streams are created non-blocking (cudaStreamNonBlocking, as PyTorch's side
 * streams), so they do not implicitly order against the legacy stream: use
 * wait_stream()/wait_event().
 *
 * Lifetime: an array frees its memory on the stream it was allocated on,
 * which may be a Stream that died long before the array. So a dead Stream's
 * handle is not destroyed but kept per device and priority for the next
 * Stream() (as PyTorch's stream pool never destroys its streams); handles
 * therefore stay valid for the life of the process. */
#include "runtime/runtime.h"
#include "core/core.h"

/* ---- thread-local current stream ----------------------------------------- */

#define CL_STREAM_NESTING 64

typedef struct {
    PyObject *stream;   /* the entered Stream (strong) */
    PyObject *previous; /* what was current before (strong, may be NULL) */
    int device;
} stream_frame;

static _Thread_local int tl_num_set;                      /* devices with a current stream */
static _Thread_local cudaStream_t tl_handle[CL_MAX_DEVICES];
static _Thread_local PyObject *tl_stream[CL_MAX_DEVICES]; /* strong references */
static _Thread_local stream_frame tl_frames[CL_STREAM_NESTING];
static _Thread_local int tl_depth;

typedef struct {
    PyObject_HEAD
    cudaStream_t handle;
    int device;
    int priority;
    bool owned; /* false for wrappers of the legacy default stream */
} StreamObject;

typedef struct {
    PyObject_HEAD
    cudaEvent_t handle;
    int device;
    bool timing;
    bool blocking;
    bool recorded;
} EventObject;

cudaStream_t
cl_current_stream(cl_state *st)
{
    (void)st;
    if (tl_num_set == 0) {
        return (cudaStream_t)0;
    }
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= CL_MAX_DEVICES) {
        (void)cudaGetLastError();
        return (cudaStream_t)0;
    }
    return tl_handle[device];
}

cudaStream_t
cl_current_stream_of(int device)
{
    if (tl_num_set == 0 || device < 0 || device >= CL_MAX_DEVICES) {
        return (cudaStream_t)0;
    }
    return tl_handle[device];
}

/* Make `stream` (a StreamObject or NULL) current for `device`; steals nothing. */
static void
set_current(int device, PyObject *stream)
{
    PyObject *old = tl_stream[device];
    Py_XINCREF(stream);
    tl_stream[device] = stream;
    tl_handle[device] = stream != NULL ? ((StreamObject *)stream)->handle : (cudaStream_t)0;
    tl_num_set += (stream != NULL) - (old != NULL);
    Py_XDECREF(old);
}

/* ---- helpers --------------------------------------------------------------- */

static cl_state *
state_of(PyObject *self)
{
    return cl_state_from_type(Py_TYPE(self));
}

static PyObject *
stream_wrap(cl_state *st, cudaStream_t handle, int device, int priority, bool owned)
{
    StreamObject *s = PyObject_New(StreamObject, st->Stream_Type);
    if (s == NULL) {
        return NULL;
    }
    s->handle = handle;
    s->device = device;
    s->priority = priority;
    s->owned = owned;
    return (PyObject *)s;
}

static int
check_type(PyObject *obj, PyTypeObject *type, const char *func, const char *param,
           const char *what)
{
    return Py_TYPE(obj) == type ? 0 : cl_expected_type_error(func, param, what, obj);
}

static int
create_event(cl_state *st, int device, bool timing, bool blocking, EventObject **out)
{
    unsigned flags = (timing ? cudaEventDefault : cudaEventDisableTiming) |
                     (blocking ? cudaEventBlockingSync : 0);
    int previous;
    cudaEvent_t ev = NULL;
    *out = NULL;
    if (cl_device_enter(st, device, &previous) < 0) {
        return -1;
    }
    /* Without the GIL: the driver may hold this call while another thread's pageable
       copy waits for its stream, and Python must run meanwhile. */
    cudaError_t err;
    CL_WITHOUT_GIL(err = cudaEventCreateWithFlags(&ev, flags));
    cl_device_exit(device, previous);
    CL_CUDA_CHECK(st, err);
    EventObject *e = PyObject_New(EventObject, st->Event_Type);
    if (e == NULL) {
        (void)cudaEventDestroy(ev);
        return -1;
    }
    e->handle = ev;
    e->device = device;
    e->timing = timing;
    e->blocking = blocking;
    e->recorded = false;
    *out = e;
    return 0;
fail:
    return -1;
}

int
cl_stream_wait_stream(cl_state *st, cudaStream_t stream, cudaStream_t other, int other_device)
{
    cudaEvent_t ev = NULL;
    int previous;
    if (stream == other && stream != (cudaStream_t)0) {
        return 0; /* (the legacy stream's handle 0 names one stream per device) */
    }
    if (cl_device_enter(st, other_device, &previous) < 0) {
        return -1;
    }
    cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (err == cudaSuccess) {
        err = cudaEventRecord(ev, other);
    }
    if (err == cudaSuccess) {
        err = cudaStreamWaitEvent(stream, ev, 0);
    }
    if (ev != NULL) {
        (void)cudaEventDestroy(ev);
    }
    cl_device_exit(other_device, previous);
    CL_CUDA_CHECK(st, err);
    return 0;
fail:
    return -1;
}

/* ---- Stream ---------------------------------------------------------------- */

static PyObject *
Stream_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"priority", "device", NULL};
    cl_state *st = cl_state_from_type(type);
    PyObject *prio_obj = NULL, *dev_obj = NULL;
    int device, previous, least = 0, greatest = 0;
    long priority = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:Stream", names, &prio_obj, &dev_obj)) {
        return NULL;
    }
    if (prio_obj != NULL) {
        if (PyBool_Check(prio_obj) || !PyLong_Check(prio_obj)) {
            return cl_expected_type_error("Stream", "priority", "an int", prio_obj), NULL;
        }
        int overflow = 0;
        priority = PyLong_AsLongAndOverflow(prio_obj, &overflow);
        if (priority == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (overflow || priority < -1000 || priority > 1000) {
            return cl_arg_error(PyExc_ValueError, "Stream", "priority", "out of range: %R",
                                prio_obj),
                   NULL;
        }
    }
    if (cl_parse_device(st, dev_obj, "Stream", &device) < 0) {
        return NULL;
    }
    if (cl_device_enter(st, device, &previous) < 0) {
        return NULL;
    }
    cudaError_t err = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (err != cudaSuccess) {
        cl_device_exit(device, previous);
        CL_CUDA_CHECK(st, err);
    }
    if (priority < greatest || priority > least) {
        cl_device_exit(device, previous);
        return cl_arg_error(PyExc_ValueError, "Stream", "priority",
                            "must be in [%d, %d] on device %d (lower numbers run first), got %ld",
                            greatest, least, device, priority),
               NULL;
    }
    cl_device_state *ds = &st->devices[device];
    cudaStream_t handle = NULL;
    for (int i = ds->num_spare_streams - 1; i >= 0; i--) {
        if (ds->spare_priorities[i] == (int)priority) {
            handle = ds->spare_streams[i];
            ds->num_spare_streams--;
            ds->spare_streams[i] = ds->spare_streams[ds->num_spare_streams];
            ds->spare_priorities[i] = ds->spare_priorities[ds->num_spare_streams];
            break;
        }
    }
    if (handle == NULL) {
        err = cudaStreamCreateWithPriority(&handle, cudaStreamNonBlocking, (int)priority);
    }
    cl_device_exit(device, previous);
    CL_CUDA_CHECK(st, err);
    PyObject *s = stream_wrap(st, handle, device, (int)priority, true);
    if (s == NULL) {
        (void)cudaStreamDestroy(handle);
    }
    return s;
fail:
    return NULL;
}

static void
Stream_dealloc(StreamObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (self->owned && self->handle != NULL) {
        cl_state *st = cl_state_from_type(type);
        cl_device_state *ds = st != NULL ? &st->devices[self->device] : NULL;
        if (ds != NULL && ds->num_spare_streams == ds->cap_spare_streams) {
            int cap = ds->cap_spare_streams ? 2 * ds->cap_spare_streams : 8;
            cudaStream_t *s2 = PyMem_RawRealloc(ds->spare_streams, cap * sizeof *s2);
            if (s2 != NULL) {
                ds->spare_streams = s2;
                int *p2 = PyMem_RawRealloc(ds->spare_priorities, cap * sizeof *p2);
                if (p2 != NULL) {
                    ds->spare_priorities = p2;
                    ds->cap_spare_streams = cap;
                }
            }
        }
        if (ds != NULL && ds->num_spare_streams < ds->cap_spare_streams) {
            ds->spare_streams[ds->num_spare_streams] = self->handle;
            ds->spare_priorities[ds->num_spare_streams] = self->priority;
            ds->num_spare_streams++;
        }
        /* else: leaked on purpose, arrays may still free memory on it. */
    }
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *
Stream_repr(StreamObject *self)
{
    return PyUnicode_FromFormat("<cudalab.Stream device=%d priority=%d cuda_stream=0x%zx>",
                                self->device, self->priority, (size_t)(uintptr_t)self->handle);
}

static PyObject *
Stream_richcompare(PyObject *a, PyObject *b, int op)
{
    if (Py_TYPE(a) != Py_TYPE(b) || (op != Py_EQ && op != Py_NE)) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    StreamObject *x = (StreamObject *)a, *y = (StreamObject *)b;
    bool eq = x->handle == y->handle && x->device == y->device;
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static Py_hash_t
Stream_hash(StreamObject *self)
{
    Py_hash_t h = (Py_hash_t)((uintptr_t)self->handle >> 4) ^ ((Py_hash_t)self->device << 20);
    return h == -1 ? -2 : h;
}

static PyObject *
Stream_get_device(StreamObject *self, void *c)
{
    return PyLong_FromLong(self->device);
}

static PyObject *
Stream_get_priority(StreamObject *self, void *c)
{
    return PyLong_FromLong(self->priority);
}

static PyObject *
Stream_get_cuda_stream(StreamObject *self, void *c)
{
    return PyLong_FromSize_t((size_t)(uintptr_t)self->handle);
}

PyDoc_STRVAR(Stream_synchronize_doc,
"synchronize()\n--\n\nWait (with the GIL released) until all work on this stream is done.");

static PyObject *
Stream_synchronize(StreamObject *self, PyObject *unused)
{
    cl_state *st = state_of((PyObject *)self);
    int previous;
    cudaError_t err;
    if (cl_refuse_while_capturing(st, "Stream.synchronize", "synchronizing a stream") < 0 ||
        cl_device_enter(st, self->device, &previous) < 0) {
        return NULL;
    }
    CL_WITHOUT_GIL(err = cudaStreamSynchronize(self->handle));
    cl_device_exit(self->device, previous);
    CL_CUDA_CHECK(st, err);
    Py_RETURN_NONE;
fail:
    return NULL;
}

/* cudaSuccess -> True, cudaErrorNotReady -> False, else raise. */
static PyObject *
query_result(cl_state *st, cudaError_t err)
{
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        Py_RETURN_FALSE;
    }
    CL_CUDA_CHECK(st, err);
    Py_RETURN_TRUE;
fail:
    return NULL;
}

PyDoc_STRVAR(Stream_query_doc,
"query()\n--\n\nTrue when all work enqueued on this stream has finished.");

static PyObject *
Stream_query(StreamObject *self, PyObject *unused)
{
    cl_state *st = state_of((PyObject *)self);
    int previous;
    if (cl_refuse_while_capturing(st, "Stream.query", "querying a stream") < 0 ||
        cl_device_enter(st, self->device, &previous) < 0) {
        return NULL;
    }
    cudaError_t err = cudaStreamQuery(self->handle);
    cl_device_exit(self->device, previous);
    return query_result(st, err);
}

static int
require_recorded(EventObject *e, const char *func, const char *param)
{
    if (!e->recorded) {
        return cl_arg_error(PyExc_ValueError, func, param,
                            "the event was never recorded (call event.record() first)");
    }
    return 0;
}

PyDoc_STRVAR(Stream_wait_event_doc,
"wait_event(event)\n--\n\n"
"Make all future work on this stream wait for `event` (recorded before).\n\n"
"Parameters\n----------\nevent : Event\n    A recorded event; the host does not block.");

static PyObject *
Stream_wait_event(StreamObject *self, PyObject *event)
{
    cl_state *st = state_of((PyObject *)self);
    int previous;
    if (check_type(event, st->Event_Type, "wait_event", "event", "an Event") < 0 ||
        require_recorded((EventObject *)event, "wait_event", "event") < 0 ||
        cl_device_enter(st, self->device, &previous) < 0) {
        return NULL;
    }
    cudaError_t err = cudaStreamWaitEvent(self->handle, ((EventObject *)event)->handle, 0);
    cl_device_exit(self->device, previous);
    CL_CUDA_CHECK(st, err);
    Py_RETURN_NONE;
fail:
    return NULL;
}

PyDoc_STRVAR(Stream_wait_stream_doc,
"wait_stream(stream)\n--\n\n"
"Make all future work on this stream wait for the work enqueued so far on\n"
"`stream`, which may belong to another device. The host does not block.\n\n"
"Parameters\n----------\nstream : Stream");

static PyObject *
Stream_wait_stream(StreamObject *self, PyObject *other)
{
    cl_state *st = state_of((PyObject *)self);
    if (check_type(other, st->Stream_Type, "wait_stream", "stream", "a Stream") < 0 ||
        cl_stream_wait_stream(st, self->handle, ((StreamObject *)other)->handle,
                           ((StreamObject *)other)->device) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static int
event_record(cl_state *st, EventObject *e, cudaStream_t stream, int device)
{
    int previous;
    if (cl_device_enter(st, device, &previous) < 0) {
        return -1;
    }
    cudaError_t err;
    CL_WITHOUT_GIL(err = cudaEventRecord(e->handle, stream));  /* may wait: see create_event */
    cl_device_exit(device, previous);
    CL_CUDA_CHECK(st, err);
    e->recorded = true;
    return 0;
fail:
    return -1;
}

PyDoc_STRVAR(Stream_record_event_doc,
"record_event(event=None)\n--\n\n"
"Record `event` (a new Event(enable_timing=False) when None) on this stream.\n\n"
"Returns\n-------\nEvent\n    The recorded event.");

static PyObject *
Stream_record_event(StreamObject *self, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames)
{
    static const char *const names[] = {"event", NULL};
    cl_state *st = state_of((PyObject *)self);
    PyObject *argv[1];
    EventObject *e;
    if (cl_parse_args("record_event", args, nargs, kwnames, names, 0, argv) < 0) {
        return NULL;
    }
    if (argv[0] != NULL && argv[0] != Py_None) {
        if (check_type(argv[0], st->Event_Type, "record_event", "event", "an Event") < 0) {
            return NULL;
        }
        e = (EventObject *)Py_NewRef(argv[0]);
        if (e->device != self->device) {
            Py_DECREF(e);
            return cl_arg_error(PyExc_ValueError, "record_event", "event",
                                "the event is on device %d, the stream on device %d",
                                ((EventObject *)argv[0])->device, self->device),
                   NULL;
        }
    }
    else if (create_event(st, self->device, false, false, &e) < 0) {
        return NULL;
    }
    if (event_record(st, e, self->handle, self->device) < 0) {
        Py_DECREF(e);
        return NULL;
    }
    return (PyObject *)e;
}

static PyObject *
Stream_enter(StreamObject *self, PyObject *unused)
{
    if (tl_depth >= CL_STREAM_NESTING) {
        PyErr_Format(PyExc_RuntimeError, "`with Stream` nested more than %d deep",
                     CL_STREAM_NESTING);
        return NULL;
    }
    stream_frame *f = &tl_frames[tl_depth++];
    f->stream = Py_NewRef(self);
    f->previous = Py_XNewRef(tl_stream[self->device]);
    f->device = self->device;
    set_current(self->device, (PyObject *)self);
    return Py_NewRef(self);
}

static PyObject *
Stream_exit(StreamObject *self, PyObject *args)
{
    if (tl_depth == 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Stream.__exit__() without a matching __enter__() in this thread");
        return NULL;
    }
    stream_frame *f = &tl_frames[--tl_depth];
    set_current(f->device, f->previous);
    Py_XDECREF(f->previous);
    Py_DECREF(f->stream);
    f->stream = f->previous = NULL;
    Py_RETURN_FALSE;
}

static PyMethodDef Stream_methods[] = {
    {"synchronize", (PyCFunction)Stream_synchronize, METH_NOARGS, Stream_synchronize_doc},
    {"query", (PyCFunction)Stream_query, METH_NOARGS, Stream_query_doc},
    {"wait_event", (PyCFunction)Stream_wait_event, METH_O, Stream_wait_event_doc},
    {"wait_stream", (PyCFunction)Stream_wait_stream, METH_O, Stream_wait_stream_doc},
    {"record_event", (PyCFunction)(void (*)(void))Stream_record_event,
     METH_FASTCALL | METH_KEYWORDS, Stream_record_event_doc},
    {"__enter__", (PyCFunction)Stream_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Stream_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Stream_getset[] = {
    {"device", (getter)Stream_get_device, NULL, "The stream's device index.", NULL},
    {"priority", (getter)Stream_get_priority, NULL, "Lower numbers run first.", NULL},
    {"cuda_stream", (getter)Stream_get_cuda_stream, NULL,
     "The cudaStream_t handle as an int (0: the legacy default stream).", NULL},
    {NULL},
};

PyDoc_STRVAR(Stream_doc,
"Stream(priority=0, device=None)\n--\n\n"
"A CUDA stream (non-blocking with respect to the legacy default stream).\n\n"
"``with stream:`` makes it the calling thread's current stream for its device;\n"
"every op, allocation and copy issued inside is enqueued on it.\n\n"
"Parameters\n----------\n"
"priority : int, optional\n"
"    In the device's range (see cudaDeviceGetStreamPriorityRange; lower numbers\n"
"    are higher priorities). 0 is the default priority.\n"
"device : int, optional\n    Defaults to the current device.");

static PyType_Slot Stream_slots[] = {
    {Py_tp_doc, (void *)Stream_doc},
    {Py_tp_new, Stream_new},
    {Py_tp_dealloc, Stream_dealloc},
    {Py_tp_repr, Stream_repr},
    {Py_tp_richcompare, Stream_richcompare},
    {Py_tp_hash, Stream_hash},
    {Py_tp_methods, Stream_methods},
    {Py_tp_getset, Stream_getset},
    {0, NULL},
};

static PyType_Spec Stream_spec = {
    .name = "cudalab.Stream",
    .basicsize = sizeof(StreamObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Stream_slots,
};

/* ---- Event ----------------------------------------------------------------- */

static PyObject *
Event_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"enable_timing", "blocking", NULL};
    cl_state *st = cl_state_from_type(type);
    PyObject *timing_obj = Py_True, *blocking_obj = Py_False;
    int device;
    EventObject *e;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:Event", names, &timing_obj,
                                     &blocking_obj)) {
        return NULL;
    }
    int timing = PyObject_IsTrue(timing_obj);
    int blocking = timing < 0 ? -1 : PyObject_IsTrue(blocking_obj);
    if (timing < 0 || blocking < 0) {
        return NULL;
    }
    if (cl_require_device(st, "Event") < 0 || cl_current_device(st, &device) < 0 ||
        create_event(st, device, timing, blocking, &e) < 0) {
        return NULL;
    }
    return (PyObject *)e;
}

static void
Event_dealloc(EventObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    if (self->handle != NULL && cudaEventDestroy(self->handle) != cudaSuccess) {
        (void)cudaGetLastError();
    }
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *
Event_repr(EventObject *self)
{
    return PyUnicode_FromFormat("<cudalab.Event device=%d enable_timing=%s blocking=%s%s>",
                                self->device, self->timing ? "True" : "False",
                                self->blocking ? "True" : "False",
                                self->recorded ? "" : " (never recorded)");
}

PyDoc_STRVAR(Event_record_doc,
"record(stream=None)\n--\n\n"
"Record the event on `stream` (the current stream when None).");

static PyObject *
Event_record(EventObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"stream", NULL};
    cl_state *st = state_of((PyObject *)self);
    PyObject *argv[1];
    cudaStream_t stream;
    if (cl_parse_args("record", args, nargs, kwnames, names, 0, argv) < 0) {
        return NULL;
    }
    if (argv[0] != NULL && argv[0] != Py_None) {
        if (check_type(argv[0], st->Stream_Type, "record", "stream", "a Stream") < 0) {
            return NULL;
        }
        StreamObject *s = (StreamObject *)argv[0];
        if (s->device != self->device) {
            return cl_arg_error(PyExc_ValueError, "record", "stream",
                                "the stream is on device %d, the event on device %d",
                                s->device, self->device),
                   NULL;
        }
        stream = s->handle;
    }
    else {
        int previous;
        if (cl_device_enter(st, self->device, &previous) < 0) {
            return NULL;
        }
        stream = cl_current_stream(st);
        cl_device_exit(self->device, previous);
    }
    if (event_record(st, self, stream, self->device) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Event_synchronize_doc,
"synchronize()\n--\n\nWait (GIL released) until the recorded work is done.");

static PyObject *
Event_synchronize(EventObject *self, PyObject *unused)
{
    cl_state *st = state_of((PyObject *)self);
    cudaError_t err;
    if (cl_refuse_while_capturing(st, "Event.synchronize", "waiting for an event") < 0) {
        return NULL;
    }
    CL_WITHOUT_GIL(err = cudaEventSynchronize(self->handle));
    CL_CUDA_CHECK(st, err);
    Py_RETURN_NONE;
fail:
    return NULL;
}

PyDoc_STRVAR(Event_query_doc,
"query()\n--\n\nTrue when the recorded work is done (or the event was never recorded).");

static PyObject *
Event_query(EventObject *self, PyObject *unused)
{
    cl_state *st = state_of((PyObject *)self);
    if (cl_refuse_while_capturing(st, "Event.query", "querying an event") < 0) {
        return NULL;
    }
    return query_result(st, cudaEventQuery(self->handle));
}

PyDoc_STRVAR(Event_elapsed_time_doc,
"elapsed_time(end)\n--\n\n"
"Milliseconds between this event and `end` (waits for both to complete).\n\n"
"Both must have been created with enable_timing=True and recorded.\n\n"
"Returns\n-------\nfloat");

static PyObject *
Event_elapsed_time(EventObject *self, PyObject *end_obj)
{
    cl_state *st = state_of((PyObject *)self);
    if (check_type(end_obj, st->Event_Type, "elapsed_time", "end", "an Event") < 0) {
        return NULL;
    }
    EventObject *end = (EventObject *)end_obj;
    if (!self->timing) {
        PyErr_SetString(PyExc_ValueError,
                        "elapsed_time(): this (start) event was created with "
                        "enable_timing=False; create it with Event(enable_timing=True)");
        return NULL;
    }
    if (!end->timing) {
        return cl_arg_error(PyExc_ValueError, "elapsed_time", "end",
                            "the event was created with enable_timing=False; create it with "
                            "Event(enable_timing=True)"),
               NULL;
    }
    if (!self->recorded) {
        PyErr_SetString(PyExc_ValueError,
                        "elapsed_time(): this (start) event was never recorded "
                        "(call event.record() first)");
        return NULL;
    }
    if (require_recorded(end, "elapsed_time", "end") < 0 ||
        cl_refuse_while_capturing(st, "elapsed_time", "waiting for events") < 0) {
        return NULL;
    }
    float ms = 0.0f;
    cudaError_t err;
    Py_BEGIN_ALLOW_THREADS
    err = cudaEventSynchronize(self->handle);
    if (err == cudaSuccess) {
        err = cudaEventSynchronize(end->handle);
    }
    Py_END_ALLOW_THREADS
    CL_CUDA_CHECK(st, err);
    CL_CUDA_CHECK(st, cudaEventElapsedTime(&ms, self->handle, end->handle));
    return PyFloat_FromDouble((double)ms);
fail:
    return NULL;
}

static PyObject *
Event_get_device(EventObject *self, void *c)
{
    return PyLong_FromLong(self->device);
}

static PyObject *
Event_get_cuda_event(EventObject *self, void *c)
{
    return PyLong_FromSize_t((size_t)(uintptr_t)self->handle);
}

static PyMethodDef Event_methods[] = {
    {"record", (PyCFunction)(void (*)(void))Event_record, METH_FASTCALL | METH_KEYWORDS,
     Event_record_doc},
    {"synchronize", (PyCFunction)Event_synchronize, METH_NOARGS, Event_synchronize_doc},
    {"query", (PyCFunction)Event_query, METH_NOARGS, Event_query_doc},
    {"elapsed_time", (PyCFunction)Event_elapsed_time, METH_O, Event_elapsed_time_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Event_getset[] = {
    {"device", (getter)Event_get_device, NULL, "The event's device index.", NULL},
    {"cuda_event", (getter)Event_get_cuda_event, NULL, "The cudaEvent_t handle as an int.",
     NULL},
    {NULL},
};

PyDoc_STRVAR(Event_doc,
"Event(enable_timing=True, blocking=False)\n--\n\n"
"A CUDA event on the current device.\n\n"
"Parameters\n----------\n"
"enable_timing : bool\n    Needed for elapsed_time(); costs a little on record.\n"
"blocking : bool\n    synchronize() sleeps instead of spinning (cudaEventBlockingSync).");

static PyType_Slot Event_slots[] = {
    {Py_tp_doc, (void *)Event_doc},
    {Py_tp_new, Event_new},
    {Py_tp_dealloc, Event_dealloc},
    {Py_tp_repr, Event_repr},
    {Py_tp_methods, Event_methods},
    {Py_tp_getset, Event_getset},
    {0, NULL},
};

static PyType_Spec Event_spec = {
    .name = "cudalab.Event",
    .basicsize = sizeof(EventObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Event_slots,
};

/* ---- module functions ------------------------------------------------------ */

PyDoc_STRVAR(current_stream_doc,
"current_stream(device=None)\n--\n\n"
"The calling thread's current Stream on `device` (the legacy default stream,\n"
"cuda_stream == 0, unless a ``with stream:`` block is active).");

static PyObject *
current_stream(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    int device;
    if (cl_parse_device_arg(st, "current_stream", args, nargs, kwnames, false, &device) < 0) {
        return NULL;
    }
    if (tl_stream[device] != NULL) {
        return Py_NewRef(tl_stream[device]);
    }
    return stream_wrap(st, (cudaStream_t)0, device, 0, false);
}

PyDoc_STRVAR(default_stream_doc,
"default_stream(device=None)\n--\n\n"
"A Stream wrapping CUDA's legacy default stream on `device` (cuda_stream == 0).");

static PyObject *
default_stream(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    int device;
    if (cl_parse_device_arg(st, "default_stream", args, nargs, kwnames, false, &device) < 0) {
        return NULL;
    }
    return stream_wrap(st, (cudaStream_t)0, device, 0, false);
}

static PyMethodDef stream_methods[] = {
    CL_FASTCALL(current_stream),
    CL_FASTCALL(default_stream),
    {NULL, NULL, 0, NULL},
};

int
cl_stream_init(PyObject *module, cl_state *st)
{
    st->Stream_Type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Stream_spec, NULL);
    if (st->Stream_Type == NULL ||
        PyModule_AddObjectRef(module, "Stream", (PyObject *)st->Stream_Type) < 0) {
        return -1;
    }
    st->Event_Type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Event_spec, NULL);
    if (st->Event_Type == NULL ||
        PyModule_AddObjectRef(module, "Event", (PyObject *)st->Event_Type) < 0) {
        return -1;
    }
    return PyModule_AddFunctions(module, stream_methods);
}

/* For graph.c and DeviceArray.record_stream: the handle and device of a
 * Stream, or -1 with TypeError. */
int
cl_stream_handle(cl_state *st, PyObject *obj, const char *func, const char *param,
                 cudaStream_t *handle, int *device)
{
    if (check_type(obj, st->Stream_Type, func, param, "a Stream") < 0) {
        return -1;
    }
    *handle = ((StreamObject *)obj)->handle;
    *device = ((StreamObject *)obj)->device;
    return 0;
}
