/* gemv.cu — decode products y[m, n] = x[m, :] . W[n, :] for M <= 8 activation rows, W kept in its GGUF encoding and
 * decoded in registers (dequantization fused into the product: the weights are read once, as stored).
 *
 * One warp per weight row (blockDim (32, WARPS)); lane l takes the row's units l, l + 32, ... (a unit is 32
 * values, decode.cuh), so the 32 lanes of a warp read 32 consecutive units of the row — one contiguous stretch of
 * the weight per step — and every activation row's 32 values beside them, staged in shared memory (gemv_rows);
 * the warp's partial sums meet in a shuffle tree. M is a template parameter: the M sums of a unit share its decoded values. Names: gemv_<type>_m<M>. */
#include "decode.cuh"

/* The activation rows come through decode.cuh's shared tile (uk_tile_rows), read once per block (its warps are
   GEMV_WARPS weight rows). Every thread of the block reaches every barrier (rows past n compute nothing). */
template <int T, int M>
__device__ __forceinline__ void gemv_rows(const uk_u8 *__restrict__ w, long long row_bytes, int n, int k,
                                          const float *__restrict__ x, long long ldx, float *__restrict__ y,
                                          long long ldy) {
    __shared__ float xs[M][UK_TILE_FLOATS];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    const bool live = row < n;
    const uk_u8 *wr = w + (long long)(live ? row : 0) * row_bytes;
    const long long units = k / 32;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    float q[32];
    for (long long u0 = 0; u0 < units; u0 += UK_TILE_UNITS) {
        const int step = units - u0 < UK_TILE_UNITS ? (int)(units - u0) : UK_TILE_UNITS;
        uk_tile_rows(&xs[0][0], x, ldx, M, u0, 32 * step, tid, nt);
        __syncthreads();
        if (live && threadIdx.x < step) {
            uk_row_unit(T, wr, u0 + threadIdx.x, q);
#pragma unroll
            for (int m = 0; m < M; m++) {
                const float *xm = xs[m] + threadIdx.x * UK_TILE_PAD;
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 32; i++) s += q[i] * xm[i];
                acc[m] += s;
            }
        }
        __syncthreads();
    }
    if (!live) return;
#pragma unroll
    for (int m = 0; m < M; m++) {
        float v = acc[m];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (threadIdx.x == 0) y[m * ldy + row] = v;
    }
}

/* y[s, row] = x[s / x_div] . W_e[row] for each (token, slot) pair s = blockIdx.y, e = idx[s] - e0 — the experts a
   router chose, in a bank of experts expert_bytes apart holding experts [e0, e1) (all of them, or one streamed
   piece); a pair whose expert is outside the bank is left to the piece that holds it. Gate and up read the token's
   row (x_div = top_k), down the pair's own row (x_div = 1). */
template <int T>
__device__ __forceinline__ void gemv_idx_rows(const uk_u8 *__restrict__ bank, long long expert_bytes,
                                              long long row_bytes, int n, int k, const float *__restrict__ x,
                                              long long ldx, int x_div, const int *__restrict__ idx, int e0, int e1,
                                              float *__restrict__ y, long long ldy) {
    const long long s = blockIdx.y;
    const int e = idx[s];
    if (e < e0 || e >= e1) return;
    gemv_rows<T, 1>(bank + (long long)(e - e0) * expert_bytes, row_bytes, n, k, x + (s / x_div) * ldx, ldx,
                    y + s * ldy, ldy);
}

#define UK_GEMV_IDX(name, T)                                                                                    \
    extern "C" __global__ void gemv_idx_##name(const uk_u8 *bank, long long expert_bytes, long long row_bytes,  \
                                               int n, int k, const float *x, long long ldx, int x_div,          \
                                               const int *idx, int e0, int e1, float *y, long long ldy) {       \
        gemv_idx_rows<T>(bank, expert_bytes, row_bytes, n, k, x, ldx, x_div, idx, e0, e1, y, ldy);               \
    }

#define UK_GEMV(name, T, M)                                                                                     \
    extern "C" __global__ void gemv_##name##_m##M(const uk_u8 *w, long long row_bytes, int n, int k,            \
                                                  const float *x, long long ldx, float *y, long long ldy) {     \
        gemv_rows<T, M>(w, row_bytes, n, k, x, ldx, y, ldy);                                                    \
    }
#define UK_GEMV_ALL(name, T) UK_GEMV(name, T, 1) UK_GEMV(name, T, 2) UK_GEMV(name, T, 4) UK_GEMV(name, T, 8) \
    UK_GEMV_IDX(name, T)

UK_GEMV_ALL(f32, UK_F32)
UK_GEMV_ALL(f16, UK_F16)
UK_GEMV_ALL(bf16, UK_BF16)
UK_GEMV_ALL(q4_0, UK_Q4_0)
UK_GEMV_ALL(q4_1, UK_Q4_1)
UK_GEMV_ALL(q5_0, UK_Q5_0)
UK_GEMV_ALL(q5_1, UK_Q5_1)
UK_GEMV_ALL(q8_0, UK_Q8_0)
UK_GEMV_ALL(q4_k, UK_Q4_K)
UK_GEMV_ALL(q5_k, UK_Q5_K)
UK_GEMV_ALL(q6_k, UK_Q6_K)
