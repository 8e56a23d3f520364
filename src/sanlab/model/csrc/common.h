/* Shared by the compiled kernels: vectors of the target's width (GCC vector extensions:
   AVX-512, AVX2 or NEON), exp, bf16 conversion, aligned buffers. */

#ifndef SANLAB_COMMON_H
#define SANLAB_COMMON_H

#define _GNU_SOURCE /* posix_memalign, syscall */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* VL: floats per vector, the target's native width (a wider vector type than the
   registers makes GCC build every broadcast through the stack: measured 15-30x slower
   on AVX2). MR: rows per micro-kernel panel, its 2·MR accumulators in registers. */
#if defined(__AVX512F__)
#define VL 16
#define MR 8 /* 16 accumulators of 32 zmm */
#elif defined(__AVX__)
#define VL 8
#define MR 6 /* 12 accumulators of 16 ymm */
#elif defined(__ARM_NEON) || defined(__aarch64__)
#define VL 4
#define MR 8 /* 16 accumulators of 32 q registers */
#else
#define VL 4
#define MR 4
#endif
#define NW (2 * VL) /* columns per micro-kernel panel, and the granularity of key ranges */

typedef float vf __attribute__((vector_size(VL * sizeof(float))));
typedef int32_t vi __attribute__((vector_size(VL * sizeof(int32_t))));

static inline vf vload(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf vsplat(float a) { vf z = {0}; return z + a; }
static inline vf vselect(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
#if defined(__AVX512F__)
#include <immintrin.h>
/* a·b + c per lane, rounded once */
static inline vf vfma(vf a, float b, vf c) { return (vf)_mm512_fmadd_ps((__m512)a, _mm512_set1_ps(b), (__m512)c); }
static inline vf vmax(vf a, vf b) { return (vf)_mm512_max_ps((__m512)a, (__m512)b); }
static inline float hmax(vf v) { return _mm512_reduce_max_ps((__m512)v); }
static inline float hsum(vf v) { return _mm512_reduce_add_ps((__m512)v); }
#else
static inline vf vfma(vf a, float b, vf c)
{
    vf r;
    for (int i = 0; i < VL; i++) r[i] = fmaf(a[i], b, c[i]);
    return r;
}
static inline vf vmax(vf a, vf b) { return vselect(a > b, a, b); }

static inline float hmax(vf v)
{
    float m = v[0];
    for (int i = 1; i < VL; i++) m = v[i] > m ? v[i] : m;
    return m;
}

static inline float hsum(vf v)
{
    float s = 0.0f;
    for (int i = 0; i < VL; i++) s += v[i];
    return s;
}
#endif

/* exp(x) for x ≤ 88: 2^n · p(r), n = round(x·log2 e), r = x − n·ln 2 with ln 2 split in
   two constants, p the Cephes polynomial (about 1 ulp). x below −87.3 (where exp(x)
   leaves the normal range), −inf included, gives 0; NaN stays NaN. Those lanes are
   computed on garbage and then zeroed, which costs one compare instead of two clamps.
   With AVX-512 the scaling by 2^n is one VSCALEFPS, the zeroing its mask: the same values
   bit for bit as the integer exponent below (checked over every float up to 88). */
static inline vf vexp(vf x)
{
    const vf magic = vsplat(12582912.0f + 127.0f); /* 1.5·2^23 (+ the exponent bias): adding it rounds to an integer */
    const vf t = x * 1.44269504088896341f + magic;
    const vf n = t - magic;
    vf r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    vf p = vsplat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
#if defined(__AVX512F__)
    const __mmask16 normal = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-87.33654475f), _CMP_NLT_UQ);
    return (vf)_mm512_maskz_scalef_ps(normal, (__m512)p, (__m512)n);
#else
    const vi under = x < -87.33654475f;
    const vi e = ((vi)t - (vi)vsplat(12582912.0f)) << 23; /* (n + 127) << 23: 2^n */
    return (vf)((vi)(p * (vf)e) & ~under);
#endif
}

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline long round_up(long x, long m) { return (x + m - 1) / m * m; }

/* n bytes aligned to a cache line, uninitialised (for buffers written in full) */
static inline void *amalloc(size_t n)
{
    void *p = NULL;
    return posix_memalign(&p, 64, (size_t)round_up((long)n, 64)) == 0 ? p : NULL;
}

static inline void *zalloc(size_t n)
{
    void *p = NULL;
    n = round_up((long)n, 64);
    if (posix_memalign(&p, 64, n) != 0) return NULL;
    memset(p, 0, n);
    return p;
}

/* 16 bf16 <-> 16 fp32 (the store rounds to nearest even, NaN stays a quiet NaN) */
typedef uint16_t vh __attribute__((vector_size(VL * sizeof(uint16_t))));

static inline vf vload_bf16(const uint16_t *p)
{
    vh h;
    memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vi) << 16);
}

static inline void vstore_bf16(uint16_t *p, vf x)
{
#if defined(__AVX512BF16__) && VL == 16
    /* VCVTNEPS2BF16 rounds the same way and keeps NaN a quiet NaN, but reads a subnormal
       input as zero: it takes every vector without one (checked over every float) */
    if (!_mm512_fpclass_ps_mask((__m512)x, 0x20)) {
        const __m256bh h = _mm512_cvtneps_pbh((__m512)x);
        memcpy(p, &h, sizeof h);
        return;
    }
#endif
    vi u = (vi)x;
    const vi nan = (u & 0x7fffffff) > 0x7f800000;
    u = (u + 0x7fff + ((u >> 16) & 1)) >> 16;
    u = (u & ~nan) | (((vi)x >> 16 | 0x40) & nan);
    const vh h = __builtin_convertvector(u & 0xffff, vh);
    memcpy(p, &h, sizeof h);
}

/* Σ a[i]·b[i] over n fp32 values, vector accumulators then the tail (fixed order) */
static inline float dot_f32(const float *a, const float *b, int n)
{
    vf acc = vsplat(0.0f);
    int i = 0;
    for (; i + VL <= n; i += VL) acc += vload(a + i) * vload(b + i);
    float s = hsum(acc);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* fp32 -> bf16, rounding to nearest even (as torch's conversion; NaN stays a quiet NaN) */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Element j of an fp32 or bf16 array (`bf16` says which), read as fp32 or written from
   it: one value, or VL of them. (Loops that branch on `bf16` inside are unswitched by the
   compiler: the flag does not change within a loop.) */
static inline float get1(const void *p, int bf16, long j)
{
    return bf16 ? bf16_to_f32(((const uint16_t *)p)[j]) : ((const float *)p)[j];
}

static inline vf getv(const void *p, int bf16, long j)
{
    return bf16 ? vload_bf16((const uint16_t *)p + j) : vload((const float *)p + j);
}

static inline void put1(void *p, int bf16, long j, float x)
{
    if (bf16)
        ((uint16_t *)p)[j] = f32_to_bf16(x);
    else
        ((float *)p)[j] = x;
}

static inline void putv(void *p, int bf16, long j, vf x)
{
    if (bf16)
        vstore_bf16((uint16_t *)p + j, x);
    else
        vstore((float *)p + j, x);
}

/* D values of an fp32 or bf16 array from element `off`, times `scale`, into dst[0:D)
   (dst[D:Dp] is left as it is: zero in zeroed buffers) */
static inline void load_row(float *dst, const void *src, int bf16, long off, int D, float scale)
{
    int d = 0;
    for (; d + VL <= D; d += VL) vstore(dst + d, getv(src, bf16, off + d) * scale);
    for (; d < D; d++) dst[d] = get1(src, bf16, off + d) * scale;
}

#endif
