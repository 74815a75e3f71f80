/* ew.cu — the ops ONNX graphs bring, one thread per item: binary arithmetic and comparisons with NumPy broadcasting
 * (any rank), integer unary ops, Where, Cast, movement by strides (Transpose, Expand, Slice with steps, Concat),
 * Gather, Trilu, Fill, Range, reductions over any axes, Softmax / CumSum / ArgMax / TopK along one axis, and a general
 * f32 matrix product (activation x activation, Gemm). Values are the device's 4-byte words: f32 for every float
 * dtype, i32 for integers and bools (0 / 1). An N-d launch reads its shapes and strides (in elements) from a table of
 * long longs the host uploads once per binding; ``nd`` <= EW_MAX_DIMS. Sums accumulate in double (the references
 * sum in float64 and round once); integer arithmetic wraps as two's complement (through unsigned), as NumPy's does.
 * A value the host must hear of (an integer division by zero, an index out of range, an integer result beyond the
 * device's 32 bits) is written to ``*fault`` as the node's code, which the executable reads after the run. */
#include "decode.cuh"

#define EW_MAX_DIMS 8
#define EW_INF ((double)__int_as_float(0x7f800000))   /* NVRTC has no math.h: no INFINITY, no NAN */
#define EW_NAN ((double)__int_as_float(0x7fc00000))

__device__ __forceinline__ long long ew_item() { return (long long)blockIdx.x * blockDim.x + threadIdx.x; }

/* the offsets of output item i in ``ops`` operands: t = shape[nd], then per operand strides[nd] */
__device__ __forceinline__ void ew_offsets(long long i, const long long *t, int nd, int ops, long long *off) {
    for (int o = 0; o < ops; o++) off[o] = 0;
    for (int d = nd - 1; d >= 0; d--) {
        const long long n = t[d], c = n ? i % n : 0;
        i = n ? i / n : 0;
        for (int o = 0; o < ops; o++) off[o] += c * t[nd * (o + 1) + d];
    }
}

/* r as the device's word: wrapped at 32 bits (an i32 value: two's complement, as the host type wraps), or — for a
   wider type held in the word (``wide``: i64) — faulting when r does not fit, where the host would keep 64 bits */
__device__ __forceinline__ int ew_fit(long long r, int wide, int *fault, int code) {
    if (wide && (r < -2147483648LL || r > 2147483647LL)) *fault = code;
    return (int)(unsigned)(unsigned long long)r;
}

/* y = a op b, broadcast by the table: 0 +, 1 -, 2 *, 3 /, 4 pow, 5 max, 6 min (NaN wins), 7 fmod; rounded as ``round`` */
extern "C" __global__ void binary_f(const float *a, const float *b, float *y, const long long *t, int nd,
                                    long long count, int op, int round) {
    const long long i = ew_item();
    if (i >= count) return;
    long long off[2];
    ew_offsets(i, t, nd, 2, off);
    const float u = a[off[0]], v = b[off[1]];
    float r;
    switch (op) {
    case 0: r = u + v; break;
    case 1: r = u - v; break;
    case 2: r = u * v; break;
    case 3: r = u / v; break;
    case 4: r = (float)pow((double)u, (double)v); break;
    case 5: r = isnan(u) || isnan(v) ? (float)EW_NAN : (u > v ? u : v); break;
    case 6: r = isnan(u) || isnan(v) ? (float)EW_NAN : (u < v ? u : v); break;
    default: r = fmodf(u, v); break;
    }
    y[i] = uk_round_to(r, round);
}

/* integer y = a op b: 0 +, 1 -, 2 *, 3 / (toward zero), 4 max, 5 min, 6 mod with b's sign, 7 fmod (a's sign),
   8 and, 9 or, 10 xor (bools); wrapped or faulting as ew_fit says; a zero divisor writes 0 and faults */
