/* test_errors.c — every error path of every function: NULL arguments, bad struct_size, missing files, too-small
 * buffers, dead handles, options the library cannot honour. Each failure must return the documented status and
 * leave a last error that says what went wrong; each success must clear it.
 *
 * Usage: test_errors SCRATCH_DIR
 */
#include "uaii_test.h"

static const char* dir;

static uaii_session* toy_session(int profiler) {
    uaii_session* s = NULL;
    uaii_session_options o = toy_options(UAII_WEIGHT_INIT_ONES);
    o.enable_profiler = profiler;
    CHECK_OK(uaii_session_create(path_in(dir, "toy.uaii.json"), &o, &s));
    CHECK(s != NULL);
    return s;
}

static void versions(void) {
    int a = 0, b = 0, c = 0;
    CHECK_STATUS(uaii_get_version(NULL, &b, &c), UAII_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_STATUS(uaii_get_version(&a, NULL, &c), UAII_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_STATUS(uaii_get_version(&a, &b, NULL), UAII_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_OK(uaii_get_version(&a, &b, &c)); /* and a success clears the error */
    uaii_get_c_api_version(NULL, NULL, NULL);   /* skipped, no crash */
    CHECK(uaii_abi_version() == UAII_ABI_VERSION);
    CHECK_OK(UAII_CHECK_VERSION());
    CHECK_STATUS(uaii_check_version(1, 0, 0), UAII_ERR_ABI, "major");
    CHECK_STATUS(uaii_check_version(0, 2, 0), UAII_ERR_ABI, "minor");
    CHECK_STATUS(uaii_check_version(0, 4, 0), UAII_ERR_ABI, "0.3.0");
    CHECK_STATUS(uaii_check_version(0, 3, 1), UAII_ERR_ABI, "patch");
    CHECK(strcmp(uaii_status_name((uaii_status)-1), "unknown") == 0);
    CHECK(strcmp(uaii_status_name((uaii_status)1000), "unknown") == 0);
    uaii_session_options_init(NULL);
    uaii_session_options_init_sized(NULL, sizeof(uaii_session_options));
    uaii_generate_params_init_sized(NULL, sizeof(uaii_generate_params));
}

static void create_errors(void) {
    uaii_session* s = (uaii_session*)&dir; /* not NULL: a failed create must reset it */
    uaii_session_options o;
    const char* toy = path_in(dir, "toy.uaii.json");
    uaii_session_options_init(&o);
    CHECK_STATUS(uaii_session_create(NULL, &o, &s), UAII_ERR_INVALID_ARGUMENT, "path");
    CHECK(s == NULL);
    CHECK_STATUS(uaii_session_create(toy, &o, NULL), UAII_ERR_INVALID_ARGUMENT, "out");
    CHECK_STATUS(uaii_session_create(path_in(dir, "missing.gguf"), &o, &s), UAII_ERR_NOT_FOUND, "missing.gguf");
    CHECK_STATUS(uaii_session_create(path_in(dir, "missing.uaii.json"), NULL, &s), UAII_ERR_NOT_FOUND, "missing");
    /* fail closed: the first missing weight is named */
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_NOT_FOUND, "'w1'");
    CHECK_STATUS(uaii_session_create(toy, NULL, &s), UAII_ERR_NOT_FOUND, "w1.bin");
    o.allow_missing_weights = 1; /* ... and weight_init NONE still fails closed */
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_NOT_FOUND, "NONE");
    CHECK(s == NULL);

    /* struct_size */
    o = toy_options(UAII_WEIGHT_INIT_ONES);
    o.struct_size = 0;
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_ABI, "struct_size is 0");
    o.struct_size = sizeof(uaii_session_options) + 8;
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_ABI, "larger");
    o.struct_size = 12; /* ends inside `backend` */
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_ABI, "inside field");

    /* option values */
    o = toy_options(UAII_WEIGHT_INIT_ONES);
    o.weight_init = (uaii_weight_init)42;
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_INVALID_ARGUMENT, "weight_init");
    o = toy_options(UAII_WEIGHT_INIT_ONES);
    o.compute_dtype = 7;
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_INVALID_ARGUMENT, "compute_dtype");
    o.compute_dtype = UAII_COMPUTE_DTYPE_F16;
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_CONFIG, "F16");
    o = toy_options(UAII_WEIGHT_INIT_ONES);
    o.max_context = -1;
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_INVALID_ARGUMENT, "max_context");
    o = toy_options(UAII_WEIGHT_INIT_ONES);
    o.preset = "no-such-preset";
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_CONFIG, "no-such-preset");
    o = toy_options(UAII_WEIGHT_INIT_ONES);
    o.backend = "no-such-backend";
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_PLUGIN, "no-such-backend");
    o = toy_options(UAII_WEIGHT_INIT_ONES);
    o.weights_dir = "\xff\xfe";
    CHECK_STATUS(uaii_session_create(toy, &o, &s), UAII_ERR_INVALID_ARGUMENT, "UTF-8");

    /* files that are not models */
    write_text(path_in(dir, "garbage.uaii.json"), "{ this is not json");
    CHECK_STATUS(uaii_session_create(path_in(dir, "garbage.uaii.json"), NULL, &s), UAII_ERR_INVALID_ARGUMENT,
                 "garbage.uaii.json");
    write_text(path_in(dir, "garbage.bin"), "0123456789abcdef");
    CHECK_STATUS(uaii_session_create(path_in(dir, "garbage.bin"), NULL, &s), UAII_ERR_INVALID_ARGUMENT, NULL);
    CHECK(s == NULL);
}

