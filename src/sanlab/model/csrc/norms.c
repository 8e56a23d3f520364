/* RMS norm and the gated residual's backward (sanlab.model.norms._RMSNorm and
   sanlab.model.kernels._GatedResidual), one pass over the activations each way.

   RMS norm over rows of d values: r = (mean(x²) + eps)^-½, y = x·r·γ; backward
   dx = r·(dy⊙γ) − x·r³·⟨dy⊙γ, x⟩/d, dγ = Σ_rows r·(dy ⊙ x).
   Gated residual y = x + σ·h (σ = sigmoid(g), one scalar): dh = σ·dy, dg = σ(1 − σ)·Σ dy⊙h.
   fp32 arithmetic; the norm's output and dh may be written in bf16 (rounded to nearest
   even). Sums over rows (dγ, dg) add fixed chunks of rows, then the chunks in order, so
   they do not depend on the thread count. */

#include "common.h"
#include "sanlab.h"

#define CHUNK_ROWS 64

/* y[0, d) = x·a·b (b a vector), written as fp32 or bf16 from element `off` */
static inline void scaled_store(void *out, int bf16, long off, const float *x, float a, const float *b, int d)
{
    int j = 0;
    for (; j + VL <= d; j += VL) putv(out, bf16, off + j, vload(x + j) * a * vload(b + j));
    for (; j < d; j++) put1(out, bf16, off + j, x[j] * a * b[j]);
}

/* x (n, d) fp32 contiguous; out (n, d) fp32 or bf16; r (n) fp32 */
int sanlab_rms_norm_fwd(const sanlab_rms_norm_args *a)
{
    const long n = a->n;
    const int d = a->d, out_bf16 = a->out_bf16, nthreads = a->nthreads;
    const float *x = a->x, *gain = a->gain, eps = a->eps;
    void *out = a->out;
    float *r = a->r;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long i = 0; i < n; i++) {
        const float *xi = x + i * d;
        const float ri = 1.0f / sqrtf(dot_f32(xi, xi, d) / d + eps);
        r[i] = ri;
        scaled_store(out, out_bf16, i * d, xi, ri, gain + (a->group_rows ? i / a->group_rows * d : 0), d);
    }
    return 0;
}

