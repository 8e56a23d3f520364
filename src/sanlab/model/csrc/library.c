/* The library's identity: what sanlab.model.native checks after loading a build. */

#include "common.h"

/* The interface version (sanlab.model.native.ABI_VERSION checks it against a stale build). */
int sanlab_abi_version(void) { return 2; }

/* Threads an OpenMP build may use (0: built without OpenMP, one thread). */
int sanlab_openmp_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 0;
#endif
}

