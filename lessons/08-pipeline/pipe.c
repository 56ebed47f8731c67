// pipe.c: lesson 08, a model cut into stages: where to cut (TODO 1), the hand-offs across a cut (TODO 2) and
// the GPipe step (TODO 3). The stage runner (stage_forward, stage_backward: the kit's model of the stage's layers,
// with a view of it per micro-batch in flight) is given, below the TODOs.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/device.h"
#include "kit/log.h"
#include "kit/ops.h"
#include "kit/trace.h"
#include "lesson.h"

// ---------------------------------------------------------------- TODO 1: where to cut

void pipe_layer_costs(const Model *m, BalanceRule rule, const double *seconds, double *cost) {
    // TODO 1a: one cost per layer. PARAMS balances what each stage must HOLD (weights, gradients, momentum:
    // memory); TIME balances what each stage must DO per step (the pipeline runs at its slowest stage's pace).
    (void)rule, (void)seconds;
    for (int i = 0; i < m->n_layers; i++) cost[i] = 0.0;
}

bool pipe_balance(const Model *m, const double *cost, int stages, int *first) {
    // TODO 1b: the contiguous split into `stages` stages, cut only where pipe_cut_ok. Core: any valid split
    // (every layer once, every stage non-empty; false when none exists). Why balance: the pipeline runs at its
    // slowest stage's pace, so the stretch goal is the split whose most expensive stage is as cheap as possible;
    // the layer count is small (at most MODEL_MAX_LAYERS), so an exact method is affordable (README section 2),
    // where "fill up to the average" is not exact.
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
//
// A stage is the kit's model of its layers (model_create_stage: the whole model's slice of parameters, run by
// the kit's layer ops) plus, per micro-batch in flight, a VIEW of it (model_create_view): the same weights and
// gradients, activations of its own. Around them, the stage's side of each cut for the whole batch: input and
// dinput (what crosses from and back to the stage before), out and dout (to and from the stage after).

static float *floats_alloc(Device d, size_t n) {
    float *x = device_alloc(d, (n ? n : 1) * sizeof(float));
    device_memset_zero(d, x, (n ? n : 1) * sizeof(float));
    return x;
}

static void stage_create(Stage *st, const Model *table, Device d, int first, int last, bool is_last, int max_batch,
                         int micro_batches) {
    memset(st, 0, sizeof *st);
    st->first = first, st->last = last, st->device = d;
    // Every view holds one micro-batch, at most ceil(max_batch / M) images; the owner runs evaluation in
    // pieces of that size.
    st->micro_rows = (max_batch + micro_batches - 1) / micro_batches;
    Model *o = st->owner = model_create_stage(&table->cfg, d, st->micro_rows, 0, first, last);
    st->param_offset = o->param_base, st->n_params = o->n_params;
    st->buffer_offset = o->buffer_base, st->n_buffers = o->n_buffers;
    st->params = o->params, st->grads = o->grads, st->velocity = o->velocity, st->buffers = o->buffers;
    device_copy_to(d, st->params, table->params + st->param_offset, st->n_params * sizeof(float));
    device_copy_to(d, st->buffers, table->buffers + st->buffer_offset, st->n_buffers * sizeof(float));
    size_t B = (size_t)max_batch;
    st->in_floats = (size_t)o->in_c * o->in_h * o->in_w;
    st->out_floats = stage_out_floats(st, table);
    st->input = floats_alloc(d, B * st->in_floats);
    st->dinput = first == 0 ? NULL : floats_alloc(d, B * st->in_floats);
    st->out = floats_alloc(d, B * st->out_floats);
    st->dout = floats_alloc(d, B * st->out_floats);
    for (int k = 0; k < PIPE_MAX_MICRO; k++) st->holds[k] = -1;
    if (is_last) {
        st->labels = device_alloc(d, B * sizeof(int));
        st->loss = floats_alloc(d, B);
        st->pred = device_alloc(d, B * sizeof(int));
    }
}

static void stage_free(Stage *st) {
    Device d = st->device;
    for (int v = 0; v < st->n_views; v++) model_free(st->views[v]);  // views before their owner
    model_free(st->owner);
    float *bufs[] = {st->input, st->dinput, st->out, st->dout, st->loss};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) device_free(d, bufs[i]);
    if (st->labels) device_free(d, st->labels);
    if (st->pred) device_free(d, st->pred);
}

