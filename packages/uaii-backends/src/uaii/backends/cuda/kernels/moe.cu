/* moe.cu — mixture-of-experts on the device: the router, the expert products on the chosen experts only, and the
 * weighted sum of the experts' outputs.
 *
 * moe_route: one thread per token: scores = softmax (or sigmoid) of its n_experts logits, the top_k by score, best
 *   first, ties to the lower index (a strictly greater score displaces), weights = their scores, divided by their
 *   sum when normalize (the semantics of the reference's MoERouter).
 * gemv_idx_<type> (in gemv.cu): the GEMV over the expert each (token, slot) pair chose; for a prefill moe_group
 *   lists each expert's pairs and mmq_idx_<type> (in mmq.cu) multiplies them with the int8 GEMM.
 * moe_combine: y[t] = sum_j w[t, j] * o[t * top_k + j], one thread per output value. */
#include "decode.cuh"

#define UK_MOE_MAX_K 16

extern "C" __global__ void moe_route(const float *logits, int tokens, int n_experts, int top_k, int normalize,
                                     int sigmoid, float *weights, int *idx) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens || top_k > UK_MOE_MAX_K) return;
    const float *z = logits + (long long)t * n_experts;
    float mx = z[0];
    for (int e = 1; e < n_experts; e++) mx = fmaxf(mx, z[e]);
    float total = 0.0f;
    if (!sigmoid)
        for (int e = 0; e < n_experts; e++) total += expf(z[e] - mx);
    float best[UK_MOE_MAX_K];
    int pick[UK_MOE_MAX_K];
    for (int j = 0; j < top_k; j++) { best[j] = -1.0f; pick[j] = -1; }
    for (int e = 0; e < n_experts; e++) {
        const float sc = sigmoid ? 1.0f / (1.0f + expf(-z[e])) : expf(z[e] - mx) / total;
        int at = top_k;
        while (at > 0 && sc > best[at - 1]) at--;
        if (at == top_k) continue;
        for (int j = top_k - 1; j > at; j--) { best[j] = best[j - 1]; pick[j] = pick[j - 1]; }
        best[at] = sc;
        pick[at] = e;
    }
    float sum = 0.0f;
    for (int j = 0; j < top_k; j++) sum += best[j];
    for (int j = 0; j < top_k; j++) {
        weights[(long long)t * top_k + j] = normalize ? best[j] / sum : best[j];
        idx[(long long)t * top_k + j] = pick[j];
    }
}

/* moe_group: thread e for expert e0 + e of a bank of n_experts: the pairs s < pairs that chose it, ascending, at
   order[e * pairs ..] and their count at counts[e] — the lists mmq_idx_<type> reads (each expert's weights then
   read once for all its rows, not once a pair). A thread scans every pair: a prefill's few thousand. */
extern "C" __global__ void moe_group(const int *idx, int pairs, int e0, int n_experts, int *order, int *counts) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_experts) return;
    int *out = order + (long long)e * pairs;
    int c = 0;
    for (int s = 0; s < pairs; s++)
        if (idx[s] == e0 + e) out[c++] = s;
    counts[e] = c;
}

extern "C" __global__ void moe_combine(const float *o, const float *w, int tokens, int top_k, int d, float *y) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * d) return;
    const long long t = i / d, c = i % d;
    float acc = 0.0f;
    for (int j = 0; j < top_k; j++) acc += w[t * top_k + j] * o[(t * top_k + j) * d + c];
    y[i] = acc;
}
