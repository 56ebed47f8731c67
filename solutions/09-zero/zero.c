// zero.c: sharded training (ZeRO stages 1-3, FSDP) and recomputation. What you write is marked TODO:
//
//   TODO 1  the two halves of an all-reduce for a length that does not divide by the world: shard_layout (1a),
//           shard_reduce_scatter_start / _finish (1b), shard_allgather (1c)
//   TODO 2  stage 1: each rank keeps the momentum of its shard only, updates its shard, all-gathers the params
//   TODO 3  stage 2: the gradient is reduce-scattered into the shard while the unit before it runs its backward;
//           the full gradient lives only from its backward to the end of its reduce-scatter
//   TODO 4  stage 3: a unit's full parameters live only in a window around its forward and its backward
//   TODO 5  (stretch) recomputation: a unit keeps only its output; backward runs its forward again first (5a-5c)
//
// The step (zero_step) runs the units (kit stage models, lesson 08's model_create_stage) one after the other:
//
//   forward   unit 0 on the batch, unit u on unit u-1's output            (stage 3: inside u's window)
//   loss      on the last unit's logits, scaled by 1/n
//   backward  from the last unit: unit u's input gradient is unit u-1's output gradient; after unit u's backward
//             its gradient is all-reduced (stages 0-1) or its reduce-scatter into its shard starts (stages 2-3),
//             to be waited for after unit u-1's backward, which runs meanwhile (KIT_OVERLAP=0: at once)
//   update    stage 0: the whole unit; stages 1-3: this rank's shard (then stages 1-2 all-gather the params)
//
// PyTorch: ZeroRedundancyOptimizer (stage 1), FSDP(sharding_strategy=SHARD_GRAD_OP) (stage 2),
// FSDP(sharding_strategy=FULL_SHARD) (stage 3), torch.utils.checkpoint (recomputation).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lesson.h"
#include "kit/check.h"
#include "kit/log.h"
#include "kit/ops.h"
#include "kit/trace.h"

#define F sizeof(float)

// ---------------------------------------------------------------- shards of a flat buffer (TODO 1)

// TODO 1a: the layout of n floats over `world` ranks. Goal: every float in exactly one shard, every shard the
//   same size, the padding as small as it can be. Why equal: NCCL's and MPI's reduce-scatter and all-gather take
//   equal blocks. Try your rule on n = 1586, w = 3 and n = 5, w = 7 (README section 4) before the tests do.
// PyTorch: FSDP's FlatParameter pads its flat buffer to a multiple of the world size the same way.
ShardLayout shard_layout(size_t n, int world) {
    CHECK(world > 0, "shard_layout: the world has at least one rank");
    // BEGIN SOLUTION
    size_t shard = (n + (size_t)world - 1) / (size_t)world;
    return (ShardLayout){.n = n, .shard = shard, .padded = shard * (size_t)world};
    // STARTER: return (ShardLayout){.n = n, .shard = n / (size_t)world, .padded = n / (size_t)world * (size_t)world};
    // END SOLUTION
}

size_t shard_valid(const ShardLayout *l, int rank) {
    size_t off = (size_t)rank * l->shard;
    return off >= l->n ? 0 : (l->n - off < l->shard ? l->n - off : l->shard);
}

// The kit has no scaling kernel: on a GPU the shard goes to the host and back (a shard is small).
void shard_divide(Device d, float *x, size_t n, int world) {
    if (world == 1 || n == 0) return;
    float *h = d == DEVICE_CPU ? x : xmalloc(n * F);
    if (h != x) device_copy_from(d, h, x, n * F);
    const float w = (float)world, inv = 1.0f / w;
    const bool pow2 = (world & (world - 1)) == 0;
    for (size_t i = 0; i < n; i++) h[i] = pow2 ? h[i] * inv : h[i] / w;
    if (h != x) {
        device_copy_to(d, x, h, n * F);
        free(h);
    }
}

// TODO 1b: this rank's shard of the average over the ranks of `full` (n floats on every rank), in two halves, so
//   that the caller can compute while it travels (TODO 3): the start puts the kit's reduce-scatter in flight and
//   returns its work; the finish waits for it and makes the sum a mean. Decide: the kit's reduce-scatter reads
//   world equal blocks (padded floats) where full has n, so what must the padding hold for the sums, and where
//   does it live (full is const)? Why the 1/world once, at the end, with the all-reduce's rounding (lesson 03,
//   section 4)? And what must stay untouched between the start and the finish? The kit calls: the hints
//   (README, `make grade HINTS=full`).
// PyTorch: dist.reduce_scatter_tensor(shard, padded_full, op=dist.ReduceOp.AVG, async_op=True), then work.wait()
PgWork *shard_reduce_scatter_start(ProcessGroup *pg, const ShardLayout *l, const float *full, float *shard,
                                   float *scratch) {
    if (l->n == 0) return NULL;
    // BEGIN SOLUTION
    const Device d = pg_device(pg);
    const float *send = full;
    if (l->padded != l->n) {
        CHECK(scratch != NULL, "shard_reduce_scatter_start: n is not a multiple of the world: pass a scratch of padded floats");
        device_copy(d, scratch, full, l->n * F);
        device_memset_zero(d, scratch + l->n, (l->padded - l->n) * F);
        send = scratch;
    }
    return pg_reduce_scatter_sum_start(pg, send, shard, l->shard);
    // STARTER: (void)pg, (void)full, (void)shard, (void)scratch;
    // STARTER: return NULL;
    // END SOLUTION
}

