/* uaii_test.h — what the C tests of libuaii share: checks that name the failing call and the library's last error,
 * scratch files, and the toy IR graphs (written in the C++ runtime's JSON layout).
 *
 * A test binary takes a scratch directory as argv[1], prints "<name>: N checks passed" and exits 0; it exits 1 on
 * the first failed check and 77 when it skips (the autotools convention, which tests/capi maps to pytest.skip).
 */
#ifndef UAII_TEST_H
#define UAII_TEST_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "uaii/c_api/uaii.h"

#define UAII_TEST_SKIP 77
#define UAII_TEST_UNUSED __attribute__((unused))

static int uaii_checks = 0;

#define CHECK(cond)                                                                                           \
    do {                                                                                                      \
        uaii_checks++;                                                                                        \
        if (!(cond)) {                                                                                        \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: \"%s\")\n", __FILE__, __LINE__, #cond,       \
                    uaii_last_error());                                                                       \
            exit(1);                                                                                          \
        }                                                                                                     \
    } while (0)

/* `expr` returns `want`; a failure must leave a non-empty last error containing `needle` (NULL: any). */
UAII_TEST_UNUSED static void check_status(uaii_status got, uaii_status want, const char* needle, const char* expr,
                                          const char* file, int line) {
    const char* err = uaii_last_error();
    uaii_checks++;
    if (got != want) {
        fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: \"%s\")\n", file, line, expr,
                uaii_status_name(got), uaii_status_name(want), err);
        exit(1);
    }
    if (want == UAII_OK && err[0] != '\0') {
        fprintf(stderr, "%s:%d: %s succeeded but left last error \"%s\"\n", file, line, expr, err);
        exit(1);
    }
    if (want != UAII_OK && (err[0] == '\0' || (needle != NULL && strstr(err, needle) == NULL))) {
        fprintf(stderr, "%s:%d: %s: last error \"%s\" does not mention \"%s\"\n", file, line, expr, err,
                needle ? needle : "(anything)");
        exit(1);
    }
}

#define CHECK_STATUS(expr, want, needle) check_status((expr), (want), (needle), #expr, __FILE__, __LINE__)
#define CHECK_OK(expr) CHECK_STATUS(expr, UAII_OK, NULL)

/* the integers of a space- or comma-separated list (token ids passed in the environment), at most cap of them */
UAII_TEST_UNUSED static size_t parse_tokens(const char* text, int64_t* out, size_t cap) {
    size_t n = 0;
    const char* p = text ? text : "";
    while (n < cap) {
        while (*p == ' ' || *p == ',') p++;
        char* end = NULL;
        const long long v = strtoll(p, &end, 10);
        if (end == p) break; /* the end, or not a number */
        out[n++] = (int64_t)v;
        p = end;
    }
    return n;
}

UAII_TEST_UNUSED static void test_done(const char* name) { printf("%s: %d checks passed\n", name, uaii_checks); }

/* ---- scratch files -------------------------------------------------------------------------------------------- */
/* dir/name in one of 16 rotating buffers (enough for the arguments of one call). */
UAII_TEST_UNUSED static const char* path_in(const char* dir, const char* name) {
    static char bufs[16][1024];
    static int next = 0;
    char* p = bufs[next++ % 16];
    snprintf(p, sizeof bufs[0], "%s/%s", dir, name);
    return p;
}

