/* ops.c — entry points of the row operators: argument checks and row ranges across the pool; the row kernels
 * themselves are in ops_impl.inc (per ISA, through the kernel table). */
#include <stdatomic.h>

#include "uk_internal.h"

#define PAR_MIN_ELEMS 32768   /* smaller calls stay on the calling thread */

typedef struct {
    int op, kind, one, neox;
    const float *x, *w, *b, *u;
    float *y;
    int64_t rows, n, xs, us, ys, h, d, n_rot, per;
    float eps, scale, attn;
    const int32_t *pos;
    const float *inv_freq;
    _Atomic int64_t next;
} rows_ctx;

enum { OP_RMS, OP_LN, OP_SOFTMAX, OP_GLU, OP_ACT, OP_ROPE };

/* The cos/sin of a token's position, remembered per thread: a decode step rotates the same positions' queries and
   keys in every layer (2 x 30 calls of SmolLM2 per token), and the 2 x n_rot/2 double-precision sin/cos were most
   of a RoPE call. An entry is used only for the same position, rotary width, attention factor and frequencies (its
   own copy of them, compared by value: a new table at a freed one's address is not confused with it), so the
   values are those a fresh computation gives. */
#define ROPE_CACHE 8               /* entries per thread (a batched step's rows have as many positions) */
#define ROPE_CACHE_HALF 128        /* entries hold rotary widths up to 256 */
typedef struct {
    int32_t pos, half;
    float attn;
    float inv[ROPE_CACHE_HALF], cs[ROPE_CACHE_HALF], sn[ROPE_CACHE_HALF];
} rope_entry;
static _Thread_local rope_entry rope_cache[ROPE_CACHE];
static _Thread_local int rope_cache_next;

static void rope_angles(int32_t pos, const float *inv_freq, int64_t half, float attn, float *cs, float *sn) {
    for (int64_t i = 0; i < half; i++) {
        const double th = (double)pos * (double)inv_freq[i];
        cs[i] = (float)cos(th) * attn;
        sn[i] = (float)sin(th) * attn;
    }
}

/* the cos and sin rows of this call's token t: cached when they fit an entry, else into cs/sn */
static void rope_lookup(const rows_ctx *c, int64_t t, const float **cs, const float **sn, float *cs_tmp,
                        float *sn_tmp) {
    const int64_t half = c->n_rot / 2;
    const int32_t pos = c->pos[t];
    if (half > ROPE_CACHE_HALF) {
        rope_angles(pos, c->inv_freq, half, c->attn, cs_tmp, sn_tmp);
        *cs = cs_tmp, *sn = sn_tmp;
        return;
    }
    for (int e = 0; e < ROPE_CACHE; e++) {
        const rope_entry *r = &rope_cache[e];
        if (r->half == half && r->pos == pos && memcmp(&r->attn, &c->attn, sizeof(float)) == 0 &&
            memcmp(r->inv, c->inv_freq, (size_t)half * sizeof(float)) == 0) {
            *cs = r->cs, *sn = r->sn;
            return;
        }
    }
    rope_entry *r = &rope_cache[rope_cache_next];
    rope_cache_next = (rope_cache_next + 1) % ROPE_CACHE;
    rope_angles(pos, c->inv_freq, half, c->attn, r->cs, r->sn);
    memcpy(r->inv, c->inv_freq, (size_t)half * sizeof(float));
    r->pos = pos, r->attn = c->attn, r->half = (int32_t)half;
    *cs = r->cs, *sn = r->sn;
}

static void rope_token(rows_ctx *c, int64_t t) {
    float cs_tmp[2048], sn_tmp[2048];
    const float *cs, *sn;
    rope_lookup(c, t, &cs, &sn, cs_tmp, sn_tmp);
    for (int64_t hh = 0; hh < c->h; hh++) {
        const int64_t off = (t * c->h + hh) * c->d;
        uk_kt.rope_row(c->x + off, c->y + off, c->d, c->n_rot, cs, sn, c->neox);
    }
}

