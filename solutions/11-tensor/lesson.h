// lesson.h: tensor parallelism (Megatron-LM's column and row split) on the kit's ResNet, and the tensor x data
// grid: the structures and functions of lesson 11, shared by tp.c, train.c and the autograder.
//
// Lesson 08 cut the model BETWEEN layers; here each residual block is cut INSIDE, over the T ranks of a tensor
// group. A block is conv1 -> BN1 -> ReLU -> conv2 -> BN2 -> ReLU, plus its input (the residual add):
//
//   x ──f──> conv1 (this rank's c/T output channels) -> BN1, ReLU (those channels) -> conv2 (from those channels
//            only: a partial sum of every output channel) ──g──> BN2 -> ReLU -> + x
//
//   f: identity forward, all-reduce (sum) of the gradient backward     (TODO 1c)
//   g: all-reduce (sum) forward, identity backward                     (TODO 1c)
//
// conv1 is split by output channels (Megatron's column-parallel), conv2 by input channels (row-parallel): one
// all-reduce per block forward, one backward. Everything between the blocks (the stem, the pools, the
// classifier) is REPLICATED: every rank of a tensor group computes it on the same data, as Megatron replicates
// its embeddings and layer norms. With a data-parallel dimension too (the grid, TODO 4) each slice and each
// replicated layer is averaged over the D ranks that hold the same thing.
#ifndef LESSON11_H
#define LESSON11_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "solutions/03-ddp/lesson.h"
#include "kit/data.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "kit/optim.h"
#include "kit/train.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---------------------------------------------------------------- TODO 1: the split of a layer

// A conv's filters w (K, C, R, R), on the host, cut over T ranks; rank `rank`'s slice into shard.
// TODO 1a, column-parallel (by OUTPUT channel): shard (K/T, C, R, R), the filters of output channels
//   [rank K/T, (rank + 1) K/T).
void tp_split_out(const float *w, int K, int C, int R, int rank, int T, float *shard);
// TODO 1b, row-parallel (by INPUT channel): shard (K, C/T, R, R), every filter's input channels
//   [rank C/T, (rank + 1) C/T).
void tp_split_in(const float *w, int K, int C, int R, int rank, int T, float *shard);
// Given: the inverse of tp_split_in: rank `rank`'s shard put back into its place in w (K, C, R, R).
void tp_unsplit_in(const float *shard, int K, int C, int R, int rank, int T, float *w);

// TODO 1c: Megatron's two conjugate operators, in place on buf (n floats on the tensor group's device).
//   f (before a column-parallel layer): forward the identity; backward the SUM of the gradient over the group.
//   g (after a row-parallel layer): forward the SUM over the group; backward the identity.
// (f's forward changes nothing, so it takes the block's input as it is: const.)
void tp_f_forward(ProcessGroup *tensor, const float *buf, size_t n);
void tp_f_backward(ProcessGroup *tensor, float *buf, size_t n);
void tp_g_forward(ProcessGroup *tensor, float *buf, size_t n);
void tp_g_backward(ProcessGroup *tensor, float *buf, size_t n);

// ---------------------------------------------------------------- TODO 2: a residual block split over T ranks

// The layers of a block in the kit's table: conv, BN, ReLU, conv, BN, ReLU, add (kit/model.c, residual()).
#define TP_BLOCK_LAYERS 7

