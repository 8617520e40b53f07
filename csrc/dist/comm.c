/* _NcclComm: one NCCL communicator, its collectives, and its watchdog.
 *
 * Collectives go through the op frame like every op: the arrays are checked
 * before any CUDA call, the work is enqueued on the current stream of the
 * communicator's device, the arrays are noted as used on that stream (their
 * frees wait for it), and the profiler and NVTX see the public name
 * ("all_reduce", ...). NCCL calls run with the GIL released: enqueueing
 * usually takes microseconds, but the first call to a peer sets up its
 * connection and can wait for that peer.
 *
 * The watchdog. A collective whose peer died, hung or never called it spins
 * on the GPU forever, and so does whatever waits for it. After each call an
 * event from a ring of WATCH_SLOTS is recorded behind it; a thread per
 * communicator polls the oldest pending event and NCCL's asynchronous error.
 * When an operation is older than `timeout`, or NCCL reports an error, the
 * thread prints one line, aborts the communicator (ncclCommAbort ends the
 * spinning kernels, so a blocked synchronize returns) and raises
 * DistributedError in the main thread at its next Python instruction, the
 * way KeyboardInterrupt is raised. Every later call raises it again. NCCL's
 * abort may itself wait for the node's other ranks, so a process still
 * alive EXIT_GRACE_S later exits (reaper_main): nothing hangs.
 *
 * Locks. `call_lock` is held, with the GIL released, around each NCCL call on
 * the communicator, and by the watchdog before it aborts, so an abort never
 * frees the communicator under a call that is still using it; a call stuck
 * inside NCCL (waiting for a dead peer) is what ncclCommAbort is for, so the
 * watchdog waits for the lock only a bounded time. `lock` guards the ring. */
#include "dist/dist.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "runtime/runtime.h"
#include "core/core.h"
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WATCH_SLOTS 256       /* collectives watched at once (the host waits beyond) */
#define WATCH_POLL_MS 100     /* how often the watchdog looks */
#define ABORT_LOCK_WAIT_S 2   /* how long it waits for a call in flight before aborting */
#define EXIT_GRACE_S 10       /* a process still alive this long after the watchdog fired exits */
#define EXIT_STATUS 1
#define GROUP_MEMBERS 64

typedef struct {
    cudaEvent_t event;
    double enqueued;          /* CLOCK_MONOTONIC seconds */
    const char *what;         /* a static string: the op's public name */
    unsigned long long seq;   /* the communicator's operation number, from 1 */
} watch_entry;

typedef struct {
    PyObject_HEAD
    cl_nccl_comm_t comm;
    const cl_nccl_api *api;
    int rank, world_size, device;
    double timeout;           /* seconds; 0: no watchdog */
    bool closed;              /* destroy() or abort() ran in this thread */
    atomic_bool aborted;      /* the communicator is gone (abort, watchdog) */
    atomic_bool fired;        /* the watchdog fired ... */
    atomic_bool abort_done;   /* ... and its ncclCommAbort returned */
    bool leaked;              /* a fired watchdog still runs: never free this object */
    char error[640];          /* why, written before `aborted` is set */
    pthread_mutex_t call_lock;
    /* Watchdog (watching: the thread runs or ran and must be joined). */
    bool watching;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stop;
    watch_entry ring[WATCH_SLOTS];
    int head, count;
    unsigned long long seq;
} NcclComm;

/* DistributedError for the watchdog's pending call, which runs without a
 * module at hand; set once by cl_dist_init (single interpreter). */
static PyObject *pending_error_type;

static double
monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- aborting --------------------------------------------------------------- */

/* Runs in the main thread (Py_AddPendingCall): raise the watchdog's error. */
static int
raise_pending(void *arg)
{
    char *message = arg;
    PyErr_SetString(pending_error_type != NULL ? pending_error_type : PyExc_RuntimeError,
                    message);
    free(message);
    return -1;
}

/* Mark the communicator gone (calls refuse from now on, with `why`). */
static void
mark_aborted(NcclComm *self, const char *why)
{
    snprintf(self->error, sizeof self->error, "%s", why);
    atomic_store(&self->aborted, true);
}

/* ncclCommAbort after a call in flight returns (bounded wait: a call stuck
 * inside NCCL is what the abort is for). Never touches Python. */
static void
abort_nccl(NcclComm *self)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += ABORT_LOCK_WAIT_S;
    bool locked = pthread_mutex_timedlock(&self->call_lock, &deadline) == 0;
    (void)self->api->CommAbort(self->comm);
    if (locked) {
        pthread_mutex_unlock(&self->call_lock);
    }
}

/* The last resort: ncclCommAbort may wait for the other ranks of the node to
 * abort too (NCCL frees memory they may still use), and a kernel waiting
 * for a dead peer may keep the main thread in a synchronize. A process
 * still alive EXIT_GRACE_S after the watchdog fired ends itself, as torch's
 * NCCL watchdog tears its process down, so that nothing hangs. */
static void *
reaper_main(void *arg)
{
    int rank = (int)(intptr_t)arg;
    struct timespec left = {EXIT_GRACE_S, 0};
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    fprintf(stderr, "cudalab.distributed: rank %d still running %d s after its watchdog fired; "
                    "exiting with status %d\n", rank, EXIT_GRACE_S, EXIT_STATUS);
    fflush(stderr);
    _exit(EXIT_STATUS);
    return NULL;
}

/* The watchdog fires: say why, make the main thread raise, start the
 * reaper, abort. */
