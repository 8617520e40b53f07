/* ops/: the compute operations, one family per file, each entry point built
 * on the op frame (core/op_frame.h).
 *
 *   elementwise.c  element-wise ops and DeviceArray's number protocol
 *   reduce.c       sum, mean, max, min, argmax; softmax, log_softmax
 *   transpose.c    the teaching versions of the 2-D transpose
 *   random.c       the device RNG (Philox)
 *   matmul.c       cuBLAS / cuBLASLt GEMMs (matmul_plan.c: handles, plan cache)
 *   linear.c       nn Linear: forward and backward GEMMs with fused epilogues
 *   optim.c        fused multi-tensor unscale, loss-scale update, SGD, AdamW
 *   loss.c         nn: the fused softmax cross-entropy (forward + backward)
 *   convnet.c      a conv network's forward as one compiled program (models)
 */
#ifndef CUDALAB_OPS_OPS_H
#define CUDALAB_OPS_OPS_H

#include "array/array.h"

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

/* DeviceArray's number protocol (array/array.c's slots point here). Binary slots
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
