// Element conversions shared by every kernel that changes dtype.
//   - anything -> bool is `x != 0` (NaN is true, as in NumPy)
//   - bool -> anything is 0 or 1
//   - float -> integer SATURATES (NumPy and C leave out-of-range values
//     undefined; we define them, like CUDA's cvt.rzi.sat and Rust's `as`):
//     truncate toward zero, then clamp to [min, max] of the target; NaN -> 0,
//     +inf -> max, -inf -> min. See saturate_to_int below.
//   - integer -> integer wraps (two's complement), as NumPy's astype does
//   - float16/bfloat16 are computed through float32 (exact); double ->
//     bfloat16 also goes through float32, as ml_dtypes does, so results match
//     it bit for bit; double -> float16 rounds once, as NumPy does
// Everything here is __host__ __device__ so the rules can be checked on the
// host as well (tests/test_conversions_cpu.py compiles this header).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include <limits>
#include <type_traits>

namespace cl {

#define CL_HD __host__ __device__ __forceinline__

// Widen any supported type to the type arithmetic happens in.
template <typename T> CL_HD T widen(T v) { return v; }
CL_HD float widen(__half v) { return __half2float(v); }
CL_HD float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

// 2^e as F, exact for every e used here (e <= 64).
template <typename F> constexpr F pow2(int e)
{
    F r = 1;
    for (int i = 0; i < e; i++) {
        r *= 2;
    }
    return r;
}

// float/double -> integer I with saturation. The bounds are powers of two, so
// they are exact in float and double: hi = max + 1, lo = min (0 or -2^k).
// Only a value strictly between them reaches the cast (the hardware's
// truncating cvt.rzi), where the truncated value fits I and the cast is
// defined; everything else is chosen explicitly instead of left to C++'s
// undefined behaviour. Written as selects, not branches: one cvt, four
// compares and three selects per element, next to a load and a store.
template <typename I, typename F> CL_HD I saturate_to_int(F x)
{
    static_assert(std::is_integral<I>::value && !std::is_same<I, bool>::value, "integer target");
    static_assert(std::is_floating_point<F>::value, "float or double source");
    constexpr F hi = pow2<F>(std::numeric_limits<I>::digits);
    constexpr F lo = std::numeric_limits<I>::is_signed ? -hi : F(0);
    const F inside = (x > lo && x < hi) ? x : F(0); // NaN fails both tests: 0
    I r = static_cast<I>(inside);
    r = x >= hi ? std::numeric_limits<I>::max() : r; // also +inf
    r = x <= lo ? std::numeric_limits<I>::min() : r; // also -inf; x == lo is min anyway
    return r;
}

template <typename Dst> struct Convert {
    template <typename Src> CL_HD static Dst from(Src v)
    {
        using W = decltype(widen(v));
        if constexpr (std::is_integral<Dst>::value && std::is_floating_point<W>::value) {
            return saturate_to_int<Dst>(widen(v));
        }
        else {
            return static_cast<Dst>(widen(v));
        }
    }
};

template <> struct Convert<bool> {
    template <typename Src> CL_HD static bool from(Src v)
    {
        return widen(v) != 0;
    }
};

template <> struct Convert<__half> {
    template <typename Src> CL_HD static __half from(Src v)
    {
        return __float2half_rn(static_cast<float>(widen(v)));
    }
    CL_HD static __half from(double v) { return __double2half(v); }
    CL_HD static __half from(__half v) { return v; }
};

template <> struct Convert<__nv_bfloat16> {
    template <typename Src> CL_HD static __nv_bfloat16 from(Src v)
    {
        return __float2bfloat16_rn(static_cast<float>(widen(v)));
    }
    CL_HD static __nv_bfloat16 from(__nv_bfloat16 v) { return v; }
};

template <typename Dst, typename Src> CL_HD Dst convert(Src v)
{
    return Convert<Dst>::from(v);
}

#undef CL_HD

} // namespace cl
