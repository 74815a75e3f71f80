/* decode.cuh — the GGUF block decoders of the CUDA kernels.
 *
 * Why C-compatible: the same source is built by the host C compiler for the tests (tests/backends/
 * test_cuda_kernels.py decodes every type with it and compares bit for bit with uaii.kernels.dequantize), so the
 * decoders are verified on a machine without a GPU. A decoder writes the 32 values of one *unit* of a weight row
 * (a 32-value block, or one eighth of a 256-value k-quant super-block) with the float operations of the C reference
 * (quant_ref.c), in its order: compiled with --fmad=false (dequantize) they give its bits; inside a GEMV the
 * compiler may contract them (the sums differ from the CPU's in order anyway). */
#ifndef UAII_CUDA_DECODE_CUH
#define UAII_CUDA_DECODE_CUH

#ifndef UK_DEV
#define UK_DEV __device__ __forceinline__
#endif
#ifndef UK_AS_FLOAT
#define UK_AS_FLOAT(bits) __int_as_float((int)(bits))
#endif
#ifndef UK_AS_BITS
#define UK_AS_BITS(f) ((uk_u32)__float_as_int(f))
#endif

typedef unsigned char uk_u8;
typedef signed char uk_i8;
typedef unsigned int uk_u32;

/* weight types, as the host names them (uaii.backends.cuda.kernels.TYPES) */
#define UK_F32 0
#define UK_F16 1
#define UK_BF16 2
#define UK_Q4_0 3
#define UK_Q4_1 4
#define UK_Q5_0 5
#define UK_Q5_1 6
#define UK_Q8_0 7
#define UK_Q4_K 8
#define UK_Q5_K 9
#define UK_Q6_K 10

/* IEEE half -> float, exact for every input (subnormals, infinities, NaN payloads), by integer operations */
UK_DEV float uk_h2f(uk_u32 h) {
    const uk_u32 e = (h >> 10) & 31u, m = h & 1023u, s = (h & 0x8000u) << 16;
    if (e == 0u) {
        const float v = (float)m * 5.9604644775390625e-8f;      /* m * 2^-24: exact */
        return s ? -v : v;
    }
    if (e == 31u) return UK_AS_FLOAT(s | 0x7f800000u | (m << 13));
    return UK_AS_FLOAT(s | ((e + 112u) << 23) | (m << 13));
}

/* float -> IEEE half bits, rounded to nearest even (numpy's astype(float16)): overflow to inf, subnormals kept,
   NaN stays NaN (quiet); the KV cache's f16 rows (attention.cu: kv_store) */
UK_DEV unsigned short uk_f2h(float f) {
    const uk_u32 x = UK_AS_BITS(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) return (unsigned short)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);   /* rounds past 65504 */
    if (a < 0x38800000u) {                                           /* an f16 subnormal (or zero) */
        if (a < 0x33000000u) return (unsigned short)sign;            /* below half the smallest subnormal */
        const uk_u32 e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
        uk_u32 h = m >> shift;
        const uk_u32 rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rest > half || (rest == half && (h & 1u))) h++;
        return (unsigned short)(sign | h);
    }
    uk_u32 h = ((a >> 13) - (112u << 10));                      /* rebias 127 -> 15 */
    const uk_u32 rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (unsigned short)(sign | h);
}

UK_DEV float uk_bf2f(uk_u32 h) { return UK_AS_FLOAT(h << 16); }

/* x rounded to f16 (round 1) or bf16 (round 2, to nearest even; a NaN stays a quiet NaN) and back: an f16 or bf16
   value held in an f32 word, as the CPU rounds it (uaii.ir's f32_to_bf16) */
UK_DEV float uk_round_to(float x, int round) {
    if (round == 1) return uk_h2f(uk_f2h(x));
    if (round == 2) {
        uk_u32 u = UK_AS_BITS(x);
        if ((u & 0x7fffffffu) > 0x7f800000u) return UK_AS_FLOAT((u | 0x00400000u) & 0xffff0000u);
        u += 0x7fffu + ((u >> 16) & 1u);
        return UK_AS_FLOAT(u & 0xffff0000u);
    }
    return x;
}

