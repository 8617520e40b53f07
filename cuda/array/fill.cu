// Fill a contiguous buffer with one element's bit pattern (full, ones).
// Zeros use cudaMemsetAsync instead; 1-byte patterns do too.
#include "kernels.h"

namespace {

constexpr int kThreads = 256;

template <typename Word>
__global__ void __launch_bounds__(kThreads)
fill_words(Word *__restrict__ dst, Word value, int64_t n)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = value;
    }
}

template <typename Word>
cudaError_t
launch(void *dst, size_t n, const void *value, cudaStream_t stream)
{
    Word word;
    memcpy(&word, value, sizeof word);
    int64_t blocks = ((int64_t)n + kThreads - 1) / kThreads;
    unsigned int grid = (unsigned int)(blocks < 65536 ? blocks : 65536);
    fill_words<Word><<<grid, kThreads, 0, stream>>>(static_cast<Word *>(dst), word, (int64_t)n);
    return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t
cl_fill(void *dst, size_t n, const void *value, size_t itemsize, cudaStream_t stream)
{
    if (n == 0) {
        return cudaSuccess;
    }
    switch (itemsize) {
    case 1: return cudaMemsetAsync(dst, *static_cast<const unsigned char *>(value), n, stream);
    case 2: return launch<uint16_t>(dst, n, value, stream);
    case 4: return launch<uint32_t>(dst, n, value, stream);
    case 8: return launch<uint64_t>(dst, n, value, stream);
    default: return cudaErrorInvalidValue;
    }
}
