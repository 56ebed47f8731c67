// train.c: lesson 03, the training program of lesson 01 run as N processes that train ONE model (DDP).
//
//   scripts/launch.sh 2 ./train --dataset fashion-mnist --epochs 5      (mpirun -np 2 ./train ...)
//
// Every rank runs this whole file. Each holds a full replica of the model and takes its own shard of every
// global batch; after backward the ranks average their gradients, so every replica applies the same update
// and the replicas stay bit-identical. What you write is marked TODO:
//
//   setup:   rank -> GPU (TODO 1), the process group (TODO 2), this rank's shard of the data (TODO 3a),
//            identical replicas from rank 0 (TODO 4)
//   for each epoch:
//       a new shuffle, the same on every rank (TODO 3b)
//       for each local batch:
//           ddp_step: local forward+backward -> all-reduce average of the gradients -> SGD         (TODO 5)
//       evaluate this rank's shard of the test split, then add up over the ranks                  (TODO 6)
//
// The kit supplies the process group (../../kit/dist.h), forward+backward and the evaluation loop (kit/train.h:
// what you wrote in lesson 01), the sampler and the loader (kit/data.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/device.h"
#include "kit/dist.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"
#include "kit/trace.h"
#include "kit/train.h"
#include "lesson.h"

// ---------------------------------------------------------------- setup (TODO 1, 2)

// TODO 1: which GPU does this rank drive? mpirun starts the ranks of a node one after the other, and the
//   node's GPUs are numbered 0.. on each node. Which of the rank's two numbers matches that numbering?
//   Several ranks may share a GPU when there are fewer GPUs than ranks (fine with --backend mpi, refused by
//   NCCL). Return -1 when gpus <= 0 (a CPU-only node).
// PyTorch: local_rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local_rank)
int ddp_gpu_for_rank(int rank, int local_rank, int gpus) {
    // BEGIN SOLUTION
    if (gpus <= 0) return -1;
    return local_rank % gpus;
    // STARTER: return 0;
    // END SOLUTION
}

// TODO 2: start the process group (kit/dist.h) as the user asked for it: which of the options concern it?
//   It runs MPI_Init (mpirun told every process its rank and the world size), finds the local rank, binds
//   the GPU by the rule of TODO 1, and for NCCL: rank 0 makes an ncclUniqueId and broadcasts it over MPI so
//   that every rank joins the same NCCL communicator.
// PyTorch: dist.init_process_group(backend="nccl")   (torchrun plays mpirun's part)
ProcessGroup *ddp_setup(int *argc, char ***argv, const TrainOptions *o, Device dev) {
    // BEGIN SOLUTION
    return pg_init(argc, argv, o->backend, dev, o->timeout_s);
    // STARTER: return NULL;
    // END SOLUTION
}

// ---------------------------------------------------------------- data (TODO 3)

// TODO 3a: open this rank's shard of the data: train_data_open (kit/train.h) with this rank and the world
//   size, in local batches of (global batch / world), so that one step over all ranks still sees
//   --batch-size images. A global batch that does not divide evenly is an error (die with a clear
//   message). Return the local batch.
//   The kit's samplers then give rank r the positions r, r + world, r + 2 world, ... of each epoch's
//   shuffle (training: the tail is dropped so every rank takes the same number of steps) and of the
//   test split (evaluation: no shuffle, no padding, every image exactly once over all ranks).
// PyTorch: DistributedSampler(train_set, num_replicas=world, rank=rank, drop_last=True);
//          DataLoader(train_set, batch_size=global_batch // world, sampler=sampler)
int ddp_data_open(TrainData *td, const TrainOptions *o, const ProcessGroup *pg) {
    // BEGIN SOLUTION
    int world = pg_world(pg);
    if (o->batch_size % world != 0)
        die("--batch-size %d is the GLOBAL batch: it must divide evenly over %d ranks (try %d)", o->batch_size,
            world, (o->batch_size / world + 1) * world);
    int local_batch = o->batch_size / world;
    train_data_open(td, o, pg_rank(pg), world, local_batch);
    return local_batch;
    // STARTER: train_data_open(td, o, 0, 1, o->batch_size);  // lesson 01's call: every rank reads everything
    // STARTER: return o->batch_size;
    // END SOLUTION
}

