/* The library's identity: what sanlab.model.native checks after loading a build. */

#include "common.h"
#include "sanlab.h"

/* The interface version (sanlab.h), against which sanlab.model.native checks a build. */
int sanlab_abi_version(void) { return SANLAB_ABI_VERSION; }

int sanlab_abi_sizes(int64_t *sizes, int n)
{
    const int64_t all[] = {sizeof(sanlab_tensor), sizeof(sanlab_attn_args), sizeof(sanlab_norm_rope_args),
                           sizeof(sanlab_rms_norm_args), sizeof(sanlab_gated_residual_args),
                           sizeof(sanlab_head_ce_args), sizeof(sanlab_silu_gate_args)};
    const int count = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < n && i < count; i++) sizes[i] = all[i];
    return count;
}
