/* uaii/c_api/uaii.h — the stable C API of UAII (C API 0.3.0, ABI generation 1).
 *
 * Source compatible with the C API 0.3.0 of the C++ UAII runtime: every 0.3.0 name, type, enum value and struct
 * field order is kept. What this library adds follows the ABI rules below and never changes a 0.3.0 declaration.
 *
 * Conventions
 *   - Every function that can fail returns uaii_status; UAII_OK is 0. On failure uaii_last_error() describes
 *     what went wrong (thread-local; a successful call clears it).
 *   - Handles (uaii_session*) are opaque, created by uaii_session_create and released by uaii_session_destroy.
 *   - Buffers are owned by the caller: the library writes into memory you pass with its capacity, and never
 *     keeps a pointer to it after the call returns. Strings are UTF-8 and NUL-terminated.
 *   - Size queries: where an output pointer may be NULL, the call only reports the needed count in *out_n.
 *     A non-NULL output whose capacity is too small fails with UAII_ERR_INVALID_ARGUMENT and still reports
 *     the needed count.
 *
 * ABI rules (how this header evolves)
 *   - Structs that callers fill begin with `uint32_t struct_size`. New fields are only appended. The library
 *     reads struct_size bytes over its defaults: 0 or more than the library knows is UAII_ERR_ABI.
 *   - A changed signature is a new function with a `_v2` suffix; the old one stays.
 *   - Enum numbers are never reused or renumbered; new values are appended.
 *   - uaii_abi_version() changes only if one of the above is ever broken (never within 0.x).
 *
 * Threading: any function may be called from any thread. One session is used by one thread at a time (calls on
 * the same session from two threads are serialized by the library); different sessions run in parallel threads.
 * The library embeds CPython: the first call that needs it starts the interpreter (see docs/c-api.md).
 *
 * The block between the UAII_CDEF markers is the single source of the declarations: the library's build reads it
 * (comments and the UAII_API marker removed) as its cffi declarations. Keep it to plain C declarations.
 */
#ifndef UAII_C_API_UAII_H
#define UAII_C_API_UAII_H

#include <stddef.h>
#include <stdint.h>

#include "version.h"

#if defined(_WIN32) && defined(UAII_BUILDING_LIBRARY)
#define UAII_API __declspec(dllexport)
#elif defined(_WIN32)
#define UAII_API __declspec(dllimport)
#elif defined(__GNUC__)
#define UAII_API __attribute__((visibility("default")))
#else
#define UAII_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* UAII_CDEF_BEGIN */

/* ---- status codes (0.3.0) ---------------------------------------------------------------------------------- */
typedef enum uaii_status {
    UAII_OK = 0,
    UAII_ERR_INVALID_ARGUMENT = 1, /* a NULL/ill-formed argument, a wrong size, a buffer too small, a bad model */
    UAII_ERR_NOT_FOUND = 2,        /* a file, a weight or a tensor name that does not exist */
    UAII_ERR_IO = 3,               /* reading or writing a file failed */
    UAII_ERR_CONFIG = 4,           /* an option value the library cannot honour (unknown preset, dtype, ...) */
    UAII_ERR_PLUGIN = 5,           /* a backend or loader plugin is missing or failed to start */
    UAII_ERR_ABI = 6,              /* struct_size or version mismatch between caller and library */
    UAII_ERR_NOT_IMPLEMENTED = 7,  /* valid request this library or model does not support */
    UAII_ERR_INTERNAL = 8          /* a bug or an unexpected failure; uaii_last_error() has the details */
} uaii_status;

/* How a weight that cannot be loaded is filled when allow_missing_weights is set (0.3.0). */
typedef enum uaii_weight_init {
    UAII_WEIGHT_INIT_NONE = 0,     /* fail closed: a missing weight is UAII_ERR_NOT_FOUND */
    UAII_WEIGHT_INIT_ZEROS = 1,
    UAII_WEIGHT_INIT_ONES = 2,
    UAII_WEIGHT_INIT_SEQUENCE = 3  /* element i (row-major) = i * 0.01 */
} uaii_weight_init;

