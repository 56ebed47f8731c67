// lesson.h: model parallelism and GPipe, the structures and functions of lesson 08, shared by pipe.c, train.c
// and the autograder.
//
// One process, the model cut into P contiguous STAGES. Stage s owns layers [first, last) and only their
// parameters, gradients, momentum and BN statistics, and keeps the activations of its own layers. A step:
//
//   split     the batch of B images -> M micro-batches (sizes differ by at most 1)             (given)
//   forward   micro-batch k through stage 0, hand its output across the cut to stage 1, ...    (TODO 2)
//   loss      on the last stage, scaled by 1/B (so the M micro-batches add up to the batch's mean)
//   backward  micro-batch k from the last stage down, the input gradient handed back across   (TODO 2)
//             each cut; parameter gradients ACCUMULATE over the micro-batches
//   update    one SGD step per stage, on its own parameters                                   (TODO 3)
//
// Where to cut: TODO 1 (pipe_layer_costs, pipe_balance).
#ifndef LESSON08_H
#define LESSON08_H

#include <stdbool.h>
#include <stddef.h>

#include "kit/data.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"
#include "schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PIPE_MAX_STAGES 8        // --stages accepts 1..8
#define PIPE_MAX_MICRO 64        // --micro-batches accepts 1..64

typedef enum { BALANCE_PARAMS, BALANCE_TIME } BalanceRule;

// One stage: a contiguous run of the layer table with everything those layers own. Pointers are on `device`.
// The kit runs its layers: `owner` is their model (model_create_stage), and each micro-batch between its forward
// and its backward is kept in a view of it (model_create_view: the owner's weights, activations of its own).
typedef struct {
    int first, last;                 // its layers: [first, last) of the table
    Device device;
    size_t param_offset, n_params;   // its slice of the whole model's flat parameter layout
    size_t buffer_offset, n_buffers; // its slice of the BN running statistics
    float *params, *grads, *velocity, *buffers;  // (n_params) x 3, (n_buffers): the owner's
    size_t in_floats, out_floats;    // floats per sample of its input (stage 0: an image) and of its output
    float *input;                    // (max_batch, in_floats): what came across the cut (stage 0: the images)
    float *dinput;                   // (max_batch, in_floats): gradient of the input, sent back (NULL: stage 0)
    float *out, *dout;               // (max_batch, out_floats): its output, sent on, and that output's gradient
    Model *owner;                    // its layers, parameters, gradients, momentum, BN buffers
    int micro_rows;                  // images per view: ceil(max_batch / micro_batches)
    Model *views[PIPE_MAX_MICRO];    // the activations of the micro-batches in flight, made as needed
    int holds[PIPE_MAX_MICRO];       // the micro-batch each view keeps until its backward (-1: free)
    int n_views;                     // the most micro-batches this stage has held at once
    int *labels;                     // last stage: (max_batch) the batch's labels
    float *loss;                     // last stage: (max_batch) per-sample loss
    int *pred;                       // last stage: (max_batch) argmax of the logits
    double seconds;                  // this stage's forward + backward, summed over the steps
} Stage;

typedef struct {
    const Model *table;              // the layer table and the initial weights (batch 1, never trained)
    int n_stages, micro_batches, max_batch;
    Stage stages[PIPE_MAX_STAGES];
    int *host_labels;                // (max_batch) the batch's labels, for the correct count
    float *host_loss;                // (max_batch) per-sample losses copied back
    int *host_pred;                  // (max_batch) predictions copied back
    long steps;
} Pipe;

// Given: may the model be cut before layer `cut` (0 < cut < n_layers)? Only where ONE activation crosses: no
// layer at or after the cut reads an activation from before it other than layer cut-1's output (a residual's
// skip connection cannot straddle a cut).
bool pipe_cut_ok(const Model *m, int cut);

// TODO 1a: the cost of every layer (n_layers values) by `rule`: PARAMS: its parameter count; TIME: its measured
// forward + backward seconds, `seconds` (from pipe_measure_layers; NULL for PARAMS).
void pipe_layer_costs(const Model *m, BalanceRule rule, const double *seconds, double *cost);

// TODO 1b: cuts the layers into `stages` contiguous stages: first[0] = 0 < first[1] < ... < first[stages] =
// n_layers, stage s = layers [first[s], first[s+1]), cuts only where pipe_cut_ok, every stage non-empty (the core),
// and (the stretch goal) the largest stage cost (sum of cost over its layers) as small as any such split can make
// it. False when no split into `stages` exists (more stages than cut points allow).
bool pipe_balance(const Model *m, const double *cost, int stages, int *first);

