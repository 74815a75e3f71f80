/* uk_internal.h — what the C sources of uaii-kernels share: block layouts, fp16 helpers, type traits, the
 * per-ISA kernel table and the thread pool. Not part of the public API. */
#ifndef UK_INTERNAL_H
#define UK_INTERNAL_H

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "uaii_kernels.h"

#define QK 32      /* elements per legacy block (Q4_0 ... Q8_0, IQ4_NL, MXFP4) and per activation block */
#define QK_K 256   /* elements per k-quant super-block */
#define UK_NTYPES 41

#define UK_MIN(a, b) ((a) < (b) ? (a) : (b))
#define UK_MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__) || defined(__clang__)
#define UK_INLINE static inline __attribute__((always_inline))
#define UK_RESTRICT __restrict__
#else
#define UK_INLINE static inline
#define UK_RESTRICT
#endif

#if defined(__x86_64__) || defined(_M_X64)
#define UK_X86 1
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define UK_NEON 1
#endif

/* GGUF type ids (ggml_type) */
enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q8_1 = 9,
    T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_Q8_K = 15, T_IQ4_NL = 20,
    T_IQ4_XS = 23, T_BF16 = 30, T_MXFP4 = 39
};
/* held forms (uk_held_type): kernel types past the GGUF ids, each the rows of one GGUF type rearranged */
enum { T_Q4_1_X16 = 40 };
#define UK_X16_GROUP 320   /* bytes of 16 Q4_1 blocks, in either form */

/* --- block layouts (ggml-common.h); packed, sizes pinned ---------------------------------------------------- */
typedef uint16_t uk_half;
#pragma pack(push, 1)
typedef struct { uk_half d; uint8_t qs[QK / 2]; } block_q4_0;
typedef struct { uk_half d; uk_half m; uint8_t qs[QK / 2]; } block_q4_1;
typedef struct { uk_half d; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_0;
typedef struct { uk_half d; uk_half m; uint8_t qh[4]; uint8_t qs[QK / 2]; } block_q5_1;
typedef struct { uk_half d; int8_t qs[QK]; } block_q8_0;
typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uk_half d; uk_half dmin; } block_q2_K;
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uk_half d; } block_q3_K;
typedef struct { uk_half d; uk_half dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; } block_q4_K;
typedef struct { uk_half d; uk_half dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uk_half d; } block_q6_K;
typedef struct { uk_half d; uint8_t qs[QK / 2]; } block_iq4_nl;
typedef struct { uk_half d; uint16_t scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; } block_iq4_xs;
typedef struct { uint8_t e; uint8_t qs[QK / 2]; } block_mxfp4;
#pragma pack(pop)

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl size");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs size");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 size");

extern const int8_t uk_kvalues_iq4nl[16];
extern const int8_t uk_kvalues_mxfp4[16];

/* --- scalar conversions, bit-exact with numpy's float16 casts ----------------------------------------------- */
UK_INLINE uint32_t uk_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
UK_INLINE float uk_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

UK_INLINE float uk_fp16_to_fp32(uint16_t h) {
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t exp = h & 0x7c00u, sig = h & 0x03ffu;
    if (exp == 0x7c00u) return uk_u2f(sign | 0x7f800000u | (sig << 13));      /* inf, nan (payload kept) */
    if (exp != 0) return uk_u2f(sign | (((uint32_t)(h & 0x7fffu) + 0x1c000u) << 13));
    if (sig == 0) return uk_u2f(sign);
    uint32_t e = 0;                                                           /* subnormal: normalise */
    sig <<= 1;
    while ((sig & 0x0400u) == 0) { sig <<= 1; e++; }
    return uk_u2f(sign | ((127u - 15u - e) << 23) | ((sig & 0x03ffu) << 13));
}

