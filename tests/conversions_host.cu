// Host-side check of cuda/dtype_convert.cuh (built by tests/test_conversions_cpu.py
// with nvcc, no GPU needed): reads raw elements of the source dtype on stdin,
// converts each with cl::convert, writes raw elements of the target dtype.
//   conversions_host SRC DST   (dtype names as cudalab spells them)
#include "dtype_convert.cuh"

#include <stdio.h>
#include <string.h>

#include <vector>

template <typename Dst, typename Src> static int run()
{
    std::vector<Src> in;
    Src v;
    while (fread(&v, sizeof v, 1, stdin) == 1) {
        in.push_back(v);
    }
    for (const Src &x : in) {
        Dst y = cl::convert<Dst>(x);
        fwrite(&y, sizeof y, 1, stdout);
    }
    return 0;
}

template <typename Src> static int to(const char *dst)
{
    if (!strcmp(dst, "bool")) return run<bool, Src>();
    if (!strcmp(dst, "int8")) return run<int8_t, Src>();
    if (!strcmp(dst, "uint8")) return run<uint8_t, Src>();
    if (!strcmp(dst, "int32")) return run<int32_t, Src>();
    if (!strcmp(dst, "int64")) return run<int64_t, Src>();
    return 2;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        return 2;
    }
    const char *src = argv[1], *dst = argv[2];
    if (!strcmp(src, "float16")) return to<__half>(dst);
    if (!strcmp(src, "bfloat16")) return to<__nv_bfloat16>(dst);
    if (!strcmp(src, "float32")) return to<float>(dst);
    if (!strcmp(src, "float64")) return to<double>(dst);
    return 2;
}