void shard_reduce_scatter_finish(ProcessGroup *pg, const ShardLayout *l, PgWork *w, float *shard) {
    if (l->n == 0) return;
    // BEGIN SOLUTION
    pg_work_wait(pg, w, "reduce-scatter of a shard");
    shard_divide(pg_device(pg), shard, l->shard, pg_world(pg));
    // STARTER: (void)pg, (void)w, (void)shard;
    // END SOLUTION
}

// Given: both halves at once.
void shard_reduce_scatter_avg(ProcessGroup *pg, const ShardLayout *l, const float *full, float *shard, float *scratch) {
    shard_reduce_scatter_finish(pg, l, shard_reduce_scatter_start(pg, l, full, shard, scratch), shard);
}

// TODO 1c: every rank's shard (shard floats) -> full (n floats) on every rank, in rank order: the inverse of 1b.
//   Decide: the kit's all-gather writes world equal blocks, padded floats, where full holds n; which of them are
//   the buffer, and what must never be written into full (it holds n floats, not padded)? The kit calls: the
//   hints (README, `make grade HINTS=full`).
// PyTorch: dist.all_gather_into_tensor(padded_full, shard); full = padded_full[:n]
void shard_allgather(ProcessGroup *pg, const ShardLayout *l, const float *shard, float *full, float *scratch) {
    if (l->n == 0) return;
    // BEGIN SOLUTION
    if (l->padded == l->n) {
        pg_allgather(pg, shard, full, l->shard);
        return;
    }
    CHECK(scratch != NULL, "shard_allgather: n is not a multiple of the world: pass a scratch of padded floats");
    pg_allgather(pg, shard, scratch, l->shard);
    device_copy(pg_device(pg), full, scratch, l->n * F);
    // STARTER: (void)pg, (void)shard, (void)full, (void)scratch;
    // END SOLUTION
}

// ---------------------------------------------------------------- given: units and shards

// Parameters of layer i of cfg's architecture (an inference model's table has them; its memory is freed at once).
static void layer_params(const ModelConfig *cfg, size_t *count, int *n_layers) {
    Model *t = model_create_inference(cfg, DEVICE_CPU, 1);
    *n_layers = t->n_layers;
    for (int i = 0; i < t->n_layers; i++) count[i] = t->layers[i].param_count;
    model_free(t);
}

// The default cut: a unit starts at every layer with parameters where a cut is allowed (model_cut_ok), so each
// unit is one such layer with the parameter-free layers after it (the first also takes those before it).
static int plan_default(const ModelConfig *cfg, const size_t *count, int L, int *first) {
    int n = 0;
    bool has_params = false;
    first[n++] = 0;
    for (int i = 0; i < L; i++) {
        if (count[i] > 0 && has_params && model_cut_ok(cfg, i)) {
            CHECKF(n < ZERO_MAX_UNITS, "ask for fewer units with --units N", "%s has more than %d units by layer",
                   cfg->name, ZERO_MAX_UNITS);
            first[n++] = i;
            has_params = false;
        }
        has_params |= count[i] > 0;
    }
    first[n] = L;
    return n;
}

// N units balanced by parameter count: cut k goes at the allowed cut whose parameters before it are nearest
// k / N of the total, leaving enough allowed cuts for the cuts after it.
static int plan_balanced(const ModelConfig *cfg, const size_t *count, int L, int N, int *first) {
    int cuts[MODEL_MAX_LAYERS], nc = 0;
    double prefix[MODEL_MAX_LAYERS + 1] = {0};
    for (int i = 0; i < L; i++) prefix[i + 1] = prefix[i] + (double)count[i];
    for (int c = 1; c < L; c++)
        if (model_cut_ok(cfg, c)) cuts[nc++] = c;
    CHECKF(N - 1 <= nc, "ask for fewer units with --units N", "%s can be cut into at most %d units (--units %d)",
           cfg->name, nc + 1, N);
    first[0] = 0;
    int prev = -1;
    for (int k = 1; k < N; k++) {
        double target = prefix[L] * k / N;
        int best = prev + 1;
        for (int j = prev + 1; j <= nc - (N - k); j++)
            if (fabs(prefix[cuts[j]] - target) < fabs(prefix[cuts[best]] - target)) best = j;
        first[k] = cuts[best];
        prev = best;
    }
    first[N] = L;
    return N;
}

