/* uaii_kernels.h — the C API of uaii-kernels.
 *
 * Every function returns UK_OK (0) or a negative UK_E_* status unless it says otherwise; none allocates per call in
 * steady state (scratch buffers grow once and are reused), none calls back into Python, and every one may run on
 * the persistent thread pool. Output buffers are always supplied by the caller, so a decode step allocates nothing.
 * Type arguments are GGUF ggml_type ids (F32 = 0, F16 = 1, Q4_0 = 2, ... BF16 = 30, MXFP4 = 39).
 *
 * The declarations between the CDEF markers are read verbatim by build_kernels.py as the cffi cdef: keep them
 * plain C (no macros, no preprocessor lines).
 */
#ifndef UAII_KERNELS_H
#define UAII_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CDEF BEGIN */
enum {
    UK_OK = 0,
    UK_E_TYPE = -1,      /* the type is unknown or not implemented by this function */
    UK_E_ARG = -2,       /* a size or argument is invalid (e.g. not a whole number of blocks) */
    UK_E_NOMEM = -3,     /* a scratch buffer could not be allocated */
    UK_E_ISA = -4        /* the instruction set is not available on this CPU */
};

enum {
    UK_ISA_SCALAR = 0,   /* portable C, the reference every SIMD path is tested against */
    UK_ISA_AVX2 = 1,     /* x86-64: AVX2 + FMA + F16C */
    UK_ISA_AVXVNNI = 2,  /* x86-64: AVX2 level + AVX-VNNI (256-bit VPDPBUSD) */
    UK_ISA_AVX512 = 3,   /* x86-64: AVX-512 F/BW/DQ/VL + VNNI (32 vector registers, VPDPBUSD) */
    UK_ISA_NEON = 4      /* aarch64: Advanced SIMD */
};

enum { UK_ACT_SILU = 0, UK_ACT_GELU_ERF = 1, UK_ACT_GELU_TANH = 2 };

/* --- run-time configuration ------------------------------------------------------------------------------- */
int uk_isa_available(int isa);               /* 1 when this CPU (and OS) can run `isa`, else 0 */
int uk_best_isa(void);                       /* the ISA chosen at start-up */
int uk_get_isa(void);
int uk_set_isa(int isa);                     /* force a path (tests, benchmarks); not while kernels run */
int uk_set_num_threads(int n);               /* n <= 0: UAII_NUM_THREADS or the number of usable cores */
int uk_get_num_threads(void);
int uk_pool_workers_started(void);           /* threads the pool has created so far (never per call) */

/* --- formats ------------------------------------------------------------------------------------------------ */
int uk_type_block_elems(int type);           /* elements per block, 0 for an unknown type */
int uk_type_block_bytes(int type);           /* bytes per block, 0 for an unknown type */
int uk_can_dequantize(int type);
int uk_can_quantize(int type);
int uk_dequantize(int type, const void *src, float *dst, int64_t n);
int uk_quantize(int type, const float *src, void *dst, int64_t n);
/* dst[i, :] = row ids[i] of a [n_rows, n_cols] table of `type`, dequantized (only the rows used). */
int uk_get_rows(int type, const void *table, int64_t n_rows, int64_t n_cols, const int64_t *ids, int64_t n_ids,
                float *dst);
/* memcpy split across the pool (staging copies; the STREAM-like bandwidth probe of the benchmark) */
int uk_copy(void *dst, const void *src, int64_t n);
/* The activation format of the integer path: per 32 values an int8 block, its scale d and s = d * sum(q). */
int uk_quantize_act(const float *x, int64_t k, int8_t *q, float *d, float *s);
/* The activation format of uk_gemm's mode 2 for Q8_0 weights: per 32 values an int16 block and its scale d. */
int uk_quantize_act16(const float *x, int64_t k, int16_t *q, float *d);

/* --- y = x . W^T -------------------------------------------------------------------------------------------- */
/* The path uk_gemm takes for `type` in `mode`: 2: integer (8-bit activation) fast path or native float path,
   4: integer path with 16-bit activations (mode 2 on Q8_0), 1: dequantize-rows-then-f32-dot path, 0: none or an
   unknown mode (3, integer decode rows and f32 batches, is no longer returned: batches sum exactly as decode rows
   do). uk_gemm_path(type) is uk_gemm_path_mode(type, 0). */
int uk_gemm_path(int type);
int uk_gemm_path_mode(int type, int mode);
/* W [n, k] of `type` stays packed; x [m, k] f32 with row stride ldx; y [m, n] f32 with row stride ldy.
   mode 0: the fastest path for the type; mode 1: always dequantize weight rows to f32 and use f32 dots;
   mode 2 ("precise"): 16-bit activations for the types that have such a kernel (Q8_0: ~100x less activation error
   than mode 0, batches ~2.5x slower), exactly mode 0 for the others. Any other mode: UK_E_ARG.
   In every mode row j of y has the same bits whatever m and the thread count (prefill and decode agree). */
