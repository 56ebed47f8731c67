// tests/test_model.c: the layer table, flat buffers and whole-network gradients of kit/model.c.
#include "tests/testutil.h"

#include <sys/wait.h>
#include <unistd.h>

#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"

static Model *make(const char *name, int width, int c, int hw, int batch, uint64_t seed) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, name, width, c, hw, hw, 10));
    return model_create(&cfg, DEVICE_CPU, batch, seed);
}

// Views tile the flat buffer exactly, in order, and the parameter count is the known formula.
static void test_views_tile_the_buffer(void **state) {
    Model *m = make("resnet9", 8, 3, 32, 2, 1);
    size_t next = 0;
    for (int i = 0; i < m->n_views; i++) {
        assert_int_equal(m->views[i].offset, next);
        next += m->views[i].count;
    }
    assert_int_equal(next, m->n_params);
    // ResNet-9 with width w: convs 3->w, w->2w, 2x(2w->2w), 2w->4w, 4w->8w, 2x(8w->8w), all 3x3 without bias,
    // a BN (2 per channel) after each, and a linear 8w->10 with bias.
    size_t w = 8, convs = 9 * (3 * w + w * 2 * w + 2 * (2 * w * 2 * w) + 2 * w * 4 * w + 4 * w * 8 * w + 2 * (8 * w * 8 * w));
    size_t bns = 2 * (w + 2 * w + 2 * 2 * w + 4 * w + 8 * w + 2 * 8 * w);
    assert_int_equal(m->n_params, convs + bns + 8 * w * 10 + 10);
    const TensorView *v = &m->views[m->layers[0].weight];
    assert_string_equal(v->name, "00.conv.weight");
    assert_int_equal(v->ndim, 4);
    assert_int_equal(v->shape[0], 8);
    assert_int_equal(v->shape[1], 3);
    assert_true(v->decay);
    v = &m->views[m->layers[1].weight];
    assert_string_equal(v->name, "01.bn.weight");
    assert_false(v->decay);
    model_free(m);
}

// Same seed, same numbers; another seed, other numbers; BN starts at scale 1, shift 0.
static void test_init_is_deterministic(void **state) {
    Model *a = make("tiny-bn", 0, 3, 32, 2, 5), *b = make("tiny-bn", 0, 3, 32, 2, 5), *c = make("tiny-bn", 0, 3, 32, 2, 6);
    assert_memory_equal(a->params, b->params, a->n_params * sizeof(float));
    assert_memory_not_equal(a->params, c->params, a->n_params * sizeof(float));
    const TensorView *g = &a->views[a->layers[1].weight], *bb = &a->views[a->layers[1].bias_view];
    assert_string_equal(g->name, "01.bn.weight");
    assert_string_equal(bb->name, "01.bn.bias");
    for (size_t i = 0; i < g->count; i++) {
        assert_true(a->params[g->offset + i] == 1.0f);
        assert_true(a->params[bb->offset + i] == 0.0f);
    }
    // Conv weights lie within PyTorch's bound 1/sqrt(fan_in) and are not all equal.
    const TensorView *w = &a->views[a->layers[0].weight];
    float bound = 1.0f / sqrtf(3 * 9), lo = 1, hi = -1;
    for (size_t i = 0; i < w->count; i++) {
        float x = a->params[w->offset + i];
        assert_true(fabsf(x) <= bound);
        lo = fminf(lo, x), hi = fmaxf(hi, x);
    }
    assert_true(hi - lo > bound);
    model_free(a), model_free(b), model_free(c);
}

static double batch_loss(Model *m, const float *x, const int *y, int n) {
    const float *logits = model_forward(m, x, n, true);
    float loss[8];
    cross_entropy_forward(DEVICE_CPU, n, 10, logits, y, 0.0f, loss);
    double s = 0;
    for (int i = 0; i < n; i++) s += loss[i];
    return s / n;
}

// The whole network's gradient (residual adds, BN, pooling, linear wired together) matches central finite
// differences of the loss for the parameters with the largest gradients. Each op is checked on its own in
// test_ops; this catches wiring mistakes (a residual share dropped, a gradient not accumulated).
// hw is the input size: at least 32 for resnet9, so its last stage still has 4x4 images; at 2x2 a BN over
// 16 values followed by ReLU is so kinked that float32 finite differences stop being a reference.
static void check_model_gradient(const char *name, int width, int hw) {
    enum { N = 4 };
    Model *m = make(name, width, 3, hw, N, 3);
    float *x = xmalloc(N * 3 * (size_t)hw * hw * sizeof(float));
    int y[N] = {1, 7, 3, 3};
    fill_uniform(x, N * 3 * (size_t)hw * hw, -2.0f, 2.0f, 9);
    const float *logits = model_forward(m, x, N, true);
    cross_entropy_forward(DEVICE_CPU, N, 10, logits, y, 0.0f, m->loss);
    memset(m->dlogits, 0, N * 10 * sizeof(float));
    cross_entropy_backward(DEVICE_CPU, N, 10, logits, y, 0.0f, 1.0f / N, m->dlogits);
    model_zero_grad(m);
    model_backward(m, x, m->dlogits, N);
    float *grad = xmalloc(m->n_params * sizeof(float));
    memcpy(grad, m->grads, m->n_params * sizeof(float));

    // One parameter per view: the one with the largest gradient (float32 differences need a sizeable signal).
    int checked = 0;
    for (int v = 0; v < m->n_views; v++) {
        const TensorView *tv = &m->views[v];
        size_t best = tv->offset;
        for (size_t i = tv->offset; i < tv->offset + tv->count; i++)
            if (fabsf(grad[i]) > fabsf(grad[best])) best = i;
        if (fabsf(grad[best]) < 1e-3f) continue;
        float keep = m->params[best], h = 1e-3f * fmaxf(1.0f, fabsf(keep));
        m->params[best] = keep + h;
        double up = batch_loss(m, x, y, N);
        m->params[best] = keep - h;
        double down = batch_loss(m, x, y, N);
        m->params[best] = keep;
        double fd = (up - down) / (2 * h);
        // Central differences with h = 1e-3 have O(h^2) curvature error (ReLU kinks make it larger) plus
        // float32 rounding of the loss (~3e-7 / h = 3e-4): a few percent at most, while a wiring bug is off
        // by 50% or more, or has the wrong sign.
        if (fabs(fd - grad[best]) > 0.05 * fabs(grad[best]) + 5e-4)
            fail_msg("%s: d loss / d %s[%zu]: backward %.6g, finite differences %.6g", name, tv->name,
                     best - tv->offset, grad[best], fd);
        checked++;
    }
    assert_true(checked >= m->n_views / 2);
    free(grad);
    free(x);
    model_free(m);
}

