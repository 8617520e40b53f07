/* CUDAGraph.replay(): the one method of runtime/graph.c's CUDAGraph that is
 * an op (profiled as "CUDAGraph.replay", run on the current stream of the
 * graph's device). runtime/ stands below the op frame, so module.c hands
 * this function to cl_graph_init for the type's method table. */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "runtime/runtime.h"
#include "core/core.h"

PyObject *
cl_graph_replay(PyObject *self, PyObject *unused)
{
    int device;
    if (cl_graph_replay_device(self, &device) < 0) {
        return NULL;
    }
    cl_op op;
    cl_op_init(&op, cl_state_from_type(Py_TYPE(self)), "CUDAGraph.replay");
    op.device = device;
    if (cl_op_begin(&op) < 0) {
        return NULL;
    }
    if (cl_graph_launch(self, op.stream) < 0) {
        return cl_op_end(&op, NULL, NULL);
    }
    /* What the graph does is not known here: no dtype, bytes or FLOPs. */
    cl_prof_info info = {.dtype = -1, .bytes = -1, .flops = -1, .out_ndim = -1};
    return cl_op_end(&op, Py_NewRef(Py_None), &info);
}
