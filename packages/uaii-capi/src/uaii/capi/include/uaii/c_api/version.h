/* uaii/c_api/version.h — version of the UAII C API declared by uaii/c_api/uaii.h.
 *
 * These macros describe the header a program was compiled against. The library it runs against answers
 * uaii_get_c_api_version() and uaii_abi_version(); compare them at start-up (see UAII_CHECK_VERSION in uaii.h).
 */
#ifndef UAII_C_API_VERSION_H
#define UAII_C_API_VERSION_H

#define UAII_C_API_VERSION_MAJOR 0
#define UAII_C_API_VERSION_MINOR 3
#define UAII_C_API_VERSION_PATCH 0
#define UAII_C_API_VERSION_STRING "0.3.0"

/* One number for #if tests: major * 10000 + minor * 100 + patch (sqlite3's SQLITE_VERSION_NUMBER habit). */
#define UAII_C_API_VERSION_NUMBER (UAII_C_API_VERSION_MAJOR * 10000 + UAII_C_API_VERSION_MINOR * 100 + \
                                   UAII_C_API_VERSION_PATCH)

/* The binary interface generation. It changes only when an existing declaration would change meaning or layout,
 * which the rules of this API forbid inside 0.x (new behaviour arrives as new functions, `_v2` functions and
 * fields appended to size-prefixed structs). A library whose uaii_abi_version() differs from the value a program
 * was compiled with must not be used by that program. */
#define UAII_ABI_VERSION 1

#endif /* UAII_C_API_VERSION_H */
