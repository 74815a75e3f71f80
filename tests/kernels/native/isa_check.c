/* isa_check.c — the C library without Python: every available ISA against the scalar reference, through the public
 * API only. Built and run by tests/kernels/test_native.py with the host compiler, and cross-compiled for aarch64
 * and run under qemu-user where those tools exist (that is how the NEON path is checked on an x86 machine).
 * Exit status 0 when every check passes; prints one line per failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uaii_kernels.h"

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}
static float rndf(void) { return ((float)(rnd() % 2000001) - 1000000.0f) / 500000.0f; }  /* [-2, 2] */

static uint16_t f32_to_f16_small(float f) {   /* small positive normal halves only: exact enough for scales */
    int e;
    float m = frexpf(f, &e);                   /* f = m 2^e, 0.5 <= m < 1 */
    return (uint16_t)(((e + 14) << 10) | (((uint32_t)((m * 2.0f - 1.0f) * 1024.0f)) & 0x3ff));
}

typedef struct { int type, elems, bytes; int off[2]; int e8m0; } tdesc;
static const tdesc TYPES[] = {
    {2, 32, 18, {0, -1}, 0}, {3, 32, 20, {0, 2}, 0}, {6, 32, 22, {0, -1}, 0}, {7, 32, 24, {0, 2}, 0},
    {8, 32, 34, {0, -1}, 0}, {10, 256, 84, {80, 82}, 0}, {11, 256, 110, {108, -1}, 0}, {12, 256, 144, {0, 2}, 0},
    {13, 256, 176, {0, 2}, 0}, {14, 256, 210, {208, -1}, 0}, {20, 32, 18, {0, -1}, 0}, {23, 256, 136, {0, -1}, 0},
    {39, 32, 17, {-1, -1}, 1},
};

static void random_weight(const tdesc *t, uint8_t *w, int64_t n_blocks) {
    for (int64_t b = 0; b < n_blocks; b++) {
        uint8_t *blk = w + b * t->bytes;
        for (int i = 0; i < t->bytes; i++) blk[i] = (uint8_t)rnd();
        for (int o = 0; o < 2; o++) {
            if (t->off[o] < 0) continue;
            const uint16_t h = f32_to_f16_small(0.001f + (float)(rnd() % 1000) * 1e-5f);
            memcpy(blk + t->off[o], &h, 2);
        }
        if (t->e8m0) blk[0] = (uint8_t)(118 + rnd() % 6);
    }
}

static int failures = 0;
static void fail(const char *isa, const char *what, int type, double err) {
    printf("FAIL isa=%s %s type=%d err=%g\n", isa, what, type, err);
    failures++;
}

