/* The nn Linear layer's three GEMMs on cuBLASLt, with fused epilogues.
 *
 *   _nn_linear(x, weight, bias=None, activation=None, out=None, aux=None, precision=None)
 *       y = act(x @ weight.T + bias)
 *   _nn_linear_backward_input(grad_y, weight, out=None, aux=None, activation=None,
 *                             bias_grad=None, precision=None)
 *       grad_x = grad_y @ weight, times act'(aux) when an activation is given
 *   _nn_linear_backward_weight(grad_y, x, out=None, bias_grad=None, accumulate=False,
 *                              precision=None)
 *       grad_w = grad_y.T @ x (+ out when accumulating); bias_grad = grad_y summed over rows
 *
 * Shapes (PyTorch's layout): x (..., in), weight (out, in), bias (out,), y and
 * grad_y (..., out), grad_x (..., in), grad_w (out, in). The leading axes of x,
 * y and the gradients are rows: they are flattened into N rows, which needs
 * unit stride along the last axis and evenly spaced rows (any row stride at
 * least a row long, e.g. x[:, :in] of a wider buffer). Nothing is copied: a
 * layout that does not fit raises ValueError.
 *
 * Column-major mapping. cuBLAS is column-major: a row-major (R, C) array with
 * row stride ld is a column-major C x R matrix with leading dimension ld,
 * i.e. the array's transpose. So each product is computed transposed, with
 * cuBLAS's A ("X" in cl_mm_key) and B ("Y"):
 *
 *   forward         y^T (out x N)  = W (out x in) . x^T (in x N)
 *                   A = weight, stored in x out  -> op T, lda = weight's row stride
 *                   B = x,      stored in x N    -> op N, ldb = x's row stride
 *                   m = out, n = N, k = in
 *   backward input  grad_x^T (in x N) = W^T (in x out) . grad_y^T (out x N)
 *                   A = weight, stored in x out  -> op N
 *                   B = grad_y, stored out x N   -> op N
 *                   m = in, n = N, k = out
 *   backward weight grad_w^T (in x out) = x^T (in x N) . grad_y (N x out)
 *                   A = x,      stored in x N    -> op N
 *                   B = grad_y, stored out x N   -> op T
 *                   m = in, n = out, k = N
 *
 * and D (m x n, ld = the result's row stride) is the row-major result.
 *
 * Epilogues. cuBLASLt's bias vector has one entry per row of D, i.e. per
 * output feature here (m = out in the forward product), and its bias
 * gradients reduce as follows, which fixes the operand order above:
 *   forward         BIAS, RELU_BIAS, GELU_BIAS; without bias RELU, GELU; with
 *                   aux= the *_AUX variants (RELU_AUX[_BIAS], GELU_AUX[_BIAS])
 *   backward input  DRELU, DGELU; with bias_grad= DRELU_BGRAD, DGELU_BGRAD,
 *                   whose bias gradient sums D (after the derivative) over
 *                   its columns, the N rows: length m = in, the previous
 *                   layer's bias
 *   backward weight BGRADB: sums B = grad_y (after op T: N x out) over the
 *                   GEMM's k = N, giving n = out entries. (BGRADA would sum
 *                   A = x instead.)
 *
 * aux. GELU_AUX writes GELU's input (the pre-activation x W^T + b) in the
 * dtype of y: aux has y's shape and dtype. cuBLASLt's ReLU epilogues keep a
 * bit mask instead (there is no ReLU variant that writes the pre-activation),
 * so for ReLU aux is that mask, exposed as it is: uint8 of shape
 * (..., mask_bytes(features)) with mask_bytes(f) = ceil(f / 128) * 16; bit
 * f % 8 of byte f // 8 of a row is set where that row's pre-activation at
 * feature f was positive. cuBLASLt's aux leading dimension must be a multiple
 * of 8 elements (GELU) or 128 bits (ReLU) and at least D's rows: so a GELU
 * aux's rows must lie a multiple of 8 elements apart (with `out` not a
 * multiple of 8, pass a view buf[..., :out] of a wider buffer), and a ReLU
 * mask's a multiple of 16 bytes (always true of a C-contiguous mask).
 *
 * Chaining the backward. For layers h1 = act(x W1^T + b1) (aux1 = its aux),
 * y = h1 W2^T + b2:
 *   gx2 = _nn_linear_backward_input(grad_y, W2, aux=aux1, activation=act,
 *                                   bias_grad=db1)
 * gives gx2 = (grad_y W2) * act'(pre-activation 1), the gradient of layer 1's
 * pre-activation, and db1 = gx2 summed over rows, in one GEMM; then
 *   _nn_linear_backward_weight(grad_y, h1, out=dW2, bias_grad=db2)
 *   _nn_linear_backward_weight(gx2, x, out=dW1)
 * GELU is the tanh form, as cuBLASLt computes it:
 *   gelu(z) = 0.5 z (1 + tanh(sqrt(2 / pi) (z + 0.044715 z^3)))
 * (torch's gelu(approximate='tanh')); DGELU is its exact derivative.
 *
 * Dtypes: float32 (true fp32 for precision 'highest', TF32 for 'high'; the
 * default is get_float32_matmul_precision()), float16 and bfloat16 (fp32
 * accumulation). Every array of a call has the same dtype, the bias and bias
 * gradients included (cuBLASLt's rule outside fp8/int8 kernels: bias and
 * bias-gradient vectors have the output's type), except the uint8 ReLU mask.
 *
 * Accumulation: accumulate=True runs the weight GEMM with beta = 1 (grad_w +=
 * ...). cuBLASLt's bias-gradient epilogues overwrite their vector (beta
 * applies to D only), so accumulate=True with bias_grad= is refused rather
 * than silently overwriting a running sum.
 *
 * Unsupported combinations: when cuBLASLt's heuristic offers no algorithm for
 * an epilogue (a dtype, alignment or size it does not handle), the call
 * raises CudalabError naming the epilogue, dtype and sizes; there is no
 * silent fallback to an unfused product.
 *
 * A call is validate (forward_validate, backward_*_validate: every argument,
 * no CUDA call; they also describe the GEMM) -> run (lin_execute: op frame,
 * plan from matmul_plan.c's cache, one cublasLtMatmul).
 * All of it is asynchronous on the current stream and capturable in a graph
 * once the plan is cached. */
