/* The fused attention's products on AMX tiles (Intel Sapphire Rapids and later).

   Same algorithm, blocking and masking as attention.c (see there); only the seven
   matrix products per block run as bf16 tile products with fp32 accumulation
   (TDPBF16PS: C[16×16] += A[16×32] · B[32×16]), which this CPU runs an order of
   magnitude faster than fp32 vector FMAs. To keep fp32-level accuracy, an operand that
   is not exactly a bf16 number is split, x = hi + lo with hi = bf16(x) and
   lo = bf16(x − hi), and a product becomes a_hi·b_hi + a_lo·b_hi + a_hi·b_lo (the
   dropped a_lo·b_lo is ~2⁻¹⁶ of it): relative error ~1e-5 per product, against bf16's
   ~4e-3 for SDPA and FlashAttention, which round their inputs. Operands that are bf16
   already (V and dO under autocast) are not split. The scores, softmax, P, dP and dS
   stay fp32 between the products, as in the portable kernel.

   Orientation, so that no (rows × keys) matrix is ever transposed: the scores S = Q Kᵀ,
   dP = dO Vᵀ, O = P V and dQ = dS K are row-major products; the key-side gradients are
   formed transposed, dKᵀ += Qᵀ dS and dVᵀ += dOᵀ P, whose B operands are P and dS with
   pairs of rows interleaved (the tiles' "VNNI" layout: B[k][n] at (k/2, n, k%2)), and
   transposed once per kv head at the end. */

#include "attention.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__x86_64__) && defined(__linux__)

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

static int amx_state = -1;

/* AMX is usable when the CPU has it and the kernel grants this process the tile state
   (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; oneDNN asks the same). Settled by the
   first call, which sanlab.model.native makes when it loads the library. */
int amx_available(void)
{
    if (amx_state < 0) {
        unsigned eax, ebx, ecx, edx;
        int ok = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx >> 22 & 1) && (edx >> 24 & 1);
        if (ok) ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
        amx_state = ok;
    }
    return amx_state;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

static void tiles_on(void)
{
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.colsb[i] = 64;
        c.rows[i] = 16;
    }
    _tile_loadconfig(&c);
}

/* ------------------------------------------------------------------ bf16 conversion */

/* 32 fp32 values (a, then b) -> their bf16 parts hi = bf16(x), lo = bf16(x − hi). */
static inline void split2(__m512 a, __m512 b, __m512i *hi, __m512i *lo)
{
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a);
    const __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
    const __m512 hb = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
    *hi = h;
    *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
}

static inline void split32(const float *x, __m512i *hi, __m512i *lo)
{
    split2(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16), hi, lo);
}

/* the pair-row interleave of two rows' 32 bf16 values: out[2j + r] = x_r[j] */
static inline void store_pairs(uint16_t *out, __m512i x0, __m512i x1)
{
    const __m512i first = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                           39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i second = _mm512_add_epi16(first, _mm512_set1_epi16(16));
    _mm512_storeu_si512(out, _mm512_permutex2var_epi16(x0, first, x1));
    _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi16(x0, second, x1));
}

/* lanes j0 + [0, 16) inside [a, e) */
static inline __mmask16 allowed(int j0, int a, int e)
{
    const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(j0), _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5,
                                                                                4, 3, 2, 1, 0));
    return _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(a)) & _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(e));
}

/* exp(x − c) in the lanes of `k`, 0 in the others (no exp where none is allowed: the
   masked half of a diagonal panel's last key tile, keys before a document's start) */
static inline __m512 masked_exp(const float *x, float c, __mmask16 k)
{
    return k ? _mm512_maskz_mov_ps(k, (__m512)vexp((vf)_mm512_loadu_ps(x) - c)) : _mm512_setzero_ps();
}

/* The forward's pass over one row of scores s[n0, n1) with [a, e) allowed: the max of the
   allowed ones (*mx), then p = exp(s − max) (0 outside [a, e)) written only as its bf16
   parts hi, lo; returns Σ p. (The max needs its own pass; everything else is one.) */
