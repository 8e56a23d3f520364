/* What the two attention implementations share (attention.c: portable fp32 products;
   attention_amx.c: AMX bf16 tile products): operand descriptions, blocking, masking and
   the softmax's row passes. */

#ifndef SANLAB_ATTENTION_H
#define SANLAB_ATTENTION_H

#include "common.h"

/* A strided 4-D input: element (b, h, t, d) at base[b·sb + h·sh + t·st + d]. */
typedef struct {
    const void *base;
    int bf16;
    long sb, sh, st;
} Input;

static inline long at(const Input *x, int b, int h, int t) { return b * x->sb + h * x->sh + t * x->st; }

/* A strided 4-D output, written as fp32 or bf16: element (b, h, t, d) at
   base[b·sb + h·sh + t·st + d]. */
typedef struct {
    void *base;
    int bf16;
    long sb, sh, st;
} Output;

typedef struct {
    int B, H, Hkv, T, D, Dp, Tp, BQ;
} Shape;

/* The per-head QK-norm then RoPE, applied to q and k rows as they are read (the fused
   QKV path: q, k are the raw projections): per (b, t, head) row x, r = (mean(x²) + eps)^-½
   and x -> RoPE(x·r ⊙ γ), rotate-half with the row's tables c, s (D/2 each). */
typedef struct {
    const float *gq, *gk;   /* gains (D) */
    float eps;
    const float *cos, *sin; /* row (b, t) at cos[b·csb + t·cst] */
    long csb, cst;
    float *rq, *rk;         /* r per row, (B, T, H) and (B, T, Hkv): written forward, read backward */
    float *dgq, *dgk;       /* backward: dγ per kv-head task, (B·Hkv, D) each */
    int gain_batches;       /* batches per set of gains (members); 0: one set */
} QKNorm;

/* The gains batch b reads (q's or k's) */
static inline const float *gains(const QKNorm *nm, int is_q, int b, int D)
{
    const float *g = is_q ? nm->gq : nm->gk;
    return nm->gain_batches ? g + (long)(b / nm->gain_batches) * D : g;
}

/* One call's arguments: inputs (dout only in the backward), each row's first visible key
   `start` (B, T), the QK-norm (NULL: q and k are used as given), and the outputs:
   forward, out (B, H, T, D) fp32 (kept for the backward), lse (B, H, T) and y (the
   output as the caller wants it; base NULL for none); backward, dq, dk, dv. */
typedef struct {
    Shape s;
    Input q, k, v, dout;
    const int32_t *start;
    const QKNorm *norm;
    float *out, *lse;
    Output y, dq, dk, dv;
    int nthreads;
} Attn;

static inline long at_out(const Output *o, int b, int h, int t) { return b * o->sb + h * o->sh + t * o->st; }

/* n values of src times mul into output row (b, h, t) */
static inline void store_row(const Output *o, int b, int h, int t, const float *src, int n, float mul)
{
    const long off = at_out(o, b, h, t);
    int d = 0;
    for (; d + VL <= n; d += VL) putv(o->base, o->bf16, off + d, vload(src + d) * mul);
    for (; d < n; d++) put1(o->base, o->bf16, off + d, src[d] * mul);
}

/* The RoPE tables of row (b, t) */
static inline void tables(const QKNorm *nm, int b, int t, const float **c, const float **sn)
{
    *c = nm->cos + b * nm->csb + t * nm->cst;
    *sn = nm->sin + b * nm->csb + t * nm->cst;
}

/* The QK-norm and RoPE of a row that fits one vector of W floats (D = W: the d16 heads of
   the demo and probe models at W = VL, the d8 heads of the facts axis at W = VL/2): the
   rotate-half as a swap of the two halves, (x₁, x₂) -> (x₂, x₁), and the tables as (c, c)
   and (−s, s), instead of a scalar loop over D/2 (which also stalled the vector loads that
   read the row back). The same formulas in the same order as the loops below. Built where
   the compiler has __builtin_shufflevector (GCC 12+, clang); elsewhere the loops run. */
