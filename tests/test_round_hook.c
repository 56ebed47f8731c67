// tests/test_round_hook.c: the model's rounding hook (kit/model.h, model_set_round_hook; lesson 10).
//
// Where it is called: the sequence (layer, point, buffer, count) of a training step and of an eval forward,
// written out by hand from the layer tables of tiny and tiny-bn, including a BN fused with its ReLU and a
// pipeline stage whose last layer is that ReLU. What it means: a model whose hook rounds to bf16 at every point
// gives bit for bit what the same layers called one by one (kit/ops.h) with the rounding done by hand give, fused
// BN + ReLU or not. And with no hook, or a hook that does nothing, nothing changes, bit for bit.
#include "tests/testutil.h"

#include "kit/model.h"
#include "kit/ops.h"

enum { N = 4, HW = 8, MAX_EVENTS = 256 };

typedef struct {
    int layer;
    RoundPoint at;  // ROUND_* ; GRADS_READY for an on_grads_ready call
    const float *buf;
    size_t n;
} Event;
enum { GRADS_READY = 100 };

typedef struct {
    Event ev[MAX_EVENTS];
    int count;
    const Model *model;  // the model every call must name
    LowpFormat round_to; // LOWP_FP32: record only
} Recorder;

static void record(Recorder *r, int layer, int at, const float *buf, size_t n) {
    assert_true(r->count < MAX_EVENTS);
    r->ev[r->count++] = (Event){layer, (RoundPoint)at, buf, n};
}

static void recording_hook(void *ctx, const Model *m, int layer, RoundPoint at, float *buf, size_t n) {
    Recorder *r = ctx;
    assert_ptr_equal(m, r->model);
    record(r, layer, at, buf, n);
    round_lowp(m->device, r->round_to, n, buf, NULL);
}

static void grads_ready(void *ctx, size_t offset, size_t count) {
    Recorder *r = ctx;
    record(r, -1, GRADS_READY, r->model->grads + offset, count);
}

static Model *make(const char *name, int batch) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, name, 0, 3, HW, HW, 10));
    return model_create(&cfg, DEVICE_CPU, batch, 11);
}

typedef struct {
    float x[N * 3 * HW * HW];
    int y[N];
    float dlogits[N * 10];
} Batch3;

static void make_batch(Batch3 *b, uint64_t seed) {
    fill_uniform(b->x, sizeof b->x / sizeof(float), -1.0f, 1.0f, seed);
    fill_uniform(b->dlogits, sizeof b->dlogits / sizeof(float), -0.1f, 0.1f, seed + 1);
    round_lowp(DEVICE_CPU, LOWP_BF16, N * 10, b->dlogits, NULL);  // the caller rounds dlogits
    for (int i = 0; i < N; i++) b->y[i] = (i * 3) % 10;
}

static size_t out_count(const Model *m, int i, int n) {
    const Layer *l = &m->layers[i];
    return (size_t)n * l->c * l->h * l->w;
}

// The expected sequence, as (layer, point) pairs; buffers and counts are checked separately.
typedef struct {
    int layer, at;
} Step;

static void check_steps(const Recorder *r, const Step *want, int n_want, const char *what) {
    for (int i = 0; i < n_want && i < r->count; i++)
        if (r->ev[i].layer != want[i].layer || (int)r->ev[i].at != want[i].at)
            fail_msg("%s: call %d is (layer %d, point %d), expected (layer %d, point %d)", what, i, r->ev[i].layer,
                     (int)r->ev[i].at, want[i].layer, want[i].at);
    if (r->count != n_want) fail_msg("%s: %d calls, expected %d", what, r->count, n_want);
}

enum { O = ROUND_OUTPUT, D = ROUND_DOUT, P = ROUND_DPARAMS, G = GRADS_READY };

// Every OUTPUT call hands over the layer's output slot, (n, c, h, w) floats; every DPARAMS call the layer's
// gradient range, followed at once by on_grads_ready for the same range.
static void check_buffers(const Recorder *r, const Model *m, int n) {
    for (int i = 0; i < r->count; i++) {
        const Event *e = &r->ev[i];
        if (e->at == ROUND_OUTPUT || e->at == ROUND_DOUT) assert_int_equal(e->n, out_count(m, e->layer, n));
        if (e->at == ROUND_DPARAMS) {
            const Layer *l = &m->layers[e->layer];
            assert_ptr_equal(e->buf, m->grads + l->param_offset);
            assert_int_equal(e->n, l->param_count);
            assert_true(i + 1 < r->count && (int)r->ev[i + 1].at == GRADS_READY);
            assert_ptr_equal(r->ev[i + 1].buf, e->buf);
            assert_int_equal(r->ev[i + 1].n, e->n);
        }
    }
}

