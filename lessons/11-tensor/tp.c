// tp.c: lesson 11, tensor parallelism. What you write is marked TODO (README section numbers in brackets):
//
//   TODO 1  the split of a conv's filters by output channel and by input channel, and the operators f and g  [3]
//   TODO 2  a residual block's forward and backward with its channels split over the tensor group            [4]
//   TODO 3  which layers of the table are such blocks                                                        [5]
//   TODO 4  the tensor x data grid: places, groups, data, and the gradient average of the data group         [6]
//
// Everything else is given: the model as pieces (split blocks, and the replicated stages between them), the step,
// the evaluation, the gather of the slices into one model, and the arithmetic of bytes and memory.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lesson.h"
#include "kit/check.h"
#include "kit/log.h"
#include "kit/ops.h"
#include "kit/trace.h"

#define F sizeof(float)

// ---------------------------------------------------------------- TODO 1: the split of a layer

void tp_split_out(const float *w, int K, int C, int R, int rank, int T, float *shard) {
    // TODO 1a [3.1]: w is K filters one after the other, each C x R x R floats. Which filters are this rank's,
    //   and are they next to each other in memory?
    (void)w, (void)K, (void)C, (void)R, (void)rank, (void)T, (void)shard;
}

void tp_split_in(const float *w, int K, int C, int R, int rank, int T, float *shard) {
    // TODO 1b [3.1]: every one of the K filters keeps a slice of its C input channels (R x R floats each): this
    //   time the slice is not one piece of w.
    (void)w, (void)K, (void)C, (void)R, (void)rank, (void)T, (void)shard;
}

void tp_unsplit_in(const float *shard, int K, int C, int R, int rank, int T, float *w) {
    const size_t rr = (size_t)R * R, c = (size_t)(C / T);
    for (int f = 0; f < K; f++)
        memcpy(w + ((size_t)f * C + (size_t)rank * c) * rr, shard + (size_t)f * c * rr, c * rr * F);
}

// TODO 1c [3.2]: f and g. Each is one line or none; which is which is the whole idea. A sum over the group:
//   pg_allreduce_sum (kit/dist.h), in place.
void tp_f_forward(ProcessGroup *tensor, const float *buf, size_t n) {
    (void)tensor, (void)buf, (void)n;  // identity: every rank already holds the whole input
}

void tp_f_backward(ProcessGroup *tensor, float *buf, size_t n) {
    (void)tensor, (void)buf, (void)n;
}

void tp_g_forward(ProcessGroup *tensor, float *buf, size_t n) {
    (void)tensor, (void)buf, (void)n;
}

void tp_g_backward(ProcessGroup *tensor, float *buf, size_t n) {
    (void)tensor, (void)buf, (void)n;  // identity: the sum's gradient is the same for every term
}

// ---------------------------------------------------------------- TODO 2: a block split over the tensor group

static Conv2dDims conv1_dims(const TpBlock *b, int n) {
    return (Conv2dDims){.n = n, .c = b->c, .h = b->h, .w = b->w, .k = b->k, .r = 3, .stride = 1, .pad = 1};
}
static Conv2dDims conv2_dims(const TpBlock *b, int n) {
    return (Conv2dDims){.n = n, .c = b->k, .h = b->h, .w = b->w, .k = b->c, .r = 3, .stride = 1, .pad = 1};
}
static BatchNormDims bn_dims(const TpBlock *b, int n, int channels) {
    return (BatchNormDims){.n = n, .c = channels, .hw = b->h * b->w, .eps = 1e-5f, .momentum = 0.1f};
}

// Where BN1's (k channels) and BN2's (c channels) running statistics and saved batch statistics are.
static float *bn1_running(const TpBlock *b) { return b->running; }
static float *bn2_running(const TpBlock *b) { return b->running + 2 * b->k; }
static float *bn1_saved(const TpBlock *b) { return b->saved; }
static float *bn2_saved(const TpBlock *b) { return b->saved + 2 * b->k; }

// BN + ReLU over `ch` channels: training (batch statistics, running ones updated) or eval (running ones).
static void bn_relu_forward(const TpBlock *b, const BatchNormDims *s, const float *x, const float *gamma,
                            const float *beta, float *saved, float *running, float *y, bool train) {
    const Device d = b->device;
    if (train) {
        batchnorm_relu_forward_train(d, s, x, gamma, beta, y, saved, saved + s->c, running, running + s->c, b->sync,
                                     b->work);
    } else {
        batchnorm_forward_eval(d, s, x, gamma, beta, running, running + s->c, y);
        relu_forward(d, (size_t)s->n * s->c * s->hw, y, y);
    }
}

