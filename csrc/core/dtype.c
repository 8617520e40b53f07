/* NumPy dtypes <-> cl_dtype. bfloat16 is ml_dtypes' NumPy extension type, so
 * it has no fixed type number: we recognise it by its scalar type object. */
#include "core/core.h"

#include <math.h>
#include <string.h>

static const char *const dtype_names[CL_NUM_DTYPES] = {
    "bool", "int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64",
};

static const size_t dtype_sizes[CL_NUM_DTYPES] = {1, 1, 1, 4, 8, 2, 2, 4, 8};

const char *
cl_dtype_name(cl_dtype dtype)
{
    return dtype_names[dtype];
}

size_t
cl_itemsize(cl_dtype dtype)
{
    return dtype_sizes[dtype];
}

PyObject *
cl_supported_dtypes_text(void)
{
    return PyUnicode_FromString(
        "bool, int8, uint8, int32, int64, float16, bfloat16, float32, float64");
}

int
cl_dtype_init(PyObject *module, cl_state *st)
{
    static const int typenums[CL_NUM_DTYPES] = {
        NPY_BOOL, NPY_INT8, NPY_UINT8, NPY_INT32, NPY_INT64, NPY_FLOAT16, -1, NPY_FLOAT32,
        NPY_FLOAT64,
    };
    for (int i = 0; i < CL_NUM_DTYPES; i++) {
        if (typenums[i] >= 0) {
            st->descr[i] = PyArray_DescrFromType(typenums[i]);
            if (st->descr[i] == NULL) {
                return -1;
            }
        }
    }
    PyObject *ml_dtypes = PyImport_ImportModule("ml_dtypes");
    if (ml_dtypes == NULL) {
        return -1;
    }
    st->bfloat16_type = PyObject_GetAttrString(ml_dtypes, "bfloat16");
    Py_DECREF(ml_dtypes);
    if (st->bfloat16_type == NULL) {
        return -1;
    }
    if (!PyArray_DescrConverter(st->bfloat16_type, &st->descr[CL_BFLOAT16])) {
        return -1;
    }
    return 0;
}

int
cl_dtype_from_descr(cl_state *st, PyArray_Descr *descr)
{
    if (PyDataType_ISBYTESWAPPED(descr)) {
        return -1;
    }
    if ((PyObject *)descr->typeobj == st->bfloat16_type) {
        return CL_BFLOAT16;
    }
    Py_ssize_t size = PyDataType_ELSIZE(descr);
    switch (descr->kind) {
    case 'b':
        return size == 1 ? CL_BOOL : -1;
    case 'i':
        return size == 1 ? CL_INT8 : size == 4 ? CL_INT32 : size == 8 ? CL_INT64 : -1;
    case 'u':
        return size == 1 ? CL_UINT8 : -1;
    case 'f':
        return size == 2 ? CL_FLOAT16 : size == 4 ? CL_FLOAT32 : size == 8 ? CL_FLOAT64 : -1;
    default:
        return -1;
    }
}

int
cl_dtype_converter(cl_state *st, PyObject *obj, const char *func, const char *param,
                   cl_dtype *out)
{
    PyArray_Descr *descr = NULL;
    /* None means float64 to NumPy; callers decide their own default first. */
    if (obj == Py_None || !PyArray_DescrConverter(obj, &descr)) {
        PyErr_Clear();
        return cl_arg_error(PyExc_TypeError, func, param, "%R is not a NumPy dtype", obj);
    }
    int code = cl_dtype_from_descr(st, descr);
    if (code < 0) {
        PyObject *supported = cl_supported_dtypes_text();
        cl_arg_error(PyExc_TypeError, func, param,
                     "unsupported dtype %R%s (supported: %U)", (PyObject *)descr,
                     PyDataType_ISBYTESWAPPED(descr) ? " (non-native byte order)" : "",
                     supported);
        Py_XDECREF(supported);
        Py_DECREF(descr);
        return -1;
    }
    Py_DECREF(descr);
    *out = (cl_dtype)code;
    return 0;
}

/* np.can_cast(from, to, "same_kind") (rows: from). */
static const unsigned char same_kind_table[CL_NUM_DTYPES][CL_NUM_DTYPES] = {
    /*         b  i8 u8 i32 i64 f16 bf16 f32 f64 */
    /* b   */ {1, 1, 1, 1, 1, 1, 1, 1, 1},
    /* i8  */ {0, 1, 0, 1, 1, 1, 1, 1, 1},
    /* u8  */ {0, 1, 1, 1, 1, 1, 1, 1, 1},
    /* i32 */ {0, 1, 0, 1, 1, 1, 1, 1, 1},
    /* i64 */ {0, 1, 0, 1, 1, 1, 1, 1, 1},
    /* f16 */ {0, 0, 0, 0, 0, 1, 1, 1, 1},
    /* bf16*/ {0, 0, 0, 0, 0, 0, 1, 1, 1},
    /* f32 */ {0, 0, 0, 0, 0, 1, 1, 1, 1},
    /* f64 */ {0, 0, 0, 0, 0, 1, 1, 1, 1},
};

bool
cl_can_cast_same_kind(cl_dtype from, cl_dtype to)
{
    return same_kind_table[from][to] != 0;
}

void
cl_float_to_int_bytes(double x, cl_dtype dtype, void *out)
{
    /* [min, max] of each integer dtype; max + 1 is a power of two, exact in
     * double, so the comparisons below are exact (as in cl::saturate_to_int). */
    int64_t lo, hi;
    switch (dtype) {
    case CL_INT8: lo = INT8_MIN, hi = INT8_MAX; break;
    case CL_UINT8: lo = 0, hi = UINT8_MAX; break;
    case CL_INT32: lo = INT32_MIN, hi = INT32_MAX; break;
    default: lo = INT64_MIN, hi = INT64_MAX; break;
    }
    const double hi_plus_1 = 2.0 * (double)(hi / 2 + 1);
    int64_t v;
    if (isnan(x)) {
        v = 0;
    }
    else if (x >= hi_plus_1) {
        v = hi;
    }
    else if (x <= (double)lo) {
        v = lo;
    }
    else {
        v = (int64_t)x; /* truncates; in range, so defined */
    }
    int8_t i8 = (int8_t)v;
    uint8_t u8 = (uint8_t)v;
    int32_t i32 = (int32_t)v;
    switch (dtype) { /* memcpy: `out` may be any byte buffer */
    case CL_INT8: memcpy(out, &i8, 1); break;
    case CL_UINT8: memcpy(out, &u8, 1); break;
    case CL_INT32: memcpy(out, &i32, 4); break;
    default: memcpy(out, &v, 8); break;
    }
}
