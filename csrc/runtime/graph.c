/* CUDA graphs: the CUDAGraph type (its replay() is an op: ops/graph.c, which
 * module.c hands to cl_graph_init). The capture context (cudalab.graph) is
 * Python (streams.py) on top of capture_begin / capture_end / _abort_capture.
 *
 * Capture runs on a side stream in cudaStreamCaptureModeThreadLocal; the
 * graph is instantiated with cudaGraphInstantiateFlagAutoFreeOnLaunch.
 *
 * Memory: allocations made on the capturing stream become graph memory
 * nodes (cudaMallocFromPoolAsync is capturable). Their addresses are fixed
 * for the graph's life, so arrays created during capture stay valid after it
 * and hold their values after each replay. Such an array (a->graph set) does
 * not free its memory itself:
 *   - it dies during capture (a temporary): its free is captured too, and a
 *     later allocation of the same graph may get the same address (CUDA
 *     reuses addresses of graph allocations whose lifetimes do not overlap).
 *     compute-sanitizer's memcheck attributes such an address to the last
 *     allocation made there and reports accesses of the earlier, larger one
 *     as out of bounds (a 20-line CUDA program without cudalab shows it), so
 *     keep_temporaries=True (or CUDALAB_GRAPH_KEEP_TEMPORARIES=1, which
 *     scripts/sanitize.sh sets) keeps temporaries until the next replay or
 *     reset instead: every allocation of the graph then has its own address;
 *   - it dies later: the graph keeps the address and frees it when the graph
 *     is reset or destroyed (after its last launch). Each array holds a
 *     reference to the graph, and reset() refuses while any is alive. */
#include "runtime/runtime.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int device;
    bool capturing;
    bool launched;
    bool keep_temporaries;      /* no free inside the graph: see the header */
    cudaStream_t capture_stream;
    cudaStream_t launch_stream; /* last replay's stream */
    void **ptrs;                /* graph allocations not freed inside the graph */
    Py_ssize_t num_ptrs, cap_ptrs;
    Py_ssize_t live_arrays;     /* arrays referring to graph memory */
} GraphObject;

static _Thread_local GraphObject *tl_capture_graph;  /* borrowed */
static _Thread_local cudaStream_t tl_capture_stream;

PyObject *
cl_graph_capturing(cudaStream_t s)
{
    if (tl_capture_graph != NULL && tl_capture_stream == s) {
        return (PyObject *)tl_capture_graph;
    }
    return NULL;
}

bool
cl_graph_thread_capturing(void)
{
    return tl_capture_graph != NULL;
}

int
cl_refuse_while_capturing(cl_state *st, const char *func, const char *what)
{
    if (tl_capture_graph == NULL) {
        return 0;
    }
    PyErr_Format(st->CudalabError,
                 "%s(): %s is not allowed while this thread captures a CUDA graph: CUDA would "
                 "invalidate the capture. Do it before or after the `with cudalab.graph(...)` "
                 "block (host copies inside a capture need pinned memory and "
                 "non_blocking=True)",
                 func, what);
    return -1;
}

PyObject *
cl_graph_adopt(cudaStream_t s, void *ptr)
{
    GraphObject *g = tl_capture_graph;
    if (g == NULL || ptr == NULL || tl_capture_stream != s) {
        return NULL;
    }
    if (g->num_ptrs == g->cap_ptrs) {
        Py_ssize_t cap = g->cap_ptrs ? 2 * g->cap_ptrs : 16;
        void **p = PyMem_Realloc(g->ptrs, (size_t)cap * sizeof *p);
        if (p == NULL) {
            return NULL; /* the array then frees its memory inside the graph */
        }
        g->ptrs = p;
        g->cap_ptrs = cap;
    }
    g->ptrs[g->num_ptrs++] = ptr;
    g->live_arrays++;
    return Py_NewRef(g);
}

static bool
forget_ptr(GraphObject *g, void *ptr)
{
    for (Py_ssize_t i = 0; i < g->num_ptrs; i++) {
        if (g->ptrs[i] == ptr) {
            g->ptrs[i] = g->ptrs[--g->num_ptrs];
            return true;
        }
    }
    return false;
}

void
cl_graph_release(PyObject *graph, void *ptr)
{
    GraphObject *g = (GraphObject *)graph;
    g->live_arrays--;
    if (g->capturing && tl_capture_graph == g && !g->keep_temporaries && forget_ptr(g, ptr)) {
        /* A temporary of the captured work: capture its free as well. */
        if (cudaFreeAsync(ptr, g->capture_stream) != cudaSuccess) {
            (void)cudaGetLastError();
        }
    }
}