#if (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)) && VL >= 8
#define QK_FAST 1
typedef float vfh __attribute__((vector_size(VL / 2 * sizeof(float))));
typedef int32_t vih __attribute__((vector_size(VL / 2 * sizeof(int32_t))));
typedef uint16_t vhh __attribute__((vector_size(VL / 2 * sizeof(uint16_t))));
typedef float vfq __attribute__((vector_size(VL / 4 * sizeof(float))));
#if VL == 16
#define SWAP_F(x) __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7)
#define DUP_F(h) __builtin_shufflevector(h, h, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7)
#define SWAP_H(x) __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3)
#define DUP_H(h) __builtin_shufflevector(h, h, 0, 1, 2, 3, 0, 1, 2, 3)
#else /* VL == 8 */
#define SWAP_F(x) __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3)
#define DUP_F(h) __builtin_shufflevector(h, h, 0, 1, 2, 3, 0, 1, 2, 3)
#define SWAP_H(x) __builtin_shufflevector(x, x, 2, 3, 0, 1)
#define DUP_H(h) __builtin_shufflevector(h, h, 0, 1, 0, 1)
#endif

/* One row of W floats of an fp32 or bf16 array from element `off`, times `scale` */
static inline vf qk_load_f(const void *p, int bf16, long off, float scale) { return getv(p, bf16, off) * scale; }

static inline vfh qk_load_h(const void *p, int bf16, long off, float scale)
{
    vfh x;
    if (bf16) {
        vhh h;
        memcpy(&h, (const uint16_t *)p + off, sizeof h);
        x = (vfh)(__builtin_convertvector(h, vih) << 16);
    } else {
        memcpy(&x, (const float *)p + off, sizeof x);
    }
    return x * scale;
}

/* W/2 floats -> bf16 as vstore_bf16 (round to nearest even, NaN a quiet NaN) */
static inline void qk_store_h(uint16_t *p, vfh x)
{
    vih u = (vih)x;
    const vih nan = (u & 0x7fffffff) > 0x7f800000;
    u = (u + 0x7fff + ((u >> 16) & 1)) >> 16;
    u = (u & ~nan) | (((vih)x >> 16 | 0x40) & nan);
    const vhh h = __builtin_convertvector(u & 0xffff, vhh);
    memcpy(p, &h, sizeof h);
}

static inline float qk_hsum_h(vfh v)
{
    float s = 0.0f;
    for (int i = 0; i < VL / 2; i++) s += v[i];
    return s;
}

/* Both widths from one body: T the vector type, HT the type of its half, the suffix's
   load, horizontal sum, swap and duplicate. Forward: dst = RoPE(x·r ⊙ γ), x the raw row
   (r from it when `write_r`); backward: see emit_qk_grad. */
