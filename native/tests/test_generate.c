/* test_generate.c — a real language model (SmolLM2-135M GGUF) through the C API: tokenize / detokenize, chat
 * template, greedy generation equal to the Python Session's tokens, generation with callback, stop tokens, stop
 * strings, seeded sampling, statistics, the context limit, two sessions generating in two threads at once, and
 * conversion to IR.
 *
 * Usage: test_generate SCRATCH_DIR. Environment (set by tests/capi): UAII_TEST_MODEL (the GGUF; skipped when
 * unset), UAII_TEST_PROMPT, UAII_TEST_EXPECT (prompt + greedy tokens from uaii.runtime.Session, space separated),
 * UAII_TEST_CHAT_TOKENS (tokens of the chat-templated question).
 */
#define _POSIX_C_SOURCE 200809L /* pthread */
#include <pthread.h>

#include "uaii_test.h"

#define MAX_TOKENS 512

static const char* scratch;
static const char* model;
static const char* prompt_text;
static int64_t expect[MAX_TOKENS];
static size_t expect_n;
static int64_t prompt[MAX_TOKENS];
static size_t prompt_n;

typedef struct collected {
    int64_t tokens[MAX_TOKENS];
    size_t n;
    char text[8192];
    size_t text_len;
    int stop_after; /* 0: never */
    uaii_session* session; /* when set, the callback tries to re-enter it */
    uaii_status reentry;
} collected;

static int on_token(void* user_data, int64_t token, const char* piece, size_t piece_len) {
    collected* c = (collected*)user_data;
    if (token >= 0 && c->n < MAX_TOKENS) c->tokens[c->n++] = token;
    if (c->text_len + piece_len < sizeof c->text) {
        memcpy(c->text + c->text_len, piece, piece_len);
        c->text_len += piece_len;
        c->text[c->text_len] = '\0';
    }
    if (c->session != NULL) {
        size_t n = 0;
        int64_t ids[8];
        c->reentry = uaii_session_tokenize(c->session, "x", 0, 0, ids, 8, &n);
    }
    return c->stop_after > 0 && (int)c->n >= c->stop_after;
}

static void tokens_and_text(uaii_session* s) {
    int64_t ids[MAX_TOKENS];
    size_t n = 0, len = 0;
    char text[1024];
    CHECK_OK(uaii_session_tokenize(s, prompt_text, 1, 0, NULL, 0, &n)); /* size query */
    CHECK(n == prompt_n);
    CHECK_STATUS(uaii_session_tokenize(s, prompt_text, 1, 0, ids, n - 1, &n), UAII_ERR_INVALID_ARGUMENT, "small");
    CHECK(n == prompt_n);
    CHECK_OK(uaii_session_tokenize(s, prompt_text, 1, 0, ids, MAX_TOKENS, &n));
    CHECK(n == prompt_n && memcmp(ids, prompt, n * sizeof ids[0]) == 0);

    CHECK_OK(uaii_session_detokenize(s, prompt, prompt_n, NULL, 0, &len));
    CHECK(len == strlen(prompt_text));
    CHECK_STATUS(uaii_session_detokenize(s, prompt, prompt_n, text, len, &len), UAII_ERR_INVALID_ARGUMENT, "NUL");
    CHECK_OK(uaii_session_detokenize(s, prompt, prompt_n, text, sizeof text, &len));
    CHECK(strcmp(text, prompt_text) == 0 && len == strlen(text));
    {
        int64_t bad = 1000000000;
        CHECK_STATUS(uaii_session_detokenize(s, &bad, 1, text, sizeof text, &len), UAII_ERR_INVALID_ARGUMENT,
                     "vocabulary");
    }
}

