// tests/test_train.c: training learns: a small net learns the synthetic set, from a fixed seed.
#include "tests/testutil.h"

#include "kit/data.h"
#include "kit/log.h"
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"

// Trains `model` on the synthetic training split with the kit alone (no lesson code) and returns the
// training accuracy over the last `window` steps.
static double train_synthetic(const char *model, int steps, int window) {
    enum { BATCH = 32 };
    Dataset ds;
    dataset_synthetic(&ds, 2000, 10, 3, 32, 32, 1, SPLIT_TRAIN);
    Sampler s;
    sampler_init(&s, ds.n, 0, 1, 1, SAMPLER_TRAIN_DROP);
    Loader *L = loader_create(&ds, &s, BATCH, true, NULL, 1);
    ModelConfig cfg;
    assert_true(model_config(&cfg, model, 0, 3, 32, 32, 10));
    Model *m = model_create(&cfg, DEVICE_CPU, BATCH, 1);
    SgdConfig opt = {.momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};  // .lr: from the schedule
    LrSchedule sched = {.peak_lr = 0.05f, .warmup_steps = 20, .total_steps = steps, .decay = DECAY_LINEAR};
    long correct = 0, seen = 0;
    double t0 = time_now();
    int step = 0, epoch = 0;
    while (step < steps) {
        loader_start_epoch(L, epoch++, 0);
        const Batch *b;
        while (step < steps && (b = loader_next(L, NULL)) != NULL) {
            const float *logits = model_forward(m, b->x, b->n, true);
            argmax_rows(DEVICE_CPU, b->n, 10, logits, m->pred);
            memset(m->dlogits, 0, (size_t)b->n * 10 * sizeof(float));
            cross_entropy_backward(DEVICE_CPU, b->n, 10, logits, b->y, 0.0f, 1.0f / b->n, m->dlogits);
            model_zero_grad(m);
            model_backward(m, b->x, m->dlogits, b->n);
            opt.lr = lr_at(&sched, step);
            optim_step(m, &opt);
            if (step >= steps - window) {
                for (int i = 0; i < b->n; i++) correct += m->pred[i] == b->y[i];
                seen += b->n;
            }
            step++;
        }
    }
    double acc = (double)correct / seen;
    print_message("%s: %d steps, training accuracy over the last %d: %.1f%% (%.1f s)\n", model, steps, window,
                  100 * acc, time_now() - t0);
    model_free(m);
    loader_free(L);
    dataset_free(&ds);
    return acc;
}

static void test_tiny_bn_learns(void **state) { assert_true(train_synthetic("tiny-bn", 300, 50) >= 0.95); }
static void test_tiny_learns(void **state) { assert_true(train_synthetic("tiny", 300, 50) >= 0.95); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_bn_learns),
        cmocka_unit_test(test_tiny_learns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
