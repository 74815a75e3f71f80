/* gemm.c — y = x . W^T with W [n, k] packed in its storage type. The weight rows are split into chunks taken
 * from atomic counters by the pool's threads: each task starts on its own contiguous share of the chunks (one
 * sequential stream of weight bytes per core, which the hardware prefetchers follow across chunks; interleaved
 * chunks would restart them every few KiB) and then helps with the others' shares, so a descheduled thread on a
 * busy machine costs at most the chunk it holds. Paths:
 *   int:   activations quantized to 32-blocks (uk_quantize_act); decode rows use the direct per-type dot kernels
 *          (or, where the ISA has them, the wide GEMV kernels on an activation row rearranged once per call).
 *          Batches compute every (weight row, activation row) pair with the same float operations in the same
 *          order as a decode row, so that prefill and decode give the same bits (a model amplifies a last-bit
 *          difference layer by layer through its activation quantizers): the wide GEMV kernels take 1-15
 *          activation rows in their tiles, and 16 or more of Q4_0/Q5_0 run their per-pair operations with the
 *          activation rows in the lanes (tilerl, x86_wbatch.inc); small batches (2-8 rows: batched decode steps)
 *          of the legacy types take the multi-row dot (dotqm: the activation rows in the 8-block form, each
 *          weight group unpacked into the same slices in registers once for 4 rows, no weight scratch, no
 *          horizontal sums); larger batches of the
 *          types with a direct dot pack a chunk of weight rows into the 8-block form
 *          (x86_pack8.inc) once and run tile8 over every activation row, which repeats the dot's sums; the
 *          others (scalar, NEON) repack the chunk into the tile form (repack.c), which decode rows use too.
 *   int16 (mode 2, act16 types: Q8_0): activations as int16 blocks (uk_quantize_act16), one tile16 kernel for
 *          decode rows and batches. ~100x less activation error than int8, ~2.5x slower batches: for a projection
 *          whose output a caller needs exact-ish (the logits), not for a whole model. Other types: mode 0.
 *   float: F32 rows are used in place and F16/BF16 rows widened in registers (tileh) or by chunks, then the f32
 *          tile kernel, for decode rows and batches alike.
 *   f32 (mode 1): dequantize a chunk of rows, then the f32 tile kernel. */
#include <stdatomic.h>

#include "uk_internal.h"

#define GEMV_MAX_M 3      /* up to this many activation rows use the direct dot kernels */
#define GEMM_CHUNK 16     /* weight rows per chunk for batches */
#define SMALL_M 8         /* up to this many rows (batched decode steps) are chunked as decode rows where they can */

enum { PATH_FLOAT, PATH_INT, PATH_INT16, PATH_DEQUANT };   /* PATH_INT16: PATH_INT with 16-bit activations */

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
    int16_t *aq16;          /* mode 2 on act16 types: the activation rows as int16 blocks (aq unused); else NULL */
    float *ad, *as;
    uint8_t *prep;          /* wide GEMV: the rearranged activation rows, prep_stride bytes apart; else NULL */
    int64_t prep_stride;
    uint8_t *a8;            /* tile8 batches: the activation rows in the 8-block form, a8_stride bytes apart */
    int64_t a8_stride;
    uint8_t *aw;            /* tilerl batches: the activation rows in tiles of 16 (rlprep), aw_stride bytes apart */
    int64_t aw_stride;
    uk_split_t split;       /* the weight rows' chunks, shared out among the tasks */
    _Atomic int64_t prep_next, prep_done;   /* activation rows taken / prepared inside the region (gemm_task) */
    _Atomic int failed;
} gemm_ctx;

/* Whether the wide GEMV kernel of `type` takes rows of k values: it has one, and k is within its range. The choice
   depends on (type, k) alone, so a weight's decode rows and batches always take the same kernel (their bits agree). */
static int wide_for(int type, int64_t k) {
    return uk_kt.gemmw[type] && (!uk_kt.gemmw_max_k[type] || k <= uk_kt.gemmw_max_k[type]);
}

/* Whether a batch of m rows of k values takes tilerl (activation rows in lanes): the wide kernel's batches of the
   types with a row-lane form, the same bits (x86_wbatch.inc); fewer rows keep gemmw, whose weight unpacking is
   shared by up to 4 rows and needs no packing pass. */
static int wbatch_for(int type, int64_t k, int64_t m) {
    return m >= UK_WB_MIN_M && wide_for(type, k) && uk_kt.rlpack[type] && uk_kt.tilerl;
}