static void tensor_errors(void) {
    uaii_session* s = toy_session(0);
    float x[4] = {1, 2, 3, 4}, y[4];
    size_t n = 99;
    CHECK_STATUS(uaii_session_set_f32(NULL, "x", x, 4), UAII_ERR_INVALID_ARGUMENT, "session");
    CHECK_STATUS(uaii_session_set_f32(s, NULL, x, 4), UAII_ERR_INVALID_ARGUMENT, "name");
    CHECK_STATUS(uaii_session_set_f32(s, "x", NULL, 4), UAII_ERR_INVALID_ARGUMENT, "data");
    CHECK_STATUS(uaii_session_set_f32(s, "x", x, 3), UAII_ERR_INVALID_ARGUMENT, "4 elements");
    CHECK_STATUS(uaii_session_set_f32(s, "nope", x, 4), UAII_ERR_NOT_FOUND, "nope");
    CHECK_STATUS(uaii_session_set_f32(s, "w1", x, 4), UAII_ERR_INVALID_ARGUMENT, "weight");
    CHECK_STATUS(uaii_session_set_f32(s, "h", x, 4), UAII_ERR_INVALID_ARGUMENT, "not a graph input");

    CHECK_STATUS(uaii_session_run(NULL), UAII_ERR_INVALID_ARGUMENT, "session");
    CHECK_STATUS(uaii_session_run(s), UAII_ERR_INVALID_ARGUMENT, "x");  /* input never set */

    CHECK_STATUS(uaii_session_get_f32(NULL, "y_prob", y, 4, &n), UAII_ERR_INVALID_ARGUMENT, "session");
    CHECK_STATUS(uaii_session_get_f32(s, NULL, y, 4, &n), UAII_ERR_INVALID_ARGUMENT, "name");
    CHECK_STATUS(uaii_session_get_f32(s, "y_prob", y, 4, NULL), UAII_ERR_INVALID_ARGUMENT, "out_n");
    CHECK_STATUS(uaii_session_get_f32(s, "y_prob", y, 4, &n), UAII_ERR_NOT_FOUND, "uaii_session_run");
    CHECK_STATUS(uaii_session_get_f32(s, "nope", y, 4, &n), UAII_ERR_NOT_FOUND, "nope");
    CHECK_STATUS(uaii_session_get_f32(s, "h", y, 4, &n), UAII_ERR_NOT_FOUND, "'h'");

    CHECK_OK(uaii_session_set_f32(s, "x", x, 4));
    CHECK_OK(uaii_session_run(s));
    n = 0;
    CHECK_STATUS(uaii_session_get_f32(s, "y_prob", y, 3, &n), UAII_ERR_INVALID_ARGUMENT, "too small");
    CHECK(n == 4); /* the needed count is still reported */
    CHECK_OK(uaii_session_get_f32(s, "y_prob", NULL, 0, &n));
    CHECK(n == 4);
    uaii_session_destroy(s);

    /* a destroyed handle is refused, not dereferenced */
    CHECK_STATUS(uaii_session_run(s), UAII_ERR_INVALID_ARGUMENT, "not a live");
    CHECK_STATUS(uaii_session_set_f32(s, "x", x, 4), UAII_ERR_INVALID_ARGUMENT, "not a live");
    uaii_session_destroy(s); /* double destroy: no crash, an error */
    CHECK(strstr(uaii_last_error(), "not a live") != NULL);
    uaii_session_destroy(NULL);
    CHECK(uaii_last_error()[0] == '\0');
}