static void test_gradient_tiny(void **state) {
    check_model_gradient("tiny", 8, 16);
    check_model_gradient("tiny-bn", 8, 16);
    check_model_gradient("fmnist", 4, 16);
}
static void test_gradient_resnet9(void **state) { check_model_gradient("resnet9", 4, 32); }

// Eval mode uses the running statistics: it does not depend on the other samples of the batch.
static void test_eval_is_per_sample(void **state) {
    Model *m = make("tiny-bn", 0, 3, 32, 4, 2);
    float x[4 * 3 * 32 * 32];
    fill_uniform(x, sizeof x / sizeof x[0], -1, 1, 4);
    float all[40], one[10];
    memcpy(all, model_forward(m, x, 4, false), sizeof all);
    memcpy(one, model_forward(m, x + 3 * 3 * 32 * 32, 1, false), sizeof one);
    // Equal up to float rounding: a GEMM over 4 images may block (and so round) differently than over 1. Each
    // layer's sums have at most 72 terms (conv 2: 8 channels x 3 x 3), so every layer adds at most
    // gamma_72 = 4.3e-6 of its sum|terms|; through 4 such layers (conv, conv, average, linear) that is below
    // 2e-5 of the activations' scale. So the logits are compared against their largest one, at 1e-4; train
    // mode by mistake (batch statistics of 4 images instead of the running ones) changes them by O(1).
    double scale = 0.0;
    for (int i = 0; i < 10; i++) scale = fabs(one[i]) > scale ? fabs(one[i]) : scale;
    assert_close(all + 30, one, 10, 1e-4, scale);
    // Train mode normalises with the batch statistics: the same sample gives another output.
    float train_all[40];
    memcpy(train_all, model_forward(m, x, 4, true), sizeof train_all);
    assert_memory_not_equal(all, train_all, sizeof all);
    model_free(m);
}

// An inference model keeps its conv filters prepared (model_prepare_inference: Winograd's transformed filters, and
// filters packed for gemm_small where a layer's GEMMs have few columns). Its eval forward must be a training model's
// eval forward, alone and in a batch, after the weights change too. resnet9 at width 16 on 16 x 16 inputs has
// Winograd forwards on 16 x 16 and 8 x 8 maps (64 and 16 tiles: gemm_small at batch 1) and im2col ones on 4 x 4 and
// 2 x 2 maps (gemm_small up to 4 images). The two differ only in the order of each conv's sums, so they agree to
// rounding: each layer within twice its own bound (kit/WINOGRAD.md: about 1e-5 of its terms for C = 128; measured
// here about 1e-7 of the largest logit), compared at 1e-4 of the largest logit as test_eval_is_per_sample does. The
// prepared filters not following the weights (round 1, before model_prepare_inference) moves them by tens of %.
static void test_inference_model_matches_eval(void **state) {
    (void)state;
    ModelConfig cfg;
    assert_true(model_config(&cfg, "resnet9", 16, 3, 16, 16, 10));
    Model *train = model_create(&cfg, DEVICE_CPU, 3, 5), *inf = model_create_inference(&cfg, DEVICE_CPU, 3);
    assert_non_null(inf->prepared);  // some layer has prepared filters: the path under test is taken
    float x[3 * 3 * 16 * 16], a[30], b[30];
    fill_uniform(x, sizeof x / sizeof x[0], -1, 1, 6);
    for (int round = 0; round < 2; round++) {
        // Round 0: the training model's initial weights; round 1: all of them moved, running statistics included.
        if (round == 1)
            for (size_t i = 0; i < train->n_params; i++) train->params[i] *= 1.0f + 0.25f * ((float)(i % 7) - 3.0f) / 3.0f;
        for (size_t i = 0; i < train->n_buffers; i++) train->buffers[i] += round ? 0.01f * (float)(i % 5) : 0.0f;
        memcpy(inf->params, train->params, train->n_params * sizeof(float));
        memcpy(inf->buffers, train->buffers, train->n_buffers * sizeof(float));
        double scale = 0.0;
        if (round == 1) {  // before it is told: the prepared filters are still round 0's, and the logits show it
            memcpy(a, model_forward(train, x, 3, false), sizeof a);
            memcpy(b, model_forward(inf, x, 3, false), sizeof b);
            for (int i = 0; i < 30; i++) scale = fabs(a[i]) > scale ? fabs(a[i]) : scale;
            assert_true(max_rel_error(b, a, 30, scale) > 1e-2);
        }
        model_prepare_inference(inf);
        for (int n = 1; n <= 3; n += 2) {
            memcpy(a, model_forward(train, x, n, false), (size_t)n * 10 * sizeof(float));
            memcpy(b, model_forward(inf, x, n, false), (size_t)n * 10 * sizeof(float));
            scale = 0.0;
            for (int i = 0; i < n * 10; i++) scale = fabs(a[i]) > scale ? fabs(a[i]) : scale;
            print_message("round %d, batch %d: inference against eval: %.2g of the largest logit\n", round, n,
                          max_rel_error(b, a, (size_t)n * 10, scale));
            assert_close(b, a, (size_t)n * 10, 1e-4, scale);
        }
    }
    model_free(train);
    model_free(inf);
}

