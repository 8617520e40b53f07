/* Device random numbers (private functions wrapped by cudalab.random):
 *
 *   _random_normal(shape, mean=0.0, std=1.0, dtype=None, seed=0, offset=0)
 *   _random_uniform(shape, low=0.0, high=1.0, dtype=None, seed=0, offset=0)
 *   _random_integers(shape, low, high=None, dtype=None, seed=0, offset=0)
 *   _philox4x32_10(counter, key)   one Philox block, for known-answer tests
 *
 * (seed, offset) select the Philox4x32-10 stream: the key is the seed, the
 * offset is the per-call number cudalab.random advances (cuda/random.cu
 * describes the counter layout). Error messages name the public functions
 * (normal, uniform, integers). Every argument is checked before the GPU is
 * touched. */
#include "cudalab.h"

#include <math.h>

static bool
is_float_dtype(cl_dtype d)
{
    return d == CL_FLOAT16 || d == CL_BFLOAT16 || d == CL_FLOAT32 || d == CL_FLOAT64;
}

static bool
is_int_dtype(cl_dtype d)
{
    return d == CL_INT8 || d == CL_UINT8 || d == CL_INT32 || d == CL_INT64;
}

/* A finite real number (int, float, NumPy real scalar; not bool-as-text,
 * complex or str). */
static int
parse_real(PyObject *obj, const char *func, const char *param, double *out)
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

/* A Python int in [0, 2**64). */
static int
parse_u64(PyObject *obj, const char *func, const char *param, uint64_t *out)
{
    if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, param, "expected an int, got %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    PyObject *v = PyNumber_Index(obj);
    if (v == NULL) {
        return -1;
    }
    int overflow;
    long long s = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (s == -1 && PyErr_Occurred()) {
        Py_DECREF(v);
        return -1;
    }
    if (overflow < 0 || (overflow == 0 && s < 0)) {
        cl_arg_error(PyExc_ValueError, func, param, "must be non-negative, got %R", obj);
        Py_DECREF(v);
        return -1;
    }
    if (overflow == 0) {
        *out = (uint64_t)s;
        Py_DECREF(v);
        return 0;
    }
    unsigned long long u = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return cl_arg_error(PyExc_ValueError, func, param, "must be less than 2**64, got %R",
                            obj);
    }
    *out = (uint64_t)u;
    return 0;
}

/* `dtype` (None = the default), restricted to floats or to integers. */
static int
parse_dtype(cl_state *st, PyObject *obj, const char *func, bool want_float, cl_dtype def,
            cl_dtype *out)
{
    if (obj == NULL || obj == Py_None) {
        *out = def;
        return 0;
    }
    if (cl_dtype_converter(st, obj, func, "dtype", out) < 0) {
        return -1;
    }
    if (want_float ? !is_float_dtype(*out) : !is_int_dtype(*out)) {
        return cl_arg_error(PyExc_TypeError, func, "dtype", "expected %s, got %s",
                            want_float ? "a float dtype (float16, bfloat16, float32, float64)"
                                       : "an integer dtype (int8, uint8, int32, int64)",
                            cl_dtype_name(*out));
    }
    return 0;
}

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

/* The uniform bound `x` of parameter `param` rounded into dtype. */
static int
uniform_bound(cl_state *st, double x, cl_dtype dtype, const char *param, double *out)
{
    int r = round_to_dtype(st, x, dtype, out);
    if (r == 1) {
        PyObject *v = PyFloat_FromDouble(x);
        if (v != NULL) {
            cl_arg_error(PyExc_ValueError, "uniform", param, "%R overflows %s", v,
                         cl_dtype_name(dtype));
            Py_DECREF(v);
        }
        return -1;
    }
    return r;
}

/* The shape, the seed and offset, and a new output array on the current
 * device (after cl_require_device). */
static int
parse_common(cl_state *st, const char *func, PyObject *shape_obj, PyObject *seed_obj,
             PyObject *offset_obj, int *ndim, Py_ssize_t *shape, uint64_t *seed,
             uint64_t *offset)
{
    if (cl_parse_shape(shape_obj, func, "shape", ndim, shape) < 0) {
        return -1;
    }
    *seed = 0;
    *offset = 0;
    if (seed_obj != NULL && parse_u64(seed_obj, func, "seed", seed) < 0) {
        return -1;
    }
    if (offset_obj != NULL && parse_u64(offset_obj, func, "offset", offset) < 0) {
        return -1;
    }
    return 0;
}