typedef enum uaii_compute_dtype {
    UAII_COMPUTE_DTYPE_F32 = 0,
    UAII_COMPUTE_DTYPE_F16 = 1
} uaii_compute_dtype;

/* An inference session over one model or IR graph (opaque). */
typedef struct uaii_session uaii_session;

/* Options of uaii_session_create. Fill with uaii_session_options_init, then change fields. */
typedef struct uaii_session_options {
    uint32_t struct_size;           /* bytes of this struct the caller knows; set by uaii_session_options_init */
    const char* backend;            /* "cpu" (default; NULL means "cpu"), "auto", or a backend plugin name */
    const char* weights_dir;        /* base of relative weight references (default: the model file's directory) */
    uaii_weight_init weight_init;   /* fill of missing weights when allow_missing_weights != 0 (default NONE) */
    int enable_fusion;              /* planner fusion passes (default 1) */
    int enable_memory_reuse;        /* arena with reused offsets (default 1) */
    int enable_profiler;            /* record per-call timings for profile_summary / write_trace (default 0) */
    const char* profile_trace_path; /* with the profiler on: Chrome trace written here by uaii_session_destroy */
    uint64_t budget_bytes;          /* memory budget; 0 = unlimited (default) */
    int enable_streaming;           /* stream weights through staging buffers instead of mapping (default 0) */
    int allow_missing_weights;      /* 0 = fail closed (default); else fill per weight_init and record a warning */
    const char* weights_sandbox;    /* when set, weight references must resolve inside this directory */
    int compute_dtype;              /* a uaii_compute_dtype (default F32) */
    int keep_quantized_weights;     /* keep block-quantized weights packed (default 1) */
    int64_t max_context;            /* context length; 0 = the model's (default) */
    /* ---- 0.3.x additions (appended; older callers pass a smaller struct_size and get the defaults) ---- */
    int64_t kv_window;              /* resident KV window in tokens; 0 = unbounded (default) */
    int32_t kv_sinks;               /* attention-sink tokens kept when the window slides (default 4) */
    int32_t pin_layers;             /* trunk layers kept resident under a budget; -1 = the runtime's choice */
    int32_t n_threads;              /* CPU threads; 0 = the runtime's choice (default) */
    const char* preset;             /* a memory preset name; NULL = none (default) */
    const char* kv_positions;       /* rotary positions of a windowed KV cache: "absolute" (default; NULL too) or
                                       "cache" (StreamingLLM: positions within the cache) */
    const char* kv_dtype;           /* KV cache element type: "f32" (default; NULL too) or "f16" */
} uaii_session_options;

/* ---- versions, status names, errors (0.3.0) ----------------------------------------------------------------- */

/* Writes the default options, struct_size included. Called through the symbol (a program built against the
 * 0.3.0 header of another runtime), it fills the 0.3.0 fields only; through this header's macro of the same name
 * it fills exactly sizeof(*options) bytes (see uaii_session_options_init_sized). */
UAII_API void uaii_session_options_init(uaii_session_options* options);

/* The library's version. UAII_ERR_INVALID_ARGUMENT if a pointer is NULL. */
UAII_API uaii_status uaii_get_version(int* major, int* minor, int* patch);
/* The library's version as text, e.g. "0.1.0" (static storage). */
UAII_API const char* uaii_get_version_string(void);
/* The C API version the library implements (0, 3, 0). NULL pointers are skipped. */
UAII_API void uaii_get_c_api_version(int* major, int* minor, int* patch);
/* "0.3.0" (static storage). */
UAII_API const char* uaii_get_c_api_version_string(void);
/* "ok", "invalid_argument", "not_found", "io", "config", "plugin", "abi", "not_implemented", "internal";
 * "unknown" for any other value (static storage). */
UAII_API const char* uaii_status_name(uaii_status status);
/* The message of this thread's last failed call, "" when the last call succeeded. Never NULL. The pointer stays
 * valid until this thread's next call into the library. */
UAII_API const char* uaii_last_error(void);

/* ---- sessions (0.3.0) ------------------------------------------------------------------------------------------ */