// The gradient-ready hook reports every parameter exactly once, from the end of the buffer to the start.
typedef struct {
    size_t next_end;
    size_t covered;
} HookLog;
static void record_ready(void *ctx, size_t offset, size_t count) {
    HookLog *h = ctx;
    assert_int_equal(offset + count, h->next_end);
    h->next_end = offset;
    h->covered += count;
}
static void test_grads_ready_hook_order(void **state) {
    Model *m = make("resnet9", 4, 3, 16, 2, 1);
    HookLog log = {m->n_params, 0};
    m->on_grads_ready = record_ready;
    m->on_grads_ready_ctx = &log;
    float x[2 * 3 * 16 * 16];
    fill_uniform(x, sizeof x / sizeof x[0], -1, 1, 1);
    model_forward(m, x, 2, true);
    fill_uniform(m->dlogits, 20, -1, 1, 2);
    model_zero_grad(m);
    model_backward(m, x, m->dlogits, 2);
    assert_int_equal(log.covered, m->n_params);
    assert_int_equal(log.next_end, 0);
    model_free(m);
}

// Weight decay reaches conv/linear weights only: with a zero gradient, BN and biases do not move.
static void test_weight_decay_only_on_weights(void **state) {
    Model *m = make("tiny-bn", 0, 3, 32, 2, 1);
    float *before = xmalloc(m->n_params * sizeof(float));
    memcpy(before, m->params, m->n_params * sizeof(float));
    model_zero_grad(m);
    SgdConfig opt = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.1f, .nesterov = false};
    optim_step(m, &opt);
    for (int v = 0; v < m->n_views; v++) {
        const TensorView *tv = &m->views[v];
        for (size_t i = tv->offset; i < tv->offset + tv->count; i++) {
            // p - lr * (wd * p) with v = 0 and g = 0: 3 roundings here and 2 in the reference's p * (1 - 0.01f),
            // each at most u = 2^-24 of a number no larger than |p|.
            if (tv->decay) assert_true(fabsf(m->params[i] - before[i] * (1 - 0.01f)) <= 5 * 0x1p-24 * fabsf(before[i]));
            else assert_true(m->params[i] == before[i]);
        }
    }
    free(before);
    model_free(m);
}

// Schedules: a few float operations on numbers of at most 0.4, so |error| <= a few u x 0.4 < 1e-7 (1e-6 where
// a cosine or a division by the step count enters); a wrong warmup or decay is off by 0.05 or more.
static void test_schedule(void **state) {
    LrSchedule s = {.peak_lr = 0.4f, .warmup_steps = 4, .total_steps = 14, .final_lr = 0.0f, .decay = DECAY_LINEAR};
    assert_float_equal(lr_at(&s, 0), 0.1f, 1e-7);
    assert_float_equal(lr_at(&s, 3), 0.4f, 1e-7);
    assert_float_equal(lr_at(&s, 9), 0.2f, 1e-6);
    assert_float_equal(lr_at(&s, 14), 0.0f, 1e-7);
    assert_float_equal(lr_at(&s, 100), 0.0f, 1e-7);
    s.decay = DECAY_COSINE;
    assert_float_equal(lr_at(&s, 9), 0.2f, 1e-6);  // cosine passes the midpoint at half the peak
    assert_true(lr_at(&s, 6) > 0.3f);              // and stays high longer than linear early on
    s.decay = DECAY_NONE;
    assert_float_equal(lr_at(&s, 12), 0.4f, 1e-7);
}

// The memory plan (kit/model.c, plan_memory: in-place ReLU, fused BN + ReLU, gradient slots reused and
// zeroed when they come alive) must not change a single number. The reference below runs the same layer
// table the plain way: every activation and every gradient in its own zeroed buffer, the unfused ops, in
// the same order with the same arguments. Same float operations in the same order: the logits, parameter
// gradients and running statistics must be equal BIT FOR BIT (no tolerance to derive). Two steps on
// different batches catch a gradient slot that is not re-zeroed.
typedef struct {
    float **act, **grad;
} PlainRun;

static const float *plain_act(const PlainRun *p, int idx, const float *x) { return idx < 0 ? x : p->act[idx]; }

