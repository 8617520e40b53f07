/* The reductions, declared once: every list of them (the cl_reduce_op enum of
 * kernels.h, the result dtypes in reduce.cu, the Python functions, their
 * argument specs and docstrings in csrc/ops/reduce.c, and _core._REDUCTIONS,
 * the names the package re-exports and the profiler files as reductions) is
 * generated from this table.
 *
 *   X(ID, name, on_float, on_int, takes_dtype, empty, summary, returns, tail)
 *
 *   ID           the enum constant CL_REDUCE_<ID>; table order is the ABI
 *                (append only)
 *   name         the public function
 *   on_float     result dtype for float input, on_int for bool and integer
 *                input; CL_REDUCE_KEEP: the input's own dtype
 *   takes_dtype  1: the function has dtype= (cast the input to it first)
 *   empty        the ValueError text for an empty reduced slice; NULL when
 *                the op has an identity (sum of nothing is 0, mean is NaN)
 *   summary, returns, tail  docstring pieces: the one-line summary, the
 *                Returns body, and the sections after it
 *
 * A new reduction is a line here, its combine operation and case in
 * reduce.cu's run_op, its stub in _core.pyi, its tests and its row in docs/api.md. */
#ifndef CUDALAB_REDUCE_OPS_H
#define CUDALAB_REDUCE_OPS_H

#define CL_REDUCE_KEEP (-1)
#define CL_REDUCE_OPS(X)                                                                       \
    X(SUM, "sum", CL_REDUCE_KEEP, CL_INT64, 1, NULL,                                           \
      "Sum of array elements over all elements or one axis.",                                  \
      "    0-d for a full reduction without keepdims. dtype: int64 for bool and\n"             \
      "    integer input (NumPy gives uint64 for uint8; cudalab has no uint64),\n"             \
      "    else the input's; float16/bfloat16 accumulate in float32.\n",                       \
      "Notes\n-----\n"                                                                         \
      "float32 is accumulated in float32 along short per-thread chains combined\n"             \
      "by a tree, so the error stays close to pairwise summation.\n" CL_REDUCE_DETERMINISM)   \
    X(MEAN, "mean", CL_REDUCE_KEEP, CL_FLOAT64, 1, NULL,                                       \
      "Arithmetic mean over all elements or one axis.",                                        \
      "    float64 for bool and integer input, else the input's dtype\n"                       \
      "    (float16/bfloat16 accumulate in float32). The mean of nothing is NaN\n"             \
      "    (NumPy also warns; cudalab does not).\n",                                           \
      "Notes\n-----\n" CL_REDUCE_DETERMINISM)                                                  \
    X(MAX, "max", CL_REDUCE_KEEP, CL_REDUCE_KEEP, 0,                                           \
      "zero-size array to reduction operation maximum which has no identity",                  \
      "Maximum over all elements or one axis; NaN propagates, as in NumPy.",                   \
      "    Same dtype as `a`.\n",                                                              \
      CL_REDUCE_NO_IDENTITY)                                                                   \
    X(MIN, "min", CL_REDUCE_KEEP, CL_REDUCE_KEEP, 0,                                           \
      "zero-size array to reduction operation minimum which has no identity",                  \
      "Minimum over all elements or one axis; NaN propagates, as in NumPy.",                   \
      "    Same dtype as `a`.\n",                                                              \
      CL_REDUCE_NO_IDENTITY)                                                                   \
    X(ARGMAX, "argmax", CL_INT64, CL_INT64, 0, "attempt to get argmax of an empty sequence",  \
      "Index of the maximum, over all elements (flat C-order index) or along one axis.",      \
      "    int64. Ties give the first occurrence; if a NaN is present, the index\n"            \
      "    of the first NaN, as in NumPy.\n",                                                  \
      "Raises\n------\nValueError\n    When a reduced slice is empty.\n")

#define CL_REDUCE_DETERMINISM                                                                  \
    "The result is bit-identical from run to run (fixed combination order, no\n"               \
    "atomics). Work is enqueued on the current stream of `a`'s device.\n"
#define CL_REDUCE_NO_IDENTITY                                                                  \
    "Raises\n------\nValueError\n    When a reduced slice is empty (there is no identity).\n"

#endif /* CUDALAB_REDUCE_OPS_H */
