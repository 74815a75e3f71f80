/* gemv.cu — decode products y[m, n] = x[m, :] . W[n, :] for M <= 8 activation rows, W kept in its GGUF encoding and
 * decoded in registers (dequantization fused into the product: the weights are read once, as stored).
 *
 * One warp per weight row (blockDim (32, UK_GEMV_WARPS)); lane l takes the row's units l, l + 32, ... (a unit is 32
 * values, decode.cuh). A step of 32 units is one contiguous stretch of the row: the warp copies it into shared
 * memory as aligned 4-byte words, consecutive lanes reading consecutive words (every load instruction one 128-byte
 * line), and each lane decodes its unit from there. Why not straight from global memory: a lane's unit is 18 to 64
 * bytes that the decoders read in 16-bit words, 32 lanes 18+ bytes apart — each of those loads touches several
 * lines, so the L1's line rate, not the memory, would bound the product at a fraction of the bandwidth. f32
 * rows (128 bytes a unit) would not fit the tile beside 8 activation rows and are read directly.
 * The partial sums meet in a shuffle tree. M is a template parameter: the M sums of a unit share its decoded values.
 *
 * Two forms. gemv_<type>_m<M> (every type) decodes the unit to floats and multiplies the activation rows, which reach
 * the lanes through decode.cuh's shared tile (uk_tile_rows): a float from shared memory per weight and activation row.
 * gemvq_<type>_m<M> (the block types) multiplies the unit's int8 words (decode.cuh's dot form) with the activation
 * rows quantized to int8 blocks (mmq.cu's quant_act, launched first: the CPU's integer path quantizes the same way)
 * by __dp4a, a unit pair's sum uk_unit_pair as the int8 GEMM's — 8 words of shared memory per unit and row instead of
 * 32 floats. Why both: a decode GEMV must read weights at the memory's rate, and on a GPU whose memory outruns its
 * shared-memory pipe (an H200: 4.8 TB/s against 132 SMs x 128 bytes a cycle) the float form's activation loads
 * alone take that pipe's every cycle at Q4's 0.56 bytes a weight; the int8 form takes a quarter of it. The lowering
 * runs gemvq_ on the block types; bench/bench_gpu.py measures both. */
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

/* The weight row of this thread's warp (one warp a row; rows past n are not live but reach every barrier), the
   thread's place in the block, the row's units and its type's block shape. */
struct uk_gemv_row {
    int row, tid, nt, per, bb;
    bool live;
    const uk_u8 *w;
    long long units;
};

__device__ __forceinline__ uk_gemv_row gemv_row(int t, const uk_u8 *w, long long row_bytes, int n, int k) {
    uk_gemv_row r;
    r.row = blockIdx.x * blockDim.y + threadIdx.y;
    r.tid = threadIdx.y * blockDim.x + threadIdx.x;
    r.nt = blockDim.x * blockDim.y;
    r.live = r.row < n;
    r.w = w + (long long)(r.live ? r.row : 0) * row_bytes;
    r.units = k / 32;
    r.per = uk_block_units(t);
    r.bb = uk_block_bytes(t);
    return r;
}

/* Units u0 .. u0 + step of the warp's row into its words (gemv_stage; where the first byte is, returned), nothing
   for a row past n or a type read directly (TILE 0). A k-quant row has whole super-blocks: u0 and step are
   multiples of per. */
template <int TILE>
__device__ __forceinline__ int gemv_stage_step(const uk_gemv_row &r, long long u0, int step, uk_u32 *words) {
    if (TILE == 0 || !r.live) return 0;
    return gemv_stage<(TILE / 4 + 1 + 31) / 32>(r.w, u0 / r.per * r.bb, (u0 + step) / r.per * r.bb, words);
}

/* The warp's M partial sums of its row added in a shuffle tree, lane 0 storing them. */
template <int M>
__device__ __forceinline__ void gemv_store(const float *acc, int row, float *__restrict__ y, long long ldy) {
#pragma unroll
    for (int m = 0; m < M; m++) {
        float v = acc[m];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (threadIdx.x == 0) y[m * ldy + row] = v;
    }
}