/* Drop the graph and everything it owns; never raises. */
static void
destroy_all(GraphObject *g)
{
    int previous = cl_device_enter_quiet(g->device);
    if (g->launched) {
        /* Graph memory is live after a launch; free it after the last one. */
        for (Py_ssize_t i = 0; i < g->num_ptrs; i++) {
            if (cudaFreeAsync(g->ptrs[i], g->launch_stream) != cudaSuccess) {
                (void)cudaGetLastError();
            }
        }
    }
    g->num_ptrs = 0;
    if (g->exec != NULL && cudaGraphExecDestroy(g->exec) != cudaSuccess) {
        (void)cudaGetLastError();
    }
    if (g->graph != NULL && cudaGraphDestroy(g->graph) != cudaSuccess) {
        (void)cudaGetLastError();
    }
    g->exec = NULL;
    g->graph = NULL;
    g->launched = false;
    cl_device_exit(g->device, previous);
}

/* End `g`'s capture (its stream is usable after) and leave this thread's
 * capture state; the captured graph, if any, goes to *graph. */
static cudaError_t
end_capture(GraphObject *g, cudaGraph_t *graph)
{
    *graph = NULL;
    cudaError_t err = cudaStreamEndCapture(g->capture_stream, graph);
    g->capturing = false;
    if (tl_capture_graph == g) {
        tl_capture_graph = NULL;
        tl_capture_stream = NULL;
    }
    return err;
}

/* End a capture that failed or is abandoned, discarding what it captured. */
static void
abort_capture(GraphObject *g)
{
    cudaGraph_t partial;
    if (!g->capturing) {
        return;
    }
    (void)end_capture(g, &partial);
    if (partial != NULL) {
        (void)cudaGraphDestroy(partial);
    }
    (void)cudaGetLastError();
    /* Nothing was ever allocated for real: forget the addresses. */
    g->num_ptrs = 0;
}

/* CudalabError "<func>(): <message>" for a CUDAGraph used out of order. */
static PyObject *
graph_state_error(GraphObject *g, const char *func, const char *message)
{
    cl_state *st = cl_state_from_type(Py_TYPE(g));
    PyErr_Format(st->CudalabError, "%s(): %s", func, message);
    return NULL;
}

/* keep_temporaries: True/False, or None for the environment's
 * CUDALAB_GRAPH_KEEP_TEMPORARIES ("1" keeps them). */
static int
parse_keep_temporaries(PyObject *obj, bool *keep)
{
    if (obj == NULL || obj == Py_None) {
        const char *env = getenv("CUDALAB_GRAPH_KEEP_TEMPORARIES");
        *keep = env != NULL && strcmp(env, "1") == 0;
        return 0;
    }
    if (!PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "CUDAGraph(): 'keep_temporaries' expected a bool or None, got %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *keep = obj == Py_True;
    return 0;
}

static PyObject *
Graph_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"keep_temporaries", NULL};
    PyObject *keep_obj = NULL;
    bool keep;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$O:CUDAGraph", kwlist, &keep_obj) ||
        parse_keep_temporaries(keep_obj, &keep) < 0) {
        return NULL;
    }
    GraphObject *g = PyObject_New(GraphObject, type);
    if (g == NULL) {
        return NULL;
    }
    g->graph = NULL;
    g->exec = NULL;
    g->device = 0;
    g->capturing = g->launched = false;
    g->keep_temporaries = keep;
    g->capture_stream = g->launch_stream = NULL;
    g->ptrs = NULL;
    g->num_ptrs = g->cap_ptrs = 0;
    g->live_arrays = 0;
    return (PyObject *)g;
}

static void
Graph_dealloc(GraphObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    abort_capture(self);
    destroy_all(self);
    PyMem_Free(self->ptrs);
    type->tp_free((PyObject *)self);
    Py_DECREF(type);
}

PyDoc_STRVAR(Graph_capture_begin_doc,
"capture_begin(stream)\n--\n\n"
"Start capturing the work this thread enqueues on `stream` (a Stream, not the\n"
"legacy default stream). Prefer the ``with cudalab.graph(g):`` context.");

