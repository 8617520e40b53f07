/* The op profiler behind cudalab.profiler, and NVTX ranges.
 *
 * Hooks. Every op entry point brackets its work with cl_prof_begin /
 * cl_prof_end (prof/prof.h shows the pattern; python/cudalab/profiler.py lists
 * the ops). st->prof_flags holds two bits:
 *
 *   CL_PROF_RECORD  set while a cudalab.profiler.profile() records;
 *   CL_PROF_NVTX    ops and record_function ranges are NVTX ranges in the
 *                   "cudalab" domain. On at import when NVTX_INJECTION64_PATH
 *                   is set (how Nsight Systems and Nsight Compute attach their
 *                   NVTX handler; without it every NVTX call is a no-op), or
 *                   through _nvtx_set_enabled().
 *
 * Off path: with both bits clear an op copies one int and takes two
 * well-predicted branches, and calls nothing. NVTX without a tool would cost
 * only a few ns per push/pop, but putting it behind the same flag keeps the
 * op's off path a single test of one word instead of two indirect calls; a
 * tool that is attached by other means than the environment variable can be
 * served with _nvtx_set_enabled(True).
 *
 * Recording (CL_PROF_RECORD). begin takes the host time with
 * clock_gettime(CLOCK_MONOTONIC) (the clock of Python's time.monotonic_ns()
 * and time.perf_counter_ns() on Linux) and records a timing event, taken from
 * a per-device pool of reusable events, on the op's stream (the current stream
 * of its device, where every cudalab op enqueues its work); end records a
 * second event (ops that then wait on the host, get and asarray, record it
 * before waiting: cl_prof_gpu_done), takes the host time and appends a plain C
 * record to a growable array. Both run with the GIL held, which protects the array; records carry
 * the native thread id. On a stream that is being captured into a CUDA graph
 * no event is recorded (it would become part of the graph): the record then
 * has host times only. Failures of the profiler's own CUDA calls never fail
 * the op: the record just loses its GPU time.
 *
 * GPU times are resolved when the profile ends: each end event is
 * synchronized (GIL released), the GPU duration is cudaEventElapsedTime(start,
 * end) and the start is put on the host clock through a per-device origin
 * event. The origin is recorded at profile start (for the current device;
 * for other devices at their first op) on a private, idle non-blocking stream
 * and synchronized at once; its GPU time is taken to be the midpoint of the
 * host times just before the record and just after the synchronize, so GPU
 * timestamps carry an offset error of at most half that interval (reported
 * per device as the uncertainty). cudaEventElapsedTime returns float
 * milliseconds with about 0.5 us resolution, so durations are good to about
 * 0.5 us and placement loses about 1 us more per 16 s of profile. */
#include "prof/prof.h"
#include "array/array.h"
#include "runtime/runtime.h"
#include "core/core.h"

#include <time.h>

#include <nvtx3/nvToolsExt.h>

#define EVENT_BATCH 64
#define EVENTS_KEPT (1 << 16) /* pooled events kept per device between profiles */

/* ---- state --------------------------------------------------------------------- */

typedef struct prof_device {
    cudaEvent_t *events; /* timing events, reused from profile to profile */
    int num_events;      /* created */
    int next;            /* first one unused in profile `session` */
    int session;
    cudaEvent_t origin;
    cudaStream_t origin_stream; /* private, non-blocking, idle */
    int origin_session;         /* the profile `origin` was recorded for */
    int64_t origin_host_ns;
    int64_t origin_uncertainty_ns;
} prof_device;

typedef struct prof_record {
    const char *name;
    char *owned_name; /* user ranges: a PyMem copy (name points here) */
    bool is_range;
    bool open;        /* a user range not ended yet */
    bool capturing;
    bool has_gpu;     /* resolved */
    int dtype;
    int device;
    cudaStream_t stream;
    unsigned long thread_id;
    int64_t host_start_ns, host_end_ns;
    int ev_start, ev_end;
    int64_t gpu_start_ns, gpu_duration_ns;
    int64_t bytes, flops;
    int ninputs;
    int in_ndim[CL_PROF_MAX_INPUTS];
    Py_ssize_t in_shape[CL_PROF_MAX_INPUTS][CL_MAX_NDIM];
    int out_ndim;
    Py_ssize_t out_shape[CL_MAX_NDIM];
} prof_record;

