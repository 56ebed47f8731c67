// dp.c: DataParallel in one process: the worker threads (given) and the four pieces of a step (TODO 1-4).
//
// The picture (PyTorch's nn.DataParallel does the same with one CUDA stream per GPU):
//
//                        global batch (host)
//                 scatter /      |       \            TODO 1: contiguous chunks, sizes differ by <= 1
//                 chunk 0     chunk 1   chunk 2
//   master  ---- replicate ------+---------+          TODO 2: params + BN buffers, master -> every replica
//   replica 0    replica 1   replica 2                given:  forward + backward, one thread each, at once
//      ^-------- reduce --------+---------+           TODO 3: sum of the gradients, onto the master
//   SGD step on the master                            TODO 4: dp_step puts the pieces together
//
// Everything that passes "through the master" (replicate, reduce, the update) is done by one thread on one
// device while the others wait: that is the master bottleneck this lesson measures.
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "kit/check.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/ops.h"
#include "lesson.h"

// ---------------------------------------------------------------- the worker threads (given)

// What the workers are asked to do. Each worker i only ever touches replica i.
typedef enum { JOB_CREATE, JOB_FORWARD_BACKWARD, JOB_FREE, JOB_EXIT } Job;

typedef struct {
    DataParallel *dp;
    int index;
} Worker;

struct DpPool {
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    long generation;  // +1 for every job: a worker runs the job when it sees a generation it has not run yet
    int pending;      // workers still busy with the current job
    Job job;
    // Arguments of the current job.
    const ModelConfig *cfg;
    int global_batch;
    uint64_t seed;
    float label_smoothing, grad_scale;
    Worker workers[DP_MAX_REPLICAS];
    pthread_t threads[DP_MAX_REPLICAS];
};

// Replicas 1..n-1 are allocated by their own thread, so on CUDA each lands on its thread's GPU; they only
// ever see one chunk. The master is created by dp_create's thread instead (see there).
static void worker_create_replica(DataParallel *dp, int i) {
    DpPool *p = dp->pool;
    if (i == 0) return;
    dp->replicas[i] = model_create(p->cfg, dp->device, (p->global_batch + dp->n - 1) / dp->n, p->seed);
}

static void worker_forward_backward(DataParallel *dp, int i) {
    const Batch *chunk = &dp->chunks[i];
    if (chunk->n <= 0 || chunk->n > dp->replicas[i]->max_batch)
        die("replica %d was given a chunk of %d images (expected 1..%d): check dp_scatter (TODO 1)", i, chunk->n,
            dp->replicas[i]->max_batch);
    double t = time_now();
    // The kit's step of lesson 01, minus the update: copy the chunk to this replica's device, forward, loss
    // (its gradient scaled by grad_scale), zero the gradients, backward.
    dp->results[i] = train_forward_backward(dp->replicas[i], chunk, dp->pool->label_smoothing, dp->pool->grad_scale);
    device_synchronize(dp->device);
    dp->compute_seconds[i] = time_now() - t;
}

static void *worker_main(void *arg) {
    Worker *w = arg;
    DataParallel *dp = w->dp;
    DpPool *p = dp->pool;
    // The kit's CUDA state (streams, cuBLAS handle) is per host thread and per GPU: pick the GPU once, first.
    if (dp->device == DEVICE_CUDA) device_set_gpu(dp->gpu[w->index]);
    // OpenMP settings are per thread: this replica's ops use threads_per_replica threads (see dp_create).
    omp_set_num_threads(dp->threads_per_replica);
    long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->generation == seen) pthread_cond_wait(&p->start, &p->mu);
        seen = p->generation;
        Job job = p->job;
        pthread_mutex_unlock(&p->mu);

        if (job == JOB_CREATE) worker_create_replica(dp, w->index);
        if (job == JOB_FORWARD_BACKWARD) worker_forward_backward(dp, w->index);
        if (job == JOB_FREE && w->index > 0) model_free(dp->replicas[w->index]);

        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
        if (job == JOB_EXIT) break;
    }
    return NULL;
}