// dlogits NULL: eval mode, forward only.
static void plain_step(Model *m, PlainRun *p, const float *x, int n, const float *dlogits) {
    const Device d = DEVICE_CPU;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        const float *in = plain_act(p, l->in, x);
        int c = m->cfg.in_c, h = m->cfg.in_h, w = m->cfg.in_w;
        if (l->in >= 0) c = m->layers[l->in].c, h = m->layers[l->in].h, w = m->layers[l->in].w;
        const size_t count = (size_t)n * l->c * l->h * l->w;
        const float *wt = l->weight >= 0 ? m->params + m->views[l->weight].offset : NULL;
        const float *bias = l->bias_view >= 0 ? m->params + m->views[l->bias_view].offset : NULL;
        Conv2dDims cd = {n, c, h, w, l->out_c, l->ksize, l->stride, l->pad};
        BatchNormDims bd = {.n = n, .c = l->c, .hw = l->h * l->w, .eps = 1e-5f, .momentum = 0.1f};
        float *saved = m->saved + l->saved_offset, *running = m->buffers;
        switch (l->kind) {
        case LAYER_CONV: conv2d_forward(d, &cd, in, wt, bias, p->act[i], m->work); break;
        case LAYER_BN: {
            float *rm = running + m->buffer_views[l->running].offset;
            float *rv = running + m->buffer_views[l->running + 1].offset;
            if (dlogits) batchnorm_forward_train(d, &bd, in, wt, bias, p->act[i], saved, saved + l->c, rm, rv, NULL, m->work);
            else batchnorm_forward_eval(d, &bd, in, wt, bias, rm, rv, p->act[i]);
            break;
        }
        case LAYER_RELU: relu_forward(d, count, in, p->act[i]); break;
        case LAYER_MAXPOOL: maxpool2_forward(d, n, c, h, w, in, p->act[i]); break;
        case LAYER_ADD: add_forward(d, count, in, plain_act(p, l->in2, x), p->act[i]); break;
        case LAYER_AVGPOOL: avgpool_forward(d, n, c, h * w, in, p->act[i]); break;
        case LAYER_LINEAR: linear_forward(d, n, c * h * w, l->out_c, in, wt, bias, p->act[i]); break;
        }
    }
    if (!dlogits) return;
    for (int i = 0; i < m->n_layers; i++)
        memset(p->grad[i], 0, (size_t)n * m->layers[i].c * m->layers[i].h * m->layers[i].w * sizeof(float));
    memcpy(p->grad[m->n_layers - 1], dlogits, (size_t)n * m->cfg.classes * sizeof(float));
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const Layer *l = &m->layers[i];
        const float *in = plain_act(p, l->in, x), *dy = p->grad[i];
        float *dx = l->in >= 0 ? p->grad[l->in] : NULL;
        int c = m->cfg.in_c, h = m->cfg.in_h, w = m->cfg.in_w;
        if (l->in >= 0) c = m->layers[l->in].c, h = m->layers[l->in].h, w = m->layers[l->in].w;
        const size_t count = (size_t)n * l->c * l->h * l->w;
        const float *wt = l->weight >= 0 ? m->params + m->views[l->weight].offset : NULL;
        float *gw = l->weight >= 0 ? m->grads + m->views[l->weight].offset : NULL;
        float *gb = l->bias_view >= 0 ? m->grads + m->views[l->bias_view].offset : NULL;
        Conv2dDims cd = {n, c, h, w, l->out_c, l->ksize, l->stride, l->pad};
        BatchNormDims bd = {.n = n, .c = l->c, .hw = l->h * l->w, .eps = 1e-5f, .momentum = 0.1f};
        const float *saved = m->saved + l->saved_offset;
        switch (l->kind) {
        case LAYER_CONV: conv2d_backward(d, &cd, in, wt, dy, dx, gw, gb, m->work); break;
        case LAYER_BN:
            batchnorm_backward(d, &bd, in, wt, saved, saved + l->c, dy, dx, gw, gb, NULL, m->work);
            break;
        case LAYER_RELU: relu_backward(d, count, p->act[i], dy, dx); break;
        case LAYER_MAXPOOL: maxpool2_backward(d, n, c, h, w, in, p->act[i], dy, dx); break;
        case LAYER_ADD:
            if (dx) add_inplace(d, count, dx, dy);
            if (l->in2 >= 0) add_inplace(d, count, p->grad[l->in2], dy);
            break;
        case LAYER_AVGPOOL:
            if (dx) avgpool_backward(d, n, c, h * w, dy, dx);
            break;
        case LAYER_LINEAR: linear_backward(d, n, c * h * w, l->out_c, in, wt, dy, dx, gw, gb); break;
        }
    }
}

static void check_plan_matches_plain(const char *name, int width, int hw, bool expect_fusion) {
    enum { N = 4 };
    Model *m = make(name, width, 3, hw, N, 5), *ref = make(name, width, 3, hw, N, 5);
    PlainRun p = {xmalloc(m->n_layers * sizeof(float *)), xmalloc(m->n_layers * sizeof(float *))};
    size_t every = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const size_t size = (size_t)m->layers[i].c * m->layers[i].h * m->layers[i].w;
        p.act[i] = xmalloc(N * size * sizeof(float)), p.grad[i] = xmalloc(N * size * sizeof(float));
        every += size;
    }
    // The plan really saves memory: some ReLU shares its input's slot, gradient slots are reused.
    assert_true(m->act_floats_per_sample < every);
    assert_true(m->grad_floats_per_sample < every);
    bool fused = false, in_place = false;
    for (int i = 0; i < m->n_layers; i++) fused |= m->layers[i].fused_relu, in_place |= m->layers[i].grad_in_place;
    assert_true(fused == expect_fusion);
    assert_true(in_place == expect_fusion);  // a conv -> BN -> ReLU chain: BN's dx overwrites the ReLU's dy

    const size_t nx = N * 3 * (size_t)hw * hw;
    float *x = xmalloc(nx * sizeof(float)), *dlogits = xmalloc(N * 10 * sizeof(float));
    for (int step = 0; step < 2; step++) {
        fill_uniform(x, nx, -2.0f, 2.0f, 20 + step);
        fill_uniform(dlogits, N * 10, -1.0f, 1.0f, 30 + step);
        const float *logits = model_forward(m, x, N, true);
        model_zero_grad(m);
        model_backward(m, x, dlogits, N);
        model_zero_grad(ref);
        plain_step(ref, &p, x, N, dlogits);
        assert_memory_equal(logits, p.act[m->n_layers - 1], N * 10 * sizeof(float));
        assert_memory_equal(m->grads, ref->grads, m->n_params * sizeof(float));
        assert_memory_equal(m->buffers, ref->buffers, m->n_buffers * sizeof(float));
    }
    // Eval mode: the unfused BN (running statistics) and the in-place ReLU.
    const float *logits = model_forward(m, x, N, false);
    plain_step(ref, &p, x, N, NULL);
    assert_memory_equal(logits, p.act[m->n_layers - 1], N * 10 * sizeof(float));
    for (int i = 0; i < m->n_layers; i++) free(p.act[i]), free(p.grad[i]);
    free(p.act), free(p.grad), free(x), free(dlogits);
    model_free(m), model_free(ref);
}