int uk_gemm(int type, const void *w, int64_t n, int64_t k, const float *x, int64_t m, int64_t ldx,
            float *y, int64_t ldy, int mode);

/* Held forms: a weight that stays resident (pinned, not streamed) may be kept in a form of its rows that this
   machine's GEMM kernels read faster than the file's layout, of the same byte size and giving the same bits in
   every mode. uk_held_type returns the kernel type of that form for rows of k values of `type` (`type` itself when
   there is none: then nothing is gained by rewriting); uk_gemm takes it as `type`. uk_relayout rewrites n rows of
   k values from `from_type` to `to_type` (a type and its held form, either way; dst == src rewrites in place,
   other overlaps are refused); UK_E_TYPE for any other pair. A held form is no format of its own: uk_dequantize
   and uk_get_rows refuse it. */
int uk_held_type(int type, int64_t k);
int uk_relayout(int from_type, int to_type, const void *src, void *dst, int64_t n, int64_t k);

/* --- operators (rows of n contiguous values; x and y may alias) ----------------------------------------------- */
int uk_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps, int w_offset_one);
int uk_layernorm(const float *x, const float *w, const float *b, float *y, int64_t rows, int64_t n, float eps);
int uk_softmax(const float *x, float *y, int64_t rows, int64_t n, float scale);
int uk_act(int kind, const float *x, float *y, int64_t n);
/* y[r, :] = act(gate[r, :]) * up[r, :] with row strides in elements (a fused [rows, 2n] tensor works as views) */
int uk_glu(int kind, const float *gate, int64_t gate_stride, const float *up, int64_t up_stride, float *y,
           int64_t rows, int64_t n);
/* x, y [t, h, d]: rotate the first n_rot dims of every head at position pos[t] by angles pos * inv_freq[i]
   (inv_freq has n_rot/2 entries, scaling already folded in), times attn_factor. neox: pairs (i, i + n_rot/2),
   else adjacent pairs (2i, 2i + 1). Dims past n_rot are copied. */
int uk_rope(const float *x, float *y, int64_t t, int64_t h, int64_t d, int64_t n_rot, const int32_t *pos,
            const float *inv_freq, float attn_factor, int neox);
/* Causal GQA attention of queries q [t, hq, d] over cached keys/values. Key s of kv head g lives at
   k + s*k_stride_s + g*k_stride_h (elements; likewise v, dv values), with absolute position k_pos[s] (< 0: empty
   slot). Query i at position q_pos[i] sees key s when k_pos[s] <= q_pos[i] and, with window > 0,
   q_pos[i] - k_pos[s] < window or k_pos[s] < n_sink. Logits are scaled, then soft-capped (softcap > 0:
   softcap * tanh(l / softcap)); sink_logits (per query head, may be NULL) adds exp(sink) to the denominator.
   kv_type: 0 f32, 1 f16. out [t, hq, dv]; a query that sees no key gets zeros. */
int uk_attention(const float *q, const void *k, const void *v, float *out, int64_t t, int64_t s, int64_t hq,
                 int64_t hkv, int64_t d, int64_t dv, int64_t k_stride_s, int64_t k_stride_h, int64_t v_stride_s,
                 int64_t v_stride_h, const int32_t *q_pos, const int32_t *k_pos, float scale, int32_t window,
                 int32_t n_sink, float softcap, const float *sink_logits, int kv_type);
/* Batched decode: row i of q [rows, hq, d] is the one new token of sequence i. Its key k_new[i] [hkv, d] and value
   v_new[i] [hkv, dv] (float32) are written to slot used[i] of that sequence's cache (k_cache[i]: C-contiguous
   [capacity, hkv, d], f16 when kv_type[i] is 1, rounded as numpy's float16 cast; likewise v_cache[i]), then the row
   attends over slots 0..used[i] exactly as uk_attention(t = 1, s = used[i] + 1, q_pos[i], k_pos[i]) would, so its
   bits are that call's whatever the other rows. One call instead of one per row: a decode step of several
   sequences pays the call, the stores and the thread wake-up once per layer. out [rows, hq, dv]. */
int uk_attention_rows(const float *q, const float *k_new, const float *v_new, float *out, int64_t rows,
                      void *const *k_cache, void *const *v_cache, const int32_t *kv_type, const int64_t *used,
                      const int32_t *const *q_pos, const int32_t *const *k_pos, int64_t hq, int64_t hkv, int64_t d,
                      int64_t dv, float scale, int32_t window, int32_t n_sink, float softcap,
                      const float *sink_logits);

