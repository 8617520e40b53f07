/* Element-wise operations and DeviceArray's number protocol.
 *
 *   add sub mul div maximum minimum     binary, NumPy broadcasting, scalars
 *   axpy(alpha, x, y)                   alpha * x + y, one rounding (fma)
 *   neg abs exp log sqrt tanh sigmoid relu gelu(approximate=)    unary
 *   + - * / += -= *= /= unary - abs()   the number protocol
 *
 * Operands are DeviceArrays or real scalars (Python bool/int/float, NumPy
 * scalars); host arrays are refused (no implicit uploads). The result dtype
 * follows NumPy 2's promotion (NEP 50: Python scalars are weak) restricted to
 * the supported dtypes, computed on the host from the tables below (checked
 * against np.result_type in tests/test_elementwise_cpu.py). Mixed-dtype array
 * operands are cast to the result dtype first (a pooled temporary), so every
 * kernel sees one dtype; `out=` of another dtype gets the result through one
 * more cast (NumPy's "same_kind" rule decides which casts are allowed).
 *
 * Everything is validated before the GPU is touched. The hot path (arrays of
 * one dtype, `out` given) makes no Python calls and no heap allocations. */
#include "cudalab.h"

/* ---- promotion tables (order of cl_dtype: b i8 u8 i32 i64 f16 bf16 f32 f64) ---- */

#define B_ CL_BOOL
#define I1 CL_INT8
#define U1 CL_UINT8
#define I4 CL_INT32
#define I8 CL_INT64
#define F2 CL_FLOAT16
#define BF CL_BFLOAT16
#define F4 CL_FLOAT32
#define F8 CL_FLOAT64
/* I2 (int16, internal only) is defined with the table below. */

/* np.result_type for two arrays, with int16 (which we lack) as a tenth,
 * internal entry: int8 with uint8 gives it, and only true division (float64)
 * or a third operand (axpy) can turn it into a supported dtype. bfloat16
 * with int32/int64/float16/int16, where np.result_type itself raises, follows
 * the loops ml_dtypes' ufuncs pick. */
#define I2 9
#define PROMOTE_N (CL_NUM_DTYPES + 1)
static const signed char promote_table[PROMOTE_N][PROMOTE_N] = {
    /*         b   i8  u8  i32 i64 f16 bf16 f32 f64 i16 */
    /* b   */ {B_, I1, U1, I4, I8, F2, BF,  F4, F8, I2},
    /* i8  */ {I1, I1, I2, I4, I8, F2, BF,  F4, F8, I2},
    /* u8  */ {U1, I2, U1, I4, I8, F2, BF,  F4, F8, I2},
    /* i32 */ {I4, I4, I4, I4, I8, F8, F8,  F8, F8, I4},
    /* i64 */ {I8, I8, I8, I8, I8, F8, F8,  F8, F8, I8},
    /* f16 */ {F2, F2, F2, F8, F8, F2, F4,  F4, F8, F4},
    /* bf16*/ {BF, BF, BF, F8, F8, F4, BF,  F4, F8, F4},
    /* f32 */ {F4, F4, F4, F8, F8, F4, F4,  F4, F8, F4},
    /* f64 */ {F8, F8, F8, F8, F8, F8, F8,  F8, F8, F8},
    /* i16 */ {I2, I2, I2, I4, I8, F4, F4,  F4, F8, I2},
};

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

#undef B_
#undef I1
#undef U1
#undef I4
#undef I8
#undef F2
#undef BF
#undef F4
#undef F8

static inline bool
is_float_dtype(cl_dtype d)
{
    return d == CL_FLOAT16 || d == CL_BFLOAT16 || d == CL_FLOAT32 || d == CL_FLOAT64;
}

static inline bool
is_int_dtype(cl_dtype d)
{
    return d == CL_INT8 || d == CL_UINT8 || d == CL_INT32 || d == CL_INT64;
}

/* ---- op descriptions ---------------------------------------------------------- */

enum ew_rule {
    RULE_PROMOTE,  /* the promoted dtype (add, mul, maximum, minimum, axpy, abs) */
    RULE_NO_BOOL,  /* the promoted dtype, bool refused (sub, neg, relu) */
    RULE_TRUE_DIV, /* bool/int -> float64 (div) */
    RULE_FLOAT,    /* bool/int8/uint8 -> float16, int32/int64 -> float64 (exp, ...) */
};

typedef struct ew_spec {
    const char *name; /* public function name, for messages */
    cl_ew_op op;
    int nin;          /* operands (axpy: x and y; alpha is separate) */
    enum ew_rule rule;
} ew_spec;

