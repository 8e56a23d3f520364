/* SiLU(gate) ⊙ up from the fused [gate | up] product (sanlab.model.kernels._NativeSiLUGate),
   one pass over the activations each way.

   Forward  y = a ⊙ up, a = gate / (1 + exp(−gate)) (SiLU);
   backward d up = dy ⊙ a, d gate = (t·s)·(1 + gate·(1 − s)), t = dy ⊙ up, s = 1 / (1 + exp(−gate)).

   Each value is torch's bit for bit, where torch's vector exp is SLEEF's expf u10 with
   fused multiply-adds (x86 with AVX2 or AVX-512): F.silu, the product, and
   aten::silu_backward each round to the tensor's dtype as torch's kernels do (a and t in
   bf16 for bf16 activations), in the same order of operations, so the model trains the
   same bits as through `_SiLUGate`'s torch formulas. torch's loops run a row's first
   values by vector blocks and the rest by its scalar code, which calls the C library's
   expf: the first `vec_cols` values of a row here take the vector exp and the rest expf.
   Where torch's operations differ (another exp, a row split between threads elsewhere),
   the values stay within the formula's rounding.

   A bf16 gate has 65,536 possible values: a and s of each are tables built by the same
   vector code when the library loads, and a row reads them by gathers (at the demo's FFN
   width, an exp and a division a value made the forward take about twice as long). The
   backward takes a and s from gate again instead of keeping a: a third less memory held
   for the backward. */

/* No contraction of a·b + c into one rounding unless written as fma: the order of roundings
   is the point (torch's kernels round the product before the sum where they do). */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "common.h"
#include "sanlab.h"
#if defined(__AVX2__) || defined(__FMA__)
#include <immintrin.h>
#endif

typedef uint32_t vu __attribute__((vector_size(VL * sizeof(uint32_t))));

/* a·b + c per lane, rounded once (all three vectors) */
static inline vf vfmav(vf a, vf b, vf c)
{
#if defined(__AVX512F__)
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__) && VL == 8
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    vf r;
    for (int i = 0; i < VL; i++) r[i] = fmaf(a[i], b[i], c[i]);
    return r;
#endif
}

/* exp(d) as SLEEF's expf u10 computes it (xexpf): q = rint(d·log2 e), s = d − q·ln 2 in two
   fused steps, a degree-6 polynomial by fused steps, 1 + s + s²·u, scaled by 2^q as two
   factors; 0 below −104, +inf above 104. The rint rounds the rounded product (nearest
   even; garbage only for |d·log2 e| ≥ 2^22, where the bounds decide). */
static inline vf vexp_u10(vf d)
{
    const vf magic = vsplat(12582912.0f); /* 1.5·2^23 */
    const vf p = d * 1.442695040888963407359924681001892137426645954152985934135449406931f;
    const vf q = (p + magic) - magic;
    vf s = vfmav(q, vsplat(-0.693145751953125f), d);
    s = vfmav(q, vsplat(-1.428606765330187045e-06f), s);
    vf u = vsplat(0.000198527617612853646278381f);
    u = vfmav(u, s, vsplat(0.00139304355252534151077271f));
    u = vfmav(u, s, vsplat(0.00833336077630519866943359f));
    u = vfmav(u, s, vsplat(0.0416664853692054748535156f));
    u = vfmav(u, s, vsplat(0.166666671633720397949219f));
    u = vfmav(u, s, vsplat(0.5f));
    u = vsplat(1.0f) + vfmav(s * s, u, s);
    const vi qi = __builtin_convertvector(q, vi);
    const vi m = qi >> 1;
    u = u * (vf)((vu)(m + 0x7f) << 23) * (vf)((vu)(qi - m + 0x7f) << 23);
    u = vselect(d < -104.0f, vsplat(0.0f), u);
    return vselect(d > 104.0f, vsplat(INFINITY), u);
}

/* x rounded to bf16 and back (nearest even, NaN a quiet NaN): what a bf16 tensor holds */
static inline vf vround_bf16(vf x)
{
    vi u = (vi)x;
    const vi nan = (u & 0x7fffffff) > 0x7f800000;
    u = (u + 0x7fff + ((u >> 16) & 1)) & ~0xffff;
    return (vf)((u & ~nan) | (((vi)x | 0x400000) & ~0xffff & nan));
}

/* For bf16 activations, SiLU(g) rounded to bf16 and s = 1 / (1 + exp(−g)) for every bf16 g,
   built by the vector code below when the library loads (512 KB, read by gathers: the
   slope 1 + g·(1 − s) from s costs less than a third gather) */
static float ACT[1 << 16], SIG[1 << 16];

static inline vf vgather(const float *table, vi idx)
{
#if defined(__AVX512F__)
    return (vf)_mm512_i32gather_ps((__m512i)idx, table, 4);
#elif defined(__AVX2__) && VL == 8
    return (vf)_mm256_i32gather_ps(table, (__m256i)idx, 4);
#else
    vf r;
    for (int i = 0; i < VL; i++) r[i] = table[idx[i]];
    return r;
#endif
}

/* the table index of a vector of bf16 values read as floats: their bits */
static inline vi bf16_bits(vf g) { return (vi)((vu)g >> 16); }

/* y = SiLU(g)·up, SiLU(g) rounded to bf16 first for bf16 activations (F.silu's tensor) */
static inline vf fwd_vec(vf g, vf up, int bf16)
{
    if (bf16) return vgather(ACT, bf16_bits(g)) * up;
    return g / (1.0f + vexp_u10(-g)) * up;
}