/* the integer path of one chunk of nr weight rows */
static void int_chunk(gemm_ctx *c, int ith, const uint8_t *w, int64_t nr, float *y) {
    const int64_t k = c->k, nb = c->nb, m = c->m;
    const int decode = m <= GEMV_MAX_M;
    if (c->aq16) {                                /* one kernel for decode rows and batches: the same bits */
        uk_kt.tile16[c->type](k, (int)nr, (int)m, w, c->row_bytes, c->aq16, c->ad, y, c->ldy);
        return;
    }
    if (c->aw) {          /* wide types' batches: the chunk's rows in the row-lane form once, then every tile */
        const int64_t ws = nb * UK_WB_BLOCK;
        uint8_t *p = uk_scratch(ith, (size_t)(nr * ws));
        if (!p) { atomic_store(&c->failed, 1); return; }
        for (int64_t i = 0; i < nr; i++) uk_kt.rlpack[c->type](w + i * c->row_bytes, nb, p + i * ws);
        uk_kt.tilerl(nb, (int)nr, m, p, ws, c->aw, c->aw_stride, y, c->ldy);
        return;
    }
    if (c->prep) {        /* wide GEMV types: all rows at once, each weight group unpacked once; every pair alike */
        uk_kt.gemmw[c->type](k, w, c->row_bytes, nr, m, c->prep, c->prep_stride, y, c->ldy);
        return;
    }
    uk_dotqm_fn dotm = uk_kt.dotqm[c->type];
    if (dotm && m > 1 && m <= SMALL_M) {         /* batched decode steps: each weight row unpacked once per 4 rows */
        for (int64_t i = 0; i < nr; i++)
            for (int64_t j = 0; j < m; j += 4)
                dotm(nb, w + i * c->row_bytes, (int)UK_MIN(4, m - j), c->a8 + j * c->a8_stride, c->a8_stride,
                     y + j * c->ldy + i, c->ldy);
        return;
    }
    uk_dotq_fn dot = uk_kt.dotq[c->type];
    if (dot && (decode || !uk_kt.pack8[c->type])) {   /* decode rows; batches of a dot with no 8-block form */
        for (int64_t i = 0; i < nr; i++)
            for (int64_t j = 0; j < m; j++)
                y[j * c->ldy + i] = dot(k, w + i * c->row_bytes, c->aq + j * k, c->ad + j * nb, c->as + j * nb);
        return;
    }
    if (dot) {                                    /* batches in the order of the dot (tile8) */
        const int64_t ws = (nb + 7) / 8 * UK_G8_BYTES;
        uint8_t *p = uk_scratch(ith, (size_t)(nr * ws));
        if (!p) { atomic_store(&c->failed, 1); return; }
        memset(p, 0, (size_t)(nr * ws));
        for (int64_t i = 0; i < nr; i++) uk_kt.pack8[c->type](w + i * c->row_bytes, nb, p + i * ws);
        uk_kt.tile8(nb, uk_kt.flags8[c->type], (int)nr, (int)m, p, ws, c->a8, c->a8_stride, y, c->ldy);
        return;
    }
    uint8_t *q = uk_scratch(ith, (size_t)nr * (size_t)(k + 12 * nb) + 64);   /* the tile form, all rows */
    if (!q) { atomic_store(&c->failed, 1); return; }
    float *sc = (float *)(q + nr * k), *mn = sc + nr * 2 * nb;
    const int64_t blocks_per_row = k / c->tr->elems;
    for (int64_t i = 0; i < nr; i++)
        c->tr->repack(w + i * c->row_bytes, blocks_per_row, q + i * k, sc + i * 2 * nb, mn + i * nb);
    uk_kt.tileq(k, (int)nr, (int)m, c->tr->repack_signed, q, sc, mn, c->aq, c->ad, c->as, y, c->ldy);
}

static void process_chunk(gemm_ctx *c, int ith, int64_t i0, int64_t nr) {
    const int64_t k = c->k;
    const uint8_t *w = c->w + i0 * c->row_bytes;
    float *y = c->y + i0;
    if (c->path == PATH_INT || c->path == PATH_INT16) {
        int_chunk(c, ith, w, nr, y);
        return;
    }
    if (c->path == PATH_FLOAT && c->type == T_F32) {
        uk_kt.tilef(k, (int)nr, (int)c->m, (const float *)w, k, c->x, c->ldx, y, c->ldy);
        return;
    }
    if (c->path == PATH_FLOAT && uk_kt.tileh) {
        uk_kt.tileh(c->type, k, (int)nr, (int)c->m, (const uint16_t *)w, k, c->x, c->ldx, y, c->ldy);
        return;
    }
    float *wf = uk_scratch(ith, (size_t)nr * (size_t)k * sizeof(float));   /* widen / dequantize the chunk */
    if (!wf) { atomic_store(&c->failed, 1); return; }
    const int64_t blocks_per_row = k / c->tr->elems;
    for (int64_t i = 0; i < nr; i++) uk_kt.dequant[c->type](w + i * c->row_bytes, wf + i * k, blocks_per_row);
    uk_kt.tilef(k, (int)nr, (int)c->m, wf, k, c->x, c->ldx, y, c->ldy);
}