static PyObject *
Graph_capture_begin(GraphObject *self, PyObject *stream)
{
    cl_state *st = cl_state_from_type(Py_TYPE(self));
    cudaStream_t handle;
    int device, previous;
    if (cl_stream_handle(st, stream, "capture_begin", "stream", &handle, &device) < 0) {
        return NULL;
    }
    if (handle == NULL) {
        return cl_arg_error(PyExc_ValueError, "capture_begin", "stream",
                            "cannot capture on the legacy default stream; use a Stream()"),
               NULL;
    }
    if (self->capturing) {
        return graph_state_error(self, "capture_begin", "this CUDAGraph is already capturing");
    }
    if (self->exec != NULL) {
        return graph_state_error(self, "capture_begin",
                                 "this CUDAGraph already holds a captured graph; call reset() "
                                 "first");
    }
    if (tl_capture_graph != NULL) {
        return graph_state_error(self, "capture_begin",
                                 "this thread is already capturing another graph");
    }
    if (cl_device_enter(st, device, &previous) < 0) {
        return NULL;
    }
    cudaError_t err = cudaStreamBeginCapture(handle, cudaStreamCaptureModeThreadLocal);
    cl_device_exit(device, previous);
    CL_CUDA_CHECK(st, err);
    self->device = device;
    self->capturing = true;
    self->capture_stream = handle;
    self->num_ptrs = 0;
    tl_capture_graph = self;
    tl_capture_stream = handle;
    Py_RETURN_NONE;
fail:
    return NULL;
}

PyDoc_STRVAR(Graph_capture_end_doc,
"capture_end()\n--\n\nEnd the capture and instantiate the graph for replay().");

static PyObject *
Graph_capture_end(GraphObject *self, PyObject *unused)
{
    cl_state *st = cl_state_from_type(Py_TYPE(self));
    cudaGraph_t graph = NULL;
    int previous;
    if (!self->capturing || tl_capture_graph != self) {
        return graph_state_error(self, "capture_end",
                                 "this CUDAGraph is not capturing in this thread");
    }
    if (cl_device_enter(st, self->device, &previous) < 0) {
        abort_capture(self);
        return NULL;
    }
    cudaError_t err = end_capture(self, &graph);
    if (err == cudaSuccess) {
        self->graph = graph;
        err = cudaGraphInstantiateWithFlags(&self->exec, graph,
                                            cudaGraphInstantiateFlagAutoFreeOnLaunch);
        if (err != cudaSuccess) {
            self->exec = NULL;
        }
    }
    else if (graph != NULL) {
        (void)cudaGraphDestroy(graph);
    }
    cl_device_exit(self->device, previous);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        if (self->graph != NULL) {
            (void)cudaGraphDestroy(self->graph);
            self->graph = NULL;
        }
        self->num_ptrs = 0;
        CL_CUDA_CHECK(st, err);
    }
    Py_RETURN_NONE;
fail:
    return NULL;
}

PyDoc_STRVAR(Graph_abort_capture_doc,
"_abort_capture()\n--\n\nEnd a capture and discard it (used on errors).");