static inline float softmax_split(const float *s, int n0, int n1, int a, int e, float *mx, uint16_t *hi, uint16_t *lo)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int j = n0; j < n1; j += 16) m = _mm512_mask_max_ps(m, allowed(j, a, e), m, _mm512_loadu_ps(s + j));
    const float mv = _mm512_reduce_max_ps(m);
    vf acc = vsplat(0.0f);
    for (int j = n0; j < n1; j += 32) {
        const __m512 p0 = masked_exp(s + j, mv, allowed(j, a, e));
        const __m512 p1 = masked_exp(s + j + 16, mv, allowed(j + 16, a, e));
        acc += (vf)p0 + (vf)p1;
        __m512i h, l;
        split2(p0, p1, &h, &l);
        _mm512_storeu_si512(hi + j, h);
        _mm512_storeu_si512(lo + j, l);
    }
    *mx = mv;
    return hsum(acc);
}

/* One row's P = exp(s − lse) (0 outside [a, e)) and dS = P ⊙ (dP − δ) for 32 columns at j */
static inline void grad32(const float *s, const float *dp, int j, int a, int e, float lse, float delta, __m512 p[2],
                          __m512 ds[2])
{
    for (int u = 0; u < 2; u++) {
        const int jj = j + 16 * u;
        const __mmask16 k = allowed(jj, a, e);
        p[u] = masked_exp(s + jj, lse, k);
        ds[u] = _mm512_maskz_mul_ps(k, p[u], _mm512_sub_ps(_mm512_loadu_ps(dp + jj), _mm512_set1_ps(delta)));
    }
}

/* The backward's pass over rows r and r + 1 of a panel, scores s and dP dp (fp32, stride
   ld) over [n0, n1): P and dS formed and written only as bf16 parts, dS's as rows
   (ds_hi/lo, stride ld) and both as one pair-row (pp, dsp). Row u's allowed keys are
   [a[u], e[u]) (empty for a padding row), its log-sum-exp lse[u] and δ delta[u]. */
static inline void grad_pair(const float *s, const float *dp, long ld, int n0, int n1, const int a[2], const int e[2],
                             const float lse[2], const float delta[2], uint16_t *ds_hi, uint16_t *ds_lo,
                             uint16_t *pp_hi, uint16_t *pp_lo, uint16_t *dsp_hi, uint16_t *dsp_lo)
{
    for (int j = n0; j < n1; j += 32) {
        __m512i ph[2], pl[2], dh[2], dl[2];
        for (int u = 0; u < 2; u++) {
            __m512 p[2], ds[2];
            grad32(s + u * ld, dp + u * ld, j, a[u], e[u], lse[u], delta[u], p, ds);
            split2(p[0], p[1], &ph[u], &pl[u]);
            split2(ds[0], ds[1], &dh[u], &dl[u]);
            _mm512_storeu_si512(ds_hi + u * ld + j, dh[u]);
            _mm512_storeu_si512(ds_lo + u * ld + j, dl[u]);
        }
        store_pairs(pp_hi + 2 * j, ph[0], ph[1]);
        store_pairs(pp_lo + 2 * j, pl[0], pl[1]);
        store_pairs(dsp_hi + 2 * j, dh[0], dh[1]);
        store_pairs(dsp_lo + 2 * j, dl[0], dl[1]);
    }
}

/* x[0, n) (n a multiple of 32) -> hi[0, n), and lo[0, n) unless lo is NULL */
static inline void split_row(const float *x, uint16_t *hi, uint16_t *lo, int n)
{
    for (int j = 0; j < n; j += 32) {
        __m512i h, l;
        split32(x + j, &h, &l);
        _mm512_storeu_si512(hi + j, h);
        if (lo) _mm512_storeu_si512(lo + j, l);
    }
}

/* Two rows x0, x1 [n0, n1) -> their parts with the rows' elements interleaved,
   out[2j + r] = part(x_r[j]) for j in [n0, n1): a pair-row of a tile's B operand. */
static inline void split_pair(const float *x0, const float *x1, uint16_t *hi, uint16_t *lo, int n0, int n1)
{
    for (int j = n0; j < n1; j += 32) {
        __m512i h0, l0, h1, l1;
        split32(x0 + j, &h0, &l0);
        split32(x1 + j, &h1, &l1);
        store_pairs(hi + 2 * j, h0, h1);
        if (lo) store_pairs(lo + 2 * j, l0, l1);
    }
}

/* ------------------------------------------------------------------ tile products */

/* One product term: A (row-major, lda elements a row) times B (pair-rows of 2·width
   elements, ldb = 2·width). */
typedef struct {
    const uint16_t *a;
    long lda;
    const uint16_t *b;
    long ldb;
} Term;

