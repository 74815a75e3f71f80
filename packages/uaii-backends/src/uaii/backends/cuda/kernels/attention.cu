/* attention.cu — one decode step's attention: each row (a sequence) has one query of hq heads and its own KV cache
 * [slots, hkv, d] (f32 or f16), GQA (query head h reads kv head h / (hq / hkv)), slot positions k_pos (-1: empty), a
 * sliding window with sink tokens, soft-capping and per-head sink logits — the semantics of uk_attention_rows.
 * Three kernels (a fourth for a mask input), so that every stage is parallel over keys or values whatever the context:
 *   attn_scores  grid (ceil(s / 128), hkv * ceil(group / 8), rows): one thread per key (the keys staged in shared
 *                memory once for up to 8 heads of a GQA group): scale * q . k, capped, or -inf when hidden;
 *   attn_mask    (an Attention node's mask input) grid (ceil(s / 128), hq, rows): the mask added, or -inf where a
 *                bool mask is 0;
 *   attn_softmax grid (hq, rows), 256 threads: max, exp, sum (with the head's sink logit), normalized in place;
 *   attn_wsum    grid (splits, attn_scores' y, rows), 128 threads: per stretch of keys and up to 8 heads of a GQA
 *                group, a thread per output value: sum of p * v (attn_wsum_sum, grid (ceil(dv / 128), hq, rows),
 *                adds the stretches when there are several).
 * Scores live in a scratch [rows, hq, s_max]. Per-row arguments are device arrays (pointers, lengths, positions):
 * a prefill of n tokens of one sequence is n rows over the same cache, each masked by its own query position.
 * kv_store writes new keys or values into the rows' caches at the slots the tables say, f32 or f16 (rounded to
 * nearest even, as numpy's astype(float16) and the CPU's f16 cache do). */
#include "decode.cuh"

#define UK_ATTN_BLOCK 256
#define UK_NEG_INF (-__int_as_float(0x7f800000))  /* no math.h under NVRTC */

__device__ __forceinline__ float kv_at(const void *base, int f16, long long i) {
    return f16 ? uk_h2f(((const unsigned short *)base)[i]) : ((const float *)base)[i];
}

__device__ __forceinline__ int visible(int kp, int qp, int window, int n_sink) {
    return kp >= 0 && kp <= qp && !(window > 0 && qp - kp >= window && kp >= n_sink);
}

#define UK_ATTN_KEYS 128  /* geometry.ATTN_KEYS: the block's threads and keys */
#define UK_ATTN_DIMS 32
#define UK_ATTN_HEADS 8   /* geometry.ATTN_HEADS: query heads per block */

/* The query heads of block row y of attn_scores and attn_wsum: up to UK_ATTN_HEADS heads of one GQA group, y = kv
   head * parts + which UK_ATTN_HEADS of its hq / hkv heads; *kh its kv head, *h0 its first head, *heads how many. */
__device__ __forceinline__ void attn_heads(int y, int hq, int hkv, int *kh, int *h0, int *heads) {
    const int group = hq / hkv, parts = (group + UK_ATTN_HEADS - 1) / UK_ATTN_HEADS, first = y % parts * UK_ATTN_HEADS;
    *kh = y / parts;
    *h0 = *kh * group + first;
    *heads = group - first < UK_ATTN_HEADS ? group - first : UK_ATTN_HEADS;
}

/* Block (b, y, row) scores keys b * UK_ATTN_KEYS .. + UK_ATTN_KEYS, a thread per key, for the query heads of block
   row y (attn_heads: up to UK_ATTN_HEADS heads of one GQA group): the group's heads read the same keys, so the keys
   are loaded once for all of them. The keys reach the threads through shared memory, UK_ATTN_DIMS dimensions at a
   time: a warp loads one key's dimensions per instruction (consecutive lanes,
   consecutive values), where each thread reading its own key straight from the cache would make every load
   instruction touch 32 lines; the heads' queries are staged beside them. Every thread reaches every barrier (keys
   past used[row] load nothing). */
