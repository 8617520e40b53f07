/* Several GPUs in one process: peer access between devices (the copies
 * themselves are ops, in ops/copy.c, which says how they are ordered).
 *
 * Peer access has two halves here. cudaDeviceEnablePeerAccess maps the
 * peer's ordinary allocations; memory from a stream-ordered pool, which is
 * all of cudalab's, is reachable only once the pool grants the device access
 * (cudaMemPoolSetAccess). Without both, a copy between devices is staged
 * through host memory at a tenth of NVLink's speed. The first copy between
 * two devices turns both on (as torch enables peer access on its first
 * copy) unless disable_peer_access() said not to. */
#include "runtime/runtime.h"
#include "core/core.h"

/* Let `device` reach `peer`'s memory (on: context and pool access) or not.
 * Returns 0, or -1 with an exception. */
static int
set_access(cl_state *st, int device, int peer, bool on)
{
    cudaMemPool_t pool;
    int previous;
    if (cl_device_pool(st, peer, &pool) < 0 || cl_device_enter(st, device, &previous) < 0) {
        return -1;
    }
    cudaError_t err = on ? cudaDeviceEnablePeerAccess(peer, 0) : cudaDeviceDisablePeerAccess(peer);
    cl_device_exit(device, previous);
    if (err == cudaErrorPeerAccessAlreadyEnabled || err == cudaErrorPeerAccessNotEnabled) {
        (void)cudaGetLastError(); /* that half was already as asked */
        err = cudaSuccess;
    }
    CL_CUDA_CHECK(st, err);
    struct cudaMemAccessDesc desc;
    memset(&desc, 0, sizeof desc);
    desc.location.type = cudaMemLocationTypeDevice;
    desc.location.id = device;
    desc.flags = on ? cudaMemAccessFlagsProtReadWrite : cudaMemAccessFlagsProtNone;
    CL_CUDA_CHECK(st, cudaMemPoolSetAccess(pool, &desc, 1));
    st->devices[device].peer_access[peer] = on ? CL_PEER_ON : CL_PEER_OFF;
    return 0;
fail:
    return -1;
}

void
cl_peer_first_copy(cl_state *st, int device, int peer)
{
    signed char *state = &st->devices[device].peer_access[peer];
    if (*state != CL_PEER_UNTOUCHED) {
        return;
    }
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device, peer) != cudaSuccess || !can) {
        (void)cudaGetLastError();
        *state = CL_PEER_NONE;
        return;
    }
    if (set_access(st, device, peer, true) < 0) {
        PyErr_Clear();
        *state = CL_PEER_NONE;
    }
}

/* ---- Python functions ------------------------------------------------------ */

/* (device, peer_device) for the functions below (device None: the current
 * one); two different devices unless `same_ok`. */
static int
parse_pair(cl_state *st, const char *func, PyObject *device_obj, PyObject *peer_obj,
           bool same_ok, int *device, int *peer)
{
    if (peer_obj == Py_None) {
        return cl_expected_type_error(func, "peer_device", "an int", peer_obj);
    }
    if (cl_parse_device(st, device_obj, func, device) < 0) {
        return -1;
    }
    /* cl_parse_device names its parameter 'device'; say which one was wrong. */
    Py_ssize_t index;
    if (cl_parse_index(peer_obj, func, "peer_device", &index) < 0) {
        return -1;
    }
    if (index < 0 || index >= cl_device_count(st)) {
        return cl_arg_error(PyExc_ValueError, func, "peer_device",
                            "device %zd does not exist (%d device%s visible)", index,
                            cl_device_count(st), cl_device_count(st) == 1 ? "" : "s");
    }
    *peer = (int)index;
    if (*peer == *device && !same_ok) {
        return cl_arg_error(PyExc_ValueError, func, "peer_device",
                            "is device %d itself: peer access is between two devices", *peer);
    }
    return 0;
}

PyDoc_STRVAR(can_access_peer_doc,
"can_access_peer(device, peer_device)\n--\n\n"
"Whether kernels and copies on `device` can reach `peer_device`'s memory\n"
"directly (cudaDeviceCanAccessPeer), as torch.cuda.can_device_access_peer.\n"
"False for a device and itself.");

static PyObject *
can_access_peer(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"device", "peer_device", NULL};
    static const char *func = "can_access_peer";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    int device, peer, can = 0;
    if (cl_parse_args(func, args, nargs, kwnames, names, 2, argv) < 0) {
        return NULL;
    }
    if (argv[0] == Py_None) {
        return cl_expected_type_error(func, "device", "an int", argv[0]), NULL;
    }
    if (parse_pair(st, func, argv[0], argv[1], true, &device, &peer) < 0) {
        return NULL;
    }
    if (device == peer) {
        Py_RETURN_FALSE; /* as torch answers for a device and itself */
    }
    CL_CUDA_CHECK(st, cudaDeviceCanAccessPeer(&can, device, peer));
    return PyBool_FromLong(can);