/* Allocate the output and run `fill` on it (profiled as `prof_name`). */
typedef cudaError_t (*fill_fn)(void *out, cl_dtype dtype, int64_t n, const void *params,
                               uint64_t key, uint64_t offset, cudaStream_t stream);

static PyObject *
generate(cl_state *st, const char *func, const char *prof_name, int ndim, const Py_ssize_t *shape,
         cl_dtype dtype, fill_fn fill, const void *params, uint64_t seed, uint64_t offset)
{
    if (cl_require_device(st, func) < 0) {
        return NULL;
    }
    cl_prof_scope ps;
    cl_prof_begin(st, &ps, prof_name, CL_PROF_CURRENT_DEVICE);
    DeviceArray *out = cl_array_new(st, func, ndim, shape, NULL, dtype);
    if (out == NULL) {
        goto done;
    }
    int64_t n = (int64_t)cl_array_size(out);
    if (n > 0) {
        CL_CUDA_CHECK(st, fill(out->data, dtype, n, params, seed, offset, cl_current_stream(st)));
    }
    goto done;
fail:
    Py_CLEAR(out);
done:
    if (CL_PROF_ACTIVE(&ps)) {
        cl_prof_info info = {.dtype = (int)dtype, .flops = -1, .out_ndim = ndim,
                             .out_shape = shape};
        info.bytes = out != NULL ? cl_prof_nbytes(out) : 0; /* written once */
        cl_prof_end(st, &ps, out != NULL ? &info : NULL);
    }
    return (PyObject *)out;
}

struct real_pair {
    double a, b;
};

static cudaError_t
fill_normal(void *out, cl_dtype dtype, int64_t n, const void *params, uint64_t key,
            uint64_t offset, cudaStream_t stream)
{
    const struct real_pair *p = params;
    return cl_random_normal(out, dtype, n, p->a, p->b, key, offset, stream);
}

static cudaError_t
fill_uniform(void *out, cl_dtype dtype, int64_t n, const void *params, uint64_t key,
             uint64_t offset, cudaStream_t stream)
{
    const struct real_pair *p = params;
    return cl_random_uniform(out, dtype, n, p->a, p->b, key, offset, stream);
}

struct int_range {
    int64_t low;
    uint64_t span;
};

static cudaError_t
fill_integers(void *out, cl_dtype dtype, int64_t n, const void *params, uint64_t key,
              uint64_t offset, cudaStream_t stream)
{
    const struct int_range *p = params;
    return cl_random_integers(out, dtype, n, p->low, p->span, key, offset, stream);
}

PyDoc_STRVAR(_random_normal_doc,
"_random_normal(shape, mean=0.0, std=1.0, dtype=None, seed=0, offset=0)\n--\n\n"
"Private: cudalab.random.normal's kernel call (Philox stream (seed, offset)).\n\n"
"Parameters\n----------\nshape : int or tuple of int\nmean, std : float\n"
"    Finite; std >= 0.\ndtype : float16, bfloat16, float32 (None) or float64\n"
"seed, offset : int\n    In [0, 2**64).");

static PyObject *
_random_normal(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"shape", "mean", "std", "dtype", "seed", "offset", NULL};
    const char *func = "normal";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[6];
    int ndim;
    Py_ssize_t shape[CL_MAX_NDIM];
    uint64_t seed, offset;
    struct real_pair p = {0.0, 1.0};
    cl_dtype dtype;
    if (cl_parse_args(func, args, nargs, kwnames, names, 1, argv) < 0 ||
        parse_common(st, func, argv[0], argv[4], argv[5], &ndim, shape, &seed, &offset) < 0) {
        return NULL;
    }
    if (argv[1] != NULL && parse_real(argv[1], func, "mean", &p.a) < 0) {
        return NULL;
    }
    if (argv[2] != NULL && parse_real(argv[2], func, "std", &p.b) < 0) {
        return NULL;
    }
    if (p.b < 0.0) {
        return cl_arg_error(PyExc_ValueError, func, "std", "must be >= 0, got %R", argv[2]),
               NULL;
    }
    if (parse_dtype(st, argv[3], func, true, CL_FLOAT32, &dtype) < 0) {
        return NULL;
    }
    return generate(st, func, "random.normal", ndim, shape, dtype, fill_normal, &p, seed,
                    offset);
}

