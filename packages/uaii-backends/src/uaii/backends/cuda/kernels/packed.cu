/* packed.cu — products and row lookups with weights in the packed layouts of other tools, decoded in registers as
 * the GGUF GEMVs decode theirs (gemv.cu): the weight bits are read as stored, never uploaded dequantized.
 *
 * Two layouts, one decoder. ONNX's MatMulNBits (B uint8 [N, k_blocks, blob]: value 2i of a byte pair in the low
 * nibble) and MLX's quantized rows (uint32 words, value j at bits j * bits .. of the little-endian words) are both
 * a row of `bits`-wide values as one LSB-first bit stream, with per-group parameters beside it: a scale, and an
 * offset (MLX's affine bias, ONNX's zero point) or a code table (MLX's fp4 / fp8 elements). The group of a value
 * never changes inside 16 values (groups are 16 to 256 values, powers of two), so pk_unit decodes a 32-value unit
 * as two halves, each with its group's parameters read once.
 *
 * Device forms (the activation arena holds every value as a 4-byte word): the packed bits are the stored bytes
 * (`stride` 1), or a fed uint8 tensor's words, one stored byte in the low byte of each (`stride` 4; a fed uint32
 * tensor's words are its stored bytes); scales and offsets are 4-byte words — float values (f16 / bf16 held as
 * float32), or uint8 codes (fp scales, packed zero points) one per word.
 *
 * Exactness: a weight value is what the CPU reference computes (uaii.ir.reference.quantized / nbits): MLX affine
 * T(T(scale * q) + bias) with T the scales' type, rounded here, fp codes times their scale; the decoder's
 * arithmetic uses the _rn intrinsics, which the compiler never contracts into a fused multiply-add.
 *
 * Kernels: pk_gemv (y[m, n] = x[m, :] . W[n, :], a warp per weight row, PK_M activation rows per block),
 * pk_gemv_idx (the product of each (token, slot) pair with the expert its router chose) and pk_rows (the rows a
 * token's ids select, dequantized: an embedding). */
#include "decode.cuh"

/* what a row's values are (uaii.backends.cuda.sources.PACKED_MODES) */
#define PK_AFFINE_F32 0  /* scale * q + bias, f32 scales and biases */
#define PK_AFFINE_F16 1  /* the same rounded to f16 after the product and after the sum */
#define PK_AFFINE_BF16 2 /* the same rounded to bf16 */
#define PK_MXFP4 3       /* E2M1 codes times an E8M0 scale code */
#define PK_NVFP4 4       /* E2M1 codes times an E4M3 scale code */
#define PK_MXFP8 5       /* E4M3 codes times an E8M0 scale code */
#define PK_NBITS 6       /* (q - zp) * scale, zp packed codes (one word per stored byte), 2^(bits-1) without */
#define PK_NBITS_FZP 7   /* (q - zp) * scale, zp a float per group */

#define PK_M 8 /* activation rows per block of pk_gemv (geometry.PACKED_ROWS) */

/* a packed weight as a kernel reads it: its rows, the values per row, their width, the group size and the mode;
   scales and offsets (NULL when the mode has none) hold a row of words per weight row */
typedef struct {
    const uk_u8 *w;
    int stride, k, bits, group, mode;
    const uk_u32 *scales, *offs;
} pk_layout;

UK_DEV int pk_groups(const pk_layout *L) { return (L->k + L->group - 1) / L->group; }

/* stored bytes of a packed row: whole groups (ONNX pads the last block; MLX's rows are whole groups) */
UK_DEV long long pk_row_bytes(const pk_layout *L) {
    return (long long)pk_groups(L) * L->group * L->bits / 8;
}

/* words of offsets per row: packed zero points take ceil(groups * bits / 8) bytes, the others one per group */
UK_DEV long long pk_offs_ld(const pk_layout *L) {
    return L->mode == PK_NBITS ? ((long long)pk_groups(L) * L->bits + 7) / 8 : pk_groups(L);
}

/* value j (bits <= 8 wide) of the LSB-first bit stream of `len` stored bytes at p, one every `stride` bytes */
UK_DEV uk_u32 pk_bits(const uk_u8 *p, int stride, long long len, long long j, int bits) {
    const long long bit = j * bits, at = bit >> 3;
    uk_u32 v = p[at * stride];
    if (at + 1 < len) v |= (uk_u32)p[(at + 1) * stride] << 8;
    return (v >> (bit & 7)) & ((1u << bits) - 1u);
}

/* E2M1: sign bit 3, two exponent bits (bias 1), one mantissa bit */
UK_DEV float pk_e2m1(uk_u32 c) {
    const uk_u32 e = (c >> 1) & 3u, m = c & 1u;
    const float mag = e == 0u ? 0.5f * (float)m : (float)((2u + m) << e) * 0.25f;
    return c & 8u ? -mag : mag;
}

