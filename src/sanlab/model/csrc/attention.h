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

typedef struct {
    int B, H, Hkv, T, D, Dp, Tp, BQ;
} Shape;

/* One call's arguments: inputs (dout only in the backward), each row's first visible key
   `start` (B, T), and the outputs: out (B, H, T, D) fp32 and lse (B, H, T) forward;
   dq (B, H, T, D), dk, dv (B, Hkv, T, D) fp32 backward. */
typedef struct {
    Shape s;
    Input q, k, v, dout;
    const int32_t *start;
    float *out, *lse, *dq, *dk, *dv;
    int nthreads;
} Attn;

/* rows per query block: the block's scores (BQ × T fp32) within ~256 KB (L2), a multiple
   of `unit` (the row panel) */
static inline int block_rows(int T, int unit)
{
    long bq = (256L * 1024 / 4) / round_up(T, NW);
    bq = bq / unit * unit;
    if (bq > 64) bq = 64;
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

/* Row i of a block, its scores row[n0, n1) (keys relative to the block's first key; n0,
   n1 multiples of NW), of which [a, e) are allowed: the rest of [n0, n1) is set to −inf,
   the allowed ones to exp(s − max). Returns the sum of the exponentials; *mx gets the
   max. (Two vectors a step: two independent chains for the max and the sum.) */
static inline float softmax_row(float *row, int n0, int n1, int a, int e, float *mx)
{
    for (int j = n0; j < a; j++) row[j] = -INFINITY;
    for (int j = e; j < n1; j++) row[j] = -INFINITY;
    vf m0 = vsplat(-INFINITY), m1 = m0;
    for (int j = n0; j < n1; j += 2 * VL) {
        m0 = vmax(m0, vload(row + j));
        m1 = vmax(m1, vload(row + j + VL));
    }
    const float m = hmax(vmax(m0, m1));
    vf s0 = vsplat(0.0f), s1 = s0;
    for (int j = n0; j < n1; j += 2 * VL) {
        const vf p0 = vexp(vload(row + j) - m), p1 = vexp(vload(row + j + VL) - m);
        vstore(row + j, p0);
        vstore(row + j + VL, p1);
        s0 += p0;
        s1 += p1;
    }
    *mx = m;
    return hsum(s0 + s1);
}

/* The backward's pass over row i: p[n0, n1) holds the scores and ds[n0, n1) dP; p becomes
   P = exp(s − lse) (0 outside the allowed [a, e)) and ds becomes P ⊙ (dP − δ). */
static inline void grad_row(float *p, float *ds, int n0, int n1, int a, int e, float lse, float delta)
{
    for (int j = n0; j < a; j++) p[j] = -INFINITY;
    for (int j = e; j < n1; j++) p[j] = -INFINITY;
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
