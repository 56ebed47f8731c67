// tests/test_memstat.c: the kit's allocation counters by part (kit/mem.h) and the release / materialize of a
// model's parts (kit/model.h), which lesson 09's memory figures are measured with.
#include "tests/testutil.h"

#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kit/cpu_bf16.h"
#ifdef KIT_CUDA
#include "kit/cuda/cuda_context.h"
#endif
#include "kit/model.h"
#include "kit/ops.h"
#include "kit/optim.h"

// Counted bytes are the bytes asked for, to the byte, and a free gives back exactly what its allocation took.
// Skips the test, saying why, where no CUDA device is usable (a GPU, or the emulator of the EMU=1 build).
static void skip_without_cuda(void) {
    const char *why = NULL;
    if (!device_cuda_usable(&why)) {
        printf("skipped: %s\n", why);
        skip();
    }
}

// fn(arg) on a thread of its own: the thread's CUDA context, scratch included, is freed when it ends, so a test
// can check that every byte came back.
static void on_own_thread(void *(*fn)(void *), void *arg) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fn, arg), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
}

static void test_counts_exact(void **state) {
    MemStats s0 = mem_stats();
    void *a = device_alloc_as(DEVICE_CPU, 1000, MEM_GRADS);
    void *b = device_alloc_as(DEVICE_CPU, 17, MEM_COMM);
    void *c = device_alloc(DEVICE_CPU, 333);  // MEM_OTHER
    MemStats s1 = mem_stats();
    assert_int_equal(s1.live[MEM_GRADS] - s0.live[MEM_GRADS], 1000);
    assert_int_equal(s1.live[MEM_COMM] - s0.live[MEM_COMM], 17);
    assert_int_equal(s1.live[MEM_OTHER] - s0.live[MEM_OTHER], 333);
    assert_int_equal(s1.live_total - s0.live_total, 1350);
    device_free(DEVICE_CPU, b);
    MemStats s2 = mem_stats();
    assert_int_equal(s2.live[MEM_COMM], s0.live[MEM_COMM]);
    assert_int_equal(s2.live_total - s0.live_total, 1333);
    assert_true(s2.peak[MEM_COMM] >= s0.live[MEM_COMM] + 17);  // the peak remembers
    device_free(DEVICE_CPU, a), device_free(DEVICE_CPU, c);
    MemStats s3 = mem_stats();
    assert_int_equal(s3.live_total, s0.live_total);
    for (int p = 0; p < MEM_PARTS; p++) assert_int_equal(s3.live[p], s0.live[p]);
}

// The peak is the most held at once since the reset: two allocations alive together count, one after the other
// do not add up.
static void test_peak_and_reset(void **state) {
    mem_stats_reset_peak();
    MemStats s0 = mem_stats();
    for (int p = 0; p < MEM_PARTS; p++) assert_int_equal(s0.peak[p], s0.live[p]);
    assert_int_equal(s0.peak_total, s0.live_total);
    void *a = device_alloc_as(DEVICE_CPU, 4096, MEM_ACTS);
    device_free(DEVICE_CPU, a);
    void *b = device_alloc_as(DEVICE_CPU, 1024, MEM_ACTS);
    void *c = device_alloc_as(DEVICE_CPU, 2048, MEM_ACTS);
    MemStats s1 = mem_stats();
    assert_int_equal(s1.peak[MEM_ACTS] - s0.live[MEM_ACTS], 4096);  // max(4096, 1024 + 2048)
    assert_int_equal(s1.peak_total - s0.live_total, 4096);
    device_free(DEVICE_CPU, b), device_free(DEVICE_CPU, c);
    mem_stats_reset_peak();
    assert_int_equal(mem_stats().peak[MEM_ACTS], s0.live[MEM_ACTS]);
    assert_string_equal(mem_part_name(MEM_PARAMS), "params");
    assert_string_equal(mem_part_name(MEM_OPTIM), "optimizer");
    assert_string_equal(mem_part_name(MEM_ACTS), "activations");
    assert_string_equal(mem_part_name(MEM_OTHER), "other");
}

