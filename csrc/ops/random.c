/* Device random numbers (private functions wrapped by cudalab.random):
 *
 *   _random_normal(shape, mean=0.0, std=1.0, dtype=None, seed=0, offset=0)
 *   _random_uniform(shape, low=0.0, high=1.0, dtype=None, seed=0, offset=0)
 *   _random_integers(shape, low, high=None, dtype=None, seed=0, offset=0)
 *   _philox4x32_10(counter, key)   one Philox block, for known-answer tests
 *
 * (seed, offset) select the Philox4x32-10 stream: the key is the seed, the
 * offset is the per-call number cudalab.random advances (cuda/ops/random.cu
 * describes the counter layout). Argument messages name the public functions
 * as cudalab.random's own checks do ("normal() argument 'std': ..."); the op
 * frame, and so the profiler record and device errors, use the qualified
 * name ("random.normal"). Every argument is checked before the GPU is
 * touched. */
#include "ops/ops.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "core/core.h"

#include <math.h>

/* ---- scalar arguments --------------------------------------------------- */

/* Where an int argument lies (classify_int). */
enum { INT_S64, INT_U64, INT_ABOVE, INT_BELOW };

/* The int `obj` (not bool): INT_S64 with *s for [-2**63, 2**63), INT_U64
 * with *u for [2**63, 2**64), INT_ABOVE or INT_BELOW beyond; -1 on error. */
static int
classify_int(PyObject *obj, const char *func, const char *param, int64_t *s, uint64_t *u)
{
    if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, param, "expected an int, got %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    PyObject *v = PyNumber_Index(obj);
    if (v == NULL) {
        return -1;
    }
    int overflow, result = INT_S64;
    long long sv = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (sv == -1 && PyErr_Occurred()) {
        result = -1;
    }
    else if (overflow < 0) {
        result = INT_BELOW;
    }
    else if (overflow > 0) {
        unsigned long long uv = PyLong_AsUnsignedLongLong(v);
        if (uv == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            result = INT_ABOVE;
        }
        else {
            *u = (uint64_t)uv;
            result = INT_U64;
        }
    }
    else {
        *s = (int64_t)sv;
    }
    Py_DECREF(v);
    return result;
}

/* A Python int in [0, 2**64). */
static int
parse_u64(PyObject *obj, const char *func, const char *param, uint64_t *out)
{
    int64_t s = 0;
    int kind = classify_int(obj, func, param, &s, out);
    if (kind < 0 || kind == INT_U64) {
        return kind < 0 ? -1 : 0;
    }
    if (kind == INT_ABOVE) {
        return cl_arg_error(PyExc_ValueError, func, param, "must be less than 2**64, got %R",
                            obj);
    }
    if (kind == INT_BELOW || s < 0) {
        return cl_arg_error(PyExc_ValueError, func, param, "must be non-negative, got %R", obj);
    }
    *out = (uint64_t)s;
    return 0;
}

/* ---- the shared part of every call --------------------------------------- */

typedef enum rand_kind { RAND_NORMAL, RAND_UNIFORM, RAND_INTEGERS } rand_kind;

enum { ARG_SHAPE, ARG_P1, ARG_P2, ARG_DTYPE, ARG_SEED, ARG_OFFSET, NUM_ARGS };

struct rand_call;

/* One entry point: its keywords are (shape, p1, p2, dtype, seed, offset). */
typedef struct rand_spec {
    rand_kind kind;
    const char *name; /* argument messages: "normal" */
    const char *op;   /* the op frame's name: "random.normal" */
    const char *const keywords[NUM_ARGS + 1];
    int required;     /* leading arguments without a default */
    double p1, p2;    /* normal and uniform: the parameters' defaults */
    int (*finish)(struct rand_call *c); /* the op's own checks, after parse_call */
} rand_spec;

/* A parsed call: what the kernel launcher needs. */
typedef struct rand_call {
    const rand_spec *spec;
    cl_state *st;
    PyObject *argv[NUM_ARGS];
    int ndim;
    Py_ssize_t shape[CL_MAX_NDIM];
    cl_dtype dtype;
    uint64_t seed, offset;
    double a, b;   /* normal: mean, std; uniform: low, high rounded to dtype */
    int64_t low;   /* integers: low, and span = high - 1 - low (mod 2**64) */
    uint64_t span;
} rand_call;