static double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) { num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); den += (double)b[i] * b[i]; }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* a batch of M activation rows gives, row for row, the bits of one row at a time (prefill and decode agree: the
   batch kernels sum as the decode kernels do; see test_batch_matches_decode.py for why bits); in mode 0 and in
   mode 2 ("precise": Q8_0's 16-bit activations) */
static void check_rows_mode(const char *isa, const tdesc *td, const uint8_t *w, const float *x, int64_t n,
                            int64_t k, int64_t m, float *yb, float *yr, int mode) {
    uk_gemm(td->type, w, n, k, x, m, k, yb, n, mode);
    for (int64_t j = 0; j < m; j++) {
        uk_gemm(td->type, w, n, k, x + j * k, 1, k, yr, n, mode);
        if (memcmp(yb + j * n, yr, sizeof(float) * (size_t)n)) {
            fail(isa, k == 512 ? "batch rows != decode rows (k 512)" : "batch rows != decode rows (k 352)",
                 td->type, 1 + mode);
            return;
        }
    }
}

static void check_rows(const char *isa, const tdesc *td, const uint8_t *w, const float *x, int64_t n, int64_t k,
                       int64_t m, float *yb, float *yr) {
    check_rows_mode(isa, td, w, x, n, k, m, yb, yr, 0);
    check_rows_mode(isa, td, w, x, n, k, m, yb, yr, 2);
}

int main(void) {
    const char *names[] = {"scalar", "avx2", "avxvnni", "avx512", "neon"};
    enum { K = 512, N = 37, M = 9 };
    float *x = malloc(sizeof(float) * M * K), *y0 = malloc(sizeof(float) * M * N), *y1 = malloc(sizeof(float) * M * N);
    float *deq0 = malloc(sizeof(float) * N * K), *deq1 = malloc(sizeof(float) * N * K);
    uint8_t *w = malloc((size_t)N * K / 32 * 40);
    for (int i = 0; i < M * K; i++) x[i] = rndf();
    int checked = 0;
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {            /* the scalar path too */
        random_weight(&TYPES[t], w, (int64_t)N * K / TYPES[t].elems);
        uk_set_isa(0);
        check_rows("scalar", &TYPES[t], w, x, N, K, M, y0, y1);
        if (TYPES[t].elems == 32) check_rows("scalar", &TYPES[t], w, x, N, 352, M, y0, y1);
    }
    for (int isa = 1; isa < 5; isa++) {
        if (!uk_isa_available(isa)) continue;
        checked++;
        /* activation quantizer: bit-exact */
        int8_t q0[K], q1[K];
        float d0[K / 32], d1[K / 32], s0[K / 32], s1[K / 32];
        uk_set_isa(0);
        uk_quantize_act(x, K, q0, d0, s0);
        uk_set_isa(isa);
        uk_quantize_act(x, K, q1, d1, s1);
        if (memcmp(q0, q1, K) || memcmp(d0, d1, sizeof d0) || memcmp(s0, s1, sizeof s0))
            fail(names[isa], "quantize_act", -1, 1);
        int16_t h0[K], h1[K];                          /* the 16-bit form (Q8_0 weights): bit-exact too */
        uk_set_isa(0);
        uk_quantize_act16(x, K, h0, d0);
        uk_set_isa(isa);
        uk_quantize_act16(x, K, h1, d1);
        if (memcmp(h0, h1, sizeof h0) || memcmp(d0, d1, sizeof d0)) fail(names[isa], "quantize_act16", -1, 1);
        for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
            const tdesc *td = &TYPES[t];
            random_weight(td, w, (int64_t)N * K / td->elems);
            uk_set_isa(0);
            uk_dequantize(td->type, w, deq0, (int64_t)N * K);
            uk_set_isa(isa);
            uk_dequantize(td->type, w, deq1, (int64_t)N * K);
            if (memcmp(deq0, deq1, sizeof(float) * N * K)) fail(names[isa], "dequantize", td->type, 1);
            for (int m = 1; m <= M; m += 4) {
                uk_set_isa(0);
                uk_gemm(td->type, w, N, K, x, m, K, y0, N, 0);
                uk_set_isa(isa);
                uk_gemm(td->type, w, N, K, x, m, K, y1, N, 0);
                const double e = rel_err(y1, y0, (int64_t)m * N);
                if (!(e < 2e-5)) fail(names[isa], "gemm", td->type, e);
                for (int64_t kk = K; td->type == 8 && kk >= 352; kk -= K - 352) {   /* mode 2, Q8_0 x int16: bits */
                    uk_set_isa(0);
                    uk_gemm(td->type, w, N, kk, x, m, kk, y0, N, 2);
                    uk_set_isa(isa);
                    uk_gemm(td->type, w, N, kk, x, m, kk, y1, N, 2);
                    if (memcmp(y0, y1, sizeof(float) * (size_t)(m * N))) fail(names[isa], "gemm bits", 8, 1);
                }
            }
            check_rows(names[isa], td, w, x, N, K, M, y0, y1);
            if (td->elems == 32) check_rows(names[isa], td, w, x, N, 352, M, y0, y1);   /* 3 blocks past 8 */
        }
        /* f32 weights and the row operators */
        float *wf = deq0, *o0 = deq1, *o1 = deq1 + M * K;
        for (int i = 0; i < N * K; i++) wf[i] = rndf();
        uk_set_isa(0);
        uk_gemm(0, wf, N, K, x, M, K, y0, N, 0);
        uk_set_isa(isa);
        uk_gemm(0, wf, N, K, x, M, K, y1, N, 0);
        if (!(rel_err(y1, y0, M * N) < 1e-5)) fail(names[isa], "gemm", 0, rel_err(y1, y0, M * N));
        for (int op = 0; op < 4; op++) {
            for (int pass = 0; pass < 2; pass++) {
                uk_set_isa(pass ? isa : 0);
                float *o = pass ? o1 : o0;
                if (op == 0) uk_rmsnorm(x, wf, o, M, K, 1e-6f, 1);
                if (op == 1) uk_softmax(x, o, M, K, 0.7f);
                if (op == 2) uk_glu(UK_ACT_SILU, x, K, x + K, K, o, M - 1, K);
                if (op == 3) uk_act(UK_ACT_GELU_TANH, x, o, (int64_t)M * K);
            }
            const int64_t n = (op == 2 ? M - 1 : M) * (int64_t)K;
            const double e = rel_err(o1, o0, n);
            if (!(e < 1e-6)) fail(names[isa], "op", op, e);
        }
    }
    printf("isa_check: %d SIMD ISA(s) against scalar, %d failure(s)\n", checked, failures);
    return failures ? 1 : 0;
}
