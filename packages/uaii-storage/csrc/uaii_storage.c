/* uaii_storage.c — pread-based weight reads on a pool of I/O threads. See uaii_storage.h for the contract. */
#define _GNU_SOURCE
#include "uaii_storage.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64
#define MAX_ALIGN (1u << 20)

struct uaii_file {
    int fd;          /* buffered reads, fadvise */
    int fd_direct;   /* O_DIRECT reads, or -1 */
    int direct_ok;   /* cleared (atomically) when the file system refuses O_DIRECT reads */
    int drop_cache;  /* advise DONTNEED after buffered reads */
    uint32_t align;  /* window alignment: the direct-I/O offset alignment */
    uint64_t size;
};

struct uaii_read_job {
    uaii_file *file;
    uint8_t *dst;
    uint64_t offset, nbytes;     /* requested range */
    uint64_t win_start, win_end; /* aligned window; dst[0] holds byte win_start */
    uint64_t chunk;              /* chunk size of this job (a multiple of the file alignment) */
    uint32_t n_chunks, next_chunk, running;
    int32_t status;
    uint64_t done_seq; /* value of the pool's jobs_done counter when this job completed */
    int active; /* submitted and not yet completed */
    int queued; /* on the pool queue (has unclaimed chunks) */
    uaii_read_job *qnext, *qprev;
};

struct uaii_io_pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* chunks queued, or stop */
    pthread_cond_t done_cv; /* some job completed */
    uaii_read_job *head, *tail;
    pthread_t threads[MAX_THREADS];
    int n_threads;
    int stop;
    uint64_t chunk_bytes;
    int busy;              /* chunks being read now */
    uint64_t busy_since;   /* when busy went from 0 to 1 */
    uaii_io_counters counters;
    int fault_eintr, fault_short; /* test hooks, atomics */
};

typedef struct {
    uint64_t bytes_direct, bytes_buffered, short_reads, eintr_retries, direct_fallbacks;
} chunk_stats;

uint64_t uaii_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t round_down(uint64_t x, uint64_t a) { return x / a * a; }
static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
static uint64_t min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* ---- queue (pool->mu held) ------------------------------------------------------------------------------ */
static void queue_push_back(uaii_io_pool *p, uaii_read_job *j) {
    j->qnext = NULL;
    j->qprev = p->tail;
    if (p->tail) p->tail->qnext = j; else p->head = j;
    p->tail = j;
    j->queued = 1;
}

static void queue_push_front(uaii_io_pool *p, uaii_read_job *j) {
    j->qprev = NULL;
    j->qnext = p->head;
    if (p->head) p->head->qprev = j; else p->tail = j;
    p->head = j;
    j->queued = 1;
}

static void queue_remove(uaii_io_pool *p, uaii_read_job *j) {
    if (!j->queued) return;
    if (j->qprev) j->qprev->qnext = j->qnext; else p->head = j->qnext;
    if (j->qnext) j->qnext->qprev = j->qprev; else p->tail = j->qprev;
    j->qnext = j->qprev = NULL;
    j->queued = 0;
}

/* Completes the job when no chunk is left to claim and none is running. */
static void maybe_finish(uaii_io_pool *p, uaii_read_job *j) {
    if (!j->active || j->running > 0 || j->next_chunk < j->n_chunks) return;
    j->active = 0;
    j->done_seq = ++p->counters.jobs_done;
    if (j->status != 0) p->counters.errors++;
    pthread_cond_broadcast(&p->done_cv);
}