static void
watchdog_fire(NcclComm *self, const char *why)
{
    atomic_store(&self->fired, true);
    fprintf(stderr, "cudalab.distributed: %s\n", why);
    fflush(stderr);
    mark_aborted(self, why);
    for (int attempt = 0; attempt < 50; attempt++) {
        char *copy = strdup(why);
        if (copy == NULL || Py_AddPendingCall(raise_pending, copy) == 0) {
            break;
        }
        free(copy); /* the pending-call queue is full: try again shortly */
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    pthread_t reaper;
    if (pthread_create(&reaper, NULL, reaper_main, (void *)(intptr_t)self->rank) == 0) {
        pthread_detach(reaper);
    }
    abort_nccl(self);
    atomic_store(&self->abort_done, true);
}

/* ---- the watchdog thread ---------------------------------------------------- */

static void *
watchdog_main(void *arg)
{
    NcclComm *self = arg;
    char why[sizeof self->error];
    (void)cudaSetDevice(self->device);
    pthread_mutex_lock(&self->lock);
    while (!self->stop) {
        why[0] = '\0';
        /* Retire what has completed. */
        while (self->count > 0) {
            cudaError_t q = cudaEventQuery(self->ring[self->head].event);
            if (q == cudaErrorNotReady) {
                break;
            }
            if (q != cudaSuccess) {
                (void)cudaGetLastError();
            }
            self->head = (self->head + 1) % WATCH_SLOTS;
            self->count--;
        }
        double now = monotonic_s();
        if (self->count > 0 && now - self->ring[self->head].enqueued > self->timeout) {
            const watch_entry *e = &self->ring[self->head];
            snprintf(why, sizeof why,
                     "rank %d of %d (device %d): %s (operation #%llu) did not complete within "
                     "%.1f s; the NCCL communicator was aborted. A peer process died, hung, or "
                     "never called the same collective.",
                     self->rank, self->world_size, self->device, e->what, e->seq,
                     self->timeout);
        }
        else {
            int async = CL_NCCL_SUCCESS;
            if (self->api->CommGetAsyncError(self->comm, &async) == CL_NCCL_SUCCESS &&
                async != CL_NCCL_SUCCESS && async != CL_NCCL_IN_PROGRESS) {
                snprintf(why, sizeof why,
                         "rank %d of %d (device %d): NCCL reported an asynchronous error (%s); "
                         "the NCCL communicator was aborted.",
                         self->rank, self->world_size, self->device,
                         self->api->GetErrorString(async));
            }
        }
        if (why[0] != '\0') {
            pthread_mutex_unlock(&self->lock);
            watchdog_fire(self, why);
            return NULL;
        }
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long ns = until.tv_nsec + WATCH_POLL_MS * 1000000L;
        until.tv_sec += ns / 1000000000L;
        until.tv_nsec = ns % 1000000000L;
        (void)pthread_cond_timedwait(&self->wake, &self->lock, &until);
    }
    pthread_mutex_unlock(&self->lock);
    return NULL;
}

/* Record the watch event behind an operation just enqueued on `stream` (on
 * the communicator's device). No GIL needed; may wait while the ring is full. */
static void
watch_push(NcclComm *self, cudaStream_t stream, const char *what)
{
    pthread_mutex_lock(&self->lock);
    while (self->count == WATCH_SLOTS && !atomic_load(&self->aborted)) {
        /* As many operations pending as slots: wait for the oldest (the
         * watchdog ends that wait if it never completes). */
        cudaEvent_t oldest = self->ring[self->head].event;
        pthread_mutex_unlock(&self->lock);
        if (cudaEventSynchronize(oldest) != cudaSuccess) {
            (void)cudaGetLastError();
        }
        pthread_mutex_lock(&self->lock);
        if (self->count == WATCH_SLOTS && self->ring[self->head].event == oldest) {
            self->head = (self->head + 1) % WATCH_SLOTS;
            self->count--;
        }
    }
    if (self->count < WATCH_SLOTS) {
        watch_entry *e = &self->ring[(self->head + self->count) % WATCH_SLOTS];
        if (cudaEventRecord(e->event, stream) == cudaSuccess) {
            e->enqueued = monotonic_s();
            e->what = what;
            e->seq = ++self->seq;
            self->count++;
        }
        else {
            (void)cudaGetLastError();
        }
    }
    pthread_mutex_unlock(&self->lock);
}

/* Stop and join the watchdog (GIL released by the caller). A watchdog that
 * fired may be stuck in ncclCommAbort waiting for peers: it is left to the
 * reaper after a short wait, and the object is then never freed (`leaked`),
 * since that thread still uses it. */
static void
watchdog_stop(NcclComm *self)
{
    if (!self->watching) {
        return;
    }
    pthread_mutex_lock(&self->lock);
    self->stop = true;
    pthread_cond_signal(&self->wake);
    pthread_mutex_unlock(&self->lock);
    if (atomic_load(&self->fired)) {
        for (int i = 0; i < 200 && !atomic_load(&self->abort_done); i++) {
            struct timespec pause = {0, 10 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        if (!atomic_load(&self->abort_done)) {
            pthread_detach(self->thread);
            self->watching = false;
            self->leaked = true;
            return;
        }
    }
    pthread_join(self->thread, NULL);
    self->watching = false;
}

/* ---- construction ---------------------------------------------------------- */

/* A new, not yet connected, object of `type` for `device` with its locks
 * and (when timeout > 0) its watch events. */
static NcclComm *
comm_alloc(cl_state *st, PyTypeObject *type, const cl_nccl_api *api, int rank, int world_size,
           int device, double timeout)
{
    NcclComm *self = (NcclComm *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->api = api;
    self->rank = rank;
    self->world_size = world_size;
    self->device = device;
    self->timeout = timeout;
    self->closed = true; /* until a communicator exists */
    atomic_init(&self->aborted, false);
    atomic_init(&self->fired, false);
    atomic_init(&self->abort_done, false);
    pthread_mutex_init(&self->call_lock, NULL);
    pthread_mutex_init(&self->lock, NULL);
    pthread_cond_init(&self->wake, NULL);
    if (timeout > 0) {
        int previous;
        if (cl_device_enter(st, device, &previous) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        for (int i = 0; i < WATCH_SLOTS; i++) {
            cudaError_t err = cudaEventCreateWithFlags(&self->ring[i].event,
                                                       cudaEventDisableTiming);
            if (err != cudaSuccess) {
                self->ring[i].event = NULL;
                cl_device_exit(device, previous);
                cl_raise_cuda(st, err, "cudaEventCreateWithFlags", __FILE__, __LINE__);
                Py_DECREF(self);
                return NULL;
            }
        }
        cl_device_exit(device, previous);
    }
    return self;
}

/* The communicator exists: mark it open and start its watchdog. */
static int
comm_open(NcclComm *self, cl_state *st, cl_nccl_comm_t comm)
{
    self->comm = comm;
    self->closed = false;
    if (self->timeout > 0) {
        int err = pthread_create(&self->thread, NULL, watchdog_main, self);
        if (err != 0) {
            PyErr_Format(st->DistributedError, "could not start the watchdog thread: %s",
                         strerror(err));
            return -1;
        }
        self->watching = true;
    }
    return 0;
}

/* timeout argument: seconds, <= 0 or inf turns the watchdog off. */
static int
parse_timeout(PyObject *obj, const char *func, double *timeout)
{
    if (PyBool_Check(obj) || !PyNumber_Check(obj)) {
        return cl_expected_type_error(func, "timeout", "a number of seconds", obj);
    }
    double t = PyFloat_AsDouble(obj);
    if (t == -1.0 && PyErr_Occurred()) {
        return -1;
    }
    if (isnan(t)) {
        return cl_arg_error(PyExc_ValueError, func, "timeout", "must not be NaN");
    }
    *timeout = t > 0 && isfinite(t) ? t : 0.0;
    return 0;
}

static int
parse_small_int(PyObject *obj, const char *func, const char *param, int lo, int hi, int *out)
{
    Py_ssize_t v;
    if (cl_parse_index(obj, func, param, &v) < 0) {
        return -1;
    }
    if (v < lo || v > hi) {
        return cl_arg_error(PyExc_ValueError, func, param, "must be in [%d, %d], got %zd", lo,
                            hi, v);
    }
    *out = (int)v;
    return 0;
}

static PyObject *
Comm_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"unique_id", "world_size", "rank", "device", "timeout", NULL};
    static const char *func = "_NcclComm";
    cl_state *st = cl_state_from_type(type);
    PyObject *id_obj, *size_obj, *rank_obj, *device_obj, *timeout_obj;
    int world_size = 0, rank = 0, device = 0, r = CL_NCCL_SUCCESS;
    double timeout = 0.0;
    cudaError_t err = cudaSuccess;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO:_NcclComm", names, &id_obj, &size_obj,
                                     &rank_obj, &device_obj, &timeout_obj)) {
        return NULL;
    }
    if (!PyBytes_Check(id_obj)) {
        return cl_expected_type_error(func, "unique_id", "bytes", id_obj), NULL;
    }
    if (PyBytes_GET_SIZE(id_obj) != CL_NCCL_UNIQUE_ID_BYTES) {
        return cl_arg_error(PyExc_ValueError, func, "unique_id", "must be %d bytes, got %zd",
                            CL_NCCL_UNIQUE_ID_BYTES, PyBytes_GET_SIZE(id_obj)), NULL;
    }
    if (parse_small_int(size_obj, func, "world_size", 1, 1 << 24, &world_size) < 0 ||
        parse_small_int(rank_obj, func, "rank", 0, world_size - 1, &rank) < 0 ||
        parse_timeout(timeout_obj, func, &timeout) < 0) {
        return NULL;
    }
    if (device_obj == Py_None) {
        return cl_expected_type_error(func, "device", "an int", device_obj), NULL;
    }
    const cl_nccl_api *api = cl_nccl_require(st, func);
    if (api == NULL || cl_parse_device(st, device_obj, func, &device) < 0) {
        return NULL;
    }
    NcclComm *self = comm_alloc(st, type, api, rank, world_size, device, timeout);
    if (self == NULL) {
        return NULL;
    }
    cl_nccl_unique_id id;
    memcpy(id.internal, PyBytes_AS_STRING(id_obj), sizeof id.internal);
    cl_nccl_comm_t comm = NULL;
    /* Blocks until every rank has joined. */
    Py_BEGIN_ALLOW_THREADS
    int previous = device;
    err = cudaGetDevice(&previous);
    if (err == cudaSuccess && previous != device) {
        err = cudaSetDevice(device);
    }
    if (err == cudaSuccess) {
        r = api->CommInitRank(&comm, world_size, id, rank);
        if (previous != device) {
            (void)cudaSetDevice(previous);
        }
    }
    Py_END_ALLOW_THREADS
    if (err != cudaSuccess) {
        cl_raise_cuda(st, err, "cudaSetDevice(device)", __FILE__, __LINE__);
        Py_DECREF(self);
        return NULL;
    }
    if (r != CL_NCCL_SUCCESS) {
        CL_NCCL_RAISE(st, r, NULL, "ncclCommInitRank(&comm, world_size, unique_id, rank)");
        Py_DECREF(self);
        return NULL;
    }
    if (comm_open(self, st, comm) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
Comm_dealloc(NcclComm *self)
{
    PyTypeObject *type = Py_TYPE(self);
    Py_BEGIN_ALLOW_THREADS
    watchdog_stop(self);
    Py_END_ALLOW_THREADS
    if (self->leaked) {
        return; /* the fired watchdog still uses it (watchdog_stop) */
    }
    /* Not destroyed explicitly: abort. ncclCommDestroy may wait for peers
     * that are gone by now (at exit, after a failure). */
    if (!self->closed && !atomic_load(&self->aborted)) {
        (void)self->api->CommAbort(self->comm);
    }
    int previous = cl_device_enter_quiet(self->device);
    for (int i = 0; i < WATCH_SLOTS; i++) {
        if (self->ring[i].event != NULL && cudaEventDestroy(self->ring[i].event) != cudaSuccess) {
            (void)cudaGetLastError();
        }
    }
    cl_device_exit(self->device, previous);
    pthread_mutex_destroy(&self->call_lock);
    pthread_mutex_destroy(&self->lock);
    pthread_cond_destroy(&self->wake);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

static PyObject *
Comm_repr(NcclComm *self)
{
    const char *state = atomic_load(&self->aborted) ? " aborted" : self->closed ? " destroyed" : "";
    return PyUnicode_FromFormat("<cudalab._NcclComm rank=%d world_size=%d device=%d%s>",
                                self->rank, self->world_size, self->device, state);
}

/* ---- state checks ----------------------------------------------------------- */

/* 0 when the communicator can take calls; DistributedError otherwise. */
static int
check_open(NcclComm *self, cl_state *st, const char *func)
{
    if (atomic_load(&self->aborted)) {
        PyErr_Format(st->DistributedError, "%s(): %s", func, self->error);
        return -1;
    }
    if (self->closed) {
        PyErr_Format(st->DistributedError,
                     "%s(): the communicator was destroyed (rank %d, device %d)", func,
                     self->rank, self->device);
        return -1;
    }
    return 0;
}

static cl_state *
state_of(NcclComm *self)
{
    return cl_state_from_type(Py_TYPE(self));
}

/* ---- collectives ------------------------------------------------------------ */

typedef enum {
    K_ALL_REDUCE,
    K_BROADCAST,
    K_REDUCE,
    K_ALL_GATHER,
    K_REDUCE_SCATTER,
    K_ALL_TO_ALL,
    K_SEND,
    K_RECV,
} coll_kind;

typedef struct {
    coll_kind kind;
    DeviceArray *send, *recv; /* send: the array of send(), recv: of recv() */
    int dtype;                /* NCCL's */
    int op;                   /* NCCL's, after the bool mapping */
    int root;                 /* broadcast, reduce; the peer of send/recv */
    size_t count;             /* elements per NCCL's count argument */
    size_t nbytes;            /* message bytes, for the profiler */
} coll_call;

/* An array operand: DeviceArray, C-contiguous, on the communicator's device. */
static int
coll_array(NcclComm *self, cl_op *op, PyObject *obj, const char *param, DeviceArray **out)
{
    if (cl_op_array(op, obj, param, out) < 0) {
        return -1;
    }
    if ((*out)->device != self->device) {
        return cl_arg_error(PyExc_ValueError, op->func, param,
                            "is on device %d but the communicator (rank %d) is on device %d",
                            (*out)->device, self->rank, self->device);
    }
    if (!cl_is_c_contiguous(*out)) {
        return cl_arg_error(PyExc_ValueError, op->func, param,
                            "must be C-contiguous (NCCL reads and writes one block)");
    }
    return 0;
}

/* The reduction code `obj` for dtype `dtype`: NCCL's op, with bool's
 * logical forms (sum/avg: or = max, prod: and = min), avg refused on ints. */
static int
coll_reduce_op(cl_op *op, PyObject *obj, cl_dtype dtype, int *out)
{
    int code = 0;
    if (parse_small_int(obj, op->func, "op", CL_NCCL_SUM, CL_NCCL_AVG, &code) < 0) {
        return -1;
    }
    if (dtype == CL_BOOL) {
        code = code == CL_NCCL_PROD || code == CL_NCCL_MIN ? CL_NCCL_MIN : CL_NCCL_MAX;
    }
    else if (code == CL_NCCL_AVG && !cl_dtype_is_float(dtype)) {
        return cl_arg_error(PyExc_ValueError, op->func, "op",
                            "avg needs a floating dtype, got %s (sum, then divide)",
                            cl_dtype_name(dtype));
    }
    *out = code;
    return 0;
}

static size_t
nbytes_of(const DeviceArray *a)
{
    return (size_t)cl_array_size(a) * cl_itemsize(a->dtype);
}

/* send and recv of one collective: same dtype, recv.size == send.size *
 * `recv_per_send` / `send_per_recv`, and no overlap except the in-place form
 * NCCL allows (when `inplace_ok`): recv + `inplace_offset` bytes == send. */
static int
coll_pair(cl_op *op, const DeviceArray *send, const DeviceArray *recv, Py_ssize_t recv_per_send,
          Py_ssize_t send_per_recv, bool inplace_ok, Py_ssize_t inplace_offset)
{
    if (send->dtype != recv->dtype) {
        return cl_arg_error(PyExc_TypeError, op->func, "recv", "has dtype %s but send has %s",
                            cl_dtype_name(recv->dtype), cl_dtype_name(send->dtype));
    }
    Py_ssize_t ns = cl_array_size(send), nr = cl_array_size(recv);
    if (nr * send_per_recv != ns * recv_per_send) {
        return cl_arg_error(PyExc_ValueError, op->func, "recv",
                            "has %zd elements but send has %zd (expected %zd)", nr, ns,
                            ns * recv_per_send / send_per_recv);
    }
    if (cl_arrays_overlap(send, recv) &&
        (!inplace_ok || recv->data + inplace_offset != send->data)) {
        return cl_arg_error(PyExc_ValueError, op->func, "recv",
                            "overlaps send; only the in-place form is allowed");
    }
    return 0;
}

/* Enqueue `c` on `stream`. Called with the GIL released and call_lock held. */
static int
coll_issue(NcclComm *self, const coll_call *c, cudaStream_t stream)
{
    const cl_nccl_api *api = self->api;
    void *sb = c->send != NULL ? c->send->data : NULL;
    void *rb = c->recv != NULL ? c->recv->data : NULL;
    switch (c->kind) {
    case K_ALL_REDUCE:
        return api->AllReduce(sb, rb, c->count, c->dtype, c->op, self->comm, stream);
    case K_BROADCAST:
        return api->Broadcast(sb, rb, c->count, c->dtype, c->root, self->comm, stream);
    case K_REDUCE:
        return api->Reduce(sb, rb, c->count, c->dtype, c->op, c->root, self->comm, stream);
    case K_ALL_GATHER:
        return api->AllGather(sb, rb, c->count, c->dtype, self->comm, stream);
    case K_REDUCE_SCATTER:
        return api->ReduceScatter(sb, rb, c->count, c->dtype, c->op, self->comm, stream);
    case K_SEND:
        return api->Send(sb, c->count, c->dtype, c->root, self->comm, stream);
    case K_RECV:
        return api->Recv(rb, c->count, c->dtype, c->root, self->comm, stream);
    case K_ALL_TO_ALL: {
        /* Block p of send to rank p, block p of recv from rank p, as one group. */
        size_t block = c->count * cl_itemsize(c->send->dtype);
        int r = api->GroupStart();
        for (int p = 0; r == CL_NCCL_SUCCESS && p < self->world_size; p++) {
            r = api->Send((char *)sb + (size_t)p * block, c->count, c->dtype, p, self->comm,
                          stream);
            if (r == CL_NCCL_SUCCESS) {
                r = api->Recv((char *)rb + (size_t)p * block, c->count, c->dtype, p,
                              self->comm, stream);
            }
        }
        int end = api->GroupEnd();
        return r != CL_NCCL_SUCCESS ? r : end;
    }
    }
    return CL_NCCL_INVALID_ARGUMENT;
}

/* ---- thread-local group bookkeeping ----------------------------------------- */

typedef struct {
    NcclComm *comm; /* strong */
    cudaStream_t stream;
} group_entry;

static _Thread_local int tl_group_depth;
static _Thread_local group_entry tl_group[GROUP_MEMBERS];
static _Thread_local int tl_group_count;

void
cl_nccl_group_begin(void)
{
    tl_group_depth++;
}

int
cl_nccl_group_depth(void)
{
    return tl_group_depth;
}

static void
group_note(NcclComm *comm, cudaStream_t stream)
{
    for (int i = 0; i < tl_group_count; i++) {
        if (tl_group[i].comm == comm && tl_group[i].stream == stream) {
            return;
        }
    }
    if (tl_group_count < GROUP_MEMBERS) { /* beyond: those go unwatched */
        Py_INCREF(comm);
        tl_group[tl_group_count++] = (group_entry){comm, stream};
    }
}

void
cl_nccl_group_finish(bool ok)
{
    if (tl_group_depth > 0 && --tl_group_depth > 0) {
        return; /* an inner group: the outermost end launches */
    }
    int n = tl_group_count;
    tl_group_count = 0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        for (int i = 0; i < n; i++) {
            NcclComm *c = tl_group[i].comm;
            if (!c->watching || atomic_load(&c->aborted)) {
                continue;
            }
            int previous = cl_device_enter_quiet(c->device);
            watch_push(c, tl_group[i].stream, "grouped collective");
            cl_device_exit(c->device, previous);
        }
        Py_END_ALLOW_THREADS
    }
    for (int i = 0; i < n; i++) {
        Py_DECREF(tl_group[i].comm);
    }
}

/* Enqueue a validated call on the op's stream and close the op frame. */
static PyObject *
coll_run(NcclComm *self, cl_op *op, coll_call *c)
{
    cl_state *st = op->st;
    int r = CL_NCCL_SUCCESS;
    bool was_aborted = false;
    if (check_open(self, st, op->func) < 0 || cl_op_begin(op) < 0) {
        return NULL;
    }
    cl_op_use(op, c->send);
    cl_op_use(op, c->recv);
    bool grouped = tl_group_depth > 0;
    bool watch = self->watching && !grouped && cl_graph_capturing(op->stream) == NULL;
    if (c->count > 0) {
        cudaStream_t stream = op->stream;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&self->call_lock);
        if (atomic_load(&self->aborted)) {
            was_aborted = true;
        }
        else {
            r = coll_issue(self, c, stream);
            if (r == CL_NCCL_SUCCESS && watch) {
                watch_push(self, stream, op->func);
            }
        }
        pthread_mutex_unlock(&self->call_lock);
        Py_END_ALLOW_THREADS
    }
    PyObject *result = NULL;
    if (was_aborted) {
        PyErr_Format(st->DistributedError, "%s(): %s", op->func, self->error);
    }
    else if (r != CL_NCCL_SUCCESS) {
        CL_NCCL_RAISE(st, r, self->comm, op->func);
    }
    else {
        if (grouped && c->count > 0) {
            group_note(self, op->stream);
        }
        result = Py_NewRef(Py_None);
    }
    const DeviceArray *shown = c->recv != NULL ? c->recv : c->send;
    cl_prof_info info = {
        .dtype = (int)shown->dtype,
        .bytes = (int64_t)c->nbytes,
        .flops = -1,
        .ninputs = c->send != NULL ? 1 : 0,
        .inputs = {c->send},
        .out_ndim = shown->ndim,
        .out_shape = shown->shape,
    };
    return cl_op_end(op, result, CL_OP_PROFILING(op) ? &info : NULL);
}

PyDoc_STRVAR(all_reduce_doc,
"all_reduce(send, recv, op)\n--\n\n"
"ncclAllReduce on the current stream: recv = op over every rank's send\n"
"(recv may be send). op: 0 sum, 1 prod, 2 max, 3 min, 4 avg.");

static PyObject *
Comm_all_reduce(NcclComm *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"send", "recv", "op", NULL};
    PyObject *argv[3];
    cl_op op;
    coll_call c = {.kind = K_ALL_REDUCE};
    cl_op_init(&op, state_of(self), "all_reduce");
    if (cl_parse_args(op.func, args, nargs, kwnames, names, 3, argv) < 0 ||
        coll_array(self, &op, argv[0], "send", &c.send) < 0 ||
        coll_array(self, &op, argv[1], "recv", &c.recv) < 0 ||
        coll_pair(&op, c.send, c.recv, 1, 1, true, 0) < 0 ||
        coll_reduce_op(&op, argv[2], c.send->dtype, &c.op) < 0) {
        return NULL;
    }
    c.dtype = cl_nccl_dtype(c.send->dtype);
    c.count = (size_t)cl_array_size(c.send);
    c.nbytes = nbytes_of(c.send);
    return coll_run(self, &op, &c);
}

PyDoc_STRVAR(broadcast_doc,
"broadcast(send, recv, root)\n--\n\n"
"ncclBroadcast on the current stream: every rank's recv = root's send.");

static PyObject *
Comm_broadcast(NcclComm *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"send", "recv", "root", NULL};
    PyObject *argv[3];
    cl_op op;
    coll_call c = {.kind = K_BROADCAST};
    cl_op_init(&op, state_of(self), "broadcast");
    if (cl_parse_args(op.func, args, nargs, kwnames, names, 3, argv) < 0 ||
        coll_array(self, &op, argv[0], "send", &c.send) < 0 ||
        coll_array(self, &op, argv[1], "recv", &c.recv) < 0 ||
        coll_pair(&op, c.send, c.recv, 1, 1, true, 0) < 0 ||
        parse_small_int(argv[2], op.func, "root", 0, self->world_size - 1, &c.root) < 0) {
        return NULL;
    }
    c.dtype = cl_nccl_dtype(c.send->dtype);
    c.count = (size_t)cl_array_size(c.send);
    c.nbytes = nbytes_of(c.send);
    return coll_run(self, &op, &c);
}