typedef struct {
    int layer;             // the whole model's index of conv1: the block is layers [layer, layer + TP_BLOCK_LAYERS)
    int c, h, w;           // the block's input and output, per sample (a residual block keeps its shape)
    int k;                 // c / T: this rank's channels between the two convs
    int tp, tp_rank;       // the tensor group's size and this rank's place in it
    Device device;
    int max_batch;

    // This rank's parameters in one flat buffer; grads and velocity in the same layout. The views:
    //   w1 (k, c, 3, 3)  conv1's filters of this rank's k output channels      column-parallel: a slice
    //   g1, b1 (k)       BN1's scale and shift of those channels                 a slice
    //   w2 (c, k, 3, 3)  conv2's filters, from this rank's k input channels     row-parallel: a slice
    //   g2, b2 (c)       BN2's scale and shift, every channel                    replicated
    size_t n_params;
    float *params, *grads, *velocity;  // (n_params)
    float *w1, *g1, *b1, *w2, *g2, *b2;        // views into params
    float *dw1, *dg1, *db1, *dw2, *dg2, *db2;  // the same views into grads
    float *running;  // (2 k + 2 c) BN1's running mean and variance (k each), then BN2's (c each)
    float *saved;    // (2 k + 2 c) this step's batch mean and invstd, the same order

    // The activations of up to max_batch samples, and their gradients.
    float *a1;   // (N, k, h, w) conv1's output
    float *a2;   // (N, k, h, w) BN1 + ReLU
    float *z;    // (N, c, h, w) conv2's output: this rank's partial sum, then (g) the whole sum
    float *a3;   // (N, c, h, w) BN2 + ReLU
    float *out;  // (N, c, h, w) x + a3: the block's output
    float *dz;   // (N, c, h, w) the gradient of z
    float *da;   // (N, k, h, w) the gradient of a2, then (in place) of a1
    float *dx;   // (N, c, h, w) the gradient of the block's input x
    float *work; // scratch of the convs and BNs
    const BatchNormSync *sync;  // the data group's BN statistics (the grid, D > 1), or NULL: this batch's
} TpBlock;

// TODO 2a: the block's forward on x (n, c, h, w) into blk->out: train uses the batch statistics (updating the
// running ones), eval the running statistics. The tensor group: its f and g (TODO 1c).
void tp_block_forward(TpBlock *blk, ProcessGroup *tensor, const float *x, int n, bool train);
// TODO 2b: its backward from dout (n, c, h, w), the gradient of blk->out, the SAME on every rank of the group:
// the parameter gradients ADDED into blk->grads, the input's gradient written to blk->dx (complete: the same on
// every rank of the group). After tp_block_forward(train) on the same x.
void tp_block_backward(TpBlock *blk, ProcessGroup *tensor, const float *x, const float *dout, int n);

// ---------------------------------------------------------------- TODO 3: which layers can be split

// TODO 3: true when layers [i, i + TP_BLOCK_LAYERS) of the table are a residual block that tensor parallelism of
// T ranks can split as above: conv (no bias), BN, ReLU, conv (no bias), BN, ReLU, then an add of the block's input
// (the output of layer i-1, or the model input when i = 0) and of that ReLU, with channels that T divides.
bool tp_is_block(const Model *table, int i, int T);

// ---------------------------------------------------------------- TODO 4: the grid (tensor x data)

typedef struct {
    int tp, dp;            // T x D = the world
    int tp_rank, replica;  // this rank's place: its rank in its tensor group, and which data-parallel replica
} TpGrid;

// TODO 4a: the place of `rank` in a world of `world` ranks, tensor groups of `tp` CONSECUTIVE ranks (README:
// the group that moves the most bytes on the fastest links). False when tp does not divide world.
bool tp_grid(int rank, int world, int tp, TpGrid *g);
// TODO 4b: the two sub-groups (pg_split, collective over world): *tensor, the T ranks of g's replica (ranked by
// tp_rank); *data, the D ranks with g's tp_rank, one per replica (ranked by replica).
void tp_groups(ProcessGroup *world, const TpGrid *g, ProcessGroup **tensor, ProcessGroup **data);
// TODO 4c: this rank's data: its REPLICA's shard (the T ranks of a tensor group read the same images), in local
// batches of the global --batch-size / D.
void tp_data_open(TrainData *td, const TrainOptions *o, const TpGrid *g);

// ---------------------------------------------------------------- the model on one rank

#define TP_MAX_PIECES 16