UAII_TEST_UNUSED static void make_dir(const char* path) {
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "cannot create %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

UAII_TEST_UNUSED static void write_bytes(const char* path, const void* data, size_t n) {
    FILE* f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

UAII_TEST_UNUSED static void write_text(const char* path, const char* text) {
    write_bytes(path, text, strlen(text));
}

UAII_TEST_UNUSED static int file_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && st.st_size > 0;
}

UAII_TEST_UNUSED static int close_to(float a, float b) {
    return (a > b ? a - b : b - a) <= 1e-5f * (1.0f + (b < 0 ? -b : b));
}

/* ---- the toy MLP ------------------------------------------------------------------------------------------------
 * y_prob = Softmax(Relu(x @ w1 + b1) @ w2 + b2), x [1,4], w1 [4,8], b1 [8], w2 [8,4], b2 [4]: MatMul -> Relu ->
 * MatMul -> Softmax with four weights, referenced as raw files `<wdir>/w1.bin` ... (a prefix "" means beside the
 * graph). With every weight filled with ones each output is 0.25, as the C++ runtime documents. */
UAII_TEST_UNUSED static void write_toy_graph(const char* path, const char* wdir) {
    char text[8192];
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s%s", wdir, wdir[0] ? "/" : "");
    snprintf(text, sizeof text,
             "{\n  \"ir_version\": {\"major\": 1, \"minor\": 0},\n  \"name\": \"toy_mlp4\",\n"
             "  \"producer\": \"uaii C tests\",\n  \"domain\": \"uaii\",\n  \"tensors\": [\n"
             "    {\"id\": 1, \"name\": \"x\", \"dtype\": \"f32\", \"shape\": [1, 4], \"storage_hint\": \"ram\", "
             "\"is_weight\": false, \"weight_ref\": \"\"},\n"
             "    {\"id\": 2, \"name\": \"w1\", \"dtype\": \"f32\", \"shape\": [4, 8], \"storage_hint\": \"external\", "
             "\"is_weight\": true, \"weight_ref\": \"%sw1.bin\"},\n"
             "    {\"id\": 3, \"name\": \"b1\", \"dtype\": \"f32\", \"shape\": [8], \"storage_hint\": \"external\", "
             "\"is_weight\": true, \"weight_ref\": \"%sb1.bin\"},\n"
             "    {\"id\": 4, \"name\": \"w2\", \"dtype\": \"f32\", \"shape\": [8, 4], \"storage_hint\": \"external\", "
             "\"is_weight\": true, \"weight_ref\": \"%sw2.bin\"},\n"
             "    {\"id\": 5, \"name\": \"b2\", \"dtype\": \"f32\", \"shape\": [4], \"storage_hint\": \"external\", "
             "\"is_weight\": true, \"weight_ref\": \"%sb2.bin\"},\n"
             "    {\"id\": 6, \"name\": \"h\", \"dtype\": \"f32\", \"shape\": [1, 8], \"storage_hint\": \"ram\", "
             "\"is_weight\": false, \"weight_ref\": \"\"},\n"
             "    {\"id\": 7, \"name\": \"hb\", \"dtype\": \"f32\", \"shape\": [1, 8], \"storage_hint\": \"ram\", "
             "\"is_weight\": false, \"weight_ref\": \"\"},\n"
             "    {\"id\": 8, \"name\": \"h_act\", \"dtype\": \"f32\", \"shape\": [1, 8], \"storage_hint\": \"ram\", "
             "\"is_weight\": false, \"weight_ref\": \"\"},\n"
             "    {\"id\": 9, \"name\": \"y\", \"dtype\": \"f32\", \"shape\": [1, 4], \"storage_hint\": \"ram\", "
             "\"is_weight\": false, \"weight_ref\": \"\"},\n"
             "    {\"id\": 10, \"name\": \"yb\", \"dtype\": \"f32\", \"shape\": [1, 4], \"storage_hint\": \"ram\", "
             "\"is_weight\": false, \"weight_ref\": \"\"},\n"
             "    {\"id\": 11, \"name\": \"y_prob\", \"dtype\": \"f32\", \"shape\": [1, 4], \"storage_hint\": \"ram\", "
             "\"is_weight\": false, \"weight_ref\": \"\"}\n"
             "  ],\n  \"nodes\": [\n"
             "    {\"id\": 1, \"name\": \"fc1\", \"op_name\": \"MatMul\", \"op_version\": \"1\", \"inputs\": [1, 2], "
             "\"outputs\": [6], \"attributes\": []},\n"
             "    {\"id\": 2, \"name\": \"bias1\", \"op_name\": \"Add\", \"op_version\": \"1\", \"inputs\": [6, 3], "
             "\"outputs\": [7], \"attributes\": []},\n"
             "    {\"id\": 3, \"name\": \"act\", \"op_name\": \"Relu\", \"op_version\": \"1\", \"inputs\": [7], "
             "\"outputs\": [8], \"attributes\": []},\n"
             "    {\"id\": 4, \"name\": \"fc2\", \"op_name\": \"MatMul\", \"op_version\": \"1\", \"inputs\": [8, 4], "
             "\"outputs\": [9], \"attributes\": []},\n"
             "    {\"id\": 5, \"name\": \"bias2\", \"op_name\": \"Add\", \"op_version\": \"1\", \"inputs\": [9, 5], "
             "\"outputs\": [10], \"attributes\": []},\n"
             "    {\"id\": 6, \"name\": \"prob\", \"op_name\": \"Softmax\", \"op_version\": \"1\", \"inputs\": [10], "
             "\"outputs\": [11], \"attributes\": [{\"key\": \"axis\", \"type\": \"int\", \"value\": -1}]}\n"
             "  ],\n  \"inputs\": [1],\n  \"outputs\": [11],\n"
             "  \"metadata\": {\"note\": \"MatMul -> Relu -> MatMul -> Softmax with four weights\"}\n}\n",
             prefix, prefix, prefix, prefix);
    write_text(path, text);
}

/* Writes w1, b1, w2, b2 as raw little-endian f32 files into dir: w1[i] = (i % 5) * 0.1 - 0.2, b1 = 0.05,
 * w2[i] = (i % 3) * 0.2 - 0.1, b2[j] = 0.1 * j. */
UAII_TEST_UNUSED static void write_toy_weights(const char* dir, float w1[32], float b1[8], float w2[32],
                                               float b2[4]) {
    for (int i = 0; i < 32; i++) w1[i] = (float)(i % 5) * 0.1f - 0.2f;
    for (int i = 0; i < 8; i++) b1[i] = 0.05f;
    for (int i = 0; i < 32; i++) w2[i] = (float)(i % 3) * 0.2f - 0.1f;
    for (int i = 0; i < 4; i++) b2[i] = 0.1f * (float)i;
    write_bytes(path_in(dir, "w1.bin"), w1, 32 * sizeof(float));
    write_bytes(path_in(dir, "b1.bin"), b1, 8 * sizeof(float));
    write_bytes(path_in(dir, "w2.bin"), w2, 32 * sizeof(float));
    write_bytes(path_in(dir, "b2.bin"), b2, 4 * sizeof(float));
}

/* The toy MLP in plain C (the reference the library's result is compared with). */
UAII_TEST_UNUSED static void toy_reference(const float x[4], const float w1[32], const float b1[8],
                                           const float w2[32], const float b2[4], float out[4]) {
    float h[8], y[4], mx, sum = 0.0f;
    for (int j = 0; j < 8; j++) {
        float acc = b1[j];
        for (int k = 0; k < 4; k++) acc += x[k] * w1[k * 8 + j];
        h[j] = acc > 0.0f ? acc : 0.0f;
    }
    for (int j = 0; j < 4; j++) {
        float acc = b2[j];
        for (int k = 0; k < 8; k++) acc += h[k] * w2[k * 4 + j];
        y[j] = acc;
    }
    mx = y[0];
    for (int j = 1; j < 4; j++) mx = y[j] > mx ? y[j] : mx;
    for (int j = 0; j < 4; j++) {
        /* exp without libm: the values are small, a short series is exact to float precision */
        double t = (double)(y[j] - mx), term = 1.0, e = 1.0;
        for (int n = 1; n < 40; n++) {
            term *= t / n;
            e += term;
        }
        out[j] = (float)e;
        sum += out[j];
    }
    for (int j = 0; j < 4; j++) out[j] /= sum;
}

/* Options that open the toy graph with its weights filled per `init`. */
UAII_TEST_UNUSED static uaii_session_options toy_options(uaii_weight_init init) {
    uaii_session_options o;
    uaii_session_options_init(&o);
    o.allow_missing_weights = 1;
    o.weight_init = init;
    return o;
}

/* Creates a session on the toy graph, runs it on x and writes y_prob. */
UAII_TEST_UNUSED static void run_toy(uaii_session* s, const float x[4], float y[4]) {
    size_t n = 0;
    CHECK_OK(uaii_session_set_f32(s, "x", x, 4));
    CHECK_OK(uaii_session_run(s));
    CHECK_OK(uaii_session_get_f32(s, "y_prob", y, 4, &n));
    CHECK(n == 4);
}

#endif /* UAII_TEST_H */