// TODO 3b: start training epoch `epoch` on the loader (loader_start_epoch), at batch first_batch (0 when the
//   epoch starts; lesson 04 resumes in the middle of one). The shuffle depends on (seed, epoch) only: every
//   rank computes the same permutation, so the shards stay disjoint, and the order changes every epoch --
//   but only if the loader is told which epoch it is.
// PyTorch: sampler.set_epoch(epoch)   (forgetting it repeats epoch 0's order every epoch)
void ddp_start_epoch(TrainData *td, int epoch, int first_batch) {
    // BEGIN SOLUTION
    loader_start_epoch(td->train_loader, epoch, first_batch);
    // STARTER: loader_start_epoch(td->train_loader, 0, first_batch);
    // END SOLUTION
}

// ---------------------------------------------------------------- identical replicas (TODO 4)

// TODO 4: make every replica equal to rank 0's in everything a forward pass reads (kit/model.h: which
//   buffers are state, which are rebuilt every step?). Every rank built its model from the same --seed, so
//   why broadcast? Because "the same seed" is a promise that breaks silently: a rank restored from another
//   checkpoint, an initialisation on the GPU that is not deterministic, a rank that drew one extra random
//   number. After the broadcast the replicas are bit-identical by construction, whatever happened before.
// PyTorch: DistributedDataParallel(model) broadcasts the module's state from rank 0 when it is created.
void ddp_broadcast_model(ProcessGroup *pg, Model *m) {
    // BEGIN SOLUTION
    pg_broadcast(pg, m->params, m->n_params, 0);
    if (m->n_buffers > 0) pg_broadcast(pg, m->buffers, m->n_buffers, 0);
    // END SOLUTION
}

// ---------------------------------------------------------------- the training step (TODO 5)

// TODO 5: one data-parallel step on this rank's local batch b (b->n images).
//   a. local gradients: train_forward_backward (kit/train.h) with grad_scale 1/b->n: the mean over THIS
//      rank's batch
//   b. turn every rank's gradient into the gradient of the mean over the GLOBAL batch, with ONE collective
//      over the one flat buffer. The mean of the ranks' means over equal local batches IS the global mean.
//      Apply the 1/world once: where does a sum without it, or a second one, leave the update?
//   Stretch (TODO 7): when ddp->buckets is not NULL, the all-reduce runs in buckets that start during
//      backward: call buckets_begin before a, and buckets_finish (waits for them all) instead of b.
// PyTorch: loss.backward() inside DistributedDataParallel (it all-reduces and averages as backward runs)
Metrics ddp_step(Ddp *ddp, const Batch *b, const SgdConfig *opt, float label_smoothing) {
    Model *m = ddp->model;
    double start = time_now();
    // BEGIN SOLUTION
    if (ddp->buckets) buckets_begin(ddp->buckets);
    // END SOLUTION
    Metrics r = train_forward_backward(m, b, label_smoothing, 1.0f / (float)b->n);  // this rank's own gradients
    double backward_done = time_now();
    // BEGIN SOLUTION
    if (ddp->buckets) buckets_finish(ddp->buckets);
    else pg_allreduce_avg(ddp->pg, m->grads, m->n_params);
    // END SOLUTION
    double reduced = time_now();
    optim_step(m, opt);  // on the timeline (--trace) as "optimizer step", as forward and backward are
    // BN running statistics: each rank updated its own from its local batch. Rank 0's win, as with PyTorch
    // DDP's broadcast_buffers, so the replicas stay identical and evaluation sees one model on every rank.
    if (m->n_buffers > 0) pg_broadcast(ddp->pg, m->buffers, m->n_buffers, 0);
    ddp->comm_seconds += reduced - backward_done;
    ddp->compute_seconds += (backward_done - start) + (time_now() - reduced);
    return r;
}

// ---------------------------------------------------------------- global metrics (TODO 6)