extern "C" __global__ void binary_i(const int *a, const int *b, int *y, const long long *t, int nd, long long count,
                                    int op, int *fault, int code, int wide) {
    const long long i = ew_item();
    if (i >= count) return;
    long long off[2];
    ew_offsets(i, t, nd, 2, off);
    const long long u = a[off[0]], v = b[off[1]];
    if ((op == 3 || op == 6 || op == 7) && v == 0) {
        *fault = code;
        y[i] = 0;
        return;
    }
    long long r;
    switch (op) {
    case 0: r = u + v; break;
    case 1: r = u - v; break;
    case 2: r = u * v; break;
    case 3: r = u / v; break;
    case 4: r = u > v ? u : v; break;
    case 5: r = u < v ? u : v; break;
    case 6: r = u % v; r = r != 0 && ((r < 0) != (v < 0)) ? r + v : r; break;
    case 7: r = u % v; break;
    case 8: r = (u != 0) & (v != 0); break;
    case 9: r = (u != 0) | (v != 0); break;
    default: r = (u != 0) ^ (v != 0); break;
    }
    y[i] = ew_fit(r, wide, fault, code);
}

/* y = (a cmp b) as 0 / 1: 0 ==, 1 <, 2 >, 3 <=, 4 >= (NaN compares false); compare_f on floats, compare_i on
   integer words */
#define EW_COMPARE(name, T)                                                                                     \
    extern "C" __global__ void name(const T *a, const T *b, int *y, const long long *t, int nd, long long count, \
                                    int op) {                                                                   \
        const long long i = ew_item();                                                                          \
        if (i >= count) return;                                                                                 \
        long long off[2];                                                                                       \
        ew_offsets(i, t, nd, 2, off);                                                                           \
        const T u = a[off[0]], v = b[off[1]];                                                                   \
        y[i] = op == 0 ? u == v : op == 1 ? u < v : op == 2 ? u > v : op == 3 ? u <= v : u >= v;                \
    }
EW_COMPARE(compare_f, float)
EW_COMPARE(compare_i, int)

/* integer y = f(x): 0 neg, 1 abs, 2 relu, 3 not (bools); wrapped or faulting as ew_fit says */
extern "C" __global__ void unary_i(const int *x, long long count, int *y, int op, int *fault, int code, int wide) {
    const long long i = ew_item();
    if (i >= count) return;
    const long long v = x[i];
    y[i] = ew_fit(op == 0 ? -v : op == 1 ? (v < 0 ? -v : v) : op == 2 ? (v > 0 ? v : 0) : (v == 0), wide, fault, code);
}

/* out = c ? x : y, the three broadcast by the table (words: any dtype) */
extern "C" __global__ void where_w(const int *c, const unsigned *x, const unsigned *y, unsigned *out,
                                   const long long *t, int nd, long long count) {
    const long long i = ew_item();
    if (i >= count) return;
    long long off[3];
    ew_offsets(i, t, nd, 3, off);
    out[i] = c[off[0]] ? x[off[1]] : y[off[2]];
}

/* float → float of another width: rounded to f16 (1) or bf16 (2), or kept (0) */
extern "C" __global__ void cast_f(const float *x, long long count, float *y, int round) {
    const long long i = ew_item();
    if (i < count) y[i] = uk_round_to(x[i], round);
}

/* float → integer: rounded half to even, NaN 0, saturated to [lo, hi] (the target type's range); a result beyond
   the device's 32 bits writes the saturated i32 and faults; to_bool: x != 0 */
extern "C" __global__ void cast_f2i(const float *x, long long count, int *y, long long lo, long long hi, int to_bool,
                                    int *fault, int code) {
    const long long i = ew_item();
    if (i >= count) return;
    const float v = x[i];
    if (to_bool) {
        y[i] = v != 0.0f;
        return;
    }
    double r = isnan(v) ? 0.0 : rint((double)v);
    r = r < (double)lo ? (double)lo : r > (double)hi ? (double)hi : r;
    if (r < -2147483648.0 || r > 2147483647.0) {
        *fault = code;
        r = r < 0.0 ? -2147483648.0 : 2147483647.0;
    }
    y[i] = (int)r;
}