/* --- ONNX MatMulNBits (com.microsoft): y = x . dequant(B)^T + bias, B in ONNX's block-quantized layout ----------- */
/* Element types of the scales and zero points (UK_NB_NONE: no zero points, the default 2^(bits-1); UK_NB_U8: uint8
   packed like B). */
enum { UK_NB_NONE = 0, UK_NB_U8 = 1, UK_NB_F32 = 2, UK_NB_F16 = 3, UK_NB_BF16 = 4 };
/* B uint8 [n, kb, block_size * bits / 8] with kb = ceil(k / block_size) (bits 4: value 2i in the low nibble of
   byte i); scales [n * kb] of scale_type (F32, F16, BF16); zero_points NULL (zp_type NONE), uint8 [n *
   ceil(kb * bits / 8)] (U8; 4 bits: two per byte, low nibble first, each row padded to a whole byte) or [n * kb]
   floats (F32, F16, BF16); w = (q - zp) * scale. bits 4 or 8 (else UK_E_TYPE), block_size a power of two in
   16..256. x [m, k] f32 (row stride ldx), y [m, n] f32 (row stride ldy), bias [n] or NULL. mode 0: activations
   quantized to int8 per 32 values and integer dots (the fast path; bit-identical on every ISA, batch size and
   thread count); mode 1: rows dequantized to f32, f32 dots; mode 2: mode 0 (no 16-bit activation kernel). */
int uk_nbits_gemm(int bits, int block_size, const uint8_t *b, int64_t n, int64_t k, const void *scales,
                  int scale_type, const void *zero_points, int zp_type, const float *bias, const float *x, int64_t m,
                  int64_t ldx, float *y, int64_t ldy, int mode);
/* dst [n, k] = the weight dequantized to f32, bit-identical to (float)(q - zp) * scale (integer zero points) or
   ((float)q - zp) * scale (float ones) in float32 arithmetic. */
int uk_nbits_dequantize(int bits, int block_size, const uint8_t *b, int64_t n, int64_t k, const void *scales,
                        int scale_type, const void *zero_points, int zp_type, float *dst);

/* --- MLX's quantized layout (mlx.core.quantize, mlx 0.32): y = x . dequant(W)^T + bias ---------------------------- */
/* Modes (mode, bits, group sizes): AFFINE (1, 2, 3, 4, 5, 6, 8; 32, 64, 128): w = T(T(scale * q) + bias) with T the
   scales' type (scale_type UK_NB_F32, UK_NB_F16 or UK_NB_BF16 words; biases of the same type and shape); MXFP4 (4, E2M1
   values; 32) and MXFP8 (8, E4M3 values; 32): w = value * 2^(scale - 127), NVFP4 (4, E2M1; 16): w = value * E4M3
   scale; the fp modes take uint8 scale codes (scale_type UK_NB_U8) and no biases (NULL). W is uint32 [n, k * bits /
   32], each row one LSB-first bit stream of k values (any alignment: read as bytes); scales (and biases)
   [n, k / group_size]. An unknown mode, bits not of the mode or a wrong scale type: UK_E_TYPE; a group size not of
   the mode, k not a whole number of groups, a missing or superfluous bias array, bad sizes or strides: UK_E_ARG. */
enum { UK_MLX_AFFINE = 0, UK_MLX_MXFP4 = 1, UK_MLX_MXFP8 = 2, UK_MLX_NVFP4 = 3 };
/* dst [rows, k] = rows row0 .. row0 + rows - 1 of W dequantized to f32, bit-exact with mlx.core.dequantize (and
   with uaii.ir.reference.quantized.dequantize). */
int uk_mlx_dequantize(int mode, int bits, int group_size, const uint32_t *w, int64_t n, int64_t k,
                      const void *scales, const void *biases, int scale_type, int64_t row0, int64_t rows, float *dst);
/* y [m, n] (row stride ldy) = x [m, k] (row stride ldx) . W^T (+ bias[n] when not NULL), f32 activations. The weight
   stays packed: decode rows dequantize it in registers, batches by chunks of rows into scratch, and every output is
   summed in one order (mlxq.c), so every ISA, batch size and thread count gives the same bits. */
int uk_mlx_gemm(int mode, int bits, int group_size, const uint32_t *w, int64_t n, int64_t k, const void *scales,
                const void *biases, int scale_type, const float *bias, const float *x, int64_t m, int64_t ldx,
                float *y, int64_t ldy);
/* CDEF END */

#ifdef __cplusplus
}
#endif
#endif /* UAII_KERNELS_H */
