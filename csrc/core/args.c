/* Argument parsing for METH_FASTCALL | METH_KEYWORDS functions.
 *
 * Python's own PyArg_ParseTupleAndKeywords does not take the vectorcall
 * layout, and _PyArg_Parser is private; this small parser maps positional
 * and keyword arguments onto named slots and leaves conversion to callers,
 * which is where the "<func>() argument '<param>'" messages come from.
 * cl_parse_real is the one conversion of a real-number argument. */
#include "core/core.h"

#include <math.h>

int
cl_parse_args(const char *func, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
              const char *const *names, int nrequired, PyObject **out)
{
    int n = 0;
    while (names[n] != NULL) {
        out[n] = NULL;
        n++;
    }
    if (nargs > n) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional argument%s (%zd given)",
                     func, n, n == 1 ? "" : "s", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        out[i] = args[i];
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        const char *kname = PyUnicode_AsUTF8(key);
        if (kname == NULL) {
            return -1;
        }
        int slot = -1;
        for (int i = 0; i < n; i++) {
            if (strcmp(kname, names[i]) == 0) {
                slot = i;
                break;
            }
        }
        if (slot < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%s'", func,
                         kname);
            return -1;
        }
        if (out[slot] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", func,
                         kname);
            return -1;
        }
        out[slot] = args[nargs + k];
    }
    for (int i = 0; i < nrequired; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", func,
                         names[i]);
            return -1;
        }
    }
    return 0;
}

/* A finite real number (int, float, NumPy real scalar; not complex or str). */
int
cl_parse_real(PyObject *obj, const char *func, const char *param, double *out)
{
    if (PyComplex_Check(obj) || PyArray_IsScalar(obj, ComplexFloating) || PyUnicode_Check(obj) ||
        PyBytes_Check(obj) || (!PyFloat_Check(obj) && !PyIndex_Check(obj) &&
                               Py_TYPE(obj)->tp_as_number == NULL)) {
        return cl_arg_error(PyExc_TypeError, func, param, "expected a real number, got %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    double v = PyFloat_AsDouble(obj);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return cl_arg_error(PyExc_TypeError, func, param, "expected a real number, got %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    if (!isfinite(v)) {
        return cl_arg_error(PyExc_ValueError, func, param, "must be finite, got %R", obj);
    }
    *out = v;
    return 0;
}

int
cl_parse_index(PyObject *obj, const char *func, const char *param, Py_ssize_t *out)
{
    if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
        return cl_expected_type_error(func, param, "an int", obj);
    }
    Py_ssize_t value = PyNumber_AsSsize_t(obj, PyExc_OverflowError);
    if (value == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return cl_arg_error(PyExc_ValueError, func, param, "%R is out of range", obj);
    }
    *out = value;
    return 0;
}

int
cl_parse_shape(PyObject *obj, const char *func, const char *param, int *ndim,
               Py_ssize_t *shape)
{
    if (!PyBool_Check(obj) && PyIndex_Check(obj) && !PyArray_Check(obj)) {
        *ndim = 1;
        if (cl_parse_index(obj, func, param, &shape[0]) < 0) {
            return -1;
        }
    }
    else if (PyTuple_Check(obj) || PyList_Check(obj)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
        if (n > CL_MAX_NDIM) {
            return cl_arg_error(PyExc_ValueError, func, param,
                                "%zd dimensions exceed the maximum of %d", n, CL_MAX_NDIM);
        }
        *ndim = (int)n;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (cl_parse_index(PySequence_Fast_GET_ITEM(obj, i), func, param, &shape[i]) < 0) {
                return -1;
            }
        }
    }
    else {
        return cl_expected_type_error(func, param, "an int or a tuple of ints", obj);
    }
    for (int i = 0; i < *ndim; i++) {
        if (shape[i] < 0) {
            return cl_arg_error(PyExc_ValueError, func, param,
                                "negative dimensions are not allowed, got %zd", shape[i]);
        }
    }
    return 0;
}
