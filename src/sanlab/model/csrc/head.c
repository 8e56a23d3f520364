/* The LM head's cross-entropy and z-loss over a chunk of logits, forward and gradient in
   one visit per row (sanlab.model.loss's fused head on the CPU).

   Per row of logits l (V values, fp32 or bf16): m = max l, e = exp(l − m) kept in an fp32
   row buffer (in L1), s = Σ e, lse = m + log s, x_t = l[t]. With a gradient buffer, the
   gradient of w·(lse − x_t) + c·w·lse² with respect to l:
       g = w·(1 + 2c·lse)·p − w·onehot(t),  p = e / s,
   its target entry formed as (p_t − 1/(1 + 2c·lse))·w·(1 + 2c·lse), the subtraction in
   fp32 before the scaling (it cancels when p_t ≈ 1), and written in the buffer's dtype
   (bf16 rounded to nearest even). The torch formulas it replaces made five passes over
   the (n, V) chunk in fp32 (the cast, softmax, gather, scatter, scale and the cast back);
   rows are independent, so the result does not depend on the thread count. */

#include "common.h"
#include "sanlab.h"

static float row_max(const void *l, int bf16, long off, int V)
{
    vf m0 = vsplat(-INFINITY);
    int j = 0;
    for (; j + VL <= V; j += VL) m0 = vmax(m0, getv(l, bf16, off + j));
    float m = hmax(m0);
    for (; j < V; j++) {
        const float x = get1(l, bf16, off + j);
        m = x > m ? x : m;
    }
    return m;
}

int sanlab_head_ce(const sanlab_head_ce_args *a)
{
    const long n = a->n;
    const int V = a->V, bf16 = a->logits_bf16;
    if (n < 0 || V < 1) return 1;
    for (long i = 0; i < n; i++)
        if (a->targets[i] < 0 || a->targets[i] >= V) return 1;
    int status = 0;
#pragma omp parallel num_threads(a->nthreads)
    {
        float *e = a->grad ? amalloc(sizeof(float) * (size_t)V) : NULL;
        if (a->grad && !e) {
#pragma omp atomic write
            status = 2;
        }
#pragma omp barrier
        if (!status) {
#pragma omp for schedule(static)
            for (long i = 0; i < n; i++) {
                const long off = i * a->ld;
                const int t = (int)a->targets[i];
                const float m = row_max(a->logits, bf16, off, V);
                /* Σ exp(l − m), two vector chains; e kept only when a gradient follows */
                vf s0 = vsplat(0.0f), s1 = s0;
                int j = 0;
                for (; j + 2 * VL <= V; j += 2 * VL) {
                    const vf p0 = vexp(getv(a->logits, bf16, off + j) - m);
                    const vf p1 = vexp(getv(a->logits, bf16, off + j + VL) - m);
                    if (e) {
                        vstore(e + j, p0);
                        vstore(e + j + VL, p1);
                    }
                    s0 += p0;
                    s1 += p1;
                }
                float s = hsum(s0 + s1);
                for (; j < V; j++) {
                    const float p = expf(get1(a->logits, bf16, off + j) - m);
                    if (e) e[j] = p;
                    s += p;
                }
                const float lse = m + logf(s), x_t = get1(a->logits, bf16, off + t);
                a->lse[i] = lse;
                a->x_t[i] = x_t;
                if (!e) continue;
                const float w = a->weights[i], scale = 1.0f + 2.0f * a->c * lse, inv = 1.0f / s;
                const float k = w * scale;
                const float target = (e[t] * inv - 1.0f / scale) * k;
                const long go = i * a->ld_grad;
                for (j = 0; j + VL <= V; j += VL) putv(a->grad, a->grad_bf16, go + j, vload(e + j) * inv * k);
                for (; j < V; j++) put1(a->grad, a->grad_bf16, go + j, e[j] * inv * k);
                put1(a->grad, a->grad_bf16, go + t, target);
            }
        }
        free(e);
    }
    return status;
}