// Hands `job` to every worker and returns when all of them have finished it.
static void pool_run(DataParallel *dp, Job job) {
    DpPool *p = dp->pool;
    pthread_mutex_lock(&p->mu);
    p->job = job;
    p->pending = dp->n;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

DataParallel *dp_create(const ModelConfig *cfg, Device d, int n, int global_batch, uint64_t seed) {
    if (n < 1 || n > DP_MAX_REPLICAS) die("--devices must be between 1 and %d, got %d", DP_MAX_REPLICAS, n);
    if (global_batch < n)
        die("a global batch of %d images cannot feed %d replicas: raise --batch-size or lower --devices",
            global_batch, n);
    DataParallel *dp = xcalloc(1, sizeof *dp);
    dp->n = n;
    dp->device = d;
    int gpus = d == DEVICE_CUDA ? device_gpu_count() : 1;
    for (int i = 0; i < n; i++) dp->gpu[i] = d == DEVICE_CUDA ? i % gpus : 0;
    // CPU: N replicas each running ops with OpenMP would start N teams of `cores` threads: N times more
    // threads than cores, all spinning and evicting each other's caches. Give each replica an equal share
    // of the cores instead (at least 1; with more replicas than cores they have to take turns anyway).
    int cores = omp_get_max_threads();
    dp->threads_per_replica = d == DEVICE_CPU ? (cores / n > 1 ? cores / n : 1) : 1;

    // The calling thread works for the master (replicate, reduce, update, evaluation): use the master's GPU.
    if (d == DEVICE_CUDA) device_set_gpu(dp->gpu[0]);
    DpPool *p = dp->pool = xcalloc(1, sizeof *p);
    CHECK_PTHREAD(pthread_mutex_init(&p->mu, NULL));
    CHECK_PTHREAD(pthread_cond_init(&p->start, NULL));
    CHECK_PTHREAD(pthread_cond_init(&p->done, NULL));
    for (int i = 0; i < n; i++) {
        p->workers[i] = (Worker){dp, i};
        CHECK_PTHREAD(pthread_create(&p->threads[i], NULL, worker_main, &p->workers[i]));
    }
    // The master is used by this thread too (update, evaluation on whole batches of up to global_batch) with
    // all of its OpenMP threads, and the kit sizes a model's scratch memory for the OpenMP thread count of
    // the thread that creates it: so this thread creates it.
    dp->replicas[0] = model_create(cfg, d, global_batch, seed);
    p->cfg = cfg;
    p->global_batch = global_batch;
    p->seed = seed;
    pool_run(dp, JOB_CREATE);
    p->cfg = NULL;
    bool other_gpu = false;
    for (int i = 1; i < n; i++) other_gpu |= dp->gpu[i] != dp->gpu[0];
    if (other_gpu) dp->grad_stage = device_alloc(d, dp->replicas[0]->n_params * sizeof(float));
    return dp;
}

void dp_free(DataParallel *dp) {
    if (!dp) return;
    if (dp->grad_stage) device_free(dp->device, dp->grad_stage);
    pool_run(dp, JOB_FREE);
    pool_run(dp, JOB_EXIT);
    model_free(dp->replicas[0]);
    for (int i = 0; i < dp->n; i++) CHECK_PTHREAD(pthread_join(dp->pool->threads[i], NULL));
    pthread_cond_destroy(&dp->pool->start);
    pthread_cond_destroy(&dp->pool->done);
    pthread_mutex_destroy(&dp->pool->mu);
    free(dp->pool);
    free(dp);
}

void dp_parallel_forward_backward(DataParallel *dp, float label_smoothing, float grad_scale) {
    dp->pool->label_smoothing = label_smoothing;
    dp->pool->grad_scale = grad_scale;
    pool_run(dp, JOB_FORWARD_BACKWARD);
    double slowest = 0.0;
    for (int i = 0; i < dp->n; i++) slowest = dp->compute_seconds[i] > slowest ? dp->compute_seconds[i] : slowest;
    dp->times.compute_slowest += slowest;
}

const float *dp_grads_for_master(DataParallel *dp, int i) {
    if (dp->device == DEVICE_CPU || dp->gpu[i] == dp->gpu[0]) return dp->replicas[i]->grads;
    // Another GPU: the bytes must cross the link (NVLink or PCIe) into the master's GPU first.
    device_copy(dp->device, dp->grad_stage, dp->replicas[i]->grads, dp->replicas[0]->n_params * sizeof(float));
    return dp->grad_stage;
}

// Waits for every GPU in use (CUDA calls return before the work is done; a phase's time must include it).
static void dp_sync(DataParallel *dp) {
    if (dp->device != DEVICE_CUDA) return;
    for (int i = 0; i < dp->n; i++) {
        bool first = true;  // each GPU once
        for (int j = 0; j < i; j++) first &= dp->gpu[j] != dp->gpu[i];
        if (!first) continue;
        device_set_gpu(dp->gpu[i]);
        device_synchronize(dp->device);
    }
    device_set_gpu(dp->gpu[0]);
}

void dp_phase_done(DataParallel *dp, double *total, double *t) {
    dp_sync(dp);
    double now = time_now();
    *total += now - *t;
    *t = now;
}

// ---------------------------------------------------------------- TODO 1: scatter

// TODO 1: split `global` (global->n images: x is (n, C, H, W), y is (n)) into dp->n contiguous chunks, in order:
//   - as even as possible: sizes differ by at most one, none is empty, the larger chunks first
//     (10 images on 3 replicas: 4, 3, 3)
//   - chunks[i].x and .y point INTO global->x / global->y at the chunk's first image (an image is
//     C * H * W floats: m->cfg.in_c * in_h * in_w of any replica); chunks[i].index = global->index
//   - nothing is copied here: each replica's thread copies its own chunk to its device (in parallel)
// PyTorch: inputs.chunk(n) (torch.chunk gives 4, 4, 2 for 10 on 3: every chunk ceil(10/3) but the last)
void dp_scatter(DataParallel *dp, const Batch *global) {
    CHECK(global->n >= dp->n, "every replica needs at least one image: the global batch must be >= --devices");
    // BEGIN SOLUTION
    const ModelConfig *c = &dp->replicas[0]->cfg;
    size_t image_floats = (size_t)c->in_c * c->in_h * c->in_w;
    int base = global->n / dp->n, extra = global->n % dp->n, start = 0;
    for (int i = 0; i < dp->n; i++) {
        int n = base + (i < extra ? 1 : 0);
        dp->chunks[i] = (Batch){.n = n, .x = global->x + (size_t)start * image_floats, .y = global->y + start,
                                .index = global->index};
        start += n;
    }
    // END SOLUTION
}

// ---------------------------------------------------------------- TODO 2: replicate

// TODO 2: make every replica i >= 1 an exact copy of the master (replicas[0]) in everything its forward
//   pass reads: the parameters, and what else does a model keep (kit/model.h)? device_copy copies between
//   two buffers of the device (on CUDA also between two GPUs); sizes are in bytes.
//   Gradients and velocity are not copied: why not? (Who overwrites the first, who owns the second?)
// PyTorch: replicas = replicate(module, device_ids)  (parameters AND buffers, every forward)
void dp_replicate(DataParallel *dp) {
    // BEGIN SOLUTION
    const Model *master = dp->replicas[0];
    for (int i = 1; i < dp->n; i++) {
        Model *r = dp->replicas[i];
        device_copy(dp->device, r->params, master->params, master->n_params * sizeof(float));
        device_copy(dp->device, r->buffers, master->buffers, master->n_buffers * sizeof(float));
    }
    // END SOLUTION
}

// ---------------------------------------------------------------- TODO 3: reduce

// TODO 3: afterwards master->grads must hold the SUM of every replica's gradients (n_params floats each).
//   Think first: what does master->grads already hold when this is called? And why is there no division
//   here (see the scale in dp_step)?
//   dp_grads_for_master(dp, i) gives replica i's gradients where the master's device can read them;
//   kit/ops.h has an in-place add on the device.
// PyTorch: the backward of replicate is a reduce_add of the replicas' gradients onto device_ids[0]
void dp_reduce_to_master(DataParallel *dp) {
    // BEGIN SOLUTION
    Model *master = dp->replicas[0];
    for (int i = 1; i < dp->n; i++)
        add_inplace(dp->device, master->n_params, master->grads, dp_grads_for_master(dp, i));
    // END SOLUTION
}

// ---------------------------------------------------------------- TODO 4: the step

// TODO 4: one DataParallel step on the global batch, built from TODO 1-3, the replicas' forward + backward
//   (dp_parallel_forward_backward, given) and one SGD step at opt->lr (optim_step). What must hold:
//   - the result is lesson 01's step on the whole batch: no replica computes with the weights of the step
//     before, and the master alone updates, once, with every replica's gradient;
//   - the scale handed to the replicas: the loss is the mean over the GLOBAL batch, the chunks differ in size
//     (6, 5, 5), and TODO 3 adds the replicas' gradients without dividing. Which scale makes every image weigh
//     the same, whichever replica computed it?
//   - each of the five phases (scatter, replicate, compute, reduce, update) is timed into its dp->times field:
//         double t = time_now();  ...a phase...  dp_phase_done(dp, &dp->times.scatter, &t);  ...the next...
//   - the return value is the sum of dp->results[i] (loss_sum, correct, count) over the replicas, and the step
//     is counted in dp->times.steps
// PyTorch: out = dp_model(x)  (scatter, replicate, parallel_apply, gather); loss.backward(); opt.step()
Metrics dp_step(DataParallel *dp, const Batch *global, const SgdConfig *opt, float label_smoothing) {
    Metrics total = {0, 0, 0};
    // BEGIN SOLUTION
    double t = time_now();
    dp_scatter(dp, global);
    dp_phase_done(dp, &dp->times.scatter, &t);
    dp_replicate(dp);
    dp_phase_done(dp, &dp->times.replicate, &t);
    dp_parallel_forward_backward(dp, label_smoothing, 1.0f / (float)global->n);
    dp_phase_done(dp, &dp->times.compute, &t);
    dp_reduce_to_master(dp);
    dp_phase_done(dp, &dp->times.reduce, &t);
    optim_step(dp->replicas[0], opt);
    dp_phase_done(dp, &dp->times.update, &t);
    for (int i = 0; i < dp->n; i++) {
        total.loss_sum += dp->results[i].loss_sum;
        total.correct += dp->results[i].correct;
        total.count += dp->results[i].count;
    }
    dp->times.steps++;
    // END SOLUTION
    return total;
}
