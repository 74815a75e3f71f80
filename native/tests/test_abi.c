/* test_abi.c — the ABI rules: a program built against the 0.3.0 struct (88 bytes on LP64) keeps working, the
 * 0.3.0 symbol uaii_session_options_init writes no byte past that struct, size-prefixed structs grow only at the end,
 * and the version checks answer as documented.
 *
 * Usage: test_abi SCRATCH_DIR
 */
#include <stddef.h>

#include "uaii_test.h"

/* The options struct exactly as C API 0.3.0 declared it (what an older binary was compiled with). */
typedef struct options_v030 {
    uint32_t struct_size;
    const char* backend;
    const char* weights_dir;
    uaii_weight_init weight_init;
    int enable_fusion;
    int enable_memory_reuse;
    int enable_profiler;
    const char* profile_trace_path;
    uint64_t budget_bytes;
    int enable_streaming;
    int allow_missing_weights;
    const char* weights_sandbox;
    int compute_dtype;
    int keep_quantized_weights;
    int64_t max_context;
} options_v030;

/* the new fields are appended after the 0.3.0 ones, which keep their offsets */
_Static_assert(offsetof(uaii_session_options, max_context) == offsetof(options_v030, max_context), "0.3.0 prefix");
_Static_assert(offsetof(uaii_session_options, kv_window) >= sizeof(options_v030), "appended");
_Static_assert(offsetof(uaii_session_options, weights_sandbox) == offsetof(options_v030, weights_sandbox), "prefix");
_Static_assert(UAII_OK == 0 && UAII_ERR_INTERNAL == 8 && UAII_WEIGHT_INIT_SEQUENCE == 3, "enum numbers");
_Static_assert(UAII_COMPUTE_DTYPE_F16 == 1 && UAII_FINISH_CONTEXT == 5, "enum numbers");

int main(int argc, char** argv) {
    const char* graph;
    uaii_session* s = NULL;
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    graph = path_in(argv[1], "toy.uaii.json");
    write_toy_graph(graph, "weights");

    /* the 0.3.0 symbol (called as an old binary calls it, bypassing the header's macro) writes 88 bytes only */
    {
        struct {
            options_v030 o;
            unsigned char canary[64];
        } old;
        memset(&old, 0x5a, sizeof old);
        (uaii_session_options_init)((uaii_session_options*)&old.o);
        CHECK(old.o.struct_size == sizeof(options_v030));
        for (size_t i = 0; i < sizeof old.canary; i++) CHECK(old.canary[i] == 0x5a);
        CHECK(strcmp(old.o.backend, "cpu") == 0 && old.o.keep_quantized_weights == 1 && old.o.max_context == 0);
        /* and the library accepts that smaller struct, taking defaults for the fields it lacks */
        CHECK_STATUS(uaii_session_create(graph, (uaii_session_options*)&old.o, &s), UAII_ERR_NOT_FOUND, "w1");
        old.o.allow_missing_weights = 1;
        old.o.weight_init = UAII_WEIGHT_INIT_ONES;
        CHECK_OK(uaii_session_create(graph, (uaii_session_options*)&old.o, &s));
        uaii_session_destroy(s);
    }

    /* through the header's macro the whole current struct is initialized */
    {
        uaii_session_options o;
        memset(&o, 0x5a, sizeof o);
        uaii_session_options_init(&o);
        CHECK(o.struct_size == sizeof o);
        CHECK(o.kv_window == 0 && o.kv_sinks == 4 && o.pin_layers == -1 && o.n_threads == 0 && o.preset == NULL &&
              o.kv_positions == NULL && o.kv_dtype == NULL);
    }

    /* a newer caller (a bigger struct) initialized by this library: known fields set, the rest zeroed, and the
     * library refuses to guess what the unknown fields meant */
    {
        struct {
            uaii_session_options o;
            int64_t future_field;
        } newer;
        memset(&newer, 0x5a, sizeof newer);
        uaii_session_options_init_sized(&newer.o, sizeof newer);
        CHECK(newer.o.struct_size == sizeof newer && newer.future_field == 0 && newer.o.kv_sinks == 4);
        CHECK_STATUS(uaii_session_create(graph, &newer.o, &s), UAII_ERR_ABI, "larger");
    }

    /* generate params follow the same rule */
    {
        struct {
            uaii_generate_params p;
            unsigned char canary[16];
        } g;
        memset(&g, 0x5a, sizeof g);
        uaii_generate_params_init_sized(&g.p, offsetof(uaii_generate_params, stop_token_ids));
        CHECK(g.p.struct_size == offsetof(uaii_generate_params, stop_token_ids) && g.p.seed == -1);
        CHECK(*(unsigned char*)&g.p.stop_token_ids == 0x5a && g.canary[0] == 0x5a);
    }

    /* versions */
    {
        int major, minor, patch;
        uaii_get_c_api_version(&major, &minor, &patch);
        CHECK(major == UAII_C_API_VERSION_MAJOR && minor == UAII_C_API_VERSION_MINOR &&
              patch == UAII_C_API_VERSION_PATCH);
        CHECK(UAII_C_API_VERSION_NUMBER == 300);
        CHECK(strcmp(uaii_get_c_api_version_string(), UAII_C_API_VERSION_STRING) == 0);
        CHECK(uaii_abi_version() == UAII_ABI_VERSION);
        CHECK_OK(UAII_CHECK_VERSION());
        CHECK_OK(uaii_check_version(0, 3, 0));
        CHECK_STATUS(uaii_check_version(0, 3, 9), UAII_ERR_ABI, "patch");
    }
    test_done("test_abi");
    return 0;
}