/* `dtype` (None = float32 or int64), restricted to the kind's dtypes. */
static int
parse_dtype(rand_call *c)
{
    bool floats = c->spec->kind != RAND_INTEGERS;
    PyObject *obj = c->argv[ARG_DTYPE];
    if (obj == NULL || obj == Py_None) {
        c->dtype = floats ? CL_FLOAT32 : CL_INT64;
        return 0;
    }
    if (cl_dtype_converter(c->st, obj, c->spec->name, "dtype", &c->dtype) < 0) {
        return -1;
    }
    if (floats ? !cl_dtype_is_float(c->dtype) : !cl_dtype_is_int(c->dtype)) {
        return cl_arg_error(PyExc_TypeError, c->spec->name, "dtype", "expected %s, got %s",
                            floats ? "a float dtype (float16, bfloat16, float32, float64)"
                                   : "an integer dtype (int8, uint8, int32, int64)",
                            cl_dtype_name(c->dtype));
    }
    return 0;
}

/* The real parameter argv[i] (left at its default when absent). */
static int
parse_param(rand_call *c, int i, double *out)
{
    const char *param = c->spec->keywords[i];
    return c->argv[i] == NULL ? 0 : cl_parse_real(c->argv[i], c->spec->name, param, out);
}

/* The arguments every entry point shares: shape, seed, offset, dtype, and
 * for normal and uniform the two real parameters into c->a and c->b (which
 * hold their defaults). The integer bounds stay in argv[ARG_P1], argv[ARG_P2]. */
static int
parse_call(const rand_spec *spec, PyObject *module, PyObject *const *args, Py_ssize_t nargs,
           PyObject *kwnames, rand_call *c)
{
    c->spec = spec;
    c->st = cl_state_from_module(module);
    c->seed = 0;
    c->offset = 0;
    c->a = spec->p1;
    c->b = spec->p2;
    if (cl_parse_args(spec->name, args, nargs, kwnames, spec->keywords, spec->required,
                      c->argv) < 0 ||
        cl_parse_shape(c->argv[ARG_SHAPE], spec->name, "shape", &c->ndim, c->shape) < 0) {
        return -1;
    }
    if (c->argv[ARG_SEED] != NULL &&
        parse_u64(c->argv[ARG_SEED], spec->name, "seed", &c->seed) < 0) {
        return -1;
    }
    if (c->argv[ARG_OFFSET] != NULL &&
        parse_u64(c->argv[ARG_OFFSET], spec->name, "offset", &c->offset) < 0) {
        return -1;
    }
    if (spec->kind != RAND_INTEGERS &&
        (parse_param(c, ARG_P1, &c->a) < 0 || parse_param(c, ARG_P2, &c->b) < 0)) {
        return -1;
    }
    return parse_dtype(c);
}

static cudaError_t
fill(const rand_call *c, void *data, int64_t n, cudaStream_t stream)
{
    switch (c->spec->kind) {
    case RAND_NORMAL:
        return cl_random_normal(data, c->dtype, n, c->a, c->b, c->seed, c->offset, stream);
    case RAND_UNIFORM:
        return cl_random_uniform(data, c->dtype, n, c->a, c->b, c->seed, c->offset, stream);
    default:
        return cl_random_integers(data, c->dtype, n, c->low, c->span, c->seed, c->offset,
                                  stream);
    }
}

/* A new C-contiguous array of the call's shape and dtype, filled on the
 * current device's current stream. */
static PyObject *
generate(const rand_call *c)
{
    cl_op op;
    cl_op_init(&op, c->st, c->spec->op);
    if (cl_op_begin(&op) < 0) {
        return NULL;
    }
    DeviceArray *out = cl_op_new(&op, c->ndim, c->shape, NULL, c->dtype);
    if (out != NULL && cl_array_size(out) > 0) {
        CL_CUDA_CHECK(op.st, fill(c, out->data, (int64_t)cl_array_size(out), op.stream));
    }
    goto done;
fail:
    Py_CLEAR(out);
done:;
    cl_prof_info info = {.dtype = (int)c->dtype, .flops = -1, .out_ndim = c->ndim,
                         .out_shape = c->shape};
    info.bytes = out != NULL ? cl_prof_nbytes(out) : 0; /* written once */
    return cl_op_end(&op, (PyObject *)out, CL_OP_PROFILING(&op) ? &info : NULL);
}

/* An entry point: parse, the op's own checks, then generate. */
static PyObject *
random_entry(const rand_spec *spec, PyObject *module, PyObject *const *args, Py_ssize_t nargs,
             PyObject *kwnames)
{
    rand_call c;
    if (parse_call(spec, module, args, nargs, kwnames, &c) < 0 || spec->finish(&c) < 0) {
        return NULL;
    }
    return generate(&c);
}

/* ---- normal -------------------------------------------------------------- */

