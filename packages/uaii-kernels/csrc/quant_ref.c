/* quant_ref.c — scalar dequantization of every supported GGUF type (bit-exact with gguf-py: the same float32
 * operations in the same order, compiled with -ffp-contract=off), the repacking of weight blocks into the
 * integer form of the GEMM kernels, and the type traits table. */
#include "uk_internal.h"

const int8_t uk_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t uk_kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* --- plain types -------------------------------------------------------------------------------------------- */
static void deq_f32(const void *src, float *y, int64_t n) { memcpy(y, src, (size_t)n * 4); }

static void deq_f16(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) y[i] = uk_h((const uk_half *)(p + 2 * i));
}

static void deq_bf16(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, p + 2 * i, 2); y[i] = uk_bf16_to_fp32(h); }
}

/* --- legacy 32-blocks --------------------------------------------------------------------------------------- */
static void deq_q4_0(const void *src, float *y, int64_t nb) {
    const block_q4_0 *x = src;
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = uk_h(&x[i].d);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * (float)((x[i].qs[j] & 0x0f) - 8);
            y[j + 16] = d * (float)((x[i].qs[j] >> 4) - 8);
        }
    }
}

static void deq_q4_1(const void *src, float *y, int64_t nb) {
    const block_q4_1 *x = src;
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = uk_h(&x[i].d), m = uk_h(&x[i].m);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * (float)(x[i].qs[j] & 0x0f) + m;
            y[j + 16] = d * (float)(x[i].qs[j] >> 4) + m;
        }
    }
}

UK_INLINE uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static void deq_q5_0(const void *src, float *y, int64_t nb) {
    const block_q5_0 *x = src;
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = uk_h(&x[i].d);
        const uint32_t qh = le32(x[i].qh);
        for (int j = 0; j < QK / 2; j++) {
            const int x0 = (int)((x[i].qs[j] & 0x0f) | (((qh >> j) & 1) << 4)) - 16;
            const int x1 = (int)((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
            y[j] = d * (float)x0;
            y[j + 16] = d * (float)x1;
        }
    }
}

static void deq_q5_1(const void *src, float *y, int64_t nb) {
    const block_q5_1 *x = src;
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = uk_h(&x[i].d), m = uk_h(&x[i].m);
        const uint32_t qh = le32(x[i].qh);
        for (int j = 0; j < QK / 2; j++) {
            const int x0 = (int)((x[i].qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
            const int x1 = (int)((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
            y[j] = d * (float)x0 + m;
            y[j + 16] = d * (float)x1 + m;
        }
    }
}

static void deq_q8_0(const void *src, float *y, int64_t nb) {
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = uk_h(&x[i].d);
        for (int j = 0; j < QK; j++) y[j] = (float)x[i].qs[j] * d;
    }
}

static void deq_iq4_nl(const void *src, float *y, int64_t nb) {
    const block_iq4_nl *x = src;
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = uk_h(&x[i].d);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * (float)uk_kvalues_iq4nl[x[i].qs[j] & 0x0f];
            y[j + 16] = d * (float)uk_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
    }
}

static void deq_mxfp4(const void *src, float *y, int64_t nb) {
    const block_mxfp4 *x = src;
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const float d = uk_e8m0_half(x[i].e);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * (float)uk_kvalues_mxfp4[x[i].qs[j] & 0x0f];
            y[j + 16] = d * (float)uk_kvalues_mxfp4[x[i].qs[j] >> 4];
        }
    }
}

/* --- k-quants ----------------------------------------------------------------------------------------------- */
UK_INLINE void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void deq_q2_k(const void *src, float *y, int64_t nb) {
    const block_q2_K *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = uk_h(&x[i].d), dmin = uk_h(&x[i].dmin);
        const uint8_t *q = x[i].qs;
        int is = 0;
        for (int n = 0; n < QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int half = 0; half < 2; half++) {
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * (float)(sc & 0x0f), ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
                }
            }
        }
    }
}

/* the twelve Q3_K scale bytes hold sixteen 6-bit scales (offset 32) */
static void q3k_scales(const uint8_t *s, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? (s[j] & 0x0f) : (s[j - 8] >> 4);
        const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        out[j] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

static void deq_q3_k(const void *src, float *y, int64_t nb) {
    const block_q3_K *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = uk_h(&x[i].d);
        int8_t sc[16];
        q3k_scales(x[i].scales, sc);
        const uint8_t *q = x[i].qs;
        int is = 0, bit = 0;
        for (int n = 0; n < QK_K; n += 128, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, bit++) {
                for (int half = 0; half < 2; half++) {
                    const float dl = d * (float)sc[is++];
                    for (int l = 16 * half; l < 16 * half + 16; l++) {
                        const int v = ((q[l] >> shift) & 3) - (((x[i].hmask[l] >> bit) & 1) ? 0 : 4);
                        *y++ = dl * (float)v;
                    }
                }
            }
        }
    }
}

