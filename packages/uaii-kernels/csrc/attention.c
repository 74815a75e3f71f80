/* attention.c — causal GQA attention over a KV cache (decode: t = 1; prefill: t > 1), with a sliding window,
 * StreamingLLM-style sink tokens, per-head sink logits and logit soft-capping. One (query, head) pair is a unit of
 * work: the visible rows are listed first, then scored, softmaxed and summed by one kernel call each (the kernel
 * table's dotn / wsum); scores live in a per-thread scratch buffer that grows once. */
#include <stdatomic.h>

#include "uk_internal.h"

typedef struct {
    const float *q;
    const uint8_t *k, *v;
    float *out;
    int64_t t, s, hq, hkv, d, dv, kss, ksh, vss, vsh;
    const int32_t *q_pos, *k_pos;
    float scale, softcap;
    int32_t window, n_sink;
    const float *sinks;
    int kv_f16;
    _Atomic int64_t next;
    _Atomic int failed;
} attn_ctx;

static void attend_one(attn_ctx *c, int ith, int64_t t, int64_t h) {
    const int64_t g = h / (c->hq / c->hkv);
    const float *q = c->q + (t * c->hq + h) * c->d;
    float *o = c->out + (t * c->hq + h) * c->dv;
    float *sc = uk_scratch(ith, (size_t)c->s * 8 + 64);
    if (!sc) { atomic_store(&c->failed, 1); return; }
    int32_t *idx = (int32_t *)(sc + c->s);
    const int64_t qp = c->q_pos ? c->q_pos[t] : c->s - c->t + t;
    int64_t nv = 0;                                     /* the visible cache rows, in slot order */
    for (int64_t s = 0; s < c->s; s++) {
        const int64_t kp = c->k_pos ? c->k_pos[s] : s;
        if (kp < 0 || kp > qp) continue;
        if (c->window > 0 && qp - kp >= c->window && kp >= c->n_sink) continue;
        idx[nv++] = (int32_t)s;
    }
    for (int64_t i = 0; i < c->dv; i++) o[i] = 0.0f;
    if (nv == 0) return;
    if (c->kv_f16) uk_kt.dotn_f16(c->d, q, (const uint16_t *)c->k + g * c->ksh, c->kss, idx, nv, sc);
    else uk_kt.dotn_f32(c->d, q, (const float *)c->k + g * c->ksh, c->kss, idx, nv, sc);
    float mx = -INFINITY;
    for (int64_t i = 0; i < nv; i++) {
        float l = sc[i] * c->scale;
        if (c->softcap > 0.0f) l = c->softcap * tanhf(l / c->softcap);
        sc[i] = l;
        mx = l > mx ? l : mx;
    }
    const float sink = c->sinks ? c->sinks[h] : -INFINITY;
    if (sink > mx) mx = sink;
    uk_kt.exp_shift(sc, nv, mx);
    float sum = 0.0f;
    for (int64_t i = 0; i < nv; i++) sum += sc[i];
    if (c->sinks) sum += expf(sink - mx);
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < nv; i++) sc[i] *= inv;
    if (c->kv_f16) uk_kt.wsum_f16(c->dv, sc, (const uint16_t *)c->v + g * c->vsh, c->vss, idx, nv, o);
    else uk_kt.wsum_f32(c->dv, sc, (const float *)c->v + g * c->vsh, c->vss, idx, nv, o);
}

static void attn_task(void *arg, int ith, int nth) {
    (void)nth;
    attn_ctx *c = arg;
    for (;;) {
        const int64_t u = atomic_fetch_add(&c->next, 1);
        if (u >= c->t * c->hq) break;
        attend_one(c, ith, u / c->hq, u % c->hq);
    }
}

int uk_attention(const float *q, const void *k, const void *v, float *out, int64_t t, int64_t s, int64_t hq,
                 int64_t hkv, int64_t d, int64_t dv, int64_t k_stride_s, int64_t k_stride_h, int64_t v_stride_s,
                 int64_t v_stride_h, const int32_t *q_pos, const int32_t *k_pos, float scale, int32_t window,
                 int32_t n_sink, float softcap, const float *sink_logits, int kv_type) {
    uk_init();
    if (t < 0 || s < 0 || hq <= 0 || hkv <= 0 || hq % hkv || d <= 0 || dv <= 0 || (kv_type != 0 && kv_type != 1))
        return UK_E_ARG;
    attn_ctx c = {.q = q, .k = k, .v = v, .out = out, .t = t, .s = s, .hq = hq, .hkv = hkv, .d = d, .dv = dv,
                  .kss = k_stride_s, .ksh = k_stride_h, .vss = v_stride_s, .vsh = v_stride_h, .q_pos = q_pos,
                  .k_pos = k_pos, .scale = scale, .softcap = softcap, .window = window, .n_sink = n_sink,
                  .sinks = sink_logits, .kv_f16 = kv_type};
    const int64_t units = t * hq;
    const double work = (double)units * (double)s * (double)(d + dv);
    const int tasks = work < 65536.0 ? 1 : (int)UK_MIN((int64_t)uk_get_num_threads(), units);
    uk_parallel_begin();
    uk_parallel_run(attn_task, &c, tasks);
    uk_parallel_end();
    return atomic_load(&c.failed) ? UK_E_NOMEM : UK_OK;
}
