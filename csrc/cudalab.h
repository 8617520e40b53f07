/* cudalab._core: the CPython extension, plain C11 (no CUDA syntax).
 *
 * The sources are grouped by concern, a header per group; every .c file
 * includes this one, which includes the groups in dependency order:
 *
 *   core/     module init and state, errors, argument parsing, the op frame
 *   array/    DeviceArray, creation, dtypes, DLPack / CUDA Array Interface
 *   runtime/  devices, the memory pool, streams and events, CUDA graphs
 *   prof/     the op profiler, NVTX, timing kernels for the harness
 *   ops/      element-wise, reductions, transpose, RNG, matmul
 *   dist/     NCCL loaded at run time, communicators and their collectives
 *
 * The kernels they call are declared in cuda/kernels.h. docs/design.md
 * describes the layers and how to add an op.
 */
#ifndef CUDALAB_H
#define CUDALAB_H

#include "core/core.h"
#include "array/array.h"
#include "runtime/runtime.h"
#include "prof/prof.h"
#include "core/op_frame.h"
#include "ops/ops.h"
#include "dist/dist.h"

#endif /* CUDALAB_H */
