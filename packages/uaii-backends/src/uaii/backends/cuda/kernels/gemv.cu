/* gemv.cu — decode products y[m, n] = x[m, :] . W[n, :] for M <= 8 activation rows, W kept in its GGUF encoding and
 * decoded in registers (dequantization fused into the product: the weights are read once, as stored).
 *
 * One warp per weight row (blockDim (32, UK_GEMV_WARPS)); lane l takes the row's units l, l + 32, ... (a unit is 32
 * values, decode.cuh). A step of 32 units is one contiguous stretch of the row: the warp copies it into shared
 * memory as aligned 4-byte words, consecutive lanes reading consecutive words (every load instruction one 128-byte
 * line), and each lane decodes its unit from there. Why not straight from global memory: a lane's unit is 18 to 64
 * bytes that the decoders read byte by byte, 32 lanes 18+ bytes apart — each of those byte loads touches five or
 * more lines, so the L1's line rate, not the memory, would bound the product at a fraction of the bandwidth. f32
 * rows (128 bytes a unit) would not fit the tile beside 8 activation rows and are read directly.
 * The activation rows come through decode.cuh's shared tile (uk_tile_rows); the partial sums meet in a shuffle tree.
 * M is a template parameter: the M sums of a unit share its decoded values. Names: gemv_<type>_m<M>. */
#include "decode.cuh"

#define UK_GEMV_WARPS 4  /* geometry.GEMV_WARPS: the block is (32, UK_GEMV_WARPS) */

/* bytes of 32 units of a row of type T (32 blocks, or 4 k-quant super-blocks); 0: read directly (f32) */
template <int T>
constexpr int gemv_tile_bytes() {
    return T == UK_F32 ? 0 : T == UK_F16 || T == UK_BF16 ? 2048 : T == UK_Q4_0 ? 576 : T == UK_Q4_1 ? 640
        : T == UK_Q5_0 ? 704 : T == UK_Q5_1 ? 768 : T == UK_Q8_0 ? 1088 : T == UK_Q4_K ? 576 : T == UK_Q5_K ? 704
        : 840;                                                /* UK_Q6_K */
}

/* Bytes [b0, b1) of the row into this warp's words (the aligned words that hold them: the first at `lead` bytes
   in), read by the warp's 32 lanes together: each lane's WORDS loads are issued before any store, so a warp has
   its whole stretch in flight at once. Each word read holds at least one byte of the stretch, so no read leaves
   the weight's allocation. */
template <int WORDS>
__device__ __forceinline__ int gemv_stage(const uk_u8 *__restrict__ row, long long b0, long long b1, uk_u32 *words) {
    const unsigned long long at = (unsigned long long)(row + b0);
    const uk_u32 *aligned = (const uk_u32 *)(at & ~3ull);
    const int lead = (int)(at & 3ull), count = (int)((lead + (b1 - b0) + 3) / 4);
    uk_u32 v[WORDS];
#pragma unroll
    for (int j = 0; j < WORDS; j++) {
        const int i = threadIdx.x + 32 * j;
        v[j] = i < count ? aligned[i] : 0u;
    }
#pragma unroll
    for (int j = 0; j < WORDS; j++) {
        const int i = threadIdx.x + 32 * j;
        if (i < count) words[i] = v[j];
    }
    return lead;
}

/* Every thread of the block reaches every barrier (rows past n compute nothing). */
template <int T, int M>
__device__ __forceinline__ void gemv_rows(const uk_u8 *__restrict__ w, long long row_bytes, int n, int k,
                                          const float *__restrict__ x, long long ldx, float *__restrict__ y,
                                          long long ldy) {
    constexpr int TILE = gemv_tile_bytes<T>();
    __shared__ float xs[M][UK_TILE_FLOATS];
    __shared__ uk_u32 ws[UK_GEMV_WARPS][TILE > 0 ? TILE / 4 + 2 : 1];
    const int row = blockIdx.x * blockDim.y + threadIdx.y;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    const bool live = row < n;
    const uk_u8 *wr = w + (long long)(live ? row : 0) * row_bytes;
    const long long units = k / 32;
    const int per = uk_block_units(T), bb = uk_block_bytes(T);
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    float q[32];
    for (long long u0 = 0; u0 < units; u0 += UK_TILE_UNITS) {
        const int step = units - u0 < UK_TILE_UNITS ? (int)(units - u0) : UK_TILE_UNITS;
        uk_tile_rows(&xs[0][0], x, ldx, M, u0, 32 * step, tid, nt);
        int lead = 0;
        if (TILE > 0 && live)  /* a k-quant row has whole super-blocks: u0 and step are multiples of per */
            lead = gemv_stage<(TILE / 4 + 1 + 31) / 32>(wr, u0 / per * bb, (u0 + step) / per * bb, ws[threadIdx.y]);
        __syncthreads();
        if (live && threadIdx.x < step) {
            if (TILE > 0)
                uk_unit(T, (const uk_u8 *)ws[threadIdx.y] + lead + threadIdx.x / per * bb, threadIdx.x % per, q);
            else
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
