/* ops.cu — the row operators of a decoder step: RMSNorm (and the residual add fused before it), LayerNorm, SwiGLU,
 * GeGLU, RoPE, elementwise add, a sum or product with a broadcast row or column (a bias, a scale, a gate), the
 * unary activations and row copies (Split / Concat / Slice along the last axis), f32. Reductions are block-wide trees (their order differs from the CPU's: results agree to
 * rounding, as any two backends do); the transcendental functions are the accurate ones (expf, sincosf), not the
 * __-prefixed approximations. */
#include "decode.cuh"

#define UK_BLOCK 256

/* the sum of v over the block (blockDim.x == UK_BLOCK), for every thread */
__device__ __forceinline__ float block_sum(float v, float *shared) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = threadIdx.x < UK_BLOCK / 32 ? shared[threadIdx.x] : 0.0f;
    if (warp == 0) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    const float total = shared[0];
    __syncthreads();
    return total;
}

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * (w or 1 + w); one block per row; with res, x[r] = a[r] + res[r] first
   (written to sum when given: the residual stream goes on) */
__device__ __forceinline__ void rms_row(const float *a, const float *res, float *sum, const float *w, float *y,
                                        int n, float eps, int unit_offset) {
    __shared__ float shared[UK_BLOCK / 32];
    const long long r = blockIdx.x;
    a += r * n;
    y += r * n;
    if (res) res += r * n;
    if (sum) sum += r * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += UK_BLOCK) {
        const float v = res ? a[i] + res[i] : a[i];
        if (sum) sum[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, shared) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += UK_BLOCK) {   /* the sum as written: right when sum aliases a or res */
        const float v = sum ? sum[i] : res ? a[i] + res[i] : a[i];
        y[i] = v * inv * (unit_offset ? 1.0f + w[i] : w[i]);
    }
}

extern "C" __global__ void rms_norm(const float *x, const float *w, float *y, int n, float eps, int unit_offset) {
    rms_row(x, 0, 0, w, y, n, eps, unit_offset);
}

extern "C" __global__ void add_rms_norm(const float *a, const float *res, float *sum, const float *w, float *y, int n,
                                        float eps, int unit_offset) {
    rms_row(a, res, sum, w, y, n, eps, unit_offset);
}

/* y = silu(g) * u over count values; g and u are strided views (a fused [gate | up] row: ld = 2 ff) */
extern "C" __global__ void swiglu(const float *g, const float *u, long long ld, int ff, long long count, float *y) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const long long r = i / ff, c = i % ff;
    const float a = g[r * ld + c];
    y[i] = a / (1.0f + expf(-a)) * u[r * ld + c];
}

/* y = gelu(g) * u over count values, strided as swiglu's; gelu exact (erff) or its tanh approximation */
extern "C" __global__ void geglu(const float *g, const float *u, long long ld, int ff, long long count, float *y,
                                 int tanh_approx) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const long long r = i / ff, c = i % ff;
    const float a = g[r * ld + c];
    const float act = tanh_approx ? 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a)))
                                  : 0.5f * a * (1.0f + erff(a * 0.7071067811865476f));
    y[i] = act * u[r * ld + c];
}

/* y[i] = a[i] op b[(i / inner) % nb] (op 0: +, 1: *): b a row broadcast over the leading dims (inner = 1; one value:
   nb = 1) or a column broadcast over the trailing dims (inner = the trailing size), as a bias, a scale or a gate */
extern "C" __global__ void bcast(const float *a, const float *b, long long nb, long long inner, long long count,
                                 float *y, int op) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const float v = b[(i / inner) % nb];
    y[i] = op ? a[i] * v : a[i] + v;
}

/* y = f(x) over count values: 0 sigmoid, 1 gelu (erf), 2 gelu (tanh), 3 silu, 4 tanh, 5 relu, 6 neg, 7 exp, 8 abs,
   9 cos, 10 sin, 11 erf, 12 log, 13 reciprocal, 14 sqrt, 15 softcap (p: the cap); the result rounded to f16 (round 1)
   or bf16 (round 2) when the value is one, as the CPU rounds it */
extern "C" __global__ void unary(const float *x, long long count, float *y, int op, float p, int round) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const float a = x[i];
    float r;
    switch (op) {
    case 0: r = 1.0f / (1.0f + expf(-a)); break;
    case 1: r = 0.5f * a * (1.0f + erff(a * 0.7071067811865476f)); break;
    case 2: r = 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a))); break;
    case 4: r = tanhf(a); break;
    case 5: r = a > 0.0f ? a : 0.0f; break;   /* NaN: 0, as the comparison says */
    case 6: r = -a; break;
    case 7: r = expf(a); break;
    case 8: r = fabsf(a); break;
    case 9: r = (float)cos((double)a); break;   /* double: a float argument of 100 loses digits in cosf's reduction */
    case 10: r = (float)sin((double)a); break;
    case 11: r = erff(a); break;
    case 12: r = logf(a); break;
    case 13: r = 1.0f / a; break;
    case 14: r = sqrtf(a); break;
    case 15: r = p * tanhf(a / p); break;
    default: r = a / (1.0f + expf(-a)); break;
    }
    y[i] = uk_round_to(r, round);
}

/* dst rows (dst_ld apart) = width values of src rows (src_ld apart): a Split, Concat or Slice along the last axis */
extern "C" __global__ void copy_rows(const float *src, long long src_ld, float *dst, long long dst_ld, int rows,
                                     int width) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * width) return;
    const long long r = i / width, c = i % width;
    dst[r * dst_ld + c] = src[r * src_ld + c];
}

/* y[r] = (x[r] - mean) / sqrt(var + eps) * w (+ b): one block per row, two block-wide reductions */
extern "C" __global__ void layer_norm(const float *x, const float *w, const float *b, float *y, int n, float eps) {
    __shared__ float shared[UK_BLOCK / 32];
    const long long r = blockIdx.x;
    x += r * n;
    y += r * n;
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += UK_BLOCK) s += x[i];
    const float mean = block_sum(s, shared) / (float)n;
    float v = 0.0f;
    for (int i = threadIdx.x; i < n; i += UK_BLOCK) v += (x[i] - mean) * (x[i] - mean);
    const float inv = rsqrtf(block_sum(v, shared) / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += UK_BLOCK) y[i] = (x[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
}

extern "C" __global__ void add(const float *a, const float *b, float *y, long long count) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) y[i] = a[i] + b[i];
}

/* rotary embedding of x [rows, heads, d] in place, the first n_rot values of each head: pairs (i, i + n_rot / 2)
   (neox) or (2 i, 2 i + 1), angle pos[row] * inv_freq[i]; one thread per pair */
extern "C" __global__ void rope(float *x, const int *pos, const float *inv_freq, int rows, int heads, int d, int n_rot,
                                int neox, float attn) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const int half = n_rot / 2;
    if (t >= (long long)rows * heads * half) return;
    const int i = (int)(t % half);
    const long long head = t / half;
    const int row = (int)(head / heads);
    double sd, cd;  /* the CPU's angle: (double)pos * (double)inv_freq, its sine and cosine rounded to float */
    sincos((double)pos[row] * (double)inv_freq[i], &sd, &cd);
    const float s = (float)sd * attn, c = (float)cd * attn;  /* attn: yarn's magnitude scale (1 otherwise) */
    float *h = x + head * d;
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = h[a], x1 = h[b];
    h[a] = x0 * c - x1 * s;
    h[b] = x0 * s + x1 * c;
}