PyDoc_STRVAR(_random_uniform_doc,
"_random_uniform(shape, low=0.0, high=1.0, dtype=None, seed=0, offset=0)\n--\n\n"
"Private: cudalab.random.uniform's kernel call (Philox stream (seed, offset)).\n\n"
"Parameters\n----------\nshape : int or tuple of int\nlow, high : float\n"
"    Finite; rounded to `dtype` first, and then low < high is required.\n"
"dtype : float16, bfloat16, float32 (None) or float64\n"
"seed, offset : int\n    In [0, 2**64).");

static PyObject *
_random_uniform(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"shape", "low", "high", "dtype", "seed", "offset", NULL};
    const char *func = "uniform";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[6];
    int ndim;
    Py_ssize_t shape[CL_MAX_NDIM];
    uint64_t seed, offset;
    double low = 0.0, high = 1.0;
    struct real_pair p;
    cl_dtype dtype;
    if (cl_parse_args(func, args, nargs, kwnames, names, 1, argv) < 0 ||
        parse_common(st, func, argv[0], argv[4], argv[5], &ndim, shape, &seed, &offset) < 0) {
        return NULL;
    }
    if (argv[1] != NULL && parse_real(argv[1], func, "low", &low) < 0) {
        return NULL;
    }
    if (argv[2] != NULL && parse_real(argv[2], func, "high", &high) < 0) {
        return NULL;
    }
    if (parse_dtype(st, argv[3], func, true, CL_FLOAT32, &dtype) < 0) {
        return NULL;
    }
    if (uniform_bound(st, low, dtype, "low", &p.a) < 0 ||
        uniform_bound(st, high, dtype, "high", &p.b) < 0) {
        return NULL;
    }
    if (!(p.a < p.b)) {
        PyObject *lo = PyFloat_FromDouble(low), *hi = PyFloat_FromDouble(high);
        PyObject *lo_r = PyFloat_FromDouble(p.a), *hi_r = PyFloat_FromDouble(p.b);
        if (lo != NULL && hi != NULL && lo_r != NULL && hi_r != NULL) {
            cl_arg_error(PyExc_ValueError, func, "high",
                         "must be greater than low once both are rounded to %s (got low=%R, "
                         "high=%R, rounded %R and %R)",
                         cl_dtype_name(dtype), lo, hi, lo_r, hi_r);
        }
        Py_XDECREF(lo);
        Py_XDECREF(hi);
        Py_XDECREF(lo_r);
        Py_XDECREF(hi_r);
        return NULL;
    }
    return generate(st, func, "random.uniform", ndim, shape, dtype, fill_uniform, &p, seed,
                    offset);
}

/* An int bound as int64, or "exactly 2**63" (a valid exclusive high for
 * int64). Returns 1 for 2**63, 0 for an int64, -1 on error. Values outside
 * [-2**63, 2**63] are reported through `beyond` (-1 below, +1 above). */