static void generation_errors(void) {
    uaii_session* s = toy_session(0);
    int64_t prompt[2] = {1, 2}, out[8];
    size_t n = 0;
    char buf[64];
    uaii_generate_params p;
    uaii_generation_stats st;
    CHECK_STATUS(uaii_session_generate(NULL, prompt, 2, 4, out, 8, &n), UAII_ERR_INVALID_ARGUMENT, "session");
    CHECK_STATUS(uaii_session_generate(s, NULL, 2, 4, out, 8, &n), UAII_ERR_INVALID_ARGUMENT, "prompt_tokens");
    CHECK_STATUS(uaii_session_generate(s, prompt, 0, 4, out, 8, &n), UAII_ERR_INVALID_ARGUMENT, "prompt_n");
    CHECK_STATUS(uaii_session_generate(s, prompt, 2, -1, out, 8, &n), UAII_ERR_INVALID_ARGUMENT,
                 "max_new_tokens");
    CHECK_STATUS(uaii_session_generate(s, prompt, 2, 4, out, 8, NULL), UAII_ERR_INVALID_ARGUMENT, "out_n");
    CHECK_STATUS(uaii_session_generate(s, prompt, 2, 4, NULL, 8, &n), UAII_ERR_INVALID_ARGUMENT, "out_tokens");
    CHECK_STATUS(uaii_session_generate(s, prompt, 2, 4, out, 8, &n), UAII_ERR_NOT_IMPLEMENTED, "language model");

    uaii_generate_params_init(&p);
    CHECK(p.struct_size == sizeof p && p.max_new_tokens == 128 && p.temperature == 0.0f && p.top_p == 1.0f);
    CHECK(p.repetition_penalty == 1.0f && p.seed == -1 && p.on_token == NULL && p.stop_token_ids == NULL);
    p.struct_size = 0;
    CHECK_STATUS(uaii_session_generate_v2(s, prompt, 2, &p, out, 8, &n), UAII_ERR_ABI, "struct_size");
    p.struct_size = sizeof p + 16;
    CHECK_STATUS(uaii_session_generate_v2(s, prompt, 2, &p, out, 8, &n), UAII_ERR_ABI, "larger");
    uaii_generate_params_init(&p);
    p.top_p = 0.0f;
    CHECK_STATUS(uaii_session_generate_v2(s, prompt, 2, &p, out, 8, &n), UAII_ERR_INVALID_ARGUMENT, "top_p");
    uaii_generate_params_init(&p);
    p.n_stop_token_ids = 2; /* with a NULL array */
    CHECK_STATUS(uaii_session_generate_v2(s, prompt, 2, &p, out, 8, &n), UAII_ERR_INVALID_ARGUMENT,
                 "stop_token_ids");
    CHECK_STATUS(uaii_session_generate_v2(s, prompt, 2, NULL, out, 8, &n), UAII_ERR_NOT_IMPLEMENTED, NULL);

    /* no tokenizer on an IR graph */
    CHECK_STATUS(uaii_session_tokenize(s, "hi", 1, 0, out, 8, &n), UAII_ERR_NOT_IMPLEMENTED, "tokenizer");
    CHECK_STATUS(uaii_session_tokenize(s, NULL, 1, 0, out, 8, &n), UAII_ERR_INVALID_ARGUMENT, "text");
    CHECK_STATUS(uaii_session_tokenize(s, "hi", 1, 0, out, 8, NULL), UAII_ERR_INVALID_ARGUMENT, "out_n");
    CHECK_STATUS(uaii_session_detokenize(s, prompt, 2, buf, sizeof buf, &n), UAII_ERR_NOT_IMPLEMENTED,
                 "tokenizer");
    CHECK_STATUS(uaii_session_detokenize(s, NULL, 2, buf, sizeof buf, &n), UAII_ERR_INVALID_ARGUMENT, "tokens");
    CHECK_STATUS(uaii_session_detokenize(s, prompt, 2, buf, sizeof buf, NULL), UAII_ERR_INVALID_ARGUMENT,
                 "out_len");
    {
        uaii_chat_message m = {"user", "hi"}, bad = {NULL, "hi"};
        CHECK_STATUS(uaii_session_apply_chat_template(s, &m, 1, 1, buf, sizeof buf, &n), UAII_ERR_NOT_IMPLEMENTED,
                     "tokenizer");
        CHECK_STATUS(uaii_session_apply_chat_template(s, NULL, 1, 1, buf, sizeof buf, &n),
                     UAII_ERR_INVALID_ARGUMENT, "messages");
        CHECK_STATUS(uaii_session_apply_chat_template(s, &bad, 1, 1, buf, sizeof buf, &n),
                     UAII_ERR_INVALID_ARGUMENT, "role");
    }

    /* stats: nothing generated yet */
    CHECK_STATUS(uaii_session_get_stats(s, NULL), UAII_ERR_INVALID_ARGUMENT, "out");
    memset(&st, 0xab, sizeof st);
    st.struct_size = 0;
    CHECK_STATUS(uaii_session_get_stats(s, &st), UAII_ERR_ABI, "struct_size");
    st.struct_size = sizeof st;
    CHECK_OK(uaii_session_get_stats(s, &st));
    CHECK(st.struct_size == sizeof st && st.finish_reason == UAII_FINISH_NONE && st.generated_tokens == 0);
    st.struct_size = 8; /* an older, smaller struct gets only its own bytes */
    st.prompt_tokens = 12345;
    CHECK_OK(uaii_session_get_stats(s, &st));
    CHECK(st.struct_size == 8 && st.prompt_tokens == 12345);
    uaii_session_destroy(s);
}

