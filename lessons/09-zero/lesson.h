// lesson.h: sharded training (ZeRO stages 1-3, PyTorch's FSDP) and recomputation, the structures and functions of
// lesson 09, shared by zero.c, zero_ckpt.c, train.c and the autograder.
//
// Lesson 03 keeps a full copy of everything on every rank. Here the model is cut into U contiguous UNITS (FSDP's
// wrapping unit: kit stage models, model_create_stage) and each unit's flat state is split into `world` equal
// SHARDS (padded: FSDP's FlatParameter does the same). Rank r owns shard r of every unit. A step runs the units in
// order (forward), then backwards from the last, then updates:
//
//   stage 0  every rank: full params, grads, momentum; all-reduce (avg) each unit's grads; full update (DDP)
//   stage 1  momentum sharded: all-reduce grads, update THIS rank's shard, all-gather the params      (TODO 2)
//   stage 2  + grads sharded: reduce-scatter (avg) each unit's grads into its shard, free the full   (TODO 3)
//            (overlapped: unit u's reduce-scatter travels during unit u-1's backward)
//   stage 3  + params sharded: a unit's full params exist only around its forward and its backward  (TODO 4)
//   --recompute: a unit keeps only its output after forward; backward runs its forward again        (TODO 5)
//
// The two collectives that all-reduce is made of, for lengths that do not divide by the world: TODO 1.
#ifndef LESSON09_H
#define LESSON09_H

#include <stdbool.h>
#include <stddef.h>

#include "solutions/03-ddp/lesson.h"
#include "kit/data.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------- shards of a flat buffer (TODO 1)

// A flat buffer of n floats split over `world` ranks: every rank's shard has `shard` floats, padded = world * shard
// >= n; rank r owns floats [r * shard, (r + 1) * shard) of the padded buffer (the end of the last shards is padding).
typedef struct {
    size_t n, shard, padded;
} ShardLayout;

// TODO 1a
ShardLayout shard_layout(size_t n, int world);
// TODO 1b: full (n) on every rank -> this rank's shard (shard) of the AVERAGE over the ranks, in two halves: the
// start returns the collective in flight (NULL when n is 0), the finish waits for it and divides. scratch: (padded)
// floats on the device, or NULL when n == padded; full (or scratch) must stay unchanged until the finish.
PgWork *shard_reduce_scatter_start(ProcessGroup *pg, const ShardLayout *l, const float *full, float *shard,
                                   float *scratch);
void shard_reduce_scatter_finish(ProcessGroup *pg, const ShardLayout *l, PgWork *w, float *shard);
// Given: start + finish.
void shard_reduce_scatter_avg(ProcessGroup *pg, const ShardLayout *l, const float *full, float *shard, float *scratch);
// TODO 1c: every rank's shard (shard) -> full (n) on every rank, the padding dropped. scratch: as in 1b.
void shard_allgather(ProcessGroup *pg, const ShardLayout *l, const float *shard, float *full, float *scratch);
// The floats of this rank's shard that are real (not padding): shard, fewer on the last ranks, maybe 0.
size_t shard_valid(const ShardLayout *l, int rank);
// Given: x (n floats on device d) /= world, with the rounding of the kit's all-reduce average (pg_allreduce_avg):
// a division, or the multiply by 1/world where that is exact (a power-of-two world).
void shard_divide(Device d, float *x, size_t n, int world);

// ---------------------------------------------------------------- sharded training

typedef enum { ZERO_DDP = 0, ZERO_OPTIM = 1, ZERO_GRADS = 2, ZERO_PARAMS = 3 } ZeroStage;

#define ZERO_MAX_UNITS 32

