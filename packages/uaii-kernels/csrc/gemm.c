/* gemm.c — y = x . W^T with W [n, k] packed in its storage type. The weight rows are split into chunks taken
 * from atomic counters by the pool's threads: each task starts on its own contiguous share of the chunks (one
 * sequential stream of weight bytes per core, which the hardware prefetchers follow across chunks; interleaved
 * chunks would restart them every few KiB) and then helps with the others' shares, so a descheduled thread on a
 * busy machine costs at most the chunk it holds. Paths:
 *   int:   activations quantized to 32-blocks (uk_quantize_act); decode rows use the direct per-type dot kernels
 *          (or, where the ISA has them, the wide GEMV kernels on an activation row rearranged once per call),
 *          larger batches repack a chunk of weight rows into the tile form (repack.c) once and run the tile kernel
 *          over every activation row, so the packed weight is read once per call.
 *   float: F32 rows are used in place, F16/BF16 chunks are widened to f32, then the f32 tile kernel.
 *   f32 fallback (mode 1, and batches of types without a tile form, Q2_K): dequantize a chunk of rows, then the
 *          f32 tile kernel. */
#include <stdatomic.h>

#include "uk_internal.h"

#define GEMV_MAX_M 3      /* up to this many activation rows use the direct dot kernels */
#define GEMM_CHUNK 16     /* weight rows per chunk for batches */

enum { PATH_FLOAT, PATH_INT, PATH_DEQUANT };

#define MAX_SHARES 16     /* contiguous shares of the chunks, one per task (tasks beyond share the shares) */
typedef struct {
    _Alignas(64) _Atomic int64_t next;    /* own cache line: the counters are hit by different cores */
    int64_t end;
} share_t;

typedef struct {
    int type, path;
    const uk_traits_t *tr;
    const uint8_t *w;
    int64_t n, k, nb, row_bytes;
    const float *x;
    int64_t m, ldx;
    float *y;
    int64_t ldy;
    int8_t *aq;
    float *ad, *as;
    uint8_t *prep;          /* wide GEMV: the rearranged activation rows, prep_stride bytes apart; else NULL */
    int64_t prep_stride;
    int64_t chunk, n_chunks;
    int n_shares;
    share_t shares[MAX_SHARES];
    _Atomic int failed;
} gemm_ctx;

static void process_chunk(gemm_ctx *c, int ith, int64_t i0, int64_t nr) {
    const int64_t k = c->k, nb = c->nb;
    const uint8_t *w = c->w + i0 * c->row_bytes;
    float *y = c->y + i0;
    if (c->path == PATH_INT) {
        if (c->prep) {
            for (int64_t j = 0; j < c->m; j++)
                uk_kt.dotw[c->type](k, w, c->row_bytes, nr, c->prep + j * c->prep_stride, y + j * c->ldy);
            return;
        }
        uk_dotq_fn dot = uk_kt.dotq[c->type];
        if (dot && c->m <= GEMV_MAX_M) {
            for (int64_t i = 0; i < nr; i++)
                for (int64_t j = 0; j < c->m; j++)
                    y[j * c->ldy + i] = dot(k, w + i * c->row_bytes, c->aq + j * k, c->ad + j * nb, c->as + j * nb);
            return;
        }
        uint8_t *q = uk_scratch(ith, (size_t)nr * (size_t)(k + 12 * nb) + 64);
        if (!q) { atomic_store(&c->failed, 1); return; }
        float *sc = (float *)(q + nr * k), *mn = sc + nr * 2 * nb;
        const int64_t blocks_per_row = k / c->tr->elems;
        for (int64_t i = 0; i < nr; i++)
            c->tr->repack(w + i * c->row_bytes, blocks_per_row, q + i * k, sc + i * 2 * nb, mn + i * nb);
        uk_kt.tileq(k, (int)nr, (int)c->m, c->tr->repack_signed, q, sc, mn, c->aq, c->ad, c->as, y, c->ldy);
        return;
    }
    if (c->type == T_F32 && c->path == PATH_FLOAT) {
        if (c->m <= GEMV_MAX_M) {
            for (int64_t i = 0; i < nr; i++)
                for (int64_t j = 0; j < c->m; j++) y[j * c->ldy + i] = uk_kt.dotf[T_F32](k, w + i * c->row_bytes, c->x + j * c->ldx);
            return;
        }
        uk_kt.tilef(k, (int)nr, (int)c->m, (const float *)w, k, c->x, c->ldx, y, c->ldy);
        return;
    }
    if (c->path == PATH_FLOAT && c->m <= GEMV_MAX_M) {                  /* F16 / BF16 decode */
        for (int64_t i = 0; i < nr; i++)
            for (int64_t j = 0; j < c->m; j++) y[j * c->ldy + i] = uk_kt.dotf[c->type](k, w + i * c->row_bytes, c->x + j * c->ldx);
        return;
    }
    float *wf = uk_scratch(ith, (size_t)nr * (size_t)k * sizeof(float));   /* widen / dequantize the chunk */
    if (!wf) { atomic_store(&c->failed, 1); return; }
    const int64_t blocks_per_row = k / c->tr->elems;
    for (int64_t i = 0; i < nr; i++) uk_kt.dequant[c->type](w + i * c->row_bytes, wf + i * k, blocks_per_row);
    uk_kt.tilef(k, (int)nr, (int)c->m, wf, k, c->x, c->ldx, y, c->ldy);
}