fail:
    return NULL;
}

/* enable_peer_access / disable_peer_access: `enable` picks which. */
static PyObject *
set_peer_access(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                const char *func, bool enable)
{
    static const char *const names[] = {"peer_device", "device", NULL};
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    int device = -1, peer = -1, can = 0;
    if (cl_parse_args(func, args, nargs, kwnames, names, 1, argv) < 0 ||
        parse_pair(st, func, argv[1], argv[0], false, &device, &peer) < 0) {
        return NULL;
    }
    CL_CUDA_CHECK(st, cudaDeviceCanAccessPeer(&can, device, peer));
    if (!can) {
        if (!enable) {
            Py_RETURN_FALSE;
        }
        PyErr_Format(st->CudaError, "%s(): device %d cannot access device %d's memory "
                     "directly (cudaDeviceCanAccessPeer is 0); copies between them are staged "
                     "through host memory", func, device, peer);
        return NULL;
    }
    bool was_on = st->devices[device].peer_access[peer] == CL_PEER_ON;
    if (set_access(st, device, peer, enable) < 0) {
        return NULL;
    }
    return PyBool_FromLong(enable ? !was_on : was_on);
fail:
    return NULL;
}

PyDoc_STRVAR(enable_peer_access_doc,
"enable_peer_access(peer_device, device=None)\n--\n\n"
"Let `device` (default: the current one) reach `peer_device`'s memory\n"
"directly: cudaDeviceEnablePeerAccess, and access to peer_device's memory\n"
"pool (cudaMemPoolSetAccess), which every cudalab array comes from. Copies\n"
"then skip host memory. One direction only; call it the other way round\n"
"too. The first copy between two devices does this by itself (as torch\n"
"does) unless disable_peer_access() was called.\n\n"
"Returns\n-------\nbool\n    True when it was enabled now, False when it was already on.\n\n"
"Raises\n------\nCudaError\n    Where can_access_peer() is False.");

static PyObject *
enable_peer_access(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return set_peer_access(module, args, nargs, kwnames, "enable_peer_access", true);
}

PyDoc_STRVAR(disable_peer_access_doc,
"disable_peer_access(peer_device, device=None)\n--\n\n"
"Undo enable_peer_access (both halves): copies run on `device` that read\n"
"`peer_device`'s memory are staged through host memory again, and stay so\n"
"(the first-copy default no longer turns access on).\n\n"
"Returns\n-------\nbool\n    True when it was on, False when it was already off.");

static PyObject *
disable_peer_access(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return set_peer_access(module, args, nargs, kwnames, "disable_peer_access", false);
}

PyDoc_STRVAR(_peer_access_state_doc,
"_peer_access_state(device, peer_device)\n--\n\n"
"What cudalab knows of `device`'s access to `peer_device`'s memory, without\n"
"changing it (CUDA has no query): 'untouched' (the first copy between them\n"
"will turn it on), 'on', 'off' (disable_peer_access() was called) or\n"
"'unavailable' (the hardware cannot, or turning it on failed).");

static PyObject *
_peer_access_state(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                   PyObject *kwnames)
{
    static const char *const names[] = {"device", "peer_device", NULL};
    static const char *func = "_peer_access_state";
    cl_state *st = cl_state_from_module(module);
    PyObject *argv[2];
    int device, peer, can = 0;
    if (cl_parse_args(func, args, nargs, kwnames, names, 2, argv) < 0) {
        return NULL;
    }
    if (argv[0] == Py_None) {
        return cl_expected_type_error(func, "device", "an int", argv[0]), NULL;
    }
    if (parse_pair(st, func, argv[0], argv[1], false, &device, &peer) < 0) {
        return NULL;
    }
    signed char state = st->devices[device].peer_access[peer];
    if (state == CL_PEER_UNTOUCHED) {
        CL_CUDA_CHECK(st, cudaDeviceCanAccessPeer(&can, device, peer));
        if (!can) {
            state = CL_PEER_NONE;
        }
    }
    return PyUnicode_FromString(state == CL_PEER_ON    ? "on"
                                : state == CL_PEER_OFF ? "off"
                                : state == CL_PEER_NONE ? "unavailable"
                                                        : "untouched");
fail:
    return NULL;
}

PyMethodDef cl_peer_methods[] = {
    CL_FASTCALL(can_access_peer),
    CL_FASTCALL(enable_peer_access),
    CL_FASTCALL(disable_peer_access),
    CL_FASTCALL(_peer_access_state),
    {NULL, NULL, 0, NULL},
};
