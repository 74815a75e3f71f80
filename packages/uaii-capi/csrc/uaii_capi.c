/* uaii_capi.c — the part of libuaii written in C: version queries, status names, the thread-local last error and
 * the option initializers. None of it needs the Python interpreter, so a program can check versions and set up
 * options before the first call that starts it. The session functions are cffi `extern "Python"` stubs generated
 * from uaii.h by build_capi.py and implemented in uaii/capi/_exports.py.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "uaii/c_api/uaii.h"
#include "uaii_capi_internal.h"

/* The header's convenience macros would rewrite the definitions below. */
#undef uaii_session_options_init
#undef uaii_generate_params_init

#ifndef UAII_LIBRARY_VERSION_MAJOR /* set by build_capi.py from the package version */
#define UAII_LIBRARY_VERSION_MAJOR 0
#define UAII_LIBRARY_VERSION_MINOR 0
#define UAII_LIBRARY_VERSION_PATCH 0
#define UAII_LIBRARY_VERSION_STRING "0.0.0"
#endif

/* ---- the 0.3.0 layout is frozen ----------------------------------------------------------------------------- */
#define UAII_OPTIONS_V030_SIZE (offsetof(uaii_session_options, max_context) + sizeof(int64_t))

_Static_assert(sizeof(uaii_status) == sizeof(int), "uaii_status must stay int-sized");
_Static_assert(sizeof(uaii_weight_init) == sizeof(int), "uaii_weight_init must stay int-sized");
_Static_assert(offsetof(uaii_session_options, struct_size) == 0, "struct_size comes first");
_Static_assert(offsetof(uaii_generate_params, struct_size) == 0, "struct_size comes first");
_Static_assert(offsetof(uaii_generation_stats, struct_size) == 0, "struct_size comes first");
#if UINTPTR_MAX == 0xffffffffffffffffu /* LP64: the offsets C API 0.3.0 programs were compiled with */
_Static_assert(offsetof(uaii_session_options, backend) == 8, "0.3.0 layout");
_Static_assert(offsetof(uaii_session_options, weight_init) == 24, "0.3.0 layout");
_Static_assert(offsetof(uaii_session_options, profile_trace_path) == 40, "0.3.0 layout");
_Static_assert(offsetof(uaii_session_options, budget_bytes) == 48, "0.3.0 layout");
_Static_assert(offsetof(uaii_session_options, weights_sandbox) == 64, "0.3.0 layout");
_Static_assert(offsetof(uaii_session_options, max_context) == 80, "0.3.0 layout");
_Static_assert(UAII_OPTIONS_V030_SIZE == 88, "0.3.0 size");
#endif

/* ---- status names -------------------------------------------------------------------------------------------- */
static const char* const STATUS_NAMES[] = {
    [UAII_OK] = "ok",
    [UAII_ERR_INVALID_ARGUMENT] = "invalid_argument",
    [UAII_ERR_NOT_FOUND] = "not_found",
    [UAII_ERR_IO] = "io",
    [UAII_ERR_CONFIG] = "config",
    [UAII_ERR_PLUGIN] = "plugin",
    [UAII_ERR_ABI] = "abi",
    [UAII_ERR_NOT_IMPLEMENTED] = "not_implemented",
    [UAII_ERR_INTERNAL] = "internal",
};
_Static_assert(sizeof(STATUS_NAMES) / sizeof(STATUS_NAMES[0]) == UAII_ERR_INTERNAL + 1,
               "one name per uaii_status");

UAII_API const char* uaii_status_name(uaii_status status) {
    unsigned i = (unsigned)status;
    if (i < sizeof(STATUS_NAMES) / sizeof(STATUS_NAMES[0]) && STATUS_NAMES[i] != NULL) return STATUS_NAMES[i];
    return "unknown";
}

/* ---- the thread-local last error ----------------------------------------------------------------------------- */
/* A fixed buffer per thread: nothing to free at thread exit, and the pointer uaii_last_error returns never dangles. */
static _Thread_local char tls_error[UAII_ERROR_CAPACITY];

void uaii__set_error(const char* message) {
    if (message == NULL) {
        tls_error[0] = '\0';
        return;
    }
    size_t n = strlen(message);
    if (n < sizeof(tls_error)) {
        memcpy(tls_error, message, n + 1);
        return;
    }
    /* cut at a UTF-8 character boundary and mark the cut */
    size_t keep = sizeof(tls_error) - 4;
    while (keep > 0 && ((unsigned char)message[keep] & 0xC0) == 0x80) keep--;
    memcpy(tls_error, message, keep);
    memcpy(tls_error + keep, "...", 4);
}

void uaii__clear_error(void) { tls_error[0] = '\0'; }

UAII_API const char* uaii_last_error(void) { return tls_error; }

static uaii_status fail(uaii_status status, const char* message) {
    uaii__set_error(message);
    return status;
}

/* ---- versions ------------------------------------------------------------------------------------------------ */
UAII_API uaii_status uaii_get_version(int* major, int* minor, int* patch) {
    if (major == NULL || minor == NULL || patch == NULL)
        return fail(UAII_ERR_INVALID_ARGUMENT, "[capi] uaii_get_version: major, minor and patch must not be NULL");
    *major = UAII_LIBRARY_VERSION_MAJOR;
    *minor = UAII_LIBRARY_VERSION_MINOR;
    *patch = UAII_LIBRARY_VERSION_PATCH;
    uaii__clear_error();
    return UAII_OK;
}

