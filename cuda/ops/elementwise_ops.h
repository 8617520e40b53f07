/* The element-wise op table: every element-wise operation, declared once.
 *
 * One X(...) line per kernel op:
 *
 *     X(ENUM, name, sig, nin, rule, expr, doc)
 *
 *   ENUM  the kernel op CL_EW_<ENUM> (kernels.h's cl_ew_op; the order is part
 *         of the ABI: append only)
 *   name  the public function: its name in messages, profiler records and
 *         the module
 *   sig   its Python signature, CL_EW_SIG_<sig> below; NONE: no function of
 *         its own (a form another function selects, as gelu's tanh form)
 *   nin   the operands the kernel reads, in[0 .. nin): arrays or scalars
 *   rule  the result dtype, CL_EW_RULE_<rule> below; it also decides which
 *         dtypes reach the kernel
 *   expr  one result element, from a, b, c (in[0], in[1], in[2]) and alpha,
 *         all of the compute type C (float for float16 and bfloat16, else the
 *         dtype itself); the helpers it calls are at the end of this file
 *   doc   the docstring's summary and notes; the text signature and the
 *         Parameters and Returns sections come from `sig`
 *
 * Generated from it: the cl_ew_op enum (kernels.h), the launcher's op
 * dispatch (cuda/ops/elementwise.cu), and in csrc/ops/elementwise.c the op
 * specs, one entry point per function with its docstring, the method table
 * and _core._ELEMENTWISE_OPS, the names the package re-exports, the profiler
 * files as element-wise and the tests check. A new unary op is one line here
 * (a device helper it needs goes at the end of this file), its stub in
 * _core.pyi, its name in docs/api.md's element-wise row and its NumPy
 * reference in tests/_references.py (docs/design.md, "Adding an element-wise
 * op"). */
#ifndef CUDALAB_ELEMENTWISE_OPS_H
#define CUDALAB_ELEMENTWISE_OPS_H

#define CL_EW_FLOAT_DOC_                                                                       \
    "float16/bfloat16 are computed in float32; integer inputs give float16\n"                  \
    "(bool, int8, uint8) or float64 (int32, int64), as in NumPy."

