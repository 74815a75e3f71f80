/* test_toy_graphs.c — IR graphs end to end: the toy MLP (MatMul -> Relu -> MatMul -> Softmax, four weights) with
 * its weights missing and filled (ones: y_prob = 0.25 each, as the C++ runtime documents; zeros; the i * 0.01
 * sequence), with real weight files (compared with a plain-C reference), found through weights_dir, confined by
 * weights_sandbox, converted to the binary format, profiled, and with the warnings it records.
 *
 * Usage: test_toy_graphs SCRATCH_DIR
 */
#include "uaii_test.h"

static const char* dir;
static const float X[4] = {0.5f, -1.0f, 2.0f, 1.5f};

static uaii_session* open_toy(const char* graph, const uaii_session_options* o) {
    uaii_session* s = NULL;
    CHECK_OK(uaii_session_create(graph, o, &s));
    CHECK(s != NULL);
    return s;
}

static void filled(void) {
    const char* graph = path_in(dir, "missing.uaii.json");
    float y[4], w[32];
    size_t n = 0;
    char warnings[2048];
    uaii_session_options o;
    uaii_session* s;
    write_toy_graph(graph, "weights");

    o = toy_options(UAII_WEIGHT_INIT_ONES);
    s = open_toy(graph, &o);
    run_toy(s, X, y);
    for (int i = 0; i < 4; i++) CHECK(close_to(y[i], 0.25f));
    /* every filled weight is recorded */
    CHECK_OK(uaii_session_warnings(s, warnings, sizeof warnings, &n));
    CHECK(n == strlen(warnings));
    CHECK(strstr(warnings, "'w1'") && strstr(warnings, "'b1'") && strstr(warnings, "'w2'") && strstr(warnings, "'b2'"));
    CHECK(strstr(warnings, "filled with ones") != NULL);
    /* the filled weights and the input read back */
    CHECK_OK(uaii_session_get_f32(s, "w1", w, 32, &n));
    CHECK(n == 32 && w[0] == 1.0f && w[31] == 1.0f);
    CHECK_OK(uaii_session_get_f32(s, "x", w, 32, &n));
    CHECK(n == 4 && w[2] == X[2]);
    uaii_session_destroy(s);

    o = toy_options(UAII_WEIGHT_INIT_ZEROS);
    s = open_toy(graph, &o);
    run_toy(s, X, y);
    for (int i = 0; i < 4; i++) CHECK(close_to(y[i], 0.25f));
    CHECK_OK(uaii_session_get_f32(s, "b1", w, 32, &n));
    CHECK(n == 8 && w[0] == 0.0f && w[7] == 0.0f);
    uaii_session_destroy(s);

    o = toy_options(UAII_WEIGHT_INIT_SEQUENCE);
    s = open_toy(graph, &o);
    {
        float w1[32], b1[8], w2[32], b2[4], want[4];
        CHECK_OK(uaii_session_get_f32(s, "w1", w1, 32, &n));
        CHECK_OK(uaii_session_get_f32(s, "b1", b1, 8, &n));
        CHECK_OK(uaii_session_get_f32(s, "w2", w2, 32, &n));
        CHECK_OK(uaii_session_get_f32(s, "b2", b2, 4, &n));
        for (int i = 0; i < 32; i++) CHECK(close_to(w1[i], (float)i * 0.01f));
        for (int i = 0; i < 8; i++) CHECK(close_to(b1[i], (float)i * 0.01f));
        run_toy(s, X, y);
        toy_reference(X, w1, b1, w2, b2, want);
        for (int i = 0; i < 4; i++) CHECK(close_to(y[i], want[i]));
        CHECK(!close_to(y[0], y[3])); /* a real, non-uniform answer */
    }
    uaii_session_destroy(s);
}

static void real_weights(void) {
    const char* wdir = path_in(dir, "weights");
    const char* graph = path_in(dir, "real.uaii.json");
    float w1[32], b1[8], w2[32], b2[4], want[4], y[4];
    uaii_session_options o;
    uaii_session* s;
    make_dir(wdir);
    write_toy_weights(wdir, w1, b1, w2, b2);
    write_toy_graph(graph, "weights");
    toy_reference(X, w1, b1, w2, b2, want);

    /* no options: every weight is there */
    s = open_toy(graph, NULL);
    run_toy(s, X, y);
    for (int i = 0; i < 4; i++) CHECK(close_to(y[i], want[i]));
    {
        size_t n = 0; /* a second run with another input reuses the session */
        float x2[4] = {-1.0f, 0.0f, 1.0f, 2.0f}, want2[4];
        run_toy(s, x2, y);
        toy_reference(x2, w1, b1, w2, b2, want2);
        for (int i = 0; i < 4; i++) CHECK(close_to(y[i], want2[i]));
        CHECK_OK(uaii_session_warnings(s, NULL, 0, &n));
        CHECK(n == 0);
    }
    uaii_session_destroy(s);

    /* some weights present, others missing: fail closed on the missing ones, fill only those when allowed */
    remove(path_in(wdir, "w2.bin"));
    CHECK_STATUS(uaii_session_create(graph, NULL, &s), UAII_ERR_NOT_FOUND, "'w2'");
    o = toy_options(UAII_WEIGHT_INIT_ONES);
    s = open_toy(graph, &o);
    {
        float got[32], ones[32];
        size_t n = 0;
        char warnings[1024];
        for (int i = 0; i < 32; i++) ones[i] = 1.0f;
        CHECK_OK(uaii_session_get_f32(s, "w1", got, 32, &n));
        CHECK(memcmp(got, w1, sizeof w1) == 0);
        CHECK_OK(uaii_session_warnings(s, warnings, sizeof warnings, &n));
        CHECK(strstr(warnings, "'w2'") != NULL && strstr(warnings, "'w1'") == NULL);
        run_toy(s, X, y);
        toy_reference(X, w1, b1, ones, b2, want);
        for (int i = 0; i < 4; i++) CHECK(close_to(y[i], want[i]));
    }
    uaii_session_destroy(s);
    write_toy_weights(wdir, w1, b1, w2, b2);
}

