/* attention.cu — one decode step's attention: each row (a sequence) has one query of hq heads and its own KV cache
 * [slots, hkv, d] (f32 or f16), GQA (query head h reads kv head h / (hq / hkv)), slot positions k_pos (-1: empty), a
 * sliding window with sink tokens, soft-capping and per-head sink logits — the semantics of uk_attention_rows.
 * Two forms. Without a mask input, two kernels (attn_flash + attn_flash_sum, below): each block walks its stretch of
 * keys a tile at a time with a running maximum and sum (the scores never leave the SM). With one, four (five), so
 * that the mask applies to materialized scores and every stage is parallel over keys or values:
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

/* The logits of key first + threadIdx.x for the query heads h0 .. h0 + heads (up to UK_ATTN_HEADS heads of one GQA
   group, kv head kh) of row `row` into l[]: scale * q . k, capped, or -inf where the key is hidden or past s (the
   row's used keys). The group's heads read the same keys, so the keys are loaded once for all of them. The keys
   reach the threads through shared memory, UK_ATTN_DIMS dimensions at a time: a warp loads one key's dimensions
   per instruction (consecutive lanes, consecutive values), where each thread reading its own key straight from the
   cache would make every load instruction touch 32 lines; the heads' queries are staged beside them. Every thread
   of the block (UK_ATTN_KEYS of them) reaches every barrier (keys past s load nothing). */
__device__ __forceinline__ void attn_tile_logits(const float *q, long long row, const void *cache, int f16,
                                                 const int *kp, int qp, long long s, long long first, int hq, int hkv,
                                                 int d, int kh, int h0, int heads, float scale, float softcap,
                                                 int window, int n_sink, float *l) {
    __shared__ float tile[UK_ATTN_KEYS][UK_ATTN_DIMS + 1];
    __shared__ float qs[UK_ATTN_HEADS][UK_ATTN_DIMS];
    const long long t = first + threadIdx.x;
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
            qs[hh][e] = hh < heads && e < dims ? q[(row * hq + h0 + hh) * d + e0 + e] : 0.0f;
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
    const int shown = t < s && visible(kp[t], qp, window, n_sink);
#pragma unroll
    for (int i = 0; i < UK_ATTN_HEADS; i++) {
        float x = acc[i] * scale;
        if (softcap > 0.0f) x = softcap * tanhf(x / softcap);
        l[i] = shown ? x : UK_NEG_INF;
    }
}

/* Block (b, y, row) scores keys b * UK_ATTN_KEYS .. + UK_ATTN_KEYS, a thread per key, for the query heads of block
   row y (attn_heads) into scores[row, h, t]. (Written as a loop of one tile, as attn_flash's loop over its tiles:
   straight-line, ptxas kept every key load's address for the whole kernel, 224 registers; as a loop, 78.) */