void tp_block_forward(TpBlock *blk, ProcessGroup *tensor, const float *x, int n, bool train) {
    const Device d = blk->device;
    const size_t full = (size_t)n * blk->c * blk->h * blk->w;  // floats of x, z, a3, out
    Conv2dDims c1 = conv1_dims(blk, n), c2 = conv2_dims(blk, n);
    BatchNormDims s1 = bn_dims(blk, n, blk->k), s2 = bn_dims(blk, n, blk->c);
    (void)c1, (void)c2, (void)s1, (void)s2, (void)full, (void)d, (void)tensor, (void)x, (void)train;
    // TODO 2a [4.1]: conv1 -> BN1 + ReLU -> conv2 -> BN2 + ReLU -> + x, into blk->out, with f and g where they
    //   belong. Which of these steps see only this rank's k channels, and which every channel? After which step
    //   does a rank hold only a PART of what one process computes? The helpers above (bn_relu_forward,
    //   bn1_saved, ...) and the dims (c1, c2, s1, s2) are ready; conv2 has no bias (BN2 follows it).
    (void)bn_relu_forward, (void)bn1_saved, (void)bn2_saved, (void)bn1_running, (void)bn2_running;
}

void tp_block_backward(TpBlock *blk, ProcessGroup *tensor, const float *x, const float *dout, int n) {
    const Device d = blk->device;
    const size_t full = (size_t)n * blk->c * blk->h * blk->w, part = (size_t)n * blk->k * blk->h * blk->w;
    Conv2dDims c1 = conv1_dims(blk, n), c2 = conv2_dims(blk, n);
    BatchNormDims s1 = bn_dims(blk, n, blk->k), s2 = bn_dims(blk, n, blk->c);
    device_memset_zero(d, blk->dz, full * F);  // the kit's backward ops ADD into their gradients
    device_memset_zero(d, blk->da, part * F);
    device_memset_zero(d, blk->dx, full * F);
    (void)c1, (void)c2, (void)s1, (void)s2, (void)tensor, (void)x, (void)dout;
    // TODO 2b [4.2]: the forward's steps in reverse (batchnorm_relu_backward, conv2d_backward: kit/ops.h), with
    //   the conjugate of each operator. blk->dx must end as the WHOLE input gradient, the same on every rank:
    //   x reached this block's output along two paths. Which of them went through this rank's slice only?
}

// ---------------------------------------------------------------- TODO 3: which layers can be split

// The ReLU-after-BN chain of a block half: a conv without bias, BN, ReLU, each reading the layer before.
static bool conv_bn_relu_at(const Model *table, int i) {
    if (i + 3 > table->n_layers) return false;
    const Layer *l = &table->layers[i];
    return l[0].kind == LAYER_CONV && !l[0].bias && l[1].kind == LAYER_BN && l[1].in == i &&
           l[2].kind == LAYER_RELU && l[2].in == i + 1;
}

bool tp_is_block(const Model *table, int i, int T) {
    // TODO 3 [5]: the table's layers are Layer records (kit/model.h: kind, in, in2, out_c, ksize, stride, bias;
    //   a layer's OUTPUT shape is its c, h, w, so conv1's input channels are layer i-1's c, or table->in_c when
    //   i = 0). conv_bn_relu_at above checks one half. What else must hold for the split of section 4 to compute what
    //   one process computes: where do the two halves read from, what does the add read, what shape must the
    //   convs keep, and what must T divide?
    (void)table, (void)i, (void)T, (void)conv_bn_relu_at;
    return false;
}

// ---------------------------------------------------------------- TODO 4: the grid

bool tp_grid(int rank, int world, int tp, TpGrid *g) {
    // TODO 4a [6.1]: T consecutive ranks form a tensor group.
    (void)rank, (void)world, (void)tp, (void)g;
    return false;
}