// Many allocations alive at once, freed in a scrambled order: the table's deletions keep every later entry
// findable (a broken probe chain would lose one and the totals would not come back to the start).
static void test_many_live_allocations(void **state) {
    enum { N = 3000 };
    MemStats s0 = mem_stats();
    void **p = malloc(N * sizeof *p);
    size_t total = 0;
    for (int i = 0; i < N; i++) {
        p[i] = device_alloc_as(DEVICE_CPU, (size_t)i % 97 + 1, (MemPart)(i % MEM_PARTS));
        total += (size_t)i % 97 + 1;
    }
    assert_int_equal(mem_stats().live_total - s0.live_total, total);
    for (int k = 0; k < N; k++) {  // 1999 is prime to 3000: every index exactly once
        int i = (int)((size_t)k * 1999 % N);
        device_free(DEVICE_CPU, p[i]);
        total -= (size_t)i % 97 + 1;
        assert_int_equal(mem_stats().live_total - s0.live_total, total);
    }
    free(p);
    for (int q = 0; q < MEM_PARTS; q++) assert_int_equal(mem_stats().live[q], s0.live[q]);
}

static void *alloc_free_loop(void *arg) {
    (void)arg;
    for (int i = 0; i < 2000; i++) device_free(DEVICE_CPU, device_alloc_as(DEVICE_CPU, 64, MEM_COMM));
    return NULL;
}

// Two threads allocating and freeing at once (a loader thread beside the trainer) leave exact totals.
static void test_threads(void **state) {
    MemStats s0 = mem_stats();
    pthread_t t[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, alloc_free_loop, NULL), 0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    MemStats s1 = mem_stats();
    assert_int_equal(s1.live_total, s0.live_total);
    assert_int_equal(s1.live[MEM_COMM], s0.live[MEM_COMM]);
    assert_true(s1.peak[MEM_COMM] >= s0.live[MEM_COMM] + 64);
}

static Model *make(const char *name, int batch) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, name, 8, 3, 16, 16, 10));
    return model_create(&cfg, DEVICE_CPU, batch, 7);
}

// model_create's buffers are tagged by part: params + buffers, grads, velocity each exactly the model's floats,
// and the whole model's bytes are what model_device_bytes says.
static void test_model_tags(void **state) {
    MemStats s0 = mem_stats();
    Model *m = make("tiny-bn", 4);
    MemStats s1 = mem_stats();
    const size_t F = sizeof(float);
    assert_int_equal(s1.live[MEM_PARAMS] - s0.live[MEM_PARAMS], (m->n_params + m->n_buffers) * F);
    assert_int_equal(s1.live[MEM_GRADS] - s0.live[MEM_GRADS], m->n_params * F);
    assert_int_equal(s1.live[MEM_OPTIM] - s0.live[MEM_OPTIM], m->n_params * F);
    assert_int_equal(s1.live_total - s0.live_total, model_device_bytes(m));
    model_free(m);
    assert_int_equal(mem_stats().live_total, s0.live_total);
}

// Release frees exactly the part's bytes, materialize brings exactly them back; grads come back zeroed.
static void test_release_exact(void **state) {
    Model *m = make("tiny-bn", 4);
    const size_t P = m->n_params * sizeof(float);
    const MemPart tag[] = {MEM_PARAMS, MEM_GRADS, MEM_OPTIM};
    const unsigned part[] = {MODEL_PARAMS, MODEL_GRADS, MODEL_VELOCITY};
    for (int k = 0; k < 3; k++) {
        MemStats a = mem_stats();
        model_release(m, part[k]);
        MemStats b = mem_stats();
        assert_int_equal(a.live[tag[k]] - b.live[tag[k]], P);
        assert_int_equal(a.live_total - b.live_total, P);
        model_release(m, part[k]);  // twice: nothing more
        assert_int_equal(mem_stats().live_total, b.live_total);
        model_materialize(m, part[k]);
        assert_int_equal(mem_stats().live_total, a.live_total);
    }
    assert_non_null(m->params), assert_non_null(m->grads), assert_non_null(m->velocity);
    for (size_t i = 0; i < m->n_params; i++) assert_true(m->grads[i] == 0.0f);
    // The activations: everything a batch needs, which is all of MEM_ACTS.
    MemStats a = mem_stats();
    model_release(m, MODEL_ACTS);
    assert_null(m->acts), assert_null(m->dacts), assert_null(m->saved), assert_null(m->work);
    assert_null(m->input), assert_null(m->labels), assert_null(m->dlogits);
    MemStats b = mem_stats();
    const size_t F = sizeof(float), all_but_acts = (2 * m->n_params + m->n_params + m->n_buffers) * F;
    assert_int_equal(a.live_total - b.live_total, model_device_bytes(m) - all_but_acts);
    assert_int_equal(a.live[MEM_PARAMS], b.live[MEM_PARAMS]);
    model_materialize(m, MODEL_ACTS);
    assert_int_equal(mem_stats().live[MEM_ACTS], a.live[MEM_ACTS]);
    model_free(m);
}