static void deq_q4_k(const void *src, float *y, int64_t nb) {
    const block_q4_K *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = uk_h(&x[i].d), dmin = uk_h(&x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int j = 0; j < 8; j += 2, q += 32) {
            uint8_t sc, m;
            scale_min_k4(j, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            scale_min_k4(j + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0f) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void deq_q5_k(const void *src, float *y, int64_t nb) {
    const block_q5_K *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = uk_h(&x[i].d), dmin = uk_h(&x[i].dmin);
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        for (int j = 0; j < 8; j += 2, ql += 32) {
            uint8_t sc, m;
            scale_min_k4(j, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            scale_min_k4(j + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0x0f) | (((qh[l] >> j) & 1) << 4)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) | (((qh[l] >> (j + 1)) & 1) << 4)) - m2;
        }
    }
}

static void deq_q6_k(const void *src, float *y, int64_t nb) {
    const block_q6_K *x = src;
    for (int64_t i = 0; i < nb; i++, y += QK_K) {
        const float d = uk_h(&x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int n = 0; n < QK_K; n += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[n + l] = d * (float)sc[is] * (float)q1;
                y[n + l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[n + l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[n + l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

static void deq_iq4_xs(const void *src, float *y, int64_t nb) {
    const block_iq4_xs *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = uk_h(&x[i].d);
        uint16_t sh;
        memcpy(&sh, &x[i].scales_h, 2);
        const uint8_t *qs = x[i].qs;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 16, y += 32) {
            const int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((sh >> (2 * ib)) & 3) << 4);
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)uk_kvalues_iq4nl[qs[j] & 0x0f];
                y[j + 16] = dl * (float)uk_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

/* --- type traits -------------------------------------------------------------------------------------------- */
void uk_repack_q4_0(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_q4_1(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_q5_0(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_q5_1(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_q8_0(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_q3_k(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_q4_k(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_q5_k(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_q6_k(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_iq4_nl(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_iq4_xs(const void *, int64_t, uint8_t *, float *, float *);
void uk_repack_mxfp4(const void *, int64_t, uint8_t *, float *, float *);
void uk_quant_q8_0(const float *, void *, int64_t);
void uk_quant_q4_0(const float *, void *, int64_t);
void uk_quant_q4_1(const float *, void *, int64_t);
void uk_quant_q5_0(const float *, void *, int64_t);
void uk_quant_q5_1(const float *, void *, int64_t);
void uk_quant_q4_k(const float *, void *, int64_t);
void uk_quant_q6_k(const float *, void *, int64_t);

static const uk_traits_t TRAITS[UK_NTYPES] = {
    [T_F32] = {"f32", 1, 4, deq_f32, NULL, NULL, 0},
    [T_F16] = {"f16", 1, 2, deq_f16, NULL, NULL, 0},
    [T_BF16] = {"bf16", 1, 2, deq_bf16, NULL, NULL, 0},
    [T_Q4_0] = {"q4_0", 32, 18, deq_q4_0, uk_quant_q4_0, uk_repack_q4_0, 0},
    [T_Q4_1] = {"q4_1", 32, 20, deq_q4_1, uk_quant_q4_1, uk_repack_q4_1, 0},
    [T_Q5_0] = {"q5_0", 32, 22, deq_q5_0, uk_quant_q5_0, uk_repack_q5_0, 0},
    [T_Q5_1] = {"q5_1", 32, 24, deq_q5_1, uk_quant_q5_1, uk_repack_q5_1, 0},
    [T_Q8_0] = {"q8_0", 32, 34, deq_q8_0, uk_quant_q8_0, uk_repack_q8_0, 1},
    [T_Q2_K] = {"q2_k", 256, 84, deq_q2_k, NULL, NULL, 0},
    [T_Q3_K] = {"q3_k", 256, 110, deq_q3_k, NULL, uk_repack_q3_k, 1},
    [T_Q4_K] = {"q4_k", 256, 144, deq_q4_k, uk_quant_q4_k, uk_repack_q4_k, 0},
    [T_Q5_K] = {"q5_k", 256, 176, deq_q5_k, NULL, uk_repack_q5_k, 0},
    [T_Q6_K] = {"q6_k", 256, 210, deq_q6_k, uk_quant_q6_k, uk_repack_q6_k, 1},
    [T_IQ4_NL] = {"iq4_nl", 32, 18, deq_iq4_nl, NULL, uk_repack_iq4_nl, 1},
    [T_IQ4_XS] = {"iq4_xs", 256, 136, deq_iq4_xs, NULL, uk_repack_iq4_xs, 1},
    [T_MXFP4] = {"mxfp4", 32, 17, deq_mxfp4, NULL, uk_repack_mxfp4, 1},
};

const uk_traits_t *uk_traits(int type) {
    if (type < 0 || type >= UK_NTYPES) return NULL;
    const uk_traits_t *t = &TRAITS[type];
    return t->dequant ? t : NULL;
}
