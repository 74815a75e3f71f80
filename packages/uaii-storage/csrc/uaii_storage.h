/* uaii_storage.h — the C I/O engine of uaii-storage.
 *
 * A pool of I/O threads reads byte ranges of weight files into caller-owned, aligned memory with pread(2):
 * O_DIRECT where the file system admits it (the read window is widened to the file's direct-I/O alignment and
 * the caller receives the data at job_data_offset), otherwise buffered pread followed by
 * posix_fadvise(POSIX_FADV_DONTNEED) on the range so that our reads do not grow the page cache.
 * Each read is split into chunks that several threads read in parallel. No global state: everything lives in a
 * pool, a file or a job. No function here takes or needs the Python GIL.
 *
 * Status codes: 0 is success, a negative errno is a system error, UAII_IO_EEOF means the file ended before the
 * requested range did (a short read is never handed back as data).
 *
 * The block between the CDEF markers is read by build_storage.py as the cffi cdef: keep it to plain
 * declarations (no #include, no #if, no macros with expressions).
 */
#ifndef UAII_STORAGE_H
#define UAII_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CDEF BEGIN */
#define UAII_IO_EEOF -100000
#define UAII_IO_DEFAULT_ALIGN 4096

/* fault injection, for tests: the next `count` pread calls of a pool fail with EINTR / return half */
#define UAII_IO_FAULT_EINTR 1
#define UAII_IO_FAULT_SHORT 2

typedef struct uaii_io_pool uaii_io_pool;   /* opaque: the I/O threads and their queue */
typedef struct uaii_file uaii_file;         /* opaque: one weight file (buffered fd + O_DIRECT fd) */
typedef struct uaii_read_job uaii_read_job; /* opaque: one read; reusable after it completed */

typedef struct uaii_io_counters {
    uint64_t bytes_read;      /* bytes that reached caller memory, alignment padding included */
    uint64_t bytes_direct;    /* of which read with O_DIRECT */
    uint64_t bytes_buffered;  /* of which read with buffered pread (+ DONTNEED) */
    uint64_t jobs_done;       /* completed reads (tensors) */
    uint64_t chunks_done;     /* completed chunks */
    uint64_t short_reads;     /* pread calls that returned less than asked and were continued */
    uint64_t eintr_retries;   /* pread calls interrupted by a signal and retried */
    uint64_t direct_fallbacks;/* O_DIRECT reads refused (EINVAL) and redone buffered */
    uint64_t errors;          /* jobs that ended with an error */
    uint64_t busy_ns;         /* wall time during which at least one chunk was being read */
} uaii_io_counters;

/* --- pool ---------------------------------------------------------------------------------------------- */
/* n_threads in [1, 64]; chunk_bytes is rounded up to a multiple of UAII_IO_DEFAULT_ALIGN. NULL + *err on failure. */
uaii_io_pool *uaii_io_create(int n_threads, uint64_t chunk_bytes, int *err);
/* Cancels queued chunks, waits for running ones, joins the threads. Jobs must not be reused afterwards. */
void uaii_io_destroy(uaii_io_pool *pool);
void uaii_io_get_counters(uaii_io_pool *pool, uaii_io_counters *out);
uint64_t uaii_io_chunk_bytes(uaii_io_pool *pool);
void uaii_io_inject_fault(uaii_io_pool *pool, int kind, int count);

/* --- files --------------------------------------------------------------------------------------------- */
/* use_direct: 1 tries a second fd with O_DIRECT; drop_cache: 1 advises DONTNEED after buffered reads. */
uaii_file *uaii_file_open(const char *path, int use_direct, int drop_cache, int *err);
void uaii_file_close(uaii_file *file);
uint64_t uaii_file_size(uaii_file *file);
uint32_t uaii_file_align(uaii_file *file);      /* read-window alignment (direct-I/O offset alignment) */
int uaii_file_is_direct(uaii_file *file);       /* 1 while O_DIRECT is in use for this file */

/* --- reads --------------------------------------------------------------------------------------------- */
uaii_read_job *uaii_job_new(void);
void uaii_job_free(uaii_read_job *job);
/* Bytes of destination memory a read of [offset, offset + nbytes) needs (the aligned window). */
uint64_t uaii_window_bytes(uaii_file *file, uint64_t offset, uint64_t nbytes);
/* Queues the read; dst must be aligned to UAII_IO_DEFAULT_ALIGN and hold uaii_window_bytes() bytes.
 * Returns 0, -EINVAL (bad arguments), -EBUSY (job still running) or -ESHUTDOWN. */
int uaii_io_submit(uaii_io_pool *pool, uaii_read_job *job, uaii_file *file, uint64_t offset, uint64_t nbytes,
                   uint8_t *dst, uint64_t dst_cap);
/* Blocks until the job completed; returns its status. Several threads may wait on one job. */
int uaii_io_wait(uaii_io_pool *pool, uaii_read_job *job);
int uaii_io_done(uaii_io_pool *pool, uaii_read_job *job);  /* 1 when completed (or never submitted) */
/* Moves a queued job to the front of the queue (someone is about to wait for it). */
void uaii_io_boost(uaii_io_pool *pool, uaii_read_job *job);
/* Drops the job's unstarted chunks and waits for its running ones; status becomes -ECANCELED unless done. */
int uaii_io_cancel(uaii_io_pool *pool, uaii_read_job *job);
uint64_t uaii_job_data_offset(uaii_read_job *job);  /* where the requested bytes start inside dst */
uint64_t uaii_job_done_seq(uaii_read_job *job);     /* 1-based completion order within the pool, 0 before */

/* --- helpers ------------------------------------------------------------------------------------------- */
void *uaii_aligned_alloc(uint64_t align, uint64_t size);  /* posix_memalign; NULL on failure */
void uaii_aligned_free(void *ptr);
int64_t uaii_resident_bytes(const char *path);  /* page-cache bytes of a file (mmap + mincore), or -errno */
int uaii_drop_page_cache(const char *path);     /* fdatasync + POSIX_FADV_DONTNEED over the file; 0 or -errno */
uint64_t uaii_now_ns(void);                     /* CLOCK_MONOTONIC */
/* CDEF END */

#ifdef __cplusplus
}
#endif
#endif /* UAII_STORAGE_H */