static void prep_row(gemm_ctx *c, int64_t j);

static void gemm_task(void *arg, int ith, int nth) {
    (void)nth;
    gemm_ctx *c = arg;
    if (atomic_load(&c->prep_done) < c->m) {       /* see prep_activations: every task that joins takes rows */
        for (int64_t j; (j = atomic_fetch_add(&c->prep_next, 1)) < c->m;) {
            prep_row(c, j);
            atomic_fetch_add(&c->prep_done, 1);
        }
        uk_wait_count(&c->prep_done, c->m);         /* the rows another task took: one row's work each */
    }
    int h = 0;
    for (int64_t ch; (ch = uk_split_take(&c->split, ith, &h)) >= 0;) {
        const int64_t i0 = ch * c->split.chunk;
        process_chunk(c, ith, i0, UK_MIN(c->split.chunk, c->n - i0));
    }
}

/* activation row j: quantized, then rearranged for the wide GEMV or the 8-block form where the call uses them */
static void prep_row(gemm_ctx *c, int64_t j) {
    const int64_t k = c->k, nb = c->nb;
    if (c->aq16) {
        uk_kt.quant_act16(c->x + j * c->ldx, k, c->aq16 + j * k, c->ad + j * nb);
        return;
    }
    int8_t *aq = c->aq + j * k;
    float *ad = c->ad + j * nb, *as = c->as + j * nb;
    uk_kt.quant_act(c->x + j * c->ldx, k, aq, ad, as);
    if (c->prep) uk_kt.gprep[c->type](k, aq, ad, as, c->prep + j * c->prep_stride);
    if (c->aw) uk_kt.rlprep(nb, aq, ad, (int)(j % UK_WB_TILE), c->aw + j / UK_WB_TILE * c->aw_stride);
    if (c->a8) uk_aprep8(k, aq, ad, as, c->a8 + j * c->a8_stride);
}

/* scratch for the activation rows of an integer-path call: quantized, and rearranged where needed */
static int prep_activations(gemm_ctx *c, int nthreads) {
    const int64_t m = c->m, k = c->k, nb = c->nb, qbytes = c->path == PATH_INT16 ? 2 : 1;
    int8_t *aq = uk_scratch(UK_SLOT_SHARED, (size_t)m * (size_t)(qbytes * k + 8 * nb) + 64);
    if (!aq) return UK_E_NOMEM;
    c->aq = aq;
    c->ad = (float *)(aq + qbytes * m * k + (64 - (qbytes * m * k) % 64) % 64);
    c->as = c->ad + m * nb;
    if (c->path == PATH_INT16) {
        c->aq16 = (int16_t *)aq;
    } else if (wbatch_for(c->type, k, m)) {          /* see int_chunk; the rows past the batch read as zeros */
        c->aw_stride = nb * UK_WB_ABLOCK;
        c->aw = uk_scratch(UK_SLOT_SHARED2, (size_t)((m + UK_WB_TILE - 1) / UK_WB_TILE * c->aw_stride));
        if (!c->aw) return UK_E_NOMEM;
        for (int64_t j = m; j % UK_WB_TILE; j++)
            uk_kt.rlprep(nb, NULL, NULL, (int)(j % UK_WB_TILE), c->aw + j / UK_WB_TILE * c->aw_stride);
    } else if (wide_for(c->type, k)) {               /* decode rows and batches (see int_chunk) */
        c->prep_stride = (int64_t)(UK_GPREP_BYTES(k) + 63) / 64 * 64;
        c->prep = uk_scratch(UK_SLOT_SHARED2, (size_t)(m * c->prep_stride));
        if (!c->prep) return UK_E_NOMEM;
    } else if ((uk_kt.dotqm[c->type] && m > 1 && m <= SMALL_M) ||
               (m > GEMV_MAX_M && uk_kt.dotq[c->type] && uk_kt.pack8[c->type])) {   /* see int_chunk */
        c->a8_stride = (nb + 7) / 8 * UK_A8_BYTES;
        c->a8 = uk_scratch(UK_SLOT_SHARED2, (size_t)(m * c->a8_stride));
        if (!c->a8) return UK_E_NOMEM;
    }
    /* A batched decode step's rows are prepared by the GEMM's own tasks, each taking rows from a counter before
       its first chunk (4 x 576: each row's quantization and layout is ~1-2 us that the other thread spent spinning
       here); one region per call, not one for the rows and one for the chunks (a region's start and join cost
       about what the split saved: 4-row Q4_1 576x1536 21.9 -> 19.7 us on a 2-core Xeon). One row, or a few short
       ones, stay here. */
    if (m < 2 || m * k < 2048 || nthreads < 2) {
        for (int64_t j = 0; j < m; j++) prep_row(c, j);
    } else {
        atomic_store(&c->prep_done, 0);
    }
    return UK_OK;
}