/* E4M3 (OCP "fn"): no infinities, S.1111.111 is NaN */
UK_DEV float pk_e4m3(uk_u32 c) {
    const uk_u32 e = (c >> 3) & 15u, m = c & 7u;
    float mag;
    if (e == 0u) mag = (float)m * 0.001953125f; /* m / 8 * 2^-6: exact */
    else if (e == 15u && m == 7u) mag = UK_AS_FLOAT(0x7fc00000u);
    else mag = UK_AS_FLOAT(((e + 120u) << 23) | (m << 20));
    return c & 0x80u ? -mag : mag;
}

/* E8M0: 2^(c - 127) in float32 as mlx computes it (c = 0: the subnormal 2^-127; 255: infinity) */
UK_DEV float pk_e8m0(uk_u32 c) { return c == 0u ? UK_AS_FLOAT(0x00400000u) : UK_AS_FLOAT(c << 23); }

/* the scale s and offset o of group g of scale row `srow` */
UK_DEV void pk_group(const pk_layout *L, long long srow, int g, float *s, float *o) {
    const long long at = srow * pk_groups(L) + g;
    const uk_u32 sw = L->scales[at];
    *o = 0.0f;
    switch (L->mode) {
    case PK_MXFP4: case PK_MXFP8: *s = pk_e8m0(sw & 255u); break;
    case PK_NVFP4: *s = pk_e4m3(sw & 255u); break;
    case PK_NBITS: {
        const long long ld = pk_offs_ld(L);
        *s = UK_AS_FLOAT(sw);
        *o = L->offs ? (float)pk_bits((const uk_u8 *)(L->offs + srow * ld), 4, ld, g, L->bits)
                     : (float)(1 << (L->bits - 1));
        break;
    }
    default: /* the affine modes and PK_NBITS_FZP: a float offset per group */
        *s = UK_AS_FLOAT(sw);
        *o = UK_AS_FLOAT(L->offs[at]);
        break;
    }
}

/* the value of code q in a group of scale s and offset o */
UK_DEV float pk_value(int mode, uk_u32 q, float s, float o) {
    switch (mode) {
    case PK_AFFINE_F32: return __fadd_rn(__fmul_rn(s, (float)q), o);
    case PK_AFFINE_F16: return uk_round_to(__fadd_rn(uk_round_to(__fmul_rn(s, (float)q), 1), o), 1);
    case PK_AFFINE_BF16: return uk_round_to(__fadd_rn(uk_round_to(__fmul_rn(s, (float)q), 2), o), 2);
    case PK_MXFP4: case PK_NVFP4: return __fmul_rn(pk_e2m1(q), s);
    case PK_MXFP8: return __fmul_rn(pk_e4m3(q), s);
    default: return __fmul_rn(__fsub_rn((float)q, o), s); /* the MatMulNBits modes */
    }
}

/* values 32 u .. 32 u + 31 of the packed row at `row` (scale row `srow`) into q; 0 past the row's k values */
UK_DEV void pk_unit(const pk_layout *L, const uk_u8 *row, long long srow, long long u, float *q) {
    const long long len = pk_row_bytes(L);
    for (int h = 0; h < 2; h++) {
        const long long j0 = 32 * u + 16 * h;
        float s = 0.0f, o = 0.0f;
        if (j0 < L->k) pk_group(L, srow, (int)(j0 / L->group), &s, &o);
        for (int i = 0; i < 16; i++) {
            const long long j = j0 + i;
            q[16 * h + i] = j < L->k ? pk_value(L->mode, pk_bits(row, L->stride, len, j, L->bits), s, o) : 0.0f;
        }
    }
}

/* y[i * ldy + row] = x[i * ldx, :] . W[row] for the m <= PK_M rows i of x, the weight row this warp owns (blockDim
   (32, rows per block)); scale rows from srow0. Lane l takes units l, l + 32, ...; the activation rows come through
   decode.cuh's shared tile (uk_tile_rows); the sums meet in a shuffle tree. Every thread reaches every barrier. */