#define QK_WIDTH(SUF, T, HT, LOAD, HSUM, SWAP, DUP, STORE_BF16)                                                     \
    static inline void qk_fwd_##SUF(const Input *x, long off, const QKNorm *nm, float *rs, int write_r, float scale,\
                                    const float *g, const float *c, const float *sn, float *dst)                    \
    {                                                                                                               \
        const int W = (int)(sizeof(T) / sizeof(float));                                                             \
        const T v = LOAD(x->base, x->bf16, off, 1.0f);                                                              \
        if (write_r) *rs = 1.0f / sqrtf(HSUM(v * v) / W + nm->eps);                                                 \
        HT ch, sh;                                                                                                  \
        T gv;                                                                                                       \
        memcpy(&ch, c, sizeof ch);                                                                                  \
        memcpy(&sh, sn, sizeof sh);                                                                                 \
        memcpy(&gv, g, sizeof gv);                                                                                  \
        const T n = v * (*rs * scale) * gv, cv = DUP(ch), sv = DUP(sh);                                             \
        T sgn;                                                                                                      \
        for (int i = 0; i < W; i++) sgn[i] = i < W / 2 ? -1.0f : 1.0f;                                              \
        const T out = n * cv + SWAP(n) * (sv * sgn);                                                                \
        memcpy(dst, &out, sizeof out);                                                                              \
    }                                                                                                               \
    static inline void qk_bwd_##SUF(const Input *x, long off, float r, const float *g, const float *c,              \
                                    const float *sn, float *grad, float mul, float *acc, const Output *o, long oo)  \
    {                                                                                                               \
        const int W = (int)(sizeof(T) / sizeof(float));                                                             \
        const T n = LOAD(x->base, x->bf16, off, r);                                                                 \
        HT ch, sh;                                                                                                  \
        T gv, gr, ac;                                                                                               \
        memcpy(&ch, c, sizeof ch);                                                                                  \
        memcpy(&sh, sn, sizeof sh);                                                                                 \
        memcpy(&gv, g, sizeof gv);                                                                                  \
        memcpy(&gr, grad, sizeof gr);                                                                               \
        memcpy(&ac, acc, sizeof ac);                                                                                \
        T sgn;                                                                                                      \
        for (int i = 0; i < W; i++) sgn[i] = i < W / 2 ? 1.0f : -1.0f;                                              \
        const T gm = gr * mul, u = gm * DUP(ch) + SWAP(gm) * (DUP(sh) * sgn);                                       \
        ac = ac + n * u;                                                                                            \
        memcpy(acc, &ac, sizeof ac);                                                                                \
        const T gu = u * gv;                                                                                        \
        const float dot = HSUM(gu * n) / W;                                                                         \
        const T dx = (gu - n * dot) * r;                                                                            \
        if (o->bf16) {                                                                                              \
            STORE_BF16((uint16_t *)o->base + oo, dx);                                                               \
        } else {                                                                                                    \
            memcpy((float *)o->base + oo, &dx, sizeof dx);                                                          \
        }                                                                                                           \
    }

QK_WIDTH(f, vf, vfh, qk_load_f, hsum, SWAP_F, DUP_F, vstore_bf16)
QK_WIDTH(h, vfh, vfq, qk_load_h, qk_hsum_h, SWAP_H, DUP_H, qk_store_h)
#endif

/* Row (b, head, t) of q (is_q) or k into dst[0, D), times `scale`: as given, or through
   the QK-norm (its r is written forward, read backward: `write_r`). */
static inline void load_qk(const Attn *a, int is_q, int b, int head, int t, float scale, int write_r, float *dst)
{
    const Input *x = is_q ? &a->q : &a->k;
    const int D = a->s.D;
    const QKNorm *nm = a->norm;
    if (!nm) {
        load_row(dst, x->base, x->bf16, at(x, b, head, t), D, scale);
        return;
    }
    const int nh = is_q ? a->s.H : a->s.Hkv, half = D / 2;
    float *rs = (is_q ? nm->rq : nm->rk) + ((long)b * a->s.T + t) * nh + head;
    const float *g = gains(nm, is_q, b, D);
    const float *c, *sn;
    tables(nm, b, t, &c, &sn);
#ifdef QK_FAST
    if (D == VL) {
        qk_fwd_f(x, at(x, b, head, t), nm, rs, write_r, scale, g, c, sn, dst);
        return;
    }
    if (D == VL / 2) {
        qk_fwd_h(x, at(x, b, head, t), nm, rs, write_r, scale, g, c, sn, dst);
        return;
    }
#endif
    load_row(dst, x->base, x->bf16, at(x, b, head, t), D, 1.0f);
    if (write_r) *rs = 1.0f / sqrtf(dot_f32(dst, dst, D) / D + nm->eps);
    const float r = *rs * scale;
    int d = 0;
    for (; d + VL <= half; d += VL) {
        const vf n1 = vload(dst + d) * r * vload(g + d), n2 = vload(dst + half + d) * r * vload(g + half + d);
        const vf cv = vload(c + d), sv = vload(sn + d);
        vstore(dst + d, n1 * cv - n2 * sv);
        vstore(dst + half + d, n2 * cv + n1 * sv);
    }
    for (; d < half; d++) {
        const float n1 = dst[d] * r * g[d], n2 = dst[d + half] * r * g[d + half];
        dst[d] = n1 * c[d] - n2 * sn[d];
        dst[d + half] = n2 * c[d] + n1 * sn[d];
    }
}