static Pipe *pipe_alloc(const Model *table, int stages, int micro_batches, int max_batch) {
    CHECK(micro_batches >= 1 && micro_batches <= PIPE_MAX_MICRO, "--micro-batches out of range");
    Pipe *p = xcalloc(1, sizeof *p);
    p->table = table, p->n_stages = stages, p->micro_batches = micro_batches, p->max_batch = max_batch;
    p->host_labels = xmalloc((size_t)max_batch * sizeof(int));
    p->host_loss = xmalloc((size_t)max_batch * sizeof(float));
    p->host_pred = xmalloc((size_t)max_batch * sizeof(int));
    return p;
}

Pipe *pipe_create(const Model *table, Device d, const int *first, int stages, int micro_batches, int max_batch) {
    Device devices[PIPE_MAX_STAGES];
    for (int s = 0; s < stages && s < PIPE_MAX_STAGES; s++) devices[s] = d;
    return pipe_create_on(table, devices, first, stages, micro_batches, max_batch);
}

Pipe *pipe_create_on(const Model *table, const Device *devices, const int *first, int stages, int micro_batches,
                     int max_batch) {
    CHECK(stages >= 1 && stages <= PIPE_MAX_STAGES, "--stages out of range");
    CHECK(first[0] == 0 && first[stages] == table->n_layers,
          "the stages must cover the layers from 0 to the end (TODO 1b: pipe_balance fills first[])");
    for (int s = 0; s < stages; s++) {
        CHECK(first[s] < first[s + 1], "a stage with no layer (TODO 1b: the cuts in first[] must increase)");
        CHECK(s == 0 || pipe_cut_ok(table, first[s]), "a cut where more than one activation crosses (pipe_cut_ok)");
    }
    Pipe *p = pipe_alloc(table, stages, micro_batches, max_batch);
    for (int s = 0; s < stages; s++)
        stage_create(&p->stages[s], table, devices[s], first[s], first[s + 1], s == stages - 1, max_batch,
                     micro_batches);
    return p;
}

Pipe *pipe_create_stage(const Model *table, Device d, const int *first, int stages, int s, int micro_batches,
                        int max_batch) {
    CHECK(s >= 0 && s < stages && stages <= PIPE_MAX_STAGES, "a stage outside the split");
    CHECK(first[s] < first[s + 1] && first[s + 1] <= table->n_layers && (s == 0 || pipe_cut_ok(table, first[s])),
          "not a stage of a valid split (TODO 1b: pipe_balance fills first[])");
    Pipe *p = pipe_alloc(table, 1, micro_batches, max_batch);
    stage_create(&p->stages[0], table, d, first[s], first[s + 1], s == stages - 1, max_batch, micro_batches);
    return p;
}

void pipe_free(Pipe *p) {
    if (!p) return;
    for (int s = 0; s < p->n_stages; s++) stage_free(&p->stages[s]);
    free(p->host_labels), free(p->host_loss), free(p->host_pred);
    free(p);
}

// ---------------------------------------------------------------- given: running a stage

bool pipe_cut_ok(const Model *m, int cut) { return model_cut_ok(&m->cfg, cut); }

float *stage_out(Stage *st) { return st->out; }
float *stage_dout(Stage *st) { return st->dout; }

size_t stage_held_bytes(const Stage *st) {
    size_t bytes = 0;
    for (int v = 0; v < st->n_views; v++) bytes += model_device_bytes(st->views[v]);
    return bytes;
}

// The view that keeps micro-batch k from its forward to its backward: a free one, or a new one when every view
// holds a micro-batch still waiting for its backward (so a stage ends up with as many as it ever has in flight).
static Model *view_take(Stage *st, int k) {
    CHECK(k >= 0 && k < PIPE_MAX_MICRO, "a micro-batch index out of range");
    int v = 0;
    while (v < st->n_views && st->holds[v] >= 0) {
        if (st->holds[v] == k) die("micro-batch %d forward twice without its backward on the stage of layers %d..%d\n"
                                   "  HINT: each micro-batch goes forward once, then backward once, per step",
                                   k, st->first, st->last - 1);
        v++;
    }
    if (v == st->n_views) st->views[st->n_views++] = model_create_view(st->owner, st->micro_rows);
    st->holds[v] = k;
    return st->views[v];
}

static int view_of(const Stage *st, int k) {
    for (int v = 0; v < st->n_views; v++)
        if (st->holds[v] == k) return v;
    die("backward of micro-batch %d before its forward on the stage of layers %d..%d\n"
        "  HINT: stage_forward(.., k, true) keeps the activations that stage_backward(.., k) needs",
        k, st->first, st->last - 1);
}

