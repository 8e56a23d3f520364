/* Per-head QK-norm then rotate-half RoPE (sanlab.model.kernels.norm_rope_reference),
   forward and backward, one pass over the activations each way.

   Per (b, t, head) row x of D values: r = (mean(x²) + eps)^-½, n = x·r, and over the two
   halves with the row's tables c, s (D/2 each) and the gain γ shared by all heads:
       y₁ = n₁γ₁c − n₂γ₂s,   y₂ = n₂γ₂c + n₁γ₁s.
   Backward, u = RoPE⁻¹(dy) = (dy₁c + dy₂s, dy₂c − dy₁s):
       dn = γ ⊙ u,  dγ = Σ_rows n ⊙ u,  dx = r·(dn − n·⟨dn, n⟩/D).
   fp32 arithmetic (x may be bf16: it widens exactly; dx is written in x's dtype, rounded
   to nearest even). dγ sums fixed chunks of rows, then the chunks in order, so it does
   not depend on the thread count. */

#include "common.h"

#define CHUNK_ROWS 64 /* (b, t) rows per chunk of dγ's partial sums */

/* x row (b, t, head) at x[b·sb + t·st + head·sh]; tables row (b, t) at c[b·csb + t·cst]. */
int sanlab_norm_rope_fwd(int B, int T, int h, int D,
                         const void *x, int x_bf16, long xsb, long xst, long xsh,
                         const float *gain, float eps,
                         const float *c, const float *s, long csb, long cst,
                         float *out, float *r, int nthreads)
{
    if (D % 2 != 0 || D > 4096) return 1;
    const int half = D / 2;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long bt = 0; bt < (long)B * T; bt++) {
        const int b = (int)(bt / T), t = (int)(bt % T);
        const float *cr = c + b * csb + t * cst, *sr = s + b * csb + t * cst;
        float n[4096];
        for (int j = 0; j < h; j++) {
            load_row(n, x, x_bf16, b * xsb + t * xst + j * xsh, D, 1.0f);
            float ss = 0.0f;
            for (int d = 0; d < D; d++) ss += n[d] * n[d];
            const float rr = 1.0f / sqrtf(ss / D + eps);
            r[bt * h + j] = rr;
            float *y = out + (((long)b * h + j) * T + t) * D;
            for (int d = 0; d < half; d++) {
                const float n1 = n[d] * rr, n2 = n[d + half] * rr;
                y[d] = n1 * (gain[d] * cr[d]) - n2 * (gain[d + half] * sr[d]);
                y[d + half] = n2 * (gain[d + half] * cr[d]) + n1 * (gain[d] * sr[d]);
            }
        }
    }
    return 0;
}

/* dy row (b, head, t) at dy[b·dsb + head·dsh + t·dst] (fp32); dx (B, T, h, D) contiguous
   in x's dtype; dgain (D) fp32, or NULL when the gain needs no gradient. */
int sanlab_norm_rope_bwd(int B, int T, int h, int D,
                         const void *x, int x_bf16, long xsb, long xst, long xsh,
                         const float *gain, const float *r,
                         const float *c, const float *s, long csb, long cst,
                         const float *dy, long dsb, long dsh, long dst,
                         void *dx, int dx_bf16, float *dgain, int nthreads)
{
    if (D % 2 != 0 || D > 4096) return 1;
    const int half = D / 2;
    const long rows = (long)B * T, nchunks = (rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
    float *partial = dgain ? zalloc(sizeof(float) * nchunks * D) : NULL;
    if (dgain && !partial) return 2;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long chunk = 0; chunk < nchunks; chunk++) {
        float n[4096], u[4096];
        float *acc = partial ? partial + chunk * D : NULL;
        const long end = (chunk + 1) * CHUNK_ROWS < rows ? (chunk + 1) * CHUNK_ROWS : rows;
        for (long bt = chunk * CHUNK_ROWS; bt < end; bt++) {
            const int b = (int)(bt / T), t = (int)(bt % T);
            const float *cr = c + b * csb + t * cst, *sr = s + b * csb + t * cst;
            for (int j = 0; j < h; j++) {
                const float rr = r[bt * h + j];
                load_row(n, x, x_bf16, b * xsb + t * xst + j * xsh, D, rr);
                const float *g = dy + b * dsb + j * dsh + t * dst;
                for (int d = 0; d < half; d++) {
                    u[d] = g[d] * cr[d] + g[d + half] * sr[d];
                    u[d + half] = g[d + half] * cr[d] - g[d] * sr[d];
                }
                if (acc)
                    for (int d = 0; d < D; d++) acc[d] += n[d] * u[d];
                float dot = 0.0f;
                for (int d = 0; d < D; d++) {
                    u[d] *= gain[d]; /* dn */
                    dot += u[d] * n[d];
                }
                const float coef = dot / D;
                const long o = (bt * h + j) * D;
                if (dx_bf16) {
                    uint16_t *dst16 = (uint16_t *)dx + o;
                    for (int d = 0; d < D; d++) dst16[d] = f32_to_bf16(rr * (u[d] - n[d] * coef));
                } else {
                    float *dst32 = (float *)dx + o;
                    for (int d = 0; d < D; d++) dst32[d] = rr * (u[d] - n[d] * coef);
                }
            }
        }
    }
    if (dgain) {
        for (int d = 0; d < D; d++) dgain[d] = 0.0f;
        for (long chunk = 0; chunk < nchunks; chunk++)
            for (int d = 0; d < D; d++) dgain[d] += partial[chunk * D + d];
        free(partial);
    }
    return 0;
}