UK_INLINE uint16_t uk_fp32_to_fp16(float f) {                                 /* round to nearest even */
    uint32_t x = uk_f2u(f), sig;
    uint16_t sign = (uint16_t)((x & 0x80000000u) >> 16);
    uint32_t exp = x & 0x7f800000u;
    if (exp >= 0x47800000u) {                                                 /* overflow, inf, nan */
        if (exp == 0x7f800000u && (x & 0x007fffffu)) {
            uint16_t r = (uint16_t)(0x7c00u + ((x & 0x007fffffu) >> 13));
            return (uint16_t)(sign + (r == 0x7c00u ? r + 1 : r));
        }
        return (uint16_t)(sign + 0x7c00u);
    }
    if (exp <= 0x38000000u) {                                                 /* subnormal half or zero */
        if (exp < 0x33000000u) return sign;
        exp >>= 23;
        sig = 0x00800000u + (x & 0x007fffffu);
        sig >>= (113u - exp);
        if (((sig & 0x00003fffu) != 0x00001000u) || (x & 0x000007ffu)) sig += 0x00001000u;
        return (uint16_t)(sign + (sig >> 13));
    }
    uint16_t hexp = (uint16_t)((exp - 0x38000000u) >> 13);
    sig = x & 0x007fffffu;
    if ((sig & 0x00003fffu) != 0x00001000u) sig += 0x00001000u;
    return (uint16_t)(sign + hexp + (uint16_t)(sig >> 13));                   /* carry may spill into the exponent */
}

UK_INLINE float uk_bf16_to_fp32(uint16_t h) { return uk_u2f((uint32_t)h << 16); }

/* E8M0 exponent to 0.5 * 2^(e - 127) (ggml_e8m0_to_fp32_half; the MXFP4 values are stored doubled) */
UK_INLINE float uk_e8m0_half(uint8_t e) {
    return uk_u2f(e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23));
}

UK_INLINE float uk_h(const uk_half *p) { uk_half h; memcpy(&h, p, 2); return uk_fp16_to_fp32(h); }

/* --- type traits -------------------------------------------------------------------------------------------- */
/* Repacked weights: every 32 values become 32 one-byte integers q (unsigned 0..31 or signed), two scales (values
   0..15 and 16..31) and one additive term: w = sc[half] * q + mn. The integer tile kernel runs on this form. */
typedef void (*uk_rows_fn)(const void *src, float *dst, int64_t nblocks);
typedef void (*uk_quant_fn)(const float *src, void *dst, int64_t nblocks);
typedef void (*uk_repack_fn)(const void *src, int64_t nblocks, uint8_t *q, float *sc, float *mn);

typedef struct {
    const char *name;
    int elems, bytes;
    uk_rows_fn dequant;        /* scalar reference, bit-exact with gguf-py */
    uk_quant_fn quant;         /* scalar, NULL when not implemented */
    uk_repack_fn repack;       /* NULL: the f32 fallback path */
    int repack_signed;         /* q is int8 (else uint8 with 0 <= q <= 63 and a min term) */
} uk_traits_t;

const uk_traits_t *uk_traits(int type);      /* NULL for an unknown or unsupported type */
void uk_q8a_ref(const float *x, int64_t k, int8_t *q, float *d, float *s);
void uk_q16a_ref(const float *x, int64_t k, int16_t *q, float *d);
void uk_aprep8(int64_t k, const int8_t *aq, const float *ad, const float *as, uint8_t *out);   /* repack.c */
int uk_held_base(int type);                                         /* held.c: the GGUF type of a held form */
void uk_deq_q4_1x16_row(const void *src, float *dst, int64_t nb);  /* held.c: one whole row */

/* --- kernel table, filled per ISA --------------------------------------------------------------------------- */
/* direct integer GEMV: one weight row . quantized activation row */
typedef float (*uk_dotq_fn)(int64_t k, const void *w, const int8_t *aq, const float *ad, const float *as);
/* y[j * ldy] = dotq(w, activation row j) for j < mr (<= 4), the rows in the 8-block form (uk_aprep8, a8_stride
   bytes apart): the float operations of each pair are dotq's in its order (the same bits), each weight group
   unpacked once for all rows */
