// pipe.c: lesson 08, a model cut into stages: where to cut (TODO 1), the hand-offs across a cut (TODO 2) and
// the GPipe step (TODO 3). The stage runner (stage_forward, stage_backward: the kit's layer ops over a run of
// the layer table) is given, below the TODOs.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/ops.h"
#include "lesson.h"

bool pipe_cut_ok(const Model *m, int cut) {
    if (cut <= 0 || cut >= m->n_layers) return false;
    for (int j = cut; j < m->n_layers; j++) {
        const Layer *l = &m->layers[j];
        if (l->in < cut && l->in != cut - 1) return false;
        if (l->kind == LAYER_ADD && l->in2 < cut && l->in2 != cut - 1) return false;
    }
    return true;
}

// ---------------------------------------------------------------- TODO 1: where to cut

void pipe_layer_costs(const Model *m, BalanceRule rule, const double *seconds, double *cost) {
    // TODO 1a: one cost per layer. PARAMS balances what each stage must HOLD (weights, gradients, momentum:
    // memory); TIME balances what each stage must DO per step (the pipeline runs at its slowest stage's pace).
    (void)rule, (void)seconds;
    for (int i = 0; i < m->n_layers; i++) cost[i] = 0.0;
}

bool pipe_balance(const Model *m, const double *cost, int stages, int *first) {
    // TODO 1b: the contiguous split into `stages` stages, cut only where pipe_cut_ok, whose most expensive
    // stage is as cheap as possible. The layer count is small (at most MODEL_MAX_LAYERS): an exact method is
    // affordable (README section 2 suggests one), a greedy "fill up to the average" is not exact.
    (void)cost;
    if (stages < 1 || stages > m->n_layers) return false;
    for (int s = 0; s <= stages; s++) first[s] = 0;
    return true;
}

// ---------------------------------------------------------------- TODO 2: across the cut

void pipe_send_forward(Pipe *p, int s, int off, int n) {
    // TODO 2a: samples [off, off + n) of stage s's output become stage s+1's input. Both are laid out
    // (batch, features) with the same features per sample (next->in_floats), on two devices (pipe_copy).
    (void)p, (void)s, (void)off, (void)n;
}

void pipe_send_backward(Pipe *p, int s, int off, int n) {
    // TODO 2b: the way back: stage s+1's input gradient for those samples is stage s's output gradient.
    (void)p, (void)s, (void)off, (void)n;
}

// ---------------------------------------------------------------- TODO 3: the GPipe step

Metrics pipe_step(Pipe *p, const Batch *b, const SgdConfig *opt, float label_smoothing) {
    Metrics r = {0, 0, 0};
    pipe_load_batch(p, b);
    pipe_zero_grad(p);
    int M = p->micro_batches < b->n ? p->micro_batches : b->n;  // a short last batch may have fewer images
    // TODO 3: forward every micro-batch k (pipe_micro_range) through every stage, handing it across each cut,
    // and its loss on the last stage (pipe_loss) with the scale that makes the M micro-batches' gradients add up
    // to the gradient of the mean over the WHOLE batch; then backward every micro-batch through every stage
    // from the last, handing the gradient back across each cut; then one SGD step per stage.
    (void)M, (void)opt, (void)label_smoothing;
    p->steps++;
    return r;
}

// ---------------------------------------------------------------- given: building the stages

static float *floats_alloc(Device d, size_t n) {
    float *x = device_alloc(d, (n ? n : 1) * sizeof(float));
    device_memset_zero(d, x, (n ? n : 1) * sizeof(float));
    return x;
}

static size_t layer_floats(const Layer *l) { return (size_t)l->c * l->h * l->w; }

static Conv2dDims conv_dims(const Model *m, const Layer *l, int n) {
    int c = m->cfg.in_c, h = m->cfg.in_h, w = m->cfg.in_w;
    if (l->in >= 0) c = m->layers[l->in].c, h = m->layers[l->in].h, w = m->layers[l->in].w;
    Conv2dDims d = {.n = n, .c = c, .h = h, .w = w, .k = l->out_c, .r = l->ksize, .stride = l->stride, .pad = l->pad};
    return d;
}
static BatchNormDims bn_dims(const Layer *l, int n) {
    BatchNormDims d = {.n = n, .c = l->c, .hw = l->h * l->w, .eps = 1e-5f, .momentum = 0.1f};
    return d;
}