/* integer → float, rounded to f16 (1) or bf16 (2) when the target is one */
extern "C" __global__ void cast_i2f(const int *x, long long count, float *y, int round) {
    const long long i = ew_item();
    if (i < count) y[i] = uk_round_to((float)x[i], round);
}

/* integer → integer, saturated to [lo, hi]; to_bool: x != 0 */
extern "C" __global__ void cast_i2i(const int *x, long long count, int *y, long long lo, long long hi, int to_bool) {
    const long long i = ew_item();
    if (i >= count) return;
    const long long v = x[i];
    y[i] = to_bool ? v != 0 : (int)(v < lo ? lo : v > hi ? hi : v);
}

/* y[dst + offsets of i in the table's second strides] = x[src + offsets in the first]: a Transpose, an Expand, a
   Slice with any steps, one input of a Concat (words: any dtype) */
extern "C" __global__ void copy_nd(const unsigned *x, long long src, unsigned *y, long long dst, const long long *t,
                                   int nd, long long count) {
    const long long i = ew_item();
    if (i >= count) return;
    long long off[2];
    ew_offsets(i, t, nd, 2, off);
    y[dst + off[1]] = x[src + off[0]];
}

/* y[o, j, c] = x[o, idx[j], c] over [outer, n_idx, inner] (idx < 0 counts from the end); an index out of range
   writes 0 and faults */
extern "C" __global__ void gather_w(const unsigned *x, const int *idx, unsigned *y, long long n_idx, long long inner,
                                    long long axis_len, long long count, int *fault, int code) {
    const long long i = ew_item();
    if (i >= count) return;
    const long long c = i % inner, j = (i / inner) % n_idx, o = i / (inner * n_idx);
    long long k = idx[j];
    k = k < 0 ? k + axis_len : k;
    if (k < 0 || k >= axis_len) {
        *fault = code;
        y[i] = 0;
        return;
    }
    y[i] = x[(o * axis_len + k) * inner + c];
}

/* y = x with the values of column - row >= k (upper) or <= k (lower) of the last two axes kept, the rest 0 */
extern "C" __global__ void trilu_w(const unsigned *x, unsigned *y, long long rows, long long cols, long long count,
                                   long long k, int upper) {
    const long long i = ew_item();
    if (i >= count) return;
    const long long c = i % cols, r = (i / cols) % rows, d = c - r;
    y[i] = (upper ? d >= k : d <= k) ? x[i] : 0u;
}

/* y[i] = the one word at v (Fill) */
extern "C" __global__ void fill_w(const unsigned *v, unsigned *y, long long count) {
    const long long i = ew_item();
    if (i < count) y[i] = v[0];
}

/* y[i] = start + i delta, in double rounded once (to f16 / bf16 as ``round``) */
extern "C" __global__ void range_f(const float *start, const float *delta, float *y, long long count, int round) {
    const long long i = ew_item();
    if (i < count) y[i] = uk_round_to((float)((double)start[0] + (double)i * (double)delta[0]), round);
}

/* y[i] = start + i delta, wrapped or faulting as ew_fit says */
extern "C" __global__ void range_i(const int *start, const int *delta, int *y, long long count, int *fault, int code,
                                   int wide) {
    const long long i = ew_item();
    if (i < count) y[i] = ew_fit((long long)start[0] + i * (long long)delta[0], wide, fault, code);
}

/* one output per thread over the reduced elements: the table holds the output's shape and x strides [nd] and the
   reduced axes' shape and x strides [nr]; 0 sum, 1 mean (sum / rcount), 2 max, 3 min (NaN propagates; an empty
   reduction gives 0, NaN, -inf, +inf) */