/* C[16][w] fp32 (ldc floats a row; w 32, or 16 for only the first half) = (acc ? C : 0) +
   Σ_terms Σ_{k < ktiles} A[:, 32k:32k+32] · B[pair-rows 16k:16k+16][columns 0:w].
   Tiles: 0, 1 the two 16-column halves of C; 2 A; 3, 4 B. */
static inline void tile_16xw(int nt, const Term *t, int ktiles, float *c, long ldc, int acc, int w)
{
    const int two = w > 16;
    if (acc) {
        _tile_loadd(0, c, ldc * 4);
        if (two) _tile_loadd(1, c + 16, ldc * 4);
    } else {
        _tile_zero(0);
        if (two) _tile_zero(1);
    }
    for (int k = 0; k < ktiles; k++)
        for (int i = 0; i < nt; i++) {
            const uint16_t *b = t[i].b + 16L * k * t[i].ldb;
            _tile_loadd(2, t[i].a + 32L * k, t[i].lda * 2);
            _tile_loadd(3, b, t[i].ldb * 2);
            _tile_dpbf16ps(0, 2, 3);
            if (two) {
                _tile_loadd(4, b + 32, t[i].ldb * 2);
                _tile_dpbf16ps(1, 2, 4);
            }
        }
    _tile_stored(0, c, ldc * 4);
    if (two) _tile_stored(1, c + 16, ldc * 4);
}

static inline void tile_16x32(int nt, const Term *t, int ktiles, float *c, long ldc, int acc)
{
    tile_16xw(nt, t, ktiles, c, ldc, acc, 32);
}

/* the terms of a split product: a_hi·b_hi, then a_lo·b_hi if a is split, a_hi·b_lo if b is */
static inline int terms(Term *t, const uint16_t *ah, const uint16_t *al, long lda, const uint16_t *bh,
                        const uint16_t *bl, long ldb)
{
    int n = 0;
    t[n++] = (Term){ah, lda, bh, ldb};
    if (al) t[n++] = (Term){al, lda, bh, ldb};
    if (bl) t[n++] = (Term){ah, lda, bl, ldb};
    return n;
}

/* A panel's scores (or dP): C[16][n0, n1) fp32 (row stride Tp) = A (16 rows of Dp, parts
   ah and al) times Bᵀ, B the keys from key0 on as pair-rows of d (parts bh and bl). */
static void panel_scores(const uint16_t *ah, const uint16_t *al, int Dp, const uint16_t *bh, const uint16_t *bl,
                         long Tp, int key0, int n0, int n1, float *c)
{
    Term t[3];
    for (int n = n0; n < n1; n += 32) {
        const long ofs = 2L * (key0 + n);
        const int nt = terms(t, ah, al, Dp, bh + ofs, bl ? bl + ofs : NULL, 2L * Tp);
        tile_16x32(nt, t, Dp / 32, c + n, Tp, 0);
    }
}

/* ------------------------------------------------------------------ packing */

/* The 16×16 transpose of 32-bit words in registers: r[i] holds row i, then column i. */
static inline void transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[4 + i], 0x88);
        t[4 + i] = _mm512_shuffle_i32x4(r[i], r[4 + i], 0xdd);
        t[8 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0x88);
        t[12 + i] = _mm512_shuffle_i32x4(r[8 + i], r[12 + i], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_i32x4(t[i], t[8 + i], 0xdd);
        r[4 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], 0x88);
        r[12 + i] = _mm512_shuffle_i32x4(t[4 + i], t[12 + i], 0xdd);
    }
}

/* Transpose of 32-bit words: x (rows × cols, ld_x words a row; rows a multiple of 16) ->
   xt (cols × rows, ld_t words a row). By 16×16 blocks in registers (a column block past
   `cols` is read and written masked). */