static void test_memory_plan_matches_plain(void **state) {
    check_plan_matches_plain("tiny", 8, 16, false);  // conv -> ReLU in place, no BN to fuse
    check_plan_matches_plain("tiny-bn", 8, 16, true);
    check_plan_matches_plain("fmnist", 4, 16, true);
    check_plan_matches_plain("resnet9", 4, 32, true);  // residual adds: a gradient with two writers
}

// ---------------------------------------------------------------- stages and views (model_create_stage, _view)

// Every architecture of the table, small: width 8, 16x16 images. ResNet-9's last BN still has 2x2 maps, and its
// 16- and 32-channel convs on 8x8 maps take the Winograd path both ways (kit/winograd.c), the others im2col.
enum { STAGE_N = 4, STAGE_HW = 16, STAGE_WIDTH = 8, STAGE_SEED = 11 };

static ModelConfig stage_config(const char *name) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, name, STAGE_WIDTH, 3, STAGE_HW, STAGE_HW, 10));
    return cfg;
}

// Calls fn for every name model_names() lists: a new architecture is covered without editing the tests.
static void for_each_model(void (*fn)(const char *name)) {
    char names[128];
    snprintf(names, sizeof names, "%s", model_names());
    int count = 0;
    for (char *save = NULL, *name = strtok_r(names, "|", &save); name; name = strtok_r(NULL, "|", &save)) {
        fn(name);
        count++;
    }
    assert_true(count >= 4);
}

static size_t act_floats(const Model *m, int layer) {
    const Layer *l = &m->layers[layer];
    return (size_t)l->c * l->h * l->w;
}

// The whole model's numbers for two training steps on two batches (no update in between, gradients zeroed):
// logits, parameter gradients and running statistics after each, the eval-mode logits after both, and every
// activation's gradient from the plain run (test_memory_plan_matches_plain: it gives the planned model's numbers
// bit for bit; the planned model keeps no gradient after its last reader, and never stores a fused BN's).
typedef struct {
    float *x[2], *dlogits[2];
    float *logits[2], *grads[2], *buffers[2], *eval_logits;
    PlainRun plain[2];
} WholeRun;

static WholeRun whole_run(Model *whole, Model *ref) {
    WholeRun r;
    const int L = whole->n_layers;
    const size_t nx = STAGE_N * 3 * (size_t)STAGE_HW * STAGE_HW, nl = STAGE_N * 10;
    for (int step = 0; step < 2; step++) {
        r.x[step] = xmalloc(nx * sizeof(float)), r.dlogits[step] = xmalloc(nl * sizeof(float));
        fill_uniform(r.x[step], nx, -2.0f, 2.0f, 40 + step);
        fill_uniform(r.dlogits[step], nl, -1.0f, 1.0f, 50 + step);
        r.logits[step] = xmalloc(nl * sizeof(float));
        memcpy(r.logits[step], model_forward(whole, r.x[step], STAGE_N, true), nl * sizeof(float));
        model_zero_grad(whole);
        model_backward(whole, r.x[step], r.dlogits[step], STAGE_N);
        r.grads[step] = xmalloc(whole->n_params * sizeof(float) + 1);
        r.buffers[step] = xmalloc(whole->n_buffers * sizeof(float) + 1);
        memcpy(r.grads[step], whole->grads, whole->n_params * sizeof(float));
        memcpy(r.buffers[step], whole->buffers, whole->n_buffers * sizeof(float));
        PlainRun *p = &r.plain[step];
        p->act = xmalloc(L * sizeof(float *)), p->grad = xmalloc(L * sizeof(float *));
        for (int i = 0; i < L; i++) {
            p->act[i] = xmalloc(STAGE_N * act_floats(ref, i) * sizeof(float));
            p->grad[i] = xmalloc(STAGE_N * act_floats(ref, i) * sizeof(float));
        }
        model_zero_grad(ref);
        plain_step(ref, p, r.x[step], STAGE_N, r.dlogits[step]);
        assert_memory_equal(ref->grads, whole->grads, whole->n_params * sizeof(float));
    }
    r.eval_logits = xmalloc(nl * sizeof(float));
    memcpy(r.eval_logits, model_forward(whole, r.x[0], STAGE_N, false), nl * sizeof(float));
    return r;
}

static void whole_run_free(WholeRun *r, int layers) {
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < layers; i++) free(r->plain[step].act[i]), free(r->plain[step].grad[i]);
        free(r->plain[step].act), free(r->plain[step].grad);
        free(r->x[step]), free(r->dlogits[step]), free(r->logits[step]), free(r->grads[step]), free(r->buffers[step]);
    }
    free(r->eval_logits);
}

