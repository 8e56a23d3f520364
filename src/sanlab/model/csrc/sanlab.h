/* The compiled kernels' interface: what sanlab.model.native loads and mirrors in ctypes.

   Every entry point takes its arguments as one struct, by name, and returns 0; 1 when an
   argument is out of range; 2 when a buffer could not be allocated. A field a call does
   not use is NULL or 0. sanlab.model.native reads SANLAB_ABI_VERSION from this file and
   refuses (or rebuilds) a library that reports another version or other struct sizes;
   tests/test_native.py holds its ctypes structs against the ones below, field by field.
   Change a struct, a field or an entry point: bump SANLAB_ABI_VERSION and change the
   mirror in sanlab/model/native.py. */

#ifndef SANLAB_H
#define SANLAB_H

#include <stdint.h>

#define SANLAB_ABI_VERSION 7

/* A strided operand, its last dim contiguous: element (b, h, t, d) at
   data + (b·sb + h·sh + t·st + d) elements; fp32, or bf16 where bf16 is 1. */
typedef struct {
    void *data;
    int32_t bf16;
    int64_t sb;
    int64_t sh;
    int64_t st;
} sanlab_tensor;

/* Fused attention, forward and backward (attention.c): q (B, H, T, D), k, v (B, Hkv, T, D);
   row i of batch b sees keys [start[b·T + i], i]. With gq set, q and k are raw QKV rows
   that go through the per-head QK-norm then RoPE as they are read. */
typedef struct {
    int32_t B;
    int32_t H;
    int32_t Hkv;
    int32_t T;
    int32_t D;
    sanlab_tensor q;
    sanlab_tensor k;
    sanlab_tensor v;
    sanlab_tensor dout;    /* backward: the output's gradient */
    const int32_t *start;  /* (B, T) */
    const float *gq;       /* QK-norm gains (D); NULL: q and k are used as given */
    const float *gk;
    float eps;
    const float *cos;      /* RoPE tables: row (b, t) at cos[b·csb + t·cst], D/2 used */
    const float *sin;
    int64_t csb;
    int64_t cst;
    float *rq;             /* 1/RMS of each q row (B, T, H): forward writes, backward reads */
    float *rk;             /* and of each k row (B, T, Hkv) */
    float *dgq;            /* backward: the gains' gradients (D) */
    float *dgk;
    float *out;            /* (B, H, T, D) fp32: forward writes, backward reads */
    float *lse;            /* (B, H, T): forward writes, backward reads */
    sanlab_tensor y;       /* forward: the output as the caller wants it (data NULL: none) */
    sanlab_tensor dq;      /* backward: the inputs' gradients */
    sanlab_tensor dk;
    sanlab_tensor dv;
    int32_t nthreads;
    int32_t mode;          /* 0: the fastest products this CPU has (AMX); 1: portable fp32 */
    int32_t gain_batches;  /* batches per set of gains: batch b reads gq, gk at (b / gain_batches)·D and
                              its dγ goes to dgq, dgk at that offset (members); 0: one set for all */
} sanlab_attn_args;

/* Per-head QK-norm then RoPE (norm_rope.c): x (B, T, h, D), its strides in x.sb, x.st and
   x.sh; out (B, h, T, D) fp32 contiguous; dy (B, h, T, D) fp32 (its strides in dy.sb,
   dy.sh, dy.st); dx (B, T, h, D) contiguous in dx's dtype. */
typedef struct {
    int32_t B;
    int32_t T;
    int32_t h;
    int32_t D;
    sanlab_tensor x;
    const float *gain;     /* (D), shared by the heads */
    float eps;
    const float *cos;      /* row (b, t) at cos[b·csb + t·cst], D/2 each */
    const float *sin;
    int64_t csb;
    int64_t cst;
    float *r;              /* (B, T, h): forward writes, backward reads */
    float *out;            /* forward */
    sanlab_tensor dy;      /* backward */
    sanlab_tensor dx;      /* backward (dx.data, dx.bf16 read; contiguous) */
    float *dgain;          /* backward: (D), or NULL when the gain needs no gradient */
    int32_t nthreads;
} sanlab_norm_rope_args;

/* RMS norm over rows (norms.c): x (n, d) fp32 contiguous; out (n, d) in out_bf16's dtype;
   dy (n, d) in dy_bf16's; dx (n, d) fp32. */