#define CL_EW_OPS(X)                                                                           \
    X(ADD, add, BINARY, 2, PROMOTE, add(a, b),                                                 \
      "Element-wise ``a + b``.\n\nbool + bool is logical or, as in NumPy.")                    \
    X(SUB, sub, BINARY, 2, NO_BOOL, sub(a, b),                                                 \
      "Element-wise ``a - b``.\n\nbool - bool is a TypeError, as in NumPy.")                   \
    X(MUL, mul, BINARY, 2, PROMOTE, mul(a, b),                                                 \
      "Element-wise ``a * b``.\n\n"                                                            \
      "bool * bool is logical and. ``mul(x, 2.0, out=x)`` scales in place.")                   \
    X(DIV, div, BINARY, 2, TRUE_DIV, a / b,                                                    \
      "Element-wise true division ``a / b``.\n\n"                                              \
      "Integer and bool operands give float64, as in NumPy.")                                  \
    X(MAXIMUM, maximum, BINARY, 2, PROMOTE, maximum(a, b),                                     \
      "Element-wise maximum; a NaN in either operand gives NaN (NumPy).")                      \
    X(MINIMUM, minimum, BINARY, 2, PROMOTE, minimum(a, b),                                     \
      "Element-wise minimum; a NaN in either operand gives NaN (NumPy).")                      \
    X(AXPY, axpy, AXPY, 2, PROMOTE, mul_add(alpha, a, b),                                      \
      "``alpha * x + y`` element-wise, as one fused multiply-add (one rounding).\n\n"          \
      "One operation, so the result dtype is ``np.result_type(alpha, x, y)``\n"                \
      "(NEP 50), not that of the two-step ``alpha * x + y``.")                                 \
    X(NEG, neg, UNARY, 1, NO_BOOL, neg(a),                                                     \
      "Element-wise ``-a`` (integers wrap; bool is a TypeError, as in NumPy).")                \
    X(ABS, abs, UNARY, 1, PROMOTE, absolute(a),                                                \
      "Element-wise absolute value (abs of the most negative integer wraps).")                 \
    X(EXP, exp, UNARY, 1, FLOAT, exp(a),                                                       \
      "Element-wise exponential.\n\n" CL_EW_FLOAT_DOC_)                                        \
    X(LOG, log, UNARY, 1, FLOAT, log(a),                                                       \
      "Element-wise natural logarithm (NaN for negative inputs).\n\n"                          \
      "Result dtypes as for exp.")                                                             \
    X(SQRT, sqrt, UNARY, 1, FLOAT, sqrt(a),                                                    \
      "Element-wise square root (NaN for negative inputs).\n\nResult dtypes as for exp.")      \
    X(TANH, tanh, UNARY, 1, FLOAT, tanh(a),                                                    \
      "Element-wise hyperbolic tangent.\n\nResult dtypes as for exp.")                         \
    X(SIGMOID, sigmoid, UNARY, 1, FLOAT, C(1) / (C(1) + exp(-a)),                              \
      "Element-wise logistic sigmoid ``1 / (1 + exp(-a))``.\n\nResult dtypes as for exp.")     \
    X(RELU, relu, UNARY, 1, NO_BOOL, relu(a),                                                  \
      "Element-wise ``max(a, 0)`` in a's dtype (NaN stays NaN; bool refused).")                \
    X(GELU, gelu, GELU, 1, FLOAT, C(0.5) * a * (C(1) + erf(a * C(0.70710678118654752))),       \
      "Element-wise GELU.\n\n"                                                                 \
      "``approximate='none'``: ``0.5 a (1 + erf(a / sqrt(2)))``;\n"                            \
      "``approximate='tanh'``: ``0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))``\n"          \
      "(the two forms of torch.nn.functional.gelu). Result dtypes as for exp.")                \
    X(GELU_TANH, gelu, NONE, 1, FLOAT,                                                         \
      C(0.5) * a * (C(1) + tanh(C(0.79788456080286536) * (a + C(0.044715) * a * a * a))), "")  \
    X(POW, pow, BINARY, 2, POW, power(a, b),                                                   \
      "Element-wise power ``a ** b``, as numpy.power.\n\n"                                     \
      "float16/bfloat16 are computed in float32. Integers wrap; bool ** bool\n"                \
      "is int8, as in NumPy. An integer result with a negative scalar exponent\n"              \
      "is a ValueError, as in NumPy; elements of an integer exponent array are\n"              \
      "not checked (that would need a device sync): a negative one gives the\n"                \
      "integer part of ``1 / a ** -b`` (1 for a == 1, 1 or -1 for a == -1,\n"                  \
      "else 0).")                                                                              \
    X(CLAMP, clamp, CLAMP, 3, PROMOTE, minimum(maximum(a, b), c),                              \
      "Element-wise ``minimum(maximum(a, lo), hi)``, as torch.clamp and numpy.clip.\n\n"       \
      "A NaN in `a` or in a bound gives NaN; where lo > hi the result is hi.\n"                \
      "The result dtype is NumPy's promotion of a, lo and hi (Python scalars\n"                \
      "weak). For an integer `a`, a Python int bound beyond a's range is\n"                    \
      "ignored, as numpy.clip does.")                                                          \
    X(WHERE, where, WHERE, 3, SELECT, a != C(0) ? b : c,                                       \
      "Element-wise ``a if cond else b``: `a` where `cond` is true, else `b`.\n\n"             \
      "As numpy.where with three arguments: `cond` of any dtype is read for its\n"             \
      "truth (non-zero, NaN included), the result dtype is NumPy's promotion of\n"             \
      "a and b (Python scalars weak; two Python scalars give bool, int64 or\n"                 \
      "float64), and all three broadcast.")                                                    \
    X(RELU_GRAD, relu_grad, GRAD, 2, NO_BOOL, b <= C(0) ? C(0) : a,                            \
      "ReLU's backward: `grad` where ``x > 0``, else 0.\n\n"                                   \
      "As torch's threshold_backward: 0 at ``x == 0``, and `grad` where `x` is\n"              \
      "NaN (NaN is not ``<= 0``). Result dtype: NumPy's promotion of grad and x.")             \
    X(GELU_GRAD, gelu_grad, GELU_GRAD, 2, FLOAT,                                               \
      a * (C(0.5) * (C(1) + erf(b * C(0.70710678118654752))) +                                 \
           b * C(0.39894228040143264) * exp(C(-0.5) * b * b)),                                 \
      "GELU's backward: ``grad * d/dx gelu(x)``, as torch.ops.aten.gelu_backward.\n\n"        \
      "``approximate='none'``: ``Phi(x) + x phi(x)`` (Phi, phi: the standard\n"                \
      "normal CDF and density); ``approximate='tanh'``, with\n"                                 \
      "``t = tanh(sqrt(2/pi) (x + 0.044715 x^3))``:\n"                                          \
      "``0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)``.\n"                  \
      "float16/bfloat16 are computed in float32; result dtypes as for gelu.")                  \
    X(GELU_GRAD_TANH, gelu_grad, NONE, 2, FLOAT,                                               \
      a * gelu_tanh_slope(b, tanh(C(0.79788456080286536) * (b + C(0.044715) * b * b * b))),    \
      "")