// Given: the stages of `first` (as pipe_balance fills it) on device d, their weights copied from table (which
// must outlive the pipe), for batches of up to max_batch split into up to PIPE_MAX_MICRO micro-batches.
Pipe *pipe_create(const Model *table, Device d, const int *first, int stages, int micro_batches, int max_batch);
// Given: the same with stage s on devices[s] (one process, a stage per device: the cuts join two devices).
Pipe *pipe_create_on(const Model *table, const Device *devices, const int *first, int stages, int micro_batches,
                     int max_batch);
void pipe_free(Pipe *p);

// Given: forward of samples [off, off + n) through stage s (its input must already hold them), micro-batch
// index k (train: a view keeps its activations until stage_backward of k; batch statistics), or, train false,
// the whole range with the running statistics (evaluation; k unused).
void stage_forward(Stage *st, const Model *table, int off, int n, int k, bool train);
// Given: backward of samples [off, off + n) of micro-batch k through stage s: its output gradient must already
// hold them (the next stage's input gradient, or the loss's). Parameter gradients ACCUMULATE; the input gradient
// lands in st->dinput at the same samples, and k's view is free again.
void stage_backward(Stage *st, const Model *table, int off, int n, int k);
// Given: stage st's output gradient slot (the gradient of its last layer's output), for writing into.
float *stage_dout(Stage *st);
// Given: stage st's output (its last layer's activation).
float *stage_out(Stage *st);
// Given: bytes of the activations stage st holds: its views, one per micro-batch it has had in flight at once.
size_t stage_held_bytes(const Stage *st);
// Given: the loss of samples [off, off + n) on the last stage (labels already there): adds their loss sum and
// correct count to *r and writes scale * dloss/dlogits into the last stage's output gradient.
void pipe_loss(Pipe *p, int off, int n, float smoothing, float scale, Metrics *r);
// Given: copies n floats from src (on device `from`) to dst (on device `to`): a cut can join two devices.
void pipe_copy(Device to, float *dst, Device from, const float *src, size_t n);
// Given: puts the batch's images in stage 0's input and its labels on the last stage.
void pipe_load_batch(Pipe *p, const Batch *b);
// Given: one SGD step of stage st on its own parameters (the whole model's views that fall in its slice).
void stage_optim_step(Stage *st, const Model *table, const SgdConfig *opt);
// Given: zeroes every stage's parameter gradients and frees its views: the start of a step.
void pipe_zero_grad(Pipe *p);
// Given: micro-batch k of M over a batch of n: its first sample and its size (sizes differ by at most 1).
void pipe_micro_range(int n, int M, int k, int *off, int *size);
// Given: forward + backward seconds of `table`'s architecture per layer, `reps` steps on a synthetic batch of
// `batch`: what BALANCE_TIME cuts by. Timed per run of layers between two allowed cuts, given to its first layer
// (the others 0), so any stage's sum is its time.
void pipe_measure_layers(const Model *table, Device d, int batch, int reps, double *seconds);
// Given: the test split in eval mode through the stages (BN running statistics), whole batches, no micro-batches.
Metrics pipe_evaluate(Pipe *p, Loader *L);
// Given: every stage's parameters and BN buffers copied into m (the whole model's layout), for comparing.
void pipe_gather(const Pipe *p, Model *m);

// TODO 2: the hand-offs across the cut after stage s (s < n_stages - 1) for samples [off, off + n):
// forward: stage s's output -> stage s+1's input; backward: stage s+1's input gradient -> stage s's output
// gradient. The two stages may be on different devices.
void pipe_send_forward(Pipe *p, int s, int off, int n);
void pipe_send_backward(Pipe *p, int s, int off, int n);

// TODO 3: one GPipe step over the batch b: its M micro-batches forward through every stage (all of them), the
// loss on the last stage scaled for the mean over the WHOLE batch, backward (all of them), then one SGD step per
// stage with opt->lr. Returns the batch's loss sum, correct and count (before the update). M = 1 is naive
// model parallelism.
Metrics pipe_step(Pipe *p, const Batch *b, const SgdConfig *opt, float label_smoothing);