static void chat(uaii_session* s) {
    uaii_chat_message messages[1] = {{"user", "What is 2+2?"}};
    char text[2048], tiny[16];
    size_t len = 0, n = 0;
    int64_t ids[MAX_TOKENS], want[MAX_TOKENS];
    size_t want_n = parse_tokens(getenv("UAII_TEST_CHAT_TOKENS"), want, MAX_TOKENS);
    CHECK_OK(uaii_session_apply_chat_template(s, messages, 1, 1, NULL, 0, &len));
    CHECK_STATUS(uaii_session_apply_chat_template(s, messages, 1, 1, tiny, sizeof tiny, &len),
                 UAII_ERR_INVALID_ARGUMENT, "too small");
    CHECK_OK(uaii_session_apply_chat_template(s, messages, 1, 1, text, sizeof text, &len));
    CHECK(len == strlen(text));
    CHECK(strstr(text, "What is 2+2?") != NULL && strstr(text, "<|im_start|>assistant") != NULL);
    /* special-token text becomes the special tokens only when asked */
    CHECK_OK(uaii_session_tokenize(s, text, 0, 1, ids, MAX_TOKENS, &n));
    if (want_n > 0) CHECK(n == want_n && memcmp(ids, want, n * sizeof ids[0]) == 0);
    {
        size_t plain = 0;
        CHECK_OK(uaii_session_tokenize(s, text, 0, 0, NULL, 0, &plain));
        CHECK(plain > n);
    }
}

static void greedy(uaii_session* s) {
    int64_t out[MAX_TOKENS];
    size_t n = 0;
    int64_t max_new = (int64_t)(expect_n - prompt_n);
    uaii_generation_stats st = {.struct_size = sizeof st};
    CHECK_OK(uaii_session_generate(s, prompt, prompt_n, max_new, out, MAX_TOKENS, &n));
    CHECK(n == expect_n);
    for (size_t i = 0; i < n; i++) CHECK(out[i] == expect[i]); /* the Python Session's greedy tokens */
    CHECK_OK(uaii_session_get_stats(s, &st));
    CHECK(st.struct_size == sizeof st && st.finish_reason == UAII_FINISH_LENGTH);
    CHECK(st.prompt_tokens == (int64_t)prompt_n && st.generated_tokens == max_new);
    CHECK(st.decode_tokens_per_second > 0.0 && st.decode_seconds > 0.0 && st.ttft_seconds > 0.0);
    CHECK(st.bytes_read_per_token > 0.0 && st.bytes_read > 0 && st.peak_rss_bytes > 0 && st.load_seconds > 0.0);

    /* truncated to the caller's capacity */
    CHECK_OK(uaii_session_generate(s, prompt, prompt_n, max_new, out, prompt_n + 3, &n));
    CHECK(n == prompt_n + 3 && memcmp(out, expect, n * sizeof out[0]) == 0);
    CHECK_STATUS(uaii_session_generate(s, prompt, prompt_n, -1, out, MAX_TOKENS, &n), UAII_ERR_INVALID_ARGUMENT,
                 "max_new_tokens");
    {
        int64_t bad[2] = {1, 1000000000};
        CHECK_STATUS(uaii_session_generate(s, bad, 2, 4, out, MAX_TOKENS, &n), UAII_ERR_INVALID_ARGUMENT, "token");
    }
    CHECK_STATUS(uaii_session_run(s), UAII_ERR_INVALID_ARGUMENT, "missing input");
}