PyDoc_STRVAR(reduce_doc,
"reduce(send, recv, op, root)\n--\n\n"
"ncclReduce on the current stream: root's recv = op over every rank's send.");

static PyObject *
Comm_reduce(NcclComm *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"send", "recv", "op", "root", NULL};
    PyObject *argv[4];
    cl_op op;
    coll_call c = {.kind = K_REDUCE};
    cl_op_init(&op, state_of(self), "reduce");
    if (cl_parse_args(op.func, args, nargs, kwnames, names, 4, argv) < 0 ||
        coll_array(self, &op, argv[0], "send", &c.send) < 0 ||
        coll_array(self, &op, argv[1], "recv", &c.recv) < 0 ||
        coll_pair(&op, c.send, c.recv, 1, 1, true, 0) < 0 ||
        coll_reduce_op(&op, argv[2], c.send->dtype, &c.op) < 0 ||
        parse_small_int(argv[3], op.func, "root", 0, self->world_size - 1, &c.root) < 0) {
        return NULL;
    }
    c.dtype = cl_nccl_dtype(c.send->dtype);
    c.count = (size_t)cl_array_size(c.send);
    c.nbytes = nbytes_of(c.send);
    return coll_run(self, &op, &c);
}

PyDoc_STRVAR(all_gather_doc,
"all_gather(send, recv)\n--\n\n"
"ncclAllGather on the current stream: block r of recv (world_size blocks of\n"
"send.size) = rank r's send. In place when send is recv's own block.");

