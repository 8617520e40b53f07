/* Placeholder: cuBLAS / cuBLASLt matmul lands here (issue 3). */
#include "cudalab.h"

PyMethodDef cl_blas_methods[] = {
    {NULL, NULL, 0, NULL},
};

PyObject *cl_nb_matrix_multiply(PyObject *a, PyObject *b) { Py_RETURN_NOTIMPLEMENTED; }
