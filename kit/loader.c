// kit/loader.c: double-buffered batches, filled by one background thread (see data.h).
//
// Two buffers: the caller reads one (the batch loader_next returned) while the worker fills the other.
// The protocol is one job at a time: loader_next waits for the job in flight (that is the "wait" time),
// hands its buffer to the caller, and immediately submits the next batch into the other buffer.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/log.h"

struct Loader {
    const Dataset *ds;
    Sampler sampler;           // our own copy: the loader sets its epoch
    Augment aug;
    bool has_aug, drop_last;
    uint64_t seed;
    int batch_size;
    int *indices;              // (sampler_len) this rank's indices for the current epoch
    int count;                 // sampler_len
    int epoch, next;           // next: the batch number loader_next returns next
    bool started;
    Batch slot[2];             // x: (batch_size, C, H, W) pinned host memory; y: (batch_size)

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool job_pending;          // a job is queued or being filled
    int job_batch, job_slot;   // what the worker fills
    bool shutdown;
};

// Fills slot `slot` with batch number `batch` of the current epoch.
static void loader_fill(Loader *L, int batch, int slot) {
    int first = batch * L->batch_size;
    int n = L->count - first < L->batch_size ? L->count - first : L->batch_size;
    Batch *b = &L->slot[slot];
    dataset_fill_batch(L->ds, L->indices + first, n, L->has_aug ? &L->aug : NULL, L->seed, L->epoch, b->x, b->y);
    b->n = n;
    b->index = batch;
}

static void *loader_worker(void *arg) {
    Loader *L = arg;
    pthread_mutex_lock(&L->mu);
    for (;;) {
        while (!L->job_pending && !L->shutdown) pthread_cond_wait(&L->cv, &L->mu);
        if (L->shutdown) break;
        int batch = L->job_batch, slot = L->job_slot;
        // Fill outside the lock: the caller is free to read the other slot meanwhile. The indices and
        // epoch are not touched by the caller while a job is pending (start_epoch waits first).
        pthread_mutex_unlock(&L->mu);
        loader_fill(L, batch, slot);
        pthread_mutex_lock(&L->mu);
        L->job_pending = false;
        pthread_cond_broadcast(&L->cv);
    }
    pthread_mutex_unlock(&L->mu);
    return NULL;
}

// Blocks until no job is in flight; returns the seconds it blocked. Caller holds L->mu.
static double loader_wait_idle(Loader *L) {
    if (!L->job_pending) return 0.0;
    double t0 = time_now();
    while (L->job_pending) pthread_cond_wait(&L->cv, &L->mu);
    return time_now() - t0;
}

// Queues batch `batch` into `slot`. Caller holds L->mu and has waited for the worker to be idle.
static void loader_submit(Loader *L, int batch, int slot) {
    L->job_batch = batch;
    L->job_slot = slot;
    L->job_pending = true;
    pthread_cond_broadcast(&L->cv);
}

int loader_batches_per_epoch(const Loader *L) {
    return L->drop_last ? L->count / L->batch_size : (L->count + L->batch_size - 1) / L->batch_size;
}

Loader *loader_create(const Dataset *ds, const Sampler *s, int batch_size, bool drop_last, const Augment *aug,
                      uint64_t seed) {
    CHECK(ds && ds->images && s, "loader_create: load the dataset and initialise the sampler first");
    CHECK(batch_size >= 1, "loader_create: the batch size must be at least 1");
    CHECK(s->n == ds->n, "loader_create: the sampler was made for a dataset of another size");
    Loader *L = xcalloc(1, sizeof *L);
    L->ds = ds;
    L->sampler = *s;
    L->has_aug = aug != NULL;
    if (aug) L->aug = *aug;
    L->drop_last = drop_last;
    L->seed = seed;
    L->batch_size = batch_size;
    L->count = sampler_len(s);
    L->indices = xmalloc((size_t)(L->count > 0 ? L->count : 1) * sizeof(int));
    size_t img = (size_t)ds->c * ds->h * ds->w;
    for (int k = 0; k < 2; k++) {
        L->slot[k].x = host_alloc_pinned((size_t)batch_size * img * sizeof(float));
        L->slot[k].y = host_alloc_pinned((size_t)batch_size * sizeof(int));
    }
    CHECK_PTHREAD(pthread_mutex_init(&L->mu, NULL));
    CHECK_PTHREAD(pthread_cond_init(&L->cv, NULL));
    CHECK_PTHREAD(pthread_create(&L->thread, NULL, loader_worker, L));
    return L;
}

void loader_start_epoch(Loader *L, int epoch, int start_batch) {
    int nb = loader_batches_per_epoch(L);
    CHECKF(start_batch >= 0 && start_batch <= nb, "a resumed run must use the same batch size and world size",
           "start_batch %d is outside 0..%d (batches per epoch)", start_batch, nb);
    pthread_mutex_lock(&L->mu);
    loader_wait_idle(L);  // the worker must not read indices/epoch while we change them
    L->epoch = epoch;
    sampler_set_epoch(&L->sampler, epoch);
    sampler_indices(&L->sampler, L->indices);
    L->next = start_batch;
    L->started = true;
    if (start_batch < nb) loader_submit(L, start_batch, start_batch % 2);
    pthread_mutex_unlock(&L->mu);
}

const Batch *loader_next(Loader *L, double *wait_seconds) {
    CHECK(L->started, "call loader_start_epoch before loader_next");
    int nb = loader_batches_per_epoch(L);
    pthread_mutex_lock(&L->mu);
    double waited = loader_wait_idle(L);  // batch L->next is now in slot L->next % 2
    const Batch *b = NULL;
    if (L->next < nb) {
        b = &L->slot[L->next % 2];
        L->next++;
        // Prefetch into the other slot; the caller keeps reading b until its next call.
        if (L->next < nb) loader_submit(L, L->next, L->next % 2);
    }
    pthread_mutex_unlock(&L->mu);
    if (wait_seconds) *wait_seconds = waited;
    return b;
}

void loader_free(Loader *L) {
    if (!L) return;
    pthread_mutex_lock(&L->mu);
    // A batch being filled finishes (it is bounded work); a queued one is dropped.
    L->shutdown = true;
    pthread_cond_broadcast(&L->cv);
    pthread_mutex_unlock(&L->mu);
    CHECK_PTHREAD(pthread_join(L->thread, NULL));
    pthread_cond_destroy(&L->cv);
    pthread_mutex_destroy(&L->mu);
    for (int k = 0; k < 2; k++) {
        host_free_pinned(L->slot[k].x);
        host_free_pinned(L->slot[k].y);
    }
    free(L->indices);
    free(L);
}