static void streaming(uaii_session* s) {
    static collected c;
    int64_t out[MAX_TOKENS];
    size_t n = 0, len = 0;
    char text[4096];
    uaii_generate_params p;
    uaii_generation_stats st = {.struct_size = sizeof st};
    uaii_generate_params_init(&p);
    p.max_new_tokens = (int64_t)(expect_n - prompt_n);
    p.on_token = on_token;
    p.user_data = &c;

    /* the callback sees every token, the same greedy tokens, and their text */
    memset(&c, 0, sizeof c);
    CHECK_OK(uaii_session_generate_v2(s, prompt, prompt_n, &p, out, MAX_TOKENS, &n));
    CHECK(n == expect_n && memcmp(out, expect, n * sizeof out[0]) == 0);
    CHECK(c.n == expect_n - prompt_n && memcmp(c.tokens, expect + prompt_n, c.n * sizeof c.tokens[0]) == 0);
    CHECK_OK(uaii_session_detokenize(s, expect + prompt_n, c.n, text, sizeof text, &len));
    CHECK(strcmp(text, c.text) == 0);
    CHECK_OK(uaii_session_get_stats(s, &st));
    CHECK(st.finish_reason == UAII_FINISH_LENGTH && st.generated_tokens == (int64_t)c.n);
    CHECK(st.decode_tokens_per_second > 0.0);

    /* the callback stops the generation */
    memset(&c, 0, sizeof c);
    c.stop_after = 3;
    CHECK_OK(uaii_session_generate_v2(s, prompt, prompt_n, &p, out, MAX_TOKENS, &n));
    CHECK(n == prompt_n + 3 && c.n == 3);
    CHECK_OK(uaii_session_get_stats(s, &st));
    CHECK(st.finish_reason == UAII_FINISH_CALLBACK);

    /* re-entering the same session from its callback is refused, not deadlocked */
    memset(&c, 0, sizeof c);
    c.stop_after = 1;
    c.session = s;
    CHECK_OK(uaii_session_generate_v2(s, prompt, prompt_n, &p, out, MAX_TOKENS, &n));
    CHECK(c.reentry == UAII_ERR_INVALID_ARGUMENT);

    /* a stop token ends the generation before it, with or without a callback */
    {
        int64_t stop = expect[prompt_n + 2];
        memset(&c, 0, sizeof c);
        p.stop_token_ids = &stop;
        p.n_stop_token_ids = 1;
        CHECK_OK(uaii_session_generate_v2(s, prompt, prompt_n, &p, out, MAX_TOKENS, &n));
        CHECK(n == prompt_n + 2);
        CHECK_OK(uaii_session_get_stats(s, &st));
        CHECK(st.finish_reason == UAII_FINISH_STOP);
        p.on_token = NULL;
        CHECK_OK(uaii_session_generate_v2(s, prompt, prompt_n, &p, out, MAX_TOKENS, &n));
        CHECK(n == prompt_n + 2);
        p.stop_token_ids = NULL;
        p.n_stop_token_ids = 0;
        p.on_token = on_token;
    }

    /* a stop string: the streamed text ends before it */
    {
        const char* stops[1] = {"\n"};
        memset(&c, 0, sizeof c);
        p.stop_strings = stops;
        p.n_stop_strings = 1;
        p.max_new_tokens = 32;
        CHECK_OK(uaii_session_generate_v2(s, prompt, prompt_n, &p, out, MAX_TOKENS, &n));
        CHECK_OK(uaii_session_get_stats(s, &st));
        CHECK(st.finish_reason == UAII_FINISH_STOP); /* the greedy answer has a newline early on */
        CHECK(strchr(c.text, '\n') == NULL && c.text_len > 0);
        p.stop_strings = NULL;
        p.n_stop_strings = 0;
    }

    /* seeded sampling is reproducible */
    {
        int64_t first[MAX_TOKENS];
        size_t first_n = 0;
        p.on_token = NULL;
        p.max_new_tokens = 12;
        p.temperature = 0.9f;
        p.top_k = 50;
        p.top_p = 0.95f;
        p.seed = 1234;
        CHECK_OK(uaii_session_generate_v2(s, prompt, prompt_n, &p, first, MAX_TOKENS, &first_n));
        CHECK_OK(uaii_session_generate_v2(s, prompt, prompt_n, &p, out, MAX_TOKENS, &n));
        CHECK(n == first_n && memcmp(out, first, n * sizeof out[0]) == 0);
    }
}

static void context_limit(void) {
    uaii_session* s = NULL;
    uaii_session_options o;
    int64_t out[MAX_TOKENS];
    size_t n = 0;
    uaii_generation_stats st = {.struct_size = sizeof st};
    uaii_session_options_init(&o);
    o.max_context = (int64_t)prompt_n + 4;
    CHECK_OK(uaii_session_create(model, &o, &s));
    CHECK_OK(uaii_session_generate(s, prompt, prompt_n, 32, out, MAX_TOKENS, &n));
    CHECK(n > prompt_n && n <= prompt_n + 5);
    CHECK_OK(uaii_session_get_stats(s, &st));
    CHECK(st.finish_reason == UAII_FINISH_CONTEXT);
    uaii_session_destroy(s);
}