void tp_groups(ProcessGroup *world, const TpGrid *g, ProcessGroup **tensor, ProcessGroup **data) {
    // TODO 4b [6.1]: pg_split(world, color, key): the ranks that pass the same color form a group, ranked by key.
    //   Every rank calls it once per group, in the same order.
    (void)world, (void)g;
    *tensor = *data = NULL;
}

void tp_data_open(TrainData *td, const TrainOptions *o, const TpGrid *g) {
    // TODO 4c [6.2]: lesson 03's sharding (train_data_open, kit/train.h), by replica: why not by rank?
    train_data_open(td, o, 0, 1, o->batch_size);
    (void)g;
}

void tp_average_grads(Tp *tp) {
    // TODO 4d [6.3]: every piece's gradient (tp->pieces[p]: a replicated stage's m->grads, or a block's
    //   blk->grads), averaged over the ranks that hold the same tensors. With D = 1, what would an average over
    //   the tensor group do to a slice's gradient, and what to a replicated one?
    (void)tp;
}

// ---------------------------------------------------------------- given: making the pieces

// Block i of the table, this rank's slices, on d.
static TpBlock *block_create(const Model *table, int i, const TpGrid *g, Device d, int max_batch,
                             const BatchNormSync *sync) {
    TpBlock *b = xcalloc(1, sizeof *b);
    const Layer *c1 = &table->layers[i];
    b->layer = i, b->c = c1->out_c, b->h = c1->h, b->w = c1->w, b->k = c1->out_c / g->tp;
    b->tp = g->tp, b->tp_rank = g->tp_rank, b->device = d, b->max_batch = max_batch, b->sync = sync;
    const size_t wsz = (size_t)b->k * b->c * 9;  // w1 and w2 have as many floats
    b->n_params = 2 * wsz + 2 * (size_t)b->k + 2 * (size_t)b->c;
    b->params = device_alloc_as(d, b->n_params * F, MEM_PARAMS);
    b->grads = device_alloc_as(d, b->n_params * F, MEM_GRADS);
    b->velocity = device_alloc_as(d, b->n_params * F, MEM_OPTIM);
    device_memset_zero(d, b->grads, b->n_params * F);
    device_memset_zero(d, b->velocity, b->n_params * F);
    // Layout: the two weights first (weight decay), then the BN scales and shifts (none): two SGD calls.
    float *views[6], *dviews[6];
    size_t sizes[6] = {wsz, wsz, (size_t)b->k, (size_t)b->k, (size_t)b->c, (size_t)b->c}, off = 0;
    for (int v = 0; v < 6; v++) views[v] = b->params + off, dviews[v] = b->grads + off, off += sizes[v];
    b->w1 = views[0], b->w2 = views[1], b->g1 = views[2], b->b1 = views[3], b->g2 = views[4], b->b2 = views[5];
    b->dw1 = dviews[0], b->dw2 = dviews[1], b->dg1 = dviews[2], b->db1 = dviews[3];
    b->dg2 = dviews[4], b->db2 = dviews[5];
    const size_t stats = 2 * (size_t)b->k + 2 * (size_t)b->c;
    b->running = device_alloc_as(d, stats * F, MEM_PARAMS);
    b->saved = device_alloc_as(d, stats * F, MEM_ACTS);
    const size_t hw = (size_t)b->h * b->w, full = (size_t)max_batch * b->c * hw, part = (size_t)max_batch * b->k * hw;
    b->a1 = device_alloc_as(d, part * F, MEM_ACTS);
    b->a2 = device_alloc_as(d, part * F, MEM_ACTS);
    b->z = device_alloc_as(d, full * F, MEM_ACTS);
    b->a3 = device_alloc_as(d, full * F, MEM_ACTS);
    b->out = device_alloc_as(d, full * F, MEM_ACTS);
    b->dz = device_alloc_as(d, full * F, MEM_ACTS);
    b->da = device_alloc_as(d, part * F, MEM_ACTS);
    b->dx = device_alloc_as(d, full * F, MEM_ACTS);
    Conv2dDims d1 = conv1_dims(b, max_batch), d2 = conv2_dims(b, max_batch);
    BatchNormDims s2 = bn_dims(b, max_batch, b->c);
    size_t work = conv2d_work_floats(d, &d1);
    if (conv2d_work_floats(d, &d2) > work) work = conv2d_work_floats(d, &d2);
    if (batchnorm_work_floats(d, &s2) > work) work = batchnorm_work_floats(d, &s2);
    b->work = device_alloc_as(d, (work ? work : 1) * F, MEM_OTHER);
    return b;
}