#include "ops/ops.h"
#include "ops/matmul.h"
#include "frame/frame.h"
#include "prof/prof.h"
#include "array/array.h"
#include "core/core.h"

enum { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2 };

/* A row-major matrix view of an array: leading axes flattened into rows. */
typedef struct lin_mat {
    DeviceArray *arr;     /* borrowed */
    int64_t rows, cols;
    int64_t ld;           /* elements from one row to the next */
} lin_mat;

/* One call, as validation leaves it. */
typedef struct lin_call {
    cl_op op;
    cl_dtype dtype;       /* of the first float operand; CL_NUM_DTYPES until then */
    const char *dtype_param;
    int precision;
    int act;
    bool accumulate;
    bool out_f32;         /* half operands, float32 out (and bias_grad): weight gradients */
    lin_mat a, b;         /* the two operands (x and weight, grad_y and weight, grad_y and x) */
    DeviceArray *bias;    /* bias read, or bias gradient written; NULL: none */
    DeviceArray *aux;     /* NULL: none */
    int64_t aux_ld;       /* elements, or bits for a ReLU mask */
    DeviceArray *out;     /* out= or NULL */
    int64_t out_ld;
    int rnd;              /* the result's shape */
    Py_ssize_t rshape[CL_MAX_NDIM];
} lin_call;

/* The GEMM of a call in cuBLAS's terms (see the header comment). */
typedef struct lin_gemm {
    const lin_mat *x, *y; /* cuBLAS's A and B */
    int opx, opy;
    int64_t m, n, k;
    int epilogue;         /* cublasLtEpilogue_t, 0: none */
} lin_gemm;

static int64_t
mask_bytes(int64_t features)
{
    return (features + 127) / 128 * 16;
}

/* ---- validate (no CUDA call) ----------------------------------------------------------- */

static int
parse_activation(const char *func, PyObject *obj, int *act)
{
    *act = ACT_NONE;
    if (obj == NULL || obj == Py_None) {
        return 0;
    }
    if (!PyUnicode_Check(obj)) {
        return cl_arg_error(PyExc_TypeError, func, "activation",
                            "expected None, 'relu' or 'gelu', got %.100s", Py_TYPE(obj)->tp_name);
    }
    if (PyUnicode_CompareWithASCIIString(obj, "relu") == 0) {
        *act = ACT_RELU;
        return 0;
    }
    if (PyUnicode_CompareWithASCIIString(obj, "gelu") == 0) {
        *act = ACT_GELU;
        return 0;
    }
    return cl_arg_error(PyExc_ValueError, func, "activation",
                        "expected None, 'relu' or 'gelu', got %R", obj);
}

static int
parse_bool(const char *func, const char *param, PyObject *obj, bool *value)
{
    *value = false;
    if (obj == NULL) {
        return 0;
    }
    if (!PyBool_Check(obj)) {
        return cl_expected_type_error(func, param, "a bool", obj);
    }
    *value = obj == Py_True;
    return 0;
}

/* The options that need no array, checked first (so the CPU tier sees them).
 * Errors name `func`, the private entry point called; the profiler records
 * the op as `record`, the public op (nn.functional.linear and its backward). */
static int
lin_init(lin_call *c, cl_state *st, const char *func, const char *record,
         PyObject *precision_obj, PyObject *activation_obj)
{
    memset(c, 0, sizeof *c);
    cl_op_init(&c->op, st, func);
    cl_op_record_as(&c->op, record);
    c->dtype = CL_NUM_DTYPES;
    c->precision = cl_mm_default_precision();
    if (precision_obj != NULL && precision_obj != Py_None &&
        cl_mm_parse_precision(precision_obj, func, "precision", &c->precision) < 0) {
        return -1;
    }
    return parse_activation(func, activation_obj, &c->act);
}

/* Row-major with unit stride along the last axis and the rows (leading axes
 * flattened) evenly spaced, at least a row apart and in increasing memory
 * order (cuBLASLt's leading dimension is positive, so a reversed view such as
 * x[::-1] is refused): fills m (not m->arr). */