UK_DEV void pk_gemv_warp(const pk_layout *L, long long srow0, int n, const float *x, long long ldx, int m, float *y,
                         long long ldy) {
    __shared__ float pk_xs[PK_M][UK_TILE_FLOATS];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    const bool live = row < n;
    const uk_u8 *wr = L->w + (long long)(live ? row : 0) * pk_row_bytes(L) * L->stride;
    const long long units = (L->k + 31) / 32;
    float acc[PK_M];
#pragma unroll
    for (int i = 0; i < PK_M; i++) acc[i] = 0.0f;
    float q[32];
    for (long long u0 = 0; u0 < units; u0 += UK_TILE_UNITS) {
        const int step = units - u0 < UK_TILE_UNITS ? (int)(units - u0) : UK_TILE_UNITS;
        const long long left = L->k - 32 * u0;
        uk_tile_rows(&pk_xs[0][0], x, ldx, m, u0, left < 32 * step ? (int)left : 32 * step, tid, nt);
        __syncthreads();
        if (live && threadIdx.x < step) {
            const long long u = u0 + threadIdx.x;
            pk_unit(L, wr, srow0 + row, u, q);
            const int count = L->k - 32 * u < 32 ? (int)(L->k - 32 * u) : 32;
#pragma unroll
            for (int i = 0; i < PK_M; i++) {
                if (i >= m) break;
                const float *xi = pk_xs[i] + threadIdx.x * UK_TILE_PAD;
                float s = 0.0f;
                for (int j = 0; j < count; j++) s += q[j] * xi[j];
                acc[i] += s;
            }
        }
        __syncthreads();
    }
    if (!live) return;
#pragma unroll
    for (int i = 0; i < PK_M; i++) {
        if (i >= m) break;
        float v = acc[i];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (threadIdx.x == 0) y[i * ldy + row] = v;
    }
}

/* y[i, row] = x[i] . W[row] for rows < n (grid x) and activation rows i < m, PK_M of them per block (grid y) */
extern "C" __global__ void pk_gemv(const uk_u8 *w, int n, int stride, int k, int bits, int group, int mode,
                                   const uk_u32 *scales, const uk_u32 *offs, const float *x, long long ldx, int m,
                                   float *y, long long ldy) {
    const pk_layout L = {w, stride, k, bits, group, mode, scales, offs};
    const long long i0 = (long long)blockIdx.y * PK_M;
    if (i0 >= m) return;
    const int rows = m - i0 < PK_M ? (int)(m - i0) : PK_M;
    pk_gemv_warp(&L, 0, n, x + i0 * ldx, ldx, rows, y + i0 * ldy, ldy);
}

/* y[s, row] = x[s / x_div] . W_e[row] for each (token, slot) pair s = blockIdx.y, e = idx[s] - e0: a bank of n-row
   experts holding experts [e0, e1) (all, one piece, or the chosen ones copied in, idx then remapped); the scales
   are the whole bank's, of expert sidx[s] (the router's own index). A pair whose expert is elsewhere is left. */
extern "C" __global__ void pk_gemv_idx(const uk_u8 *bank, int n, int stride, int k, int bits, int group, int mode,
                                       const uk_u32 *scales, const uk_u32 *offs, const float *x, long long ldx,
                                       int x_div, const int *idx, int e0, int e1, const int *sidx, float *y,
                                       long long ldy) {
    const long long s = blockIdx.y;
    const int e = idx[s];
    if (e < e0 || e >= e1) return;
    pk_layout L = {bank, stride, k, bits, group, mode, scales, offs};
    L.w = bank + (long long)(e - e0) * n * pk_row_bytes(&L) * stride;
    pk_gemv_warp(&L, (long long)sidx[s] * n, n, x + (s / x_div) * ldx, ldx, 1, y + s * ldy, ldy);
}

/* y[i, :] = row widx[i] - w0 of the packed rows at w, dequantized, for the r ids whose row is in [w0, w1) (all of
   the table, one streamed piece, or the rows gathered for the ids); its scales those of row sidx[i] (the token's
   id: one outside [0, vocab) writes zeros and the fault code). One thread per 32-value unit. */
extern "C" __global__ void pk_rows(const uk_u8 *w, int stride, int k, int bits, int group, int mode,
                                   const uk_u32 *scales, const uk_u32 *offs, const int *widx, int w0, int w1,
                                   const int *sidx, int r, float *y, int vocab, int *fault, int code) {
    const pk_layout L = {w, stride, k, bits, group, mode, scales, offs};
    const long long units = (k + 31) / 32, t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= units * r) return;
    const long long i = t / units, u = t % units;
    if (sidx[i] < 0 || sidx[i] >= vocab) {  /* a token id outside the table: zeros, and the run raises */
        *fault = code;
        for (int j = 0; j < 32 && 32 * u + j < k; j++) y[i * k + 32 * u + j] = 0.0f;
        return;
    }
    const int row = widx[i];
    if (row < w0 || row >= w1) return;
    float q[32];
    pk_unit(&L, w + (long long)(row - w0) * pk_row_bytes(&L) * stride, sidx[i], u, q);
    const int count = k - 32 * u < 32 ? (int)(k - 32 * u) : 32;
    for (int j = 0; j < count; j++) y[i * k + 32 * u + j] = q[j];
}
