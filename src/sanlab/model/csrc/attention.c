/* Fused CPU attention, forward and backward (sanlab.model.native loads this file).

   out_i = Σ_j P_ij v_j with P_i = softmax_j(q_i·k_j/√D) over the keys row i may see:
   j ∈ [start_i, i] (causal, and inside the document that contains i: packed rows hold
   whole runs of one segment id, so the allowed keys of a row are one interval).
   Grouped-query attention: query head h reads kv head h / (H / Hkv).

   Every product and reduction runs in fp32 (inputs may be fp32 or bf16; bf16 widens
   exactly), the same arithmetic as `attention_reference` up to the order of sums. The
   query axis is cut into blocks of BQ rows; a block's scores against the keys it can
   see are formed, normalised and consumed while they are in cache, so no (T, T) tensor
   exists, and key panels outside a row panel's interval are never computed (a panel's
   keys end at the first multiple of VL past its last row, not of NW: at T 128 that is
   10% fewer scores, and exp, than whole NW panels, with the same bits). The
   forward keeps each row's log-sum-exp; the backward recomputes P from it
   (FlashAttention's scheme):
       dV += Pᵀ dO,  dP = dO Vᵀ,  dS = P ⊙ (dP − δ) with δ_i = dO_i·O_i,
       dQ = dS K / √D,  dK += dSᵀ Q / √D.
   Parallel over (batch, head, block) forward and (batch, kv head) backward with
   OpenMP; each task writes its own outputs, so results do not depend on the thread
   count or the schedule. Written with GCC vector extensions (gcc or clang), so the
   vectors are the target's native width (common.h): AVX-512, AVX2 or NEON. */

#include "attention.h"
#include "sanlab.h"

/* ------------------------------------------------------------------ micro-kernels */

/* C[m][0:NW] (+)= Σ_{k<K} A(m, k) · B[k][0:NW] for m < MR, A(m, k) = A[m·am + k·ak];
   only C's first `mr` rows are read and written (the others are computed from whatever
   A holds there and dropped). */
static inline void panel_rows(int mr, int K, const float *A, long am, long ak, const float *B, long ldb,
                              float *C, long ldc, int acc)
{
    vf c0[MR], c1[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; m++) {
        if (acc && m < mr) {
            c0[m] = vload(C + m * ldc);
            c1[m] = vload(C + m * ldc + VL);
        } else {
            c0[m] = vsplat(0.0f);
            c1[m] = vsplat(0.0f);
        }
    }
    for (int k = 0; k < K; k++) {
        const vf b0 = vload(B + k * ldb), b1 = vload(B + k * ldb + VL);
        const float *a = A + k * ak;
#pragma GCC unroll 8
        for (int m = 0; m < MR; m++) {
            const float s = a[m * am];
            c0[m] += s * b0;
            c1[m] += s * b1;
        }
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; m++) {
        if (m < mr) {
            vstore(C + m * ldc, c0[m]);
            vstore(C + m * ldc + VL, c1[m]);
        }
    }
}

static inline void panel(int K, const float *A, long am, long ak, const float *B, long ldb, float *C, long ldc,
                         int acc)
{
    panel_rows(MR, K, A, am, ak, B, ldb, C, ldc, acc);
}

/* panel_rows over VL columns, one vector a row: the same sums, column for column */
static inline void panel_rows1(int mr, int K, const float *A, long am, long ak, const float *B, long ldb,
                               float *C, long ldc, int acc)
{
    vf c0[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; m++) c0[m] = acc && m < mr ? vload(C + m * ldc) : vsplat(0.0f);
    for (int k = 0; k < K; k++) {
        const vf b0 = vload(B + k * ldb);
        const float *a = A + k * ak;
#pragma GCC unroll 8
        for (int m = 0; m < MR; m++) c0[m] += a[m * am] * b0;
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; m++)
        if (m < mr) vstore(C + m * ldc, c0[m]);
}

/* The scores of a row panel against key panel [n, n1): NW keys, or one vector of VL where
   only VL are left (a causal panel's last keys, `panel_keys_vl`); the same sums either way */
static inline void key_panel(int n, int n1, int K, const float *A, long am, long ak, const float *B, long ldb,
                             float *C, long ldc)
{
    if (n1 - n > VL) panel_rows(MR, K, A, am, ak, B, ldb, C, ldc, 0);
    else panel_rows1(MR, K, A, am, ak, B, ldb, C, ldc, 0);
}

#if VL >= 8
typedef float vhalf __attribute__((vector_size(VL / 2 * sizeof(float))));

