// tests/test_loader.c: the background loader gives exactly the batches a direct dataset_fill_batch
// gives, resumes mid-epoch, shuts down cleanly mid-epoch, and handles the short last batch; on the CPU,
// batch_on_device leaves the copy to the caller (the CUDA side: tests/test_cuda.c).
#include "tests/testutil.h"

#include <time.h>

#include "kit/data.h"

enum { IMG = 3 * 8 * 8 };

typedef struct {
    Dataset ds;
    Sampler s;
} Fixture;

static int setup(void **state) {
    Fixture *f = calloc(1, sizeof *f);
    dataset_synthetic(&f->ds, 203, 10, 3, 8, 8, 21, SPLIT_TRAIN);
    // Rank 1 of 2, padded: 102 indices per epoch.
    sampler_init(&f->s, f->ds.n, 1, 2, 21, SAMPLER_TRAIN_PAD);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    Fixture *f = *state;
    dataset_free(&f->ds);
    free(f);
    return 0;
}

// What batch k of an epoch must hold: a direct fill from the sampler's indices.
typedef struct {
    int n;
    float x[16 * IMG];
    int y[16];
} Expected;

static int expected_batches(const Fixture *f, int epoch, int batch, bool drop_last, const Augment *aug, uint64_t seed,
                            Expected *out, int max) {
    Sampler s = f->s;
    sampler_set_epoch(&s, epoch);
    int len = sampler_len(&s), *idx = malloc((size_t)len * sizeof *idx);
    sampler_indices(&s, idx);
    int nb = 0;
    for (int first = 0; first < len && nb < max; first += batch) {
        int n = len - first < batch ? len - first : batch;
        if (n < batch && drop_last) break;
        out[nb].n = n;
        dataset_fill_batch(&f->ds, idx + first, n, aug, seed, epoch, out[nb].x, out[nb].y);
        nb++;
    }
    free(idx);
    return nb;
}

