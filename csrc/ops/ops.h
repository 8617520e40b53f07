/* ops/: the operations, one family per file, each entry point built on the
 * op frame (frame/frame.h).
 *
 *   creation.c     asarray, asnumpy, ascontiguousarray, empty/zeros/ones/full
 *                  and their *_like forms
 *   copy.c         copies as ops: copy/astype, to the host (get, asnumpy), to
 *                  another device (to)
 *   copyto.c       copyto (np.copyto), across devices too
 *   interop.c      DLPack and the CUDA Array Interface, both ways
 *   elementwise.c  element-wise ops and DeviceArray's number protocol
 *   reduce.c       sum, mean, max, min, argmax; softmax, log_softmax
 *   transpose.c    the teaching versions of the 2-D transpose
 *   random.c       the device RNG (Philox)
 *   matmul.c       cuBLAS / cuBLASLt GEMMs (matmul_plan.c: handles, plan cache)
 *   linear.c       nn Linear: forward and backward GEMMs with fused epilogues
 *   optim.c        fused multi-tensor unscale, loss-scale update, SGD, AdamW
 *   loss.c         nn: the fused softmax cross-entropy (forward + backward)
 *   convnet.c      a conv network's forward as one compiled program (models)
 *   timing.c       kernels for the measurement harness (spin, empty launch)
 *   graph.c        CUDAGraph.replay (runtime/graph.c's type calls it)
 */
#ifndef CUDALAB_OPS_OPS_H
#define CUDALAB_OPS_OPS_H

#include "array/array.h"

/* ---- arrays: creation, copies, exchange ---------------------------------- */

/* copy.c. A C-contiguous copy of `a` in `dtype` as a user-visible op (copy,
 * astype, ascontiguousarray, asarray of a device array to another dtype):
 * profiled and NVTX-marked as `func`. */
DeviceArray *cl_array_copy_op(cl_state *st, const char *func, DeviceArray *a, cl_dtype dtype);
/* get() and asnumpy(): `a` copied to a new NumPy array, or into `out` (NULL:
 * none), checked and named as `func`. Asynchronous only with non_blocking and
 * a pinned `out`; a copy that must wait is refused during graph capture. */
PyObject *cl_array_to_host(cl_state *st, const char *func, DeviceArray *a, PyObject *out,
                           bool non_blocking);
/* Copy src (C-contiguous) into dst (C-contiguous, as many bytes, another
 * device) on `dst_stream`, the current stream of dst's device, ordered after
 * the source device's current stream, which then waits for the copy. The
 * caller's current device is put back. Returns 0 or -1. */
int cl_copy_between_devices(cl_state *st, DeviceArray *dst, cudaStream_t dst_stream,
                            const DeviceArray *src);
/* `a`'s values copied, as the op `func`, to `device` (another device than
 * a's): into `dst` (C-contiguous, a's shape and dtype, on `device`), or a
 * new C-contiguous array when dst is NULL. Returns a new reference to it. */
DeviceArray *cl_array_to_device(cl_state *st, const char *func, DeviceArray *a, int device,
                                DeviceArray *dst);

extern PyMethodDef cl_creation_methods[]; /* ops/creation.c */
extern PyMethodDef cl_copyto_methods[];   /* ops/copyto.c */

/* interop.c. DeviceArray.__cuda_array_interface__, __dlpack__, __dlpack_device__. */
PyObject *cl_array_cuda_array_interface(DeviceArray *self, void *closure);
PyObject *cl_array_dlpack(DeviceArray *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames);
PyObject *cl_array_dlpack_device(DeviceArray *self, PyObject *unused);
/* asarray's import of a foreign device array (DLPack producer on a CUDA
 * device, else __cuda_array_interface__): 1 with *out set, 0 when `obj` is
 * neither (nothing raised), -1 on error. */
int cl_import_device_object(cl_state *st, PyObject *obj, const char *func, PyObject **out);
extern PyMethodDef cl_interop_methods[]; /* ops/interop.c */

/* ---- compute ops (one file each; module.c adds every table) ---------------- */

extern PyMethodDef cl_elementwise_methods[]; /* ops/elementwise.c */
extern PyMethodDef cl_reduce_methods[];      /* ops/reduce.c (also softmax) */
extern PyMethodDef cl_transpose_methods[];   /* ops/transpose.c */
extern PyMethodDef cl_random_methods[];      /* ops/random.c */
extern PyMethodDef cl_blas_methods[];        /* ops/matmul.c */
extern PyMethodDef cl_nn_linear_methods[];   /* ops/linear.c */
extern PyMethodDef cl_optim_methods[];       /* ops/optim.c (nn: scaler, optimizers) */
extern PyMethodDef cl_loss_methods[];        /* ops/loss.c (nn) */
extern PyMethodDef cl_convnet_methods[];     /* ops/convnet.c (models) */
extern PyMethodDef cl_timing_methods[];      /* ops/timing.c */
/* The op tables' name tuples: _core._ELEMENTWISE_OPS (ops/elementwise.c) and
 * _core._REDUCTIONS (ops/reduce.c), generated from their X-macro tables. */
int cl_elementwise_init(PyObject *module);
int cl_reduce_init(PyObject *module);

/* CUDAGraph.replay() (ops/graph.c); module.c gives it to cl_graph_init. */
PyObject *cl_graph_replay(PyObject *self, PyObject *unused);

/* DeviceArray's number protocol (devicearray.c's slots point here). Binary slots
 * receive operands in either order and return Py_NotImplemented for types
 * they do not handle. ops/elementwise.c: */
PyObject *cl_nb_add(PyObject *a, PyObject *b);
PyObject *cl_nb_subtract(PyObject *a, PyObject *b);
PyObject *cl_nb_multiply(PyObject *a, PyObject *b);
PyObject *cl_nb_true_divide(PyObject *a, PyObject *b);
PyObject *cl_nb_inplace_add(PyObject *a, PyObject *b);
PyObject *cl_nb_inplace_subtract(PyObject *a, PyObject *b);
PyObject *cl_nb_inplace_multiply(PyObject *a, PyObject *b);
PyObject *cl_nb_inplace_true_divide(PyObject *a, PyObject *b);
PyObject *cl_nb_negative(PyObject *a);
PyObject *cl_nb_absolute(PyObject *a);
/* ops/matmul.c: */
PyObject *cl_nb_matrix_multiply(PyObject *a, PyObject *b);

#endif /* CUDALAB_OPS_OPS_H */
