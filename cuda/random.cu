// Placeholder: the random kernels land here (issue 3).
#include "kernels.h"
