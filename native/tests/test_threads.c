/* test_threads.c — threads: the first calls into the library come from two threads at once (the embedded
 * interpreter starts once), two sessions run in two threads at the same time, one session shared by two threads
 * is serialized by the library, and the last error is per thread.
 *
 * Usage: test_threads SCRATCH_DIR
 */
#define _POSIX_C_SOURCE 200809L /* pthread barriers */
#include <pthread.h>

#include "uaii_test.h"

#define RUNS 200

static char graph[1024];
static float W1[32], B1[8], W2[32], B2[4];
static pthread_barrier_t start_line;

typedef struct worker {
    int id;
    uaii_session* shared; /* NULL: the worker opens its own session */
    int failures;
    int runs;
    char error_seen[256];
} worker;

static void* run_worker(void* arg) {
    worker* w = (worker*)arg;
    uaii_session* s = w->shared;
    pthread_barrier_wait(&start_line);
    if (s == NULL && uaii_session_create(graph, NULL, &s) != UAII_OK) {
        fprintf(stderr, "worker %d: create failed: %s\n", w->id, uaii_last_error());
        w->failures++;
        return NULL;
    }
    for (int k = 0; k < RUNS; k++) {
        float x[4] = {(float)w->id, (float)k * 0.01f, -1.0f, 0.5f}, want[4], y[4];
        size_t n = 0;
        toy_reference(x, W1, B1, W2, B2, want);
        if (w->shared != NULL) {
            /* a shared session: each call is atomic, the set-run-get sequence is not, so only check the calls */
            if (uaii_session_set_f32(s, "x", x, 4) != UAII_OK || uaii_session_run(s) != UAII_OK ||
                uaii_session_get_f32(s, "y_prob", y, 4, &n) != UAII_OK)
                w->failures++;
        } else {
            if (uaii_session_set_f32(s, "x", x, 4) != UAII_OK || uaii_session_run(s) != UAII_OK ||
                uaii_session_get_f32(s, "y_prob", y, 4, &n) != UAII_OK || n != 4) {
                fprintf(stderr, "worker %d run %d: %s\n", w->id, k, uaii_last_error());
                w->failures++;
                break;
            }
            for (int i = 0; i < 4; i++)
                if (!close_to(y[i], want[i])) w->failures++;
        }
        w->runs++;
    }
    /* a failure here must not be seen by the other thread, and survives this thread's other activity */
    uaii_session_run(NULL);
    snprintf(w->error_seen, sizeof w->error_seen, "%s", uaii_last_error());
    pthread_barrier_wait(&start_line);
    if (strcmp(w->error_seen, uaii_last_error()) != 0) w->failures++;
    if (w->shared == NULL) uaii_session_destroy(s);
    return NULL;
}

static void run_pair(uaii_session* shared) {
    pthread_t threads[2];
    worker workers[2] = {{.id = 1, .shared = shared}, {.id = 2, .shared = shared}};
    CHECK(pthread_barrier_init(&start_line, NULL, 2) == 0);
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&threads[i], NULL, run_worker, &workers[i]) == 0);
    for (int i = 0; i < 2; i++) CHECK(pthread_join(threads[i], NULL) == 0);
    pthread_barrier_destroy(&start_line);
    for (int i = 0; i < 2; i++) {
        CHECK(workers[i].failures == 0);
        CHECK(workers[i].runs == RUNS);
        CHECK(strstr(workers[i].error_seen, "uaii_session_run") != NULL);
    }
}

int main(int argc, char** argv) {
    uaii_session* shared = NULL;
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCRATCH_DIR\n", argv[0]);
        return 2;
    }
    make_dir(path_in(argv[1], "weights"));
    write_toy_weights(path_in(argv[1], "weights"), W1, B1, W2, B2);
    snprintf(graph, sizeof graph, "%s", path_in(argv[1], "toy.uaii.json"));
    write_toy_graph(graph, "weights");

    run_pair(NULL); /* no call before: both threads start the library at once, then one session each */
    CHECK(uaii_last_error()[0] == '\0'); /* the workers' errors stayed in their threads */

    CHECK_OK(uaii_session_create(graph, NULL, &shared));
    run_pair(shared);
    uaii_session_destroy(shared);
    test_done("test_threads");
    return 0;
}