static void gemm_task(void *arg, int ith, int nth) {
    (void)nth;
    gemm_ctx *c = arg;
    for (int j = 0; j < c->n_shares; j++) {            /* own share first, then help with the others */
        share_t *sh = &c->shares[(ith + j) % c->n_shares];
        for (;;) {
            const int64_t ch = atomic_fetch_add(&sh->next, 1);
            if (ch >= sh->end) break;
            const int64_t i0 = ch * c->chunk;
            process_chunk(c, ith, i0, UK_MIN(c->chunk, c->n - i0));
        }
    }
}

typedef struct {
    const float *x;
    int64_t ldx, k, nb, m;
    int8_t *aq;
    float *ad, *as;
    _Atomic int64_t next;
} qact_ctx;

static void qact_task(void *arg, int ith, int nth) {
    (void)ith; (void)nth;
    qact_ctx *c = arg;
    for (;;) {
        const int64_t j = atomic_fetch_add(&c->next, 1);
        if (j >= c->m) break;
        uk_kt.quant_act(c->x + j * c->ldx, c->k, c->aq + j * c->k, c->ad + j * c->nb, c->as + j * c->nb);
    }
}

int uk_gemm_path(int type) {
    uk_init();
    const uk_traits_t *tr = uk_traits(type);
    if (!tr) return 0;
    if (tr->repack || type == T_F32 || type == T_F16 || type == T_BF16) return 2;
    return uk_kt.dotq[type] ? 3 : 1;
}

int uk_quantize_act(const float *x, int64_t k, int8_t *q, float *d, float *s) {
    uk_init();
    if (k < 0 || k % QK) return UK_E_ARG;
    uk_kt.quant_act(x, k, q, d, s);
    return UK_OK;
}

int uk_gemm(int type, const void *w, int64_t n, int64_t k, const float *x, int64_t m, int64_t ldx, float *y,
            int64_t ldy, int mode) {
    uk_init();
    const uk_traits_t *tr = uk_traits(type);
    if (!tr) return UK_E_TYPE;
    if (n < 0 || k <= 0 || m < 0 || ldx < k || ldy < n || k % tr->elems) return UK_E_ARG;
    if (n == 0 || m == 0) return UK_OK;
    gemm_ctx c = {.type = type, .tr = tr, .w = w, .n = n, .k = k, .nb = k / QK, .x = x, .m = m, .ldx = ldx,
                  .y = y, .ldy = ldy};
    c.row_bytes = k / tr->elems * tr->bytes;
    const int plain = type == T_F32 || type == T_F16 || type == T_BF16;
    if (plain) c.path = (mode == 1 && type != T_F32) ? PATH_DEQUANT : PATH_FLOAT;
    else if (mode == 0 && (tr->repack || (m <= GEMV_MAX_M && uk_kt.dotq[type]))) c.path = PATH_INT;
    else c.path = PATH_DEQUANT;
    const int nthreads = uk_get_num_threads();
    if (m <= GEMV_MAX_M) {                    /* decode: enough chunks to balance, at least 8 rows each */
        int64_t per = n / ((int64_t)nthreads * 8);
        c.chunk = UK_MAX(8, (per + 3) / 4 * 4);
    } else {
        c.chunk = GEMM_CHUNK;
    }
    c.n_chunks = (n + c.chunk - 1) / c.chunk;
    const double work = (double)n * (double)k * (double)m;
    const int tasks = work < 32768.0 ? 1 : (int)UK_MIN((int64_t)nthreads, c.n_chunks);
    c.n_shares = UK_MIN(tasks, MAX_SHARES);
    for (int h = 0; h < c.n_shares; h++) {
        atomic_init(&c.shares[h].next, c.n_chunks * h / c.n_shares);
        c.shares[h].end = c.n_chunks * (h + 1) / c.n_shares;
    }
    int rc = UK_OK;
    uk_parallel_begin();
    if (c.path == PATH_INT) {
        const int64_t nb = c.nb;
        int8_t *aq = uk_scratch(UK_SLOT_SHARED, (size_t)m * (size_t)(k + 8 * nb) + 64);
        if (!aq) { rc = UK_E_NOMEM; goto done; }
        c.aq = aq;
        c.ad = (float *)(aq + m * k + (64 - (m * k) % 64) % 64);
        c.as = c.ad + m * nb;
        if (m * k < 65536) {
            for (int64_t j = 0; j < m; j++) uk_kt.quant_act(x + j * ldx, k, aq + j * k, c.ad + j * nb, c.as + j * nb);
        } else {
            qact_ctx q = {.x = x, .ldx = ldx, .k = k, .nb = nb, .m = m, .aq = aq, .ad = c.ad, .as = c.as};
            uk_parallel_run(qact_task, &q, (int)UK_MIN((int64_t)nthreads, m));
        }
        if (m <= GEMV_MAX_M && uk_kt.dotw[type]) {
            c.prep_stride = (int64_t)(UK_GPREP_BYTES(k) + 63) / 64 * 64;
            c.prep = uk_scratch(UK_SLOT_SHARED2, (size_t)(m * c.prep_stride));
            if (!c.prep) { rc = UK_E_NOMEM; goto done; }
            for (int64_t j = 0; j < m; j++)
                uk_kt.gprep[type](k, aq + j * k, c.ad + j * nb, c.as + j * nb, c.prep + j * c.prep_stride);
        }
    }
    uk_parallel_run(gemm_task, &c, tasks);
    if (atomic_load(&c.failed)) rc = UK_E_NOMEM;
done:
    uk_parallel_end();
    return rc;
}