/* d gate into *dg, d up into *du: torch's silu_backward of t = dy·up (rounded to bf16 for bf16
   activations), and dy·SiLU(g) */
static inline void bwd_vec(vf g, vf up, vf dy, int bf16, vf *dg, vf *du)
{
    if (bf16) {
        const vi idx = bf16_bits(g);
        const vf s = vgather(SIG, idx);
        *du = dy * vgather(ACT, idx);
        *dg = (vround_bf16(dy * up) * s) * vfmav(g, 1.0f - s, vsplat(1.0f));
        return;
    }
    const vf e1 = 1.0f + vexp_u10(-g), s = 1.0f / e1;
    *du = dy * (g / e1);
    *dg = ((dy * up) * s) * vfmav(g, 1.0f - s, vsplat(1.0f));
}

__attribute__((constructor)) static void build_tables(void)
{
    for (int i = 0; i < 1 << 16; i += VL) {
        vi bits;
        for (int l = 0; l < VL; l++) bits[l] = (i + l) << 16;
        const vf g = (vf)bits, e1 = 1.0f + vexp_u10(-g), s = 1.0f / e1;
        vstore(ACT + i, vround_bf16(g / e1));
        vstore(SIG + i, s);
    }
}

/* n < VL values of an fp32 or bf16 array from element j into a vector (zeros past n), and back */
static inline vf load_part(const void *p, int bf16, long j, int n)
{
    float buf[VL] = {0};
    for (int i = 0; i < n; i++) buf[i] = get1(p, bf16, j + i);
    return vload(buf);
}

static inline void store_part(void *p, int bf16, long j, int n, vf x)
{
    for (int i = 0; i < n; i++) put1(p, bf16, j + i, x[i]);
}

/* row r's forward: gate_up from element in, y from element out */
static void fwd_row(const sanlab_silu_gate_args *a, long in, long out)
{
    const int F = a->F, bf16 = a->bf16, vec_cols = a->vec_cols;
    const void *gu = a->gate_up;
    int j = 0;
    for (; j + VL <= vec_cols; j += VL)
        putv(a->y, bf16, out + j, fwd_vec(getv(gu, bf16, in + j), getv(gu, bf16, in + F + j), bf16));
    if (j < vec_cols) {
        const int n = vec_cols - j;
        store_part(a->y, bf16, out + j, n, fwd_vec(load_part(gu, bf16, in + j, n), load_part(gu, bf16, in + F + j, n),
                                                   bf16));
        j = vec_cols;
    }
    for (; j < F; j++) {
        const float g = get1(gu, bf16, in + j);
        float act = g / (1.0f + expf(-g));
        if (bf16) act = bf16_to_f32(f32_to_bf16(act));
        put1(a->y, bf16, out + j, act * get1(gu, bf16, in + F + j));
    }
}

/* row r's backward: gate_up and grad from element in, dy from element out */
static void bwd_row(const sanlab_silu_gate_args *a, long in, long out)
{
    const int F = a->F, bf16 = a->bf16, vec_cols = a->vec_cols;
    const void *gu = a->gate_up;
    vf dg, du;
    int j = 0;
    for (; j + VL <= vec_cols; j += VL) {
        bwd_vec(getv(gu, bf16, in + j), getv(gu, bf16, in + F + j), getv(a->dy, bf16, out + j), bf16, &dg, &du);
        putv(a->grad, bf16, in + j, dg);
        putv(a->grad, bf16, in + F + j, du);
    }
    if (j < vec_cols) {
        const int n = vec_cols - j;
        bwd_vec(load_part(gu, bf16, in + j, n), load_part(gu, bf16, in + F + j, n),
                load_part(a->dy, bf16, out + j, n), bf16, &dg, &du);
        store_part(a->grad, bf16, in + j, n, dg);
        store_part(a->grad, bf16, in + F + j, n, du);
        j = vec_cols;
    }
    for (; j < F; j++) {
        const float g = get1(gu, bf16, in + j), dy = get1(a->dy, bf16, out + j);
        const float act = g / (1.0f + expf(-g)), s = 1.0f / (1.0f + expf(-g));
        float t = dy * get1(gu, bf16, in + F + j);
        if (bf16) t = bf16_to_f32(f32_to_bf16(t));
        put1(a->grad, bf16, in + F + j, dy * (bf16 ? bf16_to_f32(f32_to_bf16(act)) : act));
        put1(a->grad, bf16, in + j, (t * s) * fmaf(g, 1.0f - s, 1.0f));
    }
}

/* `row` over every row, split between the threads (each value its own: no sums) */
static int each_row(const sanlab_silu_gate_args *a, void (*row)(const sanlab_silu_gate_args *, long, long))
{
    const long rows = a->rows, F = a->F;
    if (rows < 0 || F < 0 || a->vec_cols < 0 || a->vec_cols > F) return 1;
#pragma omp parallel for schedule(static) num_threads(a->nthreads)
    for (long r = 0; r < rows; r++) row(a, r * 2 * F, r * F);
    return 0;
}

int sanlab_silu_gate_fwd(const sanlab_silu_gate_args *a) { return each_row(a, fwd_row); }

int sanlab_silu_gate_bwd(const sanlab_silu_gate_args *a) { return each_row(a, bwd_row); }