// The stage's slices of the flat parameter and buffer layouts: its layers' are contiguous (forward order).
static void stage_slices(Stage *st, const Model *m) {
    size_t p0 = SIZE_MAX, p1 = 0, b0 = SIZE_MAX, b1 = 0;
    for (int i = st->first; i < st->last; i++) {
        const Layer *l = &m->layers[i];
        if (l->param_count) {
            if (l->param_offset < p0) p0 = l->param_offset;
            if (l->param_offset + l->param_count > p1) p1 = l->param_offset + l->param_count;
        }
        if (l->kind == LAYER_BN) {
            const TensorView *mean = &m->buffer_views[l->running], *var = &m->buffer_views[l->running + 1];
            if (mean->offset < b0) b0 = mean->offset;
            if (var->offset + var->count > b1) b1 = var->offset + var->count;
        }
    }
    st->param_offset = p0 == SIZE_MAX ? 0 : p0, st->n_params = p0 == SIZE_MAX ? 0 : p1 - p0;
    st->buffer_offset = b0 == SIZE_MAX ? 0 : b0, st->n_buffers = b0 == SIZE_MAX ? 0 : b1 - b0;
}

static void stage_create(Stage *st, const Model *m, Device d, int first, int last, bool is_last, int max_batch) {
    memset(st, 0, sizeof *st);
    st->first = first, st->last = last, st->device = d;
    stage_slices(st, m);
    size_t B = (size_t)max_batch;
    st->params = floats_alloc(d, st->n_params);
    st->grads = floats_alloc(d, st->n_params);
    st->velocity = floats_alloc(d, st->n_params);
    st->buffers = floats_alloc(d, st->n_buffers);
    device_copy_to(d, st->params, m->params + st->param_offset, st->n_params * sizeof(float));
    device_copy_to(d, st->buffers, m->buffers + st->buffer_offset, st->n_buffers * sizeof(float));
    st->in_floats = first == 0 ? (size_t)m->cfg.in_c * m->cfg.in_h * m->cfg.in_w : layer_floats(&m->layers[first - 1]);
    st->input = floats_alloc(d, B * st->in_floats);
    st->dinput = first == 0 ? NULL : floats_alloc(d, B * st->in_floats);
    size_t work = 0;
    for (int i = first; i < last; i++) {
        const Layer *l = &m->layers[i];
        st->acts[i] = floats_alloc(d, B * layer_floats(l));
        st->dacts[i] = floats_alloc(d, B * layer_floats(l));
        size_t need = 0;
        if (l->kind == LAYER_CONV) {
            Conv2dDims cd = conv_dims(m, l, max_batch);
            need = conv2d_work_floats(d, &cd);
        } else if (l->kind == LAYER_BN) {
            BatchNormDims bd = bn_dims(l, max_batch);
            need = batchnorm_work_floats(d, &bd);
            st->saved_offset[i] = st->saved_floats;
            st->saved_floats += 2 * (size_t)l->c;  // mean, invstd
        }
        if (need > work) work = need;
    }
    st->saved = floats_alloc(d, PIPE_MAX_MICRO * st->saved_floats);
    st->work = floats_alloc(d, work);
    if (is_last) {
        st->labels = device_alloc(d, B * sizeof(int));
        st->loss = floats_alloc(d, B);
        st->pred = device_alloc(d, B * sizeof(int));
    }
}

static void stage_free(Stage *st) {
    Device d = st->device;
    float *bufs[] = {st->params, st->grads, st->velocity, st->buffers, st->input, st->dinput, st->saved, st->work,
                     st->loss};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) device_free(d, bufs[i]);
    for (int i = st->first; i < st->last; i++) device_free(d, st->acts[i]), device_free(d, st->dacts[i]);
    if (st->labels) device_free(d, st->labels);
    if (st->pred) device_free(d, st->pred);
}

Pipe *pipe_create(const Model *table, Device d, const int *first, int stages, int micro_batches, int max_batch) {
    CHECK(stages >= 1 && stages <= PIPE_MAX_STAGES, "--stages out of range");
    CHECK(micro_batches >= 1 && micro_batches <= PIPE_MAX_MICRO, "--micro-batches out of range");
    CHECK(first[0] == 0 && first[stages] == table->n_layers,
          "the stages must cover the layers from 0 to the end (TODO 1b: pipe_balance fills first[])");
    for (int s = 0; s < stages; s++) {
        CHECK(first[s] < first[s + 1], "a stage with no layer (TODO 1b: the cuts in first[] must increase)");
        CHECK(s == 0 || pipe_cut_ok(table, first[s]), "a cut where more than one activation crosses (pipe_cut_ok)");
    }
    Pipe *p = xcalloc(1, sizeof *p);
    p->table = table, p->n_stages = stages, p->micro_batches = micro_batches, p->max_batch = max_batch;
    for (int s = 0; s < stages; s++)
        stage_create(&p->stages[s], table, d, first[s], first[s + 1], s == stages - 1, max_batch);
    p->host_labels = xmalloc((size_t)max_batch * sizeof(int));
    p->host_loss = xmalloc((size_t)max_batch * sizeof(float));
    p->host_pred = xmalloc((size_t)max_batch * sizeof(int));
    return p;
}

