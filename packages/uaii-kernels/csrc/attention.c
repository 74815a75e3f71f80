/* attention.c — causal GQA attention over a KV cache (decode: t = 1; prefill: t > 1), with a sliding window,
 * StreamingLLM-style sink tokens, per-head sink logits and logit soft-capping. One (query, head) pair is a unit of
 * work: the visible rows are listed first, then scored, softmaxed and summed by one kernel call each (the kernel
 * table's dotn / wsum); scores live in a per-thread scratch buffer that grows once. uk_attention_rows runs the
 * decode rows of several sequences (one query each, each over its own cache) in one call: every row is the unit
 * work of a uk_attention call with t = 1 on that row alone, so its bits are that call's. */
#include <stdatomic.h>
#include <stdlib.h>

#include "uk_internal.h"

typedef struct {                                    /* one uk_attention call's arguments (one row's, batched) */
    const float *q;
    const uint8_t *k, *v;
    float *out;
    int64_t t, s, hq, hkv, d, dv, kss, ksh, vss, vsh;
    const int32_t *q_pos, *k_pos;
    float scale, softcap;
    int32_t window, n_sink;
    const float *sinks;
    int kv_f16;
} attn_ctx;

typedef struct {                                    /* the units of one parallel call: n calls of t * hq each */
    const attn_ctx *calls;
    int64_t n, per;
    _Atomic int64_t next;
    _Atomic int failed;
} attn_run;

static int attend_one(const attn_ctx *c, int ith, int64_t t, int64_t h) {
    const int64_t g = h / (c->hq / c->hkv);
    const float *q = c->q + (t * c->hq + h) * c->d;
    float *o = c->out + (t * c->hq + h) * c->dv;
    float *sc = uk_scratch(ith, (size_t)c->s * 8 + 64);
    if (!sc) return 1;
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
    if (nv == 0) return 0;
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
    return 0;
}

static void attn_task(void *arg, int ith, int nth) {
    (void)nth;
    attn_run *r = arg;
    for (;;) {
        const int64_t u = atomic_fetch_add(&r->next, 1);
        if (u >= r->n * r->per) break;
        const attn_ctx *c = &r->calls[u / r->per];
        const int64_t w = u % r->per;
        if (attend_one(c, ith, w / c->hq, w % c->hq)) atomic_store(&r->failed, 1);
    }
}

/* Runs the units of ``n`` calls; ``work`` (multiply-adds) decides whether threads are worth waking. */
static int attn_parallel(const attn_ctx *calls, int64_t n, int64_t per, double work) {
    attn_run r = {.calls = calls, .n = n, .per = per};
    const int64_t units = n * per;
    const int tasks = work < 65536.0 ? 1 : (int)UK_MIN((int64_t)uk_get_num_threads(), units);
    uk_parallel_begin();
    uk_parallel_run(attn_task, &r, tasks);
    uk_parallel_end();
    return atomic_load(&r.failed) ? UK_E_NOMEM : UK_OK;
}

static int attn_dims_bad(int64_t hq, int64_t hkv, int64_t d, int64_t dv) {
    return hq <= 0 || hkv <= 0 || hq % hkv || d <= 0 || dv <= 0;
}

int uk_attention(const float *q, const void *k, const void *v, float *out, int64_t t, int64_t s, int64_t hq,
                 int64_t hkv, int64_t d, int64_t dv, int64_t k_stride_s, int64_t k_stride_h, int64_t v_stride_s,
                 int64_t v_stride_h, const int32_t *q_pos, const int32_t *k_pos, float scale, int32_t window,
                 int32_t n_sink, float softcap, const float *sink_logits, int kv_type) {
    uk_init();
    if (t < 0 || s < 0 || attn_dims_bad(hq, hkv, d, dv) || (kv_type != 0 && kv_type != 1)) return UK_E_ARG;
    const attn_ctx c = {.q = q, .k = k, .v = v, .out = out, .t = t, .s = s, .hq = hq, .hkv = hkv, .d = d, .dv = dv,
                        .kss = k_stride_s, .ksh = k_stride_h, .vss = v_stride_s, .vsh = v_stride_h, .q_pos = q_pos,
                        .k_pos = k_pos, .scale = scale, .softcap = softcap, .window = window, .n_sink = n_sink,
                        .sinks = sink_logits, .kv_f16 = kv_type};
    return attn_parallel(&c, 1, t * hq, (double)(t * hq) * (double)s * (double)(d + dv));
}