static void rows_task(void *arg, int ith, int nth) {
    (void)ith; (void)nth;
    rows_ctx *c = arg;
    for (;;) {
        const int64_t r0 = atomic_fetch_add(&c->next, 1) * c->per;
        if (r0 >= c->rows) break;
        const int64_t r1 = UK_MIN(c->rows, r0 + c->per);
        for (int64_t r = r0; r < r1; r++) {
            const float *x = c->x + r * c->xs;
            float *y = c->y + r * c->ys;
            switch (c->op) {
            case OP_RMS: uk_kt.rms_row(x, c->w, y, c->n, c->eps, c->one); break;
            case OP_LN: uk_kt.ln_row(x, c->w, c->b, y, c->n, c->eps); break;
            case OP_SOFTMAX: uk_kt.softmax_row(x, y, c->n, c->scale); break;
            case OP_GLU: uk_kt.glu_row(c->kind, x, c->u + r * c->us, y, c->n); break;
            case OP_ACT: uk_kt.act(c->kind, x, y, c->n); break;
            case OP_ROPE: rope_token(c, r); break;
            default: break;
            }
        }
    }
}

static int run_rows(rows_ctx *c, int64_t work) {
    uk_init();
    const int nthreads = uk_get_num_threads();
    const int64_t tasks = work < PAR_MIN_ELEMS ? 1 : UK_MIN((int64_t)nthreads, c->rows);
    c->per = UK_MAX(1, c->rows / (tasks * 4));
    uk_parallel_begin();
    uk_parallel_run(rows_task, c, (int)tasks);
    uk_parallel_end();
    return UK_OK;
}

int uk_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps, int w_offset_one) {
    if (rows < 0 || n <= 0) return UK_E_ARG;
    rows_ctx c = {.op = OP_RMS, .x = x, .w = w, .y = y, .rows = rows, .n = n, .xs = n, .ys = n, .eps = eps,
                  .one = w_offset_one};
    return run_rows(&c, rows * n);
}

int uk_layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t n, float eps) {
    if (rows < 0 || n <= 0) return UK_E_ARG;
    rows_ctx c = {.op = OP_LN, .x = x, .w = w, .b = b, .y = y, .rows = rows, .n = n, .xs = n, .ys = n, .eps = eps};
    return run_rows(&c, rows * n);
}

int uk_softmax(const float *x, float *y, int64_t rows, int64_t n, float scale) {
    if (rows < 0 || n <= 0) return UK_E_ARG;
    rows_ctx c = {.op = OP_SOFTMAX, .x = x, .y = y, .rows = rows, .n = n, .xs = n, .ys = n, .scale = scale};
    return run_rows(&c, rows * n);
}

int uk_act(int kind, const float *x, float *y, int64_t n) {
    if (kind < 0 || kind > 2 || n < 0) return UK_E_ARG;
    const int64_t cols = 4096;                   /* split a flat array into rows of 4096 for the pool */
    rows_ctx c = {.op = OP_ACT, .kind = kind, .x = x, .y = y, .rows = n / cols, .n = cols, .xs = cols, .ys = cols};
    if (c.rows) run_rows(&c, c.rows * cols);
    if (n % cols) { uk_init(); uk_kt.act(kind, x + c.rows * cols, y + c.rows * cols, n % cols); }
    return UK_OK;
}

int uk_glu(int kind, const float *gate, int64_t gate_stride, const float *up, int64_t up_stride, float *y,
           int64_t rows, int64_t n) {
    if (kind < 0 || kind > 2 || rows < 0 || n <= 0 || gate_stride < n || up_stride < n) return UK_E_ARG;
    rows_ctx c = {.op = OP_GLU, .kind = kind, .x = gate, .u = up, .y = y, .rows = rows, .n = n,
                  .xs = gate_stride, .us = up_stride, .ys = n};
    /* an exp and a divide per element cost ~8 of a norm's elements: a batched decode step's few rows (4 x 1536
       of SwiGLU) are worth both threads; each row is still one task's whole row, so its bits do not change */
    return run_rows(&c, rows * n * 8);
}

int uk_rope(const float *x, float *y, int64_t t, int64_t h, int64_t d, int64_t n_rot, const int32_t *pos,
            const float *inv_freq, float attn_factor, int neox) {
    if (t < 0 || h <= 0 || d <= 0 || n_rot < 0 || n_rot > d || n_rot % 2 || n_rot > 4096) return UK_E_ARG;
    rows_ctx c = {.op = OP_ROPE, .x = x, .y = y, .rows = t, .h = h, .d = d, .n_rot = n_rot, .pos = pos,
                  .inv_freq = inv_freq, .attn = attn_factor, .neox = neox};
    return run_rows(&c, t * h * d * 4);
}