static void weights_dir_and_sandbox(void) {
    const char* elsewhere = path_in(dir, "elsewhere");
    const char* graph = path_in(dir, "relocated.uaii.json");
    const char* escaping = path_in(dir, "escaping.uaii.json");
    float w1[32], b1[8], w2[32], b2[4], want[4], y[4];
    uaii_session_options o;
    uaii_session* s;
    make_dir(elsewhere);
    write_toy_weights(elsewhere, w1, b1, w2, b2);
    write_toy_graph(graph, ""); /* references "w1.bin", ... relative to the weights directory */
    toy_reference(X, w1, b1, w2, b2, want);

    CHECK_STATUS(uaii_session_create(graph, NULL, &s), UAII_ERR_NOT_FOUND, "w1"); /* not beside the graph */
    uaii_session_options_init(&o);
    o.weights_dir = elsewhere;
    s = open_toy(graph, &o);
    run_toy(s, X, y);
    for (int i = 0; i < 4; i++) CHECK(close_to(y[i], want[i]));
    uaii_session_destroy(s);

    o.weights_sandbox = elsewhere; /* inside the sandbox: fine */
    s = open_toy(graph, &o);
    uaii_session_destroy(s);

    /* a reference that leaves the sandbox is refused, filled or not */
    write_toy_graph(escaping, "../elsewhere");
    uaii_session_options_init(&o);
    o.weights_dir = path_in(dir, "weights");
    CHECK(uaii_session_create(escaping, &o, &s) == UAII_OK); /* without a sandbox ".." is followed */
    uaii_session_destroy(s);
    o.weights_sandbox = path_in(dir, "weights");
    CHECK_STATUS(uaii_session_create(escaping, &o, &s), UAII_ERR_INVALID_ARGUMENT, "sandbox");
    o.allow_missing_weights = 1;
    o.weight_init = UAII_WEIGHT_INIT_ONES;
    CHECK_STATUS(uaii_session_create(escaping, &o, &s), UAII_ERR_INVALID_ARGUMENT, "sandbox");
    CHECK(s == NULL);
}

static void converted_and_profiled(void) {
    const char* sub = path_in(dir, "converted");
    const char* binary = path_in(sub, "toy.uaii");
    const char* trace = path_in(dir, "destroy.trace.json");
    float w1[32], b1[8], w2[32], b2[4], want[4], y[4];
    char summary[2048];
    uaii_session_options o;
    uaii_session* s;
    make_dir(sub);
    /* converted into another directory: the references are rewritten to still name weights/ */
    CHECK_OK(uaii_convert_model(path_in(dir, "real.uaii.json"), binary));
    CHECK_OK(uaii_convert_model(binary, path_in(sub, "again.uaii.json")));
    write_toy_weights(path_in(dir, "weights"), w1, b1, w2, b2);
    toy_reference(X, w1, b1, w2, b2, want);
    uaii_session_options_init(&o);
    o.enable_profiler = 1;
    o.profile_trace_path = trace;
    s = open_toy(binary, &o);
    for (int k = 0; k < 3; k++) run_toy(s, X, y);
    for (int i = 0; i < 4; i++) CHECK(close_to(y[i], want[i]));
    CHECK_OK(uaii_session_profile_summary(s, summary, sizeof summary));
    CHECK(strstr(summary, "create") != NULL && strstr(summary, "run") != NULL);
    CHECK_OK(uaii_session_write_trace(s, path_in(dir, "explicit.trace.json")));
    CHECK(file_exists(path_in(dir, "explicit.trace.json")));
    uaii_session_destroy(s);
    CHECK(file_exists(trace)); /* written by destroy */

    s = open_toy(path_in(sub, "again.uaii.json"), NULL);
    run_toy(s, X, y);
    for (int i = 0; i < 4; i++) CHECK(close_to(y[i], want[i]));
    uaii_session_destroy(s);
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    filled();
    real_weights();
    weights_dir_and_sandbox();
    converted_and_profiled();
    test_done("test_toy_graphs");
    return 0;
}
