// tests/learn_testutil.h: "a short training learns", for the autograders whose step wraps the model in
// something of its own (lesson 02's DataParallel, lesson 08's pipeline): the same data, optimizer and epochs
// for each, so their accuracies compare.
#ifndef TESTS_LEARN_TESTUTIL_H
#define TESTS_LEARN_TESTUTIL_H

#include "tests/testutil.h"

#include "kit/data.h"
#include "kit/optim.h"
#include "kit/train.h"

// The lessons' step signature with the wrapper as void *: each test passes a two-line adapter.
typedef Metrics (*LearnStepFn)(void *wrapper, const Batch *b, const SgdConfig *opt, float label_smoothing);

// Trains `epochs` epochs of 600 synthetic CIFAR-shaped images in batches of `batch` through step(wrapper, ...)
// and returns the last epoch's training metrics (count 0 when the step counted nothing).
static inline Metrics learn_short_run(LearnStepFn step, void *wrapper, int batch, int epochs) {
    Dataset train;
    dataset_synthetic(&train, 600, 10, 3, 32, 32, 7, SPLIT_TRAIN);
    Sampler sampler;
    sampler_init(&sampler, train.n, 0, 1, 7, SAMPLER_TRAIN_DROP);
    Loader *L = loader_create(&train, &sampler, batch, true, NULL, 7);
    SgdConfig opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = true};
    Metrics last = {0};
    for (int e = 0; e < epochs; e++) {
        loader_start_epoch(L, e, 0);
        last = (Metrics){0};
        const Batch *b;
        while ((b = loader_next(L, NULL)) != NULL) {
            Metrics r = step(wrapper, b, &opt, 0.0f);
            last.correct += r.correct;
            last.count += r.count;
        }
    }
    loader_free(L);
    dataset_free(&train);
    return last;
}

// Fails the test unless the short run learned: images counted, and 90% or more of them right in the last epoch
// (the tiny net reaches that on this set whatever wraps it). step: the step's name, setup: how it was run.
static inline void learn_expect(Metrics last, const char *step, const char *setup) {
    if (last.count == 0) print_error("%s returned count 0 for every batch\n", step);
    assert_true(last.count > 0);
    double acc = (double)last.correct / last.count;
    print_message("training accuracy in the last epoch, %s: %.1f%%\n", setup, 100 * acc);
    assert_true(acc >= 0.9);
}

#endif