static bool
matrix_layout(const DeviceArray *a, lin_mat *m)
{
    int nd = a->ndim;
    Py_ssize_t item = (Py_ssize_t)cl_itemsize(a->dtype);
    m->cols = a->shape[nd - 1];
    m->rows = 1;
    for (int i = 0; i < nd - 1; i++) {
        m->rows *= a->shape[i];
    }
    if (m->cols > 1 && a->strides[nd - 1] != item) {
        return false;
    }
    bool found = false;
    Py_ssize_t rs = m->cols * item, expect = 0;
    for (int i = nd - 2; i >= 0; i--) {
        if (a->shape[i] == 1) {
            continue;
        }
        if (!found) {
            found = true;
            rs = a->strides[i];
        }
        else if (a->strides[i] != expect) {
            return false;
        }
        expect = a->strides[i] * a->shape[i];
    }
    if (rs % item != 0 || rs / item < m->cols) {
        return false;
    }
    m->ld = rs / item;
    return true;
}

static int
layout_error(const lin_call *c, const char *param)
{
    return cl_arg_error(PyExc_ValueError, c->op.func, param,
                        "needs unit stride along its last axis and evenly spaced rows, in "
                        "increasing memory order (make it contiguous with "
                        "ascontiguousarray())");
}

/* The common dtype: float32, float16 or bfloat16, the same for every array. */
static int
check_dtype(lin_call *c, const DeviceArray *a, const char *param)
{
    if (c->dtype == CL_NUM_DTYPES) {
        if (a->dtype != CL_FLOAT32 && a->dtype != CL_FLOAT16 && a->dtype != CL_BFLOAT16) {
            return cl_arg_error(PyExc_TypeError, c->op.func, param,
                                "unsupported dtype %s (expected float32, float16 or bfloat16)",
                                cl_dtype_name(a->dtype));
        }
        c->dtype = a->dtype;
        c->dtype_param = param;
        return 0;
    }
    if (a->dtype != c->dtype) {
        return cl_arg_error(PyExc_TypeError, c->op.func, param,
                            "dtype %s differs from '%s''s dtype %s", cl_dtype_name(a->dtype),
                            c->dtype_param, cl_dtype_name(c->dtype));
    }
    return 0;
}

/* A matrix operand: a DeviceArray of 2 (up to max_nd) axes, of the common
 * dtype, not empty, with a row-major layout. */
static int
matrix_arg(lin_call *c, PyObject *obj, const char *param, int max_nd, lin_mat *m)
{
    DeviceArray *a;
    if (cl_op_array(&c->op, obj, param, &a) < 0 || check_dtype(c, a, param) < 0) {
        return -1;
    }
    if (a->ndim < 2 || a->ndim > max_nd) {
        return cl_arg_error(PyExc_ValueError, c->op.func, param,
                            max_nd == 2 ? "expected a 2-D array, got %d-D"
                                        : "expected at least 2 dimensions, got %d",
                            a->ndim);
    }
    if (cl_array_size(a) == 0) {
        PyObject *shape = cl_shape_tuple(a->ndim, a->shape);
        if (shape != NULL) {
            cl_arg_error(PyExc_ValueError, c->op.func, param,
                         "is empty (shape %R): zero-size products are not supported", shape);
            Py_DECREF(shape);
        }
        return -1;
    }
    if (!matrix_layout(a, m)) {
        return layout_error(c, param);
    }
    m->arr = a;
    return 0;
}

/* A 1-D, unit-stride vector of `length` elements of the common dtype, or None. */
static int
vector_arg(lin_call *c, PyObject *obj, const char *param, int64_t length, DeviceArray **v)
{
    *v = NULL;
    if (obj == NULL || obj == Py_None) {
        return 0;
    }
    if (!CL_IS_DEVICEARRAY(c->op.st, obj)) {
        return cl_expected_array_error(c->op.func, param, obj, true);
    }
    DeviceArray *a = (DeviceArray *)obj;
    if (cl_op_same_device(&c->op, a, param) < 0) {
        return -1;
    }
    if (c->out_f32 ? a->dtype != CL_FLOAT32 : check_dtype(c, a, param) < 0) {
        return c->out_f32 ? cl_arg_error(PyExc_TypeError, c->op.func, param,
                                         "must be float32 like out, got %s",
                                         cl_dtype_name(a->dtype))
                          : -1;
    }
    if (a->ndim != 1 || a->shape[0] != length) {
        PyObject *got = cl_shape_tuple(a->ndim, a->shape);
        if (got != NULL) {
            cl_arg_error(PyExc_ValueError, c->op.func, param, "expected shape (%lld,), got %R",
                         (long long)length, got);
            Py_DECREF(got);
        }
        return -1;
    }
    if (length > 1 && a->strides[0] != (Py_ssize_t)cl_itemsize(a->dtype)) {
        return cl_arg_error(PyExc_ValueError, c->op.func, param,
                            "must be contiguous (cuBLASLt reads it packed)");
    }
    *v = a;
    return 0;
}

/* Raise "expected shape <want>, got <got>" for `a`. */
static int
shape_error(const lin_call *c, const char *param, const DeviceArray *a, int nd,
            const Py_ssize_t *want)
{
    PyObject *w = cl_shape_tuple(nd, want), *g = cl_shape_tuple(a->ndim, a->shape);
    if (w != NULL && g != NULL) {
        cl_arg_error(PyExc_ValueError, c->op.func, param, "expected shape %R, got %R", w, g);
    }
    Py_XDECREF(w);
    Py_XDECREF(g);
    return -1;
}

