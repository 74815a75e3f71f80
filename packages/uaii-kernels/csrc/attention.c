/* attention.c — causal GQA attention over a KV cache (decode: t = 1; prefill: t > 1), with a sliding window,
 * StreamingLLM-style sink tokens, per-head sink logits and logit soft-capping. One (query, kv head) pair is a unit
 * of work, for the G = hq / hkv query heads that share the kv head: the visible rows are listed once, then scored for
 * all G heads in one pass over the keys and summed in one pass over the values (the kernel table's dotn / wsum: each
 * cache row read once, not G times, each head's operations in a lone head's order, so the same bits), softmaxed per
 * head in between; scores live in a per-thread scratch buffer that grows once. uk_attention_rows runs the
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

typedef struct {                          /* the units of one parallel call: n calls of t * hq / gs each */
    const attn_ctx *calls;
    int64_t n, per, gs;                           /* gs: query heads per unit, G or (too few units) a divisor */
    _Atomic int64_t next;
    _Atomic int failed;
} attn_run;

/* The rows visible from query t, in slot order (branch-free: the test is a coin flip under a window or a ring);
   returns how many. */
static int64_t attn_visible(const attn_ctx *c, int64_t t, int32_t *idx) {
    const int64_t qp = c->q_pos ? c->q_pos[t] : c->s - c->t + t;
    int64_t nv = 0;
    for (int64_t s = 0; s < c->s; s++) {
        const int64_t kp = c->k_pos ? c->k_pos[s] : s;
        const int out = (c->window > 0) & (qp - kp >= c->window) & (kp >= c->n_sink);
        idx[nv] = (int32_t)s;
        nv += (kp >= 0) & (kp <= qp) & !out;
    }
    return nv;
}

/* Scores -> probabilities for the nb (<= 4, a constant once inlined) heads h.. (sc: nb rows of nv), in place. The
   heads run interleaved so that their serial max and sum chains overlap; each head's operations, in its order. */