static void assert_batch(const Batch *b, const Expected *e, int index) {
    assert_non_null(b);
    assert_int_equal(b->index, index);
    assert_int_equal(b->n, e->n);
    assert_memory_equal(b->y, e->y, (size_t)e->n * sizeof(int));
    assert_memory_equal(b->x, e->x, (size_t)e->n * IMG * sizeof(float));
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void test_same_batches_as_direct_fill(void **state) {
    Fixture *f = *state;
    static Expected e[8];
    Augment aug = {.crop_pad = 2, .flip = true};
    Loader *L = loader_create(&f->ds, &f->s, 16, false, &aug, 77);
    assert_int_equal(loader_batches_per_epoch(L), 7);  // 102 = 6 * 16 + 6
    for (int epoch = 3; epoch <= 4; epoch++) {
        int nb = expected_batches(f, epoch, 16, false, &aug, 77, e, 8);
        assert_int_equal(nb, 7);
        loader_start_epoch(L, epoch, 0);
        for (int k = 0; k < nb; k++) {
            double wait = -1;
            const Batch *b = loader_next(L, &wait);
            assert_true(wait >= 0);
            assert_batch(b, &e[k], k);
            // While the worker fills the next batch, this one stays intact (double buffering).
            sleep_ms(2);
            assert_batch(b, &e[k], k);
        }
        assert_null(loader_next(L, NULL));
        assert_null(loader_next(L, NULL));  // stays at the end
    }
    loader_free(L);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// The prefetch really happens in the background: with enough "compute" between calls, loader_next
// hardly waits, although each batch costs a measurable fill (a synchronous loader would wait that long).
static void test_prefetch_hides_the_wait(void **state) {
    enum { N = 4096, B = 512, STEPS = 8 };
    Dataset ds;
    dataset_synthetic(&ds, N, 10, 3, 32, 32, 5, SPLIT_TRAIN);
    Sampler s;
    sampler_init(&s, N, 0, 1, 5, SAMPLER_TRAIN_DROP);
    Augment aug = {.crop_pad = 4, .flip = true};
    int idx[B], y[B];
    float *x = malloc((size_t)B * 3072 * sizeof *x);
    for (int i = 0; i < B; i++) idx[i] = i;
    double fill = INFINITY;  // the fastest of a few direct fills (the first ones touch fresh pages)
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        dataset_fill_batch(&ds, idx, B, &aug, 5, 0, x, y);
        double t = now_s() - t0;
        fill = t < fill ? t : fill;
    }
    free(x);
    Loader *L = loader_create(&ds, &s, B, true, &aug, 5);
    loader_start_epoch(L, 0, 0);
    double total = 0, wait = 0;
    int compute_ms = 20 + (int)(1e4 * fill), hidden = 0;  // ample time, even on a loaded machine
    for (int k = 0; k < STEPS; k++) {
        sleep_ms(compute_ms);
        assert_non_null(loader_next(L, &wait));
        assert_true(wait >= 0);
        total += wait;
        hidden += wait < 0.5 * fill;
    }
    print_message("one fill of %d images takes %.2f ms; with %d ms of compute per batch, %d of %d loader_next "
                  "calls waited less than half a fill (%.3f ms in all)\n", B, 1e3 * fill, compute_ms, hidden, STEPS,
                  1e3 * total);
    // A synchronous loader would wait a whole fill every time (0 of 8); a few stalls of a busy machine
    // (other processes' spinning threads can starve the worker) are tolerated.
    assert_true(hidden >= STEPS / 2);
    loader_free(L);
    dataset_free(&ds);
}

static void test_resume_gives_the_tail(void **state) {
    Fixture *f = *state;
    static Expected e[8];
    Augment aug = {.crop_pad = 1, .flip = true};
    int nb = expected_batches(f, 5, 16, false, &aug, 3, e, 8);
    for (int start = 0; start <= nb; start++) {
        Loader *L = loader_create(&f->ds, &f->s, 16, false, &aug, 3);
        loader_start_epoch(L, 5, start);
        for (int k = start; k < nb; k++) assert_batch(loader_next(L, NULL), &e[k], k);
        assert_null(loader_next(L, NULL));
        loader_free(L);
    }
    // Restarting an epoch in the middle of another one cancels the rest of the old one.
    Loader *L = loader_create(&f->ds, &f->s, 16, false, &aug, 3);
    loader_start_epoch(L, 4, 0);
    assert_non_null(loader_next(L, NULL));
    assert_non_null(loader_next(L, NULL));
    loader_start_epoch(L, 5, 2);
    for (int k = 2; k < nb; k++) assert_batch(loader_next(L, NULL), &e[k], k);
    assert_null(loader_next(L, NULL));
    loader_free(L);
}

// Freeing mid-epoch (a batch in flight, or none yet) neither hangs nor leaks (ASan checks the leaks).
static void test_free_mid_epoch(void **state) {
    Fixture *f = *state;
    Augment aug = {.crop_pad = 2, .flip = true};
    loader_free(loader_create(&f->ds, &f->s, 16, false, &aug, 1));  // never started
    for (int taken = 0; taken < 4; taken++) {
        Loader *L = loader_create(&f->ds, &f->s, 16, false, &aug, 1);
        loader_start_epoch(L, 0, 0);
        for (int k = 0; k < taken; k++) assert_non_null(loader_next(L, NULL));
        loader_free(L);  // the worker is filling (or has filled) the next batch
    }
    loader_free(NULL);
}

// On the CPU the batch is where the model reads it already: batch_on_device says no (the caller's copy
// is a memcpy) and never starts the CUDA staging. The batch knows its loader; a copy of it is not staged.
static void test_batch_on_device_cpu(void **state) {
    Fixture *f = *state;
    Loader *L = loader_create(&f->ds, &f->s, 16, false, NULL, 1);
    loader_start_epoch(L, 0, 0);
    const float *x = NULL;
    const int *y = NULL;
    for (int k = 0; k < 3; k++) {
        const Batch *b = loader_next(L, NULL);
        assert_non_null(b);
        assert_ptr_equal(b->loader, L);
        assert_false(batch_on_device(b, DEVICE_CPU, &x, &y));
        Batch copy = *b;
        assert_false(batch_on_device(&copy, DEVICE_CUDA, &x, &y));
    }
    assert_null(x);
    assert_null(y);
    loader_free(L);
}

static void test_short_last_batch(void **state) {
    Fixture *f = *state;
    static Expected e[8];
    for (int drop = 0; drop < 2; drop++) {
        Loader *L = loader_create(&f->ds, &f->s, 16, drop, NULL, 1);
        assert_int_equal(loader_batches_per_epoch(L), drop ? 6 : 7);
        int nb = expected_batches(f, 1, 16, drop, NULL, 1, e, 8);
        loader_start_epoch(L, 1, 0);
        int samples = 0, k = 0;
        const Batch *b;
        while ((b = loader_next(L, NULL)) != NULL) {
            assert_true(k < nb);
            assert_batch(b, &e[k], k);
            samples += b->n;
            k++;
        }
        assert_int_equal(k, nb);
        assert_int_equal(samples, drop ? 96 : 102);
        if (!drop) assert_int_equal(e[6].n, 6);
        loader_free(L);
    }
    // A batch larger than the whole shard: one short batch, or none with drop_last.
    Loader *L = loader_create(&f->ds, &f->s, 128, false, NULL, 1);
    loader_start_epoch(L, 0, 0);
    const Batch *b = loader_next(L, NULL);
    assert_non_null(b);
    assert_int_equal(b->n, 102);
    assert_null(loader_next(L, NULL));
    loader_free(L);
    L = loader_create(&f->ds, &f->s, 128, true, NULL, 1);
    assert_int_equal(loader_batches_per_epoch(L), 0);
    loader_start_epoch(L, 0, 0);
    assert_null(loader_next(L, NULL));
    loader_free(L);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_batches_as_direct_fill, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefetch_hides_the_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_gives_the_tail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_mid_epoch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short_last_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_on_device_cpu, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