static void transpose_words(const void *x, long ld_x, int rows, int cols, void *xt, long ld_t)
{
    for (int r0 = 0; r0 < rows; r0 += 16)
        for (int c0 = 0; c0 < cols; c0 += 16) {
            const int nc = cols - c0 < 16 ? cols - c0 : 16;
            const __mmask16 m = (__mmask16)((1u << nc) - 1);
            __m512i r[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_maskz_loadu_epi32(m, (const uint32_t *)x + (r0 + i) * ld_x + c0);
            transpose16(r);
            for (int i = 0; i < nc; i++) _mm512_storeu_si512((uint32_t *)xt + (c0 + i) * ld_t + r0, r[i]);
        }
}

/* Rows t of a kv head (fp32, Dp wide, zero-padded) into tile operands:
   `kt`: as B of X·Kᵀ (k over d: pair-rows of d, keys as columns), (Dp/2, 2·Tp);
   `kp`: as B of Y·K (k over keys: pair-rows of keys, d as columns), (Tp/2, 2·Dp).
   Either may be NULL; lo parts are written where the lo pointers are not NULL. `tmp_hi`,
   `tmp_lo` (Tp × Dp each) hold the bf16 rows that `kt` is the word transpose of. */
static void pack_operand(const Attn *a, int is_k, int write_r, int b, int g, float *row0, float *row1, uint16_t *tmp_hi,
                         uint16_t *tmp_lo, uint16_t *kt_hi, uint16_t *kt_lo, uint16_t *kp_hi, uint16_t *kp_lo)
{
    const Shape *s = &a->s;
    for (int t = 0; t < s->Tp; t += 2) {
        float *rows[2] = {row0, row1};
        for (int r = 0; r < 2; r++) {
            memset(rows[r], 0, sizeof(float) * s->Dp);
            if (t + r >= s->T) continue;
            if (is_k)
                load_qk(a, 0, b, g, t + r, 1.0f, write_r, rows[r]);
            else
                load_row(rows[r], a->v.base, a->v.bf16, at(&a->v, b, g, t + r), s->D, 1.0f);
        }
        for (int r = 0; r < 2; r++) {
            if (kt_hi)
                split_row(rows[r], tmp_hi + (long)(t + r) * s->Dp, kt_lo ? tmp_lo + (long)(t + r) * s->Dp : NULL, s->Dp);
        }
        if (kp_hi) split_pair(row0, row1, kp_hi + (long)t * s->Dp, kp_lo ? kp_lo + (long)t * s->Dp : NULL, 0, s->Dp);
    }
    if (kt_hi) { /* a key's d-pairs are the 32-bit words of its bf16 row: their transpose */
        transpose_words(tmp_hi, s->Dp / 2, s->Tp, s->Dp / 2, kt_hi, s->Tp);
        if (kt_lo) transpose_words(tmp_lo, s->Dp / 2, s->Tp, s->Dp / 2, kt_lo, s->Tp);
    }
}

/* rows [0, BQ) of a block of q (through load_qk, times scale) or of dout: fp32 (zero
   beyond `rows`) and split into bf16 parts */
static void load_block(const Attn *a, int is_q, int write_r, int b, int h, int i0, int rows, float scale, float *f32,
                       uint16_t *hi, uint16_t *lo)
{
    const Shape *s = &a->s;
    for (int r = 0; r < s->BQ; r++) {
        float *row = f32 + (long)r * s->Dp;
        memset(row, 0, sizeof(float) * s->Dp);
        if (r < rows && is_q)
            load_qk(a, 1, b, h, i0 + r, scale, write_r, row);
        else if (r < rows)
            load_row(row, a->dout.base, a->dout.bf16, at(&a->dout, b, h, i0 + r), s->D, scale);
        split_row(row, hi + (long)r * s->Dp, lo ? lo + (long)r * s->Dp : NULL, s->Dp);
    }
}

/* whether x·scale is exactly a bf16 number for every bf16 x: bf16 inputs and a power-of-two scale */
static int exact_bf16(const Input *x, float scale)
{
    int e;
    return x->bf16 && frexpf(scale, &e) == 0.5f;
}

/* ------------------------------------------------------------------ forward */

int attn_fwd_amx(const Attn *a)
{
    const Shape s = a->s;
    const int rep = s.H / s.Hkv, nblk = (s.T + s.BQ - 1) / s.BQ, T = s.T, D = s.D;
    const int Dd = (int)round_up(D, 16); /* the output columns P·V needs: the rest is padding */
    const float scale = 1.0f / sqrtf((float)D);
    const int split_q = a->norm || !exact_bf16(&a->q, scale), split_k = a->norm || !a->k.bf16, split_v = !a->v.bf16;
    const long kv = (long)s.Dp * s.Tp, nkv = (long)s.B * s.Hkv;
    /* (written in full by pack_operand, padding included) */
    uint16_t *kt_hi = amalloc(2 * kv * nkv), *kt_lo = split_k ? amalloc(2 * kv * nkv) : NULL;
    uint16_t *v_hi = amalloc(2 * kv * nkv), *v_lo = split_v ? amalloc(2 * kv * nkv) : NULL;
    int status = (!kt_hi || !v_hi || (split_k && !kt_lo) || (split_v && !v_lo)) ? 2 : 0;

#pragma omp parallel num_threads(a->nthreads)
    {
        float *row0 = zalloc(sizeof(float) * s.Dp), *row1 = zalloc(sizeof(float) * s.Dp);
        float *Q = zalloc(sizeof(float) * s.BQ * s.Dp), *S = zalloc(sizeof(float) * 16 * s.Tp);
        float *O = zalloc(sizeof(float) * 16 * s.Dp);
        uint16_t *q_hi = zalloc(2L * s.BQ * s.Dp), *q_lo = zalloc(2L * s.BQ * s.Dp);
        uint16_t *p_hi = zalloc(2L * 16 * s.Tp), *p_lo = zalloc(2L * 16 * s.Tp);
        uint16_t *tmp_hi = amalloc(2 * kv), *tmp_lo = amalloc(2 * kv);
        if (!row0 || !row1 || !Q || !S || !O || !q_hi || !q_lo || !p_hi || !p_lo || !tmp_hi || !tmp_lo) {
#pragma omp atomic write
            status = 2;
        }
#pragma omp barrier
        if (!status) {
#pragma omp for schedule(static)
            for (long bg = 0; bg < nkv; bg++)
                pack_operand(a, 1, 1, (int)(bg / s.Hkv), (int)(bg % s.Hkv), row0, row1, tmp_hi, tmp_lo,
                             kt_hi + bg * kv, kt_lo ? kt_lo + bg * kv : NULL, NULL, NULL);
#pragma omp for schedule(static)
            for (long bg = 0; bg < nkv; bg++)
                pack_operand(a, 0, 0, (int)(bg / s.Hkv), (int)(bg % s.Hkv), row0, row1, NULL, NULL, NULL, NULL,
                             v_hi + bg * kv, v_lo ? v_lo + bg * kv : NULL);
            tiles_on();
#pragma omp for schedule(dynamic, 1)
            for (long task = 0; task < (long)s.B * s.H * nblk; task++) {
                const int blk = (int)(task % nblk), h = (int)(task / nblk % s.H), b = (int)(task / nblk / s.H);
                const long bg = (long)b * s.Hkv + h / rep;
                const int i0 = blk * s.BQ, rows = T - i0 < s.BQ ? T - i0 : s.BQ;
                const int32_t *st = a->start + (long)b * T;
                const int lo = st[i0] / NW * NW;
                load_block(a, 1, 1, b, h, i0, rows, scale, Q, q_hi, split_q ? q_lo : NULL);
                for (int m = 0; m < rows; m += 16) {
                    const int pr = rows - m < 16 ? rows - m : 16;
                    int n0, n1;
                    panel_keys(st, i0 + m, pr, lo, &n0, &n1);
                    Term t[3];
                    /* S = Q Kᵀ for the panel's 16 rows and keys [lo + n0, lo + n1) */
                    panel_scores(q_hi + (long)m * s.Dp, split_q ? q_lo + (long)m * s.Dp : NULL, s.Dp, kt_hi + bg * kv,
                                 kt_lo ? kt_lo + bg * kv : NULL, s.Tp, lo, n0, n1, S);
                    float inv[16];
                    for (int r = 0; r < 16; r++) { /* (a padding row: nothing allowed, P = 0) */
                        const int i = i0 + m + r, ok = r < pr;
                        float mx;
                        const float l = softmax_split(S + (long)r * s.Tp, n0, n1, ok ? st[i] - lo : n1, ok ? i + 1 - lo : n1,
                                                      &mx, p_hi + (long)r * s.Tp, p_lo + (long)r * s.Tp);
                        if (ok) {
                            a->lse[((long)b * s.H + h) * T + i] = mx + logf(l);
                            inv[r] = 1.0f / l;
                        }
                    }
                    /* O = P V over the panel's keys (P always split: it is fp32) */
                    for (int d = 0; d < Dd; d += 32) {
                        const long vofs = bg * kv + (long)(lo + n0) * s.Dp + 2L * d;
                        const int nt = terms(t, p_hi + n0, p_lo + n0, s.Tp, v_hi + vofs, v_lo ? v_lo + vofs : NULL,
                                             2L * s.Dp);
                        tile_16xw(nt, t, (n1 - n0) / 32, O + d, s.Dp, 0, Dd - d);
                    }
                    for (int r = 0; r < pr; r++) {
                        float *o = a->out + (((long)b * s.H + h) * T + i0 + m + r) * D;
                        for (int d = 0; d < D; d++) o[d] = O[(long)r * s.Dp + d] * inv[r];
                        if (a->y.base) store_row(&a->y, b, h, i0 + m + r, o, D, 1.0f);
                    }
                }
            }
            _tile_release();
        }
        free(row0); free(row1); free(Q); free(S); free(O);
        free(q_hi); free(q_lo); free(p_hi); free(p_lo); free(tmp_hi); free(tmp_lo);
    }
    free(kt_hi); free(kt_lo); free(v_hi); free(v_lo);
    return status;
}

/* ------------------------------------------------------------------ backward */

int attn_bwd_amx(const Attn *a)
{
    const Shape s = a->s;
    const int rep = s.H / s.Hkv, nblk = (s.T + s.BQ - 1) / s.BQ, T = s.T, D = s.D, BQ = s.BQ;
    const int Dd = (int)round_up(D, 16); /* the columns of d the products need: the rest is padding */
    const float scale = 1.0f / sqrtf((float)D);
    const int split_q = a->norm || !exact_bf16(&a->q, scale), split_k = a->norm || !a->k.bf16, split_v = !a->v.bf16;
    const int split_do = !a->dout.bf16;
    const long kv = (long)s.Dp * s.Tp, blk = (long)BQ * s.Tp, pan = 16L * s.Tp, qd = (long)BQ * s.Dp;
    int status = 0;

#pragma omp parallel num_threads(a->nthreads)
    {
        float *row0 = zalloc(4L * s.Dp), *row1 = zalloc(4L * s.Dp);
        /* per kv head: K as B of Q·Kᵀ (kt) and of dS·K (kp), V as B of dO·Vᵀ (vt); dKᵀ, dVᵀ */
        uint16_t *kt_hi = amalloc(2 * kv), *kt_lo = amalloc(2 * kv), *kp_hi = amalloc(2 * kv), *kp_lo = amalloc(2 * kv);
        uint16_t *vt_hi = amalloc(2 * kv), *vt_lo = amalloc(2 * kv), *tmp_hi = amalloc(2 * kv), *tmp_lo = amalloc(2 * kv);
        float *dKt = amalloc(4 * kv), *dVt = amalloc(4 * kv), *rowsT = amalloc(4 * kv);
        /* per block: Q and dO as fp32 rows, their parts as rows and transposed (A of the
           key-side products); P and dS as parts with pairs of rows interleaved (B of the
           key-side products) */
        float *Q = zalloc(4 * qd), *dO = zalloc(4 * qd), *Qt = zalloc(4 * qd), *dOt = zalloc(4 * qd);
        uint16_t *q_hi = zalloc(2 * qd), *q_lo = zalloc(2 * qd), *do_hi = zalloc(2 * qd), *do_lo = zalloc(2 * qd);
        uint16_t *qt_hi = zalloc(2 * qd), *qt_lo = zalloc(2 * qd), *dot_hi = zalloc(2 * qd), *dot_lo = zalloc(2 * qd);
        uint16_t *pp_hi = zalloc(2 * blk), *pp_lo = zalloc(2 * blk), *dsp_hi = zalloc(2 * blk), *dsp_lo = zalloc(2 * blk);
        /* per panel of 16 rows: P and dS in fp32, dS's parts as rows (A of dQ), dQ */
        float *P = zalloc(4 * pan), *dS = zalloc(4 * pan), *dQ = zalloc(4L * 16 * s.Dp);
        uint16_t *ds_hi = zalloc(2 * pan), *ds_lo = zalloc(2 * pan);
        float *delta = zalloc(4L * BQ);
        if (!row0 || !row1 || !kt_hi || !kt_lo || !kp_hi || !kp_lo || !vt_hi || !vt_lo || !tmp_hi || !tmp_lo || !dKt || !rowsT ||
            !dVt || !Q || !dO || !Qt || !dOt || !q_hi || !q_lo || !do_hi || !do_lo || !qt_hi || !qt_lo || !dot_hi ||
            !dot_lo || !pp_hi || !pp_lo || !dsp_hi || !dsp_lo || !P || !dS || !dQ || !ds_hi || !ds_lo || !delta) {
#pragma omp atomic write
            status = 2;
        }
#pragma omp barrier
        if (!status) {
            tiles_on();
#pragma omp for schedule(dynamic, 1)
            for (int bg = 0; bg < s.B * s.Hkv; bg++) {
                const int b = bg / s.Hkv, g = bg % s.Hkv;
                const int32_t *st = a->start + (long)b * T;
                pack_operand(a, 1, 0, b, g, row0, row1, tmp_hi, tmp_lo, kt_hi, split_k ? kt_lo : NULL, kp_hi,
                             split_k ? kp_lo : NULL);
                pack_operand(a, 0, 0, b, g, row0, row1, tmp_hi, tmp_lo, vt_hi, split_v ? vt_lo : NULL, NULL, NULL);
                float *gq = a->norm ? a->norm->dgq + (long)bg * D : NULL, *gk = a->norm ? a->norm->dgk + (long)bg * D : NULL;
                if (a->norm) {
                    memset(gq, 0, sizeof(float) * D);
                    memset(gk, 0, sizeof(float) * D);
                }
                memset(dKt, 0, 4 * kv);
                memset(dVt, 0, 4 * kv);
                for (int h = g * rep; h < (g + 1) * rep; h++) {
                    for (int bl = 0; bl < nblk; bl++) {
                        const int i0 = bl * BQ, rows = T - i0 < BQ ? T - i0 : BQ, rows32 = (int)round_up(rows, 32);
                        const int lo = st[i0] / NW * NW;
                        const int hi = (int)round_up(i0 + rows - lo, NW); /* keys [lo, lo + hi) */
                        load_block(a, 1, 0, b, h, i0, rows, scale, Q, q_hi, split_q ? q_lo : NULL);
                        load_block(a, 0, 0, b, h, i0, rows, 1.0f, dO, do_hi, split_do ? do_lo : NULL);
                        transpose_words(Q, s.Dp, BQ, Dd, Qt, BQ);
                        transpose_words(dO, s.Dp, BQ, Dd, dOt, BQ);
                        for (int d = 0; d < Dd; d++) {
                            split_row(Qt + (long)d * BQ, qt_hi + (long)d * BQ, split_q ? qt_lo + (long)d * BQ : NULL, BQ);
                            split_row(dOt + (long)d * BQ, dot_hi + (long)d * BQ, split_do ? dot_lo + (long)d * BQ : NULL, BQ);
                        }
                        for (int r = 0; r < rows; r++) {
                            delta[r] = dot_f32(dO + (long)r * s.Dp, a->out + (((long)b * s.H + h) * T + i0 + r) * D, D);
                        }
                        for (int m = 0; m < rows; m += 16) {
                            const int pr = rows - m < 16 ? rows - m : 16;
                            int n0, n1;
                            panel_keys(st, i0 + m, pr, lo, &n0, &n1);
                            Term t[3];
                            /* S = Q Kᵀ and dP = dO Vᵀ for the panel's keys */
                            panel_scores(q_hi + (long)m * s.Dp, split_q ? q_lo + (long)m * s.Dp : NULL, s.Dp, kt_hi,
                                         split_k ? kt_lo : NULL, s.Tp, lo, n0, n1, P);
                            panel_scores(do_hi + (long)m * s.Dp, split_do ? do_lo + (long)m * s.Dp : NULL, s.Dp, vt_hi,
                                         split_v ? vt_lo : NULL, s.Tp, lo, n0, n1, dS);
                            /* P, dS = P ⊙ (dP − δ), then their parts: dS's as rows, both as
                               pair-rows of the block (zero outside [n0, n1) up to the block's keys) */
                            for (int r = 0; r < 16; r += 2) {
                                int al[2], el[2];
                                float ls[2], dl[2];
                                for (int u = 0; u < 2; u++) { /* (a padding row: nothing allowed, P = 0) */
                                    const int i = i0 + m + r + u, ok = r + u < pr;
                                    al[u] = ok ? st[i] - lo : n1;
                                    el[u] = ok ? i + 1 - lo : n1;
                                    ls[u] = ok ? a->lse[((long)b * s.H + h) * T + i] : 0.0f;
                                    dl[u] = ok ? delta[m + r + u] : 0.0f;
                                }
                                const long o = (long)(m + r) * s.Tp; /* pair-row (m + r) / 2 */
                                grad_pair(P + (long)r * s.Tp, dS + (long)r * s.Tp, s.Tp, n0, n1, al, el, ls, dl,
                                          ds_hi + (long)r * s.Tp, ds_lo + (long)r * s.Tp, pp_hi + o, pp_lo + o,
                                          dsp_hi + o, dsp_lo + o);
                                uint16_t *pairs[4] = {pp_hi + o, pp_lo + o, dsp_hi + o, dsp_lo + o};
                                for (int w = 0; w < 4; w++) {
                                    memset(pairs[w], 0, 4L * n0);
                                    if (hi > n1) memset(pairs[w] + 2L * n1, 0, 4L * (hi - n1));
                                }
                            }
                            /* dQ = dS K over the panel's keys (its √D with the output) */
                            for (int d = 0; d < Dd; d += 32) {
                                const long kofs = (long)(lo + n0) * s.Dp + 2L * d;
                                const int nt = terms(t, ds_hi + n0, ds_lo + n0, s.Tp, kp_hi + kofs,
                                                     split_k ? kp_lo + kofs : NULL, 2L * s.Dp);
                                tile_16xw(nt, t, (n1 - n0) / 32, dQ + d, s.Dp, 0, Dd - d);
                            }
                            for (int r = 0; r < pr; r++) {
                                emit_qk_grad(a, 1, b, h, i0 + m + r, dQ + (long)r * s.Dp, scale, gq);
                            }
                        }
                        for (int r = (int)round_up(rows, 16); r < rows32; r += 2) { /* (pairs the products read) */
                            const long o = (long)r * s.Tp;
                            memset(pp_hi + o, 0, 4L * hi); memset(pp_lo + o, 0, 4L * hi);
                            memset(dsp_hi + o, 0, 4L * hi); memset(dsp_lo + o, 0, 4L * hi);
                        }
                        /* dKᵀ += Qᵀ dS, dVᵀ += dOᵀ P by key panels of 32; rows before a key's
                           position contribute nothing (causal), so a panel's rows start there */
                        for (int n = 0; n < hi; n += 32) {
                            const int key = lo + n, r0 = key > i0 ? (key - i0) / 32 * 32 : 0;
                            if (r0 >= rows) break;
                            const long bofs = (long)r0 * s.Tp + 2L * n;
                            for (int d = 0; d < Dd; d += 16) {
                                Term t[3];
                                const long aofs = (long)d * BQ + r0;
                                int nt = terms(t, qt_hi + aofs, split_q ? qt_lo + aofs : NULL, BQ, dsp_hi + bofs,
                                               dsp_lo + bofs, 2L * s.Tp);
                                tile_16x32(nt, t, (rows32 - r0) / 32, dKt + (long)d * s.Tp + key, s.Tp, 1);
                                nt = terms(t, dot_hi + aofs, split_do ? dot_lo + aofs : NULL, BQ, pp_hi + bofs,
                                           pp_lo + bofs, 2L * s.Tp);
                                tile_16x32(nt, t, (rows32 - r0) / 32, dVt + (long)d * s.Tp + key, s.Tp, 1);
                            }
                        }
                    }
                }
                transpose_words(dKt, s.Tp, Dd, T, rowsT, s.Dp);
                for (int t = 0; t < T; t++) emit_qk_grad(a, 0, b, g, t, rowsT + (long)t * s.Dp, 1.0f, gk);
                transpose_words(dVt, s.Tp, Dd, T, rowsT, s.Dp);
                for (int t = 0; t < T; t++) store_row(&a->dv, b, g, t, rowsT + (long)t * s.Dp, D, 1.0f);
            }
            _tile_release();
        }
        free(row0); free(row1); free(kt_hi); free(kt_lo); free(kp_hi); free(kp_lo); free(vt_hi); free(vt_lo);
        free(tmp_hi); free(tmp_lo); free(dKt); free(dVt); free(rowsT); free(Q); free(dO); free(Qt); free(dOt);
        free(q_hi); free(q_lo); free(do_hi); free(do_lo); free(qt_hi); free(qt_lo); free(dot_hi); free(dot_lo);
        free(pp_hi); free(pp_lo); free(dsp_hi); free(dsp_lo); free(P); free(dS); free(dQ); free(ds_hi); free(ds_lo);
        free(delta);
    }
    return status;
}

#else /* no AMX in this build */

int amx_available(void) { return 0; }
int attn_fwd_amx(const Attn *a) { (void)a; return 1; }
int attn_bwd_amx(const Attn *a) { (void)a; return 1; }

#endif

/* Whether the fused attention runs its products on AMX tiles here (sanlab.model.native). */
int sanlab_amx_available(void) { return amx_available(); }
