// lesson.h: the functions you write in lesson 03, shared by train.c and the autograder.
//
// One process per rank, each with a full replica of the model. The kit supplies the process group
// (kit/dist.h), the forward+backward of one batch and the evaluation loop (kit/train.h, what you wrote in
// lesson 01), the sampler and the loader (kit/data.h). You write what makes N processes train as ONE.
#ifndef LESSON03_H
#define LESSON03_H

#include "kit/buckets.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"

#ifdef __cplusplus
extern "C" {
#endif

// The state of data-parallel training on one rank.
typedef struct {
    ProcessGroup *pg;
    Model *model;            // this rank's replica
    GradBuckets *buckets;    // stretch goal: NULL = one flat all-reduce after backward (--bucket-mb 0)
    double compute_seconds;  // forward + backward (+ the all-reduces that overlap it, when bucketed)
    double comm_seconds;     // waiting for the gradient all-reduce after backward: EXPOSED communication
} Ddp;

// TODO 1: the GPU this rank drives: its LOCAL rank (rank among the processes of its node) modulo the
// GPUs of the node; -1 when the node has no GPU (gpus <= 0).
int ddp_gpu_for_rank(int rank, int local_rank, int gpus);

// TODO 2: the process group: MPI start-up, rank/world, the backend (--backend), the timeout (--timeout).
ProcessGroup *ddp_setup(int *argc, char ***argv, const TrainOptions *o, Device dev);

// TODO 3a: this rank's shard of the data, in batches of (global batch / world). Returns the local batch.
int ddp_data_open(TrainData *td, const TrainOptions *o, const ProcessGroup *pg);
// TODO 3b: starts a training epoch at batch first_batch: a new shuffle, the same on every rank, different every
// epoch.
void ddp_start_epoch(TrainData *td, int epoch, int first_batch);

// TODO 4: makes every replica equal to rank 0's: parameters AND buffers (BN running statistics).
void ddp_broadcast_model(ProcessGroup *pg, Model *m);

// TODO 5: one step: local forward+backward, gradients averaged over the ranks, SGD update with opt->lr.
// Returns this rank's loss/correct/count (before the update). The step of lessons 01 and 02: same arguments,
// with the model replaced by this rank's DDP wrapper.
Metrics ddp_step(Ddp *ddp, const Batch *b, const SgdConfig *opt, float label_smoothing);

// TODO 6: sums of every rank's metrics, the same on every rank.
Metrics ddp_global_metrics(ProcessGroup *pg, Metrics local);
// The test split, every sample counted once over all ranks (uses TODO 6).
Metrics ddp_evaluate(ProcessGroup *pg, Model *m, Loader *test_loader);

// TODO 7 (stretch): gradient buckets of bucket_mb MB whose all-reduce starts during backward (the model
// calls m->on_grads_ready as each layer's gradients are final). NULL when bucket_mb is 0: flat all-reduce.
GradBuckets *ddp_attach_buckets(ProcessGroup *pg, Model *m, double bucket_mb);

// ---------------------------------------------------------------- the training loop (given, train.c)

// Where a training run stands. Lesson 03 trains from zero to the end; lesson 04 saves it and resumes from it.
typedef struct {
    int epoch;           // the epoch in progress, 0-based
    int batch_in_epoch;  // batches of it already trained (the next batch to train)
    long long step;      // optimizer steps done since the start: epoch * steps_per_epoch + batch_in_epoch
    Metrics carry;       // the epoch in progress, summed over ALL ranks, before this process (re)started
    long long images;    // images trained on since the start, all ranks
    double last_loss, test_acc;  // of the last finished epoch
} RunState;

typedef struct DdpRun DdpRun;

// What a later lesson adds to the loop, called on every rank at fixed points, ctx first. Each may be NULL.
typedef struct {
    void *ctx;
    // first of all, before the data: a lesson whose ranks each hold a PART of the model (a pipeline's stage)
    // opens this rank's data into r->data and returns the local batch, and says which ranks hold copies of this
    // rank's part (r->replicas, ranked by replica: the model is broadcast, checked and averaged among them) and
    // which rank prints (r->is_main). NULL: every rank holds a whole replica (r->replicas is the world), reads
    // its own shard (ddp_data_open) and rank 0 prints
    int (*open)(void *ctx, DdpRun *r);
    // makes this rank's model from cfg (NULL: model_create on the process group's device, r->local_batch,
    // --seed): a lesson that trains a model of its own (a pipeline stage, a sharded model) builds it here
    Model *(*make_model)(void *ctx, DdpRun *r, const ModelConfig *cfg);
    // after the model is made, before the broadcast from rank 0 and the gradient buckets: change what it is
    void (*model_built)(void *ctx, ProcessGroup *pg, Model *m);
    // one training step on this rank's batch b with r->opt (NULL: ddp_step); it owns the gradients'
    // communication, so the loop attaches no buckets. Returns this rank's metrics of b, as ddp_step does
    Metrics (*step)(void *ctx, DdpRun *r, const Batch *b);
    // after every complete step (r->run is the position after it): true stops the training there
    bool (*after_step)(void *ctx, DdpRun *r, const Batch *b, const Metrics *batch);
    // after every epoch and its evaluation (r->run: the next epoch): true stops the training there
    bool (*after_epoch)(void *ctx, DdpRun *r);
    // the test split's metrics, summed over every rank (NULL: ddp_evaluate on the model): a lesson whose ranks
    // do not each hold the whole model (a pipeline stage, a shard) evaluates its own way
    Metrics (*evaluate)(void *ctx, DdpRun *r);
    // at the end of every epoch: stops the job if the ranks that must agree do not (NULL: pg_check_identical
    // over the model's parameters on r->replicas); `what` names the moment for the message
    void (*check_replicas)(void *ctx, DdpRun *r, const char *what);
} TrainHooks;

// One rank's training run: what ddp_run_open makes and the loop uses.
struct DdpRun {
    ProcessGroup *pg;
    ProcessGroup *replicas;  // the ranks holding a copy of this rank's model, ranked by replica (DDP: pg)
    const TrainOptions *o;
    bool is_main;            // rank 0: the one that prints
    TrainData data;          // this rank's shard
    Ddp ddp;                 // the replica and its gradient all-reduce
    int local_batch, steps_per_epoch;
    SgdConfig opt;           // opt.lr: set before every step from sched
    LrSchedule sched;        // the run's schedule, built once
    TrainLog log;
    RunState run;            // where the run stands: zero (a fresh run) after ddp_run_open
    TrainHooks hooks;
};

// Data (hooks->open), model (hooks->make_model, hooks->model_built, then the broadcast and the buckets),
// optimizer, schedule; prints the setup.
void ddp_run_open(DdpRun *r, ProcessGroup *pg, const TrainOptions *o, const TrainHooks *hooks);
// One epoch from r->run (then its evaluation); false when a hook stopped it.
bool ddp_run_epoch(DdpRun *r);
// Every epoch from r->run to the last; false when a hook stopped it.
bool ddp_run_epochs(DdpRun *r);
// The communication report and the final line, `extra` (may be NULL) appended to "ranks=N backend=B".
void ddp_run_report(DdpRun *r, const char *extra);
// Frees the run's data and buckets; returns the model (the caller frees it).
Model *ddp_run_close(DdpRun *r);

// The training on a started process group: ddp_run_open, ddp_run_epochs, ddp_run_report. Returns the model
// (the caller frees it). Lesson 07 trains through it.
Model *ddp_train(ProcessGroup *pg, const TrainOptions *o);

#ifdef __cplusplus
}
#endif

#endif // LESSON03_H
