// tests/test_model.c: the layer table, flat buffers and whole-network gradients of kit/model.c.
#include "tests/testutil.h"

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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