extern "C" __global__ void reduce_f(const float *x, float *y, const long long *t, int nd, int nr, long long count,
                                    long long rcount, int op, int round) {
    const long long i = ew_item();
    if (i >= count) return;
    long long base;
    ew_offsets(i, t, nd, 1, &base);
    const long long *rt = t + 2 * nd;
    double acc = op == 2 ? -EW_INF : op == 3 ? EW_INF : 0.0;
    for (long long j = 0; j < rcount; j++) {
        long long off;
        ew_offsets(j, rt, nr, 1, &off);
        const double v = x[base + off];
        if (op < 2) acc += v;
        else if (isnan(v) || isnan(acc)) acc = EW_NAN;
        else acc = op == 2 ? (v > acc ? v : acc) : (v < acc ? v : acc);
    }
    if (op == 1) acc /= (double)rcount;
    y[i] = uk_round_to((float)acc, round);
}

/* integer reductions, as reduce_f's table: 0 sum (wrapped or faulting as ew_fit says), 2 max, 3 min; an empty
   max / min gives the i32 limit */
extern "C" __global__ void reduce_i(const int *x, int *y, const long long *t, int nd, int nr, long long count,
                                    long long rcount, int op, int *fault, int code, int wide) {
    const long long i = ew_item();
    if (i >= count) return;
    long long base;
    ew_offsets(i, t, nd, 1, &base);
    const long long *rt = t + 2 * nd;
    long long sum = 0;
    int ext = op == 2 ? (int)0x80000000 : 0x7fffffff;
    for (long long j = 0; j < rcount; j++) {
        long long off;
        ew_offsets(j, rt, nr, 1, &off);
        const int v = x[base + off];
        sum = (long long)(unsigned long long)((unsigned long long)sum + (unsigned long long)(long long)v);
        ext = op == 2 ? (v > ext ? v : ext) : (v < ext ? v : ext);
    }
    y[i] = op == 0 ? ew_fit(sum, wide, fault, code) : ext;
}

/* softmax along an axis of n values (x as [outer, n, inner]); one thread per (outer, inner) column */
extern "C" __global__ void softmax_ax(const float *x, float *y, long long n, long long inner, long long count,
                                      int round) {
    const long long i = ew_item();
    if (i >= count) return;
    const long long base = i / inner * n * inner + i % inner;
    double m = -EW_INF, s = 0.0;
    for (long long j = 0; j < n; j++) m = fmax(m, (double)x[base + j * inner]);
    for (long long j = 0; j < n; j++) s += exp((double)x[base + j * inner] - m);
    for (long long j = 0; j < n; j++) y[base + j * inner] = uk_round_to((float)(exp((double)x[base + j * inner] - m) / s),
                                                                     round);
}

/* running sums along an axis (x as [outer, n, inner]), in double rounded once each (``exclusive``: without the
   value itself; ``reverse``: from the end) */
extern "C" __global__ void cumsum_f(const float *x, float *y, long long n, long long inner, long long count,
                                    int exclusive, int reverse, int round) {
    const long long i = ew_item();
    if (i >= count) return;
    const long long base = i / inner * n * inner + i % inner;
    double s = 0.0;
    for (long long j = 0; j < n; j++) {
        const long long at = base + (reverse ? n - 1 - j : j) * inner;
        const double v = x[at];
        if (!exclusive) s += v;
        y[at] = uk_round_to((float)s, round);
        if (exclusive) s += v;
    }
}

/* integer running sums as cumsum_f's, wrapped or faulting as ew_fit says */
extern "C" __global__ void cumsum_i(const int *x, int *y, long long n, long long inner, long long count,
                                    int exclusive, int reverse, int *fault, int code, int wide) {
    const long long i = ew_item();
    if (i >= count) return;
    const long long base = i / inner * n * inner + i % inner;
    long long s = 0;
    for (long long j = 0; j < n; j++) {
        const long long at = base + (reverse ? n - 1 - j : j) * inner;
        const long long v = x[at];
        if (!exclusive) s += v;
        y[at] = ew_fit(s, wide, fault, code);
        if (exclusive) s += v;
    }
}