// A stage's slices are the whole model's: same tensor names, shapes and order, offsets shifted by the base, and
// (same seed) the same initial parameters and running statistics. whole: as model_create made it.
static void check_stage_layout(const Model *st, const Model *whole) {
    int v0 = 0;
    while (v0 < whole->n_views && whole->views[v0].offset < st->param_base) v0++;
    assert_true(v0 + st->n_views <= whole->n_views);
    for (int v = 0; v < st->n_views; v++) {
        const TensorView *a = &st->views[v], *b = &whole->views[v0 + v];
        assert_string_equal(a->name, b->name);
        assert_int_equal(st->param_base + a->offset, b->offset);
        assert_int_equal(a->count, b->count);
        assert_int_equal(a->decay, b->decay);
    }
    assert_memory_equal(st->params, whole->params + st->param_base, st->n_params * sizeof(float));
    assert_memory_equal(st->buffers, whole->buffers + st->buffer_base, st->n_buffers * sizeof(float));
}

// Stage [0, cut) then stage [cut, L), forward then backward with the same dlogits, against the whole model.
// Exact, BIT FOR BIT: every layer runs the same op on the same values with the same shapes (n, c, h, w) as in
// the whole model, and the hand-off across the cut is a copy. What differs is only where things live (the
// arena), which never changes a number, and three details, each exact:
//   - the layer before the cut is no longer in-place/fused with the one after it: a BN at the end of stage 0
//     and a ReLU at the start of stage 1 run unfused (kit/ops.h: the fused BN + ReLU gives bit for bit what the
//     two ops give), a ReLU after the cut gets its own buffer (the same values);
//   - the input gradient is zeroed and then accumulated by the same consumers in the same order (backward goes
//     from the last layer down in both), like the whole model's gradient slot for layer cut-1's output;
//   - stage 1's first layer also computes its input gradient, which the whole model's layer cut did too (only
//     the image's gradient is ever skipped), and no op's parameter gradient depends on whether dx is wanted.
static void check_cut(const ModelConfig *cfg, const Model *whole, const WholeRun *r, int cut) {
    const int L = whole->n_layers;
    Model *s0 = model_create_stage(cfg, DEVICE_CPU, STAGE_N, STAGE_SEED, 0, cut);
    Model *s1 = model_create_stage(cfg, DEVICE_CPU, STAGE_N, STAGE_SEED, cut, L);
    assert_int_equal(s0->n_layers + s1->n_layers, L);
    assert_int_equal(s0->param_base, 0);
    assert_int_equal(s1->param_base, s0->n_params);
    assert_int_equal(s0->n_params + s1->n_params, whole->n_params);
    assert_int_equal(s1->buffer_base, s0->n_buffers);
    assert_int_equal(s0->n_buffers + s1->n_buffers, whole->n_buffers);
    const size_t crossing = act_floats(whole, cut - 1);
    assert_int_equal((size_t)s1->in_c * s1->in_h * s1->in_w, crossing);
    check_stage_layout(s0, whole);
    check_stage_layout(s1, whole);
    assert_null(model_input_grad(s0));  // the image's gradient: not computed

    for (int step = 0; step < 2; step++) {
        const float *out0 = model_forward(s0, r->x[step], STAGE_N, true);
        memcpy(s1->input, out0, STAGE_N * crossing * sizeof(float));  // across the cut
        const float *logits = model_forward(s1, s1->input, STAGE_N, true);
        assert_memory_equal(logits, r->logits[step], STAGE_N * 10 * sizeof(float));
        model_zero_grad(s0), model_zero_grad(s1);
        model_backward(s1, s1->input, r->dlogits[step], STAGE_N);
        // The gradient at the cut: the whole model's gradient of layer cut-1's output.
        assert_memory_equal(model_input_grad(s1), r->plain[step].grad[cut - 1], STAGE_N * crossing * sizeof(float));
        memcpy(s0->dlogits, model_input_grad(s1), STAGE_N * crossing * sizeof(float));  // back across the cut
        model_backward(s0, r->x[step], s0->dlogits, STAGE_N);
        assert_memory_equal(s0->grads, r->grads[step], s0->n_params * sizeof(float));
        assert_memory_equal(s1->grads, r->grads[step] + s1->param_base, s1->n_params * sizeof(float));
        assert_memory_equal(s0->buffers, r->buffers[step], s0->n_buffers * sizeof(float));
        assert_memory_equal(s1->buffers, r->buffers[step] + s1->buffer_base, s1->n_buffers * sizeof(float));
    }
    // Eval mode (BN with those running statistics; the ReLUs in place, none fused).
    memcpy(s1->input, model_forward(s0, r->x[0], STAGE_N, false), STAGE_N * crossing * sizeof(float));
    assert_memory_equal(model_forward(s1, s1->input, STAGE_N, false), r->eval_logits, STAGE_N * 10 * sizeof(float));
    model_free(s0), model_free(s1);
}

static void check_stages_of(const char *name) {
    const ModelConfig cfg = stage_config(name);
    Model *whole = model_create(&cfg, DEVICE_CPU, STAGE_N, STAGE_SEED);
    Model *ref = model_create(&cfg, DEVICE_CPU, STAGE_N, STAGE_SEED);
    const int L = whole->n_layers;
    WholeRun r = whole_run(whole, ref);
    Model *fresh = model_create(&cfg, DEVICE_CPU, 1, STAGE_SEED);  // the initial values, for the layouts
    // The whole range is a stage too: the whole model.
    Model *all = model_create_stage(&cfg, DEVICE_CPU, STAGE_N, STAGE_SEED, 0, L);
    assert_int_equal(all->n_params, whole->n_params);
    check_stage_layout(all, fresh);
    model_free(all);
    int cuts = 0;
    for (int cut = 1; cut < L; cut++) {
        if (!model_cut_ok(&cfg, cut)) continue;
        check_cut(&cfg, fresh, &r, cut);
        cuts++;
    }
    // Every cut of a chain is allowed; ResNet-9 loses the 6 inside each of its 2 residual blocks (after the
    // block's first layer up to its add: the skip connection crosses them).
    assert_int_equal(cuts, strcmp(name, "resnet9") == 0 ? L - 1 - 2 * 6 : L - 1);
    whole_run_free(&r, L);
    model_free(whole), model_free(ref), model_free(fresh);
}