static void block_free(TpBlock *b) {
    if (!b) return;
    float *bufs[] = {b->params, b->grads, b->velocity, b->running, b->saved, b->a1, b->a2, b->z,
                     b->a3,     b->out,   b->dz,       b->da,      b->dx,    b->work};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) device_free(b->device, bufs[i]);
    free(b);
}

// The whole model's views of block b's tensors (conv1, BN1, conv2, BN2: layers b, b+1, b+3, b+4).
typedef struct {
    size_t w1, g1, b1, w2, g2, b2;  // offsets in the whole model's params
    size_t rm1, rv1, rm2, rv2;      // offsets in its buffers
} BlockOffsets;

static BlockOffsets block_offsets(const Model *whole, int i) {
    const Layer *l = &whole->layers[i];
    const TensorView *v = whole->views, *bv = whole->buffer_views;
    return (BlockOffsets){.w1 = v[l[0].weight].offset, .g1 = v[l[1].weight].offset, .b1 = v[l[1].bias_view].offset,
                          .w2 = v[l[3].weight].offset, .g2 = v[l[4].weight].offset, .b2 = v[l[4].bias_view].offset,
                          .rm1 = bv[l[1].running].offset, .rv1 = bv[l[1].running + 1].offset,
                          .rm2 = bv[l[4].running].offset, .rv2 = bv[l[4].running + 1].offset};
}

// A device buffer of n floats into a new host array.
static float *host_copy(Device d, const float *buf, size_t n) {
    float *h = xmalloc(n * F + 1);
    device_copy_from(d, h, buf, n * F);
    return h;
}

// Block b's slices (params and BN buffers) from the whole model's host arrays P and B; momentum zeroed.
static void block_scatter(TpBlock *b, const Model *whole, const float *P, const float *B) {
    const BlockOffsets o = block_offsets(whole, b->layer);
    const int r = b->tp_rank, T = b->tp;
    const size_t k = (size_t)b->k, c = (size_t)b->c, wsz = k * c * 9;
    float *hp = xmalloc(b->n_params * F), *hs = xmalloc((2 * k + 2 * c) * F);
    tp_split_out(P + o.w1, b->c, b->c, 3, r, T, hp);
    tp_split_in(P + o.w2, b->c, b->c, 3, r, T, hp + wsz);
    memcpy(hp + 2 * wsz, P + o.g1 + r * k, k * F);
    memcpy(hp + 2 * wsz + k, P + o.b1 + r * k, k * F);
    memcpy(hp + 2 * wsz + 2 * k, P + o.g2, c * F);
    memcpy(hp + 2 * wsz + 2 * k + c, P + o.b2, c * F);
    memcpy(hs, B + o.rm1 + r * k, k * F);
    memcpy(hs + k, B + o.rv1 + r * k, k * F);
    memcpy(hs + 2 * k, B + o.rm2, c * F);
    memcpy(hs + 2 * k + c, B + o.rv2, c * F);
    device_copy_to(b->device, b->params, hp, b->n_params * F);
    device_copy_to(b->device, b->running, hs, (2 * k + 2 * c) * F);
    device_memset_zero(b->device, b->velocity, b->n_params * F);
    free(hp), free(hs);
}

// Every rank's slices of block b (gathered: T x n_params, T x stats floats, in tensor-rank order) into the whole
// model's host arrays P and B.
static void block_unscatter(const TpBlock *b, const Model *whole, const float *gp, const float *gs, float *P,
                            float *B) {
    const BlockOffsets o = block_offsets(whole, b->layer);
    const size_t k = (size_t)b->k, c = (size_t)b->c, wsz = k * c * 9, stats = 2 * k + 2 * c;
    for (int t = 0; t < b->tp; t++) {
        const float *p = gp + t * b->n_params, *s = gs + t * stats;
        memcpy(P + o.w1 + t * wsz, p, wsz * F);  // output channels [t k, (t + 1) k): consecutive filters
        tp_unsplit_in(p + wsz, b->c, b->c, 3, t, b->tp, P + o.w2);
        memcpy(P + o.g1 + t * k, p + 2 * wsz, k * F);
        memcpy(P + o.b1 + t * k, p + 2 * wsz + k, k * F);
        memcpy(B + o.rm1 + t * k, s, k * F);
        memcpy(B + o.rv1 + t * k, s + k, k * F);
    }
    memcpy(P + o.g2, gp + 2 * wsz + 2 * k, c * F);  // replicated: tensor rank 0's
    memcpy(P + o.b2, gp + 2 * wsz + 2 * k + c, c * F);
    memcpy(B + o.rm2, gs + 2 * k, c * F);
    memcpy(B + o.rv2, gs + 2 * k + c, c * F);
}