/* a before b in TopK's order: descending (largest) or ascending values, NaN as the greatest, ties to the lower
   index */
__device__ __forceinline__ bool ew_before(double va, long long ia, double vb, long long ib, int largest) {
    const bool na = isnan(va), nb = isnan(vb);
    if (na || nb) {
        if (na && nb) return ia < ib;
        return largest ? na : nb;
    }
    if (va != vb) return largest ? va > vb : va < vb;
    return ia < ib;
}

/* the index of the first largest value along an axis ([outer, n, inner]; NaN is the largest), as i32 */
extern "C" __global__ void argmax_ax(const void *x, int *y, long long n, long long inner, long long count,
                                     int is_int) {
    const long long i = ew_item();
    if (i >= count) return;
    const long long base = i / inner * n * inner + i % inner;
    long long best = 0;
    double bv = 0.0;
    for (long long j = 0; j < n; j++) {
        const long long at = base + j * inner;
        const double v = is_int ? (double)((const int *)x)[at] : (double)((const float *)x)[at];
        if (j == 0 || ew_before(v, j, bv, best, 1)) {
            best = j;
            bv = v;
        }
    }
    y[i] = (int)best;
}

/* the k first values along an axis in ew_before's order and their indices (x [outer, n, inner], outputs
   [outer, k, inner]): k passes, each the first value after the previous pick */
extern "C" __global__ void topk_ax(const void *x, void *vals, int *idx, long long n, long long inner, long long count,
                                   int k, int largest, int is_int) {
    const long long i = ew_item();
    if (i >= count) return;
    const long long base = i / inner * n * inner + i % inner, obase = i / inner * k * inner + i % inner;
    double pv = 0.0;
    long long pi = -1;
    for (int r = 0; r < k; r++) {
        long long best = -1;
        double bv = 0.0;
        for (long long j = 0; j < n; j++) {
            const long long at = base + j * inner;
            const double v = is_int ? (double)((const int *)x)[at] : (double)((const float *)x)[at];
            if (pi >= 0 && !ew_before(pv, pi, v, j, largest)) continue;
            if (best < 0 || ew_before(v, j, bv, best, largest)) {
                best = j;
                bv = v;
            }
        }
        const long long out = obase + (long long)r * inner;
        ((unsigned *)vals)[out] = ((const unsigned *)x)[base + best * inner];
        idx[out] = (int)best;
        pv = bv;
        pi = best;
    }
}

/* y[batch, m, n] = alpha sum_k a[.., m, k] b[.., k, n] (+ beta c[.., m, n]) (relu when asked), in double rounded
   once; the table: the batch shape [nb] with a's, b's and c's batch strides [nb] each, then a's (m, k), b's (k, n)
   and c's (m, n) strides (c NULL: none) */
extern "C" __global__ void matmul_f(const float *a, const float *b, const float *c, float *y, const long long *t,
                                    int nb, long long m, long long n, long long k, long long count, float alpha,
                                    float beta, int relu, int round) {
    const long long i = ew_item();
    if (i >= count) return;
    const long long col = i % n, row = (i / n) % m;
    long long off[3];
    ew_offsets(i / (m * n), t, nb, 3, off);
    const long long *s = t + 4 * nb;
    const float *pa = a + off[0] + row * s[0], *pb = b + off[1] + col * s[3];
    double acc = 0.0;
    for (long long j = 0; j < k; j++) acc += (double)pa[j * s[1]] * (double)pb[j * s[2]];
    acc *= (double)alpha;
    if (c) acc += (double)beta * (double)c[off[2] + row * s[4] + col * s[5]];
    if (relu && !(acc > 0.0)) acc = isnan(acc) ? acc : 0.0;
    y[i] = uk_round_to((float)acc, round);
}
