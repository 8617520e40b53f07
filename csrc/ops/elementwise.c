/* Element-wise operations and DeviceArray's number protocol.
 *
 * The ops are the lines of the op table (cuda/ops/elementwise_ops.h): each
 * line with a signature becomes a module function here, with its docstring,
 * and _core._ELEMENTWISE_OPS names them (the package's exports, the
 * profiler's element-wise category and the tests read that tuple).
 *
 * The signatures (CL_EW_SIG_*): unary and binary (NumPy broadcasting,
 * scalars), axpy, clamp and where (three operands), gelu and the activation
 * backwards (approximate=); DeviceArray's + - * / += -= *= /= unary - abs()
 * (the number protocol) reach the same ops.
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
 * Each call goes validate (operands, result dtype, broadcast shape, out=;
 * no CUDA call) -> run (the op frame's begin, casts, the kernel, end). The
 * hot path (arrays of one dtype, `out` given) makes no Python calls and no
 * heap allocations. */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "core/core.h"

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

#undef B_
#undef I1
#undef U1
#undef I4
#undef I8
#undef F2
#undef BF
#undef F4
#undef F8

/* The range of an integer dtype (bool and floats: int64's). */
static void
int_range(cl_dtype d, long long *lo, long long *hi)
{
    switch (d) {
    case CL_INT8: *lo = INT8_MIN; *hi = INT8_MAX; break;
    case CL_UINT8: *lo = 0; *hi = UINT8_MAX; break;
    case CL_INT32: *lo = INT32_MIN; *hi = INT32_MAX; break;
    default: *lo = INT64_MIN; *hi = INT64_MAX; break;
    }
}

/* ---- the op table and the Python signatures ------------------------------------- */

typedef struct ew_spec {
    const char *name; /* the public function, for messages and the profiler */
    cl_ew_op op;
    cl_ew_sig sig;
    int nin;          /* operands the kernel reads */
    cl_ew_rule rule;
} ew_spec;