typedef struct cl_prof_state {
    int session;    /* incremented by every enable */
    bool recording;
    bool resolving; /* a disable is synchronizing events (GIL released) */
    int64_t start_ns;
    prof_record *records;
    Py_ssize_t num_records, cap_records;
    nvtxDomainHandle_t domain; /* NULL without a tool: then pushes are no-ops too */
    bool domain_created;
    prof_device devices[CL_MAX_DEVICES];
} cl_prof_state;

static int64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static cl_prof_state *
get_state(cl_state *st)
{
    if (st->prof == NULL) {
        st->prof = PyMem_Calloc(1, sizeof(cl_prof_state));
        if (st->prof == NULL) {
            PyErr_NoMemory();
        }
    }
    return st->prof;
}

/* ---- NVTX -------------------------------------------------------------------- */

static void
nvtx_push(cl_state *st, const char *name)
{
    cl_prof_state *P = get_state(st);
    if (P == NULL) {
        PyErr_Clear(); /* never fail an op for its NVTX range */
        return;
    }
    if (!P->domain_created) {
        P->domain = nvtxDomainCreateA("cudalab"); /* loads the tool's handler, if any */
        P->domain_created = true;
    }
    if (P->domain == NULL) {
        return;
    }
    nvtxEventAttributes_t attr;
    memset(&attr, 0, sizeof attr);
    attr.version = NVTX_VERSION;
    attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attr.message.ascii = name;
    nvtxDomainRangePushEx(P->domain, &attr);
}

static void
nvtx_pop(cl_state *st)
{
    if (st->prof != NULL && st->prof->domain != NULL) {
        nvtxDomainRangePop(st->prof->domain);
    }
}

/* ---- devices, events, origins ----------------------------------------------------- */

/* Make `device` current for the profiler's own calls; *previous restores it.
 * Returns -1 (error cleared) on failure. */