/* panel_rows over VL/2 columns, half a vector a row: the same sums, column for column */
static inline void panel_rows_half(int mr, int K, const float *A, long am, long ak, const float *B, long ldb,
                                   float *C, long ldc, int acc)
{
    vhalf c0[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; m++) {
        vhalf z = {0};
        if (acc && m < mr) memcpy(&z, C + m * ldc, sizeof z);
        c0[m] = z;
    }
    for (int k = 0; k < K; k++) {
        vhalf b0;
        memcpy(&b0, B + k * ldb, sizeof b0);
        const float *a = A + k * ak;
#pragma GCC unroll 8
        for (int m = 0; m < MR; m++) c0[m] += a[m * am] * b0;
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; m++)
        if (m < mr) memcpy(C + m * ldc, &c0[m], sizeof c0[m]);
}
#endif

/* C's columns [0, D) of the head dim (row stride ldc, B's columns alike): NW-wide panels,
   then one VL-wide panel where at most VL columns are left, or a VL/2-wide one where at
   most VL/2 are. The columns past D in a buffer of Dp = round_up(D, NW) are padding nobody
   reads: at D = 16 on AVX-512 (the demo's and the probe's heads) a full panel computed
   twice the columns the head has, at D = 8 (the facts axis') four times. */
static inline void head_cols(int mr, int K, int D, const float *A, long am, long ak, const float *B, long ldb,
                             float *C, long ldc, int acc)
{
    int d = 0;
    for (; D - d > VL; d += NW) panel_rows(mr, K, A, am, ak, B + d, ldb, C + d, ldc, acc);
#if VL >= 8
    if (d < D && D - d <= VL / 2) {
        panel_rows_half(mr, K, A, am, ak, B + d, ldb, C + d, ldc, acc);
        return;
    }
#endif
    if (d < D) panel_rows1(mr, K, A, am, ak, B + d, ldb, C + d, ldc, acc);
}

/* ------------------------------------------------------------------ packing */

/* kv head (b, g) packed: Kt (Dp, Tp) for the scores, V (Tp, Dp) for P·V; with `bwd` also
   K (Tp, Dp) for dQ and Vt (Dp, Tp) for dP. Columns beyond T and D stay zero. */
static void pack_kv(const Attn *a, int b, int g, int write_r, float *Kt, float *V, float *K, float *Vt)
{
    const Shape *s = &a->s;
    float row[1024];
    for (int t = 0; t < s->T; t++) {
        load_qk(a, 0, b, g, t, 1.0f, write_r, row);
        for (int d = 0; d < s->D; d++) Kt[(long)d * s->Tp + t] = row[d];
        if (K) memcpy(K + (long)t * s->Dp, row, s->D * sizeof(float));
        load_row(V + (long)t * s->Dp, a->v.base, a->v.bf16, at(&a->v, b, g, t), s->D, 1.0f);
        if (Vt)
            for (int d = 0; d < s->D; d++) Vt[(long)d * s->Tp + t] = V[(long)t * s->Dp + d];
    }
}

/* ------------------------------------------------------------------ forward */