Pipe *pipe_create_stage(const Model *table, Device d, const int *first, int stages, int s, int micro_batches,
                        int max_batch) {
    CHECK(s >= 0 && s < stages && stages <= PIPE_MAX_STAGES, "a stage outside the split");
    CHECK(micro_batches >= 1 && micro_batches <= PIPE_MAX_MICRO, "--micro-batches out of range");
    CHECK(first[s] < first[s + 1] && first[s + 1] <= table->n_layers && (s == 0 || pipe_cut_ok(table, first[s])),
          "not a stage of a valid split (TODO 1b: pipe_balance fills first[])");
    Pipe *p = xcalloc(1, sizeof *p);
    p->table = table, p->n_stages = 1, p->micro_batches = micro_batches, p->max_batch = max_batch;
    stage_create(&p->stages[0], table, d, first[s], first[s + 1], s == stages - 1, max_batch);
    p->host_labels = xmalloc((size_t)max_batch * sizeof(int));
    p->host_loss = xmalloc((size_t)max_batch * sizeof(float));
    p->host_pred = xmalloc((size_t)max_batch * sizeof(int));
    return p;
}

void pipe_free(Pipe *p) {
    if (!p) return;
    for (int s = 0; s < p->n_stages; s++) stage_free(&p->stages[s]);
    free(p->host_labels), free(p->host_loss), free(p->host_pred);
    free(p);
}

// ---------------------------------------------------------------- given: running a stage

float *stage_out(Stage *st) { return st->acts[st->last - 1]; }
float *stage_dout(Stage *st) { return st->dacts[st->last - 1]; }

// Activation idx for samples from `off`: the stage's own layer, or what came across the cut (stage 0: the images).
static float *act_at(Stage *st, const Model *m, int idx, int off) {
    if (idx < st->first) return st->input + (size_t)off * st->in_floats;
    return st->acts[idx] + (size_t)off * layer_floats(&m->layers[idx]);
}
static float *dact_at(Stage *st, const Model *m, int idx, int off) {
    if (idx < st->first) return st->dinput ? st->dinput + (size_t)off * st->in_floats : NULL;
    return st->dacts[idx] + (size_t)off * layer_floats(&m->layers[idx]);
}
static float *param_at(float *base, const Stage *st, const Model *m, int view) {
    return view < 0 ? NULL : base + (m->views[view].offset - st->param_offset);
}
static float *running_at(Stage *st, const Model *m, int view) {
    return st->buffers + (m->buffer_views[view].offset - st->buffer_offset);
}
static void in_shape(const Model *m, const Layer *l, int *c, int *h, int *w) {
    *c = m->cfg.in_c, *h = m->cfg.in_h, *w = m->cfg.in_w;
    if (l->in >= 0) *c = m->layers[l->in].c, *h = m->layers[l->in].h, *w = m->layers[l->in].w;
}

void stage_forward(Stage *st, const Model *m, int off, int n, int k, bool train) {
    Device d = st->device;
    for (int i = st->first; i < st->last; i++) {
        double t0 = time_now();
        const Layer *l = &m->layers[i];
        const float *in = act_at(st, m, l->in, off);
        float *out = act_at(st, m, i, off);
        int c, h, w;
        in_shape(m, l, &c, &h, &w);
        size_t count = (size_t)n * layer_floats(l);
        switch (l->kind) {
        case LAYER_CONV: {
            Conv2dDims cd = conv_dims(m, l, n);
            conv2d_forward(d, &cd, in, param_at(st->params, st, m, l->weight),
                           param_at(st->params, st, m, l->bias_view), out, st->work);
            break;
        }
        case LAYER_BN: {
            BatchNormDims bd = bn_dims(l, n);
            const float *gamma = param_at(st->params, st, m, l->weight);
            const float *beta = param_at(st->params, st, m, l->bias_view);
            float *rm = running_at(st, m, l->running), *rv = running_at(st, m, l->running + 1);
            float *mean = st->saved + (size_t)k * st->saved_floats + st->saved_offset[i], *invstd = mean + l->c;
            if (train) batchnorm_forward_train(d, &bd, in, gamma, beta, out, mean, invstd, rm, rv, NULL, st->work);
            else batchnorm_forward_eval(d, &bd, in, gamma, beta, rm, rv, out);
            break;
        }
        case LAYER_RELU: relu_forward(d, count, in, out); break;
        case LAYER_MAXPOOL: maxpool2_forward(d, n, c, h, w, in, out); break;
        case LAYER_ADD: add_forward(d, count, in, act_at(st, m, l->in2, off), out); break;
        case LAYER_AVGPOOL: avgpool_forward(d, n, c, h * w, in, out); break;
        case LAYER_LINEAR:
            linear_forward(d, n, c * h * w, l->out_c, in, param_at(st->params, st, m, l->weight),
                           param_at(st->params, st, m, l->bias_view), out);
            break;
        }
        device_synchronize(d);
        double dt = time_now() - t0;
        st->layer_seconds[i] += dt, st->seconds += dt;
    }
}

