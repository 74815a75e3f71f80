/* generate.c — load a GGUF model, apply its chat template to a question, tokenize it and stream the answer,
 * then print tokens/s. The whole flow of the UAII C API in one page.
 *
 *   make capi
 *   native/build/examples/generate MODEL.gguf "What is the capital of France?" -n 64
 *
 * Options: -n MAX_NEW_TOKENS (default 128), -t TEMPERATURE (default 0: greedy), -s SEED, --raw (no chat
 * template: the prompt is plain text to continue).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "uaii/c_api/uaii.h"

static int fail(const char* what, uaii_status status) {
    fprintf(stderr, "error: %s: %s (%s)\n", what, uaii_last_error(), uaii_status_name(status));
    return 1;
}

/* Streaming callback: print each piece of text as soon as it is known. */
static int print_piece(void* user_data, int64_t token, const char* piece, size_t piece_len) {
    (void)user_data;
    (void)token;
    fwrite(piece, 1, piece_len, stdout);
    fflush(stdout);
    return 0; /* non-zero would stop the generation */
}

int main(int argc, char** argv) {
    const char* model = NULL;
    const char* question = "What is the capital of France, and what is it famous for?";
    int64_t max_new = 128, seed = -1;
    float temperature = 0.0f;
    int raw = 0, positional = 0;
    uaii_session* session = NULL;
    uaii_status st;
    char* text = NULL;
    int64_t* tokens = NULL;
    size_t text_len = 0, n_tokens = 0, n_out = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) max_new = strtoll(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) temperature = strtof(argv[++i], NULL);
        else if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) seed = strtoll(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--raw") == 0) raw = 1;
        else if (positional == 0 && ++positional) model = argv[i];
        else if (positional == 1 && ++positional) question = argv[i];
    }
    if (model == NULL) {
        fprintf(stderr, "usage: %s MODEL.gguf [PROMPT] [-n MAX_NEW_TOKENS] [-t TEMPERATURE] [-s SEED] [--raw]\n",
                argv[0]);
        return 2;
    }
    /* the library must serve the header this program was compiled with */
    if ((st = UAII_CHECK_VERSION()) != UAII_OK) return fail("version check", st);

    if ((st = uaii_session_create(model, NULL, &session)) != UAII_OK) return fail("loading the model", st);

    /* the prompt text: the chat template around the question, or the raw text */
    if (raw) {
        text = malloc(strlen(question) + 1);
        if (text == NULL) return 1;
        strcpy(text, question);
    } else {
        uaii_chat_message turn = {"user", question};
        if ((st = uaii_session_apply_chat_template(session, &turn, 1, 1, NULL, 0, &text_len)) != UAII_OK)
            return fail("chat template", st);
        text = malloc(text_len + 1); /* buffers belong to the caller: ask the size, then fill */
        if (text == NULL) return 1;
        if ((st = uaii_session_apply_chat_template(session, &turn, 1, 1, text, text_len + 1, &text_len)) != UAII_OK)
            return fail("chat template", st);
    }

    /* tokens: a templated prompt holds special-token text ("<|im_start|>"), which must become those tokens */
    if ((st = uaii_session_tokenize(session, text, raw, !raw, NULL, 0, &n_tokens)) != UAII_OK)
        return fail("tokenize", st);
    tokens = malloc((n_tokens + (size_t)max_new) * sizeof *tokens);
    if (tokens == NULL) return 1;
    if ((st = uaii_session_tokenize(session, text, raw, !raw, tokens, n_tokens, &n_tokens)) != UAII_OK)
        return fail("tokenize", st);

    /* stream the answer */
    {
        uaii_generate_params params;
        uaii_generation_stats stats = {.struct_size = sizeof stats};
        static const char* finish[] = {"none", "length", "stop", "eos", "callback", "context"};
        uaii_generate_params_init(&params);
        params.max_new_tokens = max_new;
        params.temperature = temperature;
        params.seed = seed;
        params.on_token = print_piece;
        if (raw) printf("%s", text);
        st = uaii_session_generate_v2(session, tokens, n_tokens, &params, tokens, n_tokens + (size_t)max_new,
                                      &n_out);
        if (st != UAII_OK) return fail("generate", st);
        if ((st = uaii_session_get_stats(session, &stats)) != UAII_OK) return fail("stats", st);
        fprintf(stderr,
                "\n\n[%lld prompt tokens, %lld generated (%s) | prefill %.1f tok/s | decode %.1f tok/s | "
                "first token %.0f ms | %.1f MB read per token]\n",
                (long long)stats.prompt_tokens, (long long)stats.generated_tokens,
                stats.finish_reason >= 0 && stats.finish_reason <= 5 ? finish[stats.finish_reason] : "?",
                stats.prefill_tokens_per_second, stats.decode_tokens_per_second, stats.ttft_seconds * 1e3,
                stats.bytes_read_per_token / 1e6);
    }
    free(tokens);
    free(text);
    uaii_session_destroy(session);
    return 0;
}