// The whole model's layers cut into pieces: a block split over the tensor group, or a run of replicated layers
// between blocks (a kit stage, model_create_stage: every rank of the world holds the same one).
typedef struct {
    int first, last;  // the whole model's layers [first, last)
    Model *stage;     // replicated layers, or NULL
    TpBlock *block;   // a split block, or NULL
} TpPiece;

typedef struct {
    TpGrid grid;
    ProcessGroup *world, *tensor, *data;
    ModelConfig cfg;
    Device device;
    int max_batch, classes;
    int n_pieces, n_blocks;
    TpPiece pieces[TP_MAX_PIECES];

    BatchNormLayerOps bn_ops;  // D > 1: BN over the data group's batch (lesson 05), on every BN of the model
    float *input;              // (max_batch, image) the batch, when the loader has not staged it
    int *labels, *pred;        // (max_batch)
    float *loss;               // (max_batch)
    float *dlogits;            // (max_batch, classes)
    float *host_loss;          // (max_batch) in host memory
    int *host_pred;            // (max_batch) in host memory
    double compute_seconds;  // since tp_create: the step but for comm_seconds (f and g run inside the blocks: the
                             // timeline, --trace, shows them apart)
    double comm_seconds;     // the data group's gradient average (TODO 4d)
    long steps;
} Tp;

// Given: this rank's place in the grid of tensor groups of `tp` ranks and its two groups (TODO 4a-b; stops the
// job when the world is not made of such groups), without its pieces yet. Collective over world.
Tp *tp_join(ProcessGroup *world, int tp);
// Given: this rank's pieces of the model made from cfg (seed: the same initial weights as one process's
// model_create), for batches of up to max_batch on d.
void tp_make_pieces(Tp *tp, const ModelConfig *cfg, Device d, int max_batch, uint64_t seed);
// Given: tp_join, then tp_make_pieces. Collective over world.
Tp *tp_create(ProcessGroup *world, int tp, const ModelConfig *cfg, Device d, int max_batch, uint64_t seed);
void tp_free(Tp *tp);

// Given: every block's slices and every replicated stage's parameters whole into `whole` (a model of cfg): the
// slices all-gathered over the tensor group. Collective over world. For evaluation by one process, checkpoints
// and the comparisons of the tests.
void tp_gather_model(Tp *tp, Model *whole);
// Given: the reverse: this rank's pieces set from `whole` (its parameters, BN buffers; momentum zeroed).
void tp_scatter_model(Tp *tp, const Model *whole);

// TODO 4d: the gradients of this rank's pieces (slices AND replicated stages) averaged over the data group
// (nothing to do when D = 1: say why in the README's words).
void tp_average_grads(Tp *tp);

// Given: one step on this rank's batch b (the replica's): forward through the pieces, loss, backward, the data
// group's average (TODO 4d), SGD on every piece. Returns the batch's metrics on tensor rank 0, zeros elsewhere
// (the T ranks of a group compute the same loss: counted once).
Metrics tp_step(Tp *tp, const Batch *b, const SgdConfig *opt, float label_smoothing);
// Given: the test split through the pieces, summed over the world (tensor rank 0 of each replica counts).
Metrics tp_evaluate(Tp *tp, Loader *test_loader);

// ---------------------------------------------------------------- bytes and memory (given)

// What one training step of n images per replica hands to each group's collectives on this rank (pg_traffic's
// count: input bytes and calls), by the arithmetic.
typedef struct {
    uint64_t tensor_bytes, tensor_calls;  // f and g: 2 all-reduces of (n, c, h, w) per block
    uint64_t data_bytes, data_calls;      // D > 1: this rank's gradients, and BN's statistics (lesson 05)
} TpTraffic;
TpTraffic tp_expected_traffic(const Tp *tp, int n);
// This rank's parameters (replicated and sliced), and their share of the whole model's.
size_t tp_local_params(const Tp *tp);
// The memory table of this rank by part (the kit's counters), with the arithmetic beside it.
void tp_print_memory(const Tp *tp, FILE *out);

#ifdef __cplusplus
}
#endif

#endif // LESSON11_H