typedef struct {
    int64_t n;
    int32_t d;
    const float *x;
    const float *gain;     /* (d) */
    float eps;
    float *r;              /* (n): forward writes, backward reads */
    void *out;             /* forward */
    int32_t out_bf16;
    const void *dy;        /* backward */
    int32_t dy_bf16;
    float *dx;
    float *dgain;          /* (d), or NULL */
    int32_t nthreads;
    int64_t group_rows;    /* rows per gain: row i reads gain at (i / group_rows)·d and its dγ goes to
                              dgain at that offset, summed per group as a group of its own (members);
                              0: one gain for all rows */
} sanlab_rms_norm_args;

/* The gated residual (norms.c): forward out = x + σ·h (the product rounded before the sum,
   as torch's addcmul); backward dh = σ·dy in h's dtype, *dg = σ(1 − σ)·Σ dy⊙h. */
typedef struct {
    int64_t count;         /* values of dy, h and dh */
    int32_t d;             /* row width (the sums run over fixed chunks of rows) */
    const float *dy;
    const void *h;
    int32_t h_bf16;
    float sigma;
    void *dh;
    float *dg;
    int32_t nthreads;
    int64_t group_count;   /* values per gate: value j reads sigmas[j / group_count] and its sum goes
                              to dg at that index, summed per group as a group of its own (members);
                              0: the one gate `sigma` */
    const float *sigmas;
    const float *x;        /* the forward's residual stream (count) fp32 */
    float *out;            /* the forward's x + σ·h (count) fp32 */
} sanlab_gated_residual_args;

/* The head's cross-entropy and z-loss over a chunk of logits (head.c): logits (n, V), row i
   at logits + i·ld elements, fp32 or bf16; per row lse (log Σ exp) and x_t (the target's
   logit) in fp32; with grad set, the gradient of Σ_i w_i·(lse_i − x_t,i) + c·w_i·lse_i²
   with respect to the logits, row i at grad + i·ld_grad in grad_bf16's dtype. A target
   outside [0, V) is refused (1). */
typedef struct {
    int64_t n;
    int32_t V;
    const void *logits;
    int32_t logits_bf16;
    int64_t ld;
    const int64_t *targets; /* (n) */
    const float *weights;   /* (n): w */
    float c;
    float *lse;             /* (n) */
    float *x_t;             /* (n) */
    void *grad;             /* NULL: no gradient */
    int32_t grad_bf16;
    int64_t ld_grad;
    int32_t nthreads;
} sanlab_head_ce_args;

/* SiLU(gate) ⊙ up from the fused [gate | up] product (swiglu.c), torch's formulas bit for bit
   where torch's exp is SLEEF's u10: forward y = SiLU(gate)·up; backward [d gate | d up]. */
typedef struct {
    int64_t rows;
    int32_t F;             /* gate's (and up's) width: a row of gate_up, and of grad, is 2F values */
    const void *gate_up;   /* (rows, 2F) contiguous */
    int32_t bf16;          /* gate_up, y, dy and grad are all bf16 (1) or all fp32 (0) */
    void *y;               /* forward: (rows, F) */
    const void *dy;        /* backward: (rows, F) */
    void *grad;            /* backward: (rows, 2F) */
    int32_t nthreads;
    int32_t vec_cols;      /* a row's first vec_cols values take the vector exp, the rest the C library's expf */
} sanlab_silu_gate_args;

int sanlab_abi_version(void);
/* sizeof of the structs above, in their order, into sizes[0, n); returns how many there are */
int sanlab_abi_sizes(int64_t *sizes, int n);
int sanlab_amx_available(void);
int sanlab_attn_fwd(const sanlab_attn_args *a);
int sanlab_attn_bwd(const sanlab_attn_args *a);
int sanlab_norm_rope_fwd(const sanlab_norm_rope_args *a);
int sanlab_norm_rope_bwd(const sanlab_norm_rope_args *a);
int sanlab_rms_norm_fwd(const sanlab_rms_norm_args *a);
int sanlab_rms_norm_bwd(const sanlab_rms_norm_args *a);
int sanlab_gated_residual_fwd(const sanlab_gated_residual_args *a);
int sanlab_gated_residual_bwd(const sanlab_gated_residual_args *a);
int sanlab_head_ce(const sanlab_head_ce_args *a);
int sanlab_silu_gate_fwd(const sanlab_silu_gate_args *a);
int sanlab_silu_gate_bwd(const sanlab_silu_gate_args *a);

#endif