int zero_plan_units(const ModelConfig *cfg, int n_units, int *first) {
    size_t count[MODEL_MAX_LAYERS];
    int L;
    layer_params(cfg, count, &L);
    CHECKF(n_units <= ZERO_MAX_UNITS, "--units takes 1 to 32 (0: one unit per layer with parameters)",
           "--units %d", n_units);
    return n_units <= 0 ? plan_default(cfg, count, L, first) : plan_balanced(cfg, count, L, n_units, first);
}

static float *floats_alloc(Device d, size_t n, MemPart part) {
    float *x = device_alloc_as(d, n * F, part);
    device_memset_zero(d, x, n * F);
    return x;
}

// The padded scratch of unit u's collectives. With the overlap, unit u+1's reduce-scatter may still be reading its
// scratch while unit u gathers its parameters (stage 3) and starts its own reduce-scatter: odd and even units take
// turns with two scratches, so that the one in flight keeps its own (a unit that needs no padding uses none).
static float *unit_scratch(const Zero *z, int u) { return u % 2 && z->scratch_odd ? z->scratch_odd : z->scratch; }

// Model.on_grads_ready after each layer's backward: Open MPI moves a collective in flight only inside MPI calls, so
// the reduce-scatter of the unit after this one would otherwise wait for our pg_work_wait to travel at all.
static void progress_hook(void *ctx, size_t offset, size_t count) {
    (void)offset, (void)count;
    pg_progress(((Zero *)ctx)->pg);
}

// Floats per sample of unit u's output.
static size_t unit_out_floats(const Model *m) {
    const Layer *l = &m->layers[m->n_layers - 1];
    return (size_t)l->c * l->h * l->w;
}

void zero_sgd_shard(Zero *z, int u, float *param, const float *grad, float *velocity, const SgdConfig *opt) {
    const Model *m = z->units[u];
    const ShardLayout *l = &z->layout[u];
    const size_t off = (size_t)z->rank * l->shard, end = off + shard_valid(l, z->rank);
    for (int i = 0; i < m->n_views; i++) {  // each view's part of the shard, with the view's weight decay
        const TensorView *v = &m->views[i];
        size_t a = v->offset > off ? v->offset : off, b = v->offset + v->count < end ? v->offset + v->count : end;
        if (a >= b) continue;
        sgd_update(z->device, b - a, param + (a - off), grad + (a - off), velocity + (a - off), opt->lr,
                   opt->momentum, v->decay ? opt->weight_decay : 0.0f, opt->nesterov);
    }
}

// ---------------------------------------------------------------- what each stage frees (TODO 2-5)

// What unit u keeps between steps, decided once at the start. zero_create has made every shard buffer the stage
// needs; the unit model still holds everything a whole model does (model_create_stage).
static void zero_release_unsharded(Zero *z, int u) {
    // TODO 2 (stage 1 and up): the full momentum goes (model_release, kit/model.h): this rank's is velocity_shard.
    if (z->stage >= ZERO_OPTIM) {
        // BEGIN SOLUTION
        model_release(z->units[u], MODEL_VELOCITY);
        // END SOLUTION
    }
    // TODO 3 (stage 2 and up): the full gradient goes too; each backward of the unit brings it back for as long
    //   as it takes to compute it and reduce-scatter it into grad_shard.
    if (z->stage >= ZERO_GRADS) {
        // BEGIN SOLUTION
        model_release(z->units[u], MODEL_GRADS);
        // END SOLUTION
    }
    // TODO 4 (stage 3): the full parameters go: param_shard (filled by zero_create) is this rank's only copy.
    if (z->stage == ZERO_PARAMS) {
        // BEGIN SOLUTION
        model_release(z->units[u], MODEL_PARAMS);
        // END SOLUTION
    }
    // TODO 5 (--recompute): the activations go; forward brings them back for the unit's forward only.
    if (z->recompute) {
        // BEGIN SOLUTION
        model_release(z->units[u], MODEL_ACTS);
        // END SOLUTION
    }
}