// A model whose parts are released and brought back, with its params and momentum restored, computes the same
// step as one that never released anything: logits, gradients (and the input's), updated params, to the bit.
typedef struct {
    float *logits, *grads, *dinput, *params;
} StepOut;

static StepOut one_step(Model *m, const float *x, const float *dl, int n) {
    StepOut o = {0};
    size_t out = (size_t)n * m->layers[m->n_layers - 1].c * m->layers[m->n_layers - 1].h * m->layers[m->n_layers - 1].w;
    size_t in = (size_t)n * m->in_c * m->in_h * m->in_w;
    o.logits = malloc(out * sizeof(float)), o.grads = malloc(m->n_params * sizeof(float));
    o.params = malloc(m->n_params * sizeof(float)), o.dinput = malloc(in * sizeof(float));
    model_zero_grad(m);
    memcpy(o.logits, model_forward(m, x, n, true), out * sizeof(float));
    model_backward(m, x, dl, n);
    memcpy(o.grads, m->grads, m->n_params * sizeof(float));
    if (model_input_grad(m)) memcpy(o.dinput, model_input_grad(m), in * sizeof(float));
    else memset(o.dinput, 0, in * sizeof(float));
    SgdConfig c = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f};
    optim_step(m, &c);
    memcpy(o.params, m->params, m->n_params * sizeof(float));
    return o;
}

static void check_restored_step(const char *name, bool stage) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, name, 8, 3, 16, 16, 10));
    Model *whole = model_create(&cfg, DEVICE_CPU, 4, 7);
    int L = whole->n_layers, first = 0;
    model_free(whole);
    if (stage)
        for (first = 1; first < L && !model_cut_ok(&cfg, first); first++) continue;
    assert_true(first < L);
    Model *a = model_create_stage(&cfg, DEVICE_CPU, 4, 7, first, L);
    Model *b = model_create_stage(&cfg, DEVICE_CPU, 4, 7, first, L);
    const int n = 3;
    size_t in = (size_t)n * a->in_c * a->in_h * a->in_w, out = (size_t)n * 10;
    float *x = malloc(in * sizeof(float)), *dl = malloc(out * sizeof(float));
    fill_uniform(x, in, -1.0f, 1.0f, 11);
    fill_uniform(dl, out, -0.1f, 0.1f, 12);
    float *saved = malloc(a->n_params * sizeof(float));
    memcpy(saved, b->params, b->n_params * sizeof(float));
    model_release(b, MODEL_PARAMS | MODEL_GRADS | MODEL_VELOCITY | MODEL_ACTS);
    assert_null(b->params), assert_null(b->grads), assert_null(b->velocity), assert_null(b->acts);
    model_materialize(b, MODEL_PARAMS | MODEL_GRADS | MODEL_VELOCITY | MODEL_ACTS);
    memcpy(b->params, saved, b->n_params * sizeof(float));
    memset(b->velocity, 0, b->n_params * sizeof(float));
    StepOut ra = one_step(a, x, dl, n), rb = one_step(b, x, dl, n);
    assert_memory_equal(ra.logits, rb.logits, out * sizeof(float));
    assert_memory_equal(ra.grads, rb.grads, a->n_params * sizeof(float));
    assert_memory_equal(ra.dinput, rb.dinput, in * sizeof(float));
    assert_memory_equal(ra.params, rb.params, a->n_params * sizeof(float));
    StepOut all[] = {ra, rb};
    for (int k = 0; k < 2; k++) free(all[k].logits), free(all[k].grads), free(all[k].dinput), free(all[k].params);
    free(x), free(dl), free(saved);
    model_free(a), model_free(b);
}