static PyObject *
Comm_all_gather(NcclComm *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"send", "recv", NULL};
    PyObject *argv[2];
    cl_op op;
    coll_call c = {.kind = K_ALL_GATHER};
    cl_op_init(&op, state_of(self), "all_gather");
    if (cl_parse_args(op.func, args, nargs, kwnames, names, 2, argv) < 0 ||
        coll_array(self, &op, argv[0], "send", &c.send) < 0 ||
        coll_array(self, &op, argv[1], "recv", &c.recv) < 0 ||
        coll_pair(&op, c.send, c.recv, self->world_size, 1, true,
                  (Py_ssize_t)self->rank * (Py_ssize_t)nbytes_of(c.send)) < 0) {
        return NULL;
    }
    c.dtype = cl_nccl_dtype(c.send->dtype);
    c.count = (size_t)cl_array_size(c.send);
    c.nbytes = nbytes_of(c.recv);
    return coll_run(self, &op, &c);
}

PyDoc_STRVAR(reduce_scatter_doc,
"reduce_scatter(send, recv, op)\n--\n\n"
"ncclReduceScatter on the current stream: recv = op over every rank's block\n"
"`rank` of send (world_size blocks of recv.size). In place when recv is\n"
"send's own block.");

static PyObject *
Comm_reduce_scatter(NcclComm *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"send", "recv", "op", NULL};
    PyObject *argv[3];
    cl_op op;
    coll_call c = {.kind = K_REDUCE_SCATTER};
    cl_op_init(&op, state_of(self), "reduce_scatter");
    if (cl_parse_args(op.func, args, nargs, kwnames, names, 3, argv) < 0 ||
        coll_array(self, &op, argv[0], "send", &c.send) < 0 ||
        coll_array(self, &op, argv[1], "recv", &c.recv) < 0 ||
        coll_pair(&op, c.send, c.recv, 1, self->world_size, true,
                  -(Py_ssize_t)self->rank * (Py_ssize_t)nbytes_of(c.recv)) < 0 ||
        coll_reduce_op(&op, argv[2], c.send->dtype, &c.op) < 0) {
        return NULL;
    }
    c.dtype = cl_nccl_dtype(c.send->dtype);
    c.count = (size_t)cl_array_size(c.recv);
    c.nbytes = nbytes_of(c.send);
    return coll_run(self, &op, &c);
}

