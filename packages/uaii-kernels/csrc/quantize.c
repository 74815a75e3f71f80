/* quantize.c — f32 to GGUF blocks. Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 repeat gguf-py's float operations exactly
 * (Q4_0/Q5_0 round x * id + offset in float64 first, as gguf-py does); Q4_K and Q6_K follow ggml's reference
 * quantizers (quantize_row_q4_K_ref / quantize_row_q6_K_ref). Also the activation quantizer of the integer path. */
#include "uk_internal.h"

#define GROUP_MAX_EPS 1e-15f

UK_INLINE void put_half(uk_half *p, float f) { uk_half h = uk_fp32_to_fp16(f); memcpy(p, &h, 2); }

void uk_quant_q8_0(const float *x, void *dst, int64_t nb) {
    block_q8_0 *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) amax = UK_MAX(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(&y[i].d, d);
        for (int j = 0; j < QK; j++) y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* index of the first value of largest magnitude, as numpy's argmax(abs(x)) */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) { amax = fabsf(x[j]); max = x[j]; }
    }
    return max;
}

void uk_quant_q4_0(const float *x, void *dst, int64_t nb) {
    block_q4_0 *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = signed_absmax(x, QK) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(&y[i].d, d);
        for (int j = 0; j < 16; j++) {
            const int q0 = (int)truncf((float)((double)x[j] * (double)id + 8.5));
            const int q1 = (int)truncf((float)((double)x[j + 16] * (double)id + 8.5));
            y[i].qs[j] = (uint8_t)(UK_MIN(15, q0) | (UK_MIN(15, q1) << 4));
        }
    }
}

void uk_quant_q5_0(const float *x, void *dst, int64_t nb) {
    block_q5_0 *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK) {
        const float d = signed_absmax(x, QK) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(&y[i].d, d);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const int q0 = UK_MIN(31, (int)truncf((float)((double)x[j] * (double)id + 16.5)));
            const int q1 = UK_MIN(31, (int)truncf((float)((double)x[j + 16] * (double)id + 16.5)));
            y[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= ((uint32_t)(q0 >> 4) << j) | ((uint32_t)(q1 >> 4) << (j + 16));
        }
        for (int b = 0; b < 4; b++) y[i].qh[b] = (uint8_t)(qh >> (8 * b));
    }
}

static void min_max(const float *x, int n, float *mn, float *mx) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < n; j++) { lo = UK_MIN(lo, x[j]); hi = UK_MAX(hi, x[j]); }
    *mn = lo;
    *mx = hi;
}

void uk_quant_q4_1(const float *x, void *dst, int64_t nb) {
    block_q4_1 *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float mn, mx;
        min_max(x, QK, &mn, &mx);
        const float d = (mx - mn) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(&y[i].d, d);
        put_half(&y[i].m, mn);
        for (int j = 0; j < 16; j++) {
            const int q0 = UK_MIN(15, (int)truncf((x[j] - mn) * id + 0.5f));
            const int q1 = UK_MIN(15, (int)truncf((x[j + 16] - mn) * id + 0.5f));
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void uk_quant_q5_1(const float *x, void *dst, int64_t nb) {
    block_q5_1 *y = dst;
    for (int64_t i = 0; i < nb; i++, x += QK) {
        float mn, mx;
        min_max(x, QK, &mn, &mx);
        const float d = (mx - mn) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        put_half(&y[i].d, d);
        put_half(&y[i].m, mn);
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            const int q0 = UK_MIN(31, (int)truncf((x[j] - mn) * id + 0.5f));
            const int q1 = UK_MIN(31, (int)truncf((x[j + 16] - mn) * id + 0.5f));
            y[i].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= ((uint32_t)(q0 >> 4) << j) | ((uint32_t)(q1 >> 4) << (j + 16));
        }
        for (int b = 0; b < 4; b++) y[i].qh[b] = (uint8_t)(qh >> (8 * b));
    }
}

/* --- k-quants (ggml reference algorithms) -------------------------------------------------------------------- */
UK_INLINE int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

/* scale and min for n values at levels 0..nmax, searching around the min/max fit with weighted least squares */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min,
                              uint8_t *Laux, float rmin, float rdelta, int nstep) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale, best_error = 0;
    for (int i = 0; i < n; i++) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)UK_MAX(0, UK_MIN(nmax, l));
        const float diff = scale * L[i] + min - x[i];
        best_error += w[i] * diff * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = UK_MAX(0, UK_MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                const float diff = this_scale * Laux[i] + this_min - x[i];
                cur_error += w[i] * diff * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

void uk_quant_q4_k(const float *x, void *dst, int64_t nb) {
    block_q4_K *y = dst;
    uint8_t L[QK_K], Laux[32];
    float weights[32], mins[8], scales[8];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; j++) {
            float sum_x2 = 0;
            for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
            const float av_x = sqrtf(sum_x2 / 32);
            for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
            scales[j] = make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20);
            max_scale = UK_MAX(max_scale, scales[j]);
            max_min = UK_MAX(max_min, mins[j]);
        }
        const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
        const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
        memset(y[i].scales, 0, 12);
        for (int j = 0; j < 8; j++) {
            const uint8_t ls = (uint8_t)UK_MIN(63, nearest_int(inv_scale * scales[j]));
            const uint8_t lm = (uint8_t)UK_MIN(63, nearest_int(inv_min * mins[j]));
            if (j < 4) {
                y[i].scales[j] = ls;
                y[i].scales[j + 4] = lm;
            } else {
                y[i].scales[j + 4] = (uint8_t)((ls & 0x0f) | ((lm & 0x0f) << 4));
                y[i].scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
                y[i].scales[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        put_half(&y[i].d, max_scale / 63.f);
        put_half(&y[i].dmin, max_min / 63.f);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            if (j < 4) { sc = y[i].scales[j] & 63; m = y[i].scales[j + 4] & 63; }
            else {
                sc = (uint8_t)((y[i].scales[j + 4] & 0x0f) | ((y[i].scales[j - 4] >> 6) << 4));
                m = (uint8_t)((y[i].scales[j + 4] >> 4) | ((y[i].scales[j] >> 6) << 4));
            }
            const float d = uk_h(&y[i].d) * sc;
            if (!d) continue;
            const float dm = uk_h(&y[i].dmin) * m;
            for (int ii = 0; ii < 32; ii++) {
                const int l = nearest_int((x[32 * j + ii] + dm) / d);
                L[32 * j + ii] = (uint8_t)UK_MAX(0, UK_MIN(15, l));
            }
        }
        uint8_t *q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32) {
            for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        }
    }
}

