/* The library's identity: what sanlab.model.native checks after loading a build. */

#include "common.h"

/* The interface version (sanlab.model.native.ABI_VERSION checks it against a stale build). */
int sanlab_abi_version(void) { return 2; }