Zero *zero_create(ProcessGroup *pg, const ModelConfig *cfg, Device d, int max_batch, uint64_t seed, ZeroStage stage,
                  int n_units, bool recompute) {
    CHECKF(stage >= ZERO_DDP && stage <= ZERO_PARAMS, "--zero takes 0, 1, 2 or 3", "stage %d", (int)stage);
    Zero *z = xcalloc(1, sizeof *z);
    z->pg = pg, z->stage = stage, z->recompute = recompute, z->device = d, z->max_batch = max_batch;
    z->rank = pg_rank(pg), z->world = pg_world(pg), z->classes = cfg->classes;
    const char *env = getenv("KIT_OVERLAP");  // KIT_OVERLAP=0: every reduce-scatter waited for at once (to compare)
    z->overlap = stage >= ZERO_GRADS && !(env && strcmp(env, "0") == 0);
    z->n_units = zero_plan_units(cfg, n_units, z->first);
    size_t most_padded[2] = {0, 0}, most_shard = 1, most_buffers = 1;  // most_padded: of the even and the odd units
    for (int u = 0; u < z->n_units; u++) {
        Model *m = z->units[u] = model_create_stage(cfg, d, max_batch, seed, z->first[u], z->first[u + 1]);
        ShardLayout l = z->layout[u] = shard_layout(m->n_params, z->world);
        // The collectives need a padded scratch only for a unit whose length the world does not divide, and only
        // from stage 1 on (stage 0 all-reduces the unit's own buffer): sized for the largest such unit, none if none.
        if (stage >= ZERO_OPTIM && l.padded != l.n && l.padded > most_padded[u % 2]) most_padded[u % 2] = l.padded;
        if (l.shard > most_shard) most_shard = l.shard;
        if (m->n_buffers > most_buffers) most_buffers = m->n_buffers;
        if (stage >= ZERO_OPTIM) z->velocity_shard[u] = floats_alloc(d, l.shard, MEM_OPTIM);
        if (stage >= ZERO_GRADS) z->grad_shard[u] = floats_alloc(d, l.shard, MEM_GRADS);
        if (stage == ZERO_PARAMS) {  // this rank's slice of the initial params, zero padding
            z->param_shard[u] = floats_alloc(d, l.shard, MEM_PARAMS);
            device_copy(d, z->param_shard[u], m->params + (size_t)z->rank * l.shard, shard_valid(&l, z->rank) * F);
        }
        if (recompute) z->boundary[u] = floats_alloc(d, (size_t)max_batch * unit_out_floats(m), MEM_ACTS);
        if (z->overlap) m->on_grads_ready = progress_hook, m->on_grads_ready_ctx = z;
        zero_release_unsharded(z, u);
    }
    // With the overlap, odd and even units take turns (unit_scratch): one scratch for each, as large as its largest
    // unit needs; without it, one for all.
    const bool turns = z->overlap && z->n_units > 1;
    const size_t even = turns ? most_padded[0] : (most_padded[0] > most_padded[1] ? most_padded[0] : most_padded[1]);
    z->scratch = even > 0 ? floats_alloc(d, even, MEM_COMM) : NULL;
    if (turns && most_padded[1] > 0) z->scratch_odd = floats_alloc(d, most_padded[1], MEM_COMM);
    if (stage >= ZERO_OPTIM) z->shard_work = floats_alloc(d, most_shard, MEM_COMM);
    if (recompute) z->bn_saved = floats_alloc(d, most_buffers, MEM_ACTS);
    const Model *m0 = z->units[0];
    z->input = floats_alloc(d, (size_t)max_batch * m0->in_c * m0->in_h * m0->in_w, MEM_ACTS);
    z->dlogits = floats_alloc(d, (size_t)max_batch * z->classes, MEM_ACTS);
    z->loss = floats_alloc(d, (size_t)max_batch, MEM_ACTS);
    z->labels = device_alloc_as(d, (size_t)max_batch * sizeof(int), MEM_ACTS);
    z->pred = device_alloc_as(d, (size_t)max_batch * sizeof(int), MEM_ACTS);
    z->host_loss = xmalloc((size_t)max_batch * F);
    z->host_pred = xmalloc((size_t)max_batch * sizeof(int));
    return z;
}

void zero_free(Zero *z) {
    if (!z) return;
    const Device d = z->device;
    for (int u = 0; u < z->n_units; u++) {
        model_free(z->units[u]);
        float *b[] = {z->param_shard[u], z->grad_shard[u], z->velocity_shard[u], z->boundary[u]};
        for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) device_free(d, b[i]);
    }
    float *b[] = {z->scratch, z->scratch_odd, z->shard_work, z->bn_saved, z->input, z->dlogits, z->loss};
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) device_free(d, b[i]);
    device_free(d, z->labels), device_free(d, z->pred);
    free(z->host_loss), free(z->host_pred);
    free(z);
}

// ---------------------------------------------------------------- stage 3's window (TODO 4)