PyDoc_STRVAR(all_to_all_doc,
"all_to_all(send, recv)\n--\n\n"
"Block p of send (world_size equal blocks) goes to rank p; block p of recv\n"
"comes from rank p. One group of ncclSend/ncclRecv on the current stream.");

static PyObject *
Comm_all_to_all(NcclComm *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"send", "recv", NULL};
    PyObject *argv[2];
    cl_op op;
    coll_call c = {.kind = K_ALL_TO_ALL};
    cl_op_init(&op, state_of(self), "all_to_all");
    if (cl_parse_args(op.func, args, nargs, kwnames, names, 2, argv) < 0 ||
        coll_array(self, &op, argv[0], "send", &c.send) < 0 ||
        coll_array(self, &op, argv[1], "recv", &c.recv) < 0 ||
        coll_pair(&op, c.send, c.recv, 1, 1, false, 0) < 0) {
        return NULL;
    }
    Py_ssize_t n = cl_array_size(c.send);
    if (n % self->world_size != 0) {
        return cl_arg_error(PyExc_ValueError, op.func, "send",
                            "has %zd elements, not a multiple of world_size %d", n,
                            self->world_size), NULL;
    }
    c.dtype = cl_nccl_dtype(c.send->dtype);
    c.count = (size_t)(n / self->world_size);
    c.nbytes = nbytes_of(c.send);
    return coll_run(self, &op, &c);
}

