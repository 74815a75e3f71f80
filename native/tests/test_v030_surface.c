/* test_v030_surface.c — a program written against the C API 0.3.0 surface only: the names, types, enum values and
 * fields the C++ runtime's uaii.h declared, nothing this library added. It must compile with
 * `-std=c99 -Wall -Werror` and run unchanged. Self-contained on purpose (no test helper header).
 *
 * Usage: test_v030_surface SCRATCH_DIR
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uaii/c_api/uaii.h"

static int checks = 0;

static void check(int ok, const char* what, int line) {
    checks++;
    if (!ok) {
        fprintf(stderr, "test_v030_surface.c:%d: %s failed (last error: \"%s\")\n", line, what, uaii_last_error());
        exit(1);
    }
}
#define CHECK(c) check((c) ? 1 : 0, #c, __LINE__)

static int near(float a, float b) { return (a > b ? a - b : b - a) < 1e-6f; }

static void write_graph(const char* path) {
    /* MatMul -> Relu -> MatMul -> Softmax with four weights, none of which exists on disk */
    static const char* text =
        "{\"ir_version\": {\"major\": 1, \"minor\": 0}, \"name\": \"toy\", \"producer\": \"c\", \"domain\": \"uaii\",\n"
        " \"tensors\": [\n"
        "  {\"id\": 1, \"name\": \"x\", \"dtype\": \"f32\", \"shape\": [1, 4], \"storage_hint\": \"ram\", "
        "\"is_weight\": false, \"weight_ref\": \"\"},\n"
        "  {\"id\": 2, \"name\": \"w1\", \"dtype\": \"f32\", \"shape\": [4, 8], \"storage_hint\": \"external\", "
        "\"is_weight\": true, \"weight_ref\": \"weights/w1.bin\"},\n"
        "  {\"id\": 3, \"name\": \"b1\", \"dtype\": \"f32\", \"shape\": [8], \"storage_hint\": \"external\", "
        "\"is_weight\": true, \"weight_ref\": \"weights/b1.bin\"},\n"
        "  {\"id\": 4, \"name\": \"w2\", \"dtype\": \"f32\", \"shape\": [8, 4], \"storage_hint\": \"external\", "
        "\"is_weight\": true, \"weight_ref\": \"weights/w2.bin\"},\n"
        "  {\"id\": 5, \"name\": \"b2\", \"dtype\": \"f32\", \"shape\": [4], \"storage_hint\": \"external\", "
        "\"is_weight\": true, \"weight_ref\": \"weights/b2.bin\"},\n"
        "  {\"id\": 6, \"name\": \"h\", \"dtype\": \"f32\", \"shape\": [1, 8], \"storage_hint\": \"ram\", "
        "\"is_weight\": false, \"weight_ref\": \"\"},\n"
        "  {\"id\": 7, \"name\": \"hb\", \"dtype\": \"f32\", \"shape\": [1, 8], \"storage_hint\": \"ram\", "
        "\"is_weight\": false, \"weight_ref\": \"\"},\n"
        "  {\"id\": 8, \"name\": \"a\", \"dtype\": \"f32\", \"shape\": [1, 8], \"storage_hint\": \"ram\", "
        "\"is_weight\": false, \"weight_ref\": \"\"},\n"
        "  {\"id\": 9, \"name\": \"y\", \"dtype\": \"f32\", \"shape\": [1, 4], \"storage_hint\": \"ram\", "
        "\"is_weight\": false, \"weight_ref\": \"\"},\n"
        "  {\"id\": 10, \"name\": \"yb\", \"dtype\": \"f32\", \"shape\": [1, 4], \"storage_hint\": \"ram\", "
        "\"is_weight\": false, \"weight_ref\": \"\"},\n"
        "  {\"id\": 11, \"name\": \"y_prob\", \"dtype\": \"f32\", \"shape\": [1, 4], \"storage_hint\": \"ram\", "
        "\"is_weight\": false, \"weight_ref\": \"\"}],\n"
        " \"nodes\": [\n"
        "  {\"id\": 1, \"name\": \"fc1\", \"op_name\": \"MatMul\", \"op_version\": \"1\", \"inputs\": [1, 2], "
        "\"outputs\": [6], \"attributes\": []},\n"
        "  {\"id\": 2, \"name\": \"bias1\", \"op_name\": \"Add\", \"op_version\": \"1\", \"inputs\": [6, 3], "
        "\"outputs\": [7], \"attributes\": []},\n"
        "  {\"id\": 3, \"name\": \"act\", \"op_name\": \"Relu\", \"op_version\": \"1\", \"inputs\": [7], "
        "\"outputs\": [8], \"attributes\": []},\n"
        "  {\"id\": 4, \"name\": \"fc2\", \"op_name\": \"MatMul\", \"op_version\": \"1\", \"inputs\": [8, 4], "
        "\"outputs\": [9], \"attributes\": []},\n"
        "  {\"id\": 5, \"name\": \"bias2\", \"op_name\": \"Add\", \"op_version\": \"1\", \"inputs\": [9, 5], "
        "\"outputs\": [10], \"attributes\": []},\n"
        "  {\"id\": 6, \"name\": \"prob\", \"op_name\": \"Softmax\", \"op_version\": \"1\", \"inputs\": [10], "
        "\"outputs\": [11], \"attributes\": [{\"key\": \"axis\", \"type\": \"int\", \"value\": -1}]}],\n"
        " \"inputs\": [1], \"outputs\": [11], \"metadata\": {}}\n";
    FILE* f = fopen(path, "w");
    CHECK(f != NULL);
    CHECK(fputs(text, f) >= 0);
    CHECK(fclose(f) == 0);
}