// TODO 4a: open unit u's window: its full parameters, from every rank's param_shard (model_materialize, then
//   TODO 1c into the unit's params; unit_scratch(z, u) is a padded-sized scratch).
// PyTorch: FSDP's pre-forward / pre-backward hook (_unshard: all-gather the FlatParameter)
static void window_open(Zero *z, int u) {
    if (z->stage != ZERO_PARAMS) return;
    double t = time_now(), tt = trace_begin("all-gather unit");  // on the timeline (--trace) inside the unit's span
    // BEGIN SOLUTION
    Model *m = z->units[u];
    model_materialize(m, MODEL_PARAMS);
    shard_allgather(z->pg, &z->layout[u], z->param_shard[u], m->params, unit_scratch(z, u));
    // END SOLUTION
    trace_endf(tt, TRACE_COMM, "all-gather unit %d", u);
    z->comm_seconds += time_now() - t;
}

// TODO 4b: close it: the full parameters go again.
// PyTorch: FSDP's post-forward / post-backward reshard (reshard_after_forward=True)
static void window_close(Zero *z, int u) {
    if (z->stage != ZERO_PARAMS) return;
    // BEGIN SOLUTION
    model_release(z->units[u], MODEL_PARAMS);
    // END SOLUTION
}

// ---------------------------------------------------------------- forward and backward of a unit (TODO 3, 5)

// Unit u's forward on x (n, its input): returns its output, which the next unit reads (valid until the unit's
// next forward).
// TODO 5a (--recompute): the unit's activations exist only during this forward (model_materialize before,
//   model_release after); copy its output into z->boundary[u] first and return that instead.
static const float *unit_forward(Zero *z, int u, const float *x, int n, bool train) {
    Model *m = z->units[u];
    double t = trace_begin("forward unit");
    window_open(z, u);
    // BEGIN SOLUTION
    if (z->recompute) model_materialize(m, MODEL_ACTS);
    // END SOLUTION
    const float *out = model_forward(m, x, n, train);
    // BEGIN SOLUTION
    if (z->recompute) {
        device_copy(z->device, z->boundary[u], out, (size_t)n * unit_out_floats(m) * F);
        model_release(m, MODEL_ACTS);
        out = z->boundary[u];
    }
    // END SOLUTION
    window_close(z, u);
    trace_endf(t, TRACE_COMPUTE, "forward unit %d", u);
    return out;
}

// After unit u's backward its gradient is final on every rank: make it the average over the ranks.
// TODO 3 (stage 2 and up): START its reduce-scatter into grad_shard[u] instead (TODO 1b; the scratch:
//   unit_scratch(z, u)) and keep the work in z->grad_work[u]; reduce_grads_finish below ends it.
// PyTorch: FSDP's post-backward hook (reduce_scatter_tensor of the FlatParameter's gradient, on its own stream)
static void reduce_grads(Zero *z, int u) {
    Model *m = z->units[u];
    double t = time_now();
    if (z->stage <= ZERO_OPTIM) {
        pg_allreduce_avg(z->pg, m->grads, m->n_params);
    } else {
        trace_name_next("reduce-scatter unit %d", u);  // the name of its span on the timeline (--trace)
        // BEGIN SOLUTION
        z->grad_work[u] = shard_reduce_scatter_start(z->pg, &z->layout[u], m->grads, z->grad_shard[u],
                                                     unit_scratch(z, u));
        // STARTER: pg_allreduce_avg(z->pg, m->grads, m->n_params);  // as stage 1: every rank keeps all of it
        // END SOLUTION
    }
    z->comm_seconds += time_now() - t;
}

// TODO 3 (stage 2 and up): the end of unit u's reduce-scatter: wait for it (TODO 1b), then free the unit's full
//   gradient. Not before: the reduce-scatter may still be reading it (or its padded copy in unit_scratch(z, u)).
//   The step calls this after unit u-1's backward, which ran while the reduce-scatter travelled: so during a
//   backward TWO units' full gradients are alive, the one being computed and the one being reduce-scattered.
//   That is the price of the overlap: a peak of the largest two adjacent units' gradients instead of the
//   largest one's. KIT_OVERLAP=0 (z->overlap false) calls it right after unit u's own backward: one unit's.
// PyTorch: FSDP waits for the reduce-scatter stream before the optimizer step and frees the unsharded gradient
static void reduce_grads_finish(Zero *z, int u) {
    if (z->stage < ZERO_GRADS || !z->grad_work[u]) return;  // nothing in flight (ended already, or never started)
    double t = time_now();
    // BEGIN SOLUTION
    shard_reduce_scatter_finish(z->pg, &z->layout[u], z->grad_work[u], z->grad_shard[u]);
    z->grad_work[u] = NULL;
    model_release(z->units[u], MODEL_GRADS);
    // END SOLUTION
    z->comm_seconds += time_now() - t;
}