UK_INLINE void attn_softmax(const int nb, const attn_ctx *c, int64_t h, float *sc, int64_t nv) {
    float mx[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sink[4];
    if (c->softcap > 0.0f) {
        const float cap = c->softcap, scale = c->scale;
        for (int64_t i = 0; i < nv; i++)
            for (int j = 0; j < nb; j++) {
                const float l = cap * tanhf(sc[j * nv + i] * scale / cap);
                sc[j * nv + i] = l;
                mx[j] = l > mx[j] ? l : mx[j];
            }
    } else {      /* the ISA's loop (this file is built for the baseline ISA): ~15% of a decode row's attention */
        for (int j = 0; j < nb; j++) mx[j] = uk_kt.scale_max(sc + j * nv, nv, c->scale);
    }
    for (int j = 0; j < nb; j++) {
        sink[j] = c->sinks ? c->sinks[h + j] : -INFINITY;
        if (sink[j] > mx[j]) mx[j] = sink[j];
        uk_kt.exp_shift(sc + j * nv, nv, mx[j]);
    }
    for (int64_t i = 0; i < nv; i++)
        for (int j = 0; j < nb; j++) sum[j] += sc[j * nv + i];
    for (int j = 0; j < nb; j++) {
        if (c->sinks) sum[j] += expf(sink[j] - mx[j]);
        const float inv = 1.0f / sum[j];
        for (int64_t i = 0; i < nv; i++) sc[j * nv + i] *= inv;
    }
}

static void attn_softmax_heads(const attn_ctx *c, int64_t h0, int64_t g, float *sc, int64_t nv) {
    for (int64_t j = 0; j < g; j += 4) {
        switch (g - j) {
        case 1: attn_softmax(1, c, h0 + j, sc + j * nv, nv); break;
        case 2: attn_softmax(2, c, h0 + j, sc + j * nv, nv); break;
        case 3: attn_softmax(3, c, h0 + j, sc + j * nv, nv); break;
        default: attn_softmax(4, c, h0 + j, sc + j * nv, nv); break;
        }
    }
}

/* One unit: query t against kv head kh, for the G query heads that share it — one visibility scan, each key and
   value row read once for all G (the dotn / wsum kernels); every head's bits are those of that head alone. The
   unit may be G heads h0.. of kv head kh or a slice of them (when kv heads are too few to feed the threads). */
static int attend_group(const attn_ctx *c, int ith, int64_t t, int64_t h0, int64_t G) {
    const int64_t kh = h0 / (c->hq / c->hkv);
    const float *q = c->q + (t * c->hq + h0) * c->d;
    float *o = c->out + (t * c->hq + h0) * c->dv;
    const int64_t wide = c->d > c->dv ? c->d : c->dv;
    float *sc = uk_scratch(ith, ((size_t)c->s * (size_t)(G + 1) + 4 * (size_t)wide) * 4 + 64);
    if (!sc) return 1;
    int32_t *idx = (int32_t *)(sc + c->s * G);
    float *tmp = (float *)(idx + c->s);
    for (int64_t i = 0; i < G * c->dv; i++) o[i] = 0.0f;
    const int64_t nv = attn_visible(c, t, idx);
    if (nv == 0) return 0;
    if (c->kv_f16) uk_kt.dotn_f16(c->d, G, q, (const uint16_t *)c->k + kh * c->ksh, c->kss, idx, nv, sc, tmp);
    else uk_kt.dotn_f32(c->d, G, q, (const float *)c->k + kh * c->ksh, c->kss, idx, nv, sc, tmp);
    attn_softmax_heads(c, h0, G, sc, nv);
    if (c->kv_f16) uk_kt.wsum_f16(c->dv, G, sc, (const uint16_t *)c->v + kh * c->vsh, c->vss, idx, nv, o, tmp);
    else uk_kt.wsum_f32(c->dv, G, sc, (const float *)c->v + kh * c->vsh, c->vss, idx, nv, o, tmp);
    return 0;
}

static void attn_task(void *arg, int ith, int nth) {
    (void)nth;
    attn_run *r = arg;
    for (;;) {
        const int64_t u = atomic_fetch_add(&r->next, 1);
        if (u >= r->n * r->per) break;
        const attn_ctx *c = &r->calls[u / r->per];
        const int64_t w = u % r->per, blocks = c->hq / r->gs;
        if (attend_group(c, ith, w / blocks, w % blocks * r->gs, r->gs)) atomic_store(&r->failed, 1);
    }
}

/* Runs the units of ``n`` calls of ``t`` queries each; ``work`` (multiply-adds) decides whether threads are worth
   waking. A unit is one query's G heads of a kv head; when there are fewer such units than threads (one row of a
   model with one or two kv heads), the G heads are split into the fewest equal slices that feed every thread. */
static int attn_parallel(const attn_ctx *calls, int64_t n, int64_t t, int64_t hq, int64_t hkv, double work) {
    const int64_t G = hq / hkv;
    const int64_t threads = work < 65536.0 ? 1 : (int64_t)uk_get_num_threads();
    int64_t gs = G;
    while (gs > 1 && n * t * (hq / gs) < threads) {
        do gs--; while (G % gs);
    }
    attn_run r = {.calls = calls, .n = n, .per = t * (hq / gs), .gs = gs};
    const int tasks = (int)UK_MAX(1, UK_MIN(threads, n * r.per));
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
    return attn_parallel(&c, 1, t, hq, hkv, (double)(t * hq) * (double)s * (double)(d + dv));
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
        uk_kt.to_f16(x, n, (uint16_t *)cache + slot * n);
    } else {
        memcpy((float *)cache + slot * n, x, (size_t)n * sizeof(float));
    }
}

/* Longest rows first (insertion sort: a batch is a few rows): the threads take units in this order, so the long
   rows start early and the short ones fill the gaps, instead of one long row starting last on one thread. */
static void attn_longest_first(attn_ctx *calls, int64_t rows) {
    for (int64_t i = 1; i < rows; i++) {
        const attn_ctx c = calls[i];
        int64_t j = i;
        for (; j > 0 && calls[j - 1].s < c.s; j--) calls[j] = calls[j - 1];
        calls[j] = c;
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
    attn_longest_first(calls, rows);
    const int rc = attn_parallel(calls, rows, 1, hq, hkv, work);
    free(calls);
    return rc;
}