// tiny: conv0 relu1 pool2 conv3 relu4 pool5 avgpool6 linear7 (convs with bias).
static void test_sequence_tiny(void **state) {
    (void)state;
    Model *m = make("tiny", N);
    Recorder *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->model = m;
    model_set_round_hook(m, recording_hook, r);
    m->on_grads_ready = grads_ready, m->on_grads_ready_ctx = r;
    Batch3 b;
    make_batch(&b, 1);
    model_zero_grad(m);
    const float *logits = model_forward(m, b.x, N, true);
    const Step fwd[] = {{0, O}, {1, O}, {2, O}, {3, O}, {4, O}, {5, O}, {6, O}, {7, O}};
    check_steps(r, fwd, 8, "tiny, training forward");
    assert_ptr_equal(r->ev[7].buf, logits);
    assert_ptr_equal(r->ev[1].buf, r->ev[0].buf);  // the ReLU runs in place on the conv's output
    r->count = 0;
    model_backward(m, b.x, b.dlogits, N);
    const Step bwd[] = {{7, P}, {-1, G}, {6, D}, {5, D}, {4, D}, {3, D}, {3, P}, {-1, G},
                        {2, D}, {1, D}, {0, D}, {0, P}, {-1, G}};
    check_steps(r, bwd, 13, "tiny, backward");
    check_buffers(r, m, N);
    r->count = 0;
    logits = model_forward(m, b.x, 2, false);  // eval, a smaller batch: the counts follow it
    check_steps(r, fwd, 8, "tiny, eval forward");
    check_buffers(r, m, 2);
    assert_ptr_equal(r->ev[7].buf, logits);
    free(r);
    model_free(m);
}

// tiny-bn: conv0 bn1 relu2 pool3 conv4 bn5 relu6 pool7 avgpool8 linear9; on the CPU each BN runs fused with its
// ReLU in training: the BN's and the ReLU's OUTPUT calls get the same buffer, and so do their DOUT calls (the
// ReLU's output gradient, which the fused backward reads).
static void test_sequence_tiny_bn(void **state) {
    (void)state;
    Model *m = make("tiny-bn", N);
    assert_true(m->layers[1].fused_relu && m->layers[5].fused_relu);
    Recorder *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->model = m;
    model_set_round_hook(m, recording_hook, r);
    m->on_grads_ready = grads_ready, m->on_grads_ready_ctx = r;
    Batch3 b;
    make_batch(&b, 2);
    model_zero_grad(m);
    model_forward(m, b.x, N, true);
    const Step fwd[] = {{0, O}, {1, O}, {2, O}, {3, O}, {4, O}, {5, O}, {6, O}, {7, O}, {8, O}, {9, O}};
    check_steps(r, fwd, 10, "tiny-bn, training forward");
    assert_ptr_equal(r->ev[2].buf, r->ev[1].buf);
    assert_ptr_equal(r->ev[6].buf, r->ev[5].buf);
    r->count = 0;
    model_backward(m, b.x, b.dlogits, N);
    const Step bwd[] = {{9, P}, {-1, G}, {8, D}, {7, D}, {6, D}, {5, D}, {5, P}, {-1, G}, {4, D}, {4, P}, {-1, G},
                        {3, D}, {2, D}, {1, D}, {1, P}, {-1, G}, {0, D}, {0, P}, {-1, G}};
    check_steps(r, bwd, 19, "tiny-bn, backward");
    check_buffers(r, m, N);
    assert_ptr_equal(r->ev[5].buf, r->ev[4].buf);    // BN 5 reads ReLU 6's output gradient
    assert_ptr_equal(r->ev[13].buf, r->ev[12].buf);  // BN 1 reads ReLU 2's
    r->count = 0;
    model_forward(m, b.x, N, false);  // eval: no fusion, the same calls
    check_steps(r, fwd, 10, "tiny-bn, eval forward");
    check_buffers(r, m, N);
    free(r);
    model_free(m);
}

