/* dist/: NCCL, loaded at run time, and the communicators built on it.
 *
 *   nccl.c   finding NCCL with dlopen, its function table, its errors, the
 *            unique id and group calls (_nccl_load, _nccl_version, ...)
 *   comm.c   the _NcclComm type: one communicator, its collectives on the
 *            current stream through the op frame, and its watchdog thread
 *
 * Nothing here is linked against NCCL: a build and an import work without
 * it, and cudalab.distributed loads it (CUDALAB_NCCL_LIBRARY, the
 * nvidia-nccl-cu13 wheel, the system's libnccl.so.2) before the first
 * communicator is made. The declarations below are NCCL's ABI as its header
 * documents it (nccl.h, API version 2): the opaque communicator, the 128-byte
 * unique id, and int-sized enums. */
#ifndef CUDALAB_DIST_DIST_H
#define CUDALAB_DIST_DIST_H

#include "core/core.h"

typedef struct cl_nccl_comm_opaque *cl_nccl_comm_t;
#define CL_NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[CL_NCCL_UNIQUE_ID_BYTES];
} cl_nccl_unique_id;

/* ncclResult_t values. */
enum {
    CL_NCCL_SUCCESS = 0,
    CL_NCCL_UNHANDLED_CUDA_ERROR = 1,
    CL_NCCL_SYSTEM_ERROR = 2,
    CL_NCCL_INTERNAL_ERROR = 3,
    CL_NCCL_INVALID_ARGUMENT = 4,
    CL_NCCL_INVALID_USAGE = 5,
    CL_NCCL_REMOTE_ERROR = 6,
    CL_NCCL_IN_PROGRESS = 7,
};
/* ncclRedOp_t values (the codes the Python layer passes as `op`). */
enum { CL_NCCL_SUM = 0, CL_NCCL_PROD = 1, CL_NCCL_MAX = 2, CL_NCCL_MIN = 3, CL_NCCL_AVG = 4 };
/* ncclDataType_t values. */
enum {
    CL_NCCL_INT8 = 0,
    CL_NCCL_UINT8 = 1,
    CL_NCCL_INT32 = 2,
    CL_NCCL_UINT32 = 3,
    CL_NCCL_INT64 = 4,
    CL_NCCL_UINT64 = 5,
    CL_NCCL_FLOAT16 = 6,
    CL_NCCL_FLOAT32 = 7,
    CL_NCCL_FLOAT64 = 8,
    CL_NCCL_BFLOAT16 = 9,
};

/* The NCCL entry points cudalab uses, resolved by name from the library. */
typedef struct cl_nccl_api {
    int (*GetVersion)(int *version);
    int (*GetUniqueId)(cl_nccl_unique_id *id);
    int (*CommInitRank)(cl_nccl_comm_t *comm, int nranks, cl_nccl_unique_id id, int rank);
    int (*CommInitAll)(cl_nccl_comm_t *comms, int ndev, const int *devlist);
    int (*CommDestroy)(cl_nccl_comm_t comm);
    int (*CommAbort)(cl_nccl_comm_t comm);
    int (*CommGetAsyncError)(cl_nccl_comm_t comm, int *error);
    const char *(*GetErrorString)(int result);
    const char *(*GetLastError)(cl_nccl_comm_t comm); /* NCCL >= 2.13; may be NULL */
    int (*AllReduce)(const void *send, void *recv, size_t count, int dtype, int op,
                     cl_nccl_comm_t comm, cudaStream_t stream);
    int (*Broadcast)(const void *send, void *recv, size_t count, int dtype, int root,
                     cl_nccl_comm_t comm, cudaStream_t stream);
    int (*Reduce)(const void *send, void *recv, size_t count, int dtype, int op, int root,
                  cl_nccl_comm_t comm, cudaStream_t stream);
    int (*AllGather)(const void *send, void *recv, size_t send_count, int dtype,
                     cl_nccl_comm_t comm, cudaStream_t stream);
    int (*ReduceScatter)(const void *send, void *recv, size_t recv_count, int dtype, int op,
                         cl_nccl_comm_t comm, cudaStream_t stream);
    int (*Send)(const void *send, size_t count, int dtype, int peer, cl_nccl_comm_t comm,
                cudaStream_t stream);
    int (*Recv)(void *recv, size_t count, int dtype, int peer, cl_nccl_comm_t comm,
                cudaStream_t stream);
    int (*GroupStart)(void);
    int (*GroupEnd)(void);
} cl_nccl_api;

/* The loaded library's table, or NULL (with DistributedError raised, naming
 * `func`) before cudalab.distributed has loaded NCCL. */
const cl_nccl_api *cl_nccl_require(cl_state *st, const char *func);

/* Raise NcclError for `result` of `expr`, with NCCL's text and, when `comm`
 * is given and NCCL keeps one, its last error message. Returns -1. */
int cl_raise_nccl(cl_state *st, int result, cl_nccl_comm_t comm, const char *expr,
                  const char *file, int line);
#define CL_NCCL_RAISE(st, result, comm, expr) \
    cl_raise_nccl((st), (result), (comm), (expr), __FILE__, __LINE__)

/* NCCL's data type for a cudalab dtype (bool travels as uint8). */
int cl_nccl_dtype(cl_dtype dtype);

/* Grouped calls (comm.c). Inside ncclGroupStart/End an operation is only
 * queued; it is enqueued on its stream at the group's end, so the watchdog's
 * event for it is recorded then. Thread-local, as NCCL's group state is. */
void cl_nccl_group_begin(void);
int cl_nccl_group_depth(void);
/* The group ended (ok: its operations were enqueued): give each member's
 * stream to its watchdog, drop the references the members held. */
void cl_nccl_group_finish(bool ok);

int cl_dist_init(PyObject *module, cl_state *st);
extern PyMethodDef cl_nccl_methods[]; /* nccl.c */

#endif /* CUDALAB_DIST_DIST_H */
