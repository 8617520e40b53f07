/* The module state as every part of the extension reaches it, and the one
 * fact about the machine it caches from the start: how many devices there
 * are (errors.c's NoDeviceError says why there are none). The state itself
 * is created and filled by module.c. */
#include "core/core.h"

cl_state *
cl_state_from_module(PyObject *module)
{
    return (cl_state *)PyModule_GetState(module);
}

cl_state *
cl_state_from_type(PyTypeObject *type)
{
    /* DeviceArray cannot be subclassed, so its own type always finds us. */
    return (cl_state *)PyType_GetModuleState(type);
}

int
cl_device_count(cl_state *st)
{
    if (st->device_count < 0) {
        int count = 0;
        cudaError_t err = cudaGetDeviceCount(&count);
        if (err != cudaSuccess) {
            /* cudaErrorNoDevice, cudaErrorInsufficientDriver, ...: no GPU
             * for us; remember why for the NoDeviceError message. */
            (void)cudaGetLastError();
            count = 0;
        }
        st->device_count_error = err;
        st->device_count = count > CL_MAX_DEVICES ? CL_MAX_DEVICES : count;
    }
    return st->device_count;
}