PyDoc_STRVAR(_random_normal_doc,
"_random_normal(shape, mean=0.0, std=1.0, dtype=None, seed=0, offset=0)\n--\n\n"
"Private: cudalab.random.normal's kernel call (Philox stream (seed, offset)).\n\n"
"Parameters\n----------\nshape : int or tuple of int\nmean, std : float\n"
"    Finite; std >= 0.\ndtype : float16, bfloat16, float32 (None) or float64\n"
"seed, offset : int\n    In [0, 2**64).");

static int
normal_check(rand_call *c)
{
    if (c->b < 0.0) {
        return cl_arg_error(PyExc_ValueError, c->spec->name, "std", "must be >= 0, got %R",
                            c->argv[ARG_P2]);
    }
    return 0;
}

static PyObject *
_random_normal(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const rand_spec spec = {
        RAND_NORMAL, "normal", "random.normal",
        {"shape", "mean", "std", "dtype", "seed", "offset", NULL}, 1, 0.0, 1.0, normal_check};
    return random_entry(&spec, module, args, nargs, kwnames);
}

/* ---- uniform ------------------------------------------------------------- */

/* `x` rounded to nearest into `dtype`, as NumPy (ml_dtypes for bfloat16)
 * converts it; the result is exactly representable in dtype. Returns 1 (no
 * exception) when x is beyond the dtype's range (it would round to inf). */
static int
round_to_dtype(cl_state *st, double x, cl_dtype dtype, double *out)
{
    /* |x| at or above max + half an ulp rounds to infinity. */
    static const double limits[CL_NUM_DTYPES] = {
        [CL_FLOAT16] = 65520.0,
        [CL_BFLOAT16] = 3.3895313892515355e38,  /* (2 - 2**-8) * 2**127 */
        [CL_FLOAT32] = 3.4028235677973366e38,   /* (2 - 2**-24) * 2**127 */
    };
    if (dtype == CL_FLOAT64) {
        *out = x;
        return 0;
    }
    if (fabs(x) >= limits[dtype]) {
        return 1;
    }
    if (dtype == CL_FLOAT32) {
        *out = (double)(float)x;
        return 0;
    }
    PyObject *value = PyFloat_FromDouble(x);
    if (value == NULL) {
        return -1;
    }
    PyArray_Descr *descr = st->descr[dtype];
    Py_INCREF(descr); /* stolen */
    PyObject *arr = PyArray_FromAny(value, descr, 0, 0, NPY_ARRAY_FORCECAST, NULL);
    Py_DECREF(value);
    if (arr == NULL) {
        return -1;
    }
    PyObject *as64 = PyArray_Cast((PyArrayObject *)arr, NPY_FLOAT64);
    Py_DECREF(arr);
    if (as64 == NULL) {
        return -1;
    }
    *out = *(double *)PyArray_DATA((PyArrayObject *)as64);
    Py_DECREF(as64);
    return 0;
}

/* The uniform bound `*x` of parameter `param`, rounded into the dtype in place. */
static int
uniform_bound(rand_call *c, const char *param, double *x)
{
    double rounded;
    int r = round_to_dtype(c->st, *x, c->dtype, &rounded);
    if (r == 1) {
        PyObject *v = PyFloat_FromDouble(*x);
        if (v != NULL) {
            cl_arg_error(PyExc_ValueError, c->spec->name, param, "%R overflows %s", v,
                         cl_dtype_name(c->dtype));
            Py_DECREF(v);
        }
        return -1;
    }
    if (r == 0) {
        *x = rounded;
    }
    return r;
}

/* ValueError: high <= low once both are rounded into the dtype. */
static int
uniform_order_error(const rand_call *c, double low, double high)
{
    PyObject *lo = PyFloat_FromDouble(low), *hi = PyFloat_FromDouble(high);
    PyObject *lo_r = PyFloat_FromDouble(c->a), *hi_r = PyFloat_FromDouble(c->b);
    if (lo != NULL && hi != NULL && lo_r != NULL && hi_r != NULL) {
        cl_arg_error(PyExc_ValueError, c->spec->name, "high",
                     "must be greater than low once both are rounded to %s (got low=%R, "
                     "high=%R, rounded %R and %R)",
                     cl_dtype_name(c->dtype), lo, hi, lo_r, hi_r);
    }
    Py_XDECREF(lo);
    Py_XDECREF(hi);
    Py_XDECREF(lo_r);
    Py_XDECREF(hi_r);
    return -1;
}