static int
parse_bound(PyObject *obj, const char *func, const char *param, int64_t *out, int *beyond)
{
    *beyond = 0;
    if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, param, "expected an int, got %.100s",
                            Py_TYPE(obj)->tp_name);
    }
    PyObject *v = PyNumber_Index(obj);
    if (v == NULL) {
        return -1;
    }
    int overflow;
    long long s = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (s == -1 && PyErr_Occurred()) {
        Py_DECREF(v);
        return -1;
    }
    int result = 0;
    if (overflow == 0) {
        *out = (int64_t)s;
    }
    else if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(v);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            *beyond = 1;
        }
        else if (u == (1ull << 63)) {
            result = 1;
        }
        else {
            *beyond = 1;
        }
    }
    else {
        *beyond = -1;
    }
    Py_DECREF(v);
    return result;
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
    static const char *const names[] = {"shape", "low", "high", "dtype", "seed", "offset", NULL};
    const char *func = "integers";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[6];
    int ndim;
    Py_ssize_t shape[CL_MAX_NDIM];
    uint64_t seed, offset;
    cl_dtype dtype;
    if (cl_parse_args(func, args, nargs, kwnames, names, 2, argv) < 0 ||
        parse_common(st, func, argv[0], argv[4], argv[5], &ndim, shape, &seed, &offset) < 0) {
        return NULL;
    }
    /* Parse both bounds (types first), then the dtype, then the ranges. */
    int64_t low = 0, high = 0;
    int low_beyond = 0, high_beyond = 0, high_is_2_63 = 0;
    bool no_high = argv[2] == NULL || argv[2] == Py_None;
    /* With high=None the range is [0, low): `low` is then the exclusive bound. */
    const char *high_param = no_high ? "low" : "high";
    PyObject *high_obj = no_high ? argv[1] : argv[2];
    if (!no_high) {
        int r = parse_bound(argv[1], func, "low", &low, &low_beyond);
        if (r < 0) {
            return NULL;
        }
        if (r == 1) {
            low_beyond = 1; /* low = 2**63 never fits */
        }
    }
    high_is_2_63 = parse_bound(high_obj, func, high_param, &high, &high_beyond);
    if (high_is_2_63 < 0) {
        return NULL;
    }
    if (parse_dtype(st, argv[3], func, false, CL_INT64, &dtype) < 0) {
        return NULL;
    }
    int64_t min_d, max_d;
    switch (dtype) {
    case CL_INT8: min_d = -128; max_d = 127; break;
    case CL_UINT8: min_d = 0; max_d = 255; break;
    case CL_INT32: min_d = INT32_MIN; max_d = INT32_MAX; break;
    default: min_d = INT64_MIN; max_d = INT64_MAX; break;
    }
    const char *dname = cl_dtype_name(dtype);
    if (!no_high && (low_beyond != 0 || low < min_d || low > max_d)) {
        return cl_arg_error(PyExc_ValueError, func, "low",
                            "%R is out of bounds for %s (allowed %lld to %lld)", argv[1], dname,
                            (long long)min_d, (long long)max_d),
               NULL;
    }
    /* high is exclusive: high - 1 <= max_d, i.e. high <= max_d + 1. */
    bool high_too_big = high_beyond > 0 || (high_is_2_63 && dtype != CL_INT64) ||
                        (!high_is_2_63 && high_beyond == 0 && high > max_d && high - 1 > max_d);
    if (high_too_big) {
        return cl_arg_error(PyExc_ValueError, func, high_param,
                            "%R is out of bounds for %s (it is exclusive, so at most %lld + 1)",
                            high_obj, dname, (long long)max_d),
               NULL;
    }
    bool high_le_low = high_beyond < 0 || (!high_is_2_63 && high <= low);
    if (high_le_low) {
        if (no_high) {
            return cl_arg_error(PyExc_ValueError, func, "low",
                                "must be positive when high is None (the range is [0, low)), "
                                "got %R",
                                high_obj),
                   NULL;
        }
        return cl_arg_error(PyExc_ValueError, func, "high",
                            "must be greater than low (got low=%R, high=%R)", argv[1], high_obj),
               NULL;
    }
    struct int_range p;
    p.low = low;
    p.span = high_is_2_63 ? (uint64_t)1 << 63 : (uint64_t)high;
    p.span = p.span - 1u - (uint64_t)low; /* modulo 2**64: high - 1 - low >= 0 */
    return generate(st, func, "random.integers", ndim, shape, dtype, fill_integers, &p, seed,
                    offset);
}

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
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    uint32_t counter[4], key[2], result[4];
    if (cl_parse_args("_philox4x32_10", args, nargs, kwnames, names, 2, argv) < 0 ||
        parse_words(argv[0], "counter", 4, counter) < 0 ||
        parse_words(argv[1], "key", 2, key) < 0 ||
        cl_require_device(st, "_philox4x32_10") < 0) {
        return NULL;
    }
    const Py_ssize_t shape[1] = {4};
    DeviceArray *buf = cl_array_new(st, "_philox4x32_10", 1, shape, NULL, CL_INT32);
    if (buf == NULL) {
        return NULL;
    }
    cudaStream_t stream = cl_current_stream(st);
    cudaError_t err;
    CL_CUDA_CHECK(st, cl_philox4x32_10((uint32_t *)buf->data, counter, key, stream));
    CL_CUDA_CHECK(st, cudaMemcpyAsync(result, buf->data, sizeof result, cudaMemcpyDeviceToHost,
                                      stream));
    CL_WITHOUT_GIL(err = cudaStreamSynchronize(stream));
    CL_CUDA_CHECK(st, err);
    Py_DECREF(buf);
    return Py_BuildValue("(kkkk)", (unsigned long)result[0], (unsigned long)result[1],
                         (unsigned long)result[2], (unsigned long)result[3]);
fail:
    Py_DECREF(buf);
    return NULL;
}

PyMethodDef cl_random_methods[] = {
    CL_FASTCALL(_random_normal),
    CL_FASTCALL(_random_uniform),
    CL_FASTCALL(_random_integers),
    CL_FASTCALL(_philox4x32_10),
    {NULL, NULL, 0, NULL},
};