void stage_forward(Stage *st, const Model *table, int off, int n, int k, bool train) {
    double t0 = time_now(), t = trace_begin("forward micro-batch");
    Device d = st->device;
    size_t fin = st->in_floats, fout = st->out_floats;
    (void)table;
    if (train) {
        CHECK(n <= st->micro_rows, "a micro-batch larger than max_batch / micro_batches (pipe_micro_range)");
        const float *y = model_forward(view_take(st, k), st->input + (size_t)off * fin, n, true);
        device_copy(d, st->out + (size_t)off * fout, y, (size_t)n * fout * sizeof(float));
    } else {  // evaluation: running statistics, every image on its own, so in pieces through the owner
        for (int at = off; at < off + n; at += st->micro_rows) {
            int rows = off + n - at < st->micro_rows ? off + n - at : st->micro_rows;
            const float *y = model_forward(st->owner, st->input + (size_t)at * fin, rows, false);
            device_copy(d, st->out + (size_t)at * fout, y, (size_t)rows * fout * sizeof(float));
        }
    }
    device_synchronize(d);
    st->seconds += time_now() - t0;
    trace_endf(t, TRACE_COMPUTE, "forward micro-batch %d (layers %d-%d)", k, st->first, st->last - 1);
}

void stage_backward(Stage *st, const Model *table, int off, int n, int k) {
    double t0 = time_now(), t = trace_begin("backward micro-batch");
    Device d = st->device;
    size_t fin = st->in_floats, fout = st->out_floats;
    (void)table;
    int v = view_of(st, k);
    model_backward(st->views[v], st->input + (size_t)off * fin, st->dout + (size_t)off * fout, n);
    if (st->dinput)
        device_copy(d, st->dinput + (size_t)off * fin, model_input_grad(st->views[v]), (size_t)n * fin * sizeof(float));
    st->holds[v] = -1;  // its activations are no longer needed: the view is free for the next micro-batch
    device_synchronize(d);
    st->seconds += time_now() - t0;
    trace_endf(t, TRACE_COMPUTE, "backward micro-batch %d (layers %d-%d)", k, st->first, st->last - 1);
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

void stage_optim_step(Stage *st, const Model *table, const SgdConfig *opt) {
    (void)table;
    optim_step(st->owner, opt);
}

// A step starts here (pipe_step, pipe_dist_load): its micro-batches start afresh, so every view is free again,
// even when the last step left some without their backward.
void pipe_zero_grad(Pipe *p) {
    for (int s = 0; s < p->n_stages; s++) {
        model_zero_grad(p->stages[s].owner);
        for (int v = 0; v < PIPE_MAX_MICRO; v++) p->stages[s].holds[v] = -1;
    }
}

void pipe_micro_range(int n, int M, int k, int *off, int *size) {
    int base = n / M, extra = n % M;  // the first `extra` micro-batches take one image more
    *size = base + (k < extra);
    *off = k * base + (k < extra ? k : extra);
}

// The kit runs a stage as a whole, so time is measured per SEGMENT: the layers between two places where a cut
// is allowed, each as a stage of its own on a synthetic batch. A segment's time goes to its first layer, the
// others get 0: a stage of any allowed split is whole segments, so its cost, the sum over its layers, is its
// segments' time.
void pipe_measure_layers(const Model *table, Device d, int batch, int reps, double *seconds) {
    int n = table->n_layers;
    for (int a = 0, b; a < n; a = b) {
        for (b = a + 1; b < n && !pipe_cut_ok(table, b); b++) continue;
        Model *m = model_create_stage(&table->cfg, d, batch, 0, a, b);
        const Layer *out = &table->layers[b - 1];
        size_t fin = (size_t)m->in_c * m->in_h * m->in_w, fout = (size_t)batch * out->c * out->h * out->w;
        size_t nx = (size_t)batch * fin, count = nx > fout ? nx : fout;
        float *host = xmalloc(count * sizeof(float));
        for (size_t i = 0; i < count; i++) host[i] = (float)sin(0.37 * (double)i);
        float *x = device_alloc(d, nx * sizeof(float)), *dy = device_alloc(d, fout * sizeof(float));
        device_copy_to(d, x, host, nx * sizeof(float));
        device_copy_to(d, dy, host, fout * sizeof(float));
        double t = 0.0;
        for (int r = 0; r <= reps; r++) {  // rep 0 warms up
            double t0 = time_now();
            model_forward(m, x, batch, true);
            model_backward(m, x, dy, batch);
            device_synchronize(d);
            if (r > 0) t += time_now() - t0;
        }
        for (int i = a; i < b; i++) seconds[i] = i == a ? t / (reps > 0 ? reps : 1) : 0.0;
        device_free(d, x), device_free(d, dy), free(host);
        model_free(m);
    }
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