static const ew_spec spec_add = {"add", CL_EW_ADD, 2, RULE_PROMOTE};
static const ew_spec spec_sub = {"sub", CL_EW_SUB, 2, RULE_NO_BOOL};
static const ew_spec spec_mul = {"mul", CL_EW_MUL, 2, RULE_PROMOTE};
static const ew_spec spec_div = {"div", CL_EW_DIV, 2, RULE_TRUE_DIV};
static const ew_spec spec_maximum = {"maximum", CL_EW_MAXIMUM, 2, RULE_PROMOTE};
static const ew_spec spec_minimum = {"minimum", CL_EW_MINIMUM, 2, RULE_PROMOTE};
static const ew_spec spec_axpy = {"axpy", CL_EW_AXPY, 2, RULE_PROMOTE};
static const ew_spec spec_neg = {"neg", CL_EW_NEG, 1, RULE_NO_BOOL};
static const ew_spec spec_abs = {"abs", CL_EW_ABS, 1, RULE_PROMOTE};
static const ew_spec spec_exp = {"exp", CL_EW_EXP, 1, RULE_FLOAT};
static const ew_spec spec_log = {"log", CL_EW_LOG, 1, RULE_FLOAT};
static const ew_spec spec_sqrt = {"sqrt", CL_EW_SQRT, 1, RULE_FLOAT};
static const ew_spec spec_tanh = {"tanh", CL_EW_TANH, 1, RULE_FLOAT};
static const ew_spec spec_sigmoid = {"sigmoid", CL_EW_SIGMOID, 1, RULE_FLOAT};
static const ew_spec spec_relu = {"relu", CL_EW_RELU, 1, RULE_NO_BOOL};
static const ew_spec spec_gelu = {"gelu", CL_EW_GELU, 1, RULE_FLOAT};
static const ew_spec spec_gelu_tanh = {"gelu", CL_EW_GELU_TANH, 1, RULE_FLOAT};

static const ew_spec *const all_specs[] = {
    &spec_add, &spec_sub, &spec_mul, &spec_div, &spec_maximum, &spec_minimum,
    &spec_axpy, &spec_neg, &spec_abs, &spec_exp, &spec_log, &spec_sqrt,
    &spec_tanh, &spec_sigmoid, &spec_relu, &spec_gelu, NULL,
};

/* ---- operands ------------------------------------------------------------------- */

enum ew_kind {
    K_ARRAY,      /* a DeviceArray (or, for _elementwise_result_type, a dtype) */
    K_STRONG,     /* a NumPy scalar: typed, promotes like a 0-d array */
    K_WEAK_BOOL,  /* Python bool */
    K_WEAK_INT,   /* Python int */
    K_WEAK_FLOAT, /* Python float */
};

#define EW_MAX_ARGS 3 /* axpy: x, y, alpha */

typedef struct ew_arg {
    enum ew_kind kind;
    PyObject *obj;   /* borrowed */
    DeviceArray *arr; /* K_ARRAY with a real array; NULL otherwise */
    cl_dtype dtype;  /* K_ARRAY, K_STRONG */
    double f;        /* scalar value for a floating result dtype */
    long long i;     /* scalar value for an integer/bool result dtype */
    int i_overflow;  /* K_WEAK_INT outside int64 */
    const char *param;
} ew_arg;

static inline bool
is_device_array_type(PyTypeObject *t)
{
    /* The number slots receive operands of any type and no module: DeviceArray
     * is the only type whose nb_add is ours. */
    return t->tp_as_number != NULL && t->tp_as_number->nb_add == cl_nb_add;
}

static int
host_array_error(const char *func, const char *param, PyObject *obj)
{
    return cl_arg_error(PyExc_TypeError, func, param,
                        "host arrays (%.100s) are not accepted: cudalab never uploads "
                        "implicitly; copy it to the device with cudalab.asarray() first",
                        Py_TYPE(obj)->tp_name);
}

/* Classify one operand. Returns 0, -1 with an exception set, or 1 when the
 * type is simply not ours (only with strict == false: the number protocol
 * then returns NotImplemented). `dtypes_as_arrays` lets a NumPy dtype stand
 * for an array of that dtype (for _elementwise_result_type). */
static int
classify(cl_state *st, PyObject *obj, const char *func, const char *param, ew_arg *a,
         bool strict, bool dtypes_as_arrays)
{
    a->obj = obj;
    a->arr = NULL;
    a->param = param;
    a->i_overflow = 0;
    a->f = 0.0;
    a->i = 0;
    if (CL_IS_DEVICEARRAY(st, obj)) {
        a->kind = K_ARRAY;
        a->arr = (DeviceArray *)obj;
        a->dtype = a->arr->dtype;
        return 0;
    }
    if (PyFloat_CheckExact(obj)) {
        a->kind = K_WEAK_FLOAT;
        a->f = PyFloat_AS_DOUBLE(obj);
        return 0;
    }
    if (PyBool_Check(obj)) {
        a->kind = K_WEAK_BOOL;
        a->i = obj == Py_True;
        a->f = (double)a->i;
        return 0;
    }
    if (PyLong_CheckExact(obj)) {
        goto weak_int;
    }
    if (PyArray_IsScalar(obj, Generic)) {
        PyArray_Descr *descr = PyArray_DescrFromScalar(obj);
        if (descr == NULL) {
            return -1;
        }
        int code = cl_dtype_from_descr(st, descr);
        if (code < 0) {
            PyObject *supported = cl_supported_dtypes_text();
            cl_arg_error(PyExc_TypeError, func, param,
                         "unsupported dtype %R of a NumPy scalar (supported: %U)",
                         (PyObject *)descr, supported);
            Py_XDECREF(supported);
            Py_DECREF(descr);
            return -1;
        }
        Py_DECREF(descr);
        a->kind = K_STRONG;
        a->dtype = (cl_dtype)code;
        if (a->dtype == CL_BOOL) {
            int t = PyObject_IsTrue(obj);
            if (t < 0) {
                return -1;
            }
            a->i = t;
            a->f = t;
        }
        else if (is_int_dtype(a->dtype)) {
            a->i = PyLong_AsLongLong(obj);
            if (a->i == -1 && PyErr_Occurred()) {
                return -1;
            }
            a->f = (double)a->i;
        }
        else {
            a->f = PyFloat_AsDouble(obj);
            if (a->f == -1.0 && PyErr_Occurred()) {
                return -1;
            }
        }
        return 0;
    }
    if (PyFloat_Check(obj)) {
        a->kind = K_WEAK_FLOAT;
        a->f = PyFloat_AsDouble(obj);
        return a->f == -1.0 && PyErr_Occurred() ? -1 : 0;
    }
    if (PyLong_Check(obj)) {
        goto weak_int;
    }
    if (dtypes_as_arrays && PyArray_DescrCheck(obj)) {
        int code = cl_dtype_from_descr(st, (PyArray_Descr *)obj);
        if (code < 0) {
            return cl_arg_error(PyExc_TypeError, func, param, "unsupported dtype %R", obj);
        }
        a->kind = K_ARRAY;
        a->dtype = (cl_dtype)code;
        return 0;
    }
    if (PyArray_Check(obj)) {
        return host_array_error(func, param, obj);
    }
    if (!strict) {
        return 1;
    }
    return cl_arg_error(PyExc_TypeError, func, param,
                        "expected a cudalab.DeviceArray or a real scalar (bool, int, float), "
                        "got %.100s", Py_TYPE(obj)->tp_name);

weak_int:
    a->kind = K_WEAK_INT;
    {
        int overflow = 0;
        a->i = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (a->i == -1 && PyErr_Occurred()) {
            return -1;
        }
        a->i_overflow = overflow != 0;
    }
    return 0;
}