static const ew_spec ew_specs[CL_EW_NUM_OPS] = {
#define EW_SPEC_(ENUM, name, sig, nin, rule, ...)                                                 \
    {#name, CL_EW_##ENUM, CL_EW_SIG_##sig, nin, CL_EW_RULE_##rule},
    CL_EW_OPS(EW_SPEC_)
#undef EW_SPEC_
};

#define EW_MAX_PARAMS 5 /* the longest signature's parameters, and its NULL */

typedef struct ew_signature {
    const char *names[EW_MAX_PARAMS]; /* operands, then options, then "out" */
    int nops;                         /* the leading names that are operands */
    int nrequired;
    int out;                          /* where "out" is */
    int approximate;                  /* where "approximate" is (gelu's forms), or 0 */
} ew_signature;

static const ew_signature signatures[] = {
    [CL_EW_SIG_UNARY] = {{"a", "out", NULL}, 1, 1, 1},
    [CL_EW_SIG_BINARY] = {{"a", "b", "out", NULL}, 2, 2, 2},
    [CL_EW_SIG_AXPY] = {{"alpha", "x", "y", "out", NULL}, 3, 3, 3},
    [CL_EW_SIG_GELU] = {{"a", "approximate", "out", NULL}, 1, 1, 2, 1},
    [CL_EW_SIG_CLAMP] = {{"a", "lo", "hi", "out", NULL}, 3, 1, 3},
    [CL_EW_SIG_WHERE] = {{"cond", "a", "b", "out", NULL}, 3, 3, 3},
    [CL_EW_SIG_GRAD] = {{"grad", "x", "out", NULL}, 2, 2, 2},
    [CL_EW_SIG_GELU_GRAD] = {{"grad", "x", "approximate", "out", NULL}, 2, 2, 3, 2},
};

/* Each signature's text signature and Parameters/Returns sections. */
#define EW_DOC_RETURNS_PROMOTED                                                                   \
    "Returns\n-------\nDeviceArray\n    `out`, or a new array of the promoted dtype."
#define EW_TEXT_UNARY "(a, out=None)"
#define EW_DOC_UNARY                                                                              \
    "a : DeviceArray\n"                                                                           \
    "out : DeviceArray, optional\n"                                                               \
    "    Written in place; a's shape, any dtype the result casts to under\n"                      \
    "    NumPy's 'same_kind' rule. May be `a` itself.\n\n"                                        \
    "Returns\n-------\nDeviceArray\n    `out`, or a new array."
#define EW_TEXT_BINARY "(a, b, out=None)"
#define EW_DOC_BINARY                                                                             \
    "a, b : DeviceArray or scalar\n"                                                              \
    "    At least one a DeviceArray; NumPy broadcasting over any strides.\n"                      \
    "    Python scalars are weak (NEP 50): ``x + 2.0`` keeps x's float dtype.\n"                  \
    "out : DeviceArray, optional\n"                                                               \
    "    Written in place; exactly the broadcast shape, any dtype the result\n"                   \
    "    casts to under NumPy's 'same_kind' rule. May be `a` or `b` itself.\n\n"                  \
    EW_DOC_RETURNS_PROMOTED
#define EW_TEXT_AXPY "(alpha, x, y, out=None)"
#define EW_DOC_AXPY                                                                               \
    "alpha : scalar\n"                                                                            \
    "    A Python or NumPy real scalar (weak or strong like any other operand).\n"                \
    "x, y : DeviceArray or scalar\n"                                                              \
    "    At least one a DeviceArray; NumPy broadcasting.\n"                                       \
    "out : DeviceArray, optional\n"                                                               \
    "    Written in place (``axpy(a, x, y, out=y)`` is BLAS's axpy); the\n"                       \
    "    broadcast shape, a dtype the result casts to ('same_kind').\n\n"                         \
    "Returns\n-------\nDeviceArray"
#define EW_TEXT_GELU "(a, approximate='none', out=None)"
#define EW_DOC_GELU                                                                               \
    "a : DeviceArray\n"                                                                           \
    "approximate : {'none', 'tanh'}, optional\n"                                                  \
    "out : DeviceArray, optional\n"                                                               \
    "    Written in place; a's shape, a dtype the result casts to ('same_kind').\n\n"             \
    "Returns\n-------\nDeviceArray"
#define EW_TEXT_CLAMP "(a, lo=None, hi=None, out=None)"
#define EW_DOC_CLAMP                                                                              \
    "a : DeviceArray\n"                                                                           \
    "lo, hi : DeviceArray or scalar, optional\n"                                                  \
    "    The bounds, broadcast with `a`; at least one given (not None).\n"                        \
    "out : DeviceArray, optional\n"                                                               \
    "    Written in place; the broadcast shape, a dtype the result casts to\n"                    \
    "    ('same_kind'). May be `a` itself.\n\n"                                                   \
    EW_DOC_RETURNS_PROMOTED
#define EW_TEXT_WHERE "(cond, a, b, out=None)"
#define EW_DOC_WHERE                                                                              \
    "cond : DeviceArray\n"                                                                        \
    "    Any dtype: non-zero (NaN included) is true.\n"                                           \
    "a, b : DeviceArray or scalar\n"                                                              \
    "    The values where `cond` is true and where it is false.\n"                                \
    "out : DeviceArray, optional\n"                                                               \
    "    Written in place; the broadcast shape of all three, a dtype the\n"                       \
    "    result casts to ('same_kind'). May be `a` or `b` itself.\n\n"                            \
    EW_DOC_RETURNS_PROMOTED
#define EW_DOC_GRAD_OPERANDS_                                                                     \
    "grad : DeviceArray or scalar\n"                                                              \
    "    The gradient of the loss with respect to the activation's output.\n"                    \
    "x : DeviceArray or scalar\n"                                                                 \
    "    The activation's input. At least one of grad and x a DeviceArray;\n"                    \
    "    NumPy broadcasting over any strides.\n"
#define EW_DOC_GRAD_OUT_                                                                          \
    "out : DeviceArray, optional\n"                                                               \
    "    Written in place; the broadcast shape, a dtype the result casts to\n"                    \
    "    ('same_kind'). May be `grad` or `x` itself.\n\n"                                         \
    "Returns\n-------\nDeviceArray\n    `out`, or a new array: the gradient with respect to x."
#define EW_TEXT_GRAD "(grad, x, out=None)"
#define EW_DOC_GRAD EW_DOC_GRAD_OPERANDS_ EW_DOC_GRAD_OUT_
#define EW_TEXT_GELU_GRAD "(grad, x, approximate='none', out=None)"
#define EW_DOC_GELU_GRAD                                                                          \
    EW_DOC_GRAD_OPERANDS_                                                                         \
    "approximate : {'none', 'tanh'}, optional\n"                                                  \
    "    The GELU form whose derivative is taken (as gelu's).\n" EW_DOC_GRAD_OUT_

/* EW_IF_<sig>(...): its arguments for a signature, nothing for NONE. */
#define EW_IF_NONE(...)
#define EW_IF_UNARY(...) __VA_ARGS__
#define EW_IF_BINARY(...) __VA_ARGS__
#define EW_IF_AXPY(...) __VA_ARGS__
#define EW_IF_GELU(...) __VA_ARGS__
#define EW_IF_CLAMP(...) __VA_ARGS__
#define EW_IF_WHERE(...) __VA_ARGS__
#define EW_IF_GRAD(...) __VA_ARGS__
#define EW_IF_GELU_GRAD(...) __VA_ARGS__

/* ---- operands ------------------------------------------------------------------- */

enum ew_kind {
    K_ARRAY,      /* a DeviceArray (or, for _elementwise_result_type, a dtype) */
    K_STRONG,     /* a NumPy scalar: typed, promotes like a 0-d array */
    K_WEAK_BOOL,  /* Python bool */
    K_WEAK_INT,   /* Python int */
    K_WEAK_FLOAT, /* Python float */
};

#define EW_MAX_ARGS 3 /* clamp and where: three operands; axpy: x, y, alpha */

typedef struct ew_arg {
    enum ew_kind kind;
    PyObject *obj;     /* borrowed */
    DeviceArray *arr;  /* K_ARRAY with a real array; NULL otherwise */
    cl_dtype dtype;    /* K_ARRAY, K_STRONG */
    double f;          /* scalar value for a floating result dtype */
    long long i;       /* scalar value for an integer/bool result dtype */
    int i_overflow;    /* K_WEAK_INT outside int64: the sign of the excess, else 0 */
    const char *param;
} ew_arg;

enum ew_mode {
    EW_CALL,        /* a module function: anything unknown is a TypeError */
    EW_OPERATOR,    /* the number protocol: unknown types give NotImplemented */
    EW_RESULT_TYPE, /* _elementwise_result_type: NumPy dtypes stand for arrays */
};

/* One call of an element-wise op, from its operands to its result. */
typedef struct ew_call {
    cl_op op;              /* the frame: state, function name, device, stream, profiler */
    const ew_spec *spec;   /* the function called (signature, dtype rule) */
    enum ew_mode mode;
    cl_ew_op kop;          /* the kernel op (gelu's tanh form, clamp with one bound) */
    int nin;               /* the kernel's operands: arg[0 .. nin) */
    int nargs;             /* arg[nin] is axpy's alpha when nargs > nin */
    ew_arg arg[EW_MAX_ARGS];
    cl_dtype r;            /* the result dtype */
    int nd;
    Py_ssize_t shape[CL_MAX_NDIM];
    DeviceArray *out;      /* out=, or NULL */
} ew_call;

static void
ew_call_init(ew_call *c, cl_state *st, const ew_spec *spec, enum ew_mode mode)
{
    cl_op_init(&c->op, st, spec->name);
    c->spec = spec;
    c->mode = mode;
    c->kop = spec->op;
    c->nin = c->nargs = spec->nin;
    c->out = NULL;
    c->nd = 0;
}

static inline bool
is_device_array_type(PyTypeObject *t)
{
    /* The number slots receive operands of any type and no module: DeviceArray
     * is the only type whose nb_add is ours. */
    return t->tp_as_number != NULL && t->tp_as_number->nb_add == cl_nb_add;
}

static void
weak_int(PyObject *obj, ew_arg *a)
{
    int overflow = 0;
    a->kind = K_WEAK_INT;
    a->i = PyLong_AsLongLongAndOverflow(obj, &overflow);
    a->i_overflow = overflow;
    a->f = (double)a->i;
}

/* A NumPy scalar: strong, with its value. */
static int
numpy_scalar(ew_call *c, PyObject *obj, ew_arg *a)
{
    PyArray_Descr *descr = PyArray_DescrFromScalar(obj);
    if (descr == NULL) {
        return -1;
    }
    int code = cl_dtype_from_descr(c->op.st, descr);
    if (code < 0) {
        PyObject *supported = cl_supported_dtypes_text();
        cl_arg_error(PyExc_TypeError, c->op.func, a->param,
                     "unsupported dtype %R of a NumPy scalar (supported: %U)", (PyObject *)descr,
                     supported);
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
    else if (cl_dtype_is_int(a->dtype)) {
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

/* A NumPy dtype standing for an array of it (_elementwise_result_type). */
static int
dtype_operand(ew_call *c, PyObject *obj, ew_arg *a)
{
    int code = cl_dtype_from_descr(c->op.st, (PyArray_Descr *)obj);
    if (code < 0) {
        return cl_arg_error(PyExc_TypeError, c->op.func, a->param, "unsupported dtype %R", obj);
    }
    a->kind = K_ARRAY;
    a->dtype = (cl_dtype)code;
    return 0;
}

/* Classify an operand that may be an array or a real scalar. Returns 0, -1
 * with an exception set, or 1 when the type is simply not ours (only for
 * EW_OPERATOR: the number protocol then returns NotImplemented). */
static int
classify(ew_call *c, PyObject *obj, const char *param, ew_arg *a)
{
    *a = (ew_arg){.kind = K_ARRAY, .obj = obj, .param = param};
    if (CL_IS_DEVICEARRAY(c->op.st, obj)) {
        a->arr = (DeviceArray *)obj;
        a->dtype = a->arr->dtype;
        return cl_op_same_device(&c->op, a->arr, param);
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
        weak_int(obj, a);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (PyArray_IsScalar(obj, Generic)) {
        return numpy_scalar(c, obj, a);
    }
    if (PyFloat_Check(obj)) {
        a->kind = K_WEAK_FLOAT;
        a->f = PyFloat_AsDouble(obj);
        return a->f == -1.0 && PyErr_Occurred() ? -1 : 0;
    }
    if (PyLong_Check(obj)) {
        weak_int(obj, a);
        return PyErr_Occurred() ? -1 : 0;
    }
    if (c->mode == EW_RESULT_TYPE && PyArray_DescrCheck(obj)) {
        return dtype_operand(c, obj, a);
    }
    if (PyArray_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, c->op.func, param,
                            "host arrays (%.100s) are not accepted: cudalab never uploads "
                            "implicitly; copy it to the device with cudalab.asarray() first",
                            Py_TYPE(obj)->tp_name);
    }
    if (c->mode == EW_OPERATOR) {
        return 1;
    }
    return cl_arg_error(PyExc_TypeError, c->op.func, param,
                        "expected a cudalab.DeviceArray or a real scalar (bool, int, float), "
                        "got %.100s", Py_TYPE(obj)->tp_name);
}

/* An operand that must be an array (a unary op's a, clamp's a, where's cond). */
static int
array_operand(ew_call *c, PyObject *obj, const char *param, ew_arg *a)
{
    *a = (ew_arg){.kind = K_ARRAY, .obj = obj, .param = param};
    if (c->mode == EW_RESULT_TYPE && PyArray_DescrCheck(obj)) {
        return dtype_operand(c, obj, a);
    }
    if (cl_op_array(&c->op, obj, param, &a->arr) < 0) {
        return -1;
    }
    a->dtype = a->arr->dtype;
    return 0;
}

/* ---- the result dtype ----------------------------------------------------------- */

static const char *
weak_name(enum ew_kind k)
{
    return k == K_WEAK_BOOL ? "bool" : k == K_WEAK_INT ? "int" : "float";
}

/* NumPy 2 (NEP 50) promotion of arg[k0 .. nargs) (where's condition does not
 * take part): *out is a cl_dtype, or I2 when only int16 would do. */
static int
promoted_dtype(ew_call *c, int *out)
{
    const char *func = c->op.func;
    const int k0 = c->spec->rule == CL_EW_RULE_SELECT ? 1 : 0;
    int strong = -1;
    const ew_arg *first_strong = NULL;
    const ew_arg *int16_from[2] = {NULL, NULL}; /* the pair that made int16 */
    enum ew_kind weak = K_ARRAY;                /* none */
    for (int k = k0; k < c->nargs; k++) {
        const ew_arg *a = &c->arg[k];
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
    if (strong < 0 && k0 == 0) {
        return cl_arg_error(PyExc_TypeError, func, c->arg[0].param,
                            "at least one operand must be a cudalab.DeviceArray, got only "
                            "Python scalars (%s)", weak_name(weak));
    }
    if (strong < 0) {
        strong = CL_BOOL; /* where's two Python scalars: bool, int64 or float64 */
    }
    /* Weak Python scalars never change a dtype of their own kind or above. */
    if (weak == K_WEAK_FLOAT && (strong == I2 || !cl_dtype_is_float((cl_dtype)strong))) {
        strong = CL_FLOAT64;
    }
    else if (weak == K_WEAK_INT && strong == CL_BOOL) {
        strong = CL_INT64;
    }
    if (strong == I2 && c->spec->rule != CL_EW_RULE_TRUE_DIV) {
        return cl_arg_error(PyExc_TypeError, func, int16_from[1]->param,
                            "NumPy promotes %s and %s to int16, which cudalab does not "
                            "support; cast one operand with .astype() first",
                            cl_dtype_name(int16_from[0]->dtype),
                            cl_dtype_name(int16_from[1]->dtype));
    }
    *out = strong;
    return 0;
}

/* The op's rule applied to the promoted dtype. */
static int
apply_rule(ew_call *c, int promoted, cl_dtype *out)
{
    cl_dtype r = promoted == I2 ? CL_FLOAT64 : (cl_dtype)promoted; /* int16 / int16 */
    switch (c->spec->rule) {
    case CL_EW_RULE_NO_BOOL:
        if (r == CL_BOOL) {
            const ew_arg *first = c->arg[0].kind == K_ARRAY || c->arg[0].kind == K_STRONG
                                      ? &c->arg[0]
                                      : &c->arg[1];
            return cl_arg_error(PyExc_TypeError, c->op.func, first->param,
                                "%s is not supported for bool operands (NumPy refuses it "
                                "too); cast to an integer dtype with .astype() first",
                                c->kop == CL_EW_SUB   ? "subtraction"
                                : c->kop == CL_EW_NEG ? "negation"
                                                      : c->op.func);
        }
        break;
    case CL_EW_RULE_TRUE_DIV:
        r = cl_dtype_is_float(r) ? r : CL_FLOAT64;
        break;
    case CL_EW_RULE_FLOAT:
        if (r == CL_BOOL || r == CL_INT8 || r == CL_UINT8) {
            r = CL_FLOAT16;
        }
        else if (r == CL_INT32 || r == CL_INT64) {
            r = CL_FLOAT64;
        }
        break;
    case CL_EW_RULE_POW:
        r = r == CL_BOOL ? CL_INT8 : r; /* NumPy has no bool power loop */
        break;
    default:
        break;
    }
    *out = r;
    return 0;
}

/* Scalar values for the result dtype. NumPy 2 refuses a Python int that does
 * not fit an integer result dtype. */
static int
scalar_values(ew_call *c)
{
    for (int k = 0; k < c->nargs; k++) {
        ew_arg *a = &c->arg[k];
        if (a->kind != K_WEAK_INT) {
            continue;
        }
        if (cl_dtype_is_float(c->r)) {
            a->f = a->i_overflow ? PyLong_AsDouble(a->obj) : (double)a->i;
            if (a->f == -1.0 && PyErr_Occurred()) {
                return -1;
            }
            continue;
        }
        long long lo, hi;
        int_range(c->r, &lo, &hi);
        if (a->i_overflow || a->i < lo || a->i > hi) {
            return cl_arg_error(PyExc_OverflowError, c->op.func, a->param,
                                "Python integer %R out of bounds for %s", a->obj,
                                cl_dtype_name(c->r));
        }
    }
    return 0;
}

/* pow: an integer result refuses a negative scalar exponent, as NumPy does
 * (an exponent array is not checked: see the docstring). */
static int
check_pow_exponent(ew_call *c)
{
    const ew_arg *b = &c->arg[1];
    bool weak_negative = b->i_overflow < 0 || (b->i_overflow == 0 && b->i < 0);
    bool negative = (b->kind == K_WEAK_INT && weak_negative) ||
                    (b->kind == K_STRONG && cl_dtype_is_int(b->dtype) && b->i < 0);
    if (cl_dtype_is_int(c->r) && negative) {
        return cl_arg_error(PyExc_ValueError, c->op.func, b->param,
                            "Integers to negative integer powers are not allowed (as in "
                            "NumPy); use a float base or exponent");
    }
    return 0;
}

/* NumPy 2 (NEP 50) result dtype of the call, then the scalar values
 * converted for it. Raises TypeError for anything unsupported. */
static int
result_dtype(ew_call *c)
{
    int promoted = CL_BOOL;
    if (promoted_dtype(c, &promoted) < 0 || apply_rule(c, promoted, &c->r) < 0 ||
        scalar_values(c) < 0) {
        return -1;
    }
    return c->spec->rule == CL_EW_RULE_POW ? check_pow_exponent(c) : 0;
}

/* ---- operands of each signature --------------------------------------------------- */

/* approximate= picks the kernel op of gelu and gelu_grad: the tanh form's. */
static int
gelu_form(ew_call *c, PyObject *approximate)
{
    if (approximate == NULL) {
        return 0;
    }
    if (!PyUnicode_Check(approximate)) {
        return cl_arg_error(PyExc_TypeError, c->op.func, "approximate",
                            "expected 'none' or 'tanh', got %.100s",
                            Py_TYPE(approximate)->tp_name);
    }
    if (PyUnicode_CompareWithASCIIString(approximate, "tanh") == 0) {
        c->kop = c->spec->op == CL_EW_GELU ? CL_EW_GELU_TANH : CL_EW_GELU_GRAD_TANH;
    }
    else if (PyUnicode_CompareWithASCIIString(approximate, "none") != 0) {
        return cl_arg_error(PyExc_ValueError, c->op.func, "approximate",
                            "expected 'none' or 'tanh', got %R", approximate);
    }
    return 0;
}

/* axpy(alpha, x, y): the kernel reads x and y; alpha is arg[2]. */
static int
axpy_operands(ew_call *c, PyObject *const *objs)
{
    if (classify(c, objs[0], "alpha", &c->arg[2]) < 0) {
        return -1;
    }
    if (c->arg[2].kind == K_ARRAY) {
        return cl_arg_error(PyExc_TypeError, c->op.func, "alpha",
                            "expected a real scalar, got a DeviceArray (use mul and add for "
                            "an array-valued alpha)");
    }
    if (classify(c, objs[1], "x", &c->arg[0]) < 0 || classify(c, objs[2], "y", &c->arg[1]) < 0) {
        return -1;
    }
    c->nargs = 3;
    return 0;
}

/* numpy.clip ignores a Python int bound beyond the range of an integer `a`
 * (so clamp(x_uint8, 0, 1000) is allowed). */
static bool
bound_ignored(const ew_arg *bound, cl_dtype a_dtype, bool is_lo)
{
    if (!cl_dtype_is_int(a_dtype) || bound->kind != K_WEAK_INT || !PyLong_CheckExact(bound->obj)) {
        return false;
    }
    long long lo, hi;
    int_range(a_dtype, &lo, &hi);
    if (is_lo) {
        return bound->i_overflow < 0 || (bound->i_overflow == 0 && bound->i <= lo);
    }
    return bound->i_overflow > 0 || (bound->i_overflow == 0 && bound->i >= hi);
}

/* clamp(a, lo, hi): a missing or ignored bound leaves maximum or minimum. */
static int
clamp_operands(ew_call *c, PyObject *const *objs)
{
    ew_arg bound[2];
    bool has[2] = {objs[1] != NULL && objs[1] != Py_None, objs[2] != NULL && objs[2] != Py_None};
    if (array_operand(c, objs[0], "a", &c->arg[0]) < 0) {
        return -1;
    }
    if (!has[0] && !has[1]) {
        return cl_arg_error(PyExc_TypeError, c->op.func, "lo",
                            "at least one of 'lo' and 'hi' must be given (not None)");
    }
    if ((has[0] && classify(c, objs[1], "lo", &bound[0]) < 0) ||
        (has[1] && classify(c, objs[2], "hi", &bound[1]) < 0)) {
        return -1;
    }
    bool keep[2] = {has[0] && !bound_ignored(&bound[0], c->arg[0].dtype, true),
                    has[1] && !bound_ignored(&bound[1], c->arg[0].dtype, false)};
    if (!keep[0] && !keep[1]) {
        /* Both ignored: a itself, as maximum(a, the least value of a's dtype). */
        long long lo, hi;
        int_range(c->arg[0].dtype, &lo, &hi);
        bound[0] = (ew_arg){.kind = K_WEAK_INT, .obj = Py_None, .i = lo, .f = (double)lo,
                            .param = "lo"};
        keep[0] = true;
    }
    int n = 1;
    for (int k = 0; k < 2; k++) {
        if (keep[k]) {
            c->arg[n++] = bound[k];
        }
    }
    c->nin = c->nargs = n;
    c->kop = n == 3 ? CL_EW_CLAMP : keep[0] ? CL_EW_MAXIMUM : CL_EW_MINIMUM;
    return 0;
}

/* The operands of the call, as its signature names them, then its result
 * dtype. `objs` are the signature's parameters in order (NULL: absent). */
static int
ew_operands(ew_call *c, PyObject *const *objs)
{
    const char *const *names = signatures[c->spec->sig].names;
    int r = -1;
    switch (c->spec->sig) {
    case CL_EW_SIG_UNARY:
    case CL_EW_SIG_GELU:
        r = array_operand(c, objs[0], names[0], &c->arg[0]);
        break;
    case CL_EW_SIG_BINARY:
    case CL_EW_SIG_GRAD:
    case CL_EW_SIG_GELU_GRAD:
        r = classify(c, objs[0], names[0], &c->arg[0]) < 0 ||
                    classify(c, objs[1], names[1], &c->arg[1]) < 0
                ? -1
                : 0;
        break;
    case CL_EW_SIG_AXPY:
        r = axpy_operands(c, objs);
        break;
    case CL_EW_SIG_CLAMP:
        r = clamp_operands(c, objs);
        break;
    case CL_EW_SIG_WHERE:
        r = array_operand(c, objs[0], names[0], &c->arg[0]) < 0 ||
                    classify(c, objs[1], names[1], &c->arg[1]) < 0 ||
                    classify(c, objs[2], names[2], &c->arg[2]) < 0
                ? -1
                : 0;
        break;
    default:
        PyErr_SetString(PyExc_SystemError, "element-wise op without a signature");
        break;
    }
    return r < 0 ? -1 : result_dtype(c);
}

/* ---- validation: broadcast shape, out= ------------------------------------------- */

static int
broadcast_shape(ew_call *c)
{
    int nd = 0;
    for (int k = 0; k < c->nin; k++) {
        if (c->arg[k].arr != NULL && c->arg[k].arr->ndim > nd) {
            nd = c->arg[k].arr->ndim;
        }
    }
    for (int i = 0; i < nd; i++) {
        c->shape[i] = 1;
    }
    const DeviceArray *shaper = NULL;
    for (int k = 0; k < c->nin; k++) {
        const DeviceArray *a = c->arg[k].arr;
        if (a == NULL) {
            continue;
        }
        int off = nd - a->ndim;
        for (int i = 0; i < a->ndim; i++) {
            Py_ssize_t e = a->shape[i], *s = &c->shape[off + i];
            if (e == 1 || e == *s || *s == 1) {
                *s = e == 1 ? *s : e;
                continue;
            }
            PyObject *s1 = cl_shape_tuple(shaper->ndim, shaper->shape);
            PyObject *s2 = cl_shape_tuple(a->ndim, a->shape);
            if (s1 != NULL && s2 != NULL) {
                cl_arg_error(PyExc_ValueError, c->op.func, c->arg[k].param,
                             "operands could not be broadcast together with shapes %R %R", s1,
                             s2);
            }
            Py_XDECREF(s1);
            Py_XDECREF(s2);
            return -1;
        }
        shaper = a;
    }
    c->nd = nd;
    return 0;
}

/* Everything the run needs that can fail without a GPU: the shape, out= and
 * its dtype, at least one array operand. */
static int
ew_validate(ew_call *c, PyObject *out_obj)
{
    if (broadcast_shape(c) < 0 || cl_op_out(&c->op, out_obj, c->nd, c->shape, &c->out) < 0) {
        return -1;
    }
    if (c->out != NULL && !cl_can_cast_same_kind(c->r, c->out->dtype)) {
        return cl_op_out_cast_error(&c->op, c->r, c->out->dtype);
    }
    for (int k = 0; k < c->nin; k++) {
        if (c->arg[k].arr != NULL) {
            return 0;
        }
    }
    return cl_arg_error(PyExc_TypeError, c->op.func, c->arg[0].param,
                        "at least one operand must be a cudalab.DeviceArray");
}

/* ---- the run ---------------------------------------------------------------------- */

/* The dtype the kernel reads operand k in: where's condition is bool. */
static cl_dtype
operand_dtype(const ew_call *c, int k)
{
    return c->kop == CL_EW_WHERE && k == 0 ? CL_BOOL : c->r;
}

/* Element strides of `a` broadcast to the call's shape (0 on broadcast axes). */
static void
operand_strides(const ew_call *c, const DeviceArray *a, int64_t *s)
{
    int off = c->nd - a->ndim;
    Py_ssize_t item = (Py_ssize_t)cl_itemsize(a->dtype);
    for (int i = 0; i < c->nd; i++) {
        s[i] = (i < off || a->shape[i - off] == 1) ? 0 : a->strides[i - off] / item;
    }
}

/* A new result shaped like a dense, non-C-ordered operand of the full shape
 * (NumPy's order="K"), so `a.T + b.T` stays on the contiguous path. */
static DeviceArray *
new_result(ew_call *c)
{
    for (int k = 0; k < c->nin; k++) {
        const DeviceArray *a = c->arg[k].arr;
        if (a == NULL || a->ndim != c->nd) {
            continue;
        }
        bool same = true;
        for (int i = 0; i < c->nd; i++) {
            same = same && a->shape[i] == c->shape[i];
        }
        if (!same || cl_is_c_contiguous(a) || !cl_is_dense(a)) {
            break;
        }
        Py_ssize_t strides[CL_MAX_NDIM];
        Py_ssize_t in_item = (Py_ssize_t)cl_itemsize(a->dtype);
        Py_ssize_t out_item = (Py_ssize_t)cl_itemsize(c->r);
        for (int i = 0; i < c->nd; i++) {
            strides[i] = c->shape[i] > 1 ? a->strides[i] / in_item * out_item : out_item;
        }
        return cl_op_new(&c->op, c->nd, c->shape, strides, c->r);
    }
    return cl_op_new(&c->op, c->nd, c->shape, NULL, c->r);
}

/* Cast or copy operands where needed, make the result, run the kernel and
 * cast into out= when its dtype differs. tmp[k]: operand k's temporary. */
static int
ew_launch(ew_call *c, DeviceArray **tmp, DeviceArray **result)
{
    cl_state *st = c->op.st;
    const bool direct = c->out != NULL && c->out->dtype == c->r;
    cl_ew_operand in[EW_MAX_ARGS];
    int64_t in_strides[EW_MAX_ARGS][CL_MAX_NDIM], out_strides[CL_MAX_NDIM], shape[CL_MAX_NDIM];
    for (int k = 0; k < c->nin; k++) {
        DeviceArray *a = c->arg[k].arr;
        in[k] = (cl_ew_operand){NULL, NULL, c->arg[k].f, c->arg[k].i};
        if (a == NULL) {
            continue;
        }
        cl_dtype want = operand_dtype(c, k);
        if (a->dtype != want || (direct && cl_out_needs_copy(c->out, a))) {
            if ((tmp[k] = cl_op_contiguous_copy(&c->op, a, want)) == NULL) {
                return -1;
            }
            a = tmp[k];
        }
        cl_op_use(&c->op, a);
        operand_strides(c, a, in_strides[k]);
        in[k].data = a->data;
        in[k].strides = in_strides[k];
    }
    *result = direct ? c->out : new_result(c);
    if (*result == NULL) {
        return -1;
    }
    cl_op_use(&c->op, *result);
    Py_ssize_t item = (Py_ssize_t)cl_itemsize(c->r);
    for (int i = 0; i < c->nd; i++) {
        shape[i] = c->shape[i];
        out_strides[i] = (*result)->strides[i] / item;
    }
    cl_ew_operand alpha = {NULL, NULL, 0.0, 0};
    if (c->nargs > c->nin) { /* axpy */
        alpha.fvalue = c->arg[c->nin].f;
        alpha.ivalue = c->arg[c->nin].i;
    }
    if ((*result)->data != NULL) {
        CL_CUDA_CHECK(st, cl_elementwise(c->kop, c->r, (*result)->data, out_strides, c->nd, shape,
                                         in, &alpha, c->op.stream));
    }
    return c->out != NULL && !direct ? cl_op_copy_into(&c->op, c->out, *result) : 0;
fail:
    return -1;
}

/* FLOPs the profiler reports: one per result element for the arithmetic ops
 * (two for axpy's multiply-add) on floating dtypes; None (-1) for the rest,
 * whose cost is not a count of floating-point operations. */
static int64_t
elementwise_flops(const ew_call *c)
{
    int per;
    switch (c->kop) {
    case CL_EW_ADD:
    case CL_EW_SUB:
    case CL_EW_MUL:
    case CL_EW_DIV: per = 1; break;
    case CL_EW_AXPY: per = 2; break;
    default: return -1;
    }
    if (!cl_dtype_is_float(c->r)) {
        return -1;
    }
    int64_t n = 1;
    for (int i = 0; i < c->nd; i++) {
        n *= c->shape[i];
    }
    return per * n;
}

/* The profiler record: bytes of every array read and of the one written. */
static void
profile_info(const ew_call *c, const DeviceArray *result, cl_prof_info *info)
{
    *info = (cl_prof_info){.dtype = (int)c->r, .flops = elementwise_flops(c),
                           .out_ndim = c->nd, .out_shape = c->shape};
    const DeviceArray *written = c->out != NULL ? c->out : result;
    info->bytes = written != NULL ? cl_prof_nbytes(written) : 0;
    for (int k = 0; k < c->nin; k++) {
        if (c->arg[k].arr != NULL) {
            info->inputs[info->ninputs++] = c->arg[k].arr;
            info->bytes += cl_prof_nbytes(c->arg[k].arr);
        }
    }
}

/* Validate out= and the shape, then run on the device. The operands and the
 * result dtype are already set (ew_operands, or the number protocol). */
static PyObject *
ew_run(ew_call *c, PyObject *out_obj)
{
    if (ew_validate(c, out_obj) < 0 || cl_op_begin(&c->op) < 0) {
        return NULL;
    }
    DeviceArray *tmp[EW_MAX_ARGS] = {NULL, NULL, NULL};
    DeviceArray *result = NULL;
    PyObject *ret = NULL;
    if (ew_launch(c, tmp, &result) == 0) {
        ret = Py_NewRef(c->out != NULL ? (PyObject *)c->out : (PyObject *)result);
    }
    cl_prof_info info;
    if (CL_OP_PROFILING(&c->op)) {
        profile_info(c, result, &info);
    }
    if (result != NULL && result != c->out) {
        Py_DECREF(result);
    }
    for (int k = 0; k < EW_MAX_ARGS; k++) {
        Py_XDECREF(tmp[k]);
    }
    return cl_op_end(&c->op, ret, CL_OP_PROFILING(&c->op) ? &info : NULL);
}

/* ---- module functions ------------------------------------------------------------- */

/* Every function of the table: parse its signature, then its operands, run. */
static PyObject *
ew_entry(PyObject *module, const ew_spec *spec, PyObject *const *args, Py_ssize_t nargs,
         PyObject *kwnames)
{
    const ew_signature *sig = &signatures[spec->sig];
    PyObject *argv[EW_MAX_PARAMS];
    ew_call c;
    ew_call_init(&c, cl_state_from_module(module), spec, EW_CALL);
    if (cl_parse_args(spec->name, args, nargs, kwnames, sig->names, sig->nrequired, argv) < 0 ||
        (sig->approximate > 0 && gelu_form(&c, argv[sig->approximate]) < 0) ||
        ew_operands(&c, argv) < 0) {
        return NULL;
    }
    return ew_run(&c, argv[sig->out]);
}

/* One C function ew_py_<name> and its docstring per function of the table
 * (the prefix keeps abs, exp, log, pow, sqrt and tanh off the C library). */
#define EW_DEFINE_(ENUM, name, sig, doc)                                                          \
    PyDoc_STRVAR(ew_py_##name##_doc, #name EW_TEXT_##sig "\n--\n\n" doc                           \
                 "\n\nParameters\n----------\n" EW_DOC_##sig);                                    \
    static PyObject *ew_py_##name(PyObject *module, PyObject *const *args, Py_ssize_t nargs,       \
                                  PyObject *kwnames)                                              \
    {                                                                                             \
        return ew_entry(module, &ew_specs[CL_EW_##ENUM], args, nargs, kwnames);                   \
    }
#define EW_FUNCTION_(ENUM, name, sig, nin, rule, expr, doc)                                       \
    EW_IF_##sig(EW_DEFINE_(ENUM, name, sig, doc))
CL_EW_OPS(EW_FUNCTION_)
#undef EW_FUNCTION_
#undef EW_DEFINE_

/* _ELEMENTWISE_OPS: the names of the functions of the table, in its order
 * (the lines with a signature): the package re-exports each, the profiler
 * files their records as element-wise, the tests check each. */
#define EW_NAME_(ENUM, name, sig, ...) EW_IF_##sig(#name,)
static const char *const ew_function_names[] = {CL_EW_OPS(EW_NAME_)};
#undef EW_NAME_

int
cl_elementwise_init(PyObject *module)
{
    Py_ssize_t n = (Py_ssize_t)(sizeof ew_function_names / sizeof ew_function_names[0]);
    PyObject *names = PyTuple_New(n);
    for (Py_ssize_t i = 0; names != NULL && i < n; i++) {
        PyObject *name = PyUnicode_InternFromString(ew_function_names[i]);
        if (name == NULL) {
            Py_CLEAR(names);
            break;
        }
        PyTuple_SET_ITEM(names, i, name);
    }
    int r = names != NULL ? PyModule_AddObjectRef(module, "_ELEMENTWISE_OPS", names) : -1;
    Py_XDECREF(names);
    return r;
}

PyDoc_STRVAR(ew_py__elementwise_result_type_doc,
"_elementwise_result_type(func, *operands)\n--\n\n"
"The dtype `func` (an element-wise function's name) would return for these\n"
"operands, where a NumPy dtype stands for an array of that dtype and scalars\n"
"are themselves (None for an absent clamp bound). Raises the same\n"
"TypeError/OverflowError/ValueError the function would. For tests; needs\n"
"no GPU.");

static PyObject *
ew_py__elementwise_result_type(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    cl_state *st = cl_state_from_module(module);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0) {
        PyErr_SetString(PyExc_TypeError, "_elementwise_result_type() takes no keywords");
        return NULL;
    }
    const char *name = nargs >= 1 && PyUnicode_Check(args[0]) ? PyUnicode_AsUTF8(args[0]) : NULL;
    if (name == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError,
                            "_elementwise_result_type() needs a function name first");
        }
        return NULL;
    }
    const ew_spec *spec = NULL;
    for (int op = 0; spec == NULL && op < CL_EW_NUM_OPS; op++) {
        if (ew_specs[op].sig != CL_EW_SIG_NONE && strcmp(ew_specs[op].name, name) == 0) {
            spec = &ew_specs[op];
        }
    }
    if (spec == NULL) {
        PyErr_Format(PyExc_ValueError, "_elementwise_result_type(): unknown function %R",
                     args[0]);
        return NULL;
    }
    int nops = signatures[spec->sig].nops;
    if (nargs - 1 != nops) {
        PyErr_Format(PyExc_TypeError, "_elementwise_result_type(): %s takes %d operands", name,
                     nops);
        return NULL;
    }
    ew_call c;
    ew_call_init(&c, st, spec, EW_RESULT_TYPE);
    if (ew_operands(&c, args + 1) < 0) {
        return NULL;
    }
    return Py_NewRef((PyObject *)st->descr[c.r]);
}

#define EW_METHOD_(ENUM, name, sig, ...)                                                          \
    EW_IF_##sig({#name, (PyCFunction)(void (*)(void))ew_py_##name,                                \
                 METH_FASTCALL | METH_KEYWORDS, ew_py_##name##_doc},)

PyMethodDef cl_elementwise_methods[] = {
    CL_EW_OPS(EW_METHOD_)
    {"_elementwise_result_type", (PyCFunction)(void (*)(void))ew_py__elementwise_result_type,
     METH_FASTCALL | METH_KEYWORDS, ew_py__elementwise_result_type_doc},
    {NULL, NULL, 0, NULL},
};
#undef EW_METHOD_

/* ---- the number protocol --------------------------------------------------------- */

static PyObject *
nb_binary(PyObject *a, PyObject *b, cl_ew_op op, bool inplace)
{
    PyTypeObject *type = is_device_array_type(Py_TYPE(a))   ? Py_TYPE(a)
                         : is_device_array_type(Py_TYPE(b)) ? Py_TYPE(b)
                                                            : NULL;
    if (type == NULL) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    ew_call c;
    ew_call_init(&c, cl_state_from_type(type), &ew_specs[op], EW_OPERATOR);
    int r0 = classify(&c, a, "a", &c.arg[0]);
    int r1 = r0 == 0 ? classify(&c, b, "b", &c.arg[1]) : r0;
    if (r0 < 0 || r1 < 0) {
        return NULL;
    }
    if (r0 == 1 || r1 == 1) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (result_dtype(&c) < 0) {
        return NULL;
    }
    return ew_run(&c, inplace ? a : NULL);
}

static PyObject *
nb_unary(PyObject *a, cl_ew_op op)
{
    if (!is_device_array_type(Py_TYPE(a))) {
        Py_RETURN_NOTIMPLEMENTED;
    }
    ew_call c;
    ew_call_init(&c, cl_state_from_type(Py_TYPE(a)), &ew_specs[op], EW_OPERATOR);
    if (ew_operands(&c, &a) < 0) {
        return NULL;
    }
    return ew_run(&c, NULL);
}

PyObject *cl_nb_add(PyObject *a, PyObject *b) { return nb_binary(a, b, CL_EW_ADD, false); }
PyObject *cl_nb_subtract(PyObject *a, PyObject *b) { return nb_binary(a, b, CL_EW_SUB, false); }
PyObject *cl_nb_multiply(PyObject *a, PyObject *b) { return nb_binary(a, b, CL_EW_MUL, false); }
PyObject *cl_nb_true_divide(PyObject *a, PyObject *b) { return nb_binary(a, b, CL_EW_DIV, false); }
PyObject *cl_nb_inplace_add(PyObject *a, PyObject *b) { return nb_binary(a, b, CL_EW_ADD, true); }
PyObject *cl_nb_inplace_subtract(PyObject *a, PyObject *b)
{
    return nb_binary(a, b, CL_EW_SUB, true);
}
PyObject *cl_nb_inplace_multiply(PyObject *a, PyObject *b)
{
    return nb_binary(a, b, CL_EW_MUL, true);
}
PyObject *cl_nb_inplace_true_divide(PyObject *a, PyObject *b)
{
    return nb_binary(a, b, CL_EW_DIV, true);
}
PyObject *cl_nb_negative(PyObject *a) { return nb_unary(a, CL_EW_NEG); }
PyObject *cl_nb_absolute(PyObject *a) { return nb_unary(a, CL_EW_ABS); }