static void profile_and_text_errors(void) {
    uaii_session* s = toy_session(0);
    uaii_session* p = toy_session(1);
    char buf[256], tiny[8];
    size_t n = 0;
    float x[4] = {0};
    CHECK_STATUS(uaii_session_profile_summary(s, buf, sizeof buf), UAII_ERR_CONFIG, "enable_profiler");
    CHECK_STATUS(uaii_session_write_trace(s, path_in(dir, "t.json")), UAII_ERR_CONFIG, "enable_profiler");
    CHECK_STATUS(uaii_session_profile_summary(NULL, buf, sizeof buf), UAII_ERR_INVALID_ARGUMENT, "session");
    CHECK_STATUS(uaii_session_profile_summary(p, NULL, 10), UAII_ERR_INVALID_ARGUMENT, "buf");
    CHECK_STATUS(uaii_session_profile_summary(p, buf, 0), UAII_ERR_INVALID_ARGUMENT, "capacity");
    CHECK_OK(uaii_session_set_f32(p, "x", x, 4));
    CHECK_OK(uaii_session_run(p));
    CHECK_OK(uaii_session_profile_summary(p, tiny, sizeof tiny)); /* truncated, still terminated */
    CHECK(strlen(tiny) == sizeof tiny - 1);
    CHECK_STATUS(uaii_session_write_trace(p, NULL), UAII_ERR_INVALID_ARGUMENT, "path");
    CHECK_STATUS(uaii_session_write_trace(p, "/nonexistent-dir/trace.json"), UAII_ERR_IO, NULL);
    CHECK_STATUS(uaii_session_write_trace(NULL, "x.json"), UAII_ERR_INVALID_ARGUMENT, "session");

    /* warnings: size query, too small, exact */
    CHECK_STATUS(uaii_session_warnings(p, buf, sizeof buf, NULL), UAII_ERR_INVALID_ARGUMENT, "out_len");
    CHECK_OK(uaii_session_warnings(p, NULL, 0, &n));
    CHECK(n > 0);
    CHECK_STATUS(uaii_session_warnings(p, tiny, sizeof tiny, &n), UAII_ERR_INVALID_ARGUMENT, "too small");
    CHECK(n > sizeof tiny);
    uaii_session_destroy(s);
    uaii_session_destroy(p);
}

static void convert_errors(void) {
    const char* toy = path_in(dir, "toy.uaii.json");
    CHECK_STATUS(uaii_convert_model(NULL, "x.uaii"), UAII_ERR_INVALID_ARGUMENT, "input_path");
    CHECK_STATUS(uaii_convert_model(toy, NULL), UAII_ERR_INVALID_ARGUMENT, "output_path");
    CHECK_STATUS(uaii_convert_model(path_in(dir, "missing.gguf"), path_in(dir, "o.uaii")), UAII_ERR_NOT_FOUND,
                 "missing.gguf");
    CHECK_STATUS(uaii_convert_model(toy, path_in(dir, "out.txt")), UAII_ERR_INVALID_ARGUMENT, "extension");
    CHECK_STATUS(uaii_convert_model(toy, "/nonexistent-dir/out.uaii"), UAII_ERR_IO, "nonexistent-dir");
    CHECK_OK(uaii_convert_model(toy, path_in(dir, "ok.uaii")));
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    write_toy_graph(path_in(dir, "toy.uaii.json"), "weights");
    versions();
    create_errors();
    tensor_errors();
    generation_errors();
    profile_and_text_errors();
    convert_errors();
    test_done("test_errors");
    return 0;
}
