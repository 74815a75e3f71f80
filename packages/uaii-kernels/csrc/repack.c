/* repack.c — weight blocks to the integer form of the GEMM tile kernels (uk_internal.h): per 32 values, 32
 * one-byte integers q, two scales (values 0..15 and 16..31) and an additive term, so that w = sc * q + mn. One
 * scalar function per type; the tile kernels and the repacked-row GEMV then serve every type the same way. */
#include "uk_internal.h"

UK_INLINE uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

void uk_repack_q4_0(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_q4_0 *x = src;
    for (int64_t i = 0; i < nb; i++, q += 32) {
        const float d = uk_h(&x[i].d);
        for (int j = 0; j < 16; j++) { q[j] = x[i].qs[j] & 0x0f; q[j + 16] = x[i].qs[j] >> 4; }
        sc[2 * i] = sc[2 * i + 1] = d;
        mn[i] = -8.0f * d;
    }
}

void uk_repack_q4_1(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_q4_1 *x = src;
    for (int64_t i = 0; i < nb; i++, q += 32) {
        for (int j = 0; j < 16; j++) { q[j] = x[i].qs[j] & 0x0f; q[j + 16] = x[i].qs[j] >> 4; }
        sc[2 * i] = sc[2 * i + 1] = uk_h(&x[i].d);
        mn[i] = uk_h(&x[i].m);
    }
}