/* The Python signatures (csrc/ops/elementwise.c writes their parameter
 * lists and docstring sections). */
typedef enum cl_ew_sig {
    CL_EW_SIG_NONE = 0, /* no function: a form another function selects */
    CL_EW_SIG_UNARY,    /* (a, out=None) */
    CL_EW_SIG_BINARY,   /* (a, b, out=None) */
    CL_EW_SIG_AXPY,     /* (alpha, x, y, out=None): x, y are in[0], in[1] */
    CL_EW_SIG_GELU,     /* (a, approximate='none', out=None) */
    CL_EW_SIG_CLAMP,    /* (a, lo=None, hi=None, out=None) */
    CL_EW_SIG_WHERE,    /* (cond, a, b, out=None) */
    CL_EW_SIG_GRAD,     /* (grad, x, out=None): an activation's backward */
    CL_EW_SIG_GELU_GRAD, /* (grad, x, approximate='none', out=None) */
} cl_ew_sig;

/* Result dtype rules (NumPy 2 promotion, NEP 50, of the operands first). */
typedef enum cl_ew_rule {
    CL_EW_RULE_PROMOTE = 0, /* the promoted dtype; every dtype reaches the kernel */
    CL_EW_RULE_NO_BOOL,     /* the promoted dtype, bool refused */
    CL_EW_RULE_TRUE_DIV,    /* bool and integers give float64 */
    CL_EW_RULE_FLOAT,       /* bool/int8/uint8 give float16, int32/int64 float64 */
    CL_EW_RULE_POW,         /* bool gives int8; an integer result refuses a
                               negative scalar exponent */
    CL_EW_RULE_SELECT,      /* in[0] is a condition (bool in the kernel), the
                               others promote; Python scalars alone are allowed */
} cl_ew_rule;

#ifdef __CUDACC__
/* ---- the device helpers the expressions call ----------------------------- */
#include <type_traits>

