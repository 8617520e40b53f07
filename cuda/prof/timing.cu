// Kernels the measurement harness (cudalab.bench) is built on.
//
// spin:  one thread busy-waits a given number of SM clock cycles. Its length
//        is known without any timer (cycles / SM clock), which makes it the
//        reference for checking the timer itself, and it holds a stream while
//        the host enqueues a batch of short ops behind it (nvbench's
//        "blocking kernel" idea), so their GPU time excludes launch gaps.
// empty: does nothing; launching it back to back measures launch latency.
#include "kernels.h"

namespace {

__global__ void spin_cycles(long long cycles)
{
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

__global__ void empty_kernel() {}

} // namespace

extern "C" cudaError_t
cl_spin(long long cycles, cudaStream_t stream)
{
    if (cycles < 0) {
        return cudaErrorInvalidValue;
    }
    spin_cycles<<<1, 1, 0, stream>>>(cycles);
    return cudaGetLastError();
}

extern "C" cudaError_t
cl_empty_kernel(cudaStream_t stream)
{
    empty_kernel<<<1, 1, 0, stream>>>();
    return cudaGetLastError();
}