static int fwd_fp32(const Attn *a)
{
    const Shape s = a->s;
    const long kv_size = (long)s.Dp * s.Tp;
    float *kt_all = zalloc(sizeof(float) * kv_size * s.B * s.Hkv);
    float *v_all = zalloc(sizeof(float) * kv_size * s.B * s.Hkv);
    if (!kt_all || !v_all) { free(kt_all); free(v_all); return 2; }
    const int rep = s.H / s.Hkv, nblk = (s.T + s.BQ - 1) / s.BQ, T = s.T, D = s.D;
    const float scale = 1.0f / sqrtf((float)D);
    int status = 0;

#pragma omp parallel num_threads(a->nthreads)
    {
#pragma omp for schedule(static)
        for (int bg = 0; bg < s.B * s.Hkv; bg++)
            pack_kv(a, bg / s.Hkv, bg % s.Hkv, 1, kt_all + bg * kv_size, v_all + bg * kv_size, NULL, NULL);

        float *Q = zalloc(sizeof(float) * s.BQ * s.Dp);
        float *S = zalloc(sizeof(float) * s.BQ * s.Tp);
        float *O = zalloc(sizeof(float) * s.BQ * s.Dp);
        if (!Q || !S || !O) {
#pragma omp atomic write
            status = 2;
        }
#pragma omp for schedule(dynamic, 1)
        for (long task = 0; task < (long)s.B * s.H * nblk; task++) {
            if (status) continue;
            const int blk = (int)(task % nblk), h = (int)(task / nblk % s.H), b = (int)(task / nblk / s.H);
            const int g = h / rep, i0 = blk * s.BQ, rows = T - i0 < s.BQ ? T - i0 : s.BQ;
            const int32_t *st = a->start + (long)b * T;
            const float *Kt = kt_all + (long)(b * s.Hkv + g) * kv_size, *V = v_all + (long)(b * s.Hkv + g) * kv_size;
            const int lo = st[i0] / NW * NW;
            for (int r = 0; r < rows; r++)
                load_qk(a, 1, b, h, i0 + r, scale, 1, Q + (long)r * s.Dp);
            for (int r = rows; r < s.BQ; r++) memset(Q + (long)r * s.Dp, 0, sizeof(float) * s.Dp);
            for (int m = 0; m < rows; m += MR) {
                const int pr = rows - m < MR ? rows - m : MR;
                int n0, n1;
                panel_keys_vl(st, i0 + m, pr, lo, &n0, &n1);
                float *Sm = S + (long)m * s.Tp;
                /* scores of the panel's rows against keys [lo + n0, lo + n1) */
                for (int n = n0; n < n1; n += NW)
                    key_panel(n, n1, D, Q + (long)m * s.Dp, s.Dp, 1, Kt + lo + n, s.Tp, Sm + n, s.Tp);
                /* softmax over each row's own interval; exp(s − max) unnormalised. The rows'
                   log-sum-exps after the rows, not between them: the same values, and the
                   forward 5-10% faster at the demo's member shape on an AVX2 CPU (the libm
                   call inside the row loop had cost more than the logf itself) */
                float inv[MR], mx[MR], l[MR];
                for (int r = 0; r < pr; r++) {
                    const int i = i0 + m + r;
                    l[r] = softmax_row(Sm + (long)r * s.Tp, n0, n1, st[i] - lo, i + 1 - lo, &mx[r]);
                }
                for (int r = 0; r < pr; r++) {
                    a->lse[((long)b * s.H + h) * T + i0 + m + r] = mx[r] + logf(l[r]);
                    inv[r] = 1.0f / l[r];
                }
                for (int r = pr; r < MR; r++) memset(Sm + (long)r * s.Tp + n0, 0, sizeof(float) * (n1 - n0));
                /* O = P V over the panel's keys, then the softmax's normalisation */
                head_cols(MR, n1 - n0, D, Sm + n0, s.Tp, 1, V + (long)(lo + n0) * s.Dp, s.Dp, O + (long)m * s.Dp, s.Dp, 0);
                for (int r = 0; r < pr; r++) {
                    float *o = a->out + (((long)b * s.H + h) * T + i0 + m + r) * D;
                    for (int d = 0; d < D; d++) o[d] = O[(long)(m + r) * s.Dp + d] * inv[r];
                    if (a->y.base) store_row(&a->y, b, h, i0 + m + r, o, D, 1.0f);
                }
            }
        }
        free(Q);
        free(S);
        free(O);
    }
    free(kt_all);
    free(v_all);
    return status;
}

/* ------------------------------------------------------------------ backward */

