/* uaii_capi_internal.h — helpers inside libuaii that its Python side calls through cffi; not part of the API.
 *
 * The block between the CDEF markers is read by build_capi.py as cffi declarations (plain declarations only).
 */
#ifndef UAII_CAPI_INTERNAL_H
#define UAII_CAPI_INTERNAL_H

#include <stddef.h>

/* Capacity of the per-thread last-error buffer; longer messages are cut and end with "...". */
#define UAII_ERROR_CAPACITY 4096

/* CDEF BEGIN */
/* Sets this thread's last error (UTF-8; NULL clears it). */
void uaii__set_error(const char* message);
void uaii__clear_error(void);
/* Absolute path of the loaded libuaii shared object ("" when unknown). */
const char* uaii__library_path(void);
/* Bytes of uaii_session_options in C API 0.3.0 (what uaii_session_options_init fills). */
size_t uaii__options_v030_size(void);
/* CDEF END */

#endif /* UAII_CAPI_INTERNAL_H */