static const char *
weak_name(enum ew_kind k)
{
    return k == K_WEAK_BOOL ? "bool" : k == K_WEAK_INT ? "int" : "float";
}

/* NumPy 2 (NEP 50) result dtype of `spec` over the operands, then the scalar
 * values converted for it. Raises TypeError for anything unsupported. */
static int
result_dtype(const ew_spec *spec, ew_arg *args, int nargs, cl_dtype *out)
{
    const char *func = spec->name;
    int strong = -1;
    const ew_arg *first_strong = NULL;
    const ew_arg *int16_from[2] = {NULL, NULL}; /* the pair that made int16 */
    enum ew_kind weak = K_ARRAY; /* none */
    for (int k = 0; k < nargs; k++) {
        ew_arg *a = &args[k];
        if (a->kind == K_ARRAY || a->kind == K_STRONG) {
            if (strong < 0) {
                strong = a->dtype;
                first_strong = a;
                continue;
            }
            int p = promote_table[strong][a->dtype];
            if (p == I2 && strong != I2) {
                int16_from[0] = first_strong;
                int16_from[1] = a;
            }
            strong = p;
        }
        else if (a->kind > weak) {
            weak = a->kind;
        }
    }
    if (strong < 0) {
        return cl_arg_error(PyExc_TypeError, func, args[0].param,
                            "at least one operand must be a cudalab.DeviceArray, got only "
                            "Python scalars (%s)", weak_name(weak));
    }
    /* Weak Python scalars never change a dtype of their own kind or above. */
    if (weak == K_WEAK_FLOAT && (strong == I2 || !is_float_dtype((cl_dtype)strong))) {
        strong = CL_FLOAT64;
    }
    else if (weak == K_WEAK_INT && strong == CL_BOOL) {
        strong = CL_INT64;
    }
    if (strong == I2) {
        if (spec->rule != RULE_TRUE_DIV) {
            return cl_arg_error(PyExc_TypeError, func, int16_from[1]->param,
                                "NumPy promotes %s and %s to int16, which cudalab does "
                                "not support; cast one operand with .astype() first",
                                cl_dtype_name(int16_from[0]->dtype),
                                cl_dtype_name(int16_from[1]->dtype));
        }
        strong = CL_FLOAT64; /* int16 / int16 is float64 */
    }
    cl_dtype r = (cl_dtype)strong;
    switch (spec->rule) {
    case RULE_PROMOTE:
        break;
    case RULE_NO_BOOL:
        if (r == CL_BOOL) {
            return cl_arg_error(PyExc_TypeError, func, first_strong->param,
                                "%s is not supported for bool operands (NumPy refuses it "
                                "too); cast to an integer dtype with .astype() first",
                                spec->op == CL_EW_SUB ? "subtraction"
                                : spec->op == CL_EW_NEG ? "negation"
                                                        : spec->name);
        }
        break;
    case RULE_TRUE_DIV:
        if (!is_float_dtype(r)) {
            r = CL_FLOAT64;
        }
        break;
    case RULE_FLOAT:
        if (r == CL_BOOL || r == CL_INT8 || r == CL_UINT8) {
            r = CL_FLOAT16;
        }
        else if (r == CL_INT32 || r == CL_INT64) {
            r = CL_FLOAT64;
        }
        break;
    }
    /* Scalar values for the result dtype. NumPy 2 refuses a Python int that
     * does not fit an integer result dtype. */
    for (int k = 0; k < nargs; k++) {
        ew_arg *a = &args[k];
        if (a->kind != K_WEAK_INT) {
            continue;
        }
        if (is_float_dtype(r)) {
            a->f = PyLong_AsDouble(a->obj);
            if (a->f == -1.0 && PyErr_Occurred()) {
                return -1;
            }
            continue;
        }
        long long lo, hi;
        switch (r) {
        case CL_INT8: lo = -128; hi = 127; break;
        case CL_UINT8: lo = 0; hi = 255; break;
        case CL_INT32: lo = INT32_MIN; hi = INT32_MAX; break;
        default: lo = INT64_MIN; hi = INT64_MAX; break;
        }
        if (a->i_overflow || a->i < lo || a->i > hi) {
            return cl_arg_error(PyExc_OverflowError, func, a->param,
                                "Python integer %R out of bounds for %s", a->obj,
                                cl_dtype_name(r));
        }
    }
    *out = r;
    return 0;
}