static bool
same_shape(const DeviceArray *a, int nd, const Py_ssize_t *shape)
{
    if (a->ndim != nd) {
        return false;
    }
    for (int i = 0; i < nd; i++) {
        if (a->shape[i] != shape[i]) {
            return false;
        }
    }
    return true;
}

/* aux for the activation of a result with leading shape `lead` (nlead axes)
 * and `features` columns (see "aux" in the header comment). */
static int
aux_arg(lin_call *c, PyObject *obj, int nlead, const Py_ssize_t *lead, int64_t features)
{
    const char *func = c->op.func;
    DeviceArray *a;
    if (obj == NULL || obj == Py_None) {
        return 0;
    }
    if (c->act == ACT_NONE) {
        return cl_arg_error(PyExc_ValueError, func, "aux",
                            "needs activation='relu' or 'gelu' (only they have an aux matrix)");
    }
    if (cl_op_array(&c->op, obj, "aux", &a) < 0) {
        return -1;
    }
    bool relu = c->act == ACT_RELU;
    cl_dtype want = relu ? CL_UINT8 : c->dtype;
    if (a->dtype != want) {
        return cl_arg_error(PyExc_TypeError, func, "aux", "expected dtype %s (%s), got %s",
                            cl_dtype_name(want), relu ? "the ReLU bit mask" : "the result's",
                            cl_dtype_name(a->dtype));
    }
    Py_ssize_t shape[CL_MAX_NDIM];
    memcpy(shape, lead, (size_t)nlead * sizeof *shape);
    shape[nlead] = (Py_ssize_t)(relu ? mask_bytes(features) : features);
    if (!same_shape(a, nlead + 1, shape)) {
        return shape_error(c, "aux", a, nlead + 1, shape);
    }
    lin_mat m;
    if (!matrix_layout(a, &m)) {
        return layout_error(c, "aux");
    }
    if (m.ld % (relu ? 16 : 8) != 0) {
        return cl_arg_error(PyExc_ValueError, func, "aux",
                            relu ? "rows must lie a multiple of 16 bytes apart (cuBLASLt's "
                                   "ReLU mask leading dimension is a multiple of 128 bits)"
                                 : "rows must lie a multiple of 8 elements apart (cuBLASLt's "
                                   "GELU aux leading dimension); for a width that is not, "
                                   "pass a view buf[..., :width] of a wider buffer");
    }
    c->aux = a;
    c->aux_ld = relu ? m.ld * 8 : m.ld;
    return 0;
}

/* out=: the result's shape and dtype, a row-major layout. */
static int
out_arg(lin_call *c, PyObject *obj)
{
    if (cl_op_out(&c->op, obj, c->rnd, c->rshape, &c->out) < 0 ||
        cl_op_out_dtype(&c->op, c->out, c->out_f32 ? CL_FLOAT32 : c->dtype) < 0) {
        return -1;
    }
    c->out_ld = c->rshape[c->rnd - 1];
    if (c->out != NULL) {
        lin_mat m;
        if (!matrix_layout(c->out, &m)) {
            return layout_error(c, "out");
        }
        c->out_ld = m.ld;
    }
    return 0;
}

/* The arrays the GEMM writes (out, then aux or bias where the flags say
 * so) share no byte with any other of the call's. `names`: the parameters
 * of a, b, bias, aux and out, in that order. */
static int
check_overlaps(const lin_call *c, const char *const names[5], bool bias_written,
               bool aux_written)
{
    const DeviceArray *all[5] = {c->a.arr, c->b.arr, c->bias, c->aux, c->out};
    bool written[5] = {false, false, bias_written, aux_written, true};
    for (int w = 4; w >= 0; w--) {
        for (int i = 0; written[w] && all[w] != NULL && i < 5; i++) {
            if (i != w && all[i] != NULL && cl_arrays_overlap(all[w], all[i])) {
                return cl_arg_error(PyExc_ValueError, c->op.func, names[w],
                                    "overlaps '%s' (the product reads it while writing)",
                                    names[i]);
            }
        }
    }
    return 0;
}

/* The result of a call: leading axes of `rows_of`, then `features`. */
static void
result_shape(lin_call *c, const DeviceArray *rows_of, int64_t features)
{
    c->rnd = rows_of->ndim;
    memcpy(c->rshape, rows_of->shape, (size_t)c->rnd * sizeof *c->rshape);
    c->rshape[c->rnd - 1] = (Py_ssize_t)features;
}

/* The result (the leading axes of operand a, then `features`) and the
 * arguments sized by it: out=, aux, and the bias or bias-gradient vector. */
static int
feature_args(lin_call *c, int64_t features, PyObject *out_obj, PyObject *aux_obj,
             PyObject *vector_obj, const char *vector_param)
{
    result_shape(c, c->a.arr, features);
    return (out_arg(c, out_obj) < 0 || aux_arg(c, aux_obj, c->rnd - 1, c->rshape, features) < 0 ||
            vector_arg(c, vector_obj, vector_param, features, &c->bias) < 0) ? -1 : 0;
}

/* Raise "'<p>' has <n> <what> but '<q>' has <m>" (mismatched features). */
static int
features_error(const lin_call *c, const char *p, int64_t n, const char *what, const char *q,
               int64_t m)
{
    return cl_arg_error(PyExc_ValueError, c->op.func, p, "has %lld %s but '%s' has %lld",
                        (long long)n, what, q, (long long)m);
}