PyDoc_STRVAR(_random_uniform_doc,
"_random_uniform(shape, low=0.0, high=1.0, dtype=None, seed=0, offset=0)\n--\n\n"
"Private: cudalab.random.uniform's kernel call (Philox stream (seed, offset)).\n\n"
"Parameters\n----------\nshape : int or tuple of int\nlow, high : float\n"
"    Finite; rounded to `dtype` first, and then low < high is required.\n"
"dtype : float16, bfloat16, float32 (None) or float64\n"
"seed, offset : int\n    In [0, 2**64).");

/* low and high (c->a, c->b) rounded into the dtype; then low < high. */
static int
uniform_check(rand_call *c)
{
    double low = c->a, high = c->b;
    if (uniform_bound(c, "low", &c->a) < 0 || uniform_bound(c, "high", &c->b) < 0) {
        return -1;
    }
    return c->a < c->b ? 0 : uniform_order_error(c, low, high);
}

static PyObject *
_random_uniform(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const rand_spec spec = {
        RAND_UNIFORM, "uniform", "random.uniform",
        {"shape", "low", "high", "dtype", "seed", "offset", NULL}, 1, 0.0, 1.0, uniform_check};
    return random_entry(&spec, module, args, nargs, kwnames);
}

/* ---- integers ------------------------------------------------------------ */

/* An integer bound: its int64 value, or exactly 2**63 (a valid exclusive
 * high for int64), or beyond [-2**63, 2**63] on either side. */
typedef struct int_bound {
    int64_t value;
    bool is_2_63;
    int beyond; /* -1 below, +1 above, 0 inside */
} int_bound;

static int
parse_bound(PyObject *obj, const char *func, const char *param, int_bound *b)
{
    uint64_t u = 0;
    int kind = classify_int(obj, func, param, &b->value, &u);
    b->is_2_63 = kind == INT_U64 && u == (1ull << 63);
    b->beyond = kind == INT_BELOW ? -1 : (kind == INT_ABOVE || (kind == INT_U64 && !b->is_2_63));
    return kind < 0 ? -1 : 0;
}

/* low and span of [low, high) (or [0, low) without high) for the dtype,
 * with NumPy's Generator.integers bounds rules. */
static int
parse_int_range(rand_call *c)
{
    const char *func = c->spec->name, *dname = cl_dtype_name(c->dtype);
    PyObject *low_obj = c->argv[ARG_P1];
    bool no_high = c->argv[ARG_P2] == NULL || c->argv[ARG_P2] == Py_None;
    /* With high=None the range is [0, low): `low` is then the exclusive bound. */
    const char *high_param = no_high ? "low" : "high";
    PyObject *high_obj = no_high ? low_obj : c->argv[ARG_P2];
    int_bound lo = {0, false, 0}, hi = {0, false, 0};
    if ((!no_high && parse_bound(low_obj, func, "low", &lo) < 0) ||
        parse_bound(high_obj, func, high_param, &hi) < 0) {
        return -1;
    }
    int64_t min_d, max_d;
    switch (c->dtype) {
    case CL_INT8: min_d = -128; max_d = 127; break;
    case CL_UINT8: min_d = 0; max_d = 255; break;
    case CL_INT32: min_d = INT32_MIN; max_d = INT32_MAX; break;
    default: min_d = INT64_MIN; max_d = INT64_MAX; break;
    }
    if (!no_high && (lo.beyond != 0 || lo.is_2_63 || lo.value < min_d || lo.value > max_d)) {
        return cl_arg_error(PyExc_ValueError, func, "low",
                            "%R is out of bounds for %s (allowed %lld to %lld)", low_obj, dname,
                            (long long)min_d, (long long)max_d);
    }
    /* high is exclusive: high - 1 <= max_d. */
    if (hi.beyond > 0 || (hi.is_2_63 && c->dtype != CL_INT64) ||
        (!hi.is_2_63 && hi.beyond == 0 && hi.value > max_d && hi.value - 1 > max_d)) {
        return cl_arg_error(PyExc_ValueError, func, high_param,
                            "%R is out of bounds for %s (it is exclusive, so at most %lld + 1)",
                            high_obj, dname, (long long)max_d);
    }
    if (hi.beyond < 0 || (!hi.is_2_63 && hi.value <= lo.value)) {
        if (no_high) {
            return cl_arg_error(PyExc_ValueError, func, "low",
                                "must be positive when high is None (the range is [0, low)), "
                                "got %R",
                                high_obj);
        }
        return cl_arg_error(PyExc_ValueError, func, "high",
                            "must be greater than low (got low=%R, high=%R)", low_obj, high_obj);
    }
    c->low = lo.value;
    c->span = (hi.is_2_63 ? (uint64_t)1 << 63 : (uint64_t)hi.value) - 1u - (uint64_t)lo.value;
    return 0; /* span: high - 1 - low >= 0, modulo 2**64 */
}