/* The activation tile of a warp-per-row GEMV (gemv.cu, packed.cu): the activation rows reach the lanes through
   shared memory, read from global memory once per block by consecutive threads at consecutive addresses, laid out
   UK_TILE_PAD floats per unit so the 32 lanes reading value i of their 32 units hit 32 different banks. (Read
   straight from global memory, lane l's value i of unit l sits 128 bytes from lane l + 1's: 32 transactions for one
   load instruction.) A step holds UK_TILE_UNITS units, one per lane. */
#define UK_TILE_UNITS 32
#define UK_TILE_PAD 33
#define UK_TILE_FLOATS (UK_TILE_UNITS * UK_TILE_PAD)

/* values [32 u0, 32 u0 + vals) of the m rows of x (ldx apart) into the tile (row r at xs + r UK_TILE_FLOATS), by the
   block's nt threads, this one tid */
UK_DEV void uk_tile_rows(float *xs, const float *x, long long ldx, int m, long long u0, int vals, int tid, int nt) {
    for (int v = tid; v < m * vals; v += nt) {
        const int r = v / vals, at = v % vals;
        xs[r * UK_TILE_FLOATS + at / 32 * UK_TILE_PAD + at % 32] = x[r * ldx + 32 * u0 + at];
    }
}

/* bytes per block and 32-value units per block of each type */
UK_DEV int uk_block_bytes(int t) {
    switch (t) {
    case UK_F32: return 128;
    case UK_F16: case UK_BF16: return 64;
    case UK_Q4_0: return 18;
    case UK_Q4_1: return 20;
    case UK_Q5_0: return 22;
    case UK_Q5_1: return 24;
    case UK_Q8_0: return 34;
    case UK_Q4_K: return 144;
    case UK_Q5_K: return 176;
    default: return 210;                                       /* UK_Q6_K */
    }
}

UK_DEV int uk_block_units(int t) { return t >= UK_Q4_K ? 8 : 1; }