namespace cl_ew {

template <typename C> constexpr bool is_bool_v = std::is_same_v<C, bool>;
template <typename C> constexpr bool is_int_v = std::is_integral_v<C> && !is_bool_v<C>;

/* Integer arithmetic goes through the unsigned type: it wraps like NumPy's
 * and has no undefined behaviour on overflow. */
template <typename C> __device__ __forceinline__ C
add(C a, C b)
{
    if constexpr (is_bool_v<C>) {
        return a || b;
    }
    else if constexpr (is_int_v<C>) {
        using U = std::make_unsigned_t<C>;
        return (C)(U)((U)a + (U)b);
    }
    else {
        return a + b;
    }
}

template <typename C> __device__ __forceinline__ C
sub(C a, C b)
{
    if constexpr (is_int_v<C>) {
        using U = std::make_unsigned_t<C>;
        return (C)(U)((U)a - (U)b);
    }
    else {
        return a - b;
    }
}

template <typename C> __device__ __forceinline__ C
mul(C a, C b)
{
    if constexpr (is_bool_v<C>) {
        return a && b;
    }
    else if constexpr (is_int_v<C>) {
        using U = std::make_unsigned_t<C>;
        return (C)(U)((U)a * (U)b);
    }
    else {
        return a * b;
    }
}

/* alpha * x + y with one rounding for float and double. */
template <typename C> __device__ __forceinline__ C
mul_add(C alpha, C x, C y)
{
    if constexpr (std::is_floating_point_v<C>) {
        return fma(alpha, x, y);
    }
    else {
        return add(mul(alpha, x), y);
    }
}

/* NumPy's maximum/minimum: a NaN in either operand gives NaN. */
template <typename C> __device__ __forceinline__ C
maximum(C a, C b)
{
    if constexpr (std::is_floating_point_v<C>) {
        return (a >= b || a != a) ? a : b;
    }
    else {
        return a >= b ? a : b;
    }
}

template <typename C> __device__ __forceinline__ C
minimum(C a, C b)
{
    if constexpr (std::is_floating_point_v<C>) {
        return (a <= b || a != a) ? a : b;
    }
    else {
        return a <= b ? a : b;
    }
}

template <typename C> __device__ __forceinline__ C
neg(C a)
{
    if constexpr (is_int_v<C>) {
        using U = std::make_unsigned_t<C>;
        return (C)(U)((U)0 - (U)a);
    }
    else {
        return -a;
    }
}

template <typename C> __device__ __forceinline__ C
absolute(C a)
{
    if constexpr (is_bool_v<C> || std::is_unsigned_v<C>) {
        return a;
    }
    else if constexpr (is_int_v<C>) {
        return a < 0 ? neg(a) : a; /* abs(INT_MIN) wraps to INT_MIN, as in NumPy */
    }
    else {
        return fabs(a);
    }
}

template <typename C> __device__ __forceinline__ C
relu(C a)
{
    if constexpr (std::is_unsigned_v<C>) {
        return a;
    }
    else {
        return a < C(0) ? C(0) : a; /* NaN stays NaN */
    }
}

/* Floats: C's pow (powf for float). Integers: square-and-multiply, wrapping
 * like NumPy's loop. A negative exponent only comes from an exponent array
 * (csrc refuses a negative scalar one): the integer part of 1 / a ** -b. */
template <typename C> __device__ __forceinline__ C
power(C a, C b)
{
    if constexpr (std::is_floating_point_v<C>) {
        return pow(a, b);
    }
    else {
        using U = std::make_unsigned_t<C>;
        if constexpr (std::is_signed_v<C>) {
            if (b < 0) {
                return a == C(1) ? C(1) : a == C(-1) ? ((b & 1) ? C(-1) : C(1)) : C(0);
            }
        }
        U result = 1, base = (U)a, e = (U)b;
        while (e != 0) {
            if (e & 1) {
                result = (U)(result * base);
            }
            base = (U)(base * base);
            e >>= 1;
        }
        return (C)result;
    }
}

/* d/dx of the tanh-form GELU, 0.5 x (1 + t(x)), given t = tanh(u(x)) with
 * u = k (x + 0.044715 x^3), k = sqrt(2/pi): 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x),
 * u'(x) = k (1 + 3 * 0.044715 x^2). t is passed in so tanh runs once. */
template <typename C> __device__ __forceinline__ C
gelu_tanh_slope(C x, C t)
{
    const C du = C(0.79788456080286536) * (C(1) + C(0.134145) * x * x);
    return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * du;
}

} /* namespace cl_ew */
#endif /* __CUDACC__ */

#endif /* CUDALAB_ELEMENTWISE_OPS_H */