/* Every thread of the block reaches every barrier (rows past n compute nothing). */
template <int T, int M>
__device__ __forceinline__ void gemv_rows(const uk_u8 *__restrict__ w, long long row_bytes, int n, int k,
                                          const float *__restrict__ x, long long ldx, float *__restrict__ y,
                                          long long ldy) {
    constexpr int TILE = gemv_tile_bytes<T>();
    __shared__ float xs[M][UK_TILE_FLOATS];
    __shared__ uk_u32 ws[UK_GEMV_WARPS][TILE > 0 ? TILE / 4 + 2 : 1];
    const uk_gemv_row r = gemv_row(T, w, row_bytes, n, k);
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    float q[32];
    for (long long u0 = 0; u0 < r.units; u0 += UK_TILE_UNITS) {
        const int step = r.units - u0 < UK_TILE_UNITS ? (int)(r.units - u0) : UK_TILE_UNITS;
        uk_tile_rows(&xs[0][0], x, ldx, M, u0, 32 * step, r.tid, r.nt);
        const int lead = gemv_stage_step<TILE>(r, u0, step, ws[threadIdx.y]);
        __syncthreads();
        if (r.live && threadIdx.x < step) {
            if (TILE > 0)
                uk_unit(T, (const uk_u8 *)ws[threadIdx.y] + lead + threadIdx.x / r.per * r.bb, threadIdx.x % r.per,
                        q);
            else
                uk_row_unit(T, r.w, u0 + threadIdx.x, q);
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
    if (r.live) gemv_store<M>(acc, r.row, y, ldy);
}

/* gemv_rows with int8 activations (the file's head): qa the rows' int8 values (k apart), da and sa their blocks'
   d and s (k / 32 apart). The activation blocks of a step are staged UK_GEMVQ_WORDS words apart, so the 32 lanes
   reading word j of their units hit 32 different banks. */
#define UK_GEMVQ_WORDS 9
template <int T, int M>
__device__ __forceinline__ void gemvq_rows(const uk_u8 *__restrict__ w, long long row_bytes, int n, int k,
                                           const uk_i8 *__restrict__ qa, const float *__restrict__ da,
                                           const float *__restrict__ sa, float *__restrict__ y, long long ldy) {
    constexpr int TILE = gemv_tile_bytes<T>();
    __shared__ int aq[M][UK_TILE_UNITS][UK_GEMVQ_WORDS];
    __shared__ float ads[M][UK_TILE_UNITS][2];
    __shared__ uk_u32 ws[UK_GEMV_WARPS][TILE / 4 + 2];
    const uk_gemv_row r = gemv_row(T, w, row_bytes, n, k);
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    for (long long u0 = 0; u0 < r.units; u0 += UK_TILE_UNITS) {
        const int step = r.units - u0 < UK_TILE_UNITS ? (int)(r.units - u0) : UK_TILE_UNITS;
        for (int v = r.tid; v < M * step * 8; v += r.nt) {  /* consecutive threads, consecutive words of a row */
            const int a = v / (step * 8), at = v % (step * 8);
            aq[a][at / 8][at % 8] = ((const int *)(qa + a * (long long)k + 32 * u0))[at];
        }
        for (int v = r.tid; v < M * step; v += r.nt) {
            const int a = v / step, at = v % step;
            ads[a][at][0] = da[a * r.units + u0 + at];
            ads[a][at][1] = sa[a * r.units + u0 + at];
        }
        const int lead = gemv_stage_step<TILE>(r, u0, step, ws[threadIdx.y]);
        __syncthreads();
        if (r.live && threadIdx.x < step) {
            uk_u32 q[8];
            float sc[2], mn;
            uk_unit_dot_form(T, (const uk_u8 *)ws[threadIdx.y] + lead + threadIdx.x / r.per * r.bb,
                             threadIdx.x % r.per, q, sc, &mn);
#pragma unroll
            for (int m = 0; m < M; m++)
                acc[m] += uk_unit_pair((const int *)q, aq[m][threadIdx.x], sc, mn, ads[m][threadIdx.x][0],
                                       ads[m][threadIdx.x][1]);
        }
        __syncthreads();
    }
    if (r.live) gemv_store<M>(acc, r.row, y, ldy);
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

#define UK_GEMVQ(name, T, M)                                                                                    \
    extern "C" __global__ void gemvq_##name##_m##M(const uk_u8 *w, long long row_bytes, int n, int k,           \
                                                   const uk_i8 *qa, const float *da, const float *sa, float *y, \
                                                   long long ldy) {                                             \
        gemvq_rows<T, M>(w, row_bytes, n, k, qa, da, sa, y, ldy);                                               \
    }
/* gemv_idx_ on int8 activations: pair s reads quant_act's row s / x_div of qa (k apart; da and sa k / 32 apart) */
#define UK_GEMVQ_IDX(name, T)                                                                                   \
    extern "C" __global__ void gemvq_idx_##name(const uk_u8 *bank, long long expert_bytes, long long row_bytes, \
                                                int n, int k, const uk_i8 *qa, const float *da, const float *sa,  \
                                                int x_div, const int *idx, int e0, int e1, float *y,              \
                                                long long ldy) {                                                  \
        const long long s = blockIdx.y, a = s / x_div;                                                           \
        const int e = idx[s];                                                                                     \
        if (e < e0 || e >= e1) return;                                                                            \
        gemvq_rows<T, 1>(bank + (long long)(e - e0) * expert_bytes, row_bytes, n, k, qa + a * k,                 \
                         da + a * (k / 32), sa + a * (k / 32), y + s * ldy, ldy);                                 \
    }
#define UK_GEMV_BLOCKS(name, T) UK_GEMV_ALL(name, T) UK_GEMVQ(name, T, 1) UK_GEMVQ(name, T, 2) UK_GEMVQ(name, T, 4) \
    UK_GEMVQ(name, T, 8) UK_GEMVQ_IDX(name, T)

UK_GEMV_ALL(f32, UK_F32)
UK_GEMV_ALL(f16, UK_F16)
UK_GEMV_ALL(bf16, UK_BF16)
UK_GEMV_BLOCKS(q4_0, UK_Q4_0)
UK_GEMV_BLOCKS(q4_1, UK_Q4_1)
UK_GEMV_BLOCKS(q5_0, UK_Q5_0)
UK_GEMV_BLOCKS(q5_1, UK_Q5_1)
UK_GEMV_BLOCKS(q8_0, UK_Q8_0)
UK_GEMV_BLOCKS(q4_k, UK_Q4_K)
UK_GEMV_BLOCKS(q5_k, UK_Q5_K)
UK_GEMV_BLOCKS(q6_k, UK_Q6_K)
