/* cudalab._core: the CPython extension, plain C11 (no CUDA syntax).
 *
 * The sources are grouped by concern, a header per group, in layers: a
 * group's files include only their own group's headers and those of groups
 * below it (tests/test_csrc_layers_cpu.py checks), bottom-up:
 *
 *   core/     module state and device count, errors, argument parsing, dtypes
 *   runtime/  devices, the memory pool, streams and events, CUDA graphs,
 *             peer access
 *   array/    the DeviceArray object: layout, allocation, views, lifetime
 *   prof/     the op profiler and NVTX ranges
 *   frame/    the op frame every op entry point is built on, and its copies
 *   ops/      creation, copies, copyto, DLPack; element-wise, reductions,
 *             transpose, RNG, matmul, nn, models; the timing kernels
 *   dist/     NCCL loaded at run time, communicators and their collectives
 *
 * and at the top, including this header: module.c (the module: its init,
 * state and function tables) and devicearray.c (the DeviceArray type, whose
 * methods and number protocol come from every layer).
 *
 * The kernels they call are declared in cuda/kernels.h. docs/design.md
 * describes the layers and how to add an op.
 */
#ifndef CUDALAB_H
#define CUDALAB_H

#include "core/core.h"
#include "runtime/runtime.h"
#include "array/array.h"
#include "prof/prof.h"
#include "frame/frame.h"
#include "ops/ops.h"
#include "dist/dist.h"

/* devicearray.c, for module.c */
extern PyType_Spec cl_DeviceArray_spec;

#endif /* CUDALAB_H */