/* kv_positions / kv_dtype (0.3.x additions): with a window that never slides, cache positions are the absolute
   ones, so the greedy tokens are Python's; an f16 cache generates; unknown values are CONFIG errors */
static void kv_options(void) {
    uaii_session* s = NULL;
    uaii_session_options o;
    int64_t out[MAX_TOKENS];
    size_t n = 0;
    uaii_session_options_init(&o);
    CHECK(o.kv_positions == NULL && o.kv_dtype == NULL);
    o.kv_window = 256;
    o.kv_positions = "cache";
    CHECK_OK(uaii_session_create(model, &o, &s));
    CHECK_OK(uaii_session_generate(s, prompt, prompt_n, (int64_t)(expect_n - prompt_n), out, MAX_TOKENS, &n));
    CHECK(n == expect_n && memcmp(out, expect, n * sizeof out[0]) == 0);
    uaii_session_destroy(s);
    o.kv_dtype = "f16";
    CHECK_OK(uaii_session_create(model, &o, &s));
    CHECK_OK(uaii_session_generate(s, prompt, prompt_n, 8, out, MAX_TOKENS, &n));
    CHECK(n == prompt_n + 8 && memcmp(out, prompt, prompt_n * sizeof out[0]) == 0);
    uaii_session_destroy(s);
    o.kv_dtype = "f8";
    CHECK_STATUS(uaii_session_create(model, &o, &s), UAII_ERR_CONFIG, "kv_dtype");
    o.kv_dtype = NULL;
    o.kv_positions = "sideways";
    CHECK_STATUS(uaii_session_create(model, &o, &s), UAII_ERR_CONFIG, "kv_positions");
}

typedef struct lm_worker {
    uaii_session* s;
    int64_t out[MAX_TOKENS];
    size_t n;
    uaii_status status;
} lm_worker;

static void* lm_thread(void* arg) {
    lm_worker* w = (lm_worker*)arg;
    w->status = uaii_session_generate(w->s, prompt, prompt_n, (int64_t)(expect_n - prompt_n), w->out, MAX_TOKENS,
                                      &w->n);
    return NULL;
}

static void two_threads(uaii_session* first) {
    lm_worker w[2];
    pthread_t t[2];
    memset(w, 0, sizeof w);
    w[0].s = first;
    CHECK_OK(uaii_session_create(model, NULL, &w[1].s));
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, lm_thread, &w[i]) == 0);
    for (int i = 0; i < 2; i++) CHECK(pthread_join(t[i], NULL) == 0);
    for (int i = 0; i < 2; i++) {
        CHECK(w[i].status == UAII_OK && w[i].n == expect_n);
        CHECK(memcmp(w[i].out, expect, expect_n * sizeof expect[0]) == 0);
    }
    uaii_session_destroy(w[1].s);
}

int main(int argc, char** argv) {
    uaii_session* s = NULL;
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    scratch = argv[1];
    model = getenv("UAII_TEST_MODEL");
    prompt_text = getenv("UAII_TEST_PROMPT");
    if (model == NULL || model[0] == '\0' || prompt_text == NULL) {
        printf("test_generate: skipped (UAII_TEST_MODEL / UAII_TEST_PROMPT not set)\n");
        return UAII_TEST_SKIP;
    }
    expect_n = parse_tokens(getenv("UAII_TEST_EXPECT"), expect, MAX_TOKENS);
    prompt_n = parse_tokens(getenv("UAII_TEST_PROMPT_TOKENS"), prompt, MAX_TOKENS);
    CHECK(expect_n > prompt_n + 4 && prompt_n > 0);

    CHECK_OK(UAII_CHECK_VERSION());
    CHECK_OK(uaii_session_create(model, NULL, &s));
    tokens_and_text(s);
    chat(s);
    greedy(s);
    streaming(s);
    two_threads(s);
    uaii_session_destroy(s);
    context_limit();
    kv_options();
    CHECK_OK(uaii_convert_model(model, path_in(scratch, "smollm2.uaii.json")));
    CHECK(file_exists(path_in(scratch, "smollm2.uaii.json")));
    test_done("test_generate");
    return 0;
}