/* ---- reading --------------------------------------------------------------------------------------------- */
static int take_fault(int *counter) {
    int v = __atomic_load_n(counter, __ATOMIC_RELAXED);
    while (v > 0) {
        if (__atomic_compare_exchange_n(counter, &v, v - 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return 1;
    }
    return 0;
}

/* Reads until `need` bytes of [off, off + len) are in buf; short reads are continued, EINTR retried.
 * With O_DIRECT every request stays a multiple of `align`; *got receives the bytes read. */
static int pread_loop(uaii_io_pool *p, int fd, uint8_t *buf, uint64_t len, uint64_t off, uint64_t need,
                      uint64_t align, chunk_stats *st, uint64_t *got) {
    uint64_t done = 0;
    while (done < need) {
        uint64_t left = len - done, want = left;
        if (left > 1 && take_fault(&p->fault_short)) {
            want = align > 1 ? round_down(left / 2, align) : left / 2;
            if (want == 0) want = left;
        }
        ssize_t n;
        if (take_fault(&p->fault_eintr)) {
            n = -1;
            errno = EINTR;
        } else {
            n = pread(fd, buf + done, (size_t)want, (off_t)(off + done));
        }
        if (n < 0) {
            if (errno == EINTR) {
                st->eintr_retries++;
                continue;
            }
            *got = done;
            return -errno;
        }
        if (n == 0) {
            *got = done;
            return UAII_IO_EEOF;
        }
        done += (uint64_t)n;
        if ((uint64_t)n < left && done < need) st->short_reads++;
        if (align > 1 && done < need && (off + done) % align) {
            *got = done; /* an unaligned short O_DIRECT read: the rest must go through the buffered fd */
            return -EINVAL;
        }
    }
    *got = done;
    return 0;
}

static void drop_range(uaii_file *f, uint64_t lo, uint64_t hi) {
    long page = sysconf(_SC_PAGESIZE);
    uint64_t a = round_down(lo, (uint64_t)page), b = round_up(hi, (uint64_t)page);
    (void)posix_fadvise(f->fd, (off_t)a, (off_t)(b - a), POSIX_FADV_DONTNEED);
}

static int read_chunk(uaii_io_pool *p, uaii_read_job *j, uint32_t idx, chunk_stats *st) {
    uaii_file *f = j->file;
    uint64_t cs = j->win_start + (uint64_t)idx * j->chunk, ce = min_u64(cs + j->chunk, j->win_end);
    uint64_t lo = max_u64(cs, j->offset), hi = min_u64(ce, j->offset + j->nbytes), got = 0;
    uint8_t *at = j->dst - j->win_start; /* at + x is where file byte x lands */
    if (hi <= lo) return 0;
    if (f->fd_direct >= 0 && __atomic_load_n(&f->direct_ok, __ATOMIC_RELAXED)) {
        int rc = pread_loop(p, f->fd_direct, at + cs, ce - cs, cs, hi - cs, f->align, st, &got);
        st->bytes_direct += got;
        if (rc != -EINVAL) return rc;
        if (got == 0) { /* the file system refuses O_DIRECT here: buffered from now on */
            __atomic_store_n(&f->direct_ok, 0, __ATOMIC_RELAXED);
            st->direct_fallbacks++;
        }
        lo = max_u64(lo, cs + got);
        if (lo >= hi) return 0;
    }
    int rc = pread_loop(p, f->fd, at + lo, hi - lo, lo, hi - lo, 1, st, &got);
    st->bytes_buffered += got;
    if (f->drop_cache && got > 0) drop_range(f, lo, lo + got);
    return rc;
}

static void *worker_main(void *arg) {
    uaii_io_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->head == NULL) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->head == NULL) break;
        uaii_read_job *j = p->head;
        uint32_t idx = j->next_chunk++;
        j->running++;
        if (j->next_chunk == j->n_chunks) queue_remove(p, j);
        if (p->busy++ == 0) p->busy_since = uaii_now_ns();
        pthread_mutex_unlock(&p->mu);

        chunk_stats st = {0};
        int rc = read_chunk(p, j, idx, &st);

        pthread_mutex_lock(&p->mu);
        p->counters.bytes_direct += st.bytes_direct;
        p->counters.bytes_buffered += st.bytes_buffered;
        p->counters.bytes_read += st.bytes_direct + st.bytes_buffered;
        p->counters.short_reads += st.short_reads;
        p->counters.eintr_retries += st.eintr_retries;
        p->counters.direct_fallbacks += st.direct_fallbacks;
        p->counters.chunks_done++;
        if (--p->busy == 0) p->counters.busy_ns += uaii_now_ns() - p->busy_since;
        if (rc != 0 && j->status == 0) j->status = rc;
        j->running--;
        maybe_finish(p, j);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- pool ------------------------------------------------------------------------------------------------ */
uaii_io_pool *uaii_io_create(int n_threads, uint64_t chunk_bytes, int *err) {
    if (n_threads < 1 || n_threads > MAX_THREADS || chunk_bytes == 0) {
        *err = -EINVAL;
        return NULL;
    }
    uaii_io_pool *p = calloc(1, sizeof *p);
    if (!p) {
        *err = -ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->chunk_bytes = round_up(chunk_bytes, UAII_IO_DEFAULT_ALIGN);
    for (int i = 0; i < n_threads; i++) {
        int rc = pthread_create(&p->threads[i], NULL, worker_main, p);
        if (rc != 0) {
            p->n_threads = i;
            uaii_io_destroy(p);
            *err = -rc;
            return NULL;
        }
    }
    p->n_threads = n_threads;
    *err = 0;
    return p;
}

static void cancel_locked(uaii_io_pool *p, uaii_read_job *j) {
    queue_remove(p, j);
    if (j->next_chunk < j->n_chunks) {
        j->next_chunk = j->n_chunks;
        if (j->status == 0) j->status = -ECANCELED;
    }
    maybe_finish(p, j);
}

void uaii_io_destroy(uaii_io_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    while (p->head) cancel_locked(p, p->head);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void uaii_io_get_counters(uaii_io_pool *p, uaii_io_counters *out) {
    pthread_mutex_lock(&p->mu);
    *out = p->counters;
    if (p->busy > 0) out->busy_ns += uaii_now_ns() - p->busy_since;
    pthread_mutex_unlock(&p->mu);
}

uint64_t uaii_io_chunk_bytes(uaii_io_pool *p) { return p->chunk_bytes; }

void uaii_io_inject_fault(uaii_io_pool *p, int kind, int count) {
    if (kind == UAII_IO_FAULT_EINTR) __atomic_store_n(&p->fault_eintr, count, __ATOMIC_RELAXED);
    if (kind == UAII_IO_FAULT_SHORT) __atomic_store_n(&p->fault_short, count, __ATOMIC_RELAXED);
}

/* ---- files ----------------------------------------------------------------------------------------------- */
static uint32_t query_align(int fd, const struct stat *st, int *direct_possible) {
    uint32_t align = UAII_IO_DEFAULT_ALIGN;
    *direct_possible = 1;
    if (S_ISBLK(st->st_mode)) {
        int ss = 0;
        if (ioctl(fd, BLKSSZGET, &ss) == 0 && ss > 0) align = (uint32_t)ss;
    }
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        if (sx.stx_dio_offset_align == 0 || sx.stx_dio_mem_align > UAII_IO_DEFAULT_ALIGN) *direct_possible = 0;
        else align = sx.stx_dio_offset_align;
    }
#endif
    if (align == 0 || align > MAX_ALIGN) {
        align = UAII_IO_DEFAULT_ALIGN;
        *direct_possible = 0;
    }
    return align;
}

uaii_file *uaii_file_open(const char *path, int use_direct, int drop_cache, int *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *err = -errno;
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) {
        *err = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        close(fd);
        return NULL;
    }
    uaii_file *f = calloc(1, sizeof *f);
    if (!f) {
        close(fd);
        *err = -ENOMEM;
        return NULL;
    }
    f->fd = fd;
    f->fd_direct = -1;
    f->drop_cache = drop_cache;
    f->size = (uint64_t)st.st_size;
    if (S_ISBLK(st.st_mode)) {
        uint64_t bytes = 0;
        if (ioctl(fd, BLKGETSIZE64, &bytes) == 0) f->size = bytes;
    }
    int direct_possible;
    f->align = query_align(fd, &st, &direct_possible);
    if (use_direct && direct_possible) f->fd_direct = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    f->direct_ok = f->fd_direct >= 0;
    /* Buffered reads are large and explicit: kernel read-ahead would only fill the page cache past them. */
    if (drop_cache) (void)posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    *err = 0;
    return f;
}

void uaii_file_close(uaii_file *f) {
    if (!f) return;
    if (f->fd_direct >= 0) close(f->fd_direct);
    close(f->fd);
    free(f);
}

uint64_t uaii_file_size(uaii_file *f) { return f->size; }
uint32_t uaii_file_align(uaii_file *f) { return f->align; }
int uaii_file_is_direct(uaii_file *f) {
    return f->fd_direct >= 0 && __atomic_load_n(&f->direct_ok, __ATOMIC_RELAXED);
}

/* ---- reads ----------------------------------------------------------------------------------------------- */
uaii_read_job *uaii_job_new(void) { return calloc(1, sizeof(uaii_read_job)); }
void uaii_job_free(uaii_read_job *j) { free(j); }

uint64_t uaii_window_bytes(uaii_file *f, uint64_t offset, uint64_t nbytes) {
    if (nbytes == 0) return 0;
    return round_up(offset + nbytes, f->align) - round_down(offset, f->align);
}

int uaii_io_submit(uaii_io_pool *p, uaii_read_job *j, uaii_file *f, uint64_t offset, uint64_t nbytes,
                   uint8_t *dst, uint64_t dst_cap) {
    if (!p || !j || !f || (nbytes > 0 && !dst) || ((uintptr_t)dst % UAII_IO_DEFAULT_ALIGN) != 0) return -EINVAL;
    if (offset + nbytes < offset || uaii_window_bytes(f, offset, nbytes) > dst_cap) return -EINVAL;
    pthread_mutex_lock(&p->mu);
    if (j->active) {
        pthread_mutex_unlock(&p->mu);
        return -EBUSY;
    }
    if (p->stop) {
        pthread_mutex_unlock(&p->mu);
        return -ESHUTDOWN;
    }
    j->file = f;
    j->dst = dst;
    j->offset = offset;
    j->nbytes = nbytes;
    j->win_start = nbytes ? round_down(offset, f->align) : offset;
    j->win_end = nbytes ? round_up(offset + nbytes, f->align) : offset;
    j->chunk = round_up(p->chunk_bytes, f->align);
    j->n_chunks = (uint32_t)((j->win_end - j->win_start + j->chunk - 1) / j->chunk);
    j->next_chunk = 0;
    j->running = 0;
    j->status = 0;
    j->done_seq = 0;
    j->active = 1;
    if (j->n_chunks == 0) {
        maybe_finish(p, j);
    } else {
        queue_push_back(p, j);
        if (j->n_chunks > 1) pthread_cond_broadcast(&p->work_cv);
        else pthread_cond_signal(&p->work_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int uaii_io_wait(uaii_io_pool *p, uaii_read_job *j) {
    pthread_mutex_lock(&p->mu);
    while (j->active) pthread_cond_wait(&p->done_cv, &p->mu);
    int rc = j->status;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int uaii_io_done(uaii_io_pool *p, uaii_read_job *j) {
    pthread_mutex_lock(&p->mu);
    int done = !j->active;
    pthread_mutex_unlock(&p->mu);
    return done;
}

void uaii_io_boost(uaii_io_pool *p, uaii_read_job *j) {
    pthread_mutex_lock(&p->mu);
    if (j->queued && p->head != j) {
        queue_remove(p, j);
        queue_push_front(p, j);
    }
    pthread_mutex_unlock(&p->mu);
}

int uaii_io_cancel(uaii_io_pool *p, uaii_read_job *j) {
    pthread_mutex_lock(&p->mu);
    if (j->active) cancel_locked(p, j);
    while (j->active) pthread_cond_wait(&p->done_cv, &p->mu);
    int rc = j->status;
    pthread_mutex_unlock(&p->mu);
    return rc;
}

uint64_t uaii_job_data_offset(uaii_read_job *j) { return j->offset - j->win_start; }

uint64_t uaii_job_done_seq(uaii_read_job *j) { return j->done_seq; }

/* ---- helpers --------------------------------------------------------------------------------------------- */
void *uaii_aligned_alloc(uint64_t align, uint64_t size) {
    void *ptr = NULL;
    if (align < sizeof(void *)) align = sizeof(void *);
    if (posix_memalign(&ptr, (size_t)align, (size_t)(size ? size : 1)) != 0) return NULL;
    return ptr;
}

void uaii_aligned_free(void *ptr) { free(ptr); }

int64_t uaii_resident_bytes(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    if (st.st_size == 0) {
        close(fd);
        return 0;
    }
    size_t size = (size_t)st.st_size, page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (size + page - 1) / page;
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return -errno;
    unsigned char *vec = malloc(pages);
    if (!vec) {
        munmap(map, size);
        return -ENOMEM;
    }
    int64_t resident = 0;
    if (mincore(map, size, vec) != 0) {
        resident = -errno;
    } else {
        for (size_t i = 0; i < pages; i++) {
            if (vec[i] & 1) resident += (int64_t)(i + 1 == pages ? size - i * page : page);
        }
    }
    free(vec);
    munmap(map, size);
    return resident;
}

int uaii_drop_page_cache(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = 0;
    if (fdatasync(fd) != 0 && errno != EINVAL) rc = -errno;
    int adv = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (rc == 0 && adv != 0) rc = -adv;
    close(fd);
    return rc;
}