/* Opens a model and prepares it to run. `.uaii`, `.uaii.json` and `.json` files load as UAII IR; any other path
 * (GGUF, safetensors, a Hugging Face directory, ...) goes to the loaders. `options` may be NULL (defaults).
 * INVALID_ARGUMENT: path or out NULL, an ill-formed model or option. NOT_FOUND: no such file, or a weight that
 * cannot be loaded (fail closed, the message names it). ABI: options->struct_size 0 or larger than
 * sizeof(uaii_session_options) of the library. CONFIG/PLUGIN: an option value or backend that cannot be served.
 * weights_sandbox: a weight reference that leaves the sandbox is INVALID_ARGUMENT, filled or not.
 * IO: a read failed. INTERNAL: the embedded interpreter could not start (the message says why). On failure *out
 * is set to NULL. */
UAII_API uaii_status uaii_session_create(const char* path, const uaii_session_options* options,
                                         uaii_session** out);
/* Releases the session (writes the profile trace first when profile_trace_path was set). NULL is a no-op. */
UAII_API void uaii_session_destroy(uaii_session* session);

/* Sets graph input `name` from n floats, converted to the input's type. n must equal the input's element count
 * (one symbolic dimension, e.g. `seq`, is inferred from n). INVALID_ARGUMENT: NULL session/name, data NULL with
 * n > 0, wrong n, `name` is a weight or an intermediate. NOT_FOUND: the graph has no tensor `name`. */
UAII_API uaii_status uaii_session_set_f32(uaii_session* session, const char* name, const float* data, size_t n);
/* Copies tensor `name` as floats: an output of the last run, an input set before, or (IR graphs) a weight, filled
 * ones included. out NULL: size query into *out_n. INVALID_ARGUMENT: NULL session/name/out_n, capacity < element
 * count (*out_n tells the count). NOT_FOUND: no such tensor, an output before any run, an intermediate, a weight
 * of a non-IR model. NOT_IMPLEMENTED: a block-quantized weight. */
UAII_API uaii_status uaii_session_get_f32(uaii_session* session, const char* name, float* out, size_t capacity,
                                         size_t* out_n);
/* Runs the graph on the inputs set so far; outputs are then readable with uaii_session_get_f32.
 * INVALID_ARGUMENT: NULL session, an input never set (a decoder LM also takes its past_k.N / past_v.N inputs). */
UAII_API uaii_status uaii_session_run(uaii_session* session);
/* Greedy generation of up to max_new_tokens tokens after the prompt. Writes prompt + new tokens into out_tokens,
 * truncated to capacity; *out_n = tokens written. INVALID_ARGUMENT: NULL session/prompt_tokens/out_tokens/out_n,
 * prompt_n 0, max_new_tokens < 0, a token outside the vocabulary. NOT_IMPLEMENTED: not a language model. */
UAII_API uaii_status uaii_session_generate(uaii_session* session, const int64_t* prompt_tokens, size_t prompt_n,
                                          int64_t max_new_tokens, int64_t* out_tokens, size_t capacity,
                                          size_t* out_n);
/* Human-readable profile (per-call and per-phase times), NUL-terminated, truncated to capacity - 1 bytes.
 * INVALID_ARGUMENT: NULL session/buf, capacity 0. CONFIG: the session was created with enable_profiler = 0. */
UAII_API uaii_status uaii_session_profile_summary(uaii_session* session, char* buf, size_t capacity);
/* Writes the recorded profile as Chrome trace JSON (chrome://tracing, Perfetto) to path (atomically).
 * INVALID_ARGUMENT: NULL arguments. CONFIG: profiler off. IO: the file cannot be written. */
UAII_API uaii_status uaii_session_write_trace(uaii_session* session, const char* path);

/* Converts a model (any format the loaders read, or IR) to UAII IR: output ending in `.uaii` is the binary
 * format, `.uaii.json` / `.json` the JSON format. Weights stay references to the input's files.
 * INVALID_ARGUMENT: NULL paths, an unknown output extension, an ill-formed model. NOT_FOUND: no input.
 * IO: the output cannot be written (nothing partial is left behind). */
UAII_API uaii_status uaii_convert_model(const char* input_path, const char* output_path);

