/* Placeholder: the random ops land here (issue 3). */
#include "cudalab.h"

PyMethodDef cl_random_methods[] = {
    {NULL, NULL, 0, NULL},
};