typedef void (*uk_dotqm_fn)(int64_t nb, const void *w, int mr, const uint8_t *a8, int64_t a8_stride, float *y,
                            int64_t ldy);
/* wide GEMV (x86_gemv512.inc): the quantized activation row rearranged once per call by gprep into at most
   UK_GPREP_BYTES(k) bytes (64-byte aligned), then gemmw over the weight rows */
typedef void (*uk_gprep_fn)(int64_t k, const int8_t *aq, const float *ad, const float *as, uint8_t *out);
#define UK_GPREP_BYTES(k) ((size_t)(k) * 2 + 512)
#define UK_WB_BLOCK 64       /* row-lane form (rlpack): bytes per weight block */
#define UK_WB_ABLOCK 576     /* a tile of 16 activation rows (rlprep): bytes per block */
#define UK_WB_TILE 16        /* activation rows per tile (rlprep, tilerl): the 16 lanes of a vector */
#define UK_WB_MIN_M 16       /* the fewest activation rows that take tilerl */
typedef void (*uk_qact_fn)(const float *x, int64_t k, int8_t *q, float *d, float *s);
/* The 16-bit activation form (act16 types, uk_gemm mode 2): per 32 values q = round-half-even(x * 32767 / amax)
   as int16 and d = amax / 32767. tile16 computes y[j*ldy + i] = w_i . a_j for nr weight rows in their GGUF bytes
   (row_bytes apart) and mr such activation rows (aq: k values apart, ad: k/32 scales apart). Decode rows and
   batches use it alike, and every ISA sums each pair with the float operations of the scalar reference
   (tile16_q8_0_ref) in its order, so every path gives the same bits: per block the exact int32 dot isum (32
   products of |w| <= 128 and |a| <= 32767: at most 2^27 in magnitude), per group of 8 blocks lane l:
   acc[l] = fma(isum, dw * da, acc[l]), the blocks past the last group: tail = fma(isum, dw * da, tail), then
   y = (((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))) + tail. */
typedef void (*uk_qact16_fn)(const float *x, int64_t k, int16_t *q, float *d);
typedef void (*uk_tile16_fn)(int64_t k, int nr, int mr, const uint8_t *w, int64_t row_bytes, const int16_t *aq,
                             const float *ad, float *y, int64_t ldy);
/* y[j*ldy + i] = w_i . a_j for nr repacked weight rows (q: k bytes per row, sc: 2k/32 floats, mn: k/32 floats)
   and mr quantized activation rows (q: k bytes, d and s: k/32 floats per row); sign: q is int8 and mn unused */
typedef void (*uk_tileq_fn)(int64_t k, int nr, int mr, int sign, const uint8_t *wq, const float *wsc,
                            const float *wmn, const int8_t *aq, const float *ad, const float *as, float *y,
                            int64_t ldy);
/* y[j*ldy + i] = w_i . x_j, f32 rows */
typedef void (*uk_tilef_fn)(int64_t k, int nr, int mr, const float *w, int64_t ldw, const float *x, int64_t ldx,
                            float *y, int64_t ldy);

/* The 8-block form of the x86 batch kernels (x86_pack8.inc, x86_gemm.inc). Why it exists: a model quantizes every
   layer's activations, so a last-bit difference between the batch (prefill) and the decode kernels grows layer by
   layer into visibly different logits; the batch kernels must therefore sum in exactly the decode kernels' order
   (x86_gemv.inc: the integer dots of 8 blocks as one vector of 8 lanes, one multiply-add per 8 blocks, the blocks
   past the last group of 8 as one zero-padded group). Integer sums are exact in any order, so the weight bytes are
   only rearranged for the batch kernel: per weight row and group of 8 blocks of 32 values (the last group
   zero-padded; with 1-4 blocks only 4 slices, each holding words t and t + 4), 8 slices of 32 bytes (slice s,
   4-byte lane l: values 4s..4s+3 of block l, so 8 VPDPBUSD leave block l's dot in lane l), then
   per block: sw (its scale), mw (its min term: added as mw * s_a, or for Q2_K as mw * d_a * integer mins), two int32
   sub-scales (values 0..15, 16..31) and two int32 mins (Q2_K). Signed values are stored + 128 on VNNI ISAs (the
   offset is taken out through the start value of the dot: -128 * the activation sum). The activation rows get the
   same slices, then d_a, s_a and the two int32 sums of values 0..15 and 16..31 of each block. */
