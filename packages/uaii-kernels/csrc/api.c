/* api.c — the format entry points of the C API: type queries, dequantize / quantize of whole tensors and the
 * embedding row gather. Large tensors are split into block ranges across the thread pool. */
#include <stdatomic.h>

#include "uk_internal.h"

int uk_type_block_elems(int type) { const uk_traits_t *t = uk_traits(type); return t ? t->elems : 0; }
int uk_type_block_bytes(int type) { const uk_traits_t *t = uk_traits(type); return t ? t->bytes : 0; }
int uk_can_dequantize(int type) { return uk_traits(type) != NULL; }
int uk_can_quantize(int type) { const uk_traits_t *t = uk_traits(type); return t && t->quant; }

typedef struct {
    int type, quant;
    const uk_traits_t *tr;
    const uint8_t *src;
    uint8_t *dst;
    int64_t nblocks, per_chunk, n_chunks;
    _Atomic int64_t next;
} conv_ctx;

static void conv_task(void *arg, int ith, int nth) {
    (void)ith; (void)nth;
    conv_ctx *c = arg;
    for (;;) {
        const int64_t ch = atomic_fetch_add(&c->next, 1);
        if (ch >= c->n_chunks) break;
        const int64_t b0 = ch * c->per_chunk, nb = UK_MIN(c->per_chunk, c->nblocks - b0);
        if (c->quant)
            c->tr->quant((const float *)c->src + b0 * c->tr->elems, c->dst + b0 * c->tr->bytes, nb);
        else
            uk_kt.dequant[c->type](c->src + b0 * c->tr->bytes, (float *)c->dst + b0 * c->tr->elems, nb);
    }
}

static int convert(int type, const void *src, void *dst, int64_t n, int quant) {
    uk_init();
    const uk_traits_t *tr = uk_traits(type);
    if (!tr || (quant && !tr->quant)) return UK_E_TYPE;
    if (n < 0 || n % tr->elems) return UK_E_ARG;
    conv_ctx c = {.type = type, .quant = quant, .tr = tr, .src = src, .dst = dst, .nblocks = n / tr->elems};
    const int64_t min_elems = quant ? 4096 : 65536;        /* quantizing costs far more per element */
    c.per_chunk = UK_MAX(1, min_elems / tr->elems);
    c.n_chunks = (c.nblocks + c.per_chunk - 1) / c.per_chunk;
    uk_parallel_begin();
    uk_parallel_run(conv_task, &c, (int)UK_MIN(c.n_chunks, (int64_t)UK_MAX_THREADS));
    uk_parallel_end();
    return UK_OK;
}

int uk_dequantize(int type, const void *src, float *dst, int64_t n) { return convert(type, src, dst, n, 0); }
int uk_quantize(int type, const float *src, void *dst, int64_t n) { return convert(type, src, dst, n, 1); }

typedef struct {
    int type;
    const uk_traits_t *tr;
    const uint8_t *table;
    int64_t n_cols, row_bytes, n_ids;
    const int64_t *ids;
    float *dst;
    _Atomic int64_t next;
} rows_ctx;

static void rows_task(void *arg, int ith, int nth) {
    (void)ith; (void)nth;
    rows_ctx *c = arg;
    for (;;) {
        const int64_t r = atomic_fetch_add(&c->next, 1);
        if (r >= c->n_ids) break;
        uk_kt.dequant[c->type](c->table + c->ids[r] * c->row_bytes, c->dst + r * c->n_cols, c->n_cols / c->tr->elems);
    }
}

int uk_get_rows(int type, const void *table, int64_t n_rows, int64_t n_cols, const int64_t *ids, int64_t n_ids,
                float *dst) {
    uk_init();
    const uk_traits_t *tr = uk_traits(type);
    if (!tr) return UK_E_TYPE;
    if (n_cols <= 0 || n_cols % tr->elems || n_ids < 0) return UK_E_ARG;
    for (int64_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= n_rows) return UK_E_ARG;
    rows_ctx c = {.type = type, .tr = tr, .table = table, .n_cols = n_cols, .row_bytes = n_cols / tr->elems * tr->bytes,
                  .n_ids = n_ids, .ids = ids, .dst = dst};
    const int tasks = n_ids * n_cols < 65536 ? 1 : (int)UK_MIN(n_ids, (int64_t)UK_MAX_THREADS);
    uk_parallel_begin();
    uk_parallel_run(rows_task, &c, tasks);
    uk_parallel_end();
    return UK_OK;
}

typedef struct {
    uint8_t *dst;
    const uint8_t *src;
    int64_t n, chunk;
    _Atomic int64_t next;
} copy_ctx;

static void copy_task(void *arg, int ith, int nth) {
    (void)ith; (void)nth;
    copy_ctx *c = arg;
    for (;;) {
        const int64_t off = atomic_fetch_add(&c->next, 1) * c->chunk;
        if (off >= c->n) break;
        memcpy(c->dst + off, c->src + off, (size_t)UK_MIN(c->chunk, c->n - off));
    }
}

int uk_copy(void *dst, const void *src, int64_t n) {
    if (n < 0) return UK_E_ARG;
    uk_init();
    copy_ctx c = {.dst = dst, .src = src, .n = n, .chunk = 1 << 20};
    const int64_t chunks = (n + c.chunk - 1) / c.chunk;
    uk_parallel_begin();
    uk_parallel_run(copy_task, &c, (int)UK_MIN(chunks, (int64_t)UK_MAX_THREADS));
    uk_parallel_end();
    return UK_OK;
}