// TODO 6: every rank counted only its own shard. Return the sums of loss_sum, correct and count over the
//   ranks, the same on every rank, with ONE collective (kit/dist.h has a sum over doubles in host memory).
//   Sum first, divide last: the mean of the ranks' accuracies is wrong when their counts differ (the test
//   split need not divide evenly by the world size).
// PyTorch: t = torch.tensor([loss_sum, correct, count]); dist.all_reduce(t, op=dist.ReduceOp.SUM)
Metrics ddp_global_metrics(ProcessGroup *pg, Metrics local) {
    // BEGIN SOLUTION
    double sums[3] = {local.loss_sum, (double)local.correct, (double)local.count};
    pg_allreduce_sum_double_host(pg, sums, 3);
    // Counts below 2^53 are exact in a double.
    return (Metrics){.loss_sum = sums[0], .correct = (long)sums[1], .count = (long)sums[2]};
    // STARTER: return local;
    // END SOLUTION
}

Metrics ddp_evaluate(ProcessGroup *pg, Model *m, Loader *test_loader) {
    return ddp_global_metrics(pg, train_evaluate(m, test_loader));
}

// ---------------------------------------------------------------- stretch: buckets (TODO 7)

// TODO 7 (stretch): overlap the all-reduce with backward. Backward finishes the LAST layers' gradients
//   first; the kit's buckets (kit/buckets.h) group the flat gradient buffer into pieces of about bucket_mb MB
//   and start each piece's all-reduce as soon as all of its layers are done, while backward computes
//   the layers before them. Return NULL when bucket_mb <= 0 (flat all-reduce). Otherwise create them
//   (buckets_create over m->grads with the model's views m->views, m->n_views, m->n_params and
//   bucket_mb * 2^20 bytes -- at least one float), and hook them into the model: backward calls
//   m->on_grads_ready(m->on_grads_ready_ctx, offset, count) for each layer; buckets_on_grads_ready is
//   the function to put there, with the buckets as its context.
// PyTorch: DistributedDataParallel(model, bucket_cap_mb=25)
GradBuckets *ddp_attach_buckets(ProcessGroup *pg, Model *m, double bucket_mb) {
    // BEGIN SOLUTION
    if (bucket_mb <= 0) return NULL;
    size_t bytes = (size_t)(bucket_mb * (double)(1u << 20));
    if (bytes < sizeof(float)) bytes = sizeof(float);  // 0 would mean "the default" to buckets_create
    GradBuckets *gb = buckets_create(pg, m->grads, m->views, m->n_views, m->n_params, bytes);
    m->on_grads_ready = buckets_on_grads_ready;
    m->on_grads_ready_ctx = gb;
    return gb;
    // STARTER: return NULL;
    // END SOLUTION
}

// ---------------------------------------------------------------- the training loop
// The one loop every later lesson trains through: lesson 04 adds checkpoints, lesson 05 SyncBN, lesson 07 a
// start without mpirun, each through the hooks (TrainHooks, lesson.h) instead of a copy of the loop.

