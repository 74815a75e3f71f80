/* test_ir_generate.c — generation on an IR (.uaii) language model whose weights are not beside it: found through
 * weights_dir (also confined by weights_sandbox, also streamed under a memory budget), and with some weights missing
 * and filled (allow_missing_weights + weight_init). The tokens must equal uaii.runtime.Session's on the original
 * model, and the weights the options point at must win over a decoy copy beside the graph (no silent fallback).
 *
 * Usage: test_ir_generate SCRATCH_DIR. Environment (set by tests/capi; skipped when unset): UAII_TEST_IR_DIR with
 *   model/llama.uaii    the converted model; its references name "llama.gguf"
 *   model/llama.gguf    a decoy: the same architecture with other weights
 *   model/nonorms.uaii  the same graph whose RMSNorm scales reference missing raw files (the real ones are all 1)
 *   weights/llama.gguf  the real weights
 * UAII_TEST_PROMPT_TOKENS and UAII_TEST_EXPECT (prompt + greedy tokens of the Session on the original model).
 */
#include "uaii_test.h"

#define MAX_TOKENS 256

static const char* ir_dir;
static int64_t expect[MAX_TOKENS];
static size_t expect_n;
static int64_t prompt[MAX_TOKENS];
static size_t prompt_n;

static int generates_expected(uaii_session* s) {
    int64_t out[MAX_TOKENS];
    size_t n = 0;
    CHECK_OK(uaii_session_generate(s, prompt, prompt_n, (int64_t)(expect_n - prompt_n), out, MAX_TOKENS, &n));
    CHECK(n == expect_n);
    return memcmp(out, expect, expect_n * sizeof expect[0]) == 0;
}

static uaii_session_options relocated(void) {
    uaii_session_options o;
    uaii_session_options_init(&o);
    o.weights_dir = path_in(ir_dir, "weights");
    return o;
}

static void weights_dir(void) {
    const char* graph = path_in(ir_dir, "model/llama.uaii");
    uaii_session_options o = relocated();
    uaii_session* s = NULL;
    uaii_generate_params p;
    uaii_generation_stats st;
    int64_t out[MAX_TOKENS], ids[4];
    size_t n = 0;
    float scale[64];

    /* without options the decoy beside the graph is what the references name: it opens, and answers otherwise */
    CHECK_OK(uaii_session_create(graph, NULL, &s));
    CHECK(!generates_expected(s));
    uaii_session_destroy(s);

    CHECK_OK(uaii_session_create(graph, &o, &s));
    CHECK(generates_expected(s));
    CHECK(generates_expected(s)); /* again, with the KV cache of the first call */
    uaii_generate_params_init(&p);
    p.max_new_tokens = (int64_t)(expect_n - prompt_n);
    CHECK_OK(uaii_session_generate_v2(s, prompt, prompt_n, &p, out, MAX_TOKENS, &n));
    CHECK(n == expect_n && memcmp(out, expect, expect_n * sizeof expect[0]) == 0);
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    CHECK_OK(uaii_session_get_stats(s, &st));
    CHECK(st.generated_tokens == (int64_t)(expect_n - prompt_n) && st.prompt_tokens == (int64_t)prompt_n);
    /* a weight reads back from the relocated file */
    CHECK_OK(uaii_session_get_f32(s, "blk.0.attn_norm.weight", scale, 64, &n));
    CHECK(n == 64 && scale[0] == 1.0f && scale[63] == 1.0f);
    /* the graph carries no tokenizer, and the error says so */
    CHECK_STATUS(uaii_session_tokenize(s, "hi", 0, 0, ids, 4, &n), UAII_ERR_NOT_IMPLEMENTED, "tokenizer");
    uaii_session_destroy(s);

    o.weights_sandbox = path_in(ir_dir, "weights");
    CHECK_OK(uaii_session_create(graph, &o, &s));
    CHECK(generates_expected(s));
    uaii_session_destroy(s);

    /* under a budget the weights stream from the relocated file */
    o = relocated();
    o.budget_bytes = 16u << 20;
    CHECK_OK(uaii_session_create(graph, &o, &s));
    CHECK(generates_expected(s));
    uaii_session_destroy(s);
}

static void filled(void) {
    const char* graph = path_in(ir_dir, "model/nonorms.uaii");
    uaii_session_options o = relocated();
    uaii_session* s = NULL;
    char warnings[4096];
    size_t n = 0;
    float scale[64];

    CHECK_STATUS(uaii_session_create(graph, &o, &s), UAII_ERR_NOT_FOUND, "blk.0.attn_norm.weight");
    CHECK(s == NULL);
    o.allow_missing_weights = 1;
    CHECK_STATUS(uaii_session_create(graph, &o, &s), UAII_ERR_NOT_FOUND, "weight_init");
    o.weight_init = UAII_WEIGHT_INIT_ONES;
    CHECK_OK(uaii_session_create(graph, &o, &s));
    CHECK(generates_expected(s));
    CHECK_OK(uaii_session_warnings(s, warnings, sizeof warnings, &n));
    CHECK(strstr(warnings, "'output_norm.weight'") != NULL && strstr(warnings, "filled with ones") != NULL);
    CHECK(strstr(warnings, "token_embd") == NULL); /* only the missing ones */
    CHECK_OK(uaii_session_get_f32(s, "blk.1.ffn_norm.weight", scale, 64, &n));
    CHECK(n == 64 && scale[0] == 1.0f && scale[63] == 1.0f);
    uaii_session_destroy(s);

    /* filled weights stream like the others under a budget */
    o.budget_bytes = 16u << 20;
    CHECK_OK(uaii_session_create(graph, &o, &s));
    CHECK(generates_expected(s));
    uaii_session_destroy(s);

    /* zeros are a different model: the fill is what runs, not some other copy of the scales */
    o.budget_bytes = 0;
    o.weight_init = UAII_WEIGHT_INIT_ZEROS;
    CHECK_OK(uaii_session_create(graph, &o, &s));
    CHECK(!generates_expected(s));
    uaii_session_destroy(s);
}

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    ir_dir = getenv("UAII_TEST_IR_DIR");
    if (ir_dir == NULL || ir_dir[0] == '\0') {
        printf("test_ir_generate: skipped (UAII_TEST_IR_DIR not set)\n");
        return UAII_TEST_SKIP;
    }
    expect_n = parse_tokens(getenv("UAII_TEST_EXPECT"), expect, MAX_TOKENS);
    prompt_n = parse_tokens(getenv("UAII_TEST_PROMPT_TOKENS"), prompt, MAX_TOKENS);
    CHECK(expect_n > prompt_n + 4 && prompt_n > 0);
    CHECK_OK(UAII_CHECK_VERSION());
    weights_dir();
    filled();
    test_done("test_ir_generate");
    return 0;
}
