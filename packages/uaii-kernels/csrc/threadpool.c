/* threadpool.c — the persistent thread pool: workers are created once (lazily, and again only when the thread
 * count changes) and park between calls. Waiting spins briefly (pause, then sched_yield), then sleeps on a
 * condition variable, so a busy or oversubscribed machine degrades gracefully instead of burning the cores that
 * other processes need.
 *
 * Joining a job is optional: every kernel splits its work into chunks taken from an atomic counter, and the caller
 * takes chunks too. When the caller runs out of chunks it marks the job done and waits only for the workers that
 * are inside it (`active`), never for workers that have not woken up yet — on a loaded machine a descheduled worker
 * costs at most its current chunk, where a barrier over all workers would cost a scheduler time slice per call.
 * A worker joins job g only if, after announcing itself in `active`, g is still the current job and not done. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "uk_internal.h"

#if defined(UK_X86)
#include <immintrin.h>
#define UK_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define UK_PAUSE() __asm__ __volatile__("yield")
#else
#define UK_PAUSE() ((void)0)
#endif

#define SPIN_NS 60000      /* poll for 60 us (a decode step calls kernels every few tens of us) ... */
#define SPIN_YIELDS 4      /* ... then a few sched_yield()s, then sleep on the condition variable */

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* one step of a wait: pause (and look at the clock now and then) for SPIN_NS, then yield, then 0 = go to sleep */
typedef struct { uint64_t t0; int n; } spin_t;
static inline int spin_step(spin_t *sp) {
    if (sp->n >= 0) {
        for (int i = 0; i < 32; i++) UK_PAUSE();
        if ((++sp->n & 7) == 0) {
            const uint64_t t = now_ns();
            if (sp->t0 == 0) sp->t0 = t;
            else if (t - sp->t0 > SPIN_NS) sp->n = -SPIN_YIELDS;
        }
        return 1;
    }
    if (sp->n < 0) { sched_yield(); sp->n++; return sp->n < 0; }
    return 0;
}

typedef struct {
    pthread_mutex_t call_lock;          /* one parallel call at a time (and the scratch buffers with it) */
    pthread_mutex_t mu;                 /* guards the sleeps below */
    pthread_cond_t cv_work, cv_done;
    int n_threads;                      /* configured, including the calling thread */
    int n_workers;                      /* started worker threads (n_threads - 1 once started) */
    pthread_t workers[UK_MAX_THREADS];
    _Atomic uint64_t gen;               /* the current job, bumped once per job */
    _Atomic uint64_t done_gen;          /* the last job the caller finished (no new worker may join it) */
    _Atomic int active;                 /* workers inside the current job */
    _Atomic int n_sleeping;             /* workers parked on cv_work */
    _Atomic int main_sleeping;
    _Atomic int stop;
    uk_task_fn fn;
    void *ctx;
    int nth;
    int started_total;                  /* threads ever created (tests check there is none per call) */
    void *scratch[UK_MAX_THREADS + 2];
    size_t scratch_size[UK_MAX_THREADS + 2];
} uk_pool_t;

static uk_pool_t P = {
    .call_lock = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER,
    .cv_work = PTHREAD_COND_INITIALIZER, .cv_done = PTHREAD_COND_INITIALIZER,
};
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

static int default_threads(void) {
    const char *env = getenv("UAII_NUM_THREADS");
    if (env && *env) {
        int n = atoi(env);
        if (n > 0) return UK_MIN(n, UK_MAX_THREADS);
    }
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return UK_MIN(n, UK_MAX_THREADS);
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)UK_MIN(n, UK_MAX_THREADS) : 1;
}

static void after_fork_child(void) {
    /* the workers do not exist in the child: forget them; the next parallel call starts new ones */
    pthread_mutex_init(&P.call_lock, NULL);
    pthread_mutex_init(&P.mu, NULL);
    pthread_cond_init(&P.cv_work, NULL);
    pthread_cond_init(&P.cv_done, NULL);
    P.n_workers = 0;
    atomic_store(&P.active, 0);
    atomic_store(&P.n_sleeping, 0);
    atomic_store(&P.main_sleeping, 0);
    atomic_store(&P.stop, 0);
}

static void pool_init_once(void) {
    P.n_threads = default_threads();
    pthread_atfork(NULL, NULL, after_fork_child);
}