// The pieces of the table: split blocks where tp_is_block says so, replicated stages between them.
static void plan_pieces(Tp *tp, const Model *table) {
    int start = 0;  // the first layer of the replicated run in progress
    for (int i = 0; i <= table->n_layers; i++) {
        const bool block = i < table->n_layers && tp_is_block(table, i, tp->grid.tp);
        if ((block || i == table->n_layers) && i > start) {
            CHECK(tp->n_pieces < TP_MAX_PIECES, "the model has more pieces than TP_MAX_PIECES");
            tp->pieces[tp->n_pieces++] = (TpPiece){.first = start, .last = i};
        }
        if (block) {
            CHECK(tp->n_pieces < TP_MAX_PIECES, "the model has more pieces than TP_MAX_PIECES");
            tp->pieces[tp->n_pieces++] = (TpPiece){.first = i, .last = i + TP_BLOCK_LAYERS};
            tp->n_blocks++;
            i += TP_BLOCK_LAYERS - 1;
            start = i + 1;
        }
    }
}

static void bn_sync_data(double *host_buf, int count, void *ctx) {
    pg_allreduce_sum_double_host((ProcessGroup *)ctx, host_buf, count);
}

static void join_grid(Tp *tp, ProcessGroup *world, int T) {
    if (!tp_grid(pg_rank(world), pg_world(world), T, &tp->grid))
        die("%d rank(s) cannot be cut into tensor groups of %d (rank %d)\n"
            "  HINT: the number of ranks must be a multiple of --tp (TODO 4a: tp_grid)",
            pg_world(world), T, pg_rank(world));
    tp->world = world;
    tp_groups(world, &tp->grid, &tp->tensor, &tp->data);
    CHECK(tp->tensor && tp->data, "TODO 4b: tp_groups must make both groups (pg_split)");
    CHECK(pg_world(tp->tensor) == T && pg_rank(tp->tensor) == tp->grid.tp_rank,
          "TODO 4b: the tensor group holds the T ranks of one replica, ranked by tensor rank");
    CHECK(pg_world(tp->data) == tp->grid.dp && pg_rank(tp->data) == tp->grid.replica,
          "TODO 4b: the data group holds one rank per replica, ranked by replica");
}

Tp *tp_join(ProcessGroup *world, int T) {
    Tp *tp = xcalloc(1, sizeof *tp);
    join_grid(tp, world, T);
    return tp;
}

Tp *tp_create(ProcessGroup *world, int T, const ModelConfig *cfg, Device d, int max_batch, uint64_t seed) {
    Tp *tp = tp_join(world, T);
    tp_make_pieces(tp, cfg, d, max_batch, seed);
    return tp;
}