/* ---- broadcasting ------------------------------------------------------------ */

static int
broadcast_shape(const char *func, ew_arg *args, int nargs, int *ndim_out, Py_ssize_t *shape)
{
    int nd = 0;
    for (int k = 0; k < nargs; k++) {
        if (args[k].arr != NULL && args[k].arr->ndim > nd) {
            nd = args[k].arr->ndim;
        }
    }
    for (int i = 0; i < nd; i++) {
        shape[i] = 1;
    }
    const ew_arg *shaper = NULL;
    for (int k = 0; k < nargs; k++) {
        const DeviceArray *a = args[k].arr;
        if (a == NULL) {
            continue;
        }
        int off = nd - a->ndim;
        for (int i = 0; i < a->ndim; i++) {
            Py_ssize_t e = a->shape[i];
            if (e == 1 || e == shape[off + i]) {
                continue;
            }
            if (shape[off + i] == 1) {
                shape[off + i] = e;
                continue;
            }
            PyObject *s1 = cl_shape_tuple(shaper->arr->ndim, shaper->arr->shape);
            PyObject *s2 = cl_shape_tuple(a->ndim, a->shape);
            if (s1 != NULL && s2 != NULL) {
                cl_arg_error(PyExc_ValueError, func, args[k].param,
                             "operands could not be broadcast together with shapes %R %R", s1,
                             s2);
            }
            Py_XDECREF(s1);
            Py_XDECREF(s2);
            return -1;
        }
        shaper = &args[k];
    }
    *ndim_out = nd;
    return 0;
}

/* ---- the core: validate, then run on the device --------------------------------- */

/* Byte extent [lo, hi) an array's elements occupy. */
static void
extent(const DeviceArray *a, uintptr_t *lo, uintptr_t *hi)
{
    uintptr_t end = (uintptr_t)a->data;
    for (int i = 0; i < a->ndim; i++) {
        end += (uintptr_t)((a->shape[i] - 1) * a->strides[i]);
    }
    *lo = (uintptr_t)a->data;
    *hi = end + cl_itemsize(a->dtype);
}

/* Whether writing `out` while reading `a` (broadcast to out's shape) could
 * read an element another thread already overwrote: they overlap and `a` is
 * not exactly `out` element for element. */
static bool
needs_copy_for_overlap(const DeviceArray *out, const DeviceArray *a)
{
    if (cl_array_size(out) == 0 || cl_array_size(a) == 0) {
        return false;
    }
    uintptr_t olo, ohi, alo, ahi;
    extent(out, &olo, &ohi);
    extent(a, &alo, &ahi);
    if (ahi <= olo || ohi <= alo) {
        return false;
    }
    if (a->data != out->data || a->dtype != out->dtype) {
        return true;
    }
    int off = out->ndim - a->ndim;
    for (int i = 0; i < out->ndim; i++) {
        if (out->shape[i] == 1) {
            continue;
        }
        Py_ssize_t s = (i < off || a->shape[i - off] == 1) ? 0 : a->strides[i - off];
        if (s != out->strides[i]) {
            return true;
        }
    }
    return false;
}

/* Byte strides for a new result shaped like a dense, non-C-ordered operand
 * (NumPy's order="K"), so `a.T + b.T` stays on the contiguous path. */
static bool
k_order_strides(const ew_arg *args, int nargs, int nd, const Py_ssize_t *shape, cl_dtype r,
                Py_ssize_t *strides)
{
    for (int k = 0; k < nargs; k++) {
        const DeviceArray *a = args[k].arr;
        if (a == NULL || a->ndim != nd) {
            continue;
        }
        bool same = true;
        for (int i = 0; i < nd; i++) {
            same = same && a->shape[i] == shape[i];
        }
        if (!same || cl_is_c_contiguous(a) || !cl_is_dense(a)) {
            return false;
        }
        Py_ssize_t in_item = (Py_ssize_t)cl_itemsize(a->dtype);
        Py_ssize_t out_item = (Py_ssize_t)cl_itemsize(r);
        for (int i = 0; i < nd; i++) {
            strides[i] = shape[i] > 1 ? a->strides[i] / in_item * out_item : out_item;
        }
        return true;
    }
    return false;
}

/* FLOPs the profiler reports: one per result element for the arithmetic ops
 * (two for axpy's multiply-add) on floating dtypes; None (-1) for the rest,
 * whose cost is not a count of floating-point operations. */
static int64_t
elementwise_flops(cl_ew_op op, cl_dtype r, const Py_ssize_t *shape, int nd)
{
    int per;
    switch (op) {
    case CL_EW_ADD:
    case CL_EW_SUB:
    case CL_EW_MUL:
    case CL_EW_DIV: per = 1; break;
    case CL_EW_AXPY: per = 2; break;
    default: return -1;
    }
    if (!is_float_dtype(r)) {
        return -1;
    }
    int64_t n = 1;
    for (int i = 0; i < nd; i++) {
        n *= shape[i];
    }
    return per * n;
}