/* symmetric scale for n values at levels -nmax..nmax-1 (rmse_type 1: weights x^2), levels + nmax in L */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) { amax = ax; max = x[i]; }
    }
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = UK_MAX(-nmax, UK_MIN(nmax - 1, l));
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * x[i]);
            l = UK_MAX(-nmax, UK_MIN(nmax - 1, l));
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                const int l = nearest_int(iscale * x[i]);
                L[i] = (int8_t)(nmax + UK_MAX(-nmax, UK_MIN(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

void uk_quant_q6_k(const float *x, void *dst, int64_t nb) {
    block_q6_K *y = dst;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) { max_abs_scale = fabsf(scale); max_scale = scale; }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof(block_q6_K));
            continue;
        }
        const float iscale = -128.f / max_scale;
        put_half(&y[i].d, 1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) y[i].scales[ib] = (int8_t)UK_MIN(127, nearest_int(iscale * scales[ib]));
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = uk_h(&y[i].d) * y[i].scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ii++) {
                int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(UK_MAX(-32, UK_MIN(31, l)) + 32);
            }
        }
        uint8_t *ql = y[i].ql, *qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = L[j + l] & 0xf, q2 = L[j + l + 32] & 0xf;
                const uint8_t q3 = L[j + l + 64] & 0xf, q4 = L[j + l + 96] & 0xf;
                ql[l] = (uint8_t)(q1 | (q3 << 4));
                ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
                qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                  ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

/* one block of 32 activations: amax (returned) and r = round-half-even(x * qmax / amax), the part the 8-bit and
   the 16-bit quantizers share (|x * qmax / amax| <= qmax + a rounding error: r fits their int type) */
static float qa_block(const float *x, float qmax, int r[QK]) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) amax = UK_MAX(amax, fabsf(x[j]));
    const float id = amax != 0.0f ? qmax / amax : 0.0f;
    for (int j = 0; j < QK; j++) r[j] = (int)nearbyintf(x[j] * id);
    return amax;
}

/* --- activations: per 32 values q = round-half-even(x * 127 / amax), d = amax / 127, s = d * sum(q) ----------- */
void uk_q8a_ref(const float *x, int64_t k, int8_t *q, float *d, float *s) {
    for (int64_t b = 0; b < k / QK; b++, x += QK, q += QK) {
        int r[QK];
        const float amax = qa_block(x, 127.0f, r);
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            q[j] = (int8_t)r[j];
            sum += q[j];
        }
        d[b] = amax / 127.0f;
        s[b] = d[b] * (float)sum;
    }
}

/* --- 16-bit activations (Q8_0 weights): q = round-half-even(x * 32767 / amax) as int16, d = amax / 32767 ------ */
void uk_q16a_ref(const float *x, int64_t k, int16_t *q, float *d) {
    for (int64_t b = 0; b < k / QK; b++, x += QK, q += QK) {
        int r[QK];
        const float amax = qa_block(x, 32767.0f, r);
        for (int j = 0; j < QK; j++) q[j] = (int16_t)r[j];   /* |x * 32767 / amax| <= 32767.004 */
        d[b] = amax / 32767.0f;
    }
}