// Data, replica, optimizer and schedule of this rank; prints the setup (rank 0).
void ddp_run_open(DdpRun *r, ProcessGroup *pg, const TrainOptions *o, const TrainHooks *hooks) {
    memset(r, 0, sizeof *r);
    r->pg = pg;
    r->o = o;
    pg_trace_open(pg, o->trace);  // --trace FILE: every rank's timeline from here to ddp_run_close (kit/trace.h)
    if (hooks) r->hooks = *hooks;
    int world = pg_world(pg);
    Device dev = pg_device(pg);
    // TODO 6 (also): every rank computes, but only rank 0 prints, or N ranks print N copies of every line.
    // BEGIN SOLUTION
    r->is_main = pg_rank(pg) == 0;
    // STARTER: r->is_main = true;
    // END SOLUTION

    // Data: this rank's shard of every epoch, in local batches. Every rank holds a replica: the world.
    r->replicas = pg;
    r->local_batch = r->hooks.open ? r->hooks.open(r->hooks.ctx, r) : ddp_data_open(&r->data, o, pg);
    int replicas = pg_world(r->replicas);

    // Model and optimizer: the same on every rank, made identical by rank 0's broadcast.
    ModelConfig cfg;
    model_config(&cfg, o->model, o->width, r->data.train.c, r->data.train.h, r->data.train.w, r->data.train.classes);
    Model *m = r->hooks.make_model ? r->hooks.make_model(r->hooks.ctx, r, &cfg)
                                   : model_create(&cfg, dev, r->local_batch, o->seed);
    if (r->hooks.model_built) r->hooks.model_built(r->hooks.ctx, pg, m);  // before the broadcast and the buckets see it
    ddp_broadcast_model(r->replicas, m);
    r->ddp = (Ddp){.pg = r->replicas, .model = m,
                   .buckets = r->hooks.step ? NULL : ddp_attach_buckets(r->replicas, m, o->bucket_mb)};
    r->opt = train_sgd_config(o);
    r->steps_per_epoch = loader_batches_per_epoch(r->data.train_loader);
    r->sched = train_schedule(o, r->steps_per_epoch);  // warmup, then linear decay to 0: the run's one schedule
    if (r->is_main) {
        train_print_setup(&r->data, m);
        printf("data: %d %s%s x %d images per step = global batch %d; %d steps per epoch\n", replicas,
               replicas == world ? "rank" : "replica", replicas == 1 ? "" : "s", r->local_batch,
               r->local_batch * replicas, r->steps_per_epoch);
        if (r->ddp.buckets)
            printf("gradients: all-reduced in %d bucket%s of up to %g MB, started during backward\n",
                   buckets_count(r->ddp.buckets), buckets_count(r->ddp.buckets) == 1 ? "" : "s", o->bucket_mb);
        else if (!r->hooks.step)
            printf("gradients: one all-reduce of the flat buffer (%zu floats) after backward\n", m->n_params);
    }
    // rank 0 prints: the bar shows its shard (images/s times the replicas), the epoch lines are global (all-reduced)
    trainlog_begin(&r->log, o, r->data.train.name, dev, replicas, r->is_main);
    r->log.last_loss = r->run.last_loss;
}

// The epoch r->run.epoch, from batch r->run.batch_in_epoch on, then its evaluation. Returns false when a hook
// asked to stop (after a step or after the epoch), true when the next epoch may start.
bool ddp_run_epoch(DdpRun *r) {
    Model *m = r->ddp.model;
    RunState *run = &r->run;
    int epoch = run->epoch;
    trainlog_epoch_begin(&r->log, epoch, r->steps_per_epoch);
    ddp_start_epoch(&r->data, epoch, run->batch_in_epoch);  // a new shuffle every epoch, the same on every rank
    const Batch *b;
    double wait;
    while ((b = loader_next(r->data.train_loader, &wait)) != NULL) {  // a "data wait" span on the timeline
        r->opt.lr = lr_at(&r->sched, (int)run->step);  // the schedule sets this step's rate
        double t = trace_begin("step");
        Metrics batch = r->hooks.step ? r->hooks.step(r->hooks.ctx, r, b)
                                      : ddp_step(&r->ddp, b, &r->opt, r->o->label_smoothing);
        trace_endf(t, TRACE_COMPUTE, "step %lld", run->step);
        trainlog_step(&r->log, b->index, &batch, wait);  // no communication per step: rank 0's own numbers
        run->batch_in_epoch = b->index + 1;  // the step is complete (all-reduce and update): the position after it
        run->step++;
        if (r->hooks.after_step && r->hooks.after_step(r->hooks.ctx, r, b, &batch)) {
            trainlog_epoch_cut(&r->log);  // the final line reports the steps of this cut epoch
            return false;
        }
    }

    // The replicas must still be equal. Comparing hashes costs one tiny all-gather and catches a missed
    // or mis-scaled all-reduce at once, with the hashes of every rank, instead of a slow drift.
    char what[64];
    snprintf(what, sizeof what, "parameters after epoch %d", epoch + 1);
    if (r->hooks.check_replicas) r->hooks.check_replicas(r->hooks.ctx, r, what);
    else pg_check_identical(r->replicas, m->params, m->n_params, what);

    Metrics train = ddp_global_metrics(r->pg, r->log.local);
    train.loss_sum += run->carry.loss_sum;  // the part of the epoch trained before this process started (04)
    train.correct += run->carry.correct;
    train.count += run->carry.count;
    double t = trace_begin("evaluate");
    Metrics test = r->hooks.evaluate ? r->hooks.evaluate(r->hooks.ctx, r) : ddp_evaluate(r->pg, m, r->data.test_loader);
    trace_end(t, TRACE_EVAL, "evaluate");
    trainlog_epoch_end(&r->log, &train, &test, lr_at(&r->sched, (epoch + 1) * r->steps_per_epoch - 1));
    if (r->is_main) printf("  (evaluated %ld test images over %d ranks)\n", test.count, pg_world(r->pg));
    *run = (RunState){.epoch = epoch + 1, .step = run->step, .images = run->images + train.count,
                      .last_loss = r->log.last_loss, .test_acc = r->log.test_acc};
    return !(r->hooks.after_epoch && r->hooks.after_epoch(r->hooks.ctx, r));
}