/* ---- the three products ------------------------------------------------------------------ */

static int
forward_epilogue(const lin_call *c)
{
    bool bias = c->bias != NULL, aux = c->aux != NULL;
    switch (c->act) {
    case ACT_RELU:
        return aux ? (bias ? CUBLASLT_EPILOGUE_RELU_AUX_BIAS : CUBLASLT_EPILOGUE_RELU_AUX)
                   : (bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU);
    case ACT_GELU:
        return aux ? (bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                   : (bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
    default:
        return bias ? CUBLASLT_EPILOGUE_BIAS : 0;
    }
}

/* x (..., in), weight (out, in), bias (out,), aux; result (..., out). */
static int
forward_validate(lin_call *c, cl_state *st, PyObject *const *argv, lin_gemm *g)
{
    /* argv: x, weight, bias, activation, out, aux, precision */
    if (lin_init(c, st, "_nn_linear", "linear", argv[6], argv[3]) < 0 ||
        cl_op_out_type(&c->op, argv[4]) < 0 ||
        matrix_arg(c, argv[0], "x", CL_MAX_NDIM, &c->a) < 0 ||
        matrix_arg(c, argv[1], "weight", 2, &c->b) < 0) {
        return -1;
    }
    if (c->b.cols != c->a.cols) {
        return features_error(c, "weight", c->b.cols, "input features", "x", c->a.cols);
    }
    int64_t features = c->b.rows;
    if (feature_args(c, features, argv[4], argv[5], argv[2], "bias") < 0) {
        return -1;
    }
    static const char *const names[] = {"x", "weight", "bias", "aux", "out"};
    *g = (lin_gemm){.x = &c->b, .y = &c->a, .opx = CUBLAS_OP_T, .opy = CUBLAS_OP_N,
                    .m = features, .n = c->a.rows, .k = c->a.cols,
                    .epilogue = forward_epilogue(c)};
    return check_overlaps(c, names, false, true);
}

static int
backward_input_epilogue(const lin_call *c)
{
    bool bgrad = c->bias != NULL;
    switch (c->act) {
    case ACT_RELU:
        return bgrad ? CUBLASLT_EPILOGUE_DRELU_BGRAD : CUBLASLT_EPILOGUE_DRELU;
    case ACT_GELU:
        return bgrad ? CUBLASLT_EPILOGUE_DGELU_BGRAD : CUBLASLT_EPILOGUE_DGELU;
    default:
        return 0;
    }
}

/* grad_y (..., out), weight (out, in), aux and bias_grad of the previous
 * layer; result (..., in). */
static int
backward_input_validate(lin_call *c, cl_state *st, PyObject *const *argv, lin_gemm *g)
{
    /* argv: grad_y, weight, out, aux, activation, bias_grad, precision */
    const char *func = "_nn_linear_backward_input";
    if (lin_init(c, st, func, "linear_backward_input", argv[6], argv[4]) < 0 || cl_op_out_type(&c->op, argv[2]) < 0 ||
        matrix_arg(c, argv[0], "grad_y", CL_MAX_NDIM, &c->a) < 0 ||
        matrix_arg(c, argv[1], "weight", 2, &c->b) < 0) {
        return -1;
    }
    if (c->b.rows != c->a.cols) {
        return features_error(c, "weight", c->b.rows, "output features", "grad_y", c->a.cols);
    }
    bool has_aux = argv[3] != NULL && argv[3] != Py_None;
    bool has_bias_grad = argv[5] != NULL && argv[5] != Py_None;
    if (c->act != ACT_NONE && !has_aux) {
        return cl_arg_error(PyExc_ValueError, func, "aux",
                            "is required with an activation (its derivative needs the previous "
                            "layer's aux: the GELU pre-activation or the ReLU mask)");
    }
    if (has_bias_grad && c->act == ACT_NONE) {
        return cl_arg_error(PyExc_ValueError, func, "bias_grad",
                            "needs an activation: cuBLASLt fuses the previous layer's bias "
                            "gradient only into DRELU_BGRAD / DGELU_BGRAD (without one, take it "
                            "from that layer's _nn_linear_backward_weight(bias_grad=...))");
    }
    int64_t features = c->b.cols;
    if (feature_args(c, features, argv[2], argv[3], argv[5], "bias_grad") < 0) {
        return -1;
    }
    static const char *const names[] = {"grad_y", "weight", "bias_grad", "aux", "out"};
    *g = (lin_gemm){.x = &c->b, .y = &c->a, .opx = CUBLAS_OP_N, .opy = CUBLAS_OP_N,
                    .m = features, .n = c->a.rows, .k = c->a.cols,
                    .epilogue = backward_input_epilogue(c)};
    return check_overlaps(c, names, true, false);
}

/* grad_y (..., out), x (..., in) with as many rows, bias_grad (out,);
 * result (out, in). */
static int
backward_weight_validate(lin_call *c, cl_state *st, PyObject *const *argv, lin_gemm *g)
{
    /* argv: grad_y, x, out, bias_grad, accumulate, precision */
    const char *func = "_nn_linear_backward_weight";
    if (lin_init(c, st, func, "linear_backward_weight", argv[5], NULL) < 0 ||
        parse_bool(func, "accumulate", argv[4], &c->accumulate) < 0 ||
        cl_op_out_type(&c->op, argv[2]) < 0 ||
        matrix_arg(c, argv[0], "grad_y", CL_MAX_NDIM, &c->a) < 0 ||
        matrix_arg(c, argv[1], "x", CL_MAX_NDIM, &c->b) < 0) {
        return -1;
    }
    if (c->b.rows != c->a.rows) {
        return features_error(c, "x", c->b.rows, "rows", "grad_y", c->a.rows);
    }
    if (c->accumulate && (argv[2] == NULL || argv[2] == Py_None)) {
        return cl_arg_error(PyExc_ValueError, func, "accumulate",
                            "needs out= (the gradient to add into)");
    }
    if (c->accumulate && argv[3] != NULL && argv[3] != Py_None) {
        return cl_arg_error(PyExc_ValueError, func, "bias_grad",
                            "cannot be accumulated: cuBLASLt's BGRADB epilogue overwrites it "
                            "(pass a separate vector and add it)");
    }
    c->rnd = 2;
    c->rshape[0] = (Py_ssize_t)c->a.cols;
    c->rshape[1] = (Py_ssize_t)c->b.cols;
    /* Half operands may write float32 gradients straight from the GEMM (its
     * accumulator's type): no half copy to cast, and accumulation in float32. */
    c->out_f32 = c->dtype != CL_FLOAT32 && argv[2] != NULL && CL_IS_DEVICEARRAY(st, argv[2]) &&
                 ((DeviceArray *)argv[2])->dtype == CL_FLOAT32;
    if (out_arg(c, argv[2]) < 0 || vector_arg(c, argv[3], "bias_grad", c->a.cols, &c->bias) < 0) {
        return -1;
    }
    static const char *const names[] = {"grad_y", "x", "bias_grad", "aux", "out"};
    *g = (lin_gemm){.x = &c->b, .y = &c->a, .opx = CUBLAS_OP_N, .opy = CUBLAS_OP_T,
                    .m = c->b.cols, .n = c->a.cols, .k = c->a.rows,
                    .epilogue = c->bias != NULL ? CUBLASLT_EPILOGUE_BGRADB : 0};
    return check_overlaps(c, names, true, false);
}

/* ---- run ----------------------------------------------------------------------------------- */

static const char *
epilogue_name(int epilogue)
{
    switch (epilogue) {
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_RELU: return "RELU";
    case CUBLASLT_EPILOGUE_RELU_BIAS: return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_RELU_AUX: return "RELU_AUX";
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS: return "RELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_GELU: return "GELU";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "GELU_BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DRELU: return "DRELU";
    case CUBLASLT_EPILOGUE_DRELU_BGRAD: return "DRELU_BGRAD";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return "DGELU_BGRAD";
    case CUBLASLT_EPILOGUE_BGRADB: return "BGRADB";
    default: return "DEFAULT";
    }
}

/* cuBLASLt's heuristic has no algorithm for the fused product. */
static int
unsupported_error(const lin_call *c, const lin_gemm *g)
{
    PyErr_Format(c->op.st->CudalabError,
                 "%s(): cuBLASLt offers no algorithm for epilogue %s in %s%s with m=%lld, "
                 "n=%lld, k=%lld, leading dimensions %lld, %lld, %lld (aux %lld); this "
                 "combination is not supported (try sizes that are multiples of 8)",
                 c->op.func, epilogue_name(g->epilogue), cl_dtype_name(c->dtype),
                 c->dtype == CL_FLOAT32 && c->precision == 1 ? " (TF32)" : "",
                 (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->x->ld,
                 (long long)g->y->ld, (long long)c->out_ld, (long long)c->aux_ld);
    return -1;
}

/* The product into `target` (rows c->out_ld apart): plan, then one call. */
static int
lin_run(lin_call *c, const lin_gemm *g, DeviceArray *target)
{
    cl_mm_key key;
    memset(&key, 0, sizeof key);
    key.device = c->op.device;
    key.dtype = (int)c->dtype;
    key.compute = (int)cl_mm_compute_type(c->dtype, c->precision);
    key.lt = 1;
    key.opx = g->opx;
    key.opy = g->opy;
    key.m = g->m;
    key.n = g->n;
    key.k = g->k;
    key.ldx = g->x->ld;
    key.ldy = g->y->ld;
    key.ldc = c->out_ld;
    key.batch = 1;
    key.align_x = cl_mm_alignment_of((uintptr_t)g->x->arr->data);
    key.align_y = cl_mm_alignment_of((uintptr_t)g->y->arr->data);
    key.align_c = cl_mm_alignment_of((uintptr_t)target->data);
    key.epilogue = g->epilogue;
    key.out_f32 = c->out_f32;
    if (c->bias != NULL) {
        key.align_bias = cl_mm_alignment_of((uintptr_t)c->bias->data);
    }
    if (c->aux != NULL) {
        key.align_aux = cl_mm_alignment_of((uintptr_t)c->aux->data);
        key.aux_ld = c->aux_ld;
    }
    cl_mm_exec ex;
    if (cl_mm_prepare(c->op.st, &key, c->op.stream, &ex) < 0) {
        return -1;
    }
    if (g->epilogue != 0 && !cl_mm_uses_lt(&ex)) {
        return unsupported_error(c, g);
    }
    cl_mm_args args = {
        .bias = c->bias != NULL ? c->bias->data : NULL,
        .aux = c->aux != NULL ? c->aux->data : NULL,
        .accumulate = c->accumulate,
    };
    return cl_mm_run_args(c->op.st, &ex, g->x->arr->data, g->y->arr->data, target->data, &args);
}

/* Enter the op, make or take the result, run, close the profiler record
 * (bytes: every array once, out twice when accumulating; FLOPs: 2 m n k). */
static PyObject *
lin_execute(lin_call *c, const lin_gemm *g)
{
    if (cl_op_begin(&c->op) < 0) {
        return NULL;
    }
    cl_mm_drain_graveyard(c->op.st);
    cl_op_use(&c->op, c->a.arr);
    cl_op_use(&c->op, c->b.arr);
    cl_op_use(&c->op, c->bias);
    cl_op_use(&c->op, c->aux);
    cl_op_use(&c->op, c->out);
    DeviceArray *result = c->out != NULL ? (DeviceArray *)Py_NewRef(c->out)
                                         : cl_op_new(&c->op, c->rnd, c->rshape, NULL, c->dtype);
    if (result != NULL && lin_run(c, g, result) < 0) {
        Py_CLEAR(result);
    }
    if (!CL_OP_PROFILING(&c->op) || result == NULL) {
        return cl_op_end(&c->op, (PyObject *)result, NULL);
    }
    int64_t bytes = cl_prof_nbytes(c->a.arr) + cl_prof_nbytes(c->b.arr) +
                    cl_prof_nbytes(result) * (c->accumulate ? 2 : 1);
    bytes += (c->bias != NULL ? cl_prof_nbytes(c->bias) : 0) +
             (c->aux != NULL ? cl_prof_nbytes(c->aux) : 0);
    cl_prof_info info = {
        .dtype = (int)c->dtype,
        .bytes = bytes,
        .flops = 2 * g->m * g->n * g->k,
        .ninputs = 2,
        .inputs = {c->a.arr, c->b.arr},
        .out_ndim = c->rnd,
        .out_shape = c->rshape,
    };
    return cl_op_end(&c->op, (PyObject *)result, &info);
}

/* ---- Python functions ------------------------------------------------------------------------ */

typedef int (*lin_validate_fn)(lin_call *c, cl_state *st, PyObject *const *argv, lin_gemm *g);

/* Parse (two required arguments, at most 7 in all), validate, run. */
static PyObject *
lin_entry(PyObject *module, const char *func, const char *const *names, PyObject *const *args,
          Py_ssize_t nargs, PyObject *kwnames, lin_validate_fn validate)
{
    PyObject *argv[7];
    lin_call c;
    lin_gemm g;
    if (cl_parse_args(func, args, nargs, kwnames, names, 2, argv) < 0 ||
        validate(&c, cl_state_from_module(module), argv, &g) < 0) {
        return NULL;
    }
    return lin_execute(&c, &g);
}

PyDoc_STRVAR(_nn_linear_doc,
"_nn_linear(x, weight, bias=None, activation=None, out=None, aux=None, precision=None)\n--\n\n"
"Linear layer forward, ``act(x @ weight.T + bias)``, in one cuBLASLt GEMM\n"
"with the bias and activation fused as its epilogue.\n\n"
"Parameters\n----------\n"
"x : DeviceArray\n"
"    (..., in_features): leading axes are rows (flattened; unit stride along\n"
"    the last axis and evenly spaced rows needed).\n"
"    float32, float16 or bfloat16; every array has this dtype (except a\n"
"    ReLU `aux`).\n"
"weight : DeviceArray\n"
"    (out_features, in_features), rows with unit stride.\n"
"bias : DeviceArray, optional\n"
"    (out_features,), contiguous, of x's dtype (cuBLASLt's rule).\n"
"activation : {None, 'relu', 'gelu'}, optional\n"
"    GELU is the tanh form ``0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z**3)))``\n"
"    (torch's ``gelu(approximate='tanh')``), as cuBLASLt computes it.\n"
"out : DeviceArray, optional\n"
"    (..., out_features) of x's dtype, rows with unit stride; must not\n"
"    overlap the inputs.\n"
"aux : DeviceArray, optional\n"
"    Receives what the backward needs (activation required). 'gelu': the\n"
"    pre-activation ``x @ weight.T + bias``, shape and dtype of the result,\n"
"    rows a multiple of 8 elements apart (a view ``buf[..., :out_features]``\n"
"    of a wider buffer otherwise). 'relu': cuBLASLt's bit mask, uint8 of\n"
"    shape (..., ceil(out_features / 128) * 16): bit ``f % 8`` of byte\n"
"    ``f // 8`` of a row is set where that row's pre-activation at feature\n"
"    ``f`` is positive.\n"
"precision : {'highest', 'high'}, optional\n"
"    float32 only: true fp32 or TF32. Default: get_float32_matmul_precision().\n\n"
"Returns\n-------\nDeviceArray\n"
"    `out` if given, else a new C-contiguous (..., out_features) array.\n\n"
"Raises\n------\n"
"TypeError\n    Non-DeviceArray arguments, unsupported or mixed dtypes.\n"
"ValueError\n    Mismatched shapes, layouts, overlaps, bad names.\n"
"CudalabError\n    cuBLASLt has no algorithm for this epilogue at these sizes.");

static PyObject *
_nn_linear(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"x",   "weight", "bias",      "activation",
                                        "out", "aux",    "precision", NULL};
    return lin_entry(module, "_nn_linear", names, args, nargs, kwnames, forward_validate);
}

PyDoc_STRVAR(_nn_linear_backward_input_doc,
"_nn_linear_backward_input(grad_y, weight, out=None, aux=None, activation=None, "
"bias_grad=None, precision=None)\n--\n\n"
"Linear layer input gradient, ``grad_y @ weight``, in one cuBLASLt GEMM;\n"
"optionally fused with the previous layer's activation derivative and bias\n"
"gradient.\n\n"
"With `activation` and `aux` (the previous layer's aux from _nn_linear)\n"
"the result is ``(grad_y @ weight) * act'(pre-activation)``: the gradient\n"
"of the previous layer's pre-activation (epilogue DRELU / DGELU); with\n"
"`bias_grad` too, that gradient summed over rows is written into it: the\n"
"previous layer's bias gradient (DRELU_BGRAD / DGELU_BGRAD).\n\n"
"Parameters\n----------\n"
"grad_y : DeviceArray\n    (..., out_features): float32, float16 or bfloat16.\n"
"weight : DeviceArray\n    (out_features, in_features), of grad_y's dtype.\n"
"out : DeviceArray, optional\n    (..., in_features) of grad_y's dtype.\n"
"aux : DeviceArray, optional\n"
"    The previous layer's aux (see _nn_linear), for a result of shape\n"
"    (..., in_features); required with `activation`.\n"
"activation : {None, 'relu', 'gelu'}, optional\n"
"    The previous layer's activation (GELU: the tanh form).\n"
"bias_grad : DeviceArray, optional\n"
"    (in_features,), of grad_y's dtype, overwritten; needs `activation`.\n"
"precision : {'highest', 'high'}, optional\n"
"    float32 only: true fp32 or TF32. Default: get_float32_matmul_precision().\n\n"
"Returns\n-------\nDeviceArray\n"
"    `out` if given, else a new C-contiguous (..., in_features) array.\n\n"
"Raises\n------\n"
"TypeError\n    Non-DeviceArray arguments, unsupported or mixed dtypes.\n"
"ValueError\n    Mismatched shapes, layouts, overlaps; aux without activation or\n"
"    the reverse; bias_grad without activation.\n"
"CudalabError\n    cuBLASLt has no algorithm for this epilogue at these sizes.");

static PyObject *
_nn_linear_backward_input(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    static const char *const names[] = {"grad_y",     "weight",    "out",       "aux",
                                        "activation", "bias_grad", "precision", NULL};
    return lin_entry(module, "_nn_linear_backward_input", names, args, nargs, kwnames,
                     backward_input_validate);
}

PyDoc_STRVAR(_nn_linear_backward_weight_doc,
"_nn_linear_backward_weight(grad_y, x, out=None, bias_grad=None, accumulate=False, "
"precision=None)\n--\n\n"
"Linear layer weight gradient, ``grad_y.T @ x`` (shape (out_features,\n"
"in_features)), in one cuBLASLt GEMM; optionally with the bias gradient\n"
"``grad_y`` summed over rows fused in (epilogue BGRADB).\n\n"
"Parameters\n----------\n"
"grad_y : DeviceArray\n    (..., out_features): float32, float16 or bfloat16.\n"
"x : DeviceArray\n    (..., in_features), as many rows as grad_y, of its dtype.\n"
"out : DeviceArray, optional\n    (out_features, in_features) of grad_y's dtype, or float32 when grad_y\n"
"    is float16 or bfloat16 (the GEMM's float32 accumulator written as is:\n"
"    master-weight gradients with no half copy and no cast).\n"
"bias_grad : DeviceArray, optional\n"
"    (out_features,), of out's dtype, overwritten.\n"
"accumulate : bool, optional\n"
"    Add into `out` (beta = 1) instead of overwriting it, for gradient\n"
"    accumulation; needs `out`. Not with `bias_grad`: cuBLASLt's bias\n"
"    gradient epilogue overwrites its vector.\n"
"precision : {'highest', 'high'}, optional\n"
"    float32 only: true fp32 or TF32. Default: get_float32_matmul_precision().\n\n"
"Returns\n-------\nDeviceArray\n"
"    `out` if given, else a new C-contiguous (out_features, in_features)\n"
"    array.\n\n"
"Raises\n------\n"
"TypeError\n    Non-DeviceArray arguments, unsupported or mixed dtypes, a non-bool\n"
"    `accumulate`.\n"
"ValueError\n    Mismatched shapes, layouts, overlaps; accumulate without out or\n"
"    with bias_grad.\n"
"CudalabError\n    cuBLASLt has no algorithm for this epilogue at these sizes.");

static PyObject *
_nn_linear_backward_weight(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    static const char *const names[] = {"grad_y",     "x",         "out", "bias_grad",
                                        "accumulate", "precision", NULL};
    return lin_entry(module, "_nn_linear_backward_weight", names, args, nargs, kwnames,
                     backward_weight_validate);
}

PyMethodDef cl_nn_linear_methods[] = {
    CL_FASTCALL(_nn_linear),
    CL_FASTCALL(_nn_linear_backward_input),
    CL_FASTCALL(_nn_linear_backward_weight),
    {NULL, NULL, 0, NULL},
};