// ================================================================ across processes (pipe_dist.c, README 12-14)
//
// With more than one rank (mpirun), rank r holds ONE stage: its parameters, gradients, momentum and activations
// only. The world of P x R ranks is a grid: P stages (the pipe of one replica) times R replicas (data parallel,
// as lesson 03). Activations go forward and their gradients come back by point-to-point messages inside the
// replica's pipe; the gradients of a stage are averaged over the R ranks that hold that same stage, and only
// there. Each rank runs its stage's ops of the schedule (schedule.h) in order.

typedef struct {
    int stages, replicas;  // P x R = the world
    int stage, replica;    // this rank's place in the grid
} PipeGrid;

// A rank's stage alone, and where it sits in the grid. Pointers are on the stage's device.
typedef struct {
    PipeGrid grid;
    ProcessGroup *world;       // every rank
    ProcessGroup *same_stage;  // the R ranks holding this rank's stage, one per replica (ranked by replica)
    ProcessGroup *pipe;        // the P ranks of this rank's replica, ranked by stage: rank s of it holds stage s
    Pipe *local;               // a Pipe of ONE stage (local->stages[0]): this rank's stage of the split
    const Model *table;
    int micro_batches;
    ScheduleKind schedule;
    PgSend *sends[2 * PIPE_MAX_MICRO];  // sends started this step, waited for at its end
    char send_what[2 * PIPE_MAX_MICRO][96];
    int n_sends;
    double wait_s, step_s;     // summed over the steps: waiting in pg_recv / pg_send_wait, and the whole step
    long steps;
} DistPipe;

// This rank's ops for one step: the schedule of its stage for M = min(micro_batches, batch) micro-batches.
typedef struct {
    int micro;                        // M
    int n_ops;                        // 2 M
    PipeOp ops[2 * PIPE_MAX_MICRO];
    int peak_inflight;                // most micro-batches forward-done and not yet backward, at once
} PipePlan;

// TODO 5a: the place of `rank` in a world of `world` ranks cut into `stages` stages, in the order you chose
// (README section 14): pipe inside (rank = replica * stages + stage: one replica's stages on consecutive ranks)
// or data inside (rank = stage * replicas + replica: one stage's copies on consecutive ranks). False when world
// is not a multiple of stages.
bool pipe_grid(int rank, int world, int stages, PipeGrid *g);
// TODO 5b: the two sub-groups of the grid (pg_split, collective over world): *same_stage, the ranks holding
// g's stage (ranked by replica); *pipe, the ranks of g's replica (ranked by stage).
void pipe_dist_groups(ProcessGroup *world, const PipeGrid *g, ProcessGroup **same_stage, ProcessGroup **pipe);
// TODO 5c: the data of this rank: its REPLICA's shard (all ranks of a pipe read the same images: stage 0 feeds
// them in, the last stage takes their labels), in local batches of the global --batch-size / replicas.
void pipe_dist_data_open(TrainData *td, const TrainOptions *o, const PipeGrid *g);

// TODO 6a: the message tag of a micro-batch's activation (backward false) or gradient (true): a different
// number for each (direction, micro-batch) of a step, in [0, 32767] (the least MPI_TAG_UB any MPI allows).
int pipe_tag(bool backward, int micro);
// TODO 6b: one op of this rank's stage, for a batch of `batch` images in M micro-batches: forward: receive the
// micro-batch's activation from the stage before (unless first), forward, send the output to the stage after
// (or, on the last stage, the loss with scale 1/batch, `batch` this replica's images, into *r); backward: receive the output gradient from the
// stage after (unless last: the loss wrote it), backward, send the input gradient to the stage before (unless
// first). Receives and sends through pipe_dist_recv / pipe_dist_send, each with its tag and a `what` that
// names the micro-batch and the two stages.
void pipe_dist_run_op(DistPipe *dp, PipeOp op, int batch, int M, float smoothing, Metrics *r);

// Given: this stage's gradient averaged over the replicas that hold it (nothing to do with one replica).
void pipe_dist_average_grads(DistPipe *dp);
// TODO 7b: one step: the plan's ops in order (pipe_dist_run_op), the sends waited for, the gradients averaged,
// one SGD step of this rank's stage. Returns the metrics of this rank's micro-batches: the replica's batch on
// the last stage, zeros elsewhere.
Metrics pipe_dist_step(DistPipe *dp, const Batch *b, const PipePlan *plan, const SgdConfig *opt, float smoothing);

