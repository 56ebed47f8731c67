// kit/loader.c: double-buffered batches, filled by one background thread (see data.h).
//
// Two buffers: the caller reads one (the batch loader_next returned) while the worker fills the other.
// The protocol is one job at a time: loader_next waits for the job in flight (that is the "wait" time),
// hands its buffer to the caller, and immediately submits the next batch into the other buffer.
// On CUDA, once a consumer asked (batch_on_device), each host buffer also has a device buffer: the worker
// queues the copy of what it filled on a copy stream, and events order it with the compute (data.h).
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/trace.h"
#ifdef KIT_CUDA
#include "kit/cuda/cuda_context.h"
#include "kit/cuda_check.h"
#endif

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
    bool job_wait_copy;        // host slot job_slot was staged: wait for that copy before refilling it
    bool shutdown;

    // The copy to the device (data.h, "overlapped"); all under mu but the buffers' contents.
    bool overlap;              // staging allowed (KIT_OVERLAP=0, loader_set_overlap)
    bool staging;              // started by a consumer on CUDA: the worker queues a copy of every slot it fills
    bool slot_staged[2];       // the batch now in slot k has its copy queued into dev_x[k], dev_y[k]
    int gpu;                   // the consumer's GPU, where the device slots live
    size_t image_floats;       // C * H * W
    float *dev_x[2];           // (batch_size, C, H, W) on the device
    int *dev_y[2];             // (batch_size)
#ifdef KIT_CUDA
    cudaStream_t copy_stream;  // non-blocking (data.h says why)
    cudaEvent_t copied[2];     // on copy_stream: slot k's copy is done
    cudaEvent_t consumed[2];   // on the legacy stream: the compute that read device slot k is done
#endif
};

#ifdef KIT_CUDA
// Worker, before refilling host slot `slot`: the copy that reads it must be done (the copy engine reads
// pinned memory while the copy runs, not when it is queued).
static void stage_wait_copy(Loader *L, int slot) {
    CUDA_CHECK(cudaSetDevice(L->gpu));
    CUDA_CHECK(cudaEventSynchronize(L->copied[slot]));
}

// Worker, holding mu, after filling slot `slot`: queue its copy behind the compute that still reads the
// device slot (consumed), and mark its end (copied).
static void stage_queue_copy(Loader *L, int slot) {
    const Batch *b = &L->slot[slot];
    CUDA_CHECK(cudaSetDevice(L->gpu));
    CUDA_CHECK(cudaStreamWaitEvent(L->copy_stream, L->consumed[slot], 0));
    CUDA_CHECK(cudaMemcpyAsync(L->dev_x[slot], b->x, (size_t)b->n * L->image_floats * sizeof(float),
                               cudaMemcpyHostToDevice, L->copy_stream));
    CUDA_CHECK(cudaMemcpyAsync(L->dev_y[slot], b->y, (size_t)b->n * sizeof(int), cudaMemcpyHostToDevice,
                               L->copy_stream));
    CUDA_CHECK(cudaEventRecord(L->copied[slot], L->copy_stream));
    L->slot_staged[slot] = true;
}

// Caller's thread, holding mu: the caller is done with device slot `slot` once the work it has queued so far
// is done. An event on the legacy default stream completes after all earlier work on every blocking stream
// of this GPU, the kit's compute streams (cuda_context.h) included.
static void stage_release(Loader *L, int slot) {
    if (L->staging) CUDA_CHECK(cudaEventRecord(L->consumed[slot], 0));
}

