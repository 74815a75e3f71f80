/* dequant.cu — weight rows (or a whole weight) to f32, bit for bit as uaii.kernels.dequantize: one thread per
 * 32-value unit, the decoders of decode.cuh, compiled with --fmad=false (no contraction of d * q + m). Used for the
 * Embedding rows a token selects and for weights a kernel reads as f32. Names: dequant_<type> (units from the
 * weight's start) and rows_<type> (the rows idx[0..r) of a weight of `units_per_row` units, row bytes apart; an id outside
 * [0, n_rows) writes zeros and the node's fault code). */
#include "decode.cuh"

#define UK_DEQUANT(name, T)                                                                                     \
    extern "C" __global__ void dequant_##name(const uk_u8 *w, long long units, float *y) {                     \
        const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;                                   \
        if (u < units) uk_row_unit(T, w, u, y + 32 * u);                                                        \
    }                                                                                                           \
    extern "C" __global__ void rows_##name(const uk_u8 *w, long long row_bytes, long long units_per_row,        \
                                           const int *idx, int r, float *y, long long n_rows, int *fault,       \
                                           int code) {                                                          \
        const long long u = (long long)blockIdx.x * blockDim.x + threadIdx.x;                                   \
        if (u >= units_per_row * r) return;                                                                     \
        const long long i = u / units_per_row, v = u % units_per_row, row = idx[i];                             \
        if (row < 0 || row >= n_rows) { /* a token id outside the table: zeros, and the run raises */           \
            *fault = code;                                                                                      \
            for (int j = 0; j < 32; j++) y[32 * u + j] = 0.0f;                                                  \
            return;                                                                                             \
        }                                                                                                       \
        uk_row_unit(T, w + row * row_bytes, v, y + 32 * u);                                                     \
    }

UK_DEQUANT(f32, UK_F32)
UK_DEQUANT(f16, UK_F16)
UK_DEQUANT(bf16, UK_BF16)
UK_DEQUANT(q4_0, UK_Q4_0)
UK_DEQUANT(q4_1, UK_Q4_1)
UK_DEQUANT(q5_0, UK_Q5_0)
UK_DEQUANT(q5_1, UK_Q5_1)
UK_DEQUANT(q8_0, UK_Q8_0)
UK_DEQUANT(q4_k, UK_Q4_K)
UK_DEQUANT(q5_k, UK_Q5_K)
UK_DEQUANT(q6_k, UK_Q6_K)