void tp_make_pieces(Tp *tp, const ModelConfig *cfg, Device d, int max_batch, uint64_t seed) {
    const int T = tp->grid.tp;
    tp->cfg = *cfg, tp->device = d, tp->max_batch = max_batch, tp->classes = cfg->classes;
    if (tp->grid.dp > 1) tp->bn_ops.sync = (BatchNormSync){.allreduce_sum = bn_sync_data, .ctx = tp->data};
    const BatchNormSync *sync = tp->grid.dp > 1 ? &tp->bn_ops.sync : NULL;
    Model *table = model_create(cfg, DEVICE_CPU, 1, seed);  // the layer table and one process's initial weights
    plan_pieces(tp, table);
    if (tp->n_blocks == 0)
        die("model %s has no residual block that %d tensor rank(s) can split (TODO 3: tp_is_block)\n"
            "  HINT: --model resnet9, whose blocks have 2 x width and 8 x width channels; --tp must divide them",
            cfg->name, T);
    for (int p = 0; p < tp->n_pieces; p++) {
        TpPiece *pc = &tp->pieces[p];
        if (tp_is_block(table, pc->first, T) && pc->last == pc->first + TP_BLOCK_LAYERS) {
            pc->block = block_create(table, pc->first, &tp->grid, d, max_batch, sync);
            block_scatter(pc->block, table, table->params, table->buffers);
        } else {
            pc->stage = model_create_stage(cfg, d, max_batch, seed, pc->first, pc->last);
            if (sync) model_set_bn_ops(pc->stage, &tp->bn_ops);
        }
    }
    model_free(table);
    const size_t image = (size_t)cfg->in_c * cfg->in_h * cfg->in_w;
    tp->input = device_alloc_as(d, (size_t)max_batch * image * F, MEM_ACTS);
    tp->labels = device_alloc(d, (size_t)max_batch * sizeof(int));
    tp->pred = device_alloc(d, (size_t)max_batch * sizeof(int));
    tp->loss = device_alloc_as(d, (size_t)max_batch * F, MEM_ACTS);
    tp->dlogits = device_alloc_as(d, (size_t)max_batch * tp->classes * F, MEM_ACTS);
    tp->host_loss = xmalloc((size_t)max_batch * F);
    tp->host_pred = xmalloc((size_t)max_batch * sizeof(int));
}

void tp_free(Tp *tp) {
    if (!tp) return;
    for (int p = 0; p < tp->n_pieces; p++) {
        model_free(tp->pieces[p].stage);
        block_free(tp->pieces[p].block);
    }
    const Device d = tp->device;
    device_free(d, tp->input), device_free(d, tp->labels), device_free(d, tp->pred);
    device_free(d, tp->loss), device_free(d, tp->dlogits);
    free(tp->host_loss), free(tp->host_pred);
    pg_finalize(tp->data);  // sub-groups, before their parent (collective: every rank frees its Tp)
    pg_finalize(tp->tensor);
    free(tp);
}

// ---------------------------------------------------------------- given: gather and scatter of the whole model

void tp_gather_model(Tp *tp, Model *whole) {
    const Device wd = whole->device;
    float *P = host_copy(wd, whole->params, whole->n_params), *B = host_copy(wd, whole->buffers, whole->n_buffers);
    for (int p = 0; p < tp->n_pieces; p++) {
        const TpPiece *pc = &tp->pieces[p];
        if (pc->stage) {
            const Model *m = pc->stage;
            device_copy_from(m->device, P + m->param_base, m->params, m->n_params * F);
            if (m->n_buffers) device_copy_from(m->device, B + m->buffer_base, m->buffers, m->n_buffers * F);
            continue;
        }
        const TpBlock *b = pc->block;
        const size_t stats = 2 * (size_t)b->k + 2 * (size_t)b->c, T = (size_t)b->tp;
        float *gp = device_alloc(b->device, T * b->n_params * F), *gs = device_alloc(b->device, T * stats * F);
        pg_allgather(tp->tensor, b->params, gp, b->n_params);
        pg_allgather(tp->tensor, b->running, gs, stats);
        float *hp = host_copy(b->device, gp, T * b->n_params), *hs = host_copy(b->device, gs, T * stats);
        block_unscatter(b, whole, hp, hs, P, B);
        free(hp), free(hs);
        device_free(b->device, gp), device_free(b->device, gs);
    }
    device_copy_to(wd, whole->params, P, whole->n_params * F);
    device_copy_to(wd, whole->buffers, B, whole->n_buffers * F);
    free(P), free(B);
}

void tp_scatter_model(Tp *tp, const Model *whole) {
    const Device wd = whole->device;
    float *P = host_copy(wd, whole->params, whole->n_params), *B = host_copy(wd, whole->buffers, whole->n_buffers);
    for (int p = 0; p < tp->n_pieces; p++) {
        const TpPiece *pc = &tp->pieces[p];
        if (pc->block) {
            block_scatter(pc->block, whole, P, B);
            continue;
        }
        Model *m = pc->stage;
        device_copy_to(m->device, m->params, P + m->param_base, m->n_params * F);
        if (m->n_buffers) device_copy_to(m->device, m->buffers, B + m->buffer_base, m->n_buffers * F);
        device_memset_zero(m->device, m->velocity, m->n_params * F);
    }
    free(P), free(B);
}

// ---------------------------------------------------------------- given: the step and the evaluation