/* the path of `type` (traits tr) in `mode` (0..2): the one rule of uk_gemm and uk_gemm_path_mode. F32 rows are
   used in place in every mode; mode 1 dequantizes every other type; mode 2 takes 16-bit activations for the types
   with a tile16 kernel; block types take the integer path where they have a dot kernel or a repacked form. */
static int path_code(int type, const uk_traits_t *tr, int mode) {
    if (type == T_F32) return PATH_FLOAT;
    if (mode == 1) return PATH_DEQUANT;
    if (type == T_F16 || type == T_BF16) return PATH_FLOAT;
    if (mode == 2 && uk_kt.tile16[type]) return PATH_INT16;
    return tr->repack || uk_kt.dotq[type] ? PATH_INT : PATH_DEQUANT;
}

int uk_gemm_path_mode(int type, int mode) {
    uk_init();
    const uk_traits_t *tr = uk_traits(uk_held_base(type));
    if (!tr || mode < 0 || mode > 2) return 0;
    static const int code[] = {[PATH_FLOAT] = 2, [PATH_INT] = 2, [PATH_INT16] = 4, [PATH_DEQUANT] = 1};
    return code[path_code(type, tr, mode)];
}

int uk_gemm_path(int type) { return uk_gemm_path_mode(type, 0); }

int uk_quantize_act(const float *x, int64_t k, int8_t *q, float *d, float *s) {
    uk_init();
    if (k < 0 || k % QK) return UK_E_ARG;
    uk_kt.quant_act(x, k, q, d, s);
    return UK_OK;
}

int uk_quantize_act16(const float *x, int64_t k, int16_t *q, float *d) {
    uk_init();
    if (k < 0 || k % QK) return UK_E_ARG;
    uk_kt.quant_act16(x, k, q, d);
    return UK_OK;
}

int uk_gemm(int type, const void *w, int64_t n, int64_t k, const float *x, int64_t m, int64_t ldx, float *y,
            int64_t ldy, int mode) {
    uk_init();
    const uk_traits_t *tr = uk_traits(uk_held_base(type));      /* a held form has its type's blocks */
    if (!tr) return UK_E_TYPE;
    if (n < 0 || k <= 0 || m < 0 || ldx < k || ldy < n || k % tr->elems || mode < 0 || mode > 2) return UK_E_ARG;
    /* a held form is read by the kernels it was made for (uk_held_type); after uk_set_isa to an ISA without them,
       only mode 1 (rows dequantized) still reads it */
    if (uk_held_base(type) != type && mode != 1 && !wide_for(type, k)) return UK_E_ISA;
    if (n == 0 || m == 0) return UK_OK;
    gemm_ctx c = {.type = type, .tr = tr, .w = w, .n = n, .k = k, .nb = k / QK, .x = x, .m = m, .ldx = ldx,
                  .y = y, .ldy = ldy};
    atomic_init(&c.prep_next, 0);
    atomic_init(&c.prep_done, m);       /* every row prepared (or none needed) unless prep_activations defers them */
    c.row_bytes = k / tr->elems * tr->bytes;
    c.path = path_code(type, tr, mode);
    const int nthreads = uk_get_num_threads();
    int64_t chunk = GEMM_CHUNK;
    if (m <= GEMV_MAX_M || (m <= SMALL_M && (c.path == PATH_INT16 ||
                                             (c.path == PATH_INT && (wide_for(type, k) || uk_kt.dotqm[type]))))) {
        /* decode rows and small batches of the kernels that need no per-chunk scratch (long contiguous streams of
           cold weight bytes) */
        chunk = uk_decode_chunk(n, nthreads);
    }
    const int tasks = uk_split_init(&c.split, n, chunk, (double)n * (double)k * (double)m, nthreads);
    int rc = UK_OK;
    uk_parallel_begin();
    if ((c.path == PATH_INT || c.path == PATH_INT16) && (rc = prep_activations(&c, nthreads)) != UK_OK) goto done;
    uk_parallel_run(gemm_task, &c, tasks);
    if (atomic_load(&c.failed)) rc = UK_E_NOMEM;
done:
    uk_parallel_end();
    return rc;
}