/* ---- 0.3.x additions ------------------------------------------------------------------------------------------ */

/* UAII_ABI_VERSION of the library (see version.h). */
UAII_API int uaii_abi_version(void);
/* UAII_OK when this library serves a program compiled against C API major.minor.patch: same ABI generation,
 * same major (and, while major is 0, same minor), and a library patch >= patch. Else UAII_ERR_ABI with the reason.
 * Call it through UAII_CHECK_VERSION() at start-up. */
UAII_API uaii_status uaii_check_version(int major, int minor, int patch);

/* Writes the default options into the first struct_size bytes (the caller's sizeof) and sets struct_size to it.
 * Sizes beyond the library's struct get zeros there (the library then refuses them with UAII_ERR_ABI). */
UAII_API void uaii_session_options_init_sized(uaii_session_options* options, size_t struct_size);

/* Tokenizes UTF-8 text with the model's tokenizer. add_special != 0 adds what the model adds around a text (e.g.
 * BOS); parse_special != 0 turns special-token text (e.g. "<|im_start|>" from a chat template) into those tokens.
 * out_tokens NULL: size query. INVALID_ARGUMENT: NULL session/text/out_n, capacity too small (*out_n = needed).
 * NOT_IMPLEMENTED: the model has no tokenizer. */
UAII_API uaii_status uaii_session_tokenize(uaii_session* session, const char* text, int add_special,
                                          int parse_special, int64_t* out_tokens, size_t capacity, size_t* out_n);
/* Decodes tokens to UTF-8 text, NUL-terminated. *out_len = text bytes without the NUL. buf NULL: size query.
 * INVALID_ARGUMENT: NULL session/out_len, tokens NULL with n > 0, a token outside the vocabulary, capacity <
 * *out_len + 1. NOT_IMPLEMENTED: the model has no tokenizer. */
UAII_API uaii_status uaii_session_detokenize(uaii_session* session, const int64_t* tokens, size_t n, char* buf,
                                            size_t capacity, size_t* out_len);

/* One chat turn for uaii_session_apply_chat_template. */
typedef struct uaii_chat_message {
    const char* role;    /* "system", "user", "assistant", ... */
    const char* content; /* UTF-8 */
} uaii_chat_message;

/* Renders the model's chat template over the messages (add_generation_prompt != 0 appends the assistant prefix)
 * into buf, NUL-terminated. buf NULL: size query. INVALID_ARGUMENT: NULL session/out_len, messages NULL with
 * n_messages > 0, a NULL role/content, capacity too small. NOT_IMPLEMENTED: the model has no chat template. */
UAII_API uaii_status uaii_session_apply_chat_template(uaii_session* session, const uaii_chat_message* messages,
                                                     size_t n_messages, int add_generation_prompt, char* buf,
                                                     size_t capacity, size_t* out_len);

/* Called after each generated token with its id and the UTF-8 text it adds (piece_len bytes, not
 * NUL-terminated; may be empty while a character spans several tokens or while the text could still begin a stop
 * string). Return 0 to go on, non-zero to stop. After the last token it may be called once more with token -1 and
 * the text held back until then. The callback runs on the calling thread; it may call uaii_* functions, except on
 * the same session (UAII_ERR_INVALID_ARGUMENT). */
typedef int (*uaii_token_callback)(void* user_data, int64_t token, const char* piece, size_t piece_len);

/* Parameters of uaii_session_generate_v2. Fill with uaii_generate_params_init, then change fields. */
typedef struct uaii_generate_params {
    uint32_t struct_size;             /* set by uaii_generate_params_init */
    int64_t max_new_tokens;           /* default 128 */
    float temperature;                /* 0 = greedy (default) */
    int32_t top_k;                    /* 0 = off (default) */
    float top_p;                      /* 1 = off (default) */
    float min_p;                      /* 0 = off (default) */
    float repetition_penalty;         /* 1 = off (default) */
    int64_t seed;                     /* < 0 = not reproducible (default -1) */
    const int64_t* stop_token_ids;    /* tokens that end generation besides the model's end-of-turn tokens */
    size_t n_stop_token_ids;
    const char* const* stop_strings;  /* UTF-8 strings that end generation (not included in the output) */
    size_t n_stop_strings;
    uaii_token_callback on_token;     /* streaming callback, or NULL */
    void* user_data;                  /* passed to on_token */
} uaii_generate_params;