/* send(array, peer) and recv(array, peer). */
static PyObject *
point_to_point(NcclComm *self, coll_kind kind, PyObject *const *args, Py_ssize_t nargs,
               PyObject *kwnames)
{
    static const char *const names[] = {"array", "peer", NULL};
    PyObject *argv[2];
    cl_op op;
    coll_call c = {.kind = kind};
    DeviceArray *a;
    cl_op_init(&op, state_of(self), kind == K_SEND ? "send" : "recv");
    if (cl_parse_args(op.func, args, nargs, kwnames, names, 2, argv) < 0 ||
        coll_array(self, &op, argv[0], "array", &a) < 0 ||
        parse_small_int(argv[1], op.func, "peer", 0, self->world_size - 1, &c.root) < 0) {
        return NULL;
    }
    if (c.root == self->rank && tl_group_depth == 0) {
        return cl_arg_error(PyExc_ValueError, op.func, "peer",
                            "is this rank (%d): a rank can exchange with itself only inside "
                            "a group, beside the matching %s",
                            self->rank, kind == K_SEND ? "recv" : "send"), NULL;
    }
    if (kind == K_SEND) {
        c.send = a;
    }
    else {
        c.recv = a;
    }
    c.dtype = cl_nccl_dtype(a->dtype);
    c.count = (size_t)cl_array_size(a);
    c.nbytes = nbytes_of(a);
    return coll_run(self, &op, &c);
}

