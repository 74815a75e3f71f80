/* held.c — held forms of weight rows (uaii_kernels.h: uk_held_type, uk_relayout). A pinned weight is read every
 * step for as long as the model is loaded, so it may as well sit in the order the GEMM tiles consume it: Q4_1 rows
 * whose 16-block groups are stored as the AVX-512 tiles lay them out in registers (x86_q41x16.inc: 4 x 64 bytes of
 * nibbles, block i's qs bytes 4c..4c+3 in dword lane i of chunk c, then the 16 d and the 16 m as fp16), and the
 * last nb % 16 blocks of a row as they are. Byte for byte the same size, row by row, so a row still starts at
 * i * row_bytes. Rewritten once, when a weight is pinned: scalar code over the thread pool. */
#include <stdatomic.h>

#include "uk_internal.h"

#define X16_BLOCKS 16
#define Q41_BYTES ((int)sizeof(block_q4_1))

int uk_held_base(int type) { return type == T_Q4_1_X16 ? T_Q4_1 : type; }

int uk_held_type(int type, int64_t k) {
    uk_init();
    /* only rows with a whole 16-block group gain anything; the tiles read the held form on AVX-512 VBMI only */
    if (type == T_Q4_1 && k > 0 && k % QK == 0 && k / QK >= X16_BLOCKS && uk_kt.gemmw[T_Q4_1_X16]) return T_Q4_1_X16;
    return type;
}

/* n bytes at offset f of a group in the file's layout and at offset h of the held form: file -> held (held = 1)
   or back */
static inline void x16_move(int held, uint8_t *dst, const uint8_t *in, int f, int h, size_t n) {
    if (held) memcpy(dst + h, in + f, n);
    else memcpy(dst + f, in + h, n);
}

/* one row of nb Q4_1 blocks into the held form (held = 1) or back (held = 0); src == dst rewrites it in place
   (a group at a time through the stack) */
static void x16_row(const uint8_t *src, uint8_t *dst, int64_t nb, int held) {
    const int64_t n16 = nb / X16_BLOCKS;
    uint8_t tmp[UK_X16_GROUP];
    for (int64_t g = 0; g < n16; g++, src += UK_X16_GROUP, dst += UK_X16_GROUP) {
        const uint8_t *in = src;
        if (src == dst) {
            memcpy(tmp, src, UK_X16_GROUP);
            in = tmp;
        }
        for (int i = 0; i < X16_BLOCKS; i++) {
            const int blk = Q41_BYTES * i;    /* block i of the file's layout: d, m, qs[16] */
            for (int c = 0; c < 4; c++) x16_move(held, dst, in, blk + 4 + 4 * c, 64 * c + 4 * i, 4);
            x16_move(held, dst, in, blk, 256 + 2 * i, 2);          /* d */
            x16_move(held, dst, in, blk + 2, 288 + 2 * i, 2);      /* m */
        }
    }
    if (src != dst) memcpy(dst, src, (size_t)(Q41_BYTES * (nb - X16_BLOCKS * n16)));
}

/* the dequantizer of a held Q4_1 row (gemm.c's f32 path, mode 1): each group back to the file's layout on the
   stack, then the Q4_1 dequantizer of this ISA (the same values) */
void uk_deq_q4_1x16_row(const void *src, float *dst, int64_t nb) {
    const uint8_t *p = src;
    uint8_t tmp[UK_X16_GROUP];
    const int64_t n16 = nb / X16_BLOCKS;
    for (int64_t g = 0; g < n16; g++, p += UK_X16_GROUP, dst += X16_BLOCKS * QK) {
        x16_row(p, tmp, X16_BLOCKS, 0);
        uk_kt.dequant[T_Q4_1](tmp, dst, X16_BLOCKS);
    }
    if (nb > X16_BLOCKS * n16) uk_kt.dequant[T_Q4_1](p, dst, nb - X16_BLOCKS * n16);
}

typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    int64_t n, nb, row_bytes, chunk;
    int held;
    _Atomic int64_t next;
} relayout_ctx;

static void relayout_task(void *arg, int ith, int nth) {
    (void)ith; (void)nth;
    relayout_ctx *c = arg;
    for (;;) {
        const int64_t r0 = atomic_fetch_add(&c->next, 1) * c->chunk;
        if (r0 >= c->n) break;
        for (int64_t r = r0; r < UK_MIN(r0 + c->chunk, c->n); r++)
            x16_row(c->src + r * c->row_bytes, c->dst + r * c->row_bytes, c->nb, c->held);
    }
}

int uk_relayout(int from_type, int to_type, const void *src, void *dst, int64_t n, int64_t k) {
    uk_init();
    const int held = from_type == T_Q4_1 && to_type == T_Q4_1_X16;
    if (!held && !(from_type == T_Q4_1_X16 && to_type == T_Q4_1)) return UK_E_TYPE;
    if (n < 0 || k <= 0 || k % QK || (n > 0 && (!src || !dst))) return UK_E_ARG;
    if (n == 0) return UK_OK;
    const int64_t nb = k / QK, row_bytes = nb * Q41_BYTES;
    const uint8_t *s = src;
    uint8_t *d = dst;
    if (s != d && s < d + n * row_bytes && d < s + n * row_bytes) return UK_E_ARG;   /* overlapping, not in place */
    relayout_ctx c = {.src = s, .dst = d, .n = n, .nb = nb, .row_bytes = row_bytes, .held = held};
    c.chunk = UK_MAX(1, (1 << 18) / row_bytes);     /* ~256 KiB of rows per task */
    const int64_t chunks = (n + c.chunk - 1) / c.chunk;
    uk_parallel_begin();
    uk_parallel_run(relayout_task, &c, (int)UK_MIN(chunks, (int64_t)UK_MAX_THREADS));
    uk_parallel_end();
    return UK_OK;
}
