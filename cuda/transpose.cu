// Placeholder: the transpose kernels land here (issue 3).
#include "kernels.h"