#if defined(__GNUC__) || defined(__clang__)
#define ATTN_PREFETCH(p) __builtin_prefetch(p)
#else
#define ATTN_PREFETCH(p) ((void)(p))
#endif

/* Asks for a row's cached slots 0..n-1 as one sequential stream: the units read them head by head, a few hundred
   bytes out of every slot, which the hardware prefetchers follow poorly from a cold cache (a decode step's GEMMs
   evict the cache between layers). Reads nothing: the bits do not change. */
#define ATTN_PREFETCH_MAX (256 << 10)   /* short contexts, where latency dominates; longer ones stream anyway */
static void attn_prefetch(const void *cache, int64_t bytes) {
    const char *p = cache;
    for (int64_t o = 0; o < bytes; o += 64) ATTN_PREFETCH(p + o);
}

/* Row i's new key and value into slot ``slot`` of its cache (f16: rounded as numpy's float16 cast). */
static void attn_store(void *cache, int64_t slot, const float *x, int64_t n, int kv_f16) {
    if (kv_f16) {
        uint16_t *dst = (uint16_t *)cache + slot * n;
        for (int64_t i = 0; i < n; i++) dst[i] = uk_fp32_to_fp16(x[i]);
    } else {
        memcpy((float *)cache + slot * n, x, (size_t)n * sizeof(float));
    }
}

int uk_attention_rows(const float *q, const float *k_new, const float *v_new, float *out, int64_t rows,
                      void *const *k_cache, void *const *v_cache, const int32_t *kv_type, const int64_t *used,
                      const int32_t *const *q_pos, const int32_t *const *k_pos, int64_t hq, int64_t hkv, int64_t d,
                      int64_t dv, float scale, int32_t window, int32_t n_sink, float softcap,
                      const float *sink_logits) {
    uk_init();
    if (rows < 0 || attn_dims_bad(hq, hkv, d, dv)) return UK_E_ARG;
    for (int64_t i = 0; i < rows; i++)
        if (used[i] < 0 || (kv_type[i] != 0 && kv_type[i] != 1) || !k_cache[i] || !v_cache[i]) return UK_E_ARG;
    attn_ctx *calls = malloc((size_t)(rows ? rows : 1) * sizeof(attn_ctx));
    if (!calls) return UK_E_NOMEM;
    double work = 0.0;
    for (int64_t i = 0; i < rows; i++) {
        attn_store(k_cache[i], used[i], k_new + i * hkv * d, hkv * d, kv_type[i]);
        attn_store(v_cache[i], used[i], v_new + i * hkv * dv, hkv * dv, kv_type[i]);
        calls[i] = (attn_ctx){.q = q + i * hq * d, .k = k_cache[i], .v = v_cache[i], .out = out + i * hq * dv,
                              .t = 1, .s = used[i] + 1, .hq = hq, .hkv = hkv, .d = d, .dv = dv, .kss = hkv * d,
                              .ksh = d, .vss = hkv * dv, .vsh = dv, .q_pos = q_pos[i], .k_pos = k_pos[i],
                              .scale = scale, .softcap = softcap, .window = window, .n_sink = n_sink,
                              .sinks = sink_logits, .kv_f16 = kv_type[i]};
        work += (double)hq * (double)(used[i] + 1) * (double)(d + dv);
    }
    int64_t bytes = 0;
    for (int64_t i = 0; i < rows; i++) bytes += (used[i] + 1) * hkv * (d + dv) * (kv_type[i] ? 2 : 4);
    for (int64_t i = 0; bytes <= ATTN_PREFETCH_MAX && i < rows; i++) {
        const int64_t es = kv_type[i] ? 2 : 4;
        attn_prefetch(k_cache[i], (used[i] + 1) * hkv * d * es);
        attn_prefetch(v_cache[i], (used[i] + 1) * hkv * dv * es);
    }
    const int rc = attn_parallel(calls, rows, hq, work);
    free(calls);
    return rc;
}
