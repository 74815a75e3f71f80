/* nbits.c — ONNX's MatMulNBits (com.microsoft contrib op): y = x . dequant(B)^T (+ bias) with B kept in ONNX's
 * block-quantized layout, read in place (a memory map, a staging buffer): nothing is repacked or dequantized at load.
 *
 * The layout (onnxruntime's contrib-op spec): B is uint8 [n, kb, bs * bits / 8] with kb = ceil(k / bs) blocks of
 * bs values per row (the last block padded), packed along k; with 4 bits value 2i is the low nibble of byte i and
 * value 2i + 1 its high nibble. scales [n * kb] (f32, f16 or bf16); zero points absent (2^(bits-1)), uint8 packed
 * like B ([n * ceil(kb * bits / 8)], each row padded to whole bytes) or float [n * kb]. w = (q - zp) * scale.
 *
 * The integer path (uk_nbits_gemm modes 0 and 2) quantizes each activation row in groups of 32 values to int8
 * (uk_quantize_act: d = amax / 127) and sums integer products, as the GGUF kernels do. Every weight block (16..256
 * values) is a whole number of 16-value halves of a group, so the float work is per group and half:
 *   q' = q - off (off = 0 for 4 bits, 128 for 8 bits: signed bytes for the dot instructions), per half h of group g
 *   ISUM = sum q' * qa (exact), IA = sum qa; z' = zp - off for an integer zero point (0 for a float one);
 *   I = ISUM - z' * IA (exact int32); a float zero point adds the min term m = ((float)off - zf) * s times da * IA.
 *   Groups 0..G8 (G8 = G / 8 * 8) accumulate in lane g % 8, the later ones in a tail:
 *     blocks >= 32: acc = fma((float)(I_0 + I_1), s * da, acc);   macc = fma(m, da * (float)(IA_0 + IA_1), macc)
 *     blocks of 16: acc = fma((float)I_0, s_0 * da, acc); acc = fma((float)I_1, s_1 * da, acc); likewise macc
 *   y = tree(acc) + tail (+ (tree(macc) + mtail) with float zero points) (+ bias), with
 *   tree(v) = ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
 * The scalar reference below computes exactly these operations in this order and every SIMD path repeats them, so
 * every ISA, batch size and thread count gives the same bits (the tests compare bits). Why fixed: a model quantizes
 * every layer's activations, and a last-bit difference between prefill and decode grows layer by layer.
 * The float path (mode 1: onnxruntime's accuracy levels 0..3) keeps the activations in f32. Each weight value is
 * dequantized as w = ((float)q - zf) * s with zf the block's zero point as a float ((float)z for an integer one:
 * the subtraction is then exact, so these are the bits of numpy's (float)(q - z) * s), and each output is
 *   acc[l] = fma(w_e, x_e, acc[l]) for e = 0 .. K8 - 1 in order, l = e % 8 (K8 = K / 8 * 8);
 *   y = tree(acc); then y = y + w_e * x_e (two roundings) for e = K8 .. K - 1; (+ bias).
 * That is the f32 tile kernel's order (uk_kt.tilef on x86, x86_gemm.inc), so batches dequantize a chunk of rows
 * into scratch once and run tilef over every activation row, while a few rows (decode) dequantize in registers
 * and never store the f32 weight; nb_fdot_ref repeats the order in scalar code, and every ISA, batch size and
 * thread count gives the same bits here too. */
#include <stdatomic.h>

#include "uk_internal.h"

#define NB_MR 4            /* activation rows per weight-row pass of the integer kernel */
#define NB_CHUNK 16        /* weight rows per chunk for batches */
#define NBF_NR 4           /* weight rows per pass of the float kernel (independent accumulator chains) */
#define NBF_MR 2           /* activation rows per pass of the float kernel */
#define NBF_BIAS 8388608.0f   /* 2^23: the float path's integer zero points are biased by it (x86_nbits.inc) */
#define NBF_FUSED_M 2      /* up to this many activation rows dequantize in registers (each pass of NBF_MR rows
                              dequantizes again); more: a chunk into scratch once, then tilef (faster from 3 rows) */
#define NBF_CHUNK_FLOATS 65536   /* a chunk's f32 copy (batches): at most 256 KiB, 4 to NB_CHUNK rows */

