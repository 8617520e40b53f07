// Element conversions with NumPy's astype semantics, shared by every kernel
// that changes dtype.
//   - anything -> bool is `x != 0` (NaN is true, as in NumPy)
//   - bool -> anything is 0 or 1
//   - float -> integer truncates toward zero (in-range values; out of range
//     is undefined in NumPy too)
//   - float16/bfloat16 are computed through float32; double -> bfloat16 also
//     goes through float32, as ml_dtypes does, so results match it bit for
//     bit; double -> float16 rounds once, as NumPy does
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

namespace cl {

// Widen any supported type to the type arithmetic happens in.
template <typename T> __device__ __forceinline__ T widen(T v) { return v; }
__device__ __forceinline__ float widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename Dst> struct Convert {
    template <typename Src> __device__ __forceinline__ static Dst from(Src v)
    {
        return static_cast<Dst>(widen(v));
    }
};

template <> struct Convert<bool> {
    template <typename Src> __device__ __forceinline__ static bool from(Src v)
    {
        return widen(v) != 0;
    }
};

template <> struct Convert<__half> {
    template <typename Src> __device__ __forceinline__ static __half from(Src v)
    {
        return __float2half_rn(static_cast<float>(widen(v)));
    }
    __device__ __forceinline__ static __half from(double v) { return __double2half(v); }
    __device__ __forceinline__ static __half from(__half v) { return v; }
};

template <> struct Convert<__nv_bfloat16> {
    template <typename Src> __device__ __forceinline__ static __nv_bfloat16 from(Src v)
    {
        return __float2bfloat16_rn(static_cast<float>(widen(v)));
    }
    __device__ __forceinline__ static __nv_bfloat16 from(__nv_bfloat16 v) { return v; }
};

template <typename Dst, typename Src> __device__ __forceinline__ Dst convert(Src v)
{
    return Convert<Dst>::from(v);
}

} // namespace cl