// Unit u's backward: dout is the gradient of its output (the loss's, or unit u+1's input gradient); its input
// is z->input_of[u], what unit_forward was given.
// TODO 5b (--recompute): its activations were freed after its forward: bring them back and run the forward
//   again from its input first (train mode: the batch statistics backward needs). A BN layer would update its
//   running statistics a second time: keep the unit's buffers (m->buffers, m->n_buffers floats) in z->bn_saved
//   before, put them back after.
// PyTorch: torch.utils.checkpoint.checkpoint(unit, x) (and its BN caveat)
static void unit_backward(Zero *z, int u, const float *dout, int n) {
    Model *m = z->units[u];
    const float *x = z->input_of[u];
    double t = trace_begin("backward unit");
    window_open(z, u);
    model_materialize(m, MODEL_GRADS);  // zeroed; a no-op when the stage keeps the full gradient
    // BEGIN SOLUTION
    if (z->recompute) {
        model_materialize(m, MODEL_ACTS);
        device_copy(z->device, z->bn_saved, m->buffers, m->n_buffers * F);
        model_forward(m, x, n, true);
        device_copy(z->device, m->buffers, z->bn_saved, m->n_buffers * F);
    }
    // END SOLUTION
    model_backward(m, x, dout, n);
    window_close(z, u);
    trace_endf(t, TRACE_COMPUTE, "backward unit %d", u);
    reduce_grads(z, u);
    if (!z->overlap) reduce_grads_finish(z, u);
}

// ---------------------------------------------------------------- the update (TODO 2, 4)

// TODO 2 (stages 1-2): the update of unit u when each rank keeps only its shard of the momentum
//   (velocity_shard[u]). Goal: after it, every rank holds the same weights DDP's update gives, bit for bit
//   (stage 1 is graded bitwise against lesson 03). Why it saves memory: a rank updates only the slice of the
//   unit it owns, so it needs the momentum of that slice only; the other ranks' slices then reach it by the
//   collective of TODO 1c. Decide: which floats of the unit's flat buffers are this rank's (TODO 1a's layout,
//   and where the real floats end), where the gradient of that slice is at stage 1 and at stage 2, how the update
//   knows which floats take weight decay (read zero_sgd_shard, given above), and why the all-gather cannot send
//   from the buffer it receives into. The kit calls: the hints (README, `make grade HINTS=full`).
// TODO 4c (stage 3): the shard is param_shard[u], the gradient grad_shard[u]: update it in place; nothing to
//   gather (the next forward's window does).
// PyTorch: ZeroRedundancyOptimizer.step() (its shard's update, then the broadcast of every rank's parameters)
static void unit_update(Zero *z, int u, const SgdConfig *opt) {
    Model *m = z->units[u];
    if (z->stage == ZERO_DDP) {
        optim_step(m, opt);
        return;
    }
    // BEGIN SOLUTION
    const ShardLayout *l = &z->layout[u];
    if (z->stage == ZERO_PARAMS && !m->params) {
        zero_sgd_shard(z, u, z->param_shard[u], z->grad_shard[u], z->velocity_shard[u], opt);
        return;
    }
    double t = time_now();
    const size_t off = (size_t)z->rank * l->shard;
    device_memset_zero(z->device, z->shard_work, l->shard * F);
    device_copy(z->device, z->shard_work, m->params + off, shard_valid(l, z->rank) * F);
    const float *grad = m->grads ? m->grads + off : z->grad_shard[u];
    zero_sgd_shard(z, u, z->shard_work, grad, z->velocity_shard[u], opt);
    shard_allgather(z->pg, l, z->shard_work, m->params, unit_scratch(z, u));
    z->comm_seconds += time_now() - t;
    // STARTER: optim_step(m, opt);  // every rank updates everything with the full momentum: lesson 03's update
    // END SOLUTION
}

// ---------------------------------------------------------------- the step

// The batch on the device: the loader's staged copy, else a copy into unit 0's input and z->labels.
static void batch_in(Zero *z, const Batch *b, const float **x, const int **y) {
    if (batch_on_device(b, z->device, x, y)) return;
    const Model *m0 = z->units[0];
    size_t image = (size_t)m0->in_c * m0->in_h * m0->in_w;
    device_copy_to(z->device, z->input, b->x, (size_t)b->n * image * F);
    device_copy_to(z->device, z->labels, b->y, (size_t)b->n * sizeof(int));
    *x = z->input, *y = z->labels;
}