extern "C" __global__ void attn_scores(const float *q, const void *const *k_cache, const int *kv_f16,
                                       const long long *used, const int *q_pos, const int *const *k_pos, int hq,
                                       int hkv, int d, float scale, float softcap, int window, int n_sink,
                                       float *scores, long long s_max) {
    const int row = blockIdx.z;
    int kh, h0, heads;
    attn_heads(blockIdx.y, hq, hkv, &kh, &h0, &heads);
    const long long s = used[row], mine = (long long)blockIdx.x * UK_ATTN_KEYS + UK_ATTN_KEYS;
    for (long long first = mine - UK_ATTN_KEYS; first < s && first < mine; first += UK_ATTN_KEYS) {
        float l[UK_ATTN_HEADS];
        attn_tile_logits(q, row, k_cache[row], kv_f16[row], k_pos[row], q_pos[row], s, first, hq, hkv, d, kh, h0,
                         heads, scale, softcap, window, n_sink, l);
        const long long t = first + threadIdx.x;
        if (t < s)
#pragma unroll
            for (int i = 0; i < UK_ATTN_HEADS; i++)
                if (i < heads) scores[((long long)row * hq + h0 + i) * s_max + t] = l[i];
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

/* Block (j, y, row) of attn_wsum and attn_flash: its row, the query heads of block row y (attn_heads) and stretch j
   of the keys, [t0, t1): ceil(s_max / splits) keys, cut at the row's used keys. */
struct uk_attn_block {
    int row, kh, h0, heads;
    long long t0, t1;
};

__device__ __forceinline__ uk_attn_block attn_block(int hq, int hkv, const long long *used, long long s_max,
                                                    int splits) {
    uk_attn_block b;
    b.row = blockIdx.z;
    attn_heads(blockIdx.y, hq, hkv, &b.kh, &b.h0, &b.heads);
    const long long s = used[b.row], chunk = (s_max + splits - 1) / splits;
    b.t0 = blockIdx.x * chunk;
    b.t1 = b.t0 + chunk < s ? b.t0 + chunk : s;
    return b;
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
    const uk_attn_block b = attn_block(hq, hkv, used, s_max, splits);
    const int row = b.row, j = blockIdx.x, kh = b.kh, h0 = b.h0, heads = b.heads;
    const long long t0 = b.t0, t1 = b.t1;
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

/* --- one kernel for scores, softmax and weighted sum (no mask input) -------------------------------------------
   attn_flash: block (j, y, row), UK_ATTN_KEYS threads, the heads of block row y (attn_heads) over stretch j of the
   keys (ceil(s_max / splits) of them, as attn_wsum's), a tile of UK_ATTN_KEYS keys at a time: the tile's logits
   (attn_tile_logits), each head's running maximum m and sum l of exp(logit - m) updated by the tile (the sums so
   far scaled by exp(m_old - m_new)), and the weighted values, a thread per output value (UK_FLASH_VALUES of them a
   thread: dv <= UK_ATTN_KEYS * UK_FLASH_VALUES), into partial[row, h, j] = (acc[0 .. dv), m, l). attn_flash_sum,
   grid (ceil(dv / UK_ATTN_KEYS), hq, rows): the stretches (and the head's sink logit) combined under their common
   maximum, in stretch order. The same numbers as attn_scores + attn_softmax + attn_wsum up to rounding, without the
   scores' round trip through device memory and with two launches for four. */
#define UK_FLASH_VALUES 2

/* x[i] of every head i replaced by the block's maximum (sum: total) of it, in every thread: a shuffle tree per
   warp, then the warps' results in order (the same bits every run) */
__device__ __forceinline__ void attn_block_reduce(float *x, int sum, float (*red)[UK_ATTN_KEYS / 32]) {
#pragma unroll
    for (int i = 0; i < UK_ATTN_HEADS; i++) {
        float v = x[i];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float o = __shfl_down_sync(0xffffffffu, v, off);
            v = sum ? v + o : fmaxf(v, o);
        }
        if (threadIdx.x % 32 == 0) red[i][threadIdx.x / 32] = v;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < UK_ATTN_HEADS; i++) {
        float r = red[i][0];
        for (int w = 1; w < UK_ATTN_KEYS / 32; w++) r = sum ? r + red[i][w] : fmaxf(r, red[i][w]);
        x[i] = r;
    }
    __syncthreads();
}

extern "C" __global__ void attn_flash(const float *q, const void *const *k_cache, const void *const *v_cache,
                                      const int *kv_f16, const long long *used, const int *q_pos,
                                      const int *const *k_pos, int hq, int hkv, int d, int dv, float scale,
                                      float softcap, int window, int n_sink, long long s_max, int splits,
                                      float *partial) {
    __shared__ float p[UK_ATTN_HEADS][UK_ATTN_KEYS];
    __shared__ float red[UK_ATTN_HEADS][UK_ATTN_KEYS / 32];
    __shared__ float ms[UK_ATTN_HEADS], mt[UK_ATTN_HEADS], ls[UK_ATTN_HEADS];  /* each head's m, its next, l */
    const uk_attn_block b = attn_block(hq, hkv, used, s_max, splits);
    const int row = b.row, j = blockIdx.x, kh = b.kh, h0 = b.h0, heads = b.heads;
    const long long t0 = b.t0, t1 = b.t1;
    const int f16 = kv_f16[row];
    const void *vc = v_cache[row];
    float acc[UK_ATTN_HEADS][UK_FLASH_VALUES];
#pragma unroll
    for (int i = 0; i < UK_ATTN_HEADS; i++)
#pragma unroll
        for (int c = 0; c < UK_FLASH_VALUES; c++) acc[i][c] = 0.0f;
    if (threadIdx.x < UK_ATTN_HEADS) {
        ms[threadIdx.x] = UK_NEG_INF;
        ls[threadIdx.x] = 0.0f;
    }
    __syncthreads();  /* an empty stretch writes them at once (the host model's threads caught the race) */
    for (long long first = t0; first < t1; first += UK_ATTN_KEYS) {
        float l[UK_ATTN_HEADS], x[UK_ATTN_HEADS];
        attn_tile_logits(q, row, k_cache[row], f16, k_pos[row], q_pos[row], t1, first, hq, hkv, d, kh, h0, heads,
                         scale, softcap, window, n_sink, l);
#pragma unroll
        for (int i = 0; i < UK_ATTN_HEADS; i++) x[i] = l[i];
        attn_block_reduce(x, 0, red);  /* x[i]: the tile's maximum of head i */
#pragma unroll
        for (int i = 0; i < UK_ATTN_HEADS; i++) {
            const float top = fmaxf(ms[i], x[i]);
            const float keep = ms[i] == UK_NEG_INF ? 0.0f : expf(ms[i] - top);  /* the sums so far, rescaled */
            x[i] = l[i] == UK_NEG_INF ? 0.0f : expf(l[i] - top);
            p[i][threadIdx.x] = x[i];
#pragma unroll
            for (int c = 0; c < UK_FLASH_VALUES; c++) acc[i][c] *= keep;
            if (threadIdx.x == 0) mt[i] = top;
        }
        attn_block_reduce(x, 1, red);  /* x[i]: the tile's sum of head i; every thread is done reading ms */
        if (threadIdx.x == 0)
            for (int i = 0; i < UK_ATTN_HEADS; i++) {
                ls[i] = ls[i] * (ms[i] == UK_NEG_INF ? 0.0f : expf(ms[i] - mt[i])) + x[i];
                ms[i] = mt[i];
            }
        __syncthreads();
        const int keys = t1 - first < UK_ATTN_KEYS ? (int)(t1 - first) : UK_ATTN_KEYS;
#pragma unroll
        for (int c = 0; c < UK_FLASH_VALUES; c++) {
            const int e = threadIdx.x + UK_ATTN_KEYS * c;
            if (e >= dv) break;
            for (int tt = 0; tt < keys; tt++) {
                const float x = kv_at(vc, f16, ((first + tt) * hkv + kh) * dv + e);
#pragma unroll
                for (int i = 0; i < UK_ATTN_HEADS; i++) {
                    const float w = i < heads ? p[i][tt] : 0.0f;
                    if (w != 0.0f) acc[i][c] += w * x;  /* a hidden key's value (maybe an empty slot's) is unused */
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < UK_ATTN_HEADS; i++) {
        if (i >= heads) break;
        float *out = partial + (((long long)row * hq + h0 + i) * splits + j) * (dv + 2);
#pragma unroll
        for (int c = 0; c < UK_FLASH_VALUES; c++) {
            const int e = threadIdx.x + UK_ATTN_KEYS * c;
            if (e < dv) out[e] = acc[i][c];
        }
        if (threadIdx.x == 0) {
            out[dv] = ms[i];
            out[dv + 1] = ls[i];
        }
    }
}

/* out[row, h, e]: attn_flash's stretches of (row, h) under their common maximum M (and the head's sink logit, which
   takes part in the sum, not in the values): sum_j acc_j exp(m_j - M) / (sum_j l_j exp(m_j - M) + exp(sink - M));
   zeros where no key is visible and there is no sink, as the CPU gives. */
extern "C" __global__ void attn_flash_sum(const float *partial, const float *sinks, int hq, int dv, int splits,
                                          float *out) {
    const int row = blockIdx.z, h = blockIdx.y;
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= dv) return;
    const float *p = partial + ((long long)row * hq + h) * splits * (dv + 2);
    float top = sinks ? sinks[h] : UK_NEG_INF;
    for (int j = 0; j < splits; j++) top = fmaxf(top, p[(long long)j * (dv + 2) + dv]);
    float value = 0.0f, total = sinks ? expf(sinks[h] - top) : 0.0f;
    if (top != UK_NEG_INF)
        for (int j = 0; j < splits; j++) {
            const float *pj = p + (long long)j * (dv + 2);
            if (pj[dv] == UK_NEG_INF) continue;  /* a stretch with nothing visible */
            const float w = expf(pj[dv] - top);
            value += pj[e] * w;
            total += pj[dv + 1] * w;
        }
    out[((long long)row * hq + h) * dv + e] = total > 0.0f ? value / total : 0.0f;
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