static void *worker_main(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t seen = 0;                  /* start_workers() reset gen to 0 before creating us */
    for (;;) {
        uint64_t g;
        spin_t sp = {0, 0};
        while ((g = atomic_load(&P.gen)) == seen && !atomic_load(&P.stop)) {
            if (spin_step(&sp)) continue;
            pthread_mutex_lock(&P.mu);
            atomic_fetch_add(&P.n_sleeping, 1);
            while ((g = atomic_load(&P.gen)) == seen && !atomic_load(&P.stop)) pthread_cond_wait(&P.cv_work, &P.mu);
            atomic_fetch_sub(&P.n_sleeping, 1);
            pthread_mutex_unlock(&P.mu);
        }
        if (atomic_load(&P.stop)) return NULL;
        seen = g;
        atomic_fetch_add(&P.active, 1);
        if (atomic_load(&P.done_gen) != g && atomic_load(&P.gen) == g && id < P.nth) P.fn(P.ctx, id, P.nth);
        if (atomic_fetch_sub(&P.active, 1) == 1 && atomic_load(&P.main_sleeping)) {
            pthread_mutex_lock(&P.mu);
            pthread_cond_signal(&P.cv_done);
            pthread_mutex_unlock(&P.mu);
        }
    }
}

static void stop_workers(void) {
    if (P.n_workers == 0) return;
    pthread_mutex_lock(&P.mu);
    atomic_store(&P.stop, 1);
    pthread_cond_broadcast(&P.cv_work);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.n_workers; i++) pthread_join(P.workers[i], NULL);
    P.n_workers = 0;
    atomic_store(&P.stop, 0);
}

static int start_workers(void) {
    int want = P.n_threads - 1;
    atomic_store(&P.gen, 0);
    atomic_store(&P.done_gen, 0);
    atomic_store(&P.active, 0);
    for (int i = 0; i < want; i++) {
        if (pthread_create(&P.workers[i], NULL, worker_main, (void *)(intptr_t)(i + 1)) != 0) {
            P.n_workers = i;          /* run with what we have */
            return i;
        }
        P.started_total++;
    }
    P.n_workers = want;
    return want;
}

int uk_set_num_threads(int n) {
    pthread_once(&pool_once, pool_init_once);
    pthread_mutex_lock(&P.call_lock);
    if (n <= 0) n = default_threads();
    n = UK_MIN(n, UK_MAX_THREADS);
    if (n != P.n_threads) {
        stop_workers();
        P.n_threads = n;
    }
    pthread_mutex_unlock(&P.call_lock);
    return UK_OK;
}

int uk_get_num_threads(void) {
    pthread_once(&pool_once, pool_init_once);
    return P.n_threads;
}

int uk_pool_workers_started(void) { return P.started_total; }

void uk_parallel_begin(void) {
    pthread_once(&pool_once, pool_init_once);
    pthread_mutex_lock(&P.call_lock);
}

void uk_parallel_end(void) { pthread_mutex_unlock(&P.call_lock); }

void uk_parallel_run(uk_task_fn fn, void *ctx, int max_tasks) {
    int nth = UK_MIN(max_tasks, P.n_threads);
    if (nth <= 1) { fn(ctx, 0, 1); return; }
    if (P.n_workers != P.n_threads - 1) {
        stop_workers();
        if (start_workers() == 0) { fn(ctx, 0, 1); return; }
    }
    nth = UK_MIN(nth, P.n_workers + 1);
    P.fn = fn;
    P.ctx = ctx;
    P.nth = nth;
    const uint64_t g = atomic_fetch_add(&P.gen, 1) + 1;     /* publishes fn/ctx/nth (seq_cst) */
    if (atomic_load(&P.n_sleeping) > 0) {
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.cv_work);
        pthread_mutex_unlock(&P.mu);
    }
    fn(ctx, 0, nth);                                         /* returns when every chunk has been taken */
    atomic_store(&P.done_gen, g);
    spin_t sp = {0, 0};
    while (atomic_load(&P.active) > 0) {                     /* only workers inside the job, finishing a chunk */
        if (spin_step(&sp)) continue;
        pthread_mutex_lock(&P.mu);
        atomic_store(&P.main_sleeping, 1);
        while (atomic_load(&P.active) > 0) pthread_cond_wait(&P.cv_done, &P.mu);
        atomic_store(&P.main_sleeping, 0);
        pthread_mutex_unlock(&P.mu);
    }
}

void uk_wait_count(_Atomic int64_t *count, int64_t target) {
    spin_t sp = {0, 0};
    while (atomic_load(count) < target)
        if (!spin_step(&sp)) sched_yield();
}

void *uk_scratch(int slot, size_t bytes) {
    if (slot < 0 || slot >= UK_MAX_THREADS + 2) return NULL;
    if (P.scratch_size[slot] < bytes) {
        size_t sz = bytes + bytes / 4 + 256;
        void *p = NULL;
        if (posix_memalign(&p, 64, sz) != 0) return NULL;
        free(P.scratch[slot]);
        P.scratch[slot] = p;
        P.scratch_size[slot] = sz;
    }
    return P.scratch[slot];
}