// Consumer's thread, holding mu: device slots on this thread's GPU, a copy stream, the events.
static void stage_start(Loader *L) {
    CUDA_CHECK(cudaGetDevice(&L->gpu));
    for (int k = 0; k < 2; k++) {
        L->dev_x[k] = device_alloc(DEVICE_CUDA, (size_t)L->batch_size * L->image_floats * sizeof(float));
        L->dev_y[k] = device_alloc(DEVICE_CUDA, (size_t)L->batch_size * sizeof(int));
        CUDA_CHECK(cudaEventCreateWithFlags(&L->copied[k], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&L->consumed[k], cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&L->copy_stream, cudaStreamNonBlocking));
    L->staging = true;
    // The next batch may be filled already (the worker saw staging off): queue its copy here, so that
    // staging starts with it whatever the timing. A job still pending queues its own when it is filled.
    if (!L->job_pending && L->next < loader_batches_per_epoch(L)) stage_queue_copy(L, L->next % 2);
}

static void stage_free(Loader *L) {
    if (!L->staging) return;
    CUDA_CHECK(cudaSetDevice(L->gpu));
    CUDA_CHECK(cudaStreamSynchronize(L->copy_stream));  // no copy may still write a buffer we free
    CUDA_CHECK(cudaStreamDestroy(L->copy_stream));
    for (int k = 0; k < 2; k++) {
        CUDA_CHECK(cudaEventDestroy(L->copied[k]));
        CUDA_CHECK(cudaEventDestroy(L->consumed[k]));
        device_free(DEVICE_CUDA, L->dev_x[k]);
        device_free(DEVICE_CUDA, L->dev_y[k]);
    }
}
#else
static void stage_wait_copy(Loader *L, int slot) { (void)L, (void)slot; }
static void stage_queue_copy(Loader *L, int slot) { (void)L, (void)slot; }
static void stage_release(Loader *L, int slot) { (void)L, (void)slot; }
static void stage_free(Loader *L) { (void)L; }
#endif

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
        bool wait_copy = L->job_wait_copy;
        // Fill outside the lock: the caller is free to read the other slot meanwhile. The indices and
        // epoch are not touched by the caller while a job is pending (start_epoch waits first).
        pthread_mutex_unlock(&L->mu);
        if (wait_copy) stage_wait_copy(L, slot);
        if (kit_trace_flags) trace_thread_name("loader");  // its own track on the timeline (--trace)
        double t = trace_begin("load batch");
        loader_fill(L, batch, slot);
        trace_endf(t, TRACE_DATA, "load batch %d", batch);
        pthread_mutex_lock(&L->mu);
        if (L->staging && L->overlap) stage_queue_copy(L, slot);
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
    L->job_wait_copy = L->slot_staged[slot];
    L->slot_staged[slot] = false;
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
    const char *env = getenv("KIT_OVERLAP");
    L->overlap = !(env && strcmp(env, "0") == 0);
    L->indices = xmalloc((size_t)(L->count > 0 ? L->count : 1) * sizeof(int));
    size_t img = (size_t)ds->c * ds->h * ds->w;
    L->image_floats = img;
    for (int k = 0; k < 2; k++) {
        L->slot[k].x = host_alloc_pinned((size_t)batch_size * img * sizeof(float));
        L->slot[k].y = host_alloc_pinned((size_t)batch_size * sizeof(int));
        L->slot[k].loader = L;
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
    for (int k = 0; k < 2; k++) stage_release(L, k);  // the caller is done with every batch before
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
    double t = trace_begin("data wait");  // the caller's track (--trace): every program's waits, in one place
    pthread_mutex_lock(&L->mu);
    double waited = loader_wait_idle(L);  // batch L->next is now in slot L->next % 2
    const Batch *b = NULL;
    if (L->next < nb) {
        b = &L->slot[L->next % 2];
        L->next++;
        // Prefetch into the other slot; the caller keeps reading b until its next call. The caller is done
        // with the batch that slot held: its compute, queued so far, releases the device slot.
        stage_release(L, L->next % 2);
        if (L->next < nb) loader_submit(L, L->next, L->next % 2);
    }
    pthread_mutex_unlock(&L->mu);
    trace_end(t, TRACE_DATA, "data wait");
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
    stage_free(L);
    pthread_cond_destroy(&L->cv);
    pthread_mutex_destroy(&L->mu);
    for (int k = 0; k < 2; k++) {
        host_free_pinned(L->slot[k].x);
        host_free_pinned(L->slot[k].y);
    }
    free(L->indices);
    free(L);
}

void loader_set_overlap(Loader *L, bool allowed) {
    pthread_mutex_lock(&L->mu);
    L->overlap = allowed;
    pthread_mutex_unlock(&L->mu);
}

bool batch_on_device(const Batch *b, Device d, const float **x, const int **y) {
    Loader *L = b->loader;
    // Only the loader's own slots: a copy of a Batch (lesson 02's chunks) may point anywhere into them.
    if (d != DEVICE_CUDA || !L || (b != &L->slot[0] && b != &L->slot[1])) return false;
    bool found = false;
#ifdef KIT_CUDA
    int slot = (int)(b - L->slot), gpu = -1;
    CUDA_CHECK(cudaGetDevice(&gpu));
    pthread_mutex_lock(&L->mu);
    if (!L->staging && L->overlap) {
        stage_start(L);  // this batch is copied by the caller; the next ones are staged
    } else if (L->slot_staged[slot] && gpu == L->gpu) {
        // The compute stream waits for this batch's copy, and only for it: the next batch's copy, queued
        // behind it on the copy stream, keeps running while this batch computes.
        CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), L->copied[slot], 0));
        *x = L->dev_x[slot];
        *y = L->dev_y[slot];
        found = true;
    }
    pthread_mutex_unlock(&L->mu);
#else
    (void)x, (void)y;
#endif
    return found;
}