PyDoc_STRVAR(send_doc,
"send(array, peer)\n--\n\nncclSend of `array` to rank `peer` on the current stream.");

static PyObject *
Comm_send(NcclComm *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return point_to_point(self, K_SEND, args, nargs, kwnames);
}

PyDoc_STRVAR(recv_doc,
"recv(array, peer)\n--\n\nncclRecv into `array` from rank `peer` on the current stream.");

static PyObject *
Comm_recv(NcclComm *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return point_to_point(self, K_RECV, args, nargs, kwnames);
}

/* ---- lifetime --------------------------------------------------------------- */

PyDoc_STRVAR(destroy_doc,
"destroy()\n--\n\n"
"Free the communicator (ncclCommDestroy) after stopping its watchdog. Every\n"
"rank calls it; work already enqueued completes. Idempotent.");

static PyObject *
Comm_destroy(NcclComm *self, PyObject *unused)
{
    int r = CL_NCCL_SUCCESS;
    if (self->closed) {
        Py_RETURN_NONE;
    }
    bool aborted;
    Py_BEGIN_ALLOW_THREADS
    watchdog_stop(self);
    aborted = atomic_load(&self->aborted);
    if (!aborted) {
        int previous = cl_device_enter_quiet(self->device);
        r = self->api->CommDestroy(self->comm);
        cl_device_exit(self->device, previous);
    }
    Py_END_ALLOW_THREADS
    self->closed = true;
    if (r != CL_NCCL_SUCCESS) {
        return CL_NCCL_RAISE(state_of(self), r, NULL, "ncclCommDestroy(comm)"), NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(abort_doc,
"abort(reason=None)\n--\n\n"
"Abort the communicator (ncclCommAbort): operations in flight end without\n"
"completing; later calls raise DistributedError with `reason`.");

static PyObject *
Comm_abort(NcclComm *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"reason", NULL};
    PyObject *argv[1];
    const char *reason = NULL;
    char why[sizeof self->error];
    if (cl_parse_args("abort", args, nargs, kwnames, names, 0, argv) < 0) {
        return NULL;
    }
    if (argv[0] != NULL && argv[0] != Py_None) {
        if (!PyUnicode_Check(argv[0])) {
            return cl_expected_type_error("abort", "reason", "a str", argv[0]), NULL;
        }
        if ((reason = PyUnicode_AsUTF8(argv[0])) == NULL) {
            return NULL;
        }
    }
    if (self->closed || atomic_load(&self->aborted)) {
        Py_RETURN_NONE;
    }
    snprintf(why, sizeof why, "rank %d of %d (device %d): the communicator was aborted%s%s",
             self->rank, self->world_size, self->device, reason != NULL ? ": " : "",
             reason != NULL ? reason : "");
    Py_BEGIN_ALLOW_THREADS
    watchdog_stop(self);
    if (!atomic_load(&self->aborted)) {
        mark_aborted(self, why);
        abort_nccl(self);
    }
    Py_END_ALLOW_THREADS
    self->closed = true;
    Py_RETURN_NONE;
}

/* ---- attributes -------------------------------------------------------------- */

static PyObject *
Comm_get_rank(NcclComm *self, void *closure)
{
    return PyLong_FromLong(self->rank);
}

static PyObject *
Comm_get_world_size(NcclComm *self, void *closure)
{
    return PyLong_FromLong(self->world_size);
}

static PyObject *
Comm_get_device(NcclComm *self, void *closure)
{
    return PyLong_FromLong(self->device);
}

static PyObject *
Comm_get_timeout(NcclComm *self, void *closure)
{
    return PyFloat_FromDouble(self->timeout > 0 ? self->timeout : INFINITY);
}

static PyObject *
Comm_get_aborted(NcclComm *self, void *closure)
{
    return PyBool_FromLong(atomic_load(&self->aborted));
}

static PyObject *
Comm_get_error(NcclComm *self, void *closure)
{
    if (!atomic_load(&self->aborted)) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(self->error);
}

static PyGetSetDef Comm_getset[] = {
    {"rank", (getter)Comm_get_rank, NULL, "This communicator's rank.", NULL},
    {"world_size", (getter)Comm_get_world_size, NULL, "The number of ranks.", NULL},
    {"device", (getter)Comm_get_device, NULL, "The CUDA device it works on.", NULL},
    {"timeout", (getter)Comm_get_timeout, NULL,
     "The watchdog's seconds (inf: no watchdog).", NULL},
    {"aborted", (getter)Comm_get_aborted, NULL, "Whether it was aborted.", NULL},
    {"error", (getter)Comm_get_error, NULL, "Why it was aborted, or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define COMM_METHOD(name) \
    {#name, (PyCFunction)(void (*)(void))Comm_##name, METH_FASTCALL | METH_KEYWORDS, name##_doc}

static PyMethodDef Comm_methods[] = {
    COMM_METHOD(all_reduce),
    COMM_METHOD(broadcast),
    COMM_METHOD(reduce),
    COMM_METHOD(all_gather),
    COMM_METHOD(reduce_scatter),
    COMM_METHOD(all_to_all),
    COMM_METHOD(send),
    COMM_METHOD(recv),
    COMM_METHOD(abort),
    {"destroy", (PyCFunction)Comm_destroy, METH_NOARGS, destroy_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(Comm_doc,
"_NcclComm(unique_id, world_size, rank, device, timeout)\n--\n\n"
"One NCCL communicator on `device` (ncclCommInitRank; blocks until every\n"
"rank has joined, with the GIL released). cudalab.distributed.ProcessGroup\n"
"wraps it; `timeout` is its watchdog's seconds (<= 0 or inf: none).");

static PyType_Slot Comm_slots[] = {
    {Py_tp_doc, (void *)Comm_doc},
    {Py_tp_new, Comm_new},
    {Py_tp_dealloc, Comm_dealloc},
    {Py_tp_repr, Comm_repr},
    {Py_tp_methods, Comm_methods},
    {Py_tp_getset, Comm_getset},
    {0, NULL},
};

static PyType_Spec Comm_spec = {
    .name = "cudalab._NcclComm",
    .basicsize = sizeof(NcclComm),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Comm_slots,
};

/* ---- one process, several devices ------------------------------------------ */

PyDoc_STRVAR(_nccl_init_all_doc,
"_nccl_init_all(devices, timeout)\n--\n\n"
"One communicator per device of this process (ncclCommInitAll): rank i works\n"
"on devices[i]. Collectives over them are issued between _nccl_group_start()\n"
"and _nccl_group_end(), one call per communicator.");

static PyObject *
_nccl_init_all(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"devices", "timeout", NULL};
    static const char *func = "_nccl_init_all";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2], *seq = NULL, *result = NULL;
    const cl_nccl_api *api = NULL;
    int devices[CL_MAX_DEVICES];
    cl_nccl_comm_t comms[CL_MAX_DEVICES] = {0};
    double timeout = 0.0;
    Py_ssize_t n = 0;
    int r;
    if (cl_parse_args(func, args, nargs, kwnames, names, 2, argv) < 0 ||
        parse_timeout(argv[1], func, &timeout) < 0) {
        return NULL;
    }
    seq = PySequence_Fast(argv[0], "_nccl_init_all() argument 'devices': expected a sequence "
                                   "of device indices");
    if (seq == NULL) {
        return NULL;
    }
    n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > CL_MAX_DEVICES) {
        cl_arg_error(PyExc_ValueError, func, "devices", "needs 1 to %d devices, got %zd",
                     CL_MAX_DEVICES, n);
        goto fail;
    }
    if ((api = cl_nccl_require(st, func)) == NULL) {
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (item == Py_None) {
            cl_expected_type_error(func, "devices", "an int", item);
            goto fail;
        }
        if (cl_parse_device(st, item, func, &devices[i]) < 0) {
            goto fail;
        }
        for (Py_ssize_t j = 0; j < i; j++) {
            if (devices[j] == devices[i]) {
                cl_arg_error(PyExc_ValueError, func, "devices", "lists device %d twice",
                             devices[i]);
                goto fail;
            }
        }
    }
    Py_BEGIN_ALLOW_THREADS
    r = api->CommInitAll(comms, (int)n, devices);
    Py_END_ALLOW_THREADS
    if (r != CL_NCCL_SUCCESS) {
        CL_NCCL_RAISE(st, r, NULL, "ncclCommInitAll(comms, ndev, devices)");
        goto fail;
    }
    result = PyList_New(n);
    for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
        NcclComm *c = comm_alloc(st, st->NcclComm_Type, api, (int)i, (int)n, devices[i],
                                 timeout);
        if (c == NULL) {
            goto fail;
        }
        PyList_SET_ITEM(result, i, (PyObject *)c);
        cl_nccl_comm_t comm = comms[i];
        comms[i] = NULL;
        if (comm_open(c, st, comm) < 0) {
            goto fail;
        }
    }
    if (result == NULL) {
        goto fail;
    }
    Py_DECREF(seq);
    return result;
fail:
    /* Communicators not yet owned by an object. */
    for (Py_ssize_t i = 0; api != NULL && i < n && i < CL_MAX_DEVICES; i++) {
        if (comms[i] != NULL) {
            (void)api->CommAbort(comms[i]);
        }
    }
    Py_XDECREF(seq);
    Py_XDECREF(result);
    return NULL;
}

static PyMethodDef comm_functions[] = {
    CL_FASTCALL(_nccl_init_all),
    {NULL, NULL, 0, NULL},
};

int
cl_dist_init(PyObject *module, cl_state *st)
{
    st->NcclComm_Type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Comm_spec, NULL);
    if (st->NcclComm_Type == NULL ||
        PyModule_AddObjectRef(module, "_NcclComm", (PyObject *)st->NcclComm_Type) < 0) {
        return -1;
    }
    if (pending_error_type == NULL) {
        pending_error_type = Py_NewRef(st->DistributedError); /* lives with the process */
    }
    if (PyModule_AddFunctions(module, comm_functions) < 0 ||
        PyModule_AddFunctions(module, cl_nccl_methods) < 0) {
        return -1;
    }
    return 0;
}