typedef struct {
    int bits, bs, off, fz;          /* fz: float zero points (min term) */
    int64_t n, k, kb, groups;       /* kb blocks of bs values, groups of 32 values per row (G = ceil(kb bs / 32)) */
    int64_t row_bytes, zp_row;      /* zp_row: bytes (uint8) or elements (float) of zero points per row */
    const uint8_t *b;
    const void *scales, *zp;
    int st, zt;
} nb_layout;

/* per group u (0..7) of a run of groups: scale, integer zero point and min term of its half 0 and half 1 */
typedef struct {
    float s0[8], s1[8], m0[8], m1[8];
    int32_t z0[8], z1[8];
} nb_params_t;

/* y[j * ldy] = weight row r . activation row j (prep + j * ps) for j < mr <= NB_MR; tmp: NB_ROW_BYTES(kb) bytes of
   scratch, 64-byte aligned (the SIMD kernels expand the row's block parameters into it) */
typedef void (*nb_rows_fn)(const nb_layout *L, int64_t r, int mr, const uint8_t *prep, int64_t ps, float *y,
                           int64_t ldy, void *tmp);
#define NB_ROW_BYTES(kb) ((size_t)((kb) + 24) * 12 + 64)

static float nb_float(const void *p, int type, int64_t i) {
    if (type == UK_NB_F16) return uk_fp16_to_fp32(((const uint16_t *)p)[i]);
    if (type == UK_NB_BF16) return uk_bf16_to_fp32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/* the integer zero point of block blk of row r (the default 2^(bits-1) when there is none) */
static int32_t nb_zp(const nb_layout *L, int64_t r, int64_t blk) {
    if (L->zt != UK_NB_U8) return 1 << (L->bits - 1);
    const uint8_t *z = (const uint8_t *)L->zp + r * L->zp_row;
    return L->bits == 8 ? z[blk] : (z[blk / 2] >> (4 * (blk & 1))) & 15;
}

static void nb_block(const nb_layout *L, int64_t r, int64_t blk, float *s, int32_t *z, float *m) {
    if (blk >= L->kb) { *s = 0.0f; *z = 0; *m = 0.0f; return; }         /* a half past the last block (16s) */
    *s = nb_float(L->scales, L->st, r * L->kb + blk);
    if (L->fz) {
        *z = 0;
        *m = ((float)L->off - nb_float(L->zp, L->zt, r * L->kb + blk)) * *s;
    } else {
        *z = nb_zp(L, r, blk) - L->off;
        *m = 0.0f;
    }
}

/* the parameters of groups g .. g + cnt - 1 of row r */
static void nb_params(const nb_layout *L, int64_t r, int64_t g, int cnt, nb_params_t *p) {
    for (int u = 0; u < cnt; u++) {
        if (L->bs >= 32) {
            nb_block(L, r, (g + u) * 32 / L->bs, &p->s0[u], &p->z0[u], &p->m0[u]);
        } else {
            nb_block(L, r, 2 * (g + u), &p->s0[u], &p->z0[u], &p->m0[u]);
            nb_block(L, r, 2 * (g + u) + 1, &p->s1[u], &p->z1[u], &p->m1[u]);
        }
    }
}

/* --- activation rows ------------------------------------------------------------------------------------------ */
/* One prepared row: qa [32 G] int8 (4 bits: each group as the values 0, 2, .., 30, then 1, 3, .., 31 — the order in
   which the weight nibbles unpack; 8 bits: natural order), then float da [G], float scratch [G], and int32 IA of
   half 0 [G], of half 1 [G], of both [G]. */
#define NB_PREP_BYTES(G) ((int64_t)(G) * 56)

static void nb_prep_row(const nb_layout *L, const float *x, uint8_t *out) {
    const int64_t G = L->groups, full = L->k / 32, used = (L->k + 31) / 32;
    int8_t *qa = (int8_t *)out;
    float *da = (float *)(out + 32 * G), *sa = da + G;
    int32_t *lo = (int32_t *)(sa + G), *hi = lo + G, *all = hi + G;
    if (full) uk_kt.quant_act(x, full * 32, qa, da, sa);
    if (used > full) {                                       /* the last, partial group: zero-padded */
        float tmp[32] = {0.0f};
        memcpy(tmp, x + full * 32, sizeof(float) * (size_t)(L->k - full * 32));
        uk_kt.quant_act(tmp, 32, qa + full * 32, da + full, sa + full);
    }
    memset(qa + used * 32, 0, (size_t)(32 * (G - used)));   /* groups of padding only (blocks > k) */
    for (int64_t g = used; g < G; g++) da[g] = 0.0f;
    for (int64_t g = 0; g < G; g++) {
        int8_t *q = qa + 32 * g, t[32];
        int32_t s0 = 0, s1 = 0;
        for (int v = 0; v < 16; v++) { s0 += q[v]; s1 += q[16 + v]; }
        lo[g] = s0; hi[g] = s1; all[g] = s0 + s1;
        if (L->bits == 4) {
            for (int v = 0; v < 16; v++) { t[v] = q[2 * v]; t[16 + v] = q[2 * v + 1]; }
            memcpy(q, t, 32);
        }
    }
}

/* --- the scalar reference -------------------------------------------------------------------------------------- */
UK_INLINE float nb_tree(const float *v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

static float nb_dot_ref(const nb_layout *L, int64_t r, const uint8_t *prep) {
    const int64_t G = L->groups, G8 = G / 8 * 8, gb = L->bits == 4 ? 16 : 32;
    const int8_t *qa = (const int8_t *)prep;
    const float *da = (const float *)(prep + 32 * G);
    const int32_t *lo = (const int32_t *)(da + 2 * G), *hi = lo + G, *all = hi + G;
    const uint8_t *w = L->b + r * L->row_bytes;
    float acc[8] = {0.0f}, macc[8] = {0.0f}, t = 0.0f, mt = 0.0f;
    nb_params_t p;
    for (int64_t g = 0; g < G; g++) {
        const int u = (int)(g % 8);
        if (u == 0) nb_params(L, r, g, (int)UK_MIN(8, G - g), &p);
        int32_t is[2] = {0, 0};
        const int8_t *a = qa + 32 * g;
        for (int64_t j = 0; j < gb && g * gb + j < L->row_bytes; j++) {
            const int c = w[g * gb + j];
            if (L->bits == 4) {
                is[j >= 8] += (c & 15) * a[j] + (c >> 4) * a[16 + j];
            } else {
                is[j >= 16] += (c - 128) * a[j];
            }
        }
        const int32_t i0 = is[0] - p.z0[u] * lo[g];
        float *A = g < G8 ? &acc[u] : &t, *M = g < G8 ? &macc[u] : &mt;
        if (L->bs >= 32) {
            *A = fmaf((float)(i0 + is[1] - p.z0[u] * hi[g]), p.s0[u] * da[g], *A);
            if (L->fz) *M = fmaf(p.m0[u], da[g] * (float)all[g], *M);
        } else {
            *A = fmaf((float)i0, p.s0[u] * da[g], *A);
            *A = fmaf((float)(is[1] - p.z1[u] * hi[g]), p.s1[u] * da[g], *A);
            if (L->fz) {
                *M = fmaf(p.m0[u], da[g] * (float)lo[g], *M);
                *M = fmaf(p.m1[u], da[g] * (float)hi[g], *M);
            }
        }
    }
    float y = nb_tree(acc) + t;
    if (L->fz) y = y + (nb_tree(macc) + mt);
    return y;
}

static void nb_rows_ref(const nb_layout *L, int64_t r, int mr, const uint8_t *prep, int64_t ps, float *y,
                        int64_t ldy, void *tmp) {
    (void)tmp;
    for (int j = 0; j < mr; j++) y[j * ldy] = nb_dot_ref(L, r, prep + j * ps);
}

/* --- the float path (mode 1) ---------------------------------------------------------------------------------- */
/* the scale and the zero point as a float of block blk of row r */
static void nb_fblock(const nb_layout *L, int64_t r, int64_t blk, float *s, float *zf) {
    *s = nb_float(L->scales, L->st, r * L->kb + blk);
    *zf = L->fz ? nb_float(L->zp, L->zt, r * L->kb + blk) : (float)nb_zp(L, r, blk);
}

/* row r dequantized: its first k values as f32 */
static void nb_dequant_row(const nb_layout *L, int64_t r, float *dst) {
    const uint8_t *w = L->b + r * L->row_bytes;
    for (int64_t blk = 0; blk < L->kb; blk++) {
        float s, zf;
        nb_fblock(L, r, blk, &s, &zf);
        const int64_t e0 = blk * L->bs, n = UK_MIN(L->bs, L->k - e0);
        for (int64_t e = e0; e < e0 + n; e++) {
            const int q = L->bits == 8 ? w[e] : (w[e / 2] >> (4 * (e & 1))) & 15;
            dst[e] = ((float)q - zf) * s;
        }
    }
}

/* one output of the float path from a dequantized row w (the order of the header comment) */
static float nb_fdot_ref(int64_t k, const float *w, const float *x) {
    const int64_t k8 = k / 8 * 8;
    float acc[8] = {0.0f};
    for (int64_t e = 0; e < k8; e++) acc[e & 7] = fmaf(w[e], x[e], acc[e & 7]);
    float y = nb_tree(acc);
    for (int64_t e = k8; e < k; e++) y = y + w[e] * x[e];
    return y;
}

/* y[j * ldy + i] = weight row r + i . activation row j for i < nr, j < m. tmp: NB_FTMP_BYTES(L) bytes, 64-aligned */
typedef void (*nb_frows_fn)(const nb_layout *L, int64_t r, int64_t nr, const float *x, int64_t ldx, int64_t m,
                            float *y, int64_t ldy, void *tmp);
/* dst [nr, k] = weight rows r .. r + nr - 1 dequantized; tmp as above */
typedef void (*nb_deq_fn)(const nb_layout *L, int64_t r, int64_t nr, float *dst, void *tmp);
#define NB_FTMP_BYTES(L) ((size_t)UK_MAX((L)->k, 2 * NBF_NR * ((L)->kb + 8)) * sizeof(float) + 64)

static void nb_frows_ref(const nb_layout *L, int64_t r, int64_t nr, const float *x, int64_t ldx, int64_t m, float *y,
                         int64_t ldy, void *tmp) {
    float *w = tmp;
    for (int64_t i = 0; i < nr; i++) {
        nb_dequant_row(L, r + i, w);
        for (int64_t j = 0; j < m; j++) y[j * ldy + i] = nb_fdot_ref(L->k, w, x + j * ldx);
    }
}

static void nb_deq_ref(const nb_layout *L, int64_t r, int64_t nr, float *dst, void *tmp) {
    (void)tmp;
    for (int64_t i = 0; i < nr; i++) nb_dequant_row(L, r + i, dst + i * L->k);
}

/* --- SIMD paths: one template compiled per x86 ISA ------------------------------------------------------------- */
#ifdef UK_X86
#include <immintrin.h>
#define UK_TGT __attribute__((target("avx2,fma,f16c")))
#define UK_FN(name) name##_avx2
#define UK_VNNI 0
#include "x86_nbits.inc"
#undef UK_TGT
#undef UK_FN
#undef UK_VNNI
#define UK_TGT __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#define UK_FN(name) name##_avx512
#define UK_VNNI 2
#include "x86_nbits.inc"
#undef UK_TGT
#undef UK_FN
#undef UK_VNNI
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#define NB_HAVE_AVXVNNI 1
#define UK_TGT __attribute__((target("avx2,fma,f16c,avxvnni")))
#define UK_FN(name) name##_avxvnni
#define UK_VNNI 1
#include "x86_nbits.inc"
#endif
#endif

/* The kernels of one ISA. The scalar reference has no fused float kernel: it dequantizes each row once per call
   (nb_frows_ref) for any number of activation rows, in the order tilef repeats. */
typedef struct {
    nb_rows_fn rows;      /* the integer path */
    nb_frows_fn frows;    /* the float path, up to fused_m activation rows */
    nb_deq_fn deq;        /* the float path, more rows: a chunk dequantized, then uk_kt.tilef */
    int64_t fused_m;
} nb_kernels;

/* the kernels of the current ISA (uk_set_isa), the scalar reference where no SIMD variant exists */
static nb_kernels nb_pick(void) {
#ifdef UK_X86
    switch (uk_get_isa()) {
    case UK_ISA_AVX512: return (nb_kernels){nb_rows_avx512, nbf_rows_avx512, nbf_dequant_avx512, NBF_FUSED_M};
#ifdef NB_HAVE_AVXVNNI
    case UK_ISA_AVXVNNI: return (nb_kernels){nb_rows_avxvnni, nbf_rows_avxvnni, nbf_dequant_avxvnni, NBF_FUSED_M};
#else
    case UK_ISA_AVXVNNI: return (nb_kernels){nb_rows_avx2, nbf_rows_avx2, nbf_dequant_avx2, NBF_FUSED_M};
#endif
    case UK_ISA_AVX2: return (nb_kernels){nb_rows_avx2, nbf_rows_avx2, nbf_dequant_avx2, NBF_FUSED_M};
    default: break;
    }
#endif
    return (nb_kernels){nb_rows_ref, nb_frows_ref, nb_deq_ref, INT64_MAX};
}

/* --- the driver ------------------------------------------------------------------------------------------------ */
typedef struct {
    nb_layout L;
    const float *x, *bias;
    int64_t m, ldx, ldy;
    float *y;
    int mode, fused;      /* fused: the float path through kern.frows */
    nb_kernels kern;
    uint8_t *prep;
    int64_t ps;
    _Atomic int64_t next_prep;
    uk_split_t split;
    _Atomic int failed;
} nb_ctx;

static void nb_chunk(nb_ctx *c, int ith, int64_t i0, int64_t nr) {
    const nb_layout *L = &c->L;
    float *y = c->y + i0;
    if (c->mode == 1 && c->fused) {
        void *tmp = uk_scratch(ith, NB_FTMP_BYTES(L));
        if (!tmp) { atomic_store(&c->failed, 1); return; }
        c->kern.frows(L, i0, nr, c->x, c->ldx, c->m, y, c->ldy, tmp);
    } else if (c->mode == 1) {
        const size_t wbytes = ((size_t)nr * (size_t)L->k * sizeof(float) + 63) / 64 * 64;
        uint8_t *wf = uk_scratch(ith, wbytes + NB_FTMP_BYTES(L));
        if (!wf) { atomic_store(&c->failed, 1); return; }
        c->kern.deq(L, i0, nr, (float *)wf, wf + wbytes);
        uk_kt.tilef(L->k, (int)nr, (int)c->m, (const float *)wf, L->k, c->x, c->ldx, y, c->ldy);
    } else {
        void *tmp = uk_scratch(ith, NB_ROW_BYTES(L->kb));
        if (!tmp) { atomic_store(&c->failed, 1); return; }
        for (int64_t j = 0; j < c->m; j += NB_MR)      /* a few activation rows against the whole chunk */
            for (int64_t i = 0; i < nr; i++)
                c->kern.rows(L, i0 + i, (int)UK_MIN(NB_MR, c->m - j), c->prep + j * c->ps, c->ps, y + j * c->ldy + i,
                             c->ldy, tmp);
    }
    if (c->bias)
        for (int64_t j = 0; j < c->m; j++)
            for (int64_t i = 0; i < nr; i++) y[j * c->ldy + i] += c->bias[i0 + i];
}

static void nb_task(void *arg, int ith, int nth) {
    (void)nth;
    nb_ctx *c = arg;
    const int64_t chunk = c->split.chunk;
    int h = 0;
    for (int64_t ch; (ch = uk_split_take(&c->split, ith, &h)) >= 0;)
        nb_chunk(c, ith, ch * chunk, UK_MIN(chunk, c->L.n - ch * chunk));
}

static void nb_prep_task(void *arg, int ith, int nth) {
    (void)ith; (void)nth;
    nb_ctx *c = arg;
    for (;;) {
        const int64_t j = atomic_fetch_add(&c->next_prep, 1);
        if (j >= c->m) break;
        nb_prep_row(&c->L, c->x + j * c->ldx, c->prep + j * c->ps);
    }
}

static int nb_layout_of(nb_layout *L, int bits, int block_size, const uint8_t *b, int64_t n, int64_t k,
                        const void *scales, int scale_type, const void *zero_points, int zp_type) {
    if (bits != 4 && bits != 8) return UK_E_TYPE;
    if (block_size < 16 || block_size > 256 || (block_size & (block_size - 1))) return UK_E_ARG;
    if (scale_type != UK_NB_F32 && scale_type != UK_NB_F16 && scale_type != UK_NB_BF16) return UK_E_TYPE;
    if (zp_type < UK_NB_NONE || zp_type > UK_NB_BF16) return UK_E_TYPE;
    if (n < 0 || k <= 0 || !b || !scales || (zp_type != UK_NB_NONE && !zero_points)) return UK_E_ARG;
    memset(L, 0, sizeof *L);
    L->bits = bits; L->bs = block_size; L->off = bits == 8 ? 128 : 0;
    L->fz = zp_type >= UK_NB_F32;
    L->n = n; L->k = k; L->kb = (k + block_size - 1) / block_size;
    L->groups = (L->kb * block_size + 31) / 32;
    L->row_bytes = L->kb * block_size * bits / 8;
    L->zp_row = zp_type == UK_NB_U8 ? (L->kb * bits + 7) / 8 : L->kb;
    L->b = b; L->scales = scales; L->st = scale_type; L->zp = zero_points; L->zt = zp_type;
    return UK_OK;
}

int uk_nbits_dequantize(int bits, int block_size, const uint8_t *b, int64_t n, int64_t k, const void *scales,
                        int scale_type, const void *zero_points, int zp_type, float *dst) {
    uk_init();
    nb_layout L;
    int rc = nb_layout_of(&L, bits, block_size, b, n, k, scales, scale_type, zero_points, zp_type);
    if (rc != UK_OK || n == 0) return rc;
    const nb_kernels kern = nb_pick();
    uk_parallel_begin();                                /* the call lock guards the scratch buffers */
    void *tmp = uk_scratch(0, NB_FTMP_BYTES(&L));
    if (tmp) kern.deq(&L, 0, n, dst, tmp);
    else rc = UK_E_NOMEM;
    uk_parallel_end();
    return rc;
}

int uk_nbits_gemm(int bits, int block_size, const uint8_t *b, int64_t n, int64_t k, const void *scales,
                  int scale_type, const void *zero_points, int zp_type, const float *bias, const float *x, int64_t m,
                  int64_t ldx, float *y, int64_t ldy, int mode) {
    uk_init();
    nb_ctx c;
    memset(&c, 0, sizeof c);
    int rc = nb_layout_of(&c.L, bits, block_size, b, n, k, scales, scale_type, zero_points, zp_type);
    if (rc != UK_OK) return rc;
    if (m < 0 || ldx < k || ldy < n || mode < 0 || mode > 2) return UK_E_ARG;
    if (n == 0 || m == 0) return UK_OK;
    c.x = x; c.m = m; c.ldx = ldx; c.y = y; c.ldy = ldy; c.bias = bias;
    c.mode = mode == 1 ? 1 : 0;                       /* mode 2 ("precise") is mode 0: no 16-bit kernel here */
    c.kern = nb_pick();
    c.fused = c.mode == 1 && m <= c.kern.fused_m;
    const int nthreads = uk_get_num_threads();
    int64_t chunk = NB_CHUNK;
    if (c.mode == 0 ? m <= NB_MR : m <= NBF_FUSED_M) {
        chunk = uk_decode_chunk(n, nthreads);         /* decode rows: long contiguous runs of weight bytes */
    } else if (c.mode == 1) {                         /* a chunk's f32 copy stays in the core's cache */
        chunk = UK_MAX(4, UK_MIN(NB_CHUNK, NBF_CHUNK_FLOATS / k / 4 * 4));
    }
    const int tasks = uk_split_init(&c.split, n, chunk, (double)n * (double)k * (double)m, nthreads);
    uk_parallel_begin();
    if (c.mode == 0) {
        c.ps = (NB_PREP_BYTES(c.L.groups) + 63) / 64 * 64;
        c.prep = uk_scratch(UK_SLOT_SHARED, (size_t)(m * c.ps));
        if (!c.prep) { rc = UK_E_NOMEM; goto done; }
        atomic_init(&c.next_prep, 0);
        if (m * k < 65536) nb_prep_task(&c, 0, 1);
        else uk_parallel_run(nb_prep_task, &c, (int)UK_MIN((int64_t)nthreads, m));
    }
    uk_parallel_run(nb_task, &c, tasks);
    if (atomic_load(&c.failed)) rc = UK_E_NOMEM;
done:
    uk_parallel_end();
    return rc;
}