void stage_backward(Stage *st, const Model *m, int off, int n, int k) {
    Device d = st->device;
    // The ops ADD into activation gradients (a residual's input gets two shares): every slot of these samples
    // starts at zero, but the output gradient, which the caller has just written.
    for (int i = st->first; i < st->last - 1; i++)
        device_memset_zero(d, dact_at(st, m, i, off), (size_t)n * layer_floats(&m->layers[i]) * sizeof(float));
    if (st->dinput)
        device_memset_zero(d, dact_at(st, m, st->first - 1, off), (size_t)n * st->in_floats * sizeof(float));
    for (int i = st->last - 1; i >= st->first; i--) {
        double t0 = time_now();
        const Layer *l = &m->layers[i];
        const float *in = act_at(st, m, l->in, off), *out = act_at(st, m, i, off), *dy = dact_at(st, m, i, off);
        float *dx = dact_at(st, m, l->in, off);
        int c, h, w;
        in_shape(m, l, &c, &h, &w);
        size_t count = (size_t)n * layer_floats(l);
        float *dw = param_at(st->grads, st, m, l->weight), *db = param_at(st->grads, st, m, l->bias_view);
        switch (l->kind) {
        case LAYER_CONV: {
            Conv2dDims cd = conv_dims(m, l, n);
            conv2d_backward(d, &cd, in, param_at(st->params, st, m, l->weight), dy, dx, dw, db, st->work);
            break;
        }
        case LAYER_BN: {
            BatchNormDims bd = bn_dims(l, n);
            const float *mean = st->saved + (size_t)k * st->saved_floats + st->saved_offset[i], *invstd = mean + l->c;
            if (dx) batchnorm_backward(d, &bd, in, param_at(st->params, st, m, l->weight), mean, invstd, dy, dx, dw, db,
                                       NULL, st->work);
            break;
        }
        case LAYER_RELU:
            if (dx) relu_backward(d, count, out, dy, dx);
            break;
        case LAYER_MAXPOOL:
            if (dx) maxpool2_backward(d, n, c, h, w, in, out, dy, dx);
            break;
        case LAYER_ADD:
            if (dx) add_inplace(d, count, dx, dy);
            if (l->in2 >= 0) add_inplace(d, count, dact_at(st, m, l->in2, off), dy);
            break;
        case LAYER_AVGPOOL:
            if (dx) avgpool_backward(d, n, c, h * w, dy, dx);
            break;
        case LAYER_LINEAR:
            linear_backward(d, n, c * h * w, l->out_c, in, param_at(st->params, st, m, l->weight), dy, dx, dw, db);
            break;
        }
        device_synchronize(d);
        double dt = time_now() - t0;
        st->layer_seconds[i] += dt, st->seconds += dt;
    }
}

void pipe_copy(Device to, float *dst, Device from, const float *src, size_t n) {
    size_t bytes = n * sizeof(float);
    if (to == from) device_copy(to, dst, src, bytes);
    else if (from == DEVICE_CPU) device_copy_to(to, dst, src, bytes);
    else device_copy_from(from, dst, src, bytes);
}

void pipe_load_batch(Pipe *p, const Batch *b) {
    CHECK(b->n > 0 && b->n <= p->max_batch, "a batch larger than the pipe's max_batch (pipe_create)");
    Stage *s0 = &p->stages[0], *last = &p->stages[p->n_stages - 1];
    device_copy_to(s0->device, s0->input, b->x, (size_t)b->n * s0->in_floats * sizeof(float));
    device_copy_to(last->device, last->labels, b->y, (size_t)b->n * sizeof(int));
    memcpy(p->host_labels, b->y, (size_t)b->n * sizeof(int));
}