static int bwd_fp32(const Attn *a)
{
    const Shape s = a->s;
    const int rep = s.H / s.Hkv, nblk = (s.T + s.BQ - 1) / s.BQ, T = s.T, D = s.D;
    const float scale = 1.0f / sqrtf((float)D);
    const long kv_size = (long)s.Dp * s.Tp;
    int status = 0;

#pragma omp parallel num_threads(a->nthreads)
    {
        float *Kt = zalloc(sizeof(float) * kv_size), *V = zalloc(sizeof(float) * kv_size);
        float *K = zalloc(sizeof(float) * kv_size), *Vt = zalloc(sizeof(float) * kv_size);
        float *dK = zalloc(sizeof(float) * kv_size), *dV = zalloc(sizeof(float) * kv_size);
        float *Q = zalloc(sizeof(float) * s.BQ * s.Dp), *dO = zalloc(sizeof(float) * s.BQ * s.Dp);
        float *dQ = zalloc(sizeof(float) * s.BQ * s.Dp);
        /* (MR floats of slack: a last key panel reads up to MR − 1 columns past the block's keys) */
        float *P = zalloc(sizeof(float) * (s.BQ * s.Tp + MR)), *dS = zalloc(sizeof(float) * (s.BQ * s.Tp + MR));
        float *delta = zalloc(sizeof(float) * s.BQ);
        if (!Kt || !V || !K || !Vt || !dK || !dV || !Q || !dO || !dQ || !P || !dS || !delta) {
#pragma omp atomic write
            status = 2;
        }
#pragma omp for schedule(dynamic, 1)
        for (int bg = 0; bg < s.B * s.Hkv; bg++) {
            if (status) continue;
            const int b = bg / s.Hkv, g = bg % s.Hkv;
            const int32_t *st = a->start + (long)b * T;
            pack_kv(a, b, g, 0, Kt, V, K, Vt);
            float *gq = a->norm ? a->norm->dgq + (long)bg * D : NULL, *gk = a->norm ? a->norm->dgk + (long)bg * D : NULL;
            if (a->norm) {
                memset(gq, 0, sizeof(float) * D);
                memset(gk, 0, sizeof(float) * D);
            }
            memset(dK, 0, sizeof(float) * kv_size);
            memset(dV, 0, sizeof(float) * kv_size);
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                for (int blk = 0; blk < nblk; blk++) {
                    const int i0 = blk * s.BQ, rows = T - i0 < s.BQ ? T - i0 : s.BQ;
                    const int lo = st[i0] / NW * NW;
                    const int hi = (int)round_up(i0 + rows - lo, NW); /* keys [lo, lo + hi) */
                    for (int r = 0; r < s.BQ; r++) {
                        float *qr = Q + (long)r * s.Dp, *dr = dO + (long)r * s.Dp;
                        if (r >= rows) {
                            memset(qr, 0, sizeof(float) * s.Dp);
                            memset(dr, 0, sizeof(float) * s.Dp);
                            delta[r] = 0.0f;
                            continue;
                        }
                        const long row = ((long)b * s.H + h) * T + i0 + r;
                        load_qk(a, 1, b, h, i0 + r, scale, 0, qr);
                        load_row(dr, a->dout.base, a->dout.bf16, at(&a->dout, b, h, i0 + r), D, 1.0f);
                        delta[r] = dot_f32(dr, a->out + row * D, D);
                    }
                    for (int m = 0; m < rows; m += MR) {
                        const int pr = rows - m < MR ? rows - m : MR;
                        float *Pm = P + (long)m * s.Tp, *dSm = dS + (long)m * s.Tp;
                        int n0, n1;
                        panel_keys_vl(st, i0 + m, pr, lo, &n0, &n1);
                        /* keys of the block outside the panel's [n0, n1) are zero for the key-panel products */
                        zero_outside(Pm, dSm, s.Tp, MR, n0, n1, hi);
                        for (int n = n0; n < n1; n += NW) {
                            key_panel(n, n1, D, Q + (long)m * s.Dp, s.Dp, 1, Kt + lo + n, s.Tp, Pm + n, s.Tp);
                            key_panel(n, n1, D, dO + (long)m * s.Dp, s.Dp, 1, Vt + lo + n, s.Tp, dSm + n, s.Tp);
                        }
                        for (int r = 0; r < pr; r++) {
                            const int i = i0 + m + r;
                            grad_row(Pm + (long)r * s.Tp, dSm + (long)r * s.Tp, n0, n1, st[i] - lo, i + 1 - lo,
                                     a->lse[((long)b * s.H + h) * T + i], delta[m + r]);
                        }
                        for (int r = pr; r < MR; r++) {
                            memset(Pm + (long)r * s.Tp + n0, 0, sizeof(float) * (n1 - n0));
                            memset(dSm + (long)r * s.Tp + n0, 0, sizeof(float) * (n1 - n0));
                        }
                        /* dQ = dS K (its √D below, with the output) */
                        head_cols(MR, n1 - n0, D, dSm + n0, s.Tp, 1, K + (long)(lo + n0) * s.Dp, s.Dp, dQ + (long)m * s.Dp, s.Dp, 0);
                        for (int r = 0; r < pr; r++) {
                            emit_qk_grad(a, 1, b, h, i0 + m + r, dQ + (long)(m + r) * s.Dp, scale, gq);
                        }
                    }
                    /* dK += dSᵀ Q (Q is scaled), dV += Pᵀ dO, by key panels; rows before a
                       key's position contribute nothing (causal), so each panel starts there */
                    for (int n = 0; n < hi; n += MR) {
                        const int key = lo + n, r0 = key > i0 ? key - i0 : 0, mr = hi - n < MR ? hi - n : MR;
                        if (r0 >= rows) break;
                        /* (a last panel of mr < MR keys where MR does not divide NW) */
                        head_cols(mr, rows - r0, D, dS + (long)r0 * s.Tp + n, 1, s.Tp, Q + (long)r0 * s.Dp, s.Dp, dK + (long)key * s.Dp, s.Dp, 1);
                        head_cols(mr, rows - r0, D, P + (long)r0 * s.Tp + n, 1, s.Tp, dO + (long)r0 * s.Dp, s.Dp, dV + (long)key * s.Dp, s.Dp, 1);
                    }
                }
            }
            for (int t = 0; t < T; t++) {
                emit_qk_grad(a, 0, b, g, t, dK + (long)t * s.Dp, 1.0f, gk);
                store_row(&a->dv, b, g, t, dV + (long)t * s.Dp, D, 1.0f);
            }
        }
        free(Kt); free(V); free(K); free(Vt); free(dK); free(dV);
        free(Q); free(dO); free(dQ); free(P); free(dS); free(delta);
    }
    return status;
}

