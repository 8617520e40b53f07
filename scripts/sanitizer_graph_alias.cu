// Does compute-sanitizer's memcheck misjudge graph allocations that share an
// address? scripts/sanitize.sh builds and runs this under memcheck first.
//
// One captured graph: a = alloc(152 bytes), write a[37] (its last float),
// free a, b = alloc(148 bytes), write b[36]. The program is correct: a's
// lifetime ends before b's begins, and CUDA may give b a's address (it does
// on an H200 with CUDA 13.0). memcheck 2025.3 then reports the write to a[37]
// as out of bounds of "the nearest allocation ... of size 148", that is of
// b: the cudalab cross-entropy report of issue 21 (a reduced loss's scratch,
// then a 'none' loss captured after it) is this. Exit status 0; the report
// (or its absence) is the result.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void write_one(float *p, int i) { p[i] = 1.0f; }

#define CHECK(call)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            std::printf("%s: %s\n", #call, cudaGetErrorString(e_));                                \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main()
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *a, *b;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaMallocAsync((void **)&a, 38 * sizeof(float), s));
    write_one<<<1, 1, 0, s>>>(a, 37);
    CHECK(cudaFreeAsync(a, s));
    CHECK(cudaMallocAsync((void **)&b, 37 * sizeof(float), s));
    write_one<<<1, 1, 0, s>>>(b, 36);
    CHECK(cudaStreamEndCapture(s, &graph));
    std::printf("graph_alias: same_address=%d\n", a == b ? 1 : 0);
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(b));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