static void test_stages_equal_whole(void **state) { for_each_model(check_stages_of); }

// Two views of one stage, each with half the batch in flight at once, in GPipe's order: forward A, forward B,
// backward B, backward A. Against one model (the same stage, same seed) running the halves one after the other:
//   - gradients: B's half then A's (forward + backward each), the order in which the views' backward passes
//     ADD into the shared gradients. Each half's gradient is computed from that half's own activations, BN
//     batch statistics included, with the same ops and shapes, and added into the same running sum in the same
//     order: equal BIT FOR BIT. (In another order they would agree only to rounding: a GEMM that accumulates
//     into dW adds its partial sums in a different association. Against ONE pass over the whole batch they
//     differ even in exact arithmetic with BN: its statistics are per half here.)
//   - running statistics: A's half then B's, the order of the views' forward passes: bit for bit too;
//   - each view's input gradient: the reference's after the backward of the same half.
static void check_views_of(const char *name) {
    enum { H = STAGE_N / 2 };
    const ModelConfig cfg = stage_config(name);
    const int first = 1;  // after the first conv: every architecture allows it, and the rest is one stage
    assert_true(model_cut_ok(&cfg, first));
    Model *whole = model_create(&cfg, DEVICE_CPU, 1, STAGE_SEED);
    const int L = whole->n_layers;
    model_free(whole);
    Model *owner = model_create_stage(&cfg, DEVICE_CPU, STAGE_N, STAGE_SEED, first, L);
    Model *grads_ref = model_create_stage(&cfg, DEVICE_CPU, H, STAGE_SEED, first, L);
    Model *stats_ref = model_create_stage(&cfg, DEVICE_CPU, H, STAGE_SEED, first, L);
    Model *a = model_create_view(owner, H), *b = model_create_view(owner, H);
    assert_ptr_equal(a->params, owner->params);
    assert_ptr_equal(a->grads, owner->grads);
    assert_ptr_equal(b->buffers, owner->buffers);
    assert_true(a->acts != b->acts && a->acts != owner->acts && a->dinput != b->dinput);
    assert_true(model_device_bytes(a) < model_device_bytes(owner));

    const size_t in = (size_t)owner->in_c * owner->in_h * owner->in_w, out = 10;
    float *x = xmalloc(STAGE_N * in * sizeof(float)), *dl = xmalloc(STAGE_N * out * sizeof(float));
    fill_uniform(x, STAGE_N * in, -2.0f, 2.0f, 60);
    fill_uniform(dl, STAGE_N * out, -1.0f, 1.0f, 61);
    float *xa = x, *xb = x + H * in, *dla = dl, *dlb = dl + H * out;

    model_zero_grad(owner);
    float *logits_a = xmalloc(H * out * sizeof(float)), *logits_b = xmalloc(H * out * sizeof(float));
    memcpy(logits_a, model_forward(a, xa, H, true), H * out * sizeof(float));
    memcpy(logits_b, model_forward(b, xb, H, true), H * out * sizeof(float));
    model_backward(b, xb, dlb, H);
    model_backward(a, xa, dla, H);

    model_zero_grad(grads_ref);
    assert_memory_equal(model_forward(grads_ref, xb, H, true), logits_b, H * out * sizeof(float));
    model_backward(grads_ref, xb, dlb, H);
    assert_memory_equal(model_input_grad(grads_ref), model_input_grad(b), H * in * sizeof(float));
    assert_memory_equal(model_forward(grads_ref, xa, H, true), logits_a, H * out * sizeof(float));
    model_backward(grads_ref, xa, dla, H);
    assert_memory_equal(model_input_grad(grads_ref), model_input_grad(a), H * in * sizeof(float));
    assert_memory_equal(owner->grads, grads_ref->grads, owner->n_params * sizeof(float));

    model_forward(stats_ref, xa, H, true);
    model_forward(stats_ref, xb, H, true);
    assert_memory_equal(owner->buffers, stats_ref->buffers, owner->n_buffers * sizeof(float));

    model_free(a), model_free(b);  // the owner's buffers stay: it still trains
    model_zero_grad(owner);
    model_forward(owner, x, STAGE_N, true);
    model_backward(owner, x, dl, STAGE_N);
    free(x), free(dl), free(logits_a), free(logits_b);
    model_free(owner), model_free(grads_ref), model_free(stats_ref);
}

static void test_views_share_parameters(void **state) { for_each_model(check_views_of); }

