/* Placeholder: elementwise ops and the number protocol land here (issue 3). */
#include "cudalab.h"

PyMethodDef cl_elementwise_methods[] = {
    {NULL, NULL, 0, NULL},
};

PyObject *cl_nb_add(PyObject *a, PyObject *b) { Py_RETURN_NOTIMPLEMENTED; }
PyObject *cl_nb_subtract(PyObject *a, PyObject *b) { Py_RETURN_NOTIMPLEMENTED; }
PyObject *cl_nb_multiply(PyObject *a, PyObject *b) { Py_RETURN_NOTIMPLEMENTED; }
PyObject *cl_nb_true_divide(PyObject *a, PyObject *b) { Py_RETURN_NOTIMPLEMENTED; }
PyObject *cl_nb_inplace_add(PyObject *a, PyObject *b) { Py_RETURN_NOTIMPLEMENTED; }
PyObject *cl_nb_inplace_subtract(PyObject *a, PyObject *b) { Py_RETURN_NOTIMPLEMENTED; }
PyObject *cl_nb_inplace_multiply(PyObject *a, PyObject *b) { Py_RETURN_NOTIMPLEMENTED; }
PyObject *cl_nb_inplace_true_divide(PyObject *a, PyObject *b) { Py_RETURN_NOTIMPLEMENTED; }
PyObject *cl_nb_negative(PyObject *a) { Py_RETURN_NOTIMPLEMENTED; }
PyObject *cl_nb_absolute(PyObject *a) { Py_RETURN_NOTIMPLEMENTED; }