/* The gradient of row (b, head, t) of q or k, given w.r.t. what attention read (after the
   QK-norm), in grad[0, D) (clobbered), times mul, written to `o`. With the QK-norm it first
   goes through the norm's backward: u = RoPE⁻¹(grad), dγ += n ⊙ u (into acc),
   dx = r·(γ⊙u − n·⟨γ⊙u, n⟩/D) with n = x·r the raw row normalised. */
static inline void emit_qk_grad(const Attn *a, int is_q, int b, int head, int t, float *grad, float mul, float *acc)
{
    const Output *o = is_q ? &a->dq : &a->dk;
    const QKNorm *nm = a->norm;
    const int D = a->s.D;
    if (!nm) {
        store_row(o, b, head, t, grad, D, mul);
        return;
    }
    const Input *x = is_q ? &a->q : &a->k;
    const int nh = is_q ? a->s.H : a->s.Hkv, half = D / 2;
    const float r = (is_q ? nm->rq : nm->rk)[((long)b * a->s.T + t) * nh + head], *g = gains(nm, is_q, b, D);
    const float *c, *sn;
    tables(nm, b, t, &c, &sn);
#ifdef QK_FAST
    if (D == VL) {
        qk_bwd_f(x, at(x, b, head, t), r, g, c, sn, grad, mul, acc, o, at_out(o, b, head, t));
        return;
    }
    if (D == VL / 2) {
        qk_bwd_h(x, at(x, b, head, t), r, g, c, sn, grad, mul, acc, o, at_out(o, b, head, t));
        return;
    }
#endif
    float n[1024];
    load_row(n, x->base, x->bf16, at(x, b, head, t), D, r);
    int d = 0;
    for (; d + VL <= half; d += VL) {
        const vf g1 = vload(grad + d) * mul, g2 = vload(grad + half + d) * mul, cv = vload(c + d), sv = vload(sn + d);
        const vf u1 = g1 * cv + g2 * sv, u2 = g2 * cv - g1 * sv;
        vstore(acc + d, vload(acc + d) + vload(n + d) * u1);
        vstore(acc + half + d, vload(acc + half + d) + vload(n + half + d) * u2);
        vstore(grad + d, u1 * vload(g + d));
        vstore(grad + half + d, u2 * vload(g + half + d));
    }
    for (; d < half; d++) {
        const float g1 = grad[d] * mul, g2 = grad[d + half] * mul;
        const float u1 = g1 * c[d] + g2 * sn[d], u2 = g2 * c[d] - g1 * sn[d];
        acc[d] += n[d] * u1;
        acc[d + half] += n[d + half] * u2;
        grad[d] = u1 * g[d];
        grad[d + half] = u2 * g[d + half];
    }
    const float dot = dot_f32(grad, n, D) / D;
    for (d = 0; d + VL <= D; d += VL) vstore(grad + d, (vload(grad + d) - vload(n + d) * dot) * r);
    for (; d < D; d++) grad[d] = r * (grad[d] - n[d] * dot);
    store_row(o, b, head, t, grad, D, 1.0f);
}

/* rows per query block: the block's scores (BQ × T fp32) within ~256 KB (L2), a multiple
   of `unit` (the row panel) */
static inline int block_rows(int T, int unit)
{
    long bq = (256L * 1024 / 4) / round_up(T, NW);
    if (bq > 64) bq = 64;
    bq = bq / unit * unit;
    if (bq < unit) bq = unit;
    return (int)bq;
}

/* The key interval of row panel [i0, i0 + MR) of a block whose keys start at `lo`
   (a multiple of NW): [n0, n1) relative to lo, n0 a multiple of NW below every row's
   start, n1 a multiple of NW past the panel's last row. */
static inline void panel_keys(const int32_t *start, int i0, int rows, int lo, int *n0, int *n1)
{
    int first = start[i0];
    int last = i0 + rows - 1;
    *n0 = (first - lo) / NW * NW;
    *n1 = (int)round_up(last + 1 - lo, NW);
}