static void run_toy(uaii_session* s) {
    const float x[4] = {1.0f, -2.0f, 3.0f, 0.5f};
    float y[4] = {0};
    size_t n = 0;
    CHECK(uaii_session_set_f32(s, "x", x, 4) == UAII_OK);
    CHECK(strcmp(uaii_last_error(), "") == 0);
    CHECK(uaii_session_run(s) == UAII_OK);
    CHECK(uaii_session_get_f32(s, "y_prob", NULL, 0, &n) == UAII_OK && n == 4); /* size query */
    CHECK(uaii_session_get_f32(s, "y_prob", y, 3, &n) == UAII_ERR_INVALID_ARGUMENT);
    CHECK(uaii_session_get_f32(s, "y_prob", y, 4, &n) == UAII_OK && n == 4);
    CHECK(near(y[0], 0.25f) && near(y[1], 0.25f) && near(y[2], 0.25f) && near(y[3], 0.25f));
}

int main(int argc, char** argv) {
    char graph[1024], binary[1024], trace[1024], summary[4096];
    int major = -1, minor = -1, patch = -1;
    uaii_session* s = NULL;
    uaii_session_options o;
    FILE* f;
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    snprintf(graph, sizeof graph, "%s/v030.uaii.json", argv[1]);
    snprintf(binary, sizeof binary, "%s/v030.uaii", argv[1]);
    snprintf(trace, sizeof trace, "%s/v030.trace.json", argv[1]);

    /* versions and names */
    CHECK(uaii_get_version(&major, &minor, &patch) == UAII_OK && major >= 0 && minor >= 0 && patch >= 0);
    CHECK(uaii_get_version(NULL, &minor, &patch) == UAII_ERR_INVALID_ARGUMENT);
    CHECK(uaii_get_version_string() != NULL && uaii_get_version_string()[0] != '\0');
    uaii_get_c_api_version(&major, &minor, &patch);
    CHECK(major == 0 && minor == 3 && patch == 0);
    CHECK(strcmp(uaii_get_c_api_version_string(), "0.3.0") == 0);
    CHECK(strcmp(uaii_status_name(UAII_OK), "ok") == 0);
    CHECK(strcmp(uaii_status_name(UAII_ERR_INVALID_ARGUMENT), "invalid_argument") == 0);
    CHECK(strcmp(uaii_status_name(UAII_ERR_NOT_FOUND), "not_found") == 0);
    CHECK(strcmp(uaii_status_name(UAII_ERR_IO), "io") == 0);
    CHECK(strcmp(uaii_status_name(UAII_ERR_CONFIG), "config") == 0);
    CHECK(strcmp(uaii_status_name(UAII_ERR_PLUGIN), "plugin") == 0);
    CHECK(strcmp(uaii_status_name(UAII_ERR_ABI), "abi") == 0);
    CHECK(strcmp(uaii_status_name(UAII_ERR_NOT_IMPLEMENTED), "not_implemented") == 0);
    CHECK(strcmp(uaii_status_name(UAII_ERR_INTERNAL), "internal") == 0);
    CHECK(strcmp(uaii_status_name((uaii_status)9), "unknown") == 0);
    CHECK(uaii_last_error() != NULL);

    /* defaults */
    uaii_session_options_init(&o);
    CHECK(o.struct_size == sizeof(uaii_session_options));
    CHECK(o.backend != NULL && strcmp(o.backend, "cpu") == 0);
    CHECK(o.weights_dir == NULL && o.weight_init == UAII_WEIGHT_INIT_NONE);
    CHECK(o.enable_fusion == 1 && o.enable_memory_reuse == 1 && o.enable_profiler == 0);
    CHECK(o.profile_trace_path == NULL && o.budget_bytes == 0 && o.enable_streaming == 0);
    CHECK(o.allow_missing_weights == 0 && o.weights_sandbox == NULL);
    CHECK(o.compute_dtype == UAII_COMPUTE_DTYPE_F32 && o.keep_quantized_weights == 1 && o.max_context == 0);

    /* missing weights fail closed, with and without options */
    write_graph(graph);
    CHECK(uaii_session_create(graph, NULL, &s) == UAII_ERR_NOT_FOUND && s == NULL);
    CHECK(strstr(uaii_last_error(), "w1") != NULL);
    CHECK(uaii_session_create(graph, &o, &s) == UAII_ERR_NOT_FOUND && s == NULL);
    CHECK(uaii_session_create("/nonexistent/model.gguf", &o, &s) == UAII_ERR_NOT_FOUND);

    /* filled with ones: y_prob = [0.25, 0.25, 0.25, 0.25] */
    o.allow_missing_weights = 1;
    o.weight_init = UAII_WEIGHT_INIT_ONES;
    o.enable_profiler = 1;
    o.profile_trace_path = trace;
    CHECK(uaii_session_create(graph, &o, &s) == UAII_OK && s != NULL);
    CHECK(uaii_last_error()[0] == '\0');
    run_toy(s);
    CHECK(uaii_session_profile_summary(s, summary, sizeof summary) == UAII_OK);
    CHECK(strstr(summary, "run") != NULL);
    CHECK(uaii_session_write_trace(s, trace) == UAII_OK);
    {
        int64_t prompt[2] = {1, 2}, out[8];
        size_t n = 0;
        CHECK(uaii_session_generate(s, prompt, 2, 4, out, 8, &n) == UAII_ERR_NOT_IMPLEMENTED);
    }
    uaii_session_destroy(s);
    f = fopen(trace, "r");
    CHECK(f != NULL && fgetc(f) == '{');
    fclose(f);
    uaii_session_destroy(NULL);

    /* the same graph through the binary IR format */
    CHECK(uaii_convert_model(graph, binary) == UAII_OK);
    o.enable_profiler = 0;
    o.profile_trace_path = NULL;
    s = NULL;
    CHECK(uaii_session_create(binary, &o, &s) == UAII_OK);
    run_toy(s);
    uaii_session_destroy(s);

    printf("test_v030_surface: %d checks passed\n", checks);
    return 0;
}
