/* mmq.cu — prefill products y[m, n] = x[m, :] . W[n, :] with int8 dot products (__dp4a) on W as stored.
 *
 * Why: a prefill batch multiplies each weight unit by many activation rows, so decoding it once into a tile of
 * shared memory and reusing it is what pays; with the activations quantized to int8 blocks as the CPU's integer
 * path quantizes them (quant_act: uk_quant_act_block — a product, a rounding and a division each, nothing a
 * contraction could change, so its bits are the CPU's), a pair of 32-value units costs 8 __dp4a and a few float
 * operations instead of 32 FMAs on decoded floats.
 *
 * quant_act: one thread per (row, 32-value block). mmq_<type>: a block of MMQ_THREADS (16 x 16) threads computes
 * MMQ_TILE (64) weight rows x MMQ_TILE activation rows; per stage it decodes MMQ_UNITS (4) units of each of its 64
 * weight rows into their integer form (decode.cuh: uk_row_unit_int; one (row, unit) per thread) and copies the
 * matching activation blocks, both into shared memory as 32-bit words (a lane per (row, unit), the units of a row
 * on neighbouring lanes); thread (tx, ty) then owns weight rows
 * ty + 16 i and activation rows tx + 16 j (i, j < 4: 16 accumulators) and adds uk_unit_pair of every pair. Rows past
 * n or m are loaded as zeros and never stored. mmq_idx_<type>: the same tiles over the rows each expert of a bank was
 * chosen for (a MoE prefill). */
#include "decode.cuh"

#define MMQ_TILE 64
#define MMQ_UNITS 4
#define MMQ_SIDE 16                     /* threads per side of a block: MMQ_SIDE x MMQ_SIDE */
#define MMQ_PER (MMQ_TILE / MMQ_SIDE)   /* rows of each kind per thread */
#define MMQ_WORDS 9  /* a unit's 8 words and a pad: the 16 activation rows a half-warp reads fall in 16 banks */

extern "C" __global__ void quant_act(const float *__restrict__ x, long long ldx, int m, int k, uk_i8 *__restrict__ q,
                                     float *__restrict__ d, float *__restrict__ s) {
    const long long nb = k / 32, i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)m * nb) return;
    const long long row = i / nb, b = i % nb;
    uk_quant_act_block(x + row * ldx + 32 * b, q + row * (long long)k + 32 * b, d + i, s + i);
}

/* The product of one tile; with ``list`` the tile's rows are a list's entries m0 .. (the rows an expert was chosen
   for): activation row list[c] / x_div, output row list[c] (mmq_idx_<type>); without, row c both. */