static void batch_in(Tp *tp, const Batch *b, const float **x, const int **y) {
    if (batch_on_device(b, tp->device, x, y)) return;
    const size_t image = (size_t)tp->cfg.in_c * tp->cfg.in_h * tp->cfg.in_w;
    device_copy_to(tp->device, tp->input, b->x, (size_t)b->n * image * F);
    device_copy_to(tp->device, tp->labels, b->y, (size_t)b->n * sizeof(int));
    *x = tp->input, *y = tp->labels;
}

// Through every piece: returns the logits; input_of[p] (may be NULL) gets each piece's input.
static const float *forward_pieces(Tp *tp, const float *x, int n, bool train, const float **input_of) {
    const float *h = x;
    for (int p = 0; p < tp->n_pieces; p++) {
        const TpPiece *pc = &tp->pieces[p];
        if (input_of) input_of[p] = h;
        double t = trace_begin("forward piece");  // on the timeline (--trace): g's all-reduce inside a block's span
        if (pc->stage) {
            h = model_forward(pc->stage, h, n, train);
        } else {
            tp_block_forward(pc->block, tp->tensor, h, n, train);
            h = pc->block->out;
        }
        trace_endf(t, TRACE_COMPUTE, "forward %s %d-%d", pc->stage ? "layers" : "block", pc->first, pc->last - 1);
    }
    return h;
}