// The two together, as lesson 08 runs them: 2 stages (cut near the middle), M = 3 micro-batches, a view per
// micro-batch on each stage, GPipe's order (every forward, then every backward from the last micro-batch), the
// activation and its gradient copied across the cut. Against the whole model running the micro-batches one after
// the other in the order of the backward passes: the logits of each and the parameter gradients bit for bit
// (the two facts above, composed).
static void check_pipeline_of(const char *name) {
    enum { M = 3, MB = 2 };
    const ModelConfig cfg = stage_config(name);
    Model *whole = model_create(&cfg, DEVICE_CPU, MB, STAGE_SEED);
    const int L = whole->n_layers;
    int cut = L / 2;
    while (!model_cut_ok(&cfg, cut)) cut++;
    Model *stage[2] = {model_create_stage(&cfg, DEVICE_CPU, MB, STAGE_SEED, 0, cut),
                       model_create_stage(&cfg, DEVICE_CPU, MB, STAGE_SEED, cut, L)};
    Model *mb[2][M];
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < M; k++) mb[s][k] = model_create_view(stage[s], MB);
    const size_t in = 3 * (size_t)STAGE_HW * STAGE_HW, crossing = act_floats(whole, cut - 1);
    float *x = xmalloc(M * MB * in * sizeof(float)), *dl = xmalloc(M * MB * 10 * sizeof(float));
    float *logits = xmalloc(M * MB * 10 * sizeof(float));
    fill_uniform(x, M * MB * in, -2.0f, 2.0f, 70);
    fill_uniform(dl, M * MB * 10, -1.0f, 1.0f, 71);

    model_zero_grad(stage[0]), model_zero_grad(stage[1]);
    for (int k = 0; k < M; k++) {
        memcpy(mb[1][k]->input, model_forward(mb[0][k], x + k * MB * in, MB, true), MB * crossing * sizeof(float));
        memcpy(logits + k * MB * 10, model_forward(mb[1][k], mb[1][k]->input, MB, true), MB * 10 * sizeof(float));
    }
    for (int k = M - 1; k >= 0; k--) {
        model_backward(mb[1][k], mb[1][k]->input, dl + k * MB * 10, MB);
        memcpy(mb[0][k]->dlogits, model_input_grad(mb[1][k]), MB * crossing * sizeof(float));
        model_backward(mb[0][k], x + k * MB * in, mb[0][k]->dlogits, MB);
    }
    model_zero_grad(whole);
    for (int k = M - 1; k >= 0; k--) {
        const float *ref = model_forward(whole, x + k * MB * in, MB, true);
        assert_memory_equal(ref, logits + k * MB * 10, MB * 10 * sizeof(float));
        model_backward(whole, x + k * MB * in, dl + k * MB * 10, MB);
    }
    assert_memory_equal(stage[0]->grads, whole->grads, stage[0]->n_params * sizeof(float));
    assert_memory_equal(stage[1]->grads, whole->grads + stage[1]->param_base, stage[1]->n_params * sizeof(float));
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < M; k++) model_free(mb[s][k]);
    model_free(stage[0]), model_free(stage[1]), model_free(whole);
    free(x), free(dl), free(logits);
}

static void test_pipeline_of_views(void **state) { for_each_model(check_pipeline_of); }

// A stage that would cut a residual connection, an empty or reversed range, a range past the end: each stops
// with status 1 and a report naming the rule, never a model that computes something else.
typedef struct {
    const ModelConfig *cfg;
    int first, last;
} StageRange;

static void create_stage_of(void *arg) {
    const StageRange *r = arg;
    model_create_stage(r->cfg, DEVICE_CPU, 2, 1, r->first, r->last);
}

static int stage_exit_status(const ModelConfig *cfg, int first, int last, char *report, size_t len) {
    StageRange r = {cfg, first, last};
    return child_exit_status(create_stage_of, &r, report, len);
}

static void test_bad_stage_refused(void **state) {
    const ModelConfig cfg = stage_config("resnet9");
    Model *whole = model_create(&cfg, DEVICE_CPU, 1, 1);
    int add = -1, L = whole->n_layers;
    for (int i = 0; i < L && add < 0; i++)
        if (whole->layers[i].kind == LAYER_ADD) add = i;
    assert_true(add > 0);
    const int skip_from = whole->layers[add].in;  // the skip connection: from its output to the add
    model_free(whole);
    assert_true(model_cut_ok(&cfg, skip_from + 1));  // before the block: one activation crosses
    assert_true(model_cut_ok(&cfg, add + 1));        // after the add
    assert_false(model_cut_ok(&cfg, add));           // before the add: the skip and the block's output cross
    assert_false(model_cut_ok(&cfg, 0));
    assert_false(model_cut_ok(&cfg, L));
    char report[4096];
    const int bad[][2] = {{0, add}, {add, L}, {3, 3}, {5, 2}, {-1, 4}, {0, L + 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int status = stage_exit_status(&cfg, bad[i][0], bad[i][1], report, sizeof report);
        if (status != 1 || !strstr(report, "HINT"))
            fail_msg("stage [%d, %d): exit status %d, report: %s", bad[i][0], bad[i][1], status, report);
    }
    stage_exit_status(&cfg, 0, add, report, sizeof report);
    assert_non_null(strstr(report, "model_cut_ok"));  // the report names the rule
}

static void test_unknown_model_name(void **state) {
    ModelConfig cfg;
    assert_false(model_config(&cfg, "resnet1000", 0, 3, 32, 32, 10));
    assert_true(model_config(&cfg, "fmnist", 0, 1, 28, 28, 10));
    assert_int_equal(cfg.width, 32);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_views_tile_the_buffer),   cmocka_unit_test(test_init_is_deterministic),
        cmocka_unit_test(test_gradient_tiny),           cmocka_unit_test(test_gradient_resnet9),
        cmocka_unit_test(test_eval_is_per_sample),      cmocka_unit_test(test_inference_model_matches_eval),      cmocka_unit_test(test_grads_ready_hook_order),
        cmocka_unit_test(test_weight_decay_only_on_weights), cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_unknown_model_name),      cmocka_unit_test(test_memory_plan_matches_plain),
        cmocka_unit_test(test_stages_equal_whole),      cmocka_unit_test(test_views_share_parameters),
        cmocka_unit_test(test_pipeline_of_views),       cmocka_unit_test(test_bad_stage_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