#define UK_G8_BYTES 448        /* 256 + 8 * (sw, mw, sub0, sub1, min0, min1) */
#define UK_A8_BYTES 384        /* 256 + 8 * (d, s, sum0, sum1) */
#define UK_G8_SIGNED 1         /* values are signed */
#define UK_G8_SUB 2            /* integer sub-scales per 16 values */
#define UK_G8_FMIN 4           /* min term mw * s_a (Q4_1, Q5_1, the -8/-16 offsets of Q4_0/Q5_0, Q4_K, Q5_K) */
#define UK_G8_IMIN 8           /* min term mw * d_a * (min0 * sum0 + min1 * sum1) (Q2_K) */
/* one weight row of nb 32-blocks in the 8-block form (out: ceil(nb / 8) groups, zeroed by the caller) */
typedef void (*uk_pack8_fn)(const void *src, int64_t nb, uint8_t *out);
/* y[j*ldy + i] = w_i . a_j for nr packed weight rows (row stride ws bytes) and mr prepared activation rows (as) */
typedef void (*uk_tile8_fn)(int64_t nb, int flags, int nr, int mr, const uint8_t *w, int64_t ws, const uint8_t *a,
                            int64_t as, float *y, int64_t ldy);
/* y[j*ldy + i] = w_i . x_j for F16 / BF16 rows (ldw elements apart): the bits of widening to f32, then tilef */
typedef void (*uk_tileh_fn)(int type, int64_t k, int nr, int mr, const uint16_t *w, int64_t ldw, const float *x,
                            int64_t ldx, float *y, int64_t ldy);

