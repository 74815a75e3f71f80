/* mlxq.c — weights in MLX's quantized layout (mlx.core.quantize, mlx 0.32): y = x . dequant(W)^T (+ bias) with W
 * kept packed as mlx stores it (a memory map, a safetensors buffer): nothing is repacked or dequantized at load.
 *
 * The layout (uaii.ir.ops.quantized): W uint32 [n, k * bits / 32], each row one bit stream, least significant bit
 * first, so value e of a row is bits e*bits .. e*bits+bits-1 of its bytes (at 3, 5 and 6 bits values straddle bytes
 * and words; 8 values always fill exactly `bits` bytes). Scales (and biases) [n, k / group_size]. Per group:
 *   affine (bits 1..6, 8; groups 32, 64, 128): w = T(T(s * q) + b), T the scales' type (f32, f16, bf16 words): the
 *     product rounded to T, then the f32 sum rounded to T (mlx's order; no fused multiply-add: -ffp-contract=off
 *     and explicit multiplies then adds). For f16 / bf16, s * q (q <= 255) is exact in f32. Rounding is to nearest
 *     even (F16C on x86, uk_fp32_to_fp16 in C; bf16 by integer rounding, a NaN kept as a quiet NaN).
 *   mxfp4 (E2M1 values, groups 32) and mxfp8 (E4M3 values, groups 32) with E8M0 scales 2^(c - 127) (c = 255: +inf
 *     as mlx computes it in f32, c = 0: the subnormal 2^-127); nvfp4 (E2M1, groups 16) with E4M3 scales. E4M3 is
 *     OCP "fn": no infinities, S.1111.111 is NaN. w = value * scale, exact in f32 (or inf / NaN).
 * The reference is uaii.ir.reference.quantized.dequantize (verified bit-exact against mlx.core.dequantize);
 * mq_dequant_row computes it value by value and every SIMD dequantizer gives its bits.
 *
 * The product keeps the activations in f32 and sums each output as the f32 tile kernel does (uk_kt.tilef on x86,
 * x86_gemm.inc; nbits.c's float path):
 *   acc[l] = fma(w_e, x_e, acc[l]) for e = 0 .. K - 1 in order, l = e % 8 (K is a whole number of groups of 16
 *   or more values: no tail); y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)) (+ bias).
 * So batches dequantize a chunk of rows into scratch once and run tilef over every activation row, while decode rows
 * (up to MQ_FUSED_M) dequantize in registers and never store the f32 weight (x86_mlxq.inc); the scalar reference
 * (mq_frows_ref) dequantizes a row at a time and repeats the order. Every ISA, batch size and thread count gives the
 * same bits (tests/kernels/test_mlx_quant.py compares bits). Other ISAs (NEON) run the scalar reference: their
 * tilef sums in another order. */
#include <stdatomic.h>

#include "uk_internal.h"

#define MQ_NR 4            /* the SIMD decode path's rows that leave its passes of 8 go through tilef MQ_NR at a time */
#define MQ_FUSED_M 2       /* up to this many activation rows dequantize in registers; more: a chunk into scratch
                              once, then tilef */
#define MQ_CHUNK 16        /* weight rows per chunk for batches */
#define MQ_CHUNK_FLOATS 65536   /* a chunk's f32 copy (batches, dequantization): at most 256 KiB */

/* How the SIMD kernels decode 8 values: MQ_LUT (bits <= 4: a 16-entry table of the group's dequantized values,
   looked up by a permute), MQ_AFF (affine, 5, 6, 8 bits: computed per value), MQ_E4M3 (mxfp8). */
enum { MQ_LUT = 0, MQ_AFF = 1, MQ_E4M3 = 2 };

typedef struct {
    int mode, bits, gs, st, kind;
    int64_t n, k, groups, row_bytes;     /* groups per row; bytes of a packed row (k * bits / 8) */
    const uint8_t *w;
    const void *scales, *biases;
} mq_layout;

/* scratch of the kernels (64-byte aligned): up to MQ_NR rows of k floats, then a padded copy of the matrix's last
   row (the SIMD kernels load up to 8 bytes from the start of 8 values, past a row's end) */
#define MQ_TMP_BYTES(L) ((size_t)MQ_NR * (size_t)(L)->k * sizeof(float) + (size_t)(L)->row_bytes + 128)

/* The rules of mlx's table of modes (uaii.ir.ops.quantized.QUANT_MODES): bits and group sizes as bit masks. */
static const struct { int bits, groups, codes; } mq_modes[] = {
    [UK_MLX_AFFINE] = {0x17e, 32 | 64 | 128, 0},   /* bits 1..6, 8; scales and biases of a float type */
    [UK_MLX_MXFP4] = {1 << 4, 32, 1},              /* uint8 scale codes, no biases */
    [UK_MLX_MXFP8] = {1 << 8, 32, 1},
    [UK_MLX_NVFP4] = {1 << 4, 16, 1},
};

