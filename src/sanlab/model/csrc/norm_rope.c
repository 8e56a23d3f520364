/* Per-head QK-norm then rotate-half RoPE (sanlab.model.norms.norm_rope_reference),
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
#include "sanlab.h"

#define CHUNK_ROWS 64 /* (b, t) rows per chunk of dγ's partial sums */
#define MAX_D 1024

/* The rotation of one head row,
   n1 = n[0, half), n2 = n[half, D), with the (b, t) row's gained tables
   gc1 = γ₁c, gs2 = γ₂s, gc2 = γ₂c, gs1 = γ₁s: y₁ = n₁·gc1 − n₂·gs2, y₂ = n₂·gc2 + n₁·gs1 */
static inline void rotate(float *y, const float *n, float r, const float *gc1, const float *gs2, const float *gc2,
                          const float *gs1, int half)
{
    int d = 0;
    for (; d + VL <= half; d += VL) {
        const vf n1 = vload(n + d) * r, n2 = vload(n + half + d) * r;
        vstore(y + d, n1 * vload(gc1 + d) - n2 * vload(gs2 + d));
        vstore(y + half + d, n2 * vload(gc2 + d) + n1 * vload(gs1 + d));
    }
    for (; d < half; d++) {
        const float n1 = n[d] * r, n2 = n[half + d] * r;
        y[d] = n1 * gc1[d] - n2 * gs2[d];
        y[half + d] = n2 * gc2[d] + n1 * gs1[d];
    }
}

/* x row (b, t, head) at x[b·sb + t·st + head·sh]; tables row (b, t) at c[b·csb + t·cst]. */
int sanlab_norm_rope_fwd(const sanlab_norm_rope_args *a)
{
    const int B = a->B, T = a->T, h = a->h, D = a->D, x_bf16 = a->x.bf16, nthreads = a->nthreads;
    const void *x = a->x.data;
    const long xsb = a->x.sb, xst = a->x.st, xsh = a->x.sh, csb = a->csb, cst = a->cst;
    const float *gain = a->gain, *c = a->cos, *s = a->sin, eps = a->eps;
    float *out = a->out, *r = a->r;
    if (D % 2 != 0 || D > MAX_D) return 1;
    const int half = D / 2;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long bt = 0; bt < (long)B * T; bt++) {
        const int b = (int)(bt / T), t = (int)(bt % T);
        const float *cr = c + b * csb + t * cst, *sr = s + b * csb + t * cst;
        float n[MAX_D], tab[2 * MAX_D]; /* the row's gained tables: γ₁c, γ₂s, γ₂c, γ₁s */
        float *gc1 = tab, *gs2 = tab + half, *gc2 = tab + D, *gs1 = tab + D + half;
        for (int d = 0; d < half; d++) {
            gc1[d] = gain[d] * cr[d];
            gs2[d] = gain[d + half] * sr[d];
            gc2[d] = gain[d + half] * cr[d];
            gs1[d] = gain[d] * sr[d];
        }
        for (int j = 0; j < h; j++) {
            load_row(n, x, x_bf16, b * xsb + t * xst + j * xsh, D, 1.0f);
            const float rr = 1.0f / sqrtf(dot_f32(n, n, D) / D + eps);
            r[bt * h + j] = rr;
            rotate(out + (((long)b * h + j) * T + t) * D, n, rr, gc1, gs2, gc2, gs1, half);
        }
    }
    return 0;
}

/* dy row (b, head, t) at dy[b·dsb + head·dsh + t·dst] (fp32); dx (B, T, h, D) contiguous
   in its dtype; dgain (D) fp32, or NULL when the gain needs no gradient. */
int sanlab_norm_rope_bwd(const sanlab_norm_rope_args *a)
{
    if (a->dy.bf16) return 1;
    const int B = a->B, T = a->T, h = a->h, D = a->D, x_bf16 = a->x.bf16, dx_bf16 = a->dx.bf16;
    const int nthreads = a->nthreads;
    const void *x = a->x.data;
    void *dx = a->dx.data;
    const long xsb = a->x.sb, xst = a->x.st, xsh = a->x.sh, csb = a->csb, cst = a->cst;
    const long dsb = a->dy.sb, dsh = a->dy.sh, dst = a->dy.st;
    const float *gain = a->gain, *r = a->r, *c = a->cos, *s = a->sin, *dy = a->dy.data;
    float *dgain = a->dgain;
    if (D % 2 != 0 || D > MAX_D) return 1;
    const int half = D / 2;
    const long rows = (long)B * T, nchunks = (rows + CHUNK_ROWS - 1) / CHUNK_ROWS;
    float *partial = dgain ? zalloc(sizeof(float) * nchunks * D) : NULL;
    if (dgain && !partial) return 2;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long chunk = 0; chunk < nchunks; chunk++) {
        float n[MAX_D], u[MAX_D], y[MAX_D];
        float *acc = partial ? partial + chunk * D : NULL;
        const long end = (chunk + 1) * CHUNK_ROWS < rows ? (chunk + 1) * CHUNK_ROWS : rows;
        for (long bt = chunk * CHUNK_ROWS; bt < end; bt++) {
            const int b = (int)(bt / T), t = (int)(bt % T);
            const float *cr = c + b * csb + t * cst, *sr = s + b * csb + t * cst;
            for (int j = 0; j < h; j++) {
                const float rr = r[bt * h + j];
                load_row(n, x, x_bf16, b * xsb + t * xst + j * xsh, D, rr); /* n = x·r */
                const float *g = dy + b * dsb + j * dsh + t * dst;
                /* u = RoPE⁻¹(dy) = (dy₁c + dy₂s, dy₂c − dy₁s) */
                int d = 0;
                for (; d + VL <= half; d += VL) {
                    const vf g1 = vload(g + d), g2 = vload(g + half + d), cv = vload(cr + d), sv = vload(sr + d);
                    vstore(u + d, g1 * cv + g2 * sv);
                    vstore(u + half + d, g2 * cv - g1 * sv);
                }
                for (; d < half; d++) {
                    u[d] = g[d] * cr[d] + g[d + half] * sr[d];
                    u[d + half] = g[d + half] * cr[d] - g[d] * sr[d];
                }
                if (acc) {
                    for (d = 0; d + VL <= D; d += VL) vstore(acc + d, vload(acc + d) + vload(n + d) * vload(u + d));
                    for (; d < D; d++) acc[d] += n[d] * u[d];
                }
                for (d = 0; d + VL <= D; d += VL) vstore(u + d, vload(u + d) * vload(gain + d)); /* dn */
                for (; d < D; d++) u[d] *= gain[d];
                const float coef = dot_f32(u, n, D) / D;
                for (d = 0; d + VL <= D; d += VL) vstore(y + d, (vload(u + d) - vload(n + d) * coef) * rr);
                for (; d < D; d++) y[d] = (u[d] - n[d] * coef) * rr;
                const long o = (bt * h + j) * D;
                for (d = 0; d + VL <= D; d += VL) putv(dx, dx_bf16, o + d, vload(y + d));
                for (; d < D; d++) put1(dx, dx_bf16, o + d, y[d]);
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
