/* kernels_scalar.c — the scalar reference kernel table: the path of UK_ISA_SCALAR and what every SIMD variant is
 * tested against. GEMV over quantized weights repacks each row (repack.c) and runs the scalar tile. */
#include "uk_internal.h"

static float dotf_f32(int64_t k, const void *w, const float *x) {
    const float *a = w;
    float s = 0.0f;
    for (int64_t i = 0; i < k; i++) s += a[i] * x[i];
    return s;
}

static void tileq_ref(int64_t k, int nr, int mr, int sign, const uint8_t *wq, const float *wsc, const float *wmn,
                      const int8_t *aq, const float *ad, const float *as, float *y, int64_t ldy) {
    const int64_t nb = k / QK;
    for (int j = 0; j < mr; j++) {
        for (int i = 0; i < nr; i++) {
            const uint8_t *q = wq + i * k;
            const int8_t *a = aq + j * k;
            const float *sc = wsc + i * 2 * nb, *mn = wmn + i * nb, *da = ad + j * nb, *sa = as + j * nb;
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++, q += QK, a += QK) {
                int32_t lo = 0, hi = 0;
                for (int l = 0; l < 16; l++) {
                    lo += (sign ? (int8_t)q[l] : (int)q[l]) * a[l];
                    hi += (sign ? (int8_t)q[l + 16] : (int)q[l + 16]) * a[l + 16];
                }
                acc += (float)lo * (sc[2 * b] * da[b]) + (float)hi * (sc[2 * b + 1] * da[b]);
                if (!sign) acc += mn[b] * sa[b];
            }
            y[j * ldy + i] = acc;
        }
    }
}

/* Q8_0 x 16-bit activations: the reference order of every ISA's tile16 (uk_internal.h), for decode and batches */
static void tile16_q8_0_ref(int64_t k, int nr, int mr, const uint8_t *w, int64_t row_bytes, const int16_t *aq,
                            const float *ad, float *y, int64_t ldy) {
    const int64_t nb = k / QK;
    for (int j = 0; j < mr; j++) {
        for (int i = 0; i < nr; i++) {
            const block_q8_0 *x = (const block_q8_0 *)(w + i * row_bytes);
            const int16_t *a = aq + j * k;
            const float *da = ad + j * nb;
            float acc[8] = {0.0f}, tail = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                int32_t isum = 0;
                for (int l = 0; l < QK; l++) isum += x[b].qs[l] * a[QK * b + l];
                const float sc = uk_h(&x[b].d) * da[b];
                if (b < nb / 8 * 8) acc[b % 8] = fmaf((float)isum, sc, acc[b % 8]);
                else tail = fmaf((float)isum, sc, tail);
            }
            y[j * ldy + i] = (((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))) + tail;
        }
    }
}

/* Q2_K has no tile form (a min per 16 values); its decode dot is the reference of the SIMD ones */
static float dotq_q2_k_ref(int64_t k, const void *w, const int8_t *aq, const float *ad, const float *as) {
    (void)as;
    const block_q2_K *x = w;
    float acc = 0.0f, macc = 0.0f;
    for (int64_t i = 0; i < k / QK_K; i++, aq += QK_K, ad += 8) {
        const float d = uk_h(&x[i].d), dmin = uk_h(&x[i].dmin);
        for (int s = 0; s < 8; s++) {
            int32_t isum = 0, imin = 0;
            for (int l = 0; l < 32; l++) {
                const int q = (x[i].qs[32 * (s / 4) + l] >> (2 * (s % 4))) & 3;
                const uint8_t sc = x[i].scales[2 * s + (l >= 16)];
                isum += (sc & 0x0f) * q * aq[32 * s + l];
                imin += (sc >> 4) * aq[32 * s + l];
            }
            acc += (float)isum * (d * ad[s]);
            macc += (float)imin * (dmin * ad[s]);
        }
    }
    return acc - macc;
}

static void tilef_ref(int64_t k, int nr, int mr, const float *w, int64_t ldw, const float *x, int64_t ldx, float *y,
                      int64_t ldy) {
    for (int j = 0; j < mr; j++)
        for (int i = 0; i < nr; i++) y[j * ldy + i] = dotf_f32(k, w + i * ldw, x + j * ldx);
}

#define UK_TGT
#define UK_FN(name) name##_ref
#define UK_LOAD_F16(p) uk_h(p)
#include "ops_impl.inc"

void uk_fill_scalar(uk_kernel_table *t) {
    memset(t, 0, sizeof(*t));
    for (int type = 0; type < UK_NTYPES; type++) {
        const uk_traits_t *tr = uk_traits(type);
        if (tr) t->dequant[type] = tr->dequant;
    }
    t->dequant[T_Q4_1_X16] = uk_deq_q4_1x16_row;     /* rows only (gemm.c's f32 path): see held.c */
    t->dotq[T_Q2_K] = dotq_q2_k_ref;
    t->quant_act = uk_q8a_ref;
    t->quant_act16 = uk_q16a_ref;
    t->tile16[T_Q8_0] = tile16_q8_0_ref;
    t->tileq = tileq_ref;
    t->tilef = tilef_ref;
    fill_ops_ref(t);
}