UAII_API const char* uaii_get_version_string(void) { return UAII_LIBRARY_VERSION_STRING; }

UAII_API void uaii_get_c_api_version(int* major, int* minor, int* patch) {
    if (major != NULL) *major = UAII_C_API_VERSION_MAJOR;
    if (minor != NULL) *minor = UAII_C_API_VERSION_MINOR;
    if (patch != NULL) *patch = UAII_C_API_VERSION_PATCH;
}

UAII_API const char* uaii_get_c_api_version_string(void) { return UAII_C_API_VERSION_STRING; }

UAII_API int uaii_abi_version(void) { return UAII_ABI_VERSION; }

UAII_API uaii_status uaii_check_version(int major, int minor, int patch) {
    char msg[256];
    const char* why = NULL;
    if (major != UAII_C_API_VERSION_MAJOR)
        why = "a different major version";
    else if (major == 0 && minor != UAII_C_API_VERSION_MINOR)
        why = "a different minor version (0.x minors are not compatible)";
    else if (minor > UAII_C_API_VERSION_MINOR)
        why = "a newer minor version";
    else if (minor == UAII_C_API_VERSION_MINOR && patch > UAII_C_API_VERSION_PATCH)
        why = "a newer patch version (functions this library lacks)";
    if (why != NULL) {
        snprintf(msg, sizeof msg, "[capi] program built against C API %d.%d.%d, %s than this library's %s", major,
                 minor, patch, why, UAII_C_API_VERSION_STRING);
        return fail(UAII_ERR_ABI, msg);
    }
    uaii__clear_error();
    return UAII_OK;
}

/* ---- option initializers ------------------------------------------------------------------------------------- */
/* Copies the first struct_size bytes of `defaults` (library size lib_size) into dst, zeroes what lies beyond the
 * library's struct, and records struct_size in the leading uint32_t. */
static void write_sized(void* dst, const void* defaults, size_t lib_size, size_t struct_size) {
    if (dst == NULL || struct_size == 0) return;
    memcpy(dst, defaults, struct_size < lib_size ? struct_size : lib_size);
    if (struct_size > lib_size) memset((char*)dst + lib_size, 0, struct_size - lib_size);
    if (struct_size >= sizeof(uint32_t)) {
        uint32_t size32 = struct_size > UINT32_MAX ? UINT32_MAX : (uint32_t)struct_size;
        memcpy(dst, &size32, sizeof size32);
    }
}

UAII_API void uaii_session_options_init_sized(uaii_session_options* options, size_t struct_size) {
    uaii_session_options d;
    memset(&d, 0, sizeof d);
    d.struct_size = (uint32_t)sizeof d;
    d.backend = "cpu";
    d.weights_dir = NULL;
    d.weight_init = UAII_WEIGHT_INIT_NONE;
    d.enable_fusion = 1;
    d.enable_memory_reuse = 1;
    d.enable_profiler = 0;
    d.profile_trace_path = NULL;
    d.budget_bytes = 0;
    d.enable_streaming = 0;
    d.allow_missing_weights = 0;
    d.weights_sandbox = NULL;
    d.compute_dtype = UAII_COMPUTE_DTYPE_F32;
    d.keep_quantized_weights = 1;
    d.max_context = 0;
    d.kv_window = 0;
    d.kv_sinks = 4;
    d.pin_layers = -1;
    d.n_threads = 0;
    d.preset = NULL;
    d.kv_positions = NULL;
    d.kv_dtype = NULL;
    write_sized(options, &d, sizeof d, struct_size);
}

/* The 0.3.0 symbol: its callers' struct is the 0.3.0 one, so only that much is written. */
UAII_API void uaii_session_options_init(uaii_session_options* options) {
    uaii_session_options_init_sized(options, UAII_OPTIONS_V030_SIZE);
}

size_t uaii__options_v030_size(void) { return UAII_OPTIONS_V030_SIZE; }

UAII_API void uaii_generate_params_init_sized(uaii_generate_params* params, size_t struct_size) {
    uaii_generate_params d;
    memset(&d, 0, sizeof d);
    d.struct_size = (uint32_t)sizeof d;
    d.max_new_tokens = 128;
    d.temperature = 0.0f;
    d.top_k = 0;
    d.top_p = 1.0f;
    d.min_p = 0.0f;
    d.repetition_penalty = 1.0f;
    d.seed = -1;
    d.stop_token_ids = NULL;
    d.n_stop_token_ids = 0;
    d.stop_strings = NULL;
    d.n_stop_strings = 0;
    d.on_token = NULL;
    d.user_data = NULL;
    write_sized(params, &d, sizeof d, struct_size);
}

/* ---- where the library lives (the embedded interpreter finds its packages from here) ------------------------- */
const char* uaii__library_path(void) {
    static char path[4096];
    Dl_info info;
    if (path[0] == '\0' && dladdr((void*)&uaii__library_path, &info) != 0 && info.dli_fname != NULL)
        snprintf(path, sizeof path, "%s", info.dli_fname);
    return path;
}
