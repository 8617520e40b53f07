// Placeholder: the reduce kernels land here (issue 3).
#include "kernels.h"