static void test_release_then_same_step(void **state) {
    check_restored_step("tiny", false);
    check_restored_step("tiny-bn", false);
    check_restored_step("tiny-bn", true);
    check_restored_step("resnet9", true);
}

// A view cannot release; forward / backward / optimizer on a released part stop with a report naming it.
static float g_x[4 * 3 * 16 * 16];
// Each runs in a child (child_exit_status, tests/testutil.h) on the model it is given.
static void run_forward(void *m) { model_forward(m, g_x, 4, true); }
static void run_backward(void *m) { model_backward(m, g_x, ((Model *)m)->dlogits, 4); }
static void run_optim(void *m) {
    SgdConfig c = {.lr = 0.1f, .momentum = 0.9f};
    optim_step(m, &c);
}
static void run_view_release(void *m) {
    Model *v = model_create_view(m, 2);
    model_release(v, MODEL_PARAMS);
}

static void test_released_refused(void **state) {
    char report[4096];
    Model *m = make("tiny", 4);
    struct {
        unsigned part;
        void (*fn)(void *);
        const char *names;
    } cases[] = {
        {MODEL_PARAMS, run_forward, "parameters"},  {MODEL_ACTS, run_forward, "activations"},
        {MODEL_GRADS, run_backward, "gradients"},   {MODEL_VELOCITY, run_optim, "momentum"},
        {MODEL_PARAMS, run_optim, "parameters"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        model_release(m, cases[i].part);
        int status = child_exit_status(cases[i].fn, m, report, sizeof report);
        if (status != 1 || !strstr(report, cases[i].names) || !strstr(report, "HINT"))
            fail_msg("case %zu: exit status %d, report: %s", i, status, report);
        model_materialize(m, cases[i].part);
    }
    int status = child_exit_status(run_view_release, m, report, sizeof report);
    if (status != 1 || !strstr(report, "view")) fail_msg("view release: exit status %d, report: %s", status, report);
    model_free(m);
}

// The CUDA half of test_cuda_counts, on a thread of its own: the thread's CUDA context (its stream, handles and
// GEMM-input scratch, kit/cuda/cuda_context.cu) is made for it and freed when it exits, so that the caller can check
// that every counted byte came back.
static void *cuda_model_counts(void *arg) {
    (void)arg;
    MemStats s0 = mem_stats();
    void *a = device_alloc_as(DEVICE_CUDA, 4000, MEM_COMM);
    assert_int_equal(mem_stats().live[MEM_COMM] - s0.live[MEM_COMM], 4000);
    device_free(DEVICE_CUDA, a);
    assert_int_equal(mem_stats().live_total, s0.live_total);
    ModelConfig cfg;
    assert_true(model_config(&cfg, "tiny", 4, 3, 8, 8, 10));
    Model *g = model_create(&cfg, DEVICE_CUDA, 2, 3), *c = model_create(&cfg, DEVICE_CPU, 2, 3);
    const size_t P = g->n_params * sizeof(float);
    MemStats s1 = mem_stats();
    model_release(g, MODEL_PARAMS | MODEL_VELOCITY);
    assert_int_equal(s1.live_total - mem_stats().live_total, 2 * P);
    model_materialize(g, MODEL_PARAMS | MODEL_VELOCITY);
    device_copy_to(DEVICE_CUDA, g->params, c->params, P);
    float x[2 * 3 * 8 * 8], gl[20], cl[20];
    fill_uniform(x, sizeof x / sizeof x[0], -1.0f, 1.0f, 5);
    device_copy_to(DEVICE_CUDA, g->input, x, sizeof x);
    device_copy_from(DEVICE_CUDA, gl, model_forward(g, g->input, 2, false), sizeof gl);
    memcpy(cl, model_forward(c, x, 2, false), sizeof cl);
    // The GPU's kernels sum the same products in another order: each logit is a sum of at most K = 4 * 8 * 8 = 256
    // products (the linear layer; the convs' are shorter), off by at most K * 2^-24 of the sum of their sizes,
    // which the 1e-4 of the logits' scale (relative, floor 1e-3) bounds with room for the ReLU's inputs' own error.
    Compare cmp = compare_arrays(gl, cl, 20);
    if (cmp.error > 1e-4) fail_msg("CUDA logits differ from the CPU's: error %g, ratio %g", cmp.error, cmp.ratio);
    model_free(g), model_free(c);
    // What the forward pass left is this thread's CUDA context only (its scratch and flags, counted as other).
    MemStats s2 = mem_stats();
    for (int p = 0; p < MEM_PARTS; p++)
        if (p != MEM_OTHER) assert_int_equal(s2.live[p], s0.live[p]);
    return NULL;
}

// On the CUDA device (a GPU, or the emulator of the EMU=1 build) the same counts: cudaMalloc'd bytes by part,
// and a CUDA model's release and materialize, whose forward then gives the CPU model's logits (same params).
static void test_cuda_counts(void **state) {
    skip_without_cuda();
    MemStats s0 = mem_stats();
    on_own_thread(cuda_model_counts, NULL);
    assert_int_equal(mem_stats().live_total, s0.live_total);  // the thread's context, scratch included, freed
}

// A thread's GEMM-input scratch on the GPU (cuda_device_scratch: 16-bit copies of conv's and linear's inputs) is
// kit memory: counted as other while it lives, grown by exactly what it grows, and given back when the thread exits.
#ifdef KIT_CUDA
static void *cuda_scratch_counts(void *arg) {
    size_t *grew = arg;
    MemStats s0 = mem_stats();
    (void)cuda_device_scratch(1000);
    grew[0] = mem_stats().live[MEM_OTHER] - s0.live[MEM_OTHER];
    (void)cuda_device_scratch(500);  // fits: no new allocation
    grew[1] = mem_stats().live[MEM_OTHER] - s0.live[MEM_OTHER];
    (void)cuda_device_scratch(1 << 20);
    grew[2] = mem_stats().live[MEM_OTHER] - s0.live[MEM_OTHER];
    return NULL;
}
#endif

static void test_cuda_scratch_counted(void **state) {
    skip_without_cuda();
#ifdef KIT_CUDA
    MemStats s0 = mem_stats();
    size_t grew[3];
    on_own_thread(cuda_scratch_counts, grew);
    assert_int_equal(grew[0], 1000);
    assert_int_equal(grew[1], 1000);
    assert_int_equal(grew[2], 1 << 20);  // the old buffer given back, the new one counted
    assert_int_equal(mem_stats().live_total, s0.live_total);
#endif
}

// conv2d's work on CUDA is the thread's context's (cuda_conv_work), taken by the pass that runs: cuDNN's workspace
// when cuDNN takes the passes, one chunk's im2col columns and GEMM output (chunk * P*Q * (C*R*R + K) floats) only
// when im2col + cuBLAS does. Before, every model held a buffer of im2col's size whichever engine ran (256 MiB for
// ResNet-9 at batch 93 or more). Float32 GEMMs here: no 16-bit copies join the count.
#ifdef KIT_CUDA
static void *conv_work_counts(void *arg) {
    size_t *grew = arg;
    const Conv2dDims s = {.n = 5, .c = 16, .h = 12, .w = 12, .k = 8, .r = 3, .stride = 1, .pad = 1};
    const size_t nx = (size_t)s.n * s.c * s.h * s.w, nw = (size_t)s.k * s.c * s.r * s.r, ny = (size_t)s.n * s.k * 144;
    float *hx = uniform_vec(nx, -1, 1, 1), *hw = uniform_vec(nw, -1, 1, 2), *hdy = uniform_vec(ny, -1, 1, 3);
    float *x = device_alloc(DEVICE_CUDA, nx * sizeof(float)), *w = device_alloc(DEVICE_CUDA, nw * sizeof(float));
    float *y = device_alloc(DEVICE_CUDA, ny * sizeof(float)), *dy = device_alloc(DEVICE_CUDA, ny * sizeof(float));
    float *dx = device_alloc(DEVICE_CUDA, nx * sizeof(float)), *dw = device_alloc(DEVICE_CUDA, nw * sizeof(float));
    device_copy_to(DEVICE_CUDA, x, hx, nx * sizeof(float)), device_copy_to(DEVICE_CUDA, w, hw, nw * sizeof(float));
    device_copy_to(DEVICE_CUDA, dy, hdy, ny * sizeof(float));
    device_memset_zero(DEVICE_CUDA, dx, nx * sizeof(float)), device_memset_zero(DEVICE_CUDA, dw, nw * sizeof(float));
    grew[0] = conv2d_work_floats(DEVICE_CUDA, &s);  // the caller's share: none
    const size_t before = mem_stats().live[MEM_OTHER];
    const bool was = cuda_conv_use_cudnn(true);
    conv2d_forward(DEVICE_CUDA, &s, x, w, NULL, y, NULL);
    conv2d_backward(DEVICE_CUDA, &s, x, w, dy, dx, dw, NULL, NULL);
    grew[1] = mem_stats().live[MEM_OTHER] - before;
    cuda_conv_set_work_budget(2 * 144 * (16 * 9 + 8));  // two images per chunk: 2 + 2 + 1
    cuda_conv_use_cudnn(false);
    conv2d_forward(DEVICE_CUDA, &s, x, w, NULL, y, NULL);
    conv2d_backward(DEVICE_CUDA, &s, x, w, dy, dx, dw, NULL, NULL);
    grew[2] = mem_stats().live[MEM_OTHER] - before;
    cuda_conv_set_work_budget(0);
    cuda_conv_use_cudnn(was);
    float *bufs[] = {x, w, y, dy, dx, dw};
    for (int i = 0; i < 6; i++) device_free(DEVICE_CUDA, bufs[i]);
    free(hx), free(hw), free(hdy);
    return NULL;
}
#endif

static void test_cuda_conv_work_on_demand(void **state) {
    skip_without_cuda();
#ifdef KIT_CUDA
    MemStats s0 = mem_stats();
    size_t grew[3];
    on_own_thread(conv_work_counts, grew);
    const size_t chunk_bytes = (size_t)2 * 144 * (16 * 9 + 8) * sizeof(float);
    assert_int_equal(grew[0], 0);
    // cuDNN's workspace (whatever its algorithm asks for: in the emulator, one image's columns for forward's GEMM
    // algorithm) stays below what one chunk of im2col holds; a build where cuDNN takes no pass leaves it at 0.
    assert_true(grew[1] < chunk_bytes);
    assert_int_equal(grew[2], chunk_bytes);  // im2col's chunk exactly, the workspace's buffer given back for it
    assert_int_equal(mem_stats().live_total, s0.live_total);  // all of it freed with the thread
#endif
}

// The CPU's bf16 GEMM scratch (kit/cpu_bf16.c) likewise: a thread's buffers are counted as other. They live until
// the process exits (they are cached per thread), so the check is on the growth.
static void *bf16_scratch_counts(void *arg) {
    size_t *grew = arg;
    MemStats s0 = mem_stats();
    (void)cpu_bf16_scratch(0, 4096);
    (void)cpu_bf16_scratch(1, 100);
    grew[0] = mem_stats().live[MEM_OTHER] - s0.live[MEM_OTHER];
    (void)cpu_bf16_scratch(0, 1 << 16);
    grew[1] = mem_stats().live[MEM_OTHER] - s0.live[MEM_OTHER];
    return NULL;
}

static void test_cpu_bf16_scratch_counted(void **state) {
    size_t grew[2];
    on_own_thread(bf16_scratch_counts, grew);
    assert_int_equal(grew[0], 4096 + 100);
    assert_int_equal(grew[1], (1 << 16) + 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_exact),        cmocka_unit_test(test_peak_and_reset),
        cmocka_unit_test(test_many_live_allocations), cmocka_unit_test(test_threads),
        cmocka_unit_test(test_model_tags),          cmocka_unit_test(test_release_exact),
        cmocka_unit_test(test_release_then_same_step), cmocka_unit_test(test_released_refused),
        cmocka_unit_test(test_cuda_counts),         cmocka_unit_test(test_cuda_scratch_counted),
        cmocka_unit_test(test_cuda_conv_work_on_demand),
        cmocka_unit_test(test_cpu_bf16_scratch_counted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