/* the 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block */
UK_DEV void uk_scale_min_k4(int j, const uk_u8 *q, int *d, int *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* --- block types: each unit as int8 words, a scale per 16-value half and a term ---------------------------------
   The one decoder of every block type: value j of unit u is sc[j / 16] * q[j], then + mn (UK_MIN_ADD), - mn
   (UK_MIN_SUB: the k-quants' d1 * q - m1) or nothing (UK_MIN_NONE), the operations of the C reference in its order
   (Q6_K's d * sc * q is (d * sc) * q). q[j] is byte j % 4 of word w[j / 4] (an int8): the form __dp4a reads, so the
   int8 kernels (mmq.cu, gemv.cu's gemvq_) take the words as they are and uk_unit takes the bytes out.
   Why words: a GPU kernel reads a unit from shared memory, where every load instruction costs a cycle of the SM's
   shared-memory pipe whatever its width; 16-bit loads and shifts of whole words (the nibbles of four values at once,
   each byte's offset subtracted with no borrow between bytes) take a quarter of the loads and instructions of a
   byte at a time. Every block of every type starts at an even address (the block sizes are even, and so are the
   rows' and the staged copies' offsets), so the 16-bit loads are aligned: the host builds (-fsanitize=alignment)
   would fail a test on one that is not. */
#define UK_MIN_NONE 0
#define UK_MIN_ADD 1
#define UK_MIN_SUB 2

/* the 16-bit little-endian word at an even address, and the 32-bit one as two aligned 16-bit loads */
UK_DEV uk_u32 uk_ld16e(const uk_u8 *p) { return *(const unsigned short *)p; }

UK_DEV uk_u32 uk_ld32e(const uk_u8 *p) { return uk_ld16e(p) | (uk_ld16e(p + 2) << 16); }

/* each byte of x (0 .. 127) minus the matching byte of c (at most 128), as int8 bytes: 128 added first, so no byte
   borrows from the next */
UK_DEV uk_u32 uk_sub_bytes(uk_u32 x, uk_u32 c) { return ((x | 0x80808080u) - c) ^ 0x80808080u; }

/* bits 0 .. 3 of b to bit 4 of bytes 0 .. 3 (Q5_0 / Q5_1's fifth bits of four values) */
UK_DEV uk_u32 uk_spread4(uk_u32 b) {
    return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

UK_DEV int uk_unit_int(int t, const uk_u8 *p, int u, uk_u32 *w, float *sc, float *mn) {
    int j;
    switch (t) {
    case UK_Q4_0: case UK_Q4_1: {
        const int at = t == UK_Q4_0 ? 2 : 4;
        sc[0] = sc[1] = uk_h2f(uk_ld16e(p));
        *mn = t == UK_Q4_1 ? uk_h2f(uk_ld16e(p + 2)) : 0.0f;
        for (j = 0; j < 4; j++) {  /* values 4j .. 4j + 3: low nibbles of bytes 4j ..; 16 + 4j ..: their high ones */
            const uk_u32 x = uk_ld32e(p + at + 4 * j), lo = x & 0x0f0f0f0fu, hi = (x >> 4) & 0x0f0f0f0fu;
            w[j] = t == UK_Q4_0 ? uk_sub_bytes(lo, 0x08080808u) : lo;
            w[j + 4] = t == UK_Q4_0 ? uk_sub_bytes(hi, 0x08080808u) : hi;
        }
        return t == UK_Q4_1 ? UK_MIN_ADD : UK_MIN_NONE;
    }
    case UK_Q5_0: case UK_Q5_1: {
        const int at = t == UK_Q5_0 ? 6 : 8;
        const uk_u32 qh = uk_ld32e(p + at - 4);
        sc[0] = sc[1] = uk_h2f(uk_ld16e(p));
        *mn = t == UK_Q5_1 ? uk_h2f(uk_ld16e(p + 2)) : 0.0f;
        for (j = 0; j < 4; j++) {  /* value i's fifth bit is bit i of qh */
            const uk_u32 x = uk_ld32e(p + at + 4 * j);
            const uk_u32 lo = (x & 0x0f0f0f0fu) | uk_spread4(qh >> (4 * j));
            const uk_u32 hi = ((x >> 4) & 0x0f0f0f0fu) | uk_spread4(qh >> (4 * j + 16));
            w[j] = t == UK_Q5_0 ? uk_sub_bytes(lo, 0x10101010u) : lo;
            w[j + 4] = t == UK_Q5_0 ? uk_sub_bytes(hi, 0x10101010u) : hi;
        }
        return t == UK_Q5_1 ? UK_MIN_ADD : UK_MIN_NONE;
    }
    case UK_Q8_0:
        sc[0] = sc[1] = uk_h2f(uk_ld16e(p));
        *mn = 0.0f;
        for (j = 0; j < 8; j++) w[j] = uk_ld32e(p + 2 + 4 * j);
        return UK_MIN_NONE;
    case UK_Q4_K: case UK_Q5_K: {
        const float d = uk_h2f(uk_ld16e(p)), dmin = uk_h2f(uk_ld16e(p + 2));
        const int shift = 4 * (u % 2);  /* an even unit the low nibbles of its 32 bytes, an odd one the high */
        int s6, m6;
        uk_scale_min_k4(u, p + 4, &s6, &m6);
        sc[0] = sc[1] = d * (float)s6;
        *mn = dmin * (float)m6;
        if (t == UK_Q4_K) {
            const uk_u8 *qs = p + 16 + 32 * (u / 2);
            for (j = 0; j < 8; j++) w[j] = (uk_ld32e(qs + 4 * j) >> shift) & 0x0f0f0f0fu;
        } else {  /* the fifth bit of value j: bit u of qh[j] */
            const uk_u8 *qh = p + 16, *ql = p + 48 + 32 * (u / 2);
            for (j = 0; j < 8; j++)
                w[j] = ((uk_ld32e(ql + 4 * j) >> shift) & 0x0f0f0f0fu) |
                       (((uk_ld32e(qh + 4 * j) >> u) & 0x01010101u) << 4);
        }
        return UK_MIN_SUB;
    }
    default: {                                                 /* UK_Q6_K */
        const float d = uk_h2f(uk_ld16e(p + 208));
        const int half = u / 4, k = u % 4;
        const uk_u8 *ql = p + 64 * half + (k & 1) * 32, *qh = p + 128 + 32 * half;
        const uk_i8 *s8 = (const uk_i8 *)(p + 192) + 8 * half + 2 * k;
        const int shift = 2 * k, nib = 4 * (k >> 1);
        sc[0] = d * (float)s8[0];
        sc[1] = d * (float)s8[1];
        *mn = 0.0f;
        for (j = 0; j < 8; j++)
            w[j] = uk_sub_bytes(((uk_ld32e(ql + 4 * j) >> nib) & 0x0f0f0f0fu) |
                                (((uk_ld32e(qh + 4 * j) >> shift) & 0x03030303u) << 4), 0x20202020u);
        return UK_MIN_NONE;
    }
    }
}

/* the unit as the int8 products read it: value j is sc[j / 16] * q[j] + mn (uk_unit's values, a zero's sign
   aside) */
UK_DEV void uk_unit_dot_form(int t, const uk_u8 *p, int u, uk_u32 *w, float *sc, float *mn) {
    if (uk_unit_int(t, p, u, w, sc, mn) == UK_MIN_SUB) *mn = -*mn;
}

/* values 32 u .. 32 u + 31 of the block at p (u < uk_block_units(t)) into y */
UK_DEV void uk_unit(int t, const uk_u8 *p, int u, float *y) {
    int j;
    switch (t) {
    case UK_F32:
        for (j = 0; j < 32; j++) y[j] = UK_AS_FLOAT(uk_ld32e(p + 4 * j));
        break;
    case UK_F16:
        for (j = 0; j < 32; j++) y[j] = uk_h2f(uk_ld16e(p + 2 * j));
        break;
    case UK_BF16:
        for (j = 0; j < 32; j++) y[j] = uk_bf2f(uk_ld16e(p + 2 * j));
        break;
    default: {
        uk_u32 q[8];
        float sc[2], mn;
        const int how = uk_unit_int(t, p, u, q, sc, &mn);
        for (j = 0; j < 32; j++) {
            const float v = sc[j / 16] * (float)(uk_i8)(q[j / 4] >> (8 * (j % 4)));
            y[j] = how == UK_MIN_ADD ? v + mn : how == UK_MIN_SUB ? v - mn : v;
        }
        break;
    }
    }
}

/* unit `unit` of a weight row of type t (units counted from the row's first block) */
UK_DEV void uk_row_unit(int t, const uk_u8 *row, long long unit, float *y) {
    const int per = uk_block_units(t);
    uk_unit(t, row + (unit / per) * uk_block_bytes(t), (int)(unit % per), y);
}

/* unit `unit` of a weight row as the int8 products read it (uk_unit_dot_form) */
UK_DEV void uk_row_unit_int(int t, const uk_u8 *row, long long unit, uk_u32 *w, float *sc, float *mn) {
    const int per = uk_block_units(t);
    uk_unit_dot_form(t, row + (unit / per) * uk_block_bytes(t), (int)(unit % per), w, sc, mn);
}

/* 32 activations as the CPU's integer path quantizes them (uk_q8a_ref): q = round-half-even(x * 127 / amax),
   d = amax / 127, s = d * sum(q); the same bits where compiled without contraction (--fmad=false) */
UK_DEV void uk_quant_act_block(const float *x, uk_i8 *q, float *d, float *s) {
    float amax = 0.0f;
    int j, sum = 0;
    for (j = 0; j < 32; j++) {
        const float a = fabsf(x[j]);
        amax = amax > a ? amax : a;
    }
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (j = 0; j < 32; j++) {
        q[j] = (uk_i8)(int)rintf(x[j] * id);
        sum += q[j];
    }
    *d = amax / 127.0f;
    *s = *d * (float)sum;
}

/* one (weight unit, activation block) pair of the int8 GEMM: the integer sums of each 16-value half, then
   da * (sc0 * lo + sc1 * hi) + mn * sa (sa = da * sum(qa) stands for the sum of the activations) */
UK_DEV float uk_unit_dot(int lo, int hi, const float *sc, float mn, float da, float sa) {
    return da * (sc[0] * (float)lo + sc[1] * (float)hi) + mn * sa;
}

/* uk_unit_dot of a weight unit's eight int8 words w (uk_unit_dot_form) and an activation block's eight words a: each
   half's integer sum by four __dp4a (the int8 GEMM's and the int8 GEMV's one pair) */
UK_DEV float uk_unit_pair(const int *w, const int *a, const float *sc, float mn, float da, float sa) {
    int lo = 0, hi = 0, j;
    for (j = 0; j < 4; j++) {
        lo = __dp4a(w[j], a[j], lo);
        hi = __dp4a(w[j + 4], a[j + 4], hi);
    }
    return uk_unit_dot(lo, hi, sc, mn, da, sa);
}

#endif