static PyObject *
ew_run(cl_state *st, const ew_spec *spec, ew_arg *args, int nargs, ew_arg *alpha,
       PyObject *out_obj)
{
    const char *func = spec->name;
    ew_arg all[EW_MAX_ARGS];
    int nall = nargs;
    for (int k = 0; k < nargs; k++) {
        all[k] = args[k];
    }
    if (alpha != NULL) {
        all[nall++] = *alpha;
    }
    cl_dtype r;
    if (result_dtype(spec, all, nall, &r) < 0) {
        return NULL;
    }
    for (int k = 0; k < nargs; k++) {
        args[k].f = all[k].f; /* weak ints now carry their value as a double too */
    }
    if (alpha != NULL) {
        alpha->f = all[nargs].f;
    }
    int nd;
    Py_ssize_t shape[CL_MAX_NDIM];
    if (broadcast_shape(func, args, nargs, &nd, shape) < 0) {
        return NULL;
    }
    DeviceArray *out = NULL;
    if (out_obj != NULL && out_obj != Py_None) {
        if (!CL_IS_DEVICEARRAY(st, out_obj)) {
            if (PyArray_Check(out_obj)) {
                return host_array_error(func, "out", out_obj), NULL;
            }
            return cl_arg_error(PyExc_TypeError, func, "out",
                                "expected a cudalab.DeviceArray or None, got %.100s",
                                Py_TYPE(out_obj)->tp_name), NULL;
        }
        out = (DeviceArray *)out_obj;
        bool same = out->ndim == nd;
        for (int i = 0; same && i < nd; i++) {
            same = out->shape[i] == shape[i];
        }
        if (!same) {
            PyObject *s1 = cl_shape_tuple(out->ndim, out->shape);
            PyObject *s2 = cl_shape_tuple(nd, shape);
            if (s1 != NULL && s2 != NULL) {
                cl_arg_error(PyExc_ValueError, func, "out",
                             "has shape %R but the broadcast result has shape %R", s1, s2);
            }
            Py_XDECREF(s1);
            Py_XDECREF(s2);
            return NULL;
        }
        if (!same_kind_table[r][out->dtype]) {
            return cl_arg_error(PyExc_TypeError, func, "out",
                                "Cannot cast ufunc '%s' output from dtype('%s') to "
                                "dtype('%s') with casting rule 'same_kind'",
                                func, cl_dtype_name(r), cl_dtype_name(out->dtype)), NULL;
        }
    }
    /* One device for every array. */
    int device = -1;
    const char *device_param = NULL;
    for (int k = 0; k <= nargs; k++) {
        const DeviceArray *a = k < nargs ? args[k].arr : out;
        const char *param = k < nargs ? args[k].param : "out";
        if (a == NULL) {
            continue;
        }
        if (device < 0) {
            device = a->device;
            device_param = param;
        }
        else if (a->device != device) {
            return cl_arg_error(PyExc_ValueError, func, param,
                                "is on device %d but '%s' is on device %d", a->device,
                                device_param, device), NULL;
        }
    }
    if (device < 0) { /* only dtypes stood in for arrays: nothing to run */
        return cl_arg_error(PyExc_TypeError, func, args[0].param,
                            "at least one operand must be a cudalab.DeviceArray"), NULL;
    }
    if (cl_require_device(st, func) < 0) {
        return NULL;
    }

    /* ---- on the device ---- */
    DeviceArray *tmp[EW_MAX_ARGS] = {NULL, NULL, NULL};
    DeviceArray *result = NULL; /* what the kernel writes */
    PyObject *ret = NULL;
    int previous;
    if (cl_device_enter(st, device, &previous) < 0) {
        return NULL;
    }
    cl_prof_scope ps;
    cl_prof_begin(st, &ps, func, device);
    bool direct = out != NULL && out->dtype == r;
    const DeviceArray *in_arr[2] = {NULL, NULL};
    for (int k = 0; k < nargs; k++) {
        DeviceArray *a = args[k].arr;
        if (a == NULL) {
            continue;
        }
        if (a->dtype != r || (direct && needs_copy_for_overlap(out, a))) {
            tmp[k] = cl_array_contiguous_copy(st, func, a, r);
            if (tmp[k] == NULL) {
                goto done;
            }
            a = tmp[k];
        }
        in_arr[k] = a;
    }
    if (direct) {
        result = out;
    }
    else {
        Py_ssize_t kstrides[CL_MAX_NDIM];
        bool k_order = out == NULL && k_order_strides(args, nargs, nd, shape, r, kstrides);
        result = cl_array_new(st, func, nd, shape, k_order ? kstrides : NULL, r);
        if (result == NULL) {
            goto done;
        }
    }
    {
        int64_t shape64[CL_MAX_NDIM], so[CL_MAX_NDIM], sin[2][CL_MAX_NDIM];
        cl_ew_operand ops[2], alpha_op;
        Py_ssize_t item = (Py_ssize_t)cl_itemsize(r);
        for (int i = 0; i < nd; i++) {
            shape64[i] = shape[i];
            so[i] = result->strides[i] / item;
        }
        for (int k = 0; k < nargs; k++) {
            const DeviceArray *a = in_arr[k];
            ops[k].fvalue = args[k].f;
            ops[k].ivalue = args[k].i;
            ops[k].data = a != NULL ? a->data : NULL;
            ops[k].strides = sin[k];
            if (a == NULL) {
                continue;
            }
            int off = nd - a->ndim;
            for (int i = 0; i < nd; i++) {
                sin[k][i] = (i < off || a->shape[i - off] == 1) ? 0 : a->strides[i - off] / item;
            }
        }
        if (alpha != NULL) {
            alpha_op.data = NULL;
            alpha_op.strides = NULL;
            alpha_op.fvalue = alpha->f;
            alpha_op.ivalue = alpha->i;
        }
        for (int k = 0; k < nargs; k++) { /* stream-safe frees (record_stream) */
            if (in_arr[k] != NULL) cl_array_note_stream(in_arr[k], cl_current_stream(st));
        }
        cl_array_note_stream(result, cl_current_stream(st));
        if (result->data != NULL) {
            CL_CUDA_CHECK(st, cl_elementwise(spec->op, r, result->data, so, nd, shape64, ops,
                                             alpha != NULL ? &alpha_op : NULL,
                                             cl_current_stream(st)));
        }
    }
    if (out != NULL && !direct) {
        if (cl_array_copy_into(st, out, result) < 0) {
            goto done;
        }
    }
    ret = Py_NewRef(out != NULL ? (PyObject *)out : (PyObject *)result);
    goto done;
fail:
    ret = NULL;
done:
    if (CL_PROF_ACTIVE(&ps)) {
        cl_prof_info info = {.dtype = (int)r, .flops = -1, .out_ndim = nd, .out_shape = shape};
        const DeviceArray *written = out != NULL ? out : result;
        info.bytes = written != NULL ? cl_prof_nbytes(written) : 0;
        for (int k = 0; k < nargs; k++) {
            if (args[k].arr != NULL) {
                info.inputs[info.ninputs++] = args[k].arr;
                info.bytes += cl_prof_nbytes(args[k].arr);
            }
        }
        info.flops = elementwise_flops(spec->op, r, shape, nd);
        cl_prof_end(st, &ps, ret != NULL ? &info : NULL);
    }
    if (result != NULL && result != out) {
        Py_DECREF(result);
    }
    for (int k = 0; k < EW_MAX_ARGS; k++) {
        Py_XDECREF(tmp[k]);
    }
    cl_device_exit(device, previous);
    return ret;
}