// A pipeline stage (lesson 08) ending with a fused BN's ReLU: its dy is the caller's dlogits, so neither the
// ReLU (the last layer) nor the BN that reads it gets a DOUT call.
static void test_sequence_stage_ending_in_fused_relu(void **state) {
    (void)state;
    ModelConfig cfg;
    assert_true(model_config(&cfg, "tiny-bn", 0, 3, HW, HW, 10));
    assert_true(model_cut_ok(&cfg, 3));
    Model *m = model_create_stage(&cfg, DEVICE_CPU, N, 11, 0, 3);  // conv0 bn1 relu2
    assert_true(m->layers[1].fused_relu);
    Recorder *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->model = m;
    model_set_round_hook(m, recording_hook, r);
    m->on_grads_ready = grads_ready, m->on_grads_ready_ctx = r;
    float x[N * 3 * HW * HW];
    fill_uniform(x, sizeof x / sizeof x[0], -1, 1, 3);
    size_t nout = out_count(m, 2, N);
    float *dy = malloc(nout * sizeof *dy);
    assert_non_null(dy);
    fill_uniform(dy, nout, -1, 1, 4);
    model_zero_grad(m);
    model_forward(m, x, N, true);
    r->count = 0;
    model_backward(m, x, dy, N);
    const Step bwd[] = {{1, P}, {-1, G}, {0, D}, {0, P}, {-1, G}};
    check_steps(r, bwd, 5, "stage conv-bn-relu, backward");
    check_buffers(r, m, N);
    free(dy);
    free(r);
    model_free(m);
}

// A view (model_create_view) made after the hook is installed calls it too, naming the view.
static void test_view_copies_the_hook(void **state) {
    (void)state;
    Model *m = make("tiny", N);
    Recorder *r = calloc(1, sizeof *r);
    assert_non_null(r);
    model_set_round_hook(m, recording_hook, r);
    Model *v = model_create_view(m, 2);
    assert_true(v->round_hook == recording_hook && v->round_hook_ctx == r);
    r->model = v;
    Batch3 b;
    make_batch(&b, 3);
    model_forward(v, b.x, 2, true);
    assert_int_equal(r->count, m->n_layers);
    model_set_round_hook(m, NULL, NULL);  // removed from the owner: the view keeps its copy, as on_grads_ready
    assert_null(m->round_hook);
    model_free(v);
    free(r);
    model_free(m);
}

// ---------------------------------------------------------------- what the rounding computes

static float *zeros(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}
static float *copy_of(const float *src, size_t n) {
    float *p = zeros(n);
    memcpy(p, src, n * sizeof *p);
    return p;
}
static void bf16(float *x, size_t n) { round_lowp(DEVICE_CPU, LOWP_BF16, n, x, NULL); }

