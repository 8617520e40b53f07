/* One dtype dispatch for every kernel family: run a body with `scalar_t`
 * bound to the C++ type of a cl_dtype, instead of a hand-written switch in
 * each launcher.
 *
 *     CL_DISPATCH(dtype, CL_ALL_TYPES, return launch<scalar_t>(p, stream));
 *
 * A set is a macro SET(X, ...) that expands X(cl_dtype, C++ type, ...) for
 * each of its dtypes: the sets below, or one of the launcher's own. A dtype outside the set gives cudaErrorInvalidValue
 * (the caller's validation should have refused it already). */
#ifndef CUDALAB_DTYPE_DISPATCH_CUH
#define CUDALAB_DTYPE_DISPATCH_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels.h"

#define CL_FLOAT_TYPES(X, ...)                                                     \
    X(CL_FLOAT16, __half, __VA_ARGS__)                                             \
    X(CL_BFLOAT16, __nv_bfloat16, __VA_ARGS__)                                     \
    X(CL_FLOAT32, float, __VA_ARGS__)                                              \
    X(CL_FLOAT64, double, __VA_ARGS__)

#define CL_INT_TYPES(X, ...)                                                       \
    X(CL_INT8, int8_t, __VA_ARGS__)                                                \
    X(CL_UINT8, uint8_t, __VA_ARGS__)                                              \
    X(CL_INT32, int32_t, __VA_ARGS__)                                              \
    X(CL_INT64, int64_t, __VA_ARGS__)

#define CL_ALL_TYPES(X, ...)                                                       \
    X(CL_BOOL, bool, __VA_ARGS__)                                                  \
    CL_INT_TYPES(X, __VA_ARGS__)                                                   \
    CL_FLOAT_TYPES(X, __VA_ARGS__)

#define CL_DISPATCH_CASE_(code, type, ...)                                         \
    case code: {                                                                   \
        using scalar_t = type;                                                     \
        __VA_ARGS__;                                                               \
    }

/* The body (which may contain commas) is pasted once per dtype of `set`; it
 * normally returns. */
#define CL_DISPATCH(dtype, set, ...)                                               \
    do {                                                                           \
        switch (dtype) {                                                           \
            set(CL_DISPATCH_CASE_, __VA_ARGS__)                                    \
        default: return cudaErrorInvalidValue;                                     \
        }                                                                          \
    } while (0)

#endif /* CUDALAB_DTYPE_DISPATCH_CUH */