typedef struct {
    uk_rows_fn dequant[UK_NTYPES];
    uk_dotq_fn dotq[UK_NTYPES];      /* NULL: repack the row and use tileq */
    uk_dotqm_fn dotqm[UK_NTYPES];    /* small batches (batched decode steps) in dotq's order; NULL: none */
    uk_gprep_fn gprep[UK_NTYPES];    /* with gemmw: preferred over dotq and pack8; NULL: none */
    uk_qact_fn quant_act;
    uk_qact16_fn quant_act16;
    /* the act16 types, which uk_gemm mode 2 ("precise") runs with 16-bit activations (uk_q16a_ref) for decode
       rows and batches: Q8_0, whose 8-bit weights leave the 8-bit activations as the larger error of the
       product; modes 0 and 1 never use them. Filled alike on every ISA; NULL: not an act16 type */
    uk_tile16_fn tile16[UK_NTYPES];
    uk_tileq_fn tileq;
    uk_tilef_fn tilef;
    uk_tileh_fn tileh;               /* NULL: widen a chunk, then tilef */
    /* batches in the decode kernels' summation order (see the 8-block form); NULL where decode and batches share
       one kernel anyway (scalar, NEON: the tile) */
    uk_pack8_fn pack8[UK_NTYPES];
    int flags8[UK_NTYPES];
    uk_tile8_fn tile8;
    /* wide GEMV types: nr weight rows against mr prepared activation rows (prep_stride bytes apart), each pair
       summed with the same operations whatever mr (a decode row is mr = 1); set with gprep, NULL: none */
    void (*gemmw[UK_NTYPES])(int64_t k, const uint8_t *w, int64_t row_bytes, int64_t nr, int64_t mr,
                             const uint8_t *prep, int64_t prep_stride, float *y, int64_t ldy);
    /* the longest rows gemmw takes (0: any); longer ones take dotq, and pack8 + tile8 for batches */
    int64_t gemmw_max_k[UK_NTYPES];
    /* batches (at least UK_WB_MIN_M rows) of the wide types whose per-pair operations tilerl repeats with the
       activation rows in lanes (x86_wbatch.inc): rlpack lays one weight row out (UK_WB_BLOCK bytes per block),
       rlprep one activation row into its lane of a tile of 16 rows (UK_WB_ABLOCK bytes per block), tilerl runs nr
       (<= 16) packed rows against mr rows in tiles ts bytes apart; NULL: gemmw takes the batches too */
    void (*rlpack[UK_NTYPES])(const void *w, int64_t nb, uint8_t *out);
    void (*rlprep)(int64_t nb, const int8_t *aq, const float *ad, int lane, uint8_t *tile);
    void (*tilerl)(int64_t nb, int nr, int64_t mr, const uint8_t *w, int64_t ws, const uint8_t *a, int64_t ts,
                  float *y, int64_t ldy);
    /* operators (ops_impl.inc) */
    float (*dot_f32)(int64_t n, const float *a, const float *b);
    float (*dot_f16)(int64_t n, const float *a, const uint16_t *b);
    void (*axpy_f32)(int64_t n, float a, const float *x, float *y);    /* y += a x */
    void (*axpy_f16)(int64_t n, float a, const uint16_t *x, float *y);
    void (*exp_shift)(float *x, int64_t n, float shift);               /* x = exp(x - shift) */
    float (*scale_max)(float *x, int64_t n, float scale);              /* x *= scale; the largest x (NaN skipped) */
    void (*to_f16)(const float *x, int64_t n, uint16_t *y);            /* y = x as uk_fp32_to_fp16 rounds it */
    /* attention rows for the g query heads of one kv head (queries q + j d, rows `stride` elements apart), each
       cache row read once for all g: out[j n + i] = q_j . row idx[i]; o_j (o + j dv) += p[j n + i] * row idx[i],
       in key order. tmp: 4 max(d, dv) floats of scratch (f16 rows widened once); each head's bits: a lone head's. */
    void (*dotn_f32)(int64_t d, int64_t g, const float *q, const float *base, int64_t stride, const int32_t *idx,
                     int64_t n, float *out, float *tmp);
    void (*dotn_f16)(int64_t d, int64_t g, const float *q, const uint16_t *base, int64_t stride, const int32_t *idx,
                     int64_t n, float *out, float *tmp);
    void (*wsum_f32)(int64_t dv, int64_t g, const float *p, const float *base, int64_t stride, const int32_t *idx,
                     int64_t n, float *o, float *tmp);
    void (*wsum_f16)(int64_t dv, int64_t g, const float *p, const uint16_t *base, int64_t stride,
                     const int32_t *idx, int64_t n, float *o, float *tmp);
    void (*act)(int kind, const float *x, float *y, int64_t n);
    void (*glu_row)(int kind, const float *g, const float *u, float *y, int64_t n);
    void (*rms_row)(const float *x, const float *w, float *y, int64_t n, float eps, int one);
    void (*ln_row)(const float *x, const float *w, const float *b, float *y, int64_t n, float eps);
    void (*softmax_row)(const float *x, float *y, int64_t n, float scale);
    void (*rope_row)(const float *x, float *y, int64_t d, int64_t n_rot, const float *c, const float *s, int neox);
} uk_kernel_table;