// Given: this rank's place in the grid of `stages` and its two groups (TODO 5a, 5b; stops the job when the world is
// not pipes of `stages`), without its stage yet. Collective over world.
DistPipe *pipe_dist_join(ProcessGroup *world, int stages, ScheduleKind schedule);
// Given: this rank's stage of the split `first`, on device d, for batches of up to max_batch in micro_batches.
void pipe_dist_make_stage(DistPipe *dp, const Model *table, Device d, const int *first, int micro_batches,
                          int max_batch);
void pipe_dist_free(DistPipe *dp);
// Given: the plan of this rank's stage for a batch of n images.
void pipe_dist_plan(const DistPipe *dp, int n, PipePlan *plan);
// Given: puts the batch in: the images into stage 0's input, the labels on the last stage; zeroes the gradients.
void pipe_dist_load(DistPipe *dp, const Batch *b);
// Given: pg_recv from stage `peer` of this pipe (the time counted as waiting).
void pipe_dist_recv(DistPipe *dp, float *buf, size_t n, int peer, int tag, const char *what);
// Given: pg_send_start to stage `peer`; the send is waited for by pipe_dist_wait_sends (buf must stay unchanged).
void pipe_dist_send(DistPipe *dp, const float *buf, size_t n, int peer, int tag, const char *what);
void pipe_dist_wait_sends(DistPipe *dp);
// Given: floats per sample of stage st's output (what it sends forward).
size_t stage_out_floats(const Stage *st, const Model *table);
// Given: the test split through the pipe in eval mode (forward only); the metrics summed over the replicas, on
// every rank.
Metrics pipe_dist_evaluate(DistPipe *dp, Loader *L);
// Given: a Pipe holding only stage s of the split `first` into `stages` (for one rank).
Pipe *pipe_create_stage(const Model *table, Device d, const int *first, int stages, int s, int micro_batches,
                        int max_batch);


// ================================================================ checkpoints (pipe_ckpt.c, given: README "Saving a pipeline")
//
// A pipeline run saves ONE checkpoint of lesson 04 (kit/ckpt.h's file, lesson 04's atomic write and run state)
// of the WHOLE model: the stages of replica 0 send their slices of the parameters, momentum and BN statistics to
// the world's rank 0, which writes it; lesson 06 evaluates it on one device, and --resume puts every slice back
// in its stage (any replica). With several replicas and BN, the saved statistics are replica 0's (each replica
// keeps its own, as with plain BN in lesson 03's DDP before the broadcast): use a BN-free model to compare.

// Where a pipeline run stands and where it saves (--checkpoint FILE or --checkpoint-dir DIR, --resume).
typedef struct {
    ProcessGroup *world;
    ProcessGroup *pipe;      // the ranks of this replica's pipe, by stage (NULL: one process, every stage here)
    int stage, replica;      // this rank's first stage, and its replica
    Pipe *p;                 // the stages of this rank: all of them (one process) or one (a rank of the grid)
    const TrainOptions *o;
    const Model *table;      // the whole model's layer table and config
    LrSchedule sched;
    int steps_per_epoch;
    int epoch;               // the next epoch to train
    long long step, images;  // optimizer steps and images (all replicas) trained since the start
    double last_loss, test_acc;  // of the last finished epoch
    char last_saved[1024];
} PipeCkpt;

// Given: checks the checkpoint options on every rank of the world (saves at the end of every epoch; --resume
// FILE|auto), then --resume: every stage takes its slice of the file, its position and log's last metrics from it.
// Exits on every rank (after an "error:" line) when the options or the checkpoint do not fit this run.
void pipe_ckpt_begin(PipeCkpt *c, ProcessGroup *world, ProcessGroup *pipe, int stage, int replica, Pipe *p,
                     const TrainOptions *o, const Model *table, const LrSchedule *sched, int steps_per_epoch,
                     TrainLog *log);
// Given: after an epoch's evaluation (images: trained since the start, over the world; log: after
// trainlog_epoch_end): the run moves on to the next epoch and, with --checkpoint or --checkpoint-dir, is saved.
// Collective over the world.
void pipe_ckpt_epoch_end(PipeCkpt *c, long long images, const TrainLog *log);
// Given: the world's rank 0 gets every stage's parameters, momentum and BN statistics in `whole` (the whole
// model's layout, on the CPU); collective over the world (replica 0's stages send; whole is used on rank 0 only).
void pipe_ckpt_gather(const PipeCkpt *c, Model *whole);
// Given: the inverse: this rank's stages take their slices of `whole` (any rank, any replica).
void pipe_ckpt_scatter(const PipeCkpt *c, const Model *whole);

#ifdef __cplusplus
}
#endif

#endif // LESSON08_H