// tiny or tiny-bn's training step by hand: every layer called through kit/ops.h on separate buffers, each output,
// output gradient and parameter gradient rounded to bf16 where the hook's points are. Writes the logits and the
// gradients (m's layout) from m's parameters and BN buffers (running statistics updated on a copy).
static void manual_step(const Model *m, const Batch3 *b, float *logits, float *grads) {
    const int L = m->n_layers;
    const Device d = DEVICE_CPU;
    assert_true(L <= 16);
    float *act[16] = {0}, *dact[16] = {0};
    float *buffers = copy_of(m->buffers, m->n_buffers);
    float *saved[16] = {0};
    float *work = zeros(1 << 20);
    memset(grads, 0, m->n_params * sizeof *grads);
    for (int i = 0; i < L; i++) {
        act[i] = zeros(out_count(m, i, N));
        dact[i] = zeros(out_count(m, i, N));
    }
    int c = 3, h = HW, w = HW;  // the current input's shape
    for (int i = 0; i < L; i++) {
        const Layer *l = &m->layers[i];
        const float *in = i == 0 ? b->x : act[i - 1];  // tiny and tiny-bn are a chain
        const float *wt = m->params + (l->weight >= 0 ? m->views[l->weight].offset : 0);
        const float *bias = l->bias_view >= 0 ? m->params + m->views[l->bias_view].offset : NULL;
        if (l->kind == LAYER_CONV) {
            Conv2dDims cd = {N, c, h, w, l->out_c, l->ksize, l->stride, l->pad};
            assert_true(conv2d_work_floats(d, &cd) <= (1 << 20));
            conv2d_forward(d, &cd, in, wt, bias, act[i], work);
        } else if (l->kind == LAYER_BN) {
            BatchNormDims bd = {N, c, h * w, 1e-5f, 0.1f};
            saved[i] = zeros(2 * (size_t)c);
            float *rm = buffers + m->buffer_views[l->running].offset;
            float *rv = buffers + m->buffer_views[l->running + 1].offset;
            batchnorm_forward_train(d, &bd, in, wt, bias, act[i], saved[i], saved[i] + c, rm, rv, NULL, work);
        } else if (l->kind == LAYER_RELU) {
            relu_forward(d, out_count(m, i, N), in, act[i]);
        } else if (l->kind == LAYER_MAXPOOL) {
            maxpool2_forward(d, N, c, h, w, in, act[i]);
        } else if (l->kind == LAYER_AVGPOOL) {
            avgpool_forward(d, N, c, h * w, in, act[i]);
        } else {
            linear_forward(d, N, c * h * w, l->out_c, in, wt, bias, act[i]);
        }
        bf16(act[i], out_count(m, i, N));
        c = l->c, h = l->h, w = l->w;
    }
    memcpy(logits, act[L - 1], out_count(m, L - 1, N) * sizeof *logits);
    memcpy(dact[L - 1], b->dlogits, sizeof b->dlogits);
    for (int i = L - 1; i >= 0; i--) {
        const Layer *l = &m->layers[i];
        int ci = 3, hi = HW, wi = HW;
        if (i > 0) ci = m->layers[i - 1].c, hi = m->layers[i - 1].h, wi = m->layers[i - 1].w;
        const float *in = i == 0 ? b->x : act[i - 1];
        float *dx = i == 0 ? NULL : dact[i - 1];
        const float *wt = m->params + (l->weight >= 0 ? m->views[l->weight].offset : 0);
        float *dw = l->weight >= 0 ? grads + m->views[l->weight].offset : NULL;
        float *db = l->bias_view >= 0 ? grads + m->views[l->bias_view].offset : NULL;
        if (i < L - 1) bf16(dact[i], out_count(m, i, N));
        if (l->kind == LAYER_CONV) {
            Conv2dDims cd = {N, ci, hi, wi, l->out_c, l->ksize, l->stride, l->pad};
            conv2d_backward(d, &cd, in, wt, dact[i], dx, dw, db, work);
        } else if (l->kind == LAYER_BN) {
            BatchNormDims bd = {N, ci, hi * wi, 1e-5f, 0.1f};
            batchnorm_backward(d, &bd, in, wt, saved[i], saved[i] + ci, dact[i], dx, dw, db, NULL, work);
        } else if (l->kind == LAYER_RELU) {
            relu_backward(d, out_count(m, i, N), act[i], dact[i], dx);
        } else if (l->kind == LAYER_MAXPOOL) {
            maxpool2_backward(d, N, ci, hi, wi, in, act[i], dact[i], dx);
        } else if (l->kind == LAYER_AVGPOOL) {
            avgpool_backward(d, N, ci, hi * wi, dact[i], dx);
        } else {
            linear_backward(d, N, ci * hi * wi, l->out_c, in, wt, dact[i], dx, dw, db);
        }
        if (l->param_count) bf16(grads + l->param_offset, l->param_count);
    }
    for (int i = 0; i < L; i++) free(act[i]), free(dact[i]), free(saved[i]);
    free(buffers);
    free(work);
}

static void rounding_hook(void *ctx, const Model *m, int layer, RoundPoint at, float *buf, size_t n) {
    (void)ctx, (void)layer, (void)at;
    round_lowp(m->device, LOWP_BF16, n, buf, NULL);
}

// The kit's own BN called as a replacement (lesson 05's interface): the model then runs BN and ReLU unfused.
static void bn_fwd(void *ctx, const BatchNormDims *s, const float *x, const float *gamma, const float *beta, float *y,
                   float *mean, float *invstd, float *rm, float *rv) {
    batchnorm_forward_train(DEVICE_CPU, s, x, gamma, beta, y, mean, invstd, rm, rv, NULL, ctx);
}
static void bn_bwd(void *ctx, const BatchNormDims *s, const float *x, const float *gamma, const float *mean,
                   const float *invstd, const float *dy, float *dx, float *dgamma, float *dbeta) {
    batchnorm_backward(DEVICE_CPU, s, x, gamma, mean, invstd, dy, dx, dgamma, dbeta, NULL, ctx);
}