void pipe_loss(Pipe *p, int off, int n, float smoothing, float scale, Metrics *r) {
    Stage *st = &p->stages[p->n_stages - 1];
    Device d = st->device;
    int k = p->table->cfg.classes;
    const float *logits = stage_out(st) + (size_t)off * k;
    float *dlogits = stage_dout(st) + (size_t)off * k;
    cross_entropy_forward(d, n, k, logits, st->labels + off, smoothing, st->loss + off);
    argmax_rows(d, n, k, logits, st->pred + off);
    device_memset_zero(d, dlogits, (size_t)n * k * sizeof(float));  // cross_entropy_backward adds
    cross_entropy_backward(d, n, k, logits, st->labels + off, smoothing, scale, dlogits);
    device_copy_from(d, p->host_loss, st->loss + off, (size_t)n * sizeof(float));
    device_copy_from(d, p->host_pred, st->pred + off, (size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) {
        r->loss_sum += p->host_loss[i];
        r->correct += p->host_pred[i] == p->host_labels[off + i];
    }
    r->count += n;
}

void stage_optim_step(Stage *st, const Model *m, const SgdConfig *opt) {
    for (int v = 0; v < m->n_views; v++) {
        const TensorView *tv = &m->views[v];
        if (tv->offset < st->param_offset || tv->offset >= st->param_offset + st->n_params) continue;
        size_t at = tv->offset - st->param_offset;
        sgd_update(st->device, tv->count, st->params + at, st->grads + at, st->velocity + at, opt->lr, opt->momentum,
                   tv->decay ? opt->weight_decay : 0.0f, opt->nesterov);
    }
}

void pipe_zero_grad(Pipe *p) {
    for (int s = 0; s < p->n_stages; s++) {
        Stage *st = &p->stages[s];
        device_memset_zero(st->device, st->grads, (st->n_params ? st->n_params : 1) * sizeof(float));
    }
}

void pipe_micro_range(int n, int M, int k, int *off, int *size) {
    int base = n / M, extra = n % M;  // the first `extra` micro-batches take one image more
    *size = base + (k < extra);
    *off = k * base + (k < extra ? k : extra);
}

void pipe_measure_layers(const Model *table, Device d, int batch, int reps, double *seconds) {
    int first[2] = {0, table->n_layers};
    Pipe *p = pipe_create(table, d, first, 1, 1, batch);
    size_t image = p->stages[0].in_floats;
    Batch b = {.n = batch, .x = xmalloc((size_t)batch * image * sizeof(float)),
               .y = xmalloc((size_t)batch * sizeof(int))};
    for (size_t i = 0; i < (size_t)batch * image; i++) b.x[i] = (float)sin(0.37 * (double)i);
    for (int i = 0; i < batch; i++) b.y[i] = i % table->cfg.classes;
    for (int r = 0; r <= reps; r++) {
        if (r == 1) memset(p->stages[0].layer_seconds, 0, sizeof p->stages[0].layer_seconds);  // rep 0 warms up
        Metrics unused = {0, 0, 0};
        pipe_load_batch(p, &b);
        stage_forward(&p->stages[0], table, 0, batch, 0, true);
        pipe_loss(p, 0, batch, 0.0f, 1.0f / (float)batch, &unused);
        stage_backward(&p->stages[0], table, 0, batch, 0);
    }
    for (int i = 0; i < table->n_layers; i++) seconds[i] = p->stages[0].layer_seconds[i] / (reps > 0 ? reps : 1);
    free(b.x), free(b.y);
    pipe_free(p);
}

Metrics pipe_evaluate(Pipe *p, Loader *L) {
    Metrics r = {0, 0, 0};
    loader_start_epoch(L, 0, 0);
    const Batch *b;
    while ((b = loader_next(L, NULL)) != NULL) {
        pipe_load_batch(p, b);
        for (int s = 0; s < p->n_stages; s++) {
            stage_forward(&p->stages[s], p->table, 0, b->n, 0, false);
            if (s + 1 < p->n_stages) pipe_send_forward(p, s, 0, b->n);
        }
        pipe_loss(p, 0, b->n, 0.0f, 0.0f, &r);
    }
    return r;
}

void pipe_gather(const Pipe *p, Model *m) {
    for (int s = 0; s < p->n_stages; s++) {
        const Stage *st = &p->stages[s];
        device_copy_from(st->device, m->params + st->param_offset, st->params, st->n_params * sizeof(float));
        device_copy_from(st->device, m->buffers + st->buffer_offset, st->buffers, st->n_buffers * sizeof(float));
    }
}