/* Writes the default parameters into the first struct_size bytes and sets struct_size to it. */
UAII_API void uaii_generate_params_init_sized(uaii_generate_params* params, size_t struct_size);

/* Why a generation ended. */
typedef enum uaii_finish_reason {
    UAII_FINISH_NONE = 0,      /* no generation yet */
    UAII_FINISH_LENGTH = 1,    /* max_new_tokens reached */
    UAII_FINISH_STOP = 2,      /* a stop token or a stop string */
    UAII_FINISH_EOS = 3,       /* the model's end-of-generation / end-of-turn token */
    UAII_FINISH_CALLBACK = 4,  /* on_token returned non-zero */
    UAII_FINISH_CONTEXT = 5    /* the context (max_context) is full */
} uaii_finish_reason;

/* Generation with sampling, stop tokens/strings and a streaming callback; the `_v2` of uaii_session_generate.
 * params NULL = defaults (greedy, as uaii_session_generate). Writes prompt + new tokens into out_tokens, truncated
 * to capacity (out_tokens may be NULL with capacity 0 when only the callback is wanted); *out_n = tokens written.
 * Errors as uaii_session_generate, plus ABI (params->struct_size) and INVALID_ARGUMENT for a bad parameter. */
UAII_API uaii_status uaii_session_generate_v2(uaii_session* session, const int64_t* prompt_tokens, size_t prompt_n,
                                             const uaii_generate_params* params, int64_t* out_tokens,
                                             size_t capacity, size_t* out_n);

/* Statistics of the session's last generation. */
typedef struct uaii_generation_stats {
    uint32_t struct_size;               /* caller sets sizeof(uaii_generation_stats); library sets bytes written */
    int32_t finish_reason;              /* a uaii_finish_reason */
    int64_t prompt_tokens;
    int64_t generated_tokens;
    int64_t cached_prompt_tokens;       /* prompt tokens the KV cache already held (a continued conversation) */
    double ttft_seconds;                /* prompt submitted -> first new token */
    double prefill_seconds;
    double decode_seconds;
    double prefill_tokens_per_second;
    double decode_tokens_per_second;    /* tokens after the first over decode_seconds: the tok/s users quote */
    uint64_t bytes_read;                /* weight bytes the generated tokens read (bytes_read_per_token x tokens) */
    double bytes_read_per_token;        /* weight bytes one decode step reads (mapped or streamed) */
    uint64_t peak_rss_bytes;            /* the process's peak resident memory */
    double load_seconds;                /* load + plan + compile time of the session */
} uaii_generation_stats;

/* Fills *out (up to out->struct_size bytes; larger callers get the library's size back in struct_size).
 * INVALID_ARGUMENT: NULL arguments. ABI: struct_size 0. */
UAII_API uaii_status uaii_session_get_stats(uaii_session* session, uaii_generation_stats* out);

/* Warnings recorded by the session (e.g. weights filled because allow_missing_weights was set), one per line,
 * NUL-terminated; "" when none. buf NULL: size query. INVALID_ARGUMENT as uaii_session_detokenize. */
UAII_API uaii_status uaii_session_warnings(uaii_session* session, char* buf, size_t capacity, size_t* out_len);

/* UAII_CDEF_END */

/* Through this header, options/params initialization fills exactly the caller's struct (ABI-safe as it grows). */
#define uaii_session_options_init(options) uaii_session_options_init_sized((options), sizeof(*(options)))
#define uaii_generate_params_init(params) uaii_generate_params_init_sized((params), sizeof(*(params)))

/* UAII_OK when the loaded library serves this program's header version. */
#define UAII_CHECK_VERSION() \
    uaii_check_version(UAII_C_API_VERSION_MAJOR, UAII_C_API_VERSION_MINOR, UAII_C_API_VERSION_PATCH)

#ifdef __cplusplus
}
#endif

#endif /* UAII_C_API_UAII_H */