// The loss of the last unit's logits into *r; its gradient (scaled by `scale`) into z->dlogits when train.
static void loss_of(Zero *z, const Batch *b, const float *logits, const int *y, float smoothing, float scale,
                    bool train, Metrics *r) {
    const Device d = z->device;
    const int n = b->n, k = z->classes;
    cross_entropy_forward(d, n, k, logits, y, smoothing, z->loss);
    argmax_rows(d, n, k, logits, z->pred);
    if (train) {
        device_memset_zero(d, z->dlogits, (size_t)n * k * F);  // cross_entropy_backward adds
        cross_entropy_backward(d, n, k, logits, y, smoothing, scale, z->dlogits);
    }
    device_copy_from(d, z->host_loss, z->loss, (size_t)n * F);
    device_copy_from(d, z->host_pred, z->pred, (size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        r->loss_sum += z->host_loss[i];
        r->correct += z->host_pred[i] == b->y[i];
    }
    r->count += n;
}

// Bytes this rank sends in one step, by the ring algorithms: an all-reduce of n floats sends 2 (world-1)/world n,
// a reduce-scatter or an all-gather of a padded buffer (world-1) shard.
static double step_bytes(const Zero *z) {
    double total = 0, w = z->world;
    for (int u = 0; u < z->n_units; u++) {
        double n = (double)z->layout[u].n, piece = (w - 1) * (double)z->layout[u].shard * F;
        if (z->stage == ZERO_DDP) total += 2 * (w - 1) / w * n * F;
        else if (z->stage == ZERO_OPTIM) total += 2 * (w - 1) / w * n * F + piece;  // all-reduce + all-gather
        else if (z->stage == ZERO_GRADS) total += 2 * piece;                      // reduce-scatter + all-gather
        else total += 3 * piece;  // all-gathers before forward and backward, reduce-scatter after backward
    }
    return total;
}

Metrics zero_step(Zero *z, const Batch *b, const SgdConfig *opt, float label_smoothing) {
    const double start = time_now(), comm_before = z->comm_seconds;
    const int n = b->n, U = z->n_units;
    const float *x;
    const int *y;
    batch_in(z, b, &x, &y);
    for (int u = 0; u < U; u++)
        if (z->units[u]->grads) model_zero_grad(z->units[u]);  // a released gradient comes back zeroed
    const float *h = x;
    for (int u = 0; u < U; u++) {
        z->input_of[u] = h;
        h = unit_forward(z, u, h, n, true);
    }
    Metrics r = {0, 0, 0};
    loss_of(z, b, h, y, label_smoothing, 1.0f / (float)n, true, &r);
    const float *dout = z->dlogits;
    for (int u = U - 1; u >= 0; u--) {
        unit_backward(z, u, dout, n);  // stages 2-3: unit u's reduce-scatter has started
        // TODO 3 (stage 2 and up, with the overlap): unit u+1's reduce-scatter ran during unit u's backward: end
        //   it now (reduce_grads_finish), and unit 0's once the loop is done, before the update reads the shards.
        // BEGIN SOLUTION
        if (z->overlap && u + 1 < U) reduce_grads_finish(z, u + 1);
        // END SOLUTION
        dout = model_input_grad(z->units[u]);
        // TODO 5c (--recompute): unit u+1's activations held its input gradient, which unit u's backward has
        //   just read: free them now (and unit 0's once the loop is done).
        // BEGIN SOLUTION
        if (z->recompute && u + 1 < U) model_release(z->units[u + 1], MODEL_ACTS);
        // END SOLUTION
    }
    // BEGIN SOLUTION
    if (z->recompute) model_release(z->units[0], MODEL_ACTS);
    if (z->overlap) reduce_grads_finish(z, 0);
    // END SOLUTION
    for (int u = 0; u < U; u++) unit_update(z, u, opt);
    // BN running statistics: rank 0's, as in lesson 03, so that evaluation sees one model everywhere.
    for (int u = 0; u < U; u++)
        if (z->units[u]->n_buffers > 0) pg_broadcast(z->pg, z->units[u]->buffers, z->units[u]->n_buffers, 0);
    z->bytes_sent += step_bytes(z);
    z->steps++;
    z->compute_seconds += (time_now() - start) - (z->comm_seconds - comm_before);
    return r;
}

// ---------------------------------------------------------------- evaluation, gathering, memory

// Stage 3 opens a window per unit, a collective: every rank runs as many batches as the rank with the most, the
// ranks with fewer opening and closing their windows without a batch.
Metrics zero_evaluate(Zero *z, Loader *test_loader) {
    loader_start_epoch(test_loader, 0, 0);
    double *counts = xcalloc((size_t)z->world, sizeof(double));
    counts[z->rank] = loader_batches_per_epoch(test_loader);
    pg_allreduce_sum_double_host(z->pg, counts, z->world);
    int most = 0;
    for (int r = 0; r < z->world; r++)
        if (counts[r] > most) most = (int)counts[r];
    free(counts);
    Metrics local = {0, 0, 0};
    for (int i = 0; i < most; i++) {
        const Batch *b = loader_next(test_loader, NULL);
        if (!b) {
            for (int u = 0; u < z->n_units; u++) window_open(z, u), window_close(z, u);
            continue;
        }
        const float *x;
        const int *y;
        batch_in(z, b, &x, &y);
        for (int u = 0; u < z->n_units; u++) x = unit_forward(z, u, x, b->n, false);
        loss_of(z, b, x, y, 0.0f, 0.0f, false, &local);
    }
    return ddp_global_metrics(z->pg, local);
}

void zero_gather_model(Zero *z, Model *full) {
    const Device d = z->device;
    for (int u = 0; u < z->n_units; u++) {
        Model *m = z->units[u];
        const ShardLayout *l = &z->layout[u];
        if (m->params) device_copy(d, full->params + m->param_base, m->params, m->n_params * F);
        else shard_allgather(z->pg, l, z->param_shard[u], full->params + m->param_base, unit_scratch(z, u));
        device_copy(d, full->buffers + m->buffer_base, m->buffers, m->n_buffers * F);
        if (!full->velocity) continue;
        if (m->velocity) device_copy(d, full->velocity + m->param_base, m->velocity, m->n_params * F);
        else shard_allgather(z->pg, l, z->velocity_shard[u], full->velocity + m->param_base, unit_scratch(z, u));
    }
}

void zero_print_memory(const Zero *z, FILE *out) {
    // Every rank's live and peak bytes per part, summed into rank 0's table (each rank fills its own row).
    const int W = z->world, cols = 2 * MEM_PARTS + 1;
    double *t = xcalloc((size_t)W * cols, sizeof(double));
    MemStats s = mem_stats();
    for (int p = 0; p < MEM_PARTS; p++) t[z->rank * cols + p] = s.live[p], t[z->rank * cols + MEM_PARTS + p] = s.peak[p];
    t[z->rank * cols + 2 * MEM_PARTS] = s.peak_total;
    pg_allreduce_sum_double_host(z->pg, t, W * cols);
    if (z->rank == 0) {
        double P = 0, S = 0, unit_max = 0, B = 0;
        for (int u = 0; u < z->n_units; u++) {
            P += (double)z->layout[u].n * F, S += (double)z->layout[u].shard * F, B += z->units[u]->n_buffers * F;
            if (z->layout[u].n * F > unit_max) unit_max = (double)z->layout[u].n * F;
        }
        const double MB = P >= 1e6 ? 1e6 : 1e3;  // kB for the small models, whose parameters are under 1 MB
        const char *unit = P >= 1e6 ? "MB" : "kB";
        fprintf(out, "memory (%s, per rank; zero=%d, %d units, world %d): live after step 1 / peak during it\n",
                unit, z->stage, z->n_units, W);
        fprintf(out, "  %-12s", "part");
        for (int r = 0; r < W; r++) fprintf(out, "  rank %-2d live       peak", r);
        fprintf(out, "   expected live (ZeRO accounting, fp32 SGD + momentum)\n");
        double expect[MEM_PARTS] = {0};
        expect[MEM_PARAMS] = (z->stage == ZERO_PARAMS ? S : P) + B;
        expect[MEM_GRADS] = z->stage >= ZERO_GRADS ? S : P;
        expect[MEM_OPTIM] = z->stage >= ZERO_OPTIM ? S : P;
        const char *how[MEM_PARTS] = {z->stage == ZERO_PARAMS ? "params/world + BN buffers (peak: + one unit)"
                                                              : "params + BN buffers",
                                      z->stage < ZERO_GRADS ? "params"
                                      : z->overlap ? "params/world (peak: + two adjacent units' full grads: the overlap)"
                                                   : "params/world (peak: + one unit's full grads)",
                                      z->stage >= ZERO_OPTIM ? "params/world (momentum)" : "params (momentum)",
                                      z->recompute ? "unit outputs + one unit's arena" : "every unit's arena",
                                      z->scratch_odd ? "scratch x 2 (the overlap)" : "scratch",
                                      "the loader's batches, conv's work on a GPU"};
        for (int p = 0; p < MEM_PARTS; p++) {
            fprintf(out, "  %-12s", mem_part_name((MemPart)p));
            for (int r = 0; r < W; r++) fprintf(out, "  %12.3f %10.3f", t[r * cols + p] / MB, t[r * cols + MEM_PARTS + p] / MB);
            if (p <= MEM_OPTIM) fprintf(out, "   %12.3f  %s\n", expect[p] / MB, how[p]);
            else fprintf(out, "   %12s  %s\n", "", how[p]);
        }
        fprintf(out, "  %-12s", "peak total");
        for (int r = 0; r < W; r++) fprintf(out, "  %23.3f", t[r * cols + 2 * MEM_PARTS] / MB);
        fprintf(out, "\n  params %.3f %s (%d units, largest %.3f %s); shards: %.3f %s per rank\n", P / MB, unit,
                z->n_units, unit_max / MB, unit, S / MB, unit);
    }
    free(t);
}