static void check_hooked_step_equals_manual(const char *name, bool unfused) {
    Model *m = make(name, N);
    float *bn_work = zeros(1 << 16);
    BatchNormLayerOps ops = {bn_fwd, bn_bwd, bn_work, {NULL, NULL}};
    if (unfused) {
        model_set_bn_ops(m, &ops);
        for (int i = 0; i < m->n_layers; i++) assert_false(m->layers[i].fused_relu);
    }
    model_set_round_hook(m, rounding_hook, NULL);
    Batch3 b;
    make_batch(&b, 5);
    float *want_logits = zeros(N * 10), *want_grads = zeros(m->n_params);
    manual_step(m, &b, want_logits, want_grads);
    model_zero_grad(m);
    const float *logits = model_forward(m, b.x, N, true);
    float got_logits[N * 10];
    memcpy(got_logits, logits, sizeof got_logits);
    model_backward(m, b.x, b.dlogits, N);
    assert_memory_equal(got_logits, want_logits, sizeof got_logits);
    for (size_t i = 0; i < m->n_params; i++)
        if (m->grads[i] != want_grads[i] && !(isnan(m->grads[i]) && isnan(want_grads[i])))
            fail_msg("%s%s: gradient %zu is %a, by hand %a", name, unfused ? " (unfused)" : "", i,
                     (double)m->grads[i], (double)want_grads[i]);
    // and every gradient is a bf16 value (rounded at DPARAMS)
    for (size_t i = 0; i < m->n_params; i++) {
        float g = m->grads[i];
        bf16(&g, 1);
        assert_true(g == m->grads[i]);
    }
    free(want_logits), free(want_grads), free(bn_work);
    model_free(m);
}

static void test_bf16_hook_equals_rounding_by_hand(void **state) {
    (void)state;
    check_hooked_step_equals_manual("tiny", false);
    check_hooked_step_equals_manual("tiny-bn", false);  // BN + ReLU fused
    check_hooked_step_equals_manual("tiny-bn", true);   // BN and ReLU apart: the same bits
}

// The rounding matters: without the hook the same step gives other logits (else the test above proves nothing).
static void test_bf16_hook_changes_the_numbers(void **state) {
    (void)state;
    Model *a = make("tiny-bn", N), *c = make("tiny-bn", N);
    model_set_round_hook(c, rounding_hook, NULL);
    Batch3 b;
    make_batch(&b, 6);
    float la[N * 10], lc[N * 10];
    memcpy(la, model_forward(a, b.x, N, true), sizeof la);
    memcpy(lc, model_forward(c, b.x, N, true), sizeof lc);
    assert_memory_not_equal(la, lc, sizeof la);
    float r[N * 10];  // the hooked logits are bf16 values (rounded at the last layer's OUTPUT)
    memcpy(r, lc, sizeof r);
    bf16(r, N * 10);
    assert_memory_equal(r, lc, sizeof r);
    model_free(a), model_free(c);
}

// ---------------------------------------------------------------- no hook, or one that does nothing

static void noop_hook(void *ctx, const Model *m, int layer, RoundPoint at, float *buf, size_t n) {
    (void)m, (void)layer, (void)at, (void)buf, (void)n;
    ++*(int *)ctx;
}

static void test_noop_hook_changes_nothing(void **state) {
    (void)state;
    const char *names[] = {"tiny", "tiny-bn", "resnet9"};
    for (int k = 0; k < 3; k++) {
        ModelConfig cfg;
        assert_true(model_config(&cfg, names[k], 4, 3, 32, 32, 10));
        Model *a = model_create(&cfg, DEVICE_CPU, 2, 9), *c = model_create(&cfg, DEVICE_CPU, 2, 9);
        int calls = 0;
        model_set_round_hook(c, noop_hook, &calls);
        float x[2 * 3 * 32 * 32], dl[2 * 10];
        fill_uniform(x, sizeof x / sizeof x[0], -1, 1, 7);
        fill_uniform(dl, 20, -1, 1, 8);
        Model *both[2] = {a, c};
        for (int j = 0; j < 2; j++) {
            model_zero_grad(both[j]);
            model_forward(both[j], x, 2, true);
            model_backward(both[j], x, dl, 2);
        }
        assert_memory_equal(a->grads, c->grads, a->n_params * sizeof(float));
        assert_memory_equal(a->buffers, c->buffers, a->n_buffers * sizeof(float));
        float ea[20], ec[20];
        memcpy(ea, model_forward(a, x, 2, false), sizeof ea);
        memcpy(ec, model_forward(c, x, 2, false), sizeof ec);
        assert_memory_equal(ea, ec, sizeof ea);
        assert_true(calls > 3 * c->n_layers);  // it was called: forward, backward, eval
        model_free(a), model_free(c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequence_tiny),
        cmocka_unit_test(test_sequence_tiny_bn),
        cmocka_unit_test(test_sequence_stage_ending_in_fused_relu),
        cmocka_unit_test(test_view_copies_the_hook),
        cmocka_unit_test(test_bf16_hook_equals_rounding_by_hand),
        cmocka_unit_test(test_bf16_hook_changes_the_numbers),
        cmocka_unit_test(test_noop_hook_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