// Trains from r->run to the last epoch. Returns false when a hook stopped it.
bool ddp_run_epochs(DdpRun *r) {
    r->log.last_loss = r->run.last_loss;  // the final line is right even when nothing is left to train
    r->log.test_acc = r->run.test_acc;
    while (r->run.epoch < r->o->epochs)
        if (!ddp_run_epoch(r)) return false;
    return true;
}

// Exposed communication (rank 0's wait for the gradient all-reduce after backward), then the final line with
// `extra` added to it.
void ddp_run_report(DdpRun *r, const char *extra) {
    const Ddp *d = &r->ddp;
    if (r->is_main && d->compute_seconds + d->comm_seconds > 0)
        printf("ddp: rank 0 computed for %.1f s and waited %.1f s (%.0f%%) for the gradient all-reduce; with buckets,\n"
               "     the part that overlapped backward is hidden inside the computing time\n",
               d->compute_seconds, d->comm_seconds, 100.0 * d->comm_seconds / (d->compute_seconds + d->comm_seconds));
    char line[256];
    snprintf(line, sizeof line, "ranks=%d backend=%s%s%s", pg_world(r->pg), pg_backend_name(pg_backend(r->pg)),
             extra ? " " : "", extra ? extra : "");
    trainlog_final(&r->log, line);
}

// Frees what ddp_run_open made but the model, which it returns (the caller frees it).
Model *ddp_run_close(DdpRun *r) {
    Model *m = r->ddp.model;
    m->on_grads_ready = NULL;
    buckets_free(r->ddp.buckets);
    train_data_close(&r->data);
    pg_trace_close(r->pg, r->o->trace);  // rank 0 merges every rank's timeline into --trace FILE
    return m;
}

// What every rank does once the process group is up: open, every epoch, the report. Returns the model (the
// caller frees it). Lesson 07 trains through it on a process group started without mpirun.
Model *ddp_train(ProcessGroup *pg, const TrainOptions *o) {
    DdpRun r;
    ddp_run_open(&r, pg, o, NULL);
    ddp_run_epochs(&r);
    ddp_run_report(&r, NULL);
    return ddp_run_close(&r);
}

// ---------------------------------------------------------------- main

#ifdef AUTOGRADER  // the autograder runs the whole program too, under this name (tests/lesson03/program_output.c)
int ddp_program_main(int argc, char **argv);
#define main ddp_program_main
#endif

int main(int argc, char **argv) {
    TrainOptions o;
    cli_parse(&o, argc, argv, CLI_DIST);  // lesson 01's options plus --backend, --bucket-mb, --timeout
    cli_apply_dataset_defaults(&o);
    Device dev;
    device_parse(o.device, &dev, true);  // quiet: rank 0 names the device in the process group's line

    ProcessGroup *pg = ddp_setup(&argc, &argv, &o, dev);
    CHECK(pg != NULL, "TODO 2: ddp_setup must return the process group made by pg_init (kit/dist.h)");
    int rank = pg_rank(pg);
    if (dev == DEVICE_CUDA)  // pg_init already bound the GPU by this rule: it must, before NCCL starts
        printf("rank %d: local rank %d of %d on this node -> GPU %d\n", rank, pg_local_rank(pg),
               pg_local_world(pg), ddp_gpu_for_rank(rank, pg_local_rank(pg), device_gpu_count()));

    model_free(ddp_train(pg, &o));
    pg_finalize(pg);
    return 0;
}