/* ------------------------------------------------------------------ entry points */

/* mode 0: the fastest implementation this CPU has (AMX tiles where the build and the OS
   allow them); mode 1: the portable fp32 one. Returns 0, 1 for arguments out of range,
   2 when a buffer could not be allocated. */
static int setup(Attn *a, int B, int H, int Hkv, int T, int D, int mode)
{
    if (B <= 0 || H <= 0 || Hkv <= 0 || T <= 0 || D <= 0 || D > 1024 || H % Hkv != 0) return 1;
    const int amx = mode == 0 && amx_available();
    const Shape s = {B, H, Hkv, T, D, (int)round_up(D, NW), (int)round_up(T, NW), block_rows(T, amx ? 32 : MR)};
    a->s = s;
    return 0;
}

static Input input(const sanlab_tensor *x) { return (Input){x->data, x->bf16, x->sb, x->sh, x->st}; }
static Output output(const sanlab_tensor *x) { return (Output){x->data, x->bf16, x->sb, x->sh, x->st}; }

int sanlab_attn_fwd(const sanlab_attn_args *p)
{
    QKNorm nm = {p->gq, p->gk, p->eps, p->cos, p->sin, p->csb, p->cst, p->rq, p->rk, NULL, NULL, p->gain_batches};
    Attn a = {.q = input(&p->q), .k = input(&p->k), .v = input(&p->v), .start = p->start,
              .norm = p->gq ? &nm : NULL, .out = p->out, .lse = p->lse, .y = output(&p->y), .nthreads = p->nthreads};
    if (setup(&a, p->B, p->H, p->Hkv, p->T, p->D, p->mode)) return 1;
    return p->mode == 0 && amx_available() ? attn_fwd_amx(&a) : fwd_fp32(&a);
}

int sanlab_attn_bwd(const sanlab_attn_args *p)
{
    const int B = p->B, Hkv = p->Hkv, D = p->D;
    const long parts = (long)B * Hkv * D;
    QKNorm nm = {p->gq, p->gk, p->eps, p->cos, p->sin, p->csb, p->cst, p->rq, p->rk, NULL, NULL, p->gain_batches};
    if (p->gq) { /* dγ per kv-head task, summed below in task order */
        nm.dgq = zalloc(sizeof(float) * parts);
        nm.dgk = zalloc(sizeof(float) * parts);
        if (!nm.dgq || !nm.dgk) { free(nm.dgq); free(nm.dgk); return 2; }
    }
    Attn a = {.q = input(&p->q), .k = input(&p->k), .v = input(&p->v), .dout = input(&p->dout), .start = p->start,
              .norm = p->gq ? &nm : NULL, .out = p->out, .lse = p->lse, .dq = output(&p->dq), .dk = output(&p->dk),
              .dv = output(&p->dv), .nthreads = p->nthreads};
    int status = setup(&a, B, p->H, Hkv, p->T, D, p->mode);
    if (!status) status = p->mode == 0 && amx_available() ? attn_bwd_amx(&a) : bwd_fp32(&a);
    if (p->gq && !status) {
        /* each set of gains sums its batches' tasks in order (one set: the solo sums) */
        const int every = p->gain_batches > 0 && p->gain_batches < B ? p->gain_batches : B, sets = (B + every - 1) / every;
        for (int m = 0; m < sets; m++) {
            float *dgq = p->dgq + (long)m * D, *dgk = p->dgk + (long)m * D;
            const long b1 = (long)(m + 1) * every < B ? (long)(m + 1) * every : B;
            for (int d = 0; d < D; d++) dgq[d] = dgk[d] = 0.0f;
            for (long bg = (long)m * every * Hkv; bg < b1 * Hkv; bg++)
                for (int d = 0; d < D; d++) {
                    dgq[d] += nm.dgq[bg * D + d];
                    dgk[d] += nm.dgk[bg * D + d];
                }
        }
    }
    free(nm.dgq);
    free(nm.dgk);
    return status;
}