/* dy (n, d) fp32 or bf16 contiguous; dx (n, d) fp32; dgain (d) or NULL */
int sanlab_rms_norm_bwd(const sanlab_rms_norm_args *a)
{
    const long n = a->n;
    const int d = a->d, dy_bf16 = a->dy_bf16, nthreads = a->nthreads;
    const float *x = a->x, *r = a->r;
    const void *dy = a->dy;
    float *dx = a->dx, *dgain = a->dgain;
    /* chunks of CHUNK_ROWS rows from each group's first row (one group: the solo sums) */
    const long group = a->group_rows > 0 && a->group_rows < n ? a->group_rows : (n > 0 ? n : 1), ngroups = (n + group - 1) / group;
    const long per = (group + CHUNK_ROWS - 1) / CHUNK_ROWS, nchunks = ngroups * per;
    float *partial = dgain ? zalloc(sizeof(float) * nchunks * d) : NULL;
    if (dgain && !partial) return 2;
    int status = 0;
#pragma omp parallel num_threads(nthreads)
    {
        float *g = amalloc(sizeof(float) * d); /* dy ⊙ γ */
        if (!g) {
#pragma omp atomic write
            status = 2;
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (long c = 0; c < nchunks; c++) {
            if (status) continue;
            float *acc = partial ? partial + c * d : NULL;
            const long g0 = c / per * group, lo = g0 + c % per * CHUNK_ROWS;
            const long gend = g0 + group < n ? g0 + group : n, end = lo + CHUNK_ROWS < gend ? lo + CHUNK_ROWS : gend;
            const float *gain = a->gain + c / per * (a->group_rows ? d : 0);
            for (long i = lo; i < end; i++) {
                const float *xi = x + i * d;
                float *dxi = dx + i * d;
                const float ri = r[i];
                load_row(dxi, dy, dy_bf16, i * d, d, 1.0f); /* dx holds dy until the last loop */
                int j = 0;
                for (; j + VL <= d; j += VL) vstore(g + j, vload(dxi + j) * vload(gain + j));
                for (; j < d; j++) g[j] = dxi[j] * gain[j];
                if (acc) {
                    for (j = 0; j + VL <= d; j += VL) vstore(acc + j, vload(acc + j) + vload(dxi + j) * vload(xi + j) * ri);
                    for (; j < d; j++) acc[j] += dxi[j] * xi[j] * ri;
                }
                const float coef = -ri * ri * ri * dot_f32(g, xi, d) / d;
                for (j = 0; j + VL <= d; j += VL) vstore(dxi + j, vload(g + j) * ri + vload(xi + j) * coef);
                for (; j < d; j++) dxi[j] = g[j] * ri + xi[j] * coef;
            }
        }
        free(g);
    }
    if (dgain) {
        for (long q = 0; q < ngroups; q++) {
            float *dg = dgain + q * d;
            for (int j = 0; j < d; j++) dg[j] = 0.0f;
            for (long c = q * per; c < (q + 1) * per; c++)
                for (int j = 0; j < d; j++) dg[j] += partial[c * d + j];
        }
        free(partial);
    }
    return status;
}

/* x (count) fp32, h (count) fp32 or bf16 -> out = x + σ·h (σ per group_count values from
   sigmas, or the one `sigma`), in one pass: torch's addcmul first widened h to an fp32
   copy (for the demo SAN's member-step at M = 8, 2 MB read and 4 MB written per residual).
   Each value is addcmul's bit for bit: one fused multiply-add, fma(h, σ, x), as PyTorch's
   CPU kernel (compiled with contraction) computes it. */
int sanlab_gated_residual_fwd(const sanlab_gated_residual_args *a)
{
    const long count = a->count;
    const int h_bf16 = a->h_bf16, nthreads = a->nthreads;
    const long group = a->group_count > 0 && a->group_count < count ? a->group_count : count;
    const long span = 1L << 14, nchunks = count > 0 ? (count + span - 1) / span : 0;
    const float *x = a->x;
    float *out = a->out;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long c = 0; c < nchunks; c++) {
        const long lo = c * span, hi = lo + span < count ? lo + span : count;
        long j = lo;
        while (j < hi) { /* runs of one gate */
            const long end = a->sigmas && (j / group + 1) * group < hi ? (j / group + 1) * group : hi;
            const float sigma = a->sigmas ? a->sigmas[j / group] : a->sigma;
            for (; j + VL <= end; j += VL) vstore(out + j, vfma(getv(a->h, h_bf16, j), sigma, vload(x + j)));
            for (; j < end; j++) out[j] = fmaf(get1(a->h, h_bf16, j), sigma, x[j]);
        }
    }
    return 0;
}

/* dy (count) fp32; h (count) fp32 or bf16; dh written in h's dtype; *dg = σ(1 − σ)·Σ dy⊙h,
   summed over fixed chunks of CHUNK_ROWS·d values */
int sanlab_gated_residual_bwd(const sanlab_gated_residual_args *a)
{
    const long count = a->count;
    const int d = a->d, h_bf16 = a->h_bf16, nthreads = a->nthreads;
    const float *dy = a->dy;
    const void *h = a->h;
    void *dh = a->dh;
    float *dg = a->dg;
    /* chunks of CHUNK_ROWS rows from each group's first value (one group: the solo sums) */
    const long group = a->group_count > 0 && a->group_count < count ? a->group_count : count;
    const long ngroups = count > 0 ? (count + group - 1) / group : 1;
    const long span = (long)CHUNK_ROWS * d, per = (group + span - 1) / span, nchunks = ngroups * per;
    float *partial = zalloc(sizeof(float) * (nchunks > 0 ? nchunks : 1));
    if (!partial) return 2;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (long c = 0; c < nchunks; c++) {
        const long g0 = c / per * group, gend = g0 + group < count ? g0 + group : count;
        const long lo = g0 + c % per * span, hi = lo + span < gend ? lo + span : gend;
        const float sigma = a->sigmas ? a->sigmas[c / per] : a->sigma;
        vf acc = vsplat(0.0f);
        long j = lo;
        for (; j + VL <= hi; j += VL) {
            const vf g = vload(dy + j);
            acc += g * getv(h, h_bf16, j);
            putv(dh, h_bf16, j, g * sigma);
        }
        float s = hsum(acc);
        for (; j < hi; j++) {
            s += dy[j] * get1(h, h_bf16, j);
            put1(dh, h_bf16, j, sigma * dy[j]);
        }
        partial[c] = s;
    }
    for (long q = 0; q < ngroups; q++) {
        const float sigma = a->sigmas ? a->sigmas[q] : a->sigma;
        float total = 0.0f;
        for (long c = q * per; c < (q + 1) * per; c++) total += partial[c];
        dg[q] = sigma * (1.0f - sigma) * total;
    }
    free(partial);
    return 0;
}
