// tests/test_trace.c: the timeline writer (kit/trace.h). Two "ranks" are written one after the other in this
// process (the writer holds one rank at a time), merged, and the merged file is read back by
// tools/trace_check.py (python3's json): valid JSON, spans nested per track, async spans paired, the clock offset
// of rank 1 applied, every event of a run that overflowed the buffer kept, nothing recorded while off.
#include <pthread.h>

#include "kit/trace.h"
#include "testutil.h"

static char dir[] = "/tmp/kit-trace-XXXXXX";
static char path[64];

// Runs tools/trace_check.py on the merged file with `args`; its exit status (0: every check held).
static int check(const char *args) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 tools/trace_check.py '%s' %s", path, args);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void *worker(void *arg) {
    (void)arg;
    trace_thread_name("worker");
    double t = trace_begin("load");
    trace_end(t, TRACE_DATA, "load");
    return NULL;
}

// Rank r's events: an outer span with two spans inside at known local times, an async span that begins inside a
// span and outlives it, an instant, and a span on another thread.
static void write_rank(int r, double offset_us) {
    trace_open(path, r, 2);
    trace_set_clock(offset_us, 0.5);
    trace_thread_name("main");
    trace_complete_at(1000.0, 100.0, TRACE_COMPUTE, "outer");
    trace_complete_at(1010.0, 20.0, TRACE_COMPUTE, "inner");
    trace_complete_at(1050.0, 30.0, TRACE_COMPUTE, "inner");
    double t = trace_begin("backward");
    uint64_t id = trace_async_begin(TRACE_COMM, "all-reduce bucket %d", 3);  // starts inside backward, ends after
    trace_end(t, TRACE_COMPUTE, "backward");
    trace_async_end(id);
    trace_name_next("reduce-scatter unit %d", 2);  // taken by the next async span begun without a name
    trace_async_end(trace_async_begin_named(TRACE_COMM, "reduce-scatter"));
    trace_instant(TRACE_STEP, "skipped step %d", 7);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, worker, NULL), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    trace_close();
}

static void test_two_ranks_merged(void **state) {
    (void)state;
    write_rank(0, 0.0);
    write_rank(1, 5000.0);
    // 2 ranks x (3 + 1 complete spans on main, 1 on the worker, 2 async pairs = 4, 1 instant) = 2 x 10 events, and
    // 2 x (process_name, sort index, labels, 2 thread names) metadata events.
    assert_int_equal(trace_merge(path, 2), 2 * 10 + 2 * 5);
    assert_int_equal(check("--ranks 2 --ts 0:outer:1000 --ts 1:outer:6000 --count 0:inner:2 --count 1:inner:2 "
                           "--overlap 'all-reduce bucket 3' backward --count 1:load:1"), 0);
    // The checker can fail: rank 1's span is not at rank 0's time (the offset was applied).
    assert_int_not_equal(check("--ts 1:outer:1000"), 0);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "grep -q '\"name\":\"reduce-scatter unit 2\"' '%s' && grep -q '\"ph\":\"i\"' '%s'", path, path);
    assert_int_equal(system(cmd), 0);
}

static void test_full_buffer_flushes(void **state) {
    (void)state;
    setenv("KIT_TRACE_EVENTS", "16", 1);  // the least: 1000 spans flush it many times
    trace_open(path, 0, 1);
    trace_set_clock(0.0, 0.0);
    for (int i = 0; i < 1000; i++) trace_complete_at(10.0 * i, 5.0, TRACE_COMPUTE, "span");
    trace_close();
    unsetenv("KIT_TRACE_EVENTS");
    assert_true(trace_merge(path, 1) > 1000);  // the 1000 spans, the flushes' own spans, the metadata
    assert_int_equal(check("--ranks 1 --count 0:span:1000 --min-count '0:trace flush:50'"), 0);
}

static void test_off_records_nothing(void **state) {
    (void)state;
    trace_open(path, 0, 1);
    trace_complete_at(0.0, 1.0, TRACE_COMPUTE, "kept");
    trace_close();
    // Off: the macros return at once; a span begun while off is not written even if tracing turned on since.
    double t = trace_begin("lost");
    assert_true(t == 0.0);
    assert_int_equal(kit_trace_flags & 1u, 0);
    trace_end(t, TRACE_COMPUTE, "lost");
    trace_instant(TRACE_STEP, "lost");
    assert_int_equal(trace_async_begin(TRACE_COMM, "lost"), 0);
    assert_int_equal(trace_merge(path, 1), 1 + 4);  // "kept" and the metadata
    assert_int_equal(check("--count 0:kept:1 --count 0:lost:0"), 0);
}

static void test_missing_rank_file(void **state) {
    (void)state;
    char other[128];
    snprintf(other, sizeof other, "%s/none.json", dir);
    assert_int_equal(trace_merge(other, 2), -1);
}

int main(void) {
    if (!mkdtemp(dir)) die("mkdtemp %s failed", dir);
    snprintf(path, sizeof path, "%s/t.json", dir);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks_merged),
        cmocka_unit_test(test_full_buffer_flushes),
        cmocka_unit_test(test_off_records_nothing),
        cmocka_unit_test(test_missing_rank_file),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (getenv("KEEP") == NULL && system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    return failed;
}