static const float mq_e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* E8M0 code c: 2^(c - 127); 255 gives +inf (255 << 23), 0 the subnormal 2^-127 */
static inline float mq_e8m0(uint8_t c) { return uk_u2f(c ? (uint32_t)c << 23 : 0x00400000u); }

/* E4M3 ("fn") code c: normal (1 + m/8) 2^(e - 7) is the f32 with exponent e + 120 and mantissa m << 20,
   subnormal m 2^-9; S.1111.111 is NaN (as numpy writes it: 0x7fc00000 with the sign) */
static inline float mq_e4m3(uint8_t c) {
    const uint32_t mag = c & 0x7fu, sign = (uint32_t)(c & 0x80u) << 24;
    if (mag == 0x7fu) return uk_u2f(sign | 0x7fc00000u);
    if (mag < 8) return uk_u2f(uk_f2u((float)mag * (1.0f / 512.0f)) | sign);
    return uk_u2f(((mag << 20) + (120u << 23)) | sign);
}

static inline float mq_bf16_round(float v) {
    const uint32_t x = uk_f2u(v);
    if (v != v) return uk_u2f((x & 0xffff0000u) | 0x00400000u);
    return uk_u2f((x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u);
}

/* v rounded to the scales' type T and back */
static inline float mq_round(float v, int st) {
    if (st == UK_NB_F16) return uk_fp16_to_fp32(uk_fp32_to_fp16(v));
    if (st == UK_NB_BF16) return mq_bf16_round(v);
    return v;
}

static inline float mq_float(const void *p, int st, int64_t i) {
    if (st == UK_NB_F16) return uk_fp16_to_fp32(((const uint16_t *)p)[i]);
    if (st == UK_NB_BF16) return uk_bf16_to_fp32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* the scale of group idx (row * groups + group) as a float: the float, or the value of the E8M0 / E4M3 code */
static inline float mq_scale(const mq_layout *L, int64_t idx) {
    if (L->mode == UK_MLX_AFFINE) return mq_float(L->scales, L->st, idx);
    const uint8_t c = ((const uint8_t *)L->scales)[idx];
    return L->mode == UK_MLX_NVFP4 ? mq_e4m3(c) : mq_e8m0(c);
}

/* --- the scalar reference -------------------------------------------------------------------------------------- */
/* value e of a row (p: its bytes): at most two bytes hold it, the second never read past the row */
static inline uint32_t mq_q(const uint8_t *p, int64_t row_bytes, int bits, int64_t e) {
    const int64_t bit = e * bits, o = bit >> 3;
    uint32_t v = p[o];
    if (o + 1 < row_bytes) v |= (uint32_t)p[o + 1] << 8;
    return (v >> (bit & 7)) & ((1u << bits) - 1u);
}

/* row r dequantized into dst [k] */
static void mq_dequant_row(const mq_layout *L, int64_t r, float *dst) {
    const uint8_t *p = L->w + r * L->row_bytes;
    for (int64_t g = 0; g < L->groups; g++) {
        const int64_t idx = r * L->groups + g, e0 = g * L->gs;
        const float s = mq_scale(L, idx), b = L->biases ? mq_float(L->biases, L->st, idx) : 0.0f;
        for (int64_t e = e0; e < e0 + L->gs; e++) {
            const uint32_t q = mq_q(p, L->row_bytes, L->bits, e);
            if (L->mode == UK_MLX_AFFINE) dst[e] = mq_round(mq_round(s * (float)q, L->st) + b, L->st);
            else dst[e] = (L->mode == UK_MLX_MXFP8 ? mq_e4m3((uint8_t)q) : mq_e2m1[q]) * s;
        }
    }
}

/* one output from a dequantized row (the order of the header comment) */
static float mq_fdot_ref(int64_t k, const float *w, const float *x) {
    float acc[8] = {0.0f};
    for (int64_t e = 0; e < k; e++) acc[e & 7] = fmaf(w[e], x[e], acc[e & 7]);
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* y[j * ldy + i] = weight row r + i . activation row j for i < nr, j < m; tmp: MQ_TMP_BYTES(L), 64-byte aligned */
typedef void (*mq_frows_fn)(const mq_layout *L, int64_t r, int64_t nr, const float *x, int64_t ldx, int64_t m,
                            float *y, int64_t ldy, void *tmp);
/* dst [nr, k] = weight rows r .. r + nr - 1 dequantized; tmp as above */
typedef void (*mq_deq_fn)(const mq_layout *L, int64_t r, int64_t nr, float *dst, void *tmp);

static void mq_frows_ref(const mq_layout *L, int64_t r, int64_t nr, const float *x, int64_t ldx, int64_t m, float *y,
                         int64_t ldy, void *tmp) {
    float *w = tmp;
    for (int64_t i = 0; i < nr; i++) {
        mq_dequant_row(L, r + i, w);
        for (int64_t j = 0; j < m; j++) y[j * ldy + i] = mq_fdot_ref(L->k, w, x + j * ldx);
    }
}

static void mq_deq_ref(const mq_layout *L, int64_t r, int64_t nr, float *dst, void *tmp) {
    (void)tmp;
    for (int64_t i = 0; i < nr; i++) mq_dequant_row(L, r + i, dst + i * L->k);
}

/* --- SIMD paths: one template compiled per x86 ISA (AVX-VNNI adds nothing to a float kernel: it runs AVX2's) ---- */
#ifdef UK_X86
#include <immintrin.h>
#define UK_TGT __attribute__((target("avx2,fma,f16c")))
#define UK_FN(name) name##_avx2
#define MQ_PERMX2 0
#include "x86_mlxq.inc"
#undef UK_TGT
#undef UK_FN
#undef MQ_PERMX2
#define UK_TGT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl")))
#define UK_FN(name) name##_avx512
#define MQ_PERMX2 1
#include "x86_mlxq.inc"
#endif

typedef struct {
    mq_frows_fn frows;    /* decode rows: up to fused_m activation rows */
    mq_deq_fn deq;        /* more rows: a chunk dequantized, then uk_kt.tilef */
    int64_t fused_m;
} mq_kernels;

/* the kernels of the current ISA (uk_set_isa), the scalar reference where no SIMD variant exists */
static mq_kernels mq_pick(void) {
#ifdef UK_X86
    switch (uk_get_isa()) {
    case UK_ISA_AVX512: return (mq_kernels){mq_frows_avx512, mq_deq_avx512, MQ_FUSED_M};
    case UK_ISA_AVXVNNI:
    case UK_ISA_AVX2: return (mq_kernels){mq_frows_avx2, mq_deq_avx2, MQ_FUSED_M};
    default: break;
    }
#endif
    return (mq_kernels){mq_frows_ref, mq_deq_ref, INT64_MAX};
}

/* --- the driver ------------------------------------------------------------------------------------------------ */
typedef struct {
    mq_layout L;
    const float *x, *bias;
    int64_t m, ldx, ldy, row0;    /* row0: the first row of a dequantization */
    float *y;                     /* the output (a dequantization's dst) */
    int fused;
    mq_kernels kern;
    uk_split_t split;
    _Atomic int failed;
} mq_ctx;

static void mq_chunk(mq_ctx *c, int ith, int64_t i0, int64_t nr) {
    const mq_layout *L = &c->L;
    float *y = c->y + i0;
    if (c->fused) {
        void *tmp = uk_scratch(ith, MQ_TMP_BYTES(L));
        if (!tmp) { atomic_store(&c->failed, 1); return; }
        c->kern.frows(L, i0, nr, c->x, c->ldx, c->m, y, c->ldy, tmp);
    } else {
        const size_t wbytes = ((size_t)nr * (size_t)L->k * sizeof(float) + 63) / 64 * 64;
        uint8_t *wf = uk_scratch(ith, wbytes + MQ_TMP_BYTES(L));
        if (!wf) { atomic_store(&c->failed, 1); return; }
        c->kern.deq(L, i0, nr, (float *)wf, wf + wbytes);
        uk_kt.tilef(L->k, (int)nr, (int)c->m, (const float *)wf, L->k, c->x, c->ldx, y, c->ldy);
    }
    if (c->bias)
        for (int64_t j = 0; j < c->m; j++)
            for (int64_t i = 0; i < nr; i++) y[j * c->ldy + i] += c->bias[i0 + i];
}

static void mq_gemm_task(void *arg, int ith, int nth) {
    (void)nth;
    mq_ctx *c = arg;
    const int64_t chunk = c->split.chunk;
    int h = 0;
    for (int64_t ch; (ch = uk_split_take(&c->split, ith, &h)) >= 0;)
        mq_chunk(c, ith, ch * chunk, UK_MIN(chunk, c->L.n - ch * chunk));
}

static void mq_deq_task(void *arg, int ith, int nth) {
    (void)nth;
    mq_ctx *c = arg;
    const int64_t chunk = c->split.chunk, rows = c->m;
    int h = 0;
    for (int64_t ch; (ch = uk_split_take(&c->split, ith, &h)) >= 0;) {
        void *tmp = uk_scratch(ith, MQ_TMP_BYTES(&c->L));
        if (!tmp) { atomic_store(&c->failed, 1); return; }
        c->kern.deq(&c->L, c->row0 + ch * chunk, UK_MIN(chunk, rows - ch * chunk), c->y + ch * chunk * c->L.k, tmp);
    }
}

static int mq_layout_of(mq_layout *L, int mode, int bits, int gs, const uint32_t *w, int64_t n, int64_t k,
                        const void *scales, const void *biases, int st) {
    if (mode < UK_MLX_AFFINE || mode > UK_MLX_NVFP4) return UK_E_TYPE;
    if (bits < 1 || bits > 8 || !((mq_modes[mode].bits >> bits) & 1)) return UK_E_TYPE;
    if (mq_modes[mode].codes ? st != UK_NB_U8 : st != UK_NB_F32 && st != UK_NB_F16 && st != UK_NB_BF16)
        return UK_E_TYPE;
    if (gs <= 0 || (gs & (gs - 1)) || !(gs & mq_modes[mode].groups)) return UK_E_ARG;
    if (n < 0 || k <= 0 || k > (INT64_MAX >> 4) || k % gs || !w || !scales) return UK_E_ARG;
    if ((biases != NULL) != !mq_modes[mode].codes) return UK_E_ARG;
    memset(L, 0, sizeof *L);
    L->mode = mode; L->bits = bits; L->gs = gs; L->st = st;
    L->kind = mode == UK_MLX_MXFP8 ? MQ_E4M3 : bits <= 4 ? MQ_LUT : MQ_AFF;
    L->n = n; L->k = k; L->groups = k / gs; L->row_bytes = k * bits / 8;
    L->w = (const uint8_t *)w; L->scales = scales; L->biases = biases;
    return UK_OK;
}

int uk_mlx_dequantize(int mode, int bits, int group_size, const uint32_t *w, int64_t n, int64_t k,
                      const void *scales, const void *biases, int scale_type, int64_t row0, int64_t rows, float *dst) {
    uk_init();
    mq_ctx c;
    memset(&c, 0, sizeof c);
    int rc = mq_layout_of(&c.L, mode, bits, group_size, w, n, k, scales, biases, scale_type);
    if (rc != UK_OK) return rc;
    if (row0 < 0 || rows < 0 || row0 > n - rows) return UK_E_ARG;
    if (rows == 0) return UK_OK;
    if (!dst) return UK_E_ARG;
    c.kern = mq_pick();
    c.y = dst; c.row0 = row0; c.m = rows;
    const int nthreads = uk_get_num_threads();
    const int tasks = uk_split_init(&c.split, rows, UK_MAX(1, MQ_CHUNK_FLOATS / k), (double)rows * (double)k / 8,
                                    nthreads);
    uk_parallel_begin();                                /* the call lock guards the scratch buffers */
    uk_parallel_run(mq_deq_task, &c, tasks);
    if (atomic_load(&c.failed)) rc = UK_E_NOMEM;
    uk_parallel_end();
    return rc;
}

int uk_mlx_gemm(int mode, int bits, int group_size, const uint32_t *w, int64_t n, int64_t k, const void *scales,
                const void *biases, int scale_type, const float *bias, const float *x, int64_t m, int64_t ldx,
                float *y, int64_t ldy) {
    uk_init();
    mq_ctx c;
    memset(&c, 0, sizeof c);
    int rc = mq_layout_of(&c.L, mode, bits, group_size, w, n, k, scales, biases, scale_type);
    if (rc != UK_OK) return rc;
    if (m < 0 || ldx < k || ldy < n || m > INT32_MAX) return UK_E_ARG;
    if (n == 0 || m == 0) return UK_OK;
    if (!x || !y) return UK_E_ARG;
    c.x = x; c.m = m; c.ldx = ldx; c.y = y; c.ldy = ldy; c.bias = bias;
    c.kern = mq_pick();
    c.fused = m <= c.kern.fused_m;
    const int nthreads = uk_get_num_threads();
    const int64_t chunk = m <= MQ_FUSED_M ? (uk_decode_chunk(n, nthreads) + 7) / 8 * 8   /* whole passes of 8 */
                                          : UK_MAX(4, UK_MIN(MQ_CHUNK, MQ_CHUNK_FLOATS / k / 4 * 4));
    const int tasks = uk_split_init(&c.split, n, chunk, (double)n * (double)k * (double)m, nthreads);
    uk_parallel_begin();
    uk_parallel_run(mq_gemm_task, &c, tasks);
    if (atomic_load(&c.failed)) rc = UK_E_NOMEM;
    uk_parallel_end();
    return rc;
}