static int
enter(int device, int *previous)
{
    if (cudaGetDevice(previous) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    if (*previous != device && cudaSetDevice(device) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
}

static void
leave(int device, int previous)
{
    if (device != previous) {
        (void)cudaSetDevice(previous);
    }
}

/* Record the origin event of `device` for this profile (device current).
 * Never while this thread captures a graph: the synchronize is not allowed
 * then, so the origin waits for the first op outside the capture. */
static int
ensure_origin(cl_prof_state *P, int device)
{
    prof_device *pd = &P->devices[device];
    if (pd->origin_session == P->session) {
        return 0;
    }
    if (cl_graph_thread_capturing()) {
        return -1;
    }
    if (pd->origin == NULL &&
        cudaEventCreateWithFlags(&pd->origin, cudaEventDefault) != cudaSuccess) {
        pd->origin = NULL;
        goto fail;
    }
    if (pd->origin_stream == NULL &&
        cudaStreamCreateWithFlags(&pd->origin_stream, cudaStreamNonBlocking) != cudaSuccess) {
        pd->origin_stream = NULL;
        goto fail;
    }
    /* The last of three rounds counts: the first ones warm the stream and
     * the event up, which narrows the interval. */
    int64_t t0 = 0, t1 = 0;
    for (int round = 0; round < 3; round++) {
        t0 = now_ns();
        if (cudaEventRecord(pd->origin, pd->origin_stream) != cudaSuccess ||
            cudaEventSynchronize(pd->origin) != cudaSuccess) {
            goto fail;
        }
        t1 = now_ns();
    }
    pd->origin_host_ns = t0 + (t1 - t0) / 2;
    pd->origin_uncertainty_ns = (t1 - t0 + 1) / 2;
    pd->origin_session = P->session;
    return 0;
fail:
    (void)cudaGetLastError();
    return -1;
}

/* The next unused pooled event of `device` (current), creating more when the
 * pool runs out; -1 when none can be had. */
static int
take_event(cl_prof_state *P, int device)
{
    prof_device *pd = &P->devices[device];
    if (pd->session != P->session) {
        pd->session = P->session;
        pd->next = 0;
    }
    if (pd->next == pd->num_events) {
        int cap = pd->num_events + (pd->num_events < EVENT_BATCH ? EVENT_BATCH : pd->num_events);
        cudaEvent_t *events = PyMem_Realloc(pd->events, (size_t)cap * sizeof *events);
        if (events == NULL) {
            return -1;
        }
        pd->events = events;
        while (pd->num_events < cap) {
            if (cudaEventCreateWithFlags(&pd->events[pd->num_events], cudaEventDefault) !=
                cudaSuccess) {
                (void)cudaGetLastError();
                break;
            }
            pd->num_events++;
        }
        if (pd->next == pd->num_events) {
            return -1;
        }
    }
    return pd->next++;
}

/* Record a pooled event on `stream` of `device` (current); its index or -1. */
static int
record_event(cl_prof_state *P, int device, cudaStream_t stream)
{
    int i = take_event(P, device);
    if (i >= 0 && cudaEventRecord(P->devices[device].events[i], stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return i;
}

static bool
stream_capturing(cudaStream_t stream)
{
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
        (void)cudaGetLastError();
        return true; /* the legacy stream next to a capture: stay out of it */
    }
    return status != cudaStreamCaptureStatusNone;
}

/* Start timing on the current stream of `device` (CL_PROF_CURRENT_DEVICE: the
 * current one; -1: host only) into `s`. */
static void
start_timing(cl_state *st, cl_prof_state *P, cl_prof_scope *s, int device)
{
    int previous = -1;
    s->device = -1;
    s->stream = NULL;
    s->ev_start = -1;
    s->capturing = false;
    if (device == CL_PROF_CURRENT_DEVICE) {
        if (cudaGetDevice(&device) != cudaSuccess) {
            (void)cudaGetLastError();
            device = -1;
        }
    }
    if (device < 0 || device >= CL_MAX_DEVICES || enter(device, &previous) < 0) {
        s->host_start_ns = now_ns();
        return;
    }
    s->device = device;
    s->stream = cl_current_stream(st);
    s->capturing = stream_capturing(s->stream);
    /* A device's origin, recorded at its first op, is not part of that op. */
    bool timed = !s->capturing && ensure_origin(P, device) == 0;
    s->host_start_ns = now_ns();
    if (timed) {
        s->ev_start = record_event(P, device, s->stream);
    }
    leave(device, previous);
}

/* Record the end event of a scope that has a start event; its index or -1. */
static int
stop_timing(cl_prof_state *P, const cl_prof_scope *s)
{
    int previous, ev = -1;
    if (s->ev_start < 0 || enter(s->device, &previous) < 0) {
        return -1;
    }
    ev = record_event(P, s->device, s->stream);
    leave(s->device, previous);
    return ev;
}

/* A new record at the end of the list (zeroed but for the unknowns); NULL
 * when it cannot grow (the record is dropped, nothing raised). */
static prof_record *
append_record(cl_prof_state *P)
{
    if (P->num_records == P->cap_records) {
        Py_ssize_t cap = P->cap_records ? 2 * P->cap_records : 256;
        prof_record *r = PyMem_Realloc(P->records, (size_t)cap * sizeof *r);
        if (r == NULL) {
            return NULL;
        }
        P->records = r;
        P->cap_records = cap;
    }
    prof_record *r = &P->records[P->num_records++];
    memset(r, 0, sizeof *r);
    r->dtype = -1;
    r->bytes = -1;
    r->flops = -1;
    r->out_ndim = -1;
    r->ev_start = r->ev_end = -1;
    r->thread_id = PyThread_get_thread_native_id();
    return r;
}

static void
fill_from_scope(prof_record *r, const cl_prof_scope *s)
{
    r->name = s->name;
    r->device = s->device;
    r->stream = s->stream;
    r->capturing = s->capturing;
    r->host_start_ns = s->host_start_ns;
    r->ev_start = s->ev_start;
}

/* ---- the hooks ------------------------------------------------------------------------ */

void
cl_prof_begin_slow(cl_state *st, cl_prof_scope *s, const char *name, int device)
{
    s->name = name;
    s->ev_start = -1;
    s->ev_end = -1;
    s->device = -1;
    s->session = 0;
    if (s->flags & CL_PROF_NVTX) {
        nvtx_push(st, name);
    }
    if (s->flags & CL_PROF_RECORD) {
        cl_prof_state *P = st->prof;
        s->session = P->session;
        start_timing(st, P, s, device);
    }
}

void
cl_prof_gpu_done_slow(cl_state *st, cl_prof_scope *s)
{
    cl_prof_state *P = st->prof;
    if ((s->flags & CL_PROF_RECORD) && s->ev_end < 0 && P->recording &&
        P->session == s->session) {
        s->ev_end = stop_timing(P, s);
    }
}

void
cl_prof_end_slow(cl_state *st, cl_prof_scope *s, const cl_prof_info *info)
{
    cl_prof_state *P = st->prof;
    if ((s->flags & CL_PROF_RECORD) && info != NULL && P->recording && P->session == s->session) {
        int ev_end = s->ev_end >= 0 ? s->ev_end : stop_timing(P, s);
        int64_t host_end = now_ns();
        prof_record *r = append_record(P);
        if (r != NULL) {
            fill_from_scope(r, s);
            r->host_end_ns = host_end;
            r->ev_end = ev_end;
            r->dtype = info->dtype;
            r->bytes = info->bytes;
            r->flops = info->flops;
            r->ninputs = info->ninputs < CL_PROF_MAX_INPUTS ? info->ninputs : CL_PROF_MAX_INPUTS;
            for (int k = 0; k < r->ninputs; k++) {
                const DeviceArray *a = info->inputs[k];
                r->in_ndim[k] = a->ndim;
                for (int i = 0; i < a->ndim; i++) {
                    r->in_shape[k][i] = a->shape[i];
                }
            }
            if (info->out_ndim >= 0 && info->out_shape != NULL) {
                r->out_ndim = info->out_ndim;
                for (int i = 0; i < info->out_ndim; i++) {
                    r->out_shape[i] = info->out_shape[i];
                }
            }
        }
    }
    if (s->flags & CL_PROF_NVTX) {
        nvtx_pop(st);
    }
}

/* ---- resolving and handing records to Python ------------------------------------------- */

/* GPU start and duration of every finished record (GIL released: touches
 * only the detached array and CUDA). */
static void
resolve(cl_prof_state *P, prof_record *records, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        prof_record *r = &records[i];
        if (r->ev_start < 0 || r->ev_end < 0 || r->open) {
            continue;
        }
        prof_device *pd = &P->devices[r->device];
        cudaEvent_t start = pd->events[r->ev_start], end = pd->events[r->ev_end];
        float offset_ms, duration_ms;
        if (cudaEventSynchronize(end) != cudaSuccess ||
            cudaEventElapsedTime(&duration_ms, start, end) != cudaSuccess ||
            cudaEventElapsedTime(&offset_ms, pd->origin, start) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        r->has_gpu = true;
        r->gpu_start_ns = pd->origin_host_ns + (int64_t)((double)offset_ms * 1e6 + 0.5);
        r->gpu_duration_ns = (int64_t)((double)duration_ms * 1e6 + 0.5);
    }
}

static PyObject *
int_or_none(bool known, long long value)
{
    return known ? PyLong_FromLongLong(value) : Py_NewRef(Py_None);
}

static int
set_item(PyObject *d, const char *key, PyObject *value)
{
    if (value == NULL) {
        return -1;
    }
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

/* One record as a dict with cudalab.profiler.ProfilerEvent's field names. */
static PyObject *
record_dict(const prof_record *r)
{
    PyObject *d = PyDict_New();
    if (d == NULL) {
        return NULL;
    }
    PyObject *shapes = PyTuple_New(r->ninputs);
    if (shapes == NULL) {
        goto fail;
    }
    for (int k = 0; k < r->ninputs; k++) {
        PyObject *t = cl_shape_tuple(r->in_ndim[k], r->in_shape[k]);
        if (t == NULL) {
            Py_DECREF(shapes);
            goto fail;
        }
        PyTuple_SET_ITEM(shapes, k, t);
    }
    bool gpu = r->has_gpu;
    if (set_item(d, "name", PyUnicode_FromString(r->name)) < 0 ||
        set_item(d, "kind", PyUnicode_FromString(r->is_range ? "range" : "op")) < 0 ||
        set_item(d, "device", int_or_none(r->device >= 0, r->device)) < 0 ||
        set_item(d, "stream", r->device >= 0
                                  ? PyLong_FromSize_t((size_t)(uintptr_t)r->stream)
                                  : Py_NewRef(Py_None)) < 0 ||
        set_item(d, "thread_id", PyLong_FromUnsignedLong(r->thread_id)) < 0 ||
        set_item(d, "host_start_ns", PyLong_FromLongLong(r->host_start_ns)) < 0 ||
        set_item(d, "host_end_ns", PyLong_FromLongLong(r->host_end_ns)) < 0 ||
        set_item(d, "gpu_start_ns", int_or_none(gpu, r->gpu_start_ns)) < 0 ||
        set_item(d, "gpu_duration_ns", int_or_none(gpu, r->gpu_duration_ns)) < 0 ||
        set_item(d, "dtype", r->dtype >= 0 ? PyUnicode_FromString(cl_dtype_name((cl_dtype)r->dtype))
                                           : Py_NewRef(Py_None)) < 0 ||
        set_item(d, "input_shapes", shapes) < 0 ||
        set_item(d, "output_shape", r->out_ndim >= 0 ? cl_shape_tuple(r->out_ndim, r->out_shape)
                                                      : Py_NewRef(Py_None)) < 0 ||
        set_item(d, "bytes", int_or_none(r->bytes >= 0, r->bytes)) < 0 ||
        set_item(d, "flops", int_or_none(r->flops >= 0, r->flops)) < 0 ||
        set_item(d, "in_graph_capture", PyBool_FromLong(r->capturing)) < 0) {
        goto fail;
    }
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static void
free_records(prof_record *records, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyMem_Free(records[i].owned_name);
    }
    PyMem_Free(records);
}

/* Keep at most EVENTS_KEPT pooled events per device once a profile is over. */
static void
trim_pools(cl_prof_state *P)
{
    for (int d = 0; d < CL_MAX_DEVICES; d++) {
        prof_device *pd = &P->devices[d];
        while (pd->num_events > EVENTS_KEPT) {
            (void)cudaEventDestroy(pd->events[--pd->num_events]);
        }
        pd->next = 0;
    }
}

/* ---- Python functions --------------------------------------------------------------- */

PyDoc_STRVAR(_profiler_enable_doc,
"_profiler_enable()\n--\n\n"
"Start recording every op (private: cudalab.profiler.profile() calls it).\n\n"
"Records the GPU origin event of the current device when a device exists.\n"
"Needs no GPU.\n\n"
"Raises\n------\n"
"RuntimeError\n    A profile is already recording (profiles do not nest).");

static PyObject *
_profiler_enable(PyObject *module, PyObject *unused)
{
    cl_state *st = cl_state_from_module(module);
    cl_prof_state *P = get_state(st);
    if (P == NULL) {
        return NULL;
    }
    if (P->recording || P->resolving) {
        PyErr_SetString(PyExc_RuntimeError,
                        "cudalab.profiler.profile() is already active: profiles do not nest "
                        "(use record_function() to mark a range inside one)");
        return NULL;
    }
    P->session++;
    P->num_records = 0;
    P->start_ns = now_ns();
    if (cl_device_count(st) > 0) {
        int device;
        if (cudaGetDevice(&device) == cudaSuccess && device >= 0 && device < CL_MAX_DEVICES) {
            (void)ensure_origin(P, device); /* else at the device's first op */
        }
        else {
            (void)cudaGetLastError();
        }
    }
    P->recording = true;
    st->prof_flags |= CL_PROF_RECORD;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(_profiler_disable_doc,
"_profiler_disable()\n--\n\n"
"Stop recording and return what was recorded (private: for\n"
"cudalab.profiler). Waits (GIL released) for the GPU work of the recorded\n"
"ops to finish, to read their events.\n\n"
"Returns\n-------\ndict\n"
"    ``events``: a list of dicts with ProfilerEvent's field names, in the\n"
"    order ops ended (user ranges: in the order they began);\n"
"    ``start_ns``/``end_ns``: host times of the profile (CLOCK_MONOTONIC);\n"
"    ``origins``: {device: (host_ns, uncertainty_ns)} of each GPU origin.\n\n"
"Raises\n------\n"
"RuntimeError\n    No profile is recording.");

static PyObject *
_profiler_disable(PyObject *module, PyObject *unused)
{
    cl_state *st = cl_state_from_module(module);
    cl_prof_state *P = st->prof;
    if (P == NULL || !P->recording) {
        PyErr_SetString(PyExc_RuntimeError, "no cudalab.profiler.profile() is recording");
        return NULL;
    }
    int64_t end_ns = now_ns();
    P->recording = false;
    st->prof_flags &= ~CL_PROF_RECORD;
    prof_record *records = P->records;
    Py_ssize_t n = P->num_records;
    P->records = NULL;
    P->num_records = P->cap_records = 0;

    /* Synchronizing is not allowed while this thread captures a graph: the
     * records keep host times only then. */
    if (!cl_graph_thread_capturing()) {
        P->resolving = true;
        Py_BEGIN_ALLOW_THREADS
        resolve(P, records, n);
        Py_END_ALLOW_THREADS
        P->resolving = false;
        trim_pools(P);
    }

    PyObject *result = PyDict_New(), *events = PyList_New(0), *origins = PyDict_New();
    if (result == NULL || events == NULL || origins == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (records[i].open) {
            continue; /* a range still open when the profile ended */
        }
        PyObject *d = record_dict(&records[i]);
        if (d == NULL || PyList_Append(events, d) < 0) {
            Py_XDECREF(d);
            goto fail;
        }
        Py_DECREF(d);
    }
    for (int dev = 0; dev < CL_MAX_DEVICES; dev++) {
        prof_device *pd = &P->devices[dev];
        if (pd->origin_session != P->session) {
            continue;
        }
        PyObject *key = PyLong_FromLong(dev);
        PyObject *value = Py_BuildValue("(LL)", (long long)pd->origin_host_ns,
                                        (long long)pd->origin_uncertainty_ns);
        int rc = key != NULL && value != NULL ? PyDict_SetItem(origins, key, value) : -1;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (rc < 0) {
            goto fail;
        }
    }
    if (set_item(result, "events", Py_NewRef(events)) < 0 ||
        set_item(result, "origins", Py_NewRef(origins)) < 0 ||
        set_item(result, "start_ns", PyLong_FromLongLong(P->start_ns)) < 0 ||
        set_item(result, "end_ns", PyLong_FromLongLong(end_ns)) < 0) {
        goto fail;
    }
    Py_DECREF(events);
    Py_DECREF(origins);
    free_records(records, n);
    return result;
fail:
    Py_XDECREF(result);
    Py_XDECREF(events);
    Py_XDECREF(origins);
    free_records(records, n);
    return NULL;
}

PyDoc_STRVAR(_profiler_is_enabled_doc,
"_profiler_is_enabled()\n--\n\nTrue while a profile records.");

static PyObject *
_profiler_is_enabled(PyObject *module, PyObject *unused)
{
    cl_state *st = cl_state_from_module(module);
    return PyBool_FromLong((st->prof_flags & CL_PROF_RECORD) != 0);
}

PyDoc_STRVAR(_profiler_range_begin_doc,
"_profiler_range_begin(name)\n--\n\n"
"Open a user range (private: cudalab.profiler.record_function): an NVTX\n"
"range when NVTX is on, and while a profile records, a record with host\n"
"times and, when a device exists, GPU events on the current stream.\n\n"
"Parameters\n----------\nname : str\n\n"
"Returns\n-------\nobject\n"
"    A token for _profiler_range_end(), or None when nothing was opened.");

static PyObject *
_profiler_range_begin(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames)
{
    static const char *const names[] = {"name", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[1];
    if (cl_parse_args("_profiler_range_begin", args, nargs, kwnames, names, 1, argv) < 0) {
        return NULL;
    }
    if (!PyUnicode_Check(argv[0])) {
        return cl_expected_type_error("_profiler_range_begin", "name", "a str", argv[0]), NULL;
    }
    int flags = st->prof_flags;
    if (flags == 0) {
        Py_RETURN_NONE;
    }
    Py_ssize_t len;
    const char *name = PyUnicode_AsUTF8AndSize(argv[0], &len);
    if (name == NULL) {
        return NULL;
    }
    cl_prof_state *P = st->prof;
    Py_ssize_t index = -1;
    if (flags & CL_PROF_RECORD) {
        char *copy = PyMem_Malloc((size_t)len + 1);
        if (copy == NULL) {
            return PyErr_NoMemory();
        }
        memcpy(copy, name, (size_t)len + 1);
        cl_prof_scope s;
        s.flags = flags;
        s.name = copy;
        s.session = P->session;
        start_timing(st, P, &s, cl_device_count(st) > 0 ? CL_PROF_CURRENT_DEVICE : -1);
        prof_record *r = append_record(P);
        if (r == NULL) {
            PyMem_Free(copy);
            return PyErr_NoMemory();
        }
        fill_from_scope(r, &s);
        r->owned_name = copy;
        r->is_range = true;
        r->open = true;
        index = P->num_records - 1;
    }
    bool nvtx = (flags & CL_PROF_NVTX) != 0;
    if (nvtx) {
        nvtx_push(st, name);
    }
    return Py_BuildValue("(inO)", P->session, index, nvtx ? Py_True : Py_False);
}

PyDoc_STRVAR(_profiler_range_end_doc,
"_profiler_range_end(token)\n--\n\n"
"Close the range _profiler_range_begin() opened (None: nothing to do).");

static PyObject *
_profiler_range_end(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"token", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[1];
    int session, nvtx;
    Py_ssize_t index;
    if (cl_parse_args("_profiler_range_end", args, nargs, kwnames, names, 1, argv) < 0) {
        return NULL;
    }
    if (argv[0] == Py_None) {
        Py_RETURN_NONE;
    }
    if (!PyTuple_Check(argv[0]) || !PyArg_ParseTuple(argv[0], "inp", &session, &index, &nvtx)) {
        PyErr_Clear();
        return cl_arg_error(PyExc_TypeError, "_profiler_range_end", "token",
                            "expected what _profiler_range_begin() returned"),
               NULL;
    }
    cl_prof_state *P = st->prof;
    if (index >= 0 && P != NULL && P->recording && P->session == session &&
        index < P->num_records && P->records[index].open) {
        prof_record *r = &P->records[index];
        cl_prof_scope s;
        s.device = r->device;
        s.stream = r->stream;
        s.ev_start = r->ev_start;
        r->ev_end = stop_timing(P, &s);
        r->host_end_ns = now_ns();
        r->open = false;
    }
    if (nvtx) {
        nvtx_pop(st);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(_nvtx_set_enabled_doc,
"_nvtx_set_enabled(enabled)\n--\n\n"
"Turn NVTX ranges for ops and record_function on or off (on at import when\n"
"NVTX_INJECTION64_PATH is set, as Nsight Systems does). Returns the previous\n"
"setting.");

static PyObject *
_nvtx_set_enabled(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"enabled", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[1];
    if (cl_parse_args("_nvtx_set_enabled", args, nargs, kwnames, names, 1, argv) < 0) {
        return NULL;
    }
    int on = PyObject_IsTrue(argv[0]);
    if (on < 0) {
        return NULL;
    }
    if (on && get_state(st) == NULL) {
        return NULL;
    }
    bool previous = (st->prof_flags & CL_PROF_NVTX) != 0;
    st->prof_flags = on ? (st->prof_flags | CL_PROF_NVTX) : (st->prof_flags & ~CL_PROF_NVTX);
    return PyBool_FromLong(previous);
}

PyDoc_STRVAR(_nvtx_is_enabled_doc,
"_nvtx_is_enabled()\n--\n\nWhether ops and record_function emit NVTX ranges.");

static PyObject *
_nvtx_is_enabled(PyObject *module, PyObject *unused)
{
    cl_state *st = cl_state_from_module(module);
    return PyBool_FromLong((st->prof_flags & CL_PROF_NVTX) != 0);
}

static PyMethodDef cl_profiler_methods[] = {
    {"_profiler_enable", (PyCFunction)_profiler_enable, METH_NOARGS, _profiler_enable_doc},
    {"_profiler_disable", (PyCFunction)_profiler_disable, METH_NOARGS, _profiler_disable_doc},
    {"_profiler_is_enabled", (PyCFunction)_profiler_is_enabled, METH_NOARGS,
     _profiler_is_enabled_doc},
    CL_FASTCALL(_profiler_range_begin),
    CL_FASTCALL(_profiler_range_end),
    CL_FASTCALL(_nvtx_set_enabled),
    {"_nvtx_is_enabled", (PyCFunction)_nvtx_is_enabled, METH_NOARGS, _nvtx_is_enabled_doc},
    {NULL, NULL, 0, NULL},
};

int
cl_profiler_init(PyObject *module, cl_state *st)
{
    st->prof_flags = 0;
    st->prof = NULL;
    const char *tool = getenv("NVTX_INJECTION64_PATH");
    if (tool != NULL && tool[0] != '\0') {
        if (get_state(st) == NULL) {
            return -1;
        }
        st->prof_flags |= CL_PROF_NVTX;
    }
    return PyModule_AddFunctions(module, cl_profiler_methods);
}

void
cl_profiler_free(cl_state *st)
{
    /* Pooled events and origin streams are left to the driver, as the memory
     * pools are (module.c): the runtime may already be unloading. */
    if (st->prof != NULL) {
        for (int d = 0; d < CL_MAX_DEVICES; d++) {
            PyMem_Free(st->prof->devices[d].events);
        }
        free_records(st->prof->records, st->prof->num_records);
        PyMem_Free(st->prof);
        st->prof = NULL;
    }
    st->prof_flags = 0;
}
