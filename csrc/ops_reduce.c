/* Placeholder: the reduce ops land here (issue 3). */
#include "cudalab.h"

PyMethodDef cl_reduce_methods[] = {
    {NULL, NULL, 0, NULL},
};