extern "C" __global__ void attn_scores(const float *q, const void *const *k_cache, const int *kv_f16,
                                       const long long *used, const int *q_pos, const int *const *k_pos, int hq,
                                       int hkv, int d, float scale, float softcap, int window, int n_sink,
                                       float *scores, long long s_max) {
    __shared__ float tile[UK_ATTN_KEYS][UK_ATTN_DIMS + 1];
    __shared__ float qs[UK_ATTN_HEADS][UK_ATTN_DIMS];
    const int row = blockIdx.z;
    int kh, h0, heads;
    attn_heads(blockIdx.y, hq, hkv, &kh, &h0, &heads);
    const long long first = (long long)blockIdx.x * UK_ATTN_KEYS, t = first + threadIdx.x, s = used[row];
    const int f16 = kv_f16[row];
    const void *cache = k_cache[row];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float acc[UK_ATTN_HEADS];
#pragma unroll
    for (int i = 0; i < UK_ATTN_HEADS; i++) acc[i] = 0.0f;
    for (int e0 = 0; e0 < d; e0 += UK_ATTN_DIMS) {
        const int dims = d - e0 < UK_ATTN_DIMS ? d - e0 : UK_ATTN_DIMS;
        /* warp w's keys w, w + 4, ... in two halves, each half's loads issued before its stores: all 32 at once
           took every register ptxas has (255, two blocks an SM), 16 take 66 */
#pragma unroll 1
        for (int b = 0; b < UK_ATTN_KEYS / 4; b += UK_ATTN_KEYS / 8) {
            float v[UK_ATTN_KEYS / 8];
#pragma unroll
            for (int j = 0; j < UK_ATTN_KEYS / 8; j++) {
                const long long tk = first + warp + 4 * (b + j);
                v[j] = lane < dims && tk < s ? kv_at(cache, f16, (tk * hkv + kh) * d + e0 + lane) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < UK_ATTN_KEYS / 8; j++) tile[warp + 4 * (b + j)][lane] = v[j];
        }
        for (int i = threadIdx.x; i < UK_ATTN_HEADS * UK_ATTN_DIMS; i += UK_ATTN_KEYS) {
            const int hh = i / UK_ATTN_DIMS, e = i % UK_ATTN_DIMS;
            qs[hh][e] = hh < heads && e < dims ? q[((long long)row * hq + h0 + hh) * d + e0 + e] : 0.0f;
        }
        __syncthreads();
        if (t < s)
            for (int e = 0; e < dims; e++) {
                const float k = tile[threadIdx.x][e];
#pragma unroll
                for (int i = 0; i < UK_ATTN_HEADS; i++) acc[i] += qs[i][e] * k;
            }
        __syncthreads();
    }
    if (t >= s) return;
    const int shown = visible(k_pos[row][t], q_pos[row], window, n_sink);
#pragma unroll
    for (int i = 0; i < UK_ATTN_HEADS; i++) {
        if (i >= heads) break;
        float l = acc[i] * scale;
        if (softcap > 0.0f) l = softcap * tanhf(l / softcap);
        scores[((long long)row * hq + h0 + i) * s_max + t] = shown ? l : UK_NEG_INF;
    }
}

/* an Attention node's mask input on the scores, after the cap as the reference applies it: additive (f32) adds its
   value, a bool (i32 0/1) hides the key where 0; a key already hidden stays so (-inf, not -inf + mask). The mask
   value of (row, h, t) is mask[row_off[row] + h * h_stride + t * key_stride]: the host's per-row offsets and the
   broadcast strides (0 along a broadcast dim) of any mask shape that broadcasts to [..., heads, seq, keys] */
extern "C" __global__ void attn_mask(float *scores, const long long *used, const void *mask, int additive,
                                     const long long *row_off, long long h_stride, long long key_stride, int hq,
                                     long long s_max) {
    const int row = blockIdx.z, h = blockIdx.y;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= used[row]) return;
    float *out = scores + ((long long)row * hq + h) * s_max + t;
    if (*out == UK_NEG_INF) return;
    const long long at = row_off[row] + h * h_stride + t * key_stride;
    if (additive) *out += ((const float *)mask)[at];
    else if (((const int *)mask)[at] == 0) *out = UK_NEG_INF;
}

extern "C" __global__ void attn_softmax(float *scores, const long long *used, const float *sinks, int hq,
                                        long long s_max) {
    __shared__ float shared[UK_ATTN_BLOCK / 32];
    const int row = blockIdx.y, h = blockIdx.x;
    const long long s = used[row];
    float *p = scores + ((long long)row * hq + h) * s_max;
    float mx = sinks ? sinks[h] : UK_NEG_INF;
    for (long long t = threadIdx.x; t < s; t += UK_ATTN_BLOCK) mx = fmaxf(mx, p[t]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_down_sync(0xffffffffu, mx, off));
    if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = shared[0];
        for (int w = 1; w < UK_ATTN_BLOCK / 32; w++) m = fmaxf(m, shared[w]);
        shared[0] = m;
    }
    __syncthreads();
    mx = shared[0];
    __syncthreads();
    float sum = 0.0f;
    for (long long t = threadIdx.x; t < s; t += UK_ATTN_BLOCK) {
        const float e = p[t] == UK_NEG_INF ? 0.0f : expf(p[t] - mx);
        p[t] = e;
        sum += e;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
    if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = sinks ? expf(sinks[h] - mx) : 0.0f;
        for (int w = 0; w < UK_ATTN_BLOCK / 32; w++) total += shared[w];
        shared[0] = total > 0.0f ? 1.0f / total : 0.0f;   /* nothing visible: zeros, as the CPU gives */
    }
    __syncthreads();
    const float inv = shared[0];
    for (long long t = threadIdx.x; t < s; t += UK_ATTN_BLOCK) p[t] *= inv;
}