PyDoc_STRVAR(_random_integers_doc,
"_random_integers(shape, low, high=None, dtype=None, seed=0, offset=0)\n--\n\n"
"Private: cudalab.random.integers's kernel call (Philox stream (seed, offset)).\n\n"
"Parameters\n----------\nshape : int or tuple of int\nlow, high : int\n"
"    Values in [low, high), or [0, low) when high is None; both bounds must\n"
"    fit `dtype` (high is exclusive, so it may be one past the maximum).\n"
"dtype : int8, uint8, int32 or int64 (None)\n"
"seed, offset : int\n    In [0, 2**64).");

static PyObject *
_random_integers(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const rand_spec spec = {
        RAND_INTEGERS, "integers", "random.integers",
        {"shape", "low", "high", "dtype", "seed", "offset", NULL}, 2, 0.0, 0.0, parse_int_range};
    return random_entry(&spec, module, args, nargs, kwnames);
}

/* ---- Philox known answers ------------------------------------------------ */

/* A sequence of exactly `n` ints in [0, 2**32). */
static int
parse_words(PyObject *obj, const char *param, int n, uint32_t *out)
{
    const char *func = "_philox4x32_10";
    if (!PyTuple_Check(obj) && !PyList_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, param,
                            "expected a tuple or list of %d ints, got %.100s", n,
                            Py_TYPE(obj)->tp_name);
    }
    if (PySequence_Fast_GET_SIZE(obj) != n) {
        return cl_arg_error(PyExc_ValueError, func, param, "expected %d words, got %zd", n,
                            PySequence_Fast_GET_SIZE(obj));
    }
    for (int i = 0; i < n; i++) {
        uint64_t v;
        if (parse_u64(PySequence_Fast_GET_ITEM(obj, i), func, param, &v) < 0) {
            return -1;
        }
        if (v > 0xFFFFFFFFull) {
            return cl_arg_error(PyExc_ValueError, func, param,
                                "word %d does not fit in 32 bits", i);
        }
        out[i] = (uint32_t)v;
    }
    return 0;
}

PyDoc_STRVAR(_philox4x32_10_doc,
"_philox4x32_10(counter, key)\n--\n\n"
"Private, for tests: one Philox4x32-10 block computed on the device by the\n"
"same function the random kernels use, in a one-thread kernel. Waits for\n"
"the result.\n\n"
"Parameters\n----------\ncounter : sequence of 4 ints in [0, 2**32)\n"
"key : sequence of 2 ints in [0, 2**32)\n\n"
"Returns\n-------\ntuple of 4 int");

static PyObject *
_philox4x32_10(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"counter", "key", NULL};
    cl_op op;
    cl_op_init(&op, cl_state_from_module(module), "_philox4x32_10");
    PyObject *argv[2];
    uint32_t counter[4], key[2], words[4];
    if (cl_parse_args(op.func, args, nargs, kwnames, names, 2, argv) < 0 ||
        parse_words(argv[0], "counter", 4, counter) < 0 ||
        parse_words(argv[1], "key", 2, key) < 0 || cl_op_begin(&op) < 0) {
        return NULL;
    }
    const Py_ssize_t shape[1] = {4};
    PyObject *result = NULL;
    cudaError_t err;
    DeviceArray *buf = cl_op_new(&op, 1, shape, NULL, CL_INT32);
    if (buf == NULL) {
        goto fail;
    }
    CL_CUDA_CHECK(op.st, cl_philox4x32_10((uint32_t *)buf->data, counter, key, op.stream));
    /* Into pageable memory: the copy itself waits for the stream. */
    Py_BEGIN_ALLOW_THREADS
    err = cudaMemcpyAsync(words, buf->data, sizeof words, cudaMemcpyDeviceToHost, op.stream);
    if (err == cudaSuccess) {
        err = cudaStreamSynchronize(op.stream);
    }
    Py_END_ALLOW_THREADS
    CL_CUDA_CHECK(op.st, err);
    result = Py_BuildValue("(kkkk)", (unsigned long)words[0], (unsigned long)words[1],
                           (unsigned long)words[2], (unsigned long)words[3]);
fail:
    Py_XDECREF(buf);
    return cl_op_end(&op, result, NULL);
}

PyMethodDef cl_random_methods[] = {
    CL_FASTCALL(_random_normal),
    CL_FASTCALL(_random_uniform),
    CL_FASTCALL(_random_integers),
    CL_FASTCALL(_philox4x32_10),
    {NULL, NULL, 0, NULL},
};