static PyObject *
Graph_abort_capture(GraphObject *self, PyObject *unused)
{
    abort_capture(self);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(Graph_replay_doc,
"replay()\n--\n\nLaunch the captured work on the current stream.");

/* replay() itself is an op (ops/graph.c): the frame around these two. */
int
cl_graph_replay_device(PyObject *graph, int *device)
{
    GraphObject *self = (GraphObject *)graph;
    if (self->exec == NULL) {
        graph_state_error(self, "replay",
                          self->capturing ? "the graph is still capturing"
                                          : "nothing captured yet (capture with "
                                            "`with cudalab.graph(g):` first)");
        return -1;
    }
    *device = self->device;
    return 0;
}

int
cl_graph_launch(PyObject *graph, cudaStream_t stream)
{
    GraphObject *self = (GraphObject *)graph;
    CL_CUDA_CHECK(cl_state_from_type(Py_TYPE(self)), cudaGraphLaunch(self->exec, stream));
    self->launched = true;
    self->launch_stream = stream;
    return 0;
fail:
    return -1;
}

PyDoc_STRVAR(Graph_reset_doc,
"reset()\n--\n\n"
"Destroy the captured graph so the object can capture again. Raises while\n"
"arrays created during the capture are alive (their memory is the graph's).");

static PyObject *
Graph_reset(GraphObject *self, PyObject *unused)
{
    if (self->capturing) {
        return graph_state_error(self, "reset", "the graph is capturing");
    }
    if (self->live_arrays > 0) {
        PyErr_Format(cl_state_from_type(Py_TYPE(self))->CudalabError,
                     "reset(): %zd array(s) created during capture are still alive; their "
                     "memory belongs to the graph (delete them first)",
                     self->live_arrays);
        return NULL;
    }
    destroy_all(self);
    Py_RETURN_NONE;
}

static PyObject *
Graph_get_capturing(GraphObject *self, void *c)
{
    return PyBool_FromLong(self->capturing);
}

static PyObject *
Graph_get_captured(GraphObject *self, void *c)
{
    return PyBool_FromLong(self->exec != NULL);
}

static PyObject *
Graph_get_keep_temporaries(GraphObject *self, void *c)
{
    return PyBool_FromLong(self->keep_temporaries);
}

static PyMethodDef Graph_methods[] = {
    {"capture_begin", (PyCFunction)Graph_capture_begin, METH_O, Graph_capture_begin_doc},
    {"capture_end", (PyCFunction)Graph_capture_end, METH_NOARGS, Graph_capture_end_doc},
    {"_abort_capture", (PyCFunction)Graph_abort_capture, METH_NOARGS, Graph_abort_capture_doc},
    {"replay", NULL, METH_NOARGS, Graph_replay_doc}, /* cl_graph_init's `replay` */
    {"reset", (PyCFunction)Graph_reset, METH_NOARGS, Graph_reset_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Graph_getset[] = {
    {"capturing", (getter)Graph_get_capturing, NULL, "True between capture begin and end.",
     NULL},
    {"captured", (getter)Graph_get_captured, NULL, "True when replay() has a graph to run.",
     NULL},
    {"keep_temporaries", (getter)Graph_get_keep_temporaries, NULL,
     "True when temporaries of the capture live until the next replay or reset().", NULL},
    {NULL},
};

PyDoc_STRVAR(Graph_doc,
"CUDAGraph(*, keep_temporaries=None)\n--\n\n"
"A captured CUDA graph. Capture with ``with cudalab.graph(g):``, then\n"
"``g.replay()`` runs the captured work again on the current stream.\n"
"Arrays created during capture keep fixed addresses: after each replay they\n"
"hold that replay's results.\n\n"
"Temporaries (arrays created and dropped during the capture) are freed inside\n"
"the graph, and CUDA may give a later allocation of the same graph the same\n"
"address. keep_temporaries=True keeps them until the next replay or reset()\n"
"instead (more memory, every allocation its own address), which\n"
"compute-sanitizer's memcheck needs to judge accesses correctly. None (the\n"
"default) reads CUDALAB_GRAPH_KEEP_TEMPORARIES from the environment ('1': keep).");

static PyType_Slot Graph_slots[] = {
    {Py_tp_doc, (void *)Graph_doc},
    {Py_tp_new, Graph_new},
    {Py_tp_dealloc, Graph_dealloc},
    {Py_tp_methods, Graph_methods},
    {Py_tp_getset, Graph_getset},
    {0, NULL},
};

static PyType_Spec Graph_spec = {
    .name = "cudalab.CUDAGraph",
    .basicsize = sizeof(GraphObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = Graph_slots,
};

int
cl_graph_init(PyObject *module, cl_state *st, PyCFunction replay)
{
    for (PyMethodDef *m = Graph_methods; m->ml_name != NULL; m++) {
        if (strcmp(m->ml_name, "replay") == 0) {
            m->ml_meth = replay;
        }
    }
    st->CUDAGraph_Type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Graph_spec, NULL);
    if (st->CUDAGraph_Type == NULL ||
        PyModule_AddObjectRef(module, "CUDAGraph", (PyObject *)st->CUDAGraph_Type) < 0) {
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(is_current_stream_capturing_doc,
"is_current_stream_capturing()\n--\n\n"
"True while this thread captures a CUDA graph (inside ``with cudalab.graph(...)``\n"
"or between ``CUDAGraph.capture_begin`` and ``capture_end``), as\n"
"torch.cuda.is_current_stream_capturing(). Work that must not be captured\n"
"(timing, host reads) checks it first.");

static PyObject *
is_current_stream_capturing(PyObject *module, PyObject *unused)
{
    return PyBool_FromLong(cl_graph_thread_capturing());
}

PyMethodDef cl_graph_methods[] = {
    {"is_current_stream_capturing", is_current_stream_capturing, METH_NOARGS,
     is_current_stream_capturing_doc},
    {NULL, NULL, 0, NULL},
};