/* out[row, h, :] = sum over keys of p * v for up to UK_ATTN_HEADS query heads of one GQA group (block row y as in
   attn_scores: the group's heads weigh the same values, loaded once), the keys cut into `splits` stretches of
   ceil(s_max / splits): block (j, y, row) sums stretch j, a thread per output value (consecutive threads on
   consecutive values of a cache row). One stretch (splits = 1) writes out [rows, hq, dv]; more write partial sums
   [rows, hq, splits, dv] there, which attn_wsum_sum adds in stretch order (no atomics: the same bits every run).
   Why stretches: a decode step has one row, so without them a few blocks would each walk every key of the context
   in one long chain. A key whose weight is 0 adds nothing (its value, maybe an empty slot's, is never used). */
extern "C" __global__ void attn_wsum(const float *scores, const void *const *v_cache, const int *kv_f16,
                                     const long long *used, int hq, int hkv, int dv, long long s_max, int splits,
                                     float *out) {
    const int row = blockIdx.z, j = blockIdx.x;
    int kh, h0, heads;
    attn_heads(blockIdx.y, hq, hkv, &kh, &h0, &heads);
    const long long s = used[row], chunk = (s_max + splits - 1) / splits;
    const long long t0 = j * chunk, t1 = t0 + chunk < s ? t0 + chunk : s;
    const int f16 = kv_f16[row];
    const void *cache = v_cache[row];
    const float *p = scores + ((long long)row * hq + h0) * s_max;
    for (int e = threadIdx.x; e < dv; e += blockDim.x) {
        float acc[UK_ATTN_HEADS];
#pragma unroll
        for (int i = 0; i < UK_ATTN_HEADS; i++) acc[i] = 0.0f;
        for (long long t = t0; t < t1; t++) {
            const float x = kv_at(cache, f16, (t * hkv + kh) * dv + e);
#pragma unroll
            for (int i = 0; i < UK_ATTN_HEADS; i++) {
                const float w = i < heads ? p[i * s_max + t] : 0.0f;
                if (w != 0.0f) acc[i] += w * x;
            }
        }
#pragma unroll
        for (int i = 0; i < UK_ATTN_HEADS; i++)
            if (i < heads) out[(((long long)row * hq + h0 + i) * splits + j) * dv + e] = acc[i];
    }
}

/* out[row, h, e] = the sum of attn_wsum's `splits` partial sums, in stretch order; one thread per output value */
extern "C" __global__ void attn_wsum_sum(const float *partial, int hq, int dv, int splits, float *out) {
    const int row = blockIdx.z, h = blockIdx.y;
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= dv) return;
    const float *p = partial + ((long long)row * hq + h) * splits * dv + e;
    float acc = 0.0f;
    for (int j = 0; j < splits; j++) acc += p[(long long)j * dv];
    out[((long long)row * hq + h) * dv + e] = acc;
}

/* The new keys (or values) of every row into its cache: x's rows (ldx apart, width values each: a [slots, hkv, d]
   cache has width = hkv * d) into row r's table entries — cache[r], f16 flag kv_f16[r] — at slot
   used[r] - seq_rows + r % seq_rows: a prefill's rows (seq_rows = rows) share one cache and follow each other up to
   its new length, a batch's rows (seq_rows = 1) are one token each. Everything a run changes is read from the
   tables, so the launch is the same every step (a CUDA graph replays it). One thread per value. */
extern "C" __global__ void kv_store(const float *x, long long ldx, int rows, int width, void *const *cache,
                                    const long long *used, const int *kv_f16, int seq_rows) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * width) return;
    const long long r = i / width, c = i % width;
    const long long at = (used[r] - seq_rows + r % seq_rows) * width + c;
    const float v = x[r * ldx + c];
    if (kv_f16[r]) ((unsigned short *)cache[r])[at] = uk_f2h(v);
    else ((float *)cache[r])[at] = v;
}