template <int T>
__device__ __forceinline__ void mmq_tile(const uk_u8 *__restrict__ w, long long row_bytes, int n, int k,
                                         const uk_i8 *__restrict__ qa, const float *__restrict__ da,
                                         const float *__restrict__ sa, int m, float *__restrict__ y, long long ldy,
                                         const int *__restrict__ list = nullptr, int x_div = 1) {
    __shared__ int wq[MMQ_UNITS][MMQ_TILE][MMQ_WORDS];  /* a unit's 32 int8 values as 8 words (and a pad) */
    __shared__ float wsc[MMQ_UNITS][MMQ_TILE][3];       /* sc[0], sc[1], mn */
    __shared__ int aq[MMQ_UNITS][MMQ_TILE][MMQ_WORDS];
    __shared__ float ads[MMQ_UNITS][MMQ_TILE][2];  /* d, s */
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * MMQ_SIDE + tx;
    const int n0 = blockIdx.x * MMQ_TILE, m0 = blockIdx.y * MMQ_TILE;
    const long long units = k / 32;
    float acc[MMQ_PER][MMQ_PER];
#pragma unroll
    for (int i = 0; i < MMQ_PER; i++)
#pragma unroll
        for (int j = 0; j < MMQ_PER; j++) acc[i][j] = 0.0f;
    for (long long u0 = 0; u0 < units; u0 += MMQ_UNITS) {
        {   /* thread tid loads (row r, unit v) of the weights and of the activations: a warp's lanes take 8 rows'
               4 consecutive units, so each load instruction reads 8 stretches of a row, not 32 rows apart */
            const int r = tid / MMQ_UNITS, v = tid % MMQ_UNITS;
            const long long u = u0 + v;
            uk_u32 q[8];
            float sc[2], mn = 0.0f;
            if (n0 + r < n && u < units) {
                uk_row_unit_int(T, w + (long long)(n0 + r) * row_bytes, u, q, sc, &mn);
            } else {
                for (int j = 0; j < 8; j++) q[j] = 0u;
                sc[0] = sc[1] = 0.0f;
            }
            for (int j = 0; j < 8; j++) wq[v][r][j] = (int)q[j];
            wsc[v][r][0] = sc[0];
            wsc[v][r][1] = sc[1];
            wsc[v][r][2] = mn;
            if (m0 + r < m && u < units) {
                const long long ar = list ? list[m0 + r] / x_div : m0 + r;
                const int *src = (const int *)(qa + ar * k + 32 * u);   /* 32-byte aligned */
                for (int j = 0; j < 8; j++) aq[v][r][j] = src[j];
                ads[v][r][0] = da[ar * units + u];
                ads[v][r][1] = sa[ar * units + u];
            } else {
                for (int j = 0; j < 8; j++) aq[v][r][j] = 0;
                ads[v][r][0] = ads[v][r][1] = 0.0f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int v = 0; v < MMQ_UNITS; v++) {
#pragma unroll
            for (int i = 0; i < MMQ_PER; i++) {
                const int r = ty + MMQ_SIDE * i;
                const float sc[2] = {wsc[v][r][0], wsc[v][r][1]};
                const float mn = wsc[v][r][2];
#pragma unroll
                for (int j = 0; j < MMQ_PER; j++) {
                    const int c = tx + MMQ_SIDE * j;
                    acc[i][j] += uk_unit_pair(wq[v][r], aq[v][c], sc, mn, ads[v][c][0], ads[v][c][1]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < MMQ_PER; i++)
#pragma unroll
        for (int j = 0; j < MMQ_PER; j++) {
            const int r = n0 + ty + MMQ_SIDE * i, c = m0 + tx + MMQ_SIDE * j;
            if (r < n && c < m) y[(long long)(list ? list[c] : c) * ldy + r] = acc[i][j];
        }
}

#define UK_MMQ(name, T)                                                                                         \
    extern "C" __global__ void __launch_bounds__(MMQ_SIDE * MMQ_SIDE)                                           \
        mmq_##name(const uk_u8 *w, long long row_bytes, int n, int k, const uk_i8 *qa, const float *da,         \
                   const float *sa, int m, float *y, long long ldy) {                                          \
        mmq_tile<T>(w, row_bytes, n, k, qa, da, sa, m, y, ldy);                                                 \
    }

/* The experts' products of a prefill, each expert's weights read once for all the rows that chose it: block
   (x, y, e) computes weight rows x * MMQ_TILE .. of expert e (bank + e * expert_bytes) for the entries y * MMQ_TILE ..
   of its list of (token, slot) pairs (moe_group: order[e * pairs ..], counts[e] of them); pair s reads activation row
   s / x_div (gate and up: the token's, x_div = top_k; down: the pair's own, 1) and writes output row s. */
#define UK_MMQ_IDX(name, T)                                                                                     \
    extern "C" __global__ void __launch_bounds__(MMQ_SIDE * MMQ_SIDE)                                           \
        mmq_idx_##name(const uk_u8 *bank, long long expert_bytes, long long row_bytes, int n, int k,            \
                       const uk_i8 *qa, const float *da, const float *sa, int x_div, const int *order,          \
                       const int *counts, int pairs, float *y, long long ldy) {                                 \
        const int e = blockIdx.z, m = counts[e];                                                                \
        if ((long long)blockIdx.y * MMQ_TILE >= m) return;                                                      \
        mmq_tile<T>(bank + e * expert_bytes, row_bytes, n, k, qa, da, sa, m, y, ldy,                            \
                    order + (long long)e * pairs, x_div);                                                       \
    }
#define UK_MMQ_BOTH(name, T) UK_MMQ(name, T) UK_MMQ_IDX(name, T)

UK_MMQ_BOTH(q4_0, UK_Q4_0)
UK_MMQ_BOTH(q4_1, UK_Q4_1)
UK_MMQ_BOTH(q5_0, UK_Q5_0)
UK_MMQ_BOTH(q5_1, UK_Q5_1)
UK_MMQ_BOTH(q8_0, UK_Q8_0)
UK_MMQ_BOTH(q4_k, UK_Q4_K)
UK_MMQ_BOTH(q5_k, UK_Q5_K)
UK_MMQ_BOTH(q6_k, UK_Q6_K)