/* ---- module functions ------------------------------------------------------------ */

static PyObject *
binary_entry(PyObject *module, const ew_spec *spec, PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames)
{
    static const char *const names[] = {"a", "b", "out", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[3];
    ew_arg ea[2];
    if (cl_parse_args(spec->name, args, nargs, kwnames, names, 2, argv) < 0 ||
        classify(st, argv[0], spec->name, "a", &ea[0], true, false) < 0 ||
        classify(st, argv[1], spec->name, "b", &ea[1], true, false) < 0) {
        return NULL;
    }
    return ew_run(st, spec, ea, 2, NULL, argv[2]);
}

static PyObject *
unary_entry(PyObject *module, const ew_spec *spec, PyObject *const *args, Py_ssize_t nargs,
            PyObject *kwnames)
{
    static const char *const names[] = {"a", "out", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    ew_arg ea[1];
    if (cl_parse_args(spec->name, args, nargs, kwnames, names, 1, argv) < 0 ||
        classify(st, argv[0], spec->name, "a", &ea[0], true, false) < 0) {
        return NULL;
    }
    if (ea[0].kind != K_ARRAY) {
        return cl_arg_error(PyExc_TypeError, spec->name, "a",
                            "expected a cudalab.DeviceArray, got %.100s",
                            Py_TYPE(argv[0])->tp_name), NULL;
    }
    return ew_run(st, spec, ea, 1, NULL, argv[1]);
}

#define BINARY(name, summary, detail)                                                          \
    PyDoc_STRVAR(ew_##name##_doc,                                                               \
        #name "(a, b, out=None)\n--\n\n" summary "\n\n" detail                                  \
        "Parameters\n----------\n"                                                              \
        "a, b : DeviceArray or scalar\n"                                                        \
        "    At least one a DeviceArray; NumPy broadcasting over any strides.\n"                \
        "    Python scalars are weak (NEP 50): ``x + 2.0`` keeps x's float dtype.\n"            \
        "out : DeviceArray, optional\n"                                                         \
        "    Written in place; exactly the broadcast shape, any dtype the result\n"             \
        "    casts to under NumPy's 'same_kind' rule. May be `a` or `b` itself.\n\n"            \
        "Returns\n-------\nDeviceArray\n    `out`, or a new array of the promoted dtype.");   \
    static PyObject *ew_##name(PyObject *module, PyObject *const *args, Py_ssize_t nargs,       \
                          PyObject *kwnames)                                                    \
    {                                                                                           \
        return binary_entry(module, &spec_##name, args, nargs, kwnames);                        \
    }

#define UNARY(name, summary, detail)                                                           \
    PyDoc_STRVAR(ew_##name##_doc,                                                               \
        #name "(a, out=None)\n--\n\n" summary "\n\n" detail                                     \
        "Parameters\n----------\n"                                                              \
        "a : DeviceArray\n"                                                                     \
        "out : DeviceArray, optional\n"                                                         \
        "    Written in place; a's shape, any dtype the result casts to under\n"               \
        "    NumPy's 'same_kind' rule. May be `a` itself.\n\n"                                 \
        "Returns\n-------\nDeviceArray\n    `out`, or a new array.");                           \
    static PyObject *ew_##name(PyObject *module, PyObject *const *args, Py_ssize_t nargs,       \
                          PyObject *kwnames)                                                    \
    {                                                                                           \
        return unary_entry(module, &spec_##name, args, nargs, kwnames);                         \
    }

BINARY(add, "Element-wise ``a + b``.", "bool + bool is logical or, as in NumPy.\n\n")
BINARY(sub, "Element-wise ``a - b``.", "bool - bool is a TypeError, as in NumPy.\n\n")
BINARY(mul, "Element-wise ``a * b``.",
       "bool * bool is logical and. ``mul(x, 2.0, out=x)`` scales in place.\n\n")
BINARY(div, "Element-wise true division ``a / b``.",
       "Integer and bool operands give float64, as in NumPy.\n\n")
BINARY(maximum, "Element-wise maximum; a NaN in either operand gives NaN (NumPy).", "")
BINARY(minimum, "Element-wise minimum; a NaN in either operand gives NaN (NumPy).", "")

UNARY(neg, "Element-wise ``-a`` (integers wrap; bool is a TypeError, as in NumPy).", "")
UNARY(abs, "Element-wise absolute value (abs of the most negative integer wraps).", "")
UNARY(exp, "Element-wise exponential.",
      "float16/bfloat16 are computed in float32; integer inputs give float16\n"
      "(bool, int8, uint8) or float64 (int32, int64), as in NumPy.\n\n")
UNARY(log, "Element-wise natural logarithm (NaN for negative inputs).",
      "Result dtypes as for exp.\n\n")
UNARY(sqrt, "Element-wise square root (NaN for negative inputs).",
      "Result dtypes as for exp.\n\n")
UNARY(tanh, "Element-wise hyperbolic tangent.", "Result dtypes as for exp.\n\n")
UNARY(sigmoid, "Element-wise logistic sigmoid ``1 / (1 + exp(-a))``.",
      "Result dtypes as for exp.\n\n")
UNARY(relu, "Element-wise ``max(a, 0)`` in a's dtype (NaN stays NaN; bool refused).", "")

PyDoc_STRVAR(ew_gelu_doc,
"gelu(a, approximate='none', out=None)\n--\n\n"
"Element-wise GELU.\n\n"
"``approximate='none'``: ``0.5 a (1 + erf(a / sqrt(2)))``;\n"
"``approximate='tanh'``: ``0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))``\n"
"(the two forms of torch.nn.functional.gelu). Result dtypes as for exp.\n\n"
"Parameters\n----------\n"
"a : DeviceArray\n"
"approximate : {'none', 'tanh'}, optional\n"
"out : DeviceArray, optional\n"
"    Written in place; a's shape, a dtype the result casts to ('same_kind').\n\n"
"Returns\n-------\nDeviceArray");

static PyObject *
ew_gelu(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"a", "approximate", "out", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[3];
    ew_arg ea[1];
    const ew_spec *spec = &spec_gelu;
    if (cl_parse_args("gelu", args, nargs, kwnames, names, 1, argv) < 0 ||
        classify(st, argv[0], "gelu", "a", &ea[0], true, false) < 0) {
        return NULL;
    }
    if (argv[1] != NULL) {
        if (!PyUnicode_Check(argv[1])) {
            return cl_arg_error(PyExc_TypeError, "gelu", "approximate",
                                "expected 'none' or 'tanh', got %.100s",
                                Py_TYPE(argv[1])->tp_name), NULL;
        }
        if (PyUnicode_CompareWithASCIIString(argv[1], "tanh") == 0) {
            spec = &spec_gelu_tanh;
        }
        else if (PyUnicode_CompareWithASCIIString(argv[1], "none") != 0) {
            return cl_arg_error(PyExc_ValueError, "gelu", "approximate",
                                "expected 'none' or 'tanh', got %R", argv[1]), NULL;
        }
    }
    if (ea[0].kind != K_ARRAY) {
        return cl_arg_error(PyExc_TypeError, "gelu", "a",
                            "expected a cudalab.DeviceArray, got %.100s",
                            Py_TYPE(argv[0])->tp_name), NULL;
    }
    return ew_run(st, spec, ea, 1, NULL, argv[2]);
}

PyDoc_STRVAR(ew_axpy_doc,
"axpy(alpha, x, y, out=None)\n--\n\n"
"``alpha * x + y`` element-wise, as one fused multiply-add (one rounding).\n\n"
"One operation, so the result dtype is ``np.result_type(alpha, x, y)``\n"
"(NEP 50), not that of the two-step ``alpha * x + y``.\n\n"
"Parameters\n----------\n"
"alpha : scalar\n"
"    A Python or NumPy real scalar (weak or strong like any other operand).\n"
"x, y : DeviceArray or scalar\n"
"    At least one a DeviceArray; NumPy broadcasting.\n"
"out : DeviceArray, optional\n"
"    Written in place (``axpy(a, x, y, out=y)`` is BLAS's axpy); the\n"
"    broadcast shape, a dtype the result casts to ('same_kind').\n\n"
"Returns\n-------\nDeviceArray");

static PyObject *
ew_axpy(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"alpha", "x", "y", "out", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[4];
    ew_arg ea[2], alpha;
    if (cl_parse_args("axpy", args, nargs, kwnames, names, 3, argv) < 0 ||
        classify(st, argv[0], "axpy", "alpha", &alpha, true, false) < 0) {
        return NULL;
    }
    if (alpha.kind == K_ARRAY) {
        return cl_arg_error(PyExc_TypeError, "axpy", "alpha",
                            "expected a real scalar, got a DeviceArray (use mul and add for "
                            "an array-valued alpha)"), NULL;
    }
    if (classify(st, argv[1], "axpy", "x", &ea[0], true, false) < 0 ||
        classify(st, argv[2], "axpy", "y", &ea[1], true, false) < 0) {
        return NULL;
    }
    return ew_run(st, &spec_axpy, ea, 2, &alpha, argv[3]);
}

PyDoc_STRVAR(ew__elementwise_result_type_doc,
"_elementwise_result_type(func, *operands)\n--\n\n"
"The dtype `func` (an element-wise function's name) would return for these\n"
"operands, where a NumPy dtype stands for an array of that dtype and scalars\n"
"are themselves. Raises the same TypeError/OverflowError the function\n"
"would. For tests; needs no GPU.");

static PyObject *
ew__elementwise_result_type(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    static const char *const params[] = {"a", "b", "c"};
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_SetString(PyExc_TypeError, "_elementwise_result_type() takes no keywords");
        return NULL;
    }
    if (nargs < 1 || !PyUnicode_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "_elementwise_result_type() needs a function name first");
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(args[0]);
    if (name == NULL) {
        return NULL;
    }
    const ew_spec *spec = NULL;
    for (int k = 0; all_specs[k] != NULL; k++) {
        if (strcmp(all_specs[k]->name, name) == 0) {
            spec = all_specs[k];
        }
    }
    if (spec == NULL) {
        PyErr_Format(PyExc_ValueError, "_elementwise_result_type(): unknown function %R",
                     args[0]);
        return NULL;
    }
    Py_ssize_t want = spec->nin + (spec->op == CL_EW_AXPY ? 1 : 0);
    if (nargs - 1 != want) {
        PyErr_Format(PyExc_TypeError, "_elementwise_result_type(): %s takes %zd operands",
                     name, want);
        return NULL;
    }
    ew_arg ea[EW_MAX_ARGS];
    for (Py_ssize_t k = 0; k < want; k++) {
        if (classify(st, args[k + 1], name, params[k], &ea[k], true, true) < 0) {
            return NULL;
        }
    }
    cl_dtype r;
    if (result_dtype(spec, ea, (int)want, &r) < 0) {
        return NULL;
    }
    return Py_NewRef((PyObject *)st->descr[r]);
}

/* CL_FASTCALL with the C function named ew_<name> (abs, exp, log, sqrt and
 * tanh would collide with the C library). */
#define EW_ENTRY(name)                                                                          \
    {#name, (PyCFunction)(void (*)(void))ew_##name, METH_FASTCALL | METH_KEYWORDS,              \
     ew_##name##_doc}

PyMethodDef cl_elementwise_methods[] = {
    EW_ENTRY(add),
    EW_ENTRY(sub),
    EW_ENTRY(mul),
    EW_ENTRY(div),
    EW_ENTRY(maximum),
    EW_ENTRY(minimum),
    EW_ENTRY(axpy),
    EW_ENTRY(neg),
    EW_ENTRY(abs),
    EW_ENTRY(exp),
    EW_ENTRY(log),
    EW_ENTRY(sqrt),
    EW_ENTRY(tanh),
    EW_ENTRY(sigmoid),
    EW_ENTRY(relu),
    EW_ENTRY(gelu),
    EW_ENTRY(_elementwise_result_type),
    {NULL, NULL, 0, NULL},
};

/* ---- the number protocol ------------------------------------------------------- */

static PyObject *
nb_binary(PyObject *a, PyObject *b, const ew_spec *spec, bool inplace)
{
    PyTypeObject *type = is_device_array_type(Py_TYPE(a))   ? Py_TYPE(a)
                         : is_device_array_type(Py_TYPE(b)) ? Py_TYPE(b)
                                                            : NULL;
    if (type == NULL) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    cl_state *st = cl_state_from_type(type);
    ew_arg ea[2];
    int r0 = classify(st, a, spec->name, "a", &ea[0], false, false);
    if (r0 < 0) {
        return NULL;
    }
    int r1 = r0 == 0 ? classify(st, b, spec->name, "b", &ea[1], false, false) : 1;
    if (r1 < 0) {
        return NULL;
    }
    if (r0 == 1 || r1 == 1) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    return ew_run(st, spec, ea, 2, NULL, inplace ? a : NULL);
}

static PyObject *
nb_unary(PyObject *a, const ew_spec *spec)
{
    if (!is_device_array_type(Py_TYPE(a))) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    cl_state *st = cl_state_from_type(Py_TYPE(a));
    ew_arg ea[1];
    if (classify(st, a, spec->name, "a", &ea[0], true, false) < 0) {
        return NULL;
    }
    return ew_run(st, spec, ea, 1, NULL, NULL);
}

PyObject *cl_nb_add(PyObject *a, PyObject *b) { return nb_binary(a, b, &spec_add, false); }
PyObject *cl_nb_subtract(PyObject *a, PyObject *b) { return nb_binary(a, b, &spec_sub, false); }
PyObject *cl_nb_multiply(PyObject *a, PyObject *b) { return nb_binary(a, b, &spec_mul, false); }
PyObject *cl_nb_true_divide(PyObject *a, PyObject *b) { return nb_binary(a, b, &spec_div, false); }
PyObject *cl_nb_inplace_add(PyObject *a, PyObject *b) { return nb_binary(a, b, &spec_add, true); }
PyObject *cl_nb_inplace_subtract(PyObject *a, PyObject *b)
{
    return nb_binary(a, b, &spec_sub, true);
}
PyObject *cl_nb_inplace_multiply(PyObject *a, PyObject *b)
{
    return nb_binary(a, b, &spec_mul, true);
}
PyObject *cl_nb_inplace_true_divide(PyObject *a, PyObject *b)
{
    return nb_binary(a, b, &spec_div, true);
}
PyObject *cl_nb_negative(PyObject *a) { return nb_unary(a, &spec_neg); }
PyObject *cl_nb_absolute(PyObject *a) { return nb_unary(a, &spec_abs); }