// The loss of the logits into *r (counted on tensor rank 0 only); its gradient scaled by 1/n into tp->dlogits.
static void loss_of(Tp *tp, const Batch *b, const float *logits, const int *y, float smoothing, bool train,
                    Metrics *r) {
    const Device d = tp->device;
    const int n = b->n, k = tp->classes;
    cross_entropy_forward(d, n, k, logits, y, smoothing, tp->loss);
    if (train) {
        device_memset_zero(d, tp->dlogits, (size_t)n * k * F);  // cross_entropy_backward adds
        cross_entropy_backward(d, n, k, logits, y, smoothing, 1.0f / (float)n, tp->dlogits);
    }
    if (tp->grid.tp_rank != 0) return;
    argmax_rows(d, n, k, logits, tp->pred);
    device_copy_from(d, tp->host_loss, tp->loss, (size_t)n * F);
    device_copy_from(d, tp->host_pred, tp->pred, (size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        r->loss_sum += tp->host_loss[i];
        r->correct += tp->host_pred[i] == b->y[i];
    }
    r->count += n;
}

static void block_update(TpBlock *b, const SgdConfig *opt) {
    const size_t weights = 2 * (size_t)b->k * b->c * 9;  // w1, w2: decayed; the BN scales and shifts: not
    sgd_update(b->device, weights, b->params, b->grads, b->velocity, opt->lr, opt->momentum, opt->weight_decay,
               opt->nesterov);
    sgd_update(b->device, b->n_params - weights, b->params + weights, b->grads + weights, b->velocity + weights,
               opt->lr, opt->momentum, 0.0f, opt->nesterov);
}

Metrics tp_step(Tp *tp, const Batch *b, const SgdConfig *opt, float label_smoothing) {
    const double start = time_now();
    double comm = 0;
    const int n = b->n;
    const float *x;
    const int *y;
    batch_in(tp, b, &x, &y);
    const float *input_of[TP_MAX_PIECES];
    for (int p = 0; p < tp->n_pieces; p++) {
        if (tp->pieces[p].stage) model_zero_grad(tp->pieces[p].stage);
        else device_memset_zero(tp->device, tp->pieces[p].block->grads, tp->pieces[p].block->n_params * F);
    }
    double t = trace_begin("forward");
    const float *logits = forward_pieces(tp, x, n, true, input_of);
    Metrics r = {0, 0, 0};
    loss_of(tp, b, logits, y, label_smoothing, true, &r);
    trace_end(t, TRACE_COMPUTE, "forward");
    t = trace_begin("backward");
    const float *dout = tp->dlogits;
    for (int p = tp->n_pieces - 1; p >= 0; p--) {
        const TpPiece *pc = &tp->pieces[p];
        double tb = trace_begin("backward piece");
        if (pc->stage) {
            model_backward(pc->stage, input_of[p], dout, n);
            dout = model_input_grad(pc->stage);
        } else {
            tp_block_backward(pc->block, tp->tensor, input_of[p], dout, n);
            dout = pc->block->dx;
        }
        trace_endf(tb, TRACE_COMPUTE, "backward %s %d-%d", pc->stage ? "layers" : "block", pc->first, pc->last - 1);
    }
    trace_end(t, TRACE_COMPUTE, "backward");
    double c = time_now();
    tp_average_grads(tp);
    comm += time_now() - c;
    for (int p = 0; p < tp->n_pieces; p++) {
        if (tp->pieces[p].stage) optim_step(tp->pieces[p].stage, opt);
        else block_update(tp->pieces[p].block, opt);
    }
    tp->steps++;
    tp->comm_seconds += comm;
    tp->compute_seconds += (time_now() - start) - comm;
    return r;
}

Metrics tp_evaluate(Tp *tp, Loader *test_loader) {
    loader_start_epoch(test_loader, 0, 0);
    Metrics local = {0, 0, 0};
    const Batch *b;
    while ((b = loader_next(test_loader, NULL)) != NULL) {
        const float *x;
        const int *y;
        batch_in(tp, b, &x, &y);
        const float *logits = forward_pieces(tp, x, b->n, false, NULL);
        loss_of(tp, b, logits, y, 0.0f, false, &local);
    }
    return ddp_global_metrics(tp->world, local);
}

// ---------------------------------------------------------------- given: bytes and memory

TpTraffic tp_expected_traffic(const Tp *tp, int n) {
    TpTraffic e = {0, 0, 0, 0};
    const bool data = tp->grid.dp > 1;
    for (int p = 0; p < tp->n_pieces; p++) {
        const TpPiece *pc = &tp->pieces[p];
        if (pc->block) {
            const TpBlock *b = pc->block;
            e.tensor_calls += 2;  // g forward, f backward
            e.tensor_bytes += 2 * (uint64_t)n * b->c * b->h * b->w * F;
            if (data) {
                e.data_calls += 1 + 4;  // the gradient average; BN1 and BN2, forward and backward
                e.data_bytes += b->n_params * F + 2 * (2 * (uint64_t)b->k + 1) * 8 + 2 * (2 * (uint64_t)b->c + 1) * 8;
            }
            continue;
        }
        if (!data) continue;
        const Model *m = pc->stage;
        e.data_calls += 1, e.data_bytes += m->n_params * F;
        for (int l = 0; l < m->n_layers; l++)
            if (m->layers[l].kind == LAYER_BN) e.data_calls += 2, e.data_bytes += 2 * (2 * (uint64_t)m->layers[l].c + 1) * 8;
    }
    return e;
}

size_t tp_local_params(const Tp *tp) {
    size_t n = 0;
    for (int p = 0; p < tp->n_pieces; p++)
        n += tp->pieces[p].stage ? tp->pieces[p].stage->n_params : tp->pieces[p].block->n_params;
    return n;
}

void tp_print_memory(const Tp *tp, FILE *out) {
    const MemStats s = mem_stats();
    size_t shard = 0, repl = 0;
    for (int p = 0; p < tp->n_pieces; p++) {
        const TpPiece *pc = &tp->pieces[p];
        if (pc->stage) repl += pc->stage->n_params;
        else shard += 2 * (size_t)pc->block->k * pc->block->c * 9 + 2 * (size_t)pc->block->k,
             repl += 2 * (size_t)pc->block->c;
    }
    fprintf(out, "tp: memory of rank %d (tensor rank %d of %d, replica %d of %d), MB live / peak since step 1\n",
            pg_rank(tp->world), tp->grid.tp_rank, tp->grid.tp, tp->grid.replica, tp->grid.dp);
    for (int p = 0; p < MEM_PARTS; p++)
        fprintf(out, "  %-12s %10.3f / %10.3f\n", mem_part_name((MemPart)p), s.live[p] / 1e6, s.peak[p] / 1e6);
    fprintf(out, "  %-12s %10.3f / %10.3f\n", "total", s.live_total / 1e6, s.peak_total / 1e6);
    fprintf(out, "  arithmetic: params %zu floats = %zu sliced (1/%d of the blocks' convs and BN1) + %zu replicated;"
                 " params, grads, momentum %.3f MB each\n",
            shard + repl, shard, tp->grid.tp, repl, (double)(shard + repl) * F / 1e6);
}
