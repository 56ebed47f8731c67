// tests/lesson03/loop_hooks.c: the hooks through which a later lesson trains its own model with its own step
// in lesson 03's loop (TrainHooks.open, make_model, step, evaluate, check_replicas). Given code, not a TODO:
// run by tests/lesson03/run-tests.sh on the solution (`test_lesson03 --check-loop-hooks`), not graded.
//
// A counting step that leaves the model alone replaces ddp_step: the loop must call it once per batch on the
// model make_model made, attach no buckets, and the parameters must come out as they went in (ddp_step would
// have moved them). A second run goes to the end of its epoch with hooks that open the data, evaluate and check
// the replicas: each must be called once, and the epoch's test accuracy must be the evaluate hook's (a lesson
// whose ranks hold parts of the model, a pipeline, cannot be evaluated or checked by lesson 03's own calls).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/cli.h"
#include "kit/device.h"
#include "kit/dist.h"
#include "kit/model.h"
#include "lesson.h"

int lesson03_check_loop_hooks(ProcessGroup *pg);

enum { STOP_AFTER = 3 };  // steps: enough to see the step called per batch, few enough to be quick

typedef struct {
    Model *made;      // what make_model returned
    int made_calls, step_calls, open_calls, eval_calls, check_calls;
    bool wrong_model;  // the step saw a model other than the one make_model made
    char checked[64];  // the `what` check_replicas was given
} HookLog;

// What the evaluate hook reports: an accuracy no evaluation of the untrained tiny net comes near (~0.1).
static const Metrics HOOK_TEST = {.loss_sum = 1.0, .correct = 3, .count = 4};

static Model *make_model(void *ctx, DdpRun *r, const ModelConfig *cfg) {
    HookLog *h = ctx;
    h->made_calls++;
    h->made = model_create(cfg, pg_device(r->pg), r->local_batch, r->o->seed);
    return h->made;
}

static Metrics counting_step(void *ctx, DdpRun *r, const Batch *b) {
    HookLog *h = ctx;
    h->step_calls++;
    h->wrong_model |= r->ddp.model != h->made;
    return (Metrics){.loss_sum = 0.5 * b->n, .correct = 0, .count = b->n};
}

static int open_data(void *ctx, DdpRun *r) {
    HookLog *h = ctx;
    h->open_calls++;
    return ddp_data_open(&r->data, r->o, r->pg);
}

static Metrics fixed_evaluate(void *ctx, DdpRun *r) {
    HookLog *h = ctx;
    (void)r;
    h->eval_calls++;
    return HOOK_TEST;
}

static void counting_check(void *ctx, DdpRun *r, const char *what) {
    HookLog *h = ctx;
    (void)r;
    h->check_calls++;
    snprintf(h->checked, sizeof h->checked, "%s", what);
}

static bool stop_early(void *ctx, DdpRun *r, const Batch *b, const Metrics *batch) {
    (void)ctx, (void)b, (void)batch;
    return r->run.step >= STOP_AFTER;
}

int lesson03_check_loop_hooks(ProcessGroup *pg) {
    static char name[] = "train";
    char *argv[] = {name, NULL};
    TrainOptions o;
    cli_parse(&o, 1, argv, CLI_DIST);  // the defaults, --bucket-mb 25 among them: buckets unless the step owns them
    o.dataset = "synthetic";
    o.model = "tiny";
    o.batch_size = 16 * pg_world(pg);
    o.epochs = 1;
    cli_apply_dataset_defaults(&o);

    HookLog h = {0};
    TrainHooks hooks = {.ctx = &h, .make_model = make_model, .step = counting_step, .after_step = stop_early};
    DdpRun r;
    ddp_run_open(&r, pg, &o, &hooks);
    Model *m = r.ddp.model;
    size_t bytes = m->n_params * sizeof(float);
    float *before = xmalloc(bytes);  // (n_params) on the host
    device_copy_from(m->device, before, m->params, bytes);
    bool finished = ddp_run_epochs(&r);
    float *after = xmalloc(bytes);
    device_copy_from(m->device, after, m->params, bytes);
    bool unchanged = memcmp(before, after, bytes) == 0;
    bool buckets = r.ddp.buckets != NULL;
    long long steps = r.run.step;
    model_free(ddp_run_close(&r));
    free(before);
    free(after);

    int bad = 0;
#define EXPECT(cond, ...)                                       \
    if (!(cond)) {                                              \
        fprintf(stderr, "loop hooks: FAIL: " __VA_ARGS__);      \
        fprintf(stderr, "\n");                                  \
        bad = 1;                                                \
    }
    EXPECT(h.made_calls == 1 && m == h.made, "make_model called %d times, its model %s the loop's", h.made_calls,
           m == h.made ? "is" : "is not");
    EXPECT(h.step_calls == STOP_AFTER && steps == STOP_AFTER, "the step hook ran %d times over %lld steps, "
           "expected %d", h.step_calls, steps, STOP_AFTER);
    EXPECT(!h.wrong_model, "the step hook saw another model than make_model's");
    EXPECT(!finished, "after_step asked to stop, the loop went on");
    EXPECT(unchanged, "the parameters moved: ddp_step ran besides the step hook");
    EXPECT(!buckets, "buckets attached although the step hook owns the gradients' communication");

    // One whole epoch (the counting step is cheap) with the hooks of a lesson that evaluates and checks its own way.
    HookLog e = {0};
    TrainHooks whole = {.ctx = &e, .open = open_data, .make_model = make_model, .step = counting_step,
                        .evaluate = fixed_evaluate, .check_replicas = counting_check};
    ddp_run_open(&r, pg, &o, &whole);
    int local_batch = r.local_batch;
    finished = ddp_run_epochs(&r);
    double test_acc = r.run.test_acc;
    model_free(ddp_run_close(&r));
    EXPECT(e.open_calls == 1 && local_batch == o.batch_size / pg_world(pg), "the open hook ran %d times "
           "(expected once, before the data), the loop's local batch is %d", e.open_calls, local_batch);
    EXPECT(finished && e.step_calls > 0, "the epoch did not run to its end (%d steps)", e.step_calls);
    EXPECT(e.eval_calls == 1, "the evaluate hook ran %d times in one epoch, expected once (the loop evaluated "
           "with ddp_evaluate instead?)", e.eval_calls);
    EXPECT(test_acc == (double)HOOK_TEST.correct / (double)HOOK_TEST.count, "the epoch's test accuracy is %g, "
           "not the evaluate hook's %g", test_acc, (double)HOOK_TEST.correct / (double)HOOK_TEST.count);
    EXPECT(e.check_calls == 1 && strstr(e.checked, "epoch 1") != NULL, "the check_replicas hook ran %d times "
           "(expected once, at the epoch's end, told which epoch: '%s')", e.check_calls, e.checked);
#undef EXPECT
    if (!bad && pg_rank(pg) == 0)
        printf("loop hooks: make_model and step replace lesson 03's model and step; open, evaluate and "
               "check_replicas its data, evaluation and replica check\n");
    return bad;
}