/* panel_keys with n1 a multiple of VL (the portable kernel's key panels may end half way) */
static inline void panel_keys_vl(const int32_t *start, int i0, int rows, int lo, int *n0, int *n1)
{
    *n0 = (start[i0] - lo) / NW * NW;
    *n1 = (int)round_up(i0 + rows - lo, VL);
}

/* Rows [0, rows) of two (·, ld) fp32 buffers: columns [0, n0) and [n1, hi) set to zero. */
static inline void zero_outside(float *x, float *y, long ld, int rows, int n0, int n1, int hi)
{
    for (int r = 0; r < rows; r++) {
        memset(x + r * ld, 0, sizeof(float) * n0);
        memset(y + r * ld, 0, sizeof(float) * n0);
        if (hi > n1) {
            memset(x + r * ld + n1, 0, sizeof(float) * (hi - n1));
            memset(y + r * ld + n1, 0, sizeof(float) * (hi - n1));
        }
    }
}

/* row[j] = −inf for the keys j in [n0, a) and [e, n1) (n0 and n1 multiples of VL, n0 ≤ a < e
   ≤ n1), a vector at a time where the scores were stored: a scalar store into a vector that
   is loaded right after makes the load wait (a store that cannot be forwarded) */
static inline void mask_outside(float *row, int n0, int n1, int a, int e)
{
    vi lane;
    for (int l = 0; l < VL; l++) lane[l] = l;
    const vf ninf = vsplat(-INFINITY);
    for (int j = n0; j < a; j += VL) {
        const vi key = lane + j;
        vstore(row + j, vselect((key >= a) & (key < e), vload(row + j), ninf));
    }
    for (int j = n0 + (e - n0) / VL * VL; j < n1; j += VL) {
        const vi key = lane + j;
        vstore(row + j, vselect((key >= a) & (key < e), vload(row + j), ninf));
    }
}

/* Row i of a block, its scores row[n0, n1) (keys relative to the block's first key; n0
   a multiple of NW, n1 of VL), of which [a, e) are allowed: the rest of [n0, n1) is set
   to −inf, the allowed ones to exp(s − max). Returns the sum of the exponentials; *mx
   gets the max. (Two vectors a step: two independent chains for the max and the sum. A
   last single vector joins the first chain, where a whole NW panel put it: the second
   would have added exp(−inf) = 0, so the sums have the bits of an NW-rounded n1.) */
static inline float softmax_row(float *row, int n0, int n1, int a, int e, float *mx)
{
    mask_outside(row, n0, n1, a, e);
    vf m0 = vsplat(-INFINITY), m1 = m0;
    int j = n0;
    for (; j + 2 * VL <= n1; j += 2 * VL) {
        m0 = vmax(m0, vload(row + j));
        m1 = vmax(m1, vload(row + j + VL));
    }
    if (j < n1) m0 = vmax(m0, vload(row + j));
    const float m = hmax(vmax(m0, m1));
    vf s0 = vsplat(0.0f), s1 = s0;
    for (j = n0; j + 2 * VL <= n1; j += 2 * VL) {
        const vf p0 = vexp(vload(row + j) - m), p1 = vexp(vload(row + j + VL) - m);
        vstore(row + j, p0);
        vstore(row + j + VL, p1);
        s0 += p0;
        s1 += p1;
    }
    if (j < n1) {
        const vf p0 = vexp(vload(row + j) - m);
        vstore(row + j, p0);
        s0 += p0;
    }
    *mx = m;
    return hsum(s0 + s1);
}

/* The backward's pass over row i: p[n0, n1) holds the scores and ds[n0, n1) dP; p becomes
   P = exp(s − lse) (0 outside the allowed [a, e)) and ds becomes P ⊙ (dP − δ). */
static inline void grad_row(float *p, float *ds, int n0, int n1, int a, int e, float lse, float delta)
{
    mask_outside(p, n0, n1, a, e);
    for (int j = n0; j < n1; j += VL) {
        const vf pv = vexp(vload(p + j) - lse);
        vstore(p + j, pv);
        vstore(ds + j, pv * (vload(ds + j) - delta));
    }
}

int attn_fwd_amx(const Attn *a);
int attn_bwd_amx(const Attn *a);
int amx_available(void);

#endif