void uk_repack_q5_0(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_q5_0 *x = src;
    for (int64_t i = 0; i < nb; i++, q += 32) {
        const float d = uk_h(&x[i].d);
        const uint32_t qh = le32(x[i].qh);
        for (int j = 0; j < 16; j++) {
            q[j] = (uint8_t)((x[i].qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
            q[j + 16] = (uint8_t)((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        sc[2 * i] = sc[2 * i + 1] = d;
        mn[i] = -16.0f * d;
    }
}

void uk_repack_q5_1(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_q5_1 *x = src;
    for (int64_t i = 0; i < nb; i++, q += 32) {
        const uint32_t qh = le32(x[i].qh);
        for (int j = 0; j < 16; j++) {
            q[j] = (uint8_t)((x[i].qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
            q[j + 16] = (uint8_t)((x[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
        sc[2 * i] = sc[2 * i + 1] = uk_h(&x[i].d);
        mn[i] = uk_h(&x[i].m);
    }
}

void uk_repack_q8_0(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < nb; i++, q += 32) {
        memcpy(q, x[i].qs, 32);
        sc[2 * i] = sc[2 * i + 1] = uk_h(&x[i].d);
        mn[i] = 0.0f;
    }
}

void uk_repack_iq4_nl(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_iq4_nl *x = src;
    for (int64_t i = 0; i < nb; i++, q += 32) {
        for (int j = 0; j < 16; j++) {
            q[j] = (uint8_t)uk_kvalues_iq4nl[x[i].qs[j] & 0x0f];
            q[j + 16] = (uint8_t)uk_kvalues_iq4nl[x[i].qs[j] >> 4];
        }
        sc[2 * i] = sc[2 * i + 1] = uk_h(&x[i].d);
        mn[i] = 0.0f;
    }
}

void uk_repack_mxfp4(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_mxfp4 *x = src;
    for (int64_t i = 0; i < nb; i++, q += 32) {
        for (int j = 0; j < 16; j++) {
            q[j] = (uint8_t)uk_kvalues_mxfp4[x[i].qs[j] & 0x0f];
            q[j + 16] = (uint8_t)uk_kvalues_mxfp4[x[i].qs[j] >> 4];
        }
        sc[2 * i] = sc[2 * i + 1] = uk_e8m0_half(x[i].e);
        mn[i] = 0.0f;
    }
}

static void scale_min_k4(int j, const uint8_t *s, uint8_t *d, uint8_t *m) {
    if (j < 4) { *d = s[j] & 63; *m = s[j + 4] & 63; }
    else { *d = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4)); *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4)); }
}

void uk_repack_q4_k(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_q4_K *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = uk_h(&x[i].d), dmin = uk_h(&x[i].dmin);
        for (int s = 0; s < 8; s++, q += 32, sc += 2, mn++) {
            uint8_t ls, lm;
            scale_min_k4(s, x[i].scales, &ls, &lm);
            const uint8_t *qs = x[i].qs + 32 * (s / 2);
            for (int l = 0; l < 32; l++) q[l] = (s & 1) ? (qs[l] >> 4) : (qs[l] & 0x0f);
            sc[0] = sc[1] = d * (float)ls;
            *mn = -(dmin * (float)lm);
        }
    }
}

void uk_repack_q5_k(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_q5_K *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = uk_h(&x[i].d), dmin = uk_h(&x[i].dmin);
        for (int s = 0; s < 8; s++, q += 32, sc += 2, mn++) {
            uint8_t ls, lm;
            scale_min_k4(s, x[i].scales, &ls, &lm);
            const uint8_t *qs = x[i].qs + 32 * (s / 2);
            for (int l = 0; l < 32; l++) {
                const int lo = (s & 1) ? (qs[l] >> 4) : (qs[l] & 0x0f);
                q[l] = (uint8_t)(lo | (((x[i].qh[l] >> s) & 1) << 4));
            }
            sc[0] = sc[1] = d * (float)ls;
            *mn = -(dmin * (float)lm);
        }
    }
}

void uk_repack_q6_k(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_q6_K *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = uk_h(&x[i].d);
        for (int s = 0; s < 8; s++, q += 32, sc += 2, mn++) {
            const int n = s / 4, part = s % 4;           /* 128-value half, then 32-value quarter in it */
            const uint8_t *ql = x[i].ql + 64 * n + 32 * (part & 1), *qh = x[i].qh + 32 * n;
            for (int l = 0; l < 32; l++) {
                const int lo = (part < 2) ? (ql[l] & 0x0f) : (ql[l] >> 4);
                q[l] = (uint8_t)(int8_t)((lo | (((qh[l] >> (2 * part)) & 3) << 4)) - 32);
            }
            const int8_t *scl = x[i].scales + 8 * n + 2 * part;
            sc[0] = d * (float)scl[0];
            sc[1] = d * (float)scl[1];
            *mn = 0.0f;
        }
    }
}

void uk_repack_iq4_xs(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_iq4_xs *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = uk_h(&x[i].d);
        uint16_t sh;
        memcpy(&sh, &x[i].scales_h, 2);
        for (int ib = 0; ib < 8; ib++, q += 32, sc += 2, mn++) {
            const uint8_t *qs = x[i].qs + 16 * ib;
            const int ls = ((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | (((sh >> (2 * ib)) & 3) << 4);
            for (int j = 0; j < 16; j++) {
                q[j] = (uint8_t)uk_kvalues_iq4nl[qs[j] & 0x0f];
                q[j + 16] = (uint8_t)uk_kvalues_iq4nl[qs[j] >> 4];
            }
            sc[0] = sc[1] = d * (float)(ls - 32);
            *mn = 0.0f;
        }
    }
}

void uk_repack_q3_k(const void *src, int64_t nb, uint8_t *q, float *sc, float *mn) {
    const block_q3_K *x = src;
    for (int64_t i = 0; i < nb; i++) {
        const float d = uk_h(&x[i].d);
        int8_t scl[16];
        for (int j = 0; j < 16; j++) {
            const int lo = j < 8 ? (x[i].scales[j] & 0x0f) : (x[i].scales[j - 8] >> 4);
            const int hi = (x[i].scales[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
            scl[j] = (int8_t)((lo | (hi << 4)) - 32);
        }
        for (int s = 0; s < 8; s++, q += 32, sc += 2, mn++) {
            const int n = s / 4, shift = 2 * (s % 4), bit = s;   /* bit = 4n + s%4 */
            const uint8_t *qs = x[i].qs + 32 * n;
            for (int l = 0; l < 32; l++) {
                const int v = ((qs[l] >> shift) & 3) - (((x[i].hmask[l] >> bit) & 1) ? 0 : 4);
                q[l] = (uint8_t)(int8_t)v;
            }
            sc[0] = d * (float)scl[2 * s];
            sc[1] = d * (float)scl[2 * s + 1];
            *mn = 0.0f;
        }
    }
}

/* A quantized activation row (uk_quantize_act) in the 8-block form (uk_internal.h): per group of 8 blocks, the
   slices, then d, s and the int32 sums of values 0..15 and 16..31 of each block; the last group zero-padded, and
   in 4 slices when it holds 1-4 blocks. */
void uk_aprep8(int64_t k, const int8_t *aq, const float *ad, const float *as, uint8_t *out) {
    const int64_t nb = k / QK;
    memset(out, 0, (size_t)((nb + 7) / 8) * UK_A8_BYTES);
    for (int64_t b = 0; b < nb; b++, aq += QK) {
        uint8_t *g = out + (b / 8) * UK_A8_BYTES;
        const int l = (int)(b % 8);
        if (nb - (b - l) <= 4) {              /* a last group of 1-4 blocks: 4 slices (x86_pack8.inc) */
            for (int t = 0; t < 4; t++) {
                memcpy(g + 32 * t + 4 * l, aq + 4 * t, 4);
                memcpy(g + 32 * t + 16 + 4 * l, aq + 16 + 4 * t, 4);
            }
        } else {
            for (int s = 0; s < 8; s++) memcpy(g + 32 * s + 4 * l, aq + 4 * s, 4);
        }
        int32_t sum[2] = {0, 0};
        for (int t = 0; t < 16; t++) { sum[0] += aq[t]; sum[1] += aq[16 + t]; }
        memcpy(g + 256 + 4 * l, &ad[b], 4);
        memcpy(g + 288 + 4 * l, &as[b], 4);
        memcpy(g + 320 + 4 * l, &sum[0], 4);
        memcpy(g + 352 + 4 * l, &sum[1], 4);
    }
}