extern uk_kernel_table uk_kt;
void uk_init(void);                   /* idempotent; every public entry point calls it */
void uk_fill_scalar(uk_kernel_table *t);
#ifdef UK_X86
void uk_fill_avx2(uk_kernel_table *t);
void uk_fill_avxvnni(uk_kernel_table *t);
void uk_fill_avx512(uk_kernel_table *t);
int uk_cpu_has_vbmi(void);     /* AVX-512 VBMI + BITALG (byte permutes, bit shuffles): the wide GEMV kernels */
#endif
#ifdef UK_NEON
void uk_fill_neon(uk_kernel_table *t);
#endif

/* --- thread pool (threadpool.c) ----------------------------------------------------------------------------- */
typedef void (*uk_task_fn)(void *ctx, int ith, int nth);
/* Runs fn(ctx, i, nth) on the caller (i = 0) and on the workers that join in time (i < nth = min(max_tasks, pool
   size)). A task must take its work in chunks from an atomic counter in ctx and return when none is left: no task
   may count on the others running at all (on a loaded machine the caller may do all the work). i is unique among
   the tasks of a call (use it for uk_scratch slots). uk_parallel_begin/end take the pool lock around a call. */
void uk_parallel_begin(void);
void uk_parallel_end(void);
void uk_parallel_run(uk_task_fn fn, void *ctx, int max_tasks);
void *uk_scratch(int slot, size_t bytes);   /* grow-only per-slot buffer (slot: 0..UK_MAX_THREADS+1), 64-aligned */
/* Waits inside a task until *count >= target: for work other tasks have already taken (never for work nobody
   took: a task may not count on the others running); spins, then yields the core. */
void uk_wait_count(_Atomic int64_t *count, int64_t target);
#define UK_MAX_THREADS 256
#define UK_SLOT_SHARED (UK_MAX_THREADS)
#define UK_SLOT_SHARED2 (UK_MAX_THREADS + 1)

/* Work split of a call that streams weight rows (gemm.c, nbits.c): n_chunks chunks of `chunk` rows in contiguous
   shares, one per task. A task takes its own share first (one weight stream per core, long runs of cold bytes), then
   helps with the others', so a descheduled thread on a shared machine holds nobody up. */
#define UK_MAX_SHARES 16
typedef struct {
    _Alignas(64) _Atomic int64_t next;    /* own cache line: the counters are hit by different cores */
    int64_t end;
} uk_share_t;

typedef struct {
    int64_t chunk, n_chunks;
    int n_shares;
    uk_share_t shares[UK_MAX_SHARES];
} uk_split_t;

/* Chunk size for decode rows and small batches: enough chunks to balance nthreads, at least 8 rows each. */
static inline int64_t uk_decode_chunk(int64_t n, int nthreads) {
    const int64_t per = n / ((int64_t)nthreads * 8);
    return UK_MAX(8, (per + 3) / 4 * 4);
}

/* Splits n rows into chunks of `chunk`; returns how many tasks to run: 1 for work (multiply-adds) under 32768. */
static inline int uk_split_init(uk_split_t *s, int64_t n, int64_t chunk, double work, int nthreads) {
    s->chunk = chunk;
    s->n_chunks = (n + chunk - 1) / chunk;
    const int tasks = work < 32768.0 ? 1 : (int)UK_MIN((int64_t)nthreads, s->n_chunks);
    s->n_shares = UK_MIN(tasks, UK_MAX_SHARES);
    for (int h = 0; h < s->n_shares; h++) {
        atomic_init(&s->shares[h].next, s->n_chunks * h / s->n_shares);
        s->shares[h].end = s->n_chunks * (h + 1) / s->n_shares;
    }
    return tasks;
}

/* Task ith's next chunk index, or -1 when none is left; *h is the task's cursor over the shares (start it at 0). */
static inline int64_t uk_split_take(uk_split_t *s, int ith, int *h) {
    for (; *h < s->n_shares; (*h)++) {
        uk_share_t *sh = &s->shares[(ith + *h) % s->n_shares];
        const int64_t ch = atomic_fetch_add(&sh->next, 1);
        if (ch < sh->end) return ch;
    }
    return -1;
}

#endif /* UK_INTERNAL_H */