typedef struct {
    ProcessGroup *pg;
    ZeroStage stage;
    bool recompute;
    int n_units;
    Model *units[ZERO_MAX_UNITS];  // unit u: layers [first[u], first[u+1]) of the model (model_create_stage)
    int first[ZERO_MAX_UNITS + 1];
    ShardLayout layout[ZERO_MAX_UNITS];      // of the unit's n_params
    float *param_shard[ZERO_MAX_UNITS];      // (shard) stage 3: the only copy of the params between windows
    float *grad_shard[ZERO_MAX_UNITS];       // (shard) stages 2-3: this rank's shard of the averaged gradient
    float *velocity_shard[ZERO_MAX_UNITS];   // (shard) stages 1-3: this rank's momentum
    PgWork *grad_work[ZERO_MAX_UNITS];       // stages 2-3: unit u's reduce-scatter in flight (TODO 3), or NULL
    bool overlap;                            // stages 2-3: unit u's reduce-scatter runs during unit u-1's backward
                                             // (false: waited for at once; KIT_OVERLAP=0 in the environment)

    // Given: what the step needs around the units, on the device.
    Device device;
    int rank, world, max_batch, classes;
    float *boundary[ZERO_MAX_UNITS];  // (max_batch, unit u's output) --recompute: the only activation a unit keeps
    const float *input_of[ZERO_MAX_UNITS];  // this step's input of unit u (the batch, or unit u-1's output)
    float *input;                     // (max_batch, image) the batch, when the loader has not staged it
    float *dlogits;                   // (max_batch, classes) the loss gradient
    float *loss;                      // (max_batch)
    int *labels, *pred;               // (max_batch)
    float *host_loss;                 // (max_batch) in host memory
    int *host_pred;                   // (max_batch) in host memory
    float *scratch;                   // (largest padded) communication scratch (TODO 1b, 1c); with the overlap: the even units'
    float *scratch_odd;               // (largest odd unit's padded) with the overlap: the odd units' scratch, or NULL
    float *shard_work;                // (largest shard) stages 1-2: this rank's slice of a unit's params
    float *bn_saved;                  // (largest n_buffers) --recompute: BN statistics kept across a recompute
    double compute_seconds, comm_seconds;  // since zero_create
    double bytes_sent;                // by this rank, all collectives since zero_create (ring algorithms' count)
    long steps;
} Zero;

// Makes the units (n_units <= 0: one per layer with parameters, with the parameter-free layers after it), their
// shards and buffers, and releases what the stage does not keep. The same on every rank (same seed).
Zero *zero_create(ProcessGroup *pg, const ModelConfig *cfg, Device d, int max_batch, uint64_t seed, ZeroStage stage,
                  int n_units, bool recompute);
// One step on this rank's batch b (TODO 2-5): returns this rank's metrics of b, as ddp_step does.
Metrics zero_step(Zero *z, const Batch *b, const SgdConfig *opt, float label_smoothing);
// The test split: every rank its shard, summed over the ranks (lesson 03's ddp_global_metrics).
Metrics zero_evaluate(Zero *z, Loader *test_loader);
// Every unit's params, BN buffers and (when full has them) momentum into one whole model: checkpoints (lesson 04)
// and evaluation (lesson 06). Collective: every rank calls it.
void zero_gather_model(Zero *z, Model *full);
void zero_free(Zero *z);

// Given helpers (zero.c).
// The cut points of the default units (n_units <= 0) or of n_units balanced by parameter count into first[]
// (n + 1 entries); returns the number of units. Stops with an error when n_units cannot be made.
int zero_plan_units(const ModelConfig *cfg, int n_units, int *first);
// SGD on this rank's shard of unit u: param, grad and velocity are (shard) arrays of the shard's floats; weight
// decay where the unit's views say so (the kit's sgd_update: the same arithmetic as optim_step).
void zero_sgd_shard(Zero *z, int u, float *param, const float *grad, float *velocity, const SgdConfig *opt);
// The memory table of this rank by part: live and peak bytes, and the ZeRO accounting beside it.
void zero_print_memory(const Zero *z, FILE *out);

#ifdef __cplusplus
}
#endif

#endif // LESSON09_H
