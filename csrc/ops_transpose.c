/* Placeholder: the transpose ops land here (issue 3). */
#include "cudalab.h"

PyMethodDef cl_transpose_methods[] = {
    {NULL, NULL, 0, NULL},
};
