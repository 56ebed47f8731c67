// tests/test_check.c: the error reports of kit/check.h: what they say, their exit status, and that each is
// ONE write() to stderr, so that the reports of several ranks under mpirun cannot interleave.
//
// How a test sees the number of write() calls: the child's stderr is one end of a SOCK_SEQPACKET socket
// pair, which keeps message boundaries; every write() becomes one packet, and the parent counts them.
#include "tests/testutil.h"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    int status;       // exit status (-1 when killed by a signal)
    int writes;       // write() calls the child made to stderr
    char text[4096];  // everything it wrote, NUL-terminated
} Report;

// Runs fn() in a child with stderr on a packet socket; returns what it wrote and how.
static Report run_child(void (*fn)(void)) {
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    fflush(stdout);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(sv[0]);
        dup2(sv[1], STDERR_FILENO);
        fn();
        _exit(0);
    }
    close(sv[1]);
    Report r = {.status = -1};
    size_t used = 0;
    for (;;) {
        char packet[4096];
        ssize_t n = recv(sv[0], packet, sizeof packet, 0);
        if (n <= 0) break;  // 0: the child closed its end (it exited)
        r.writes++;
        size_t take = (size_t)n < sizeof r.text - 1 - used ? (size_t)n : sizeof r.text - 1 - used;
        memcpy(r.text + used, packet, take);
        used += take;
    }
    r.text[used] = '\0';
    close(sv[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (WIFEXITED(status)) r.status = WEXITSTATUS(status);
    return r;
}

static void call_die(void) { die("the file %s has %d bytes, expected %d", "x.bin", 12, 3072); }

static void call_check(void) {
    int n = 0;
    CHECK(n > 0, "the dataset is empty");
}

static void call_checkf(void) {
    int i = 7, n = 5;
    CHECKF(i < n, "indices come from the sampler", "index %d is outside 0..%d", i, n - 1);
}

static void call_die_long(void) {
    static char huge[10000];
    memset(huge, 'a', sizeof huge - 1);
    die("%s", huge);
}

static void test_die_one_line_one_write(void **state) {
    Report r = run_child(call_die);
    assert_int_equal(r.status, 1);
    assert_string_equal(r.text, "error: the file x.bin has 12 bytes, expected 3072\n");
    assert_int_equal(r.writes, 1);
}

// file:line, the condition as written, the error and the hint: three lines, one write.
static void test_check_report_one_write(void **state) {
    Report r = run_child(call_check);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.text, "tests/test_check.c:"));
    assert_non_null(strstr(r.text, ": n > 0\n  error: condition is false\n  HINT: the dataset is empty\n"));
    assert_int_equal(r.writes, 1);
}

static void test_checkf_names_the_condition(void **state) {
    Report r = run_child(call_checkf);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.text, ": i < n\n  error: index 7 is outside 0..4\n  HINT: indices come from the sampler\n"));
    assert_int_equal(r.writes, 1);
}

// A message longer than the report buffer is cut, but still one write ending in a newline.
static void test_die_truncates_long_message(void **state) {
    Report r = run_child(call_die_long);
    assert_int_equal(r.status, 1);
    assert_int_equal(r.writes, 1);
    size_t len = strlen(r.text);
    assert_true(len > 100 && len < 10000);
    assert_true(strncmp(r.text, "error: aaa", 10) == 0);
    assert_int_equal(r.text[len - 1], '\n');
}

// ---------------------------------------------------------------- lists and tables of names

static const char *fruit(int i) {
    static const char *names[] = {"apple", "pear", "fig"};
    return names[i];
}

static void test_names_joined_once(void **state) {
    (void)state;
    static char names[32];
    const char *a = check_names(names, sizeof names, 3, fruit);
    assert_string_equal(a, "apple|pear|fig");
    assert_ptr_equal(check_names(names, sizeof names, 3, fruit), names);  // built once, the same buffer after
    char list[32] = "";
    check_join(list, sizeof list, ", ", "a");  // no separator before the first
    check_join(list, sizeof list, " or ", "b");
    assert_string_equal(list, "a or b");
}

static void call_join_overflow(void) {
    char small[8] = "abcd";
    check_join(small, sizeof small, "|", "efgh");
}

// A list that does not fit is a bug in the kit: a report, never a cut list.
static void test_join_overflow_reports(void **state) {
    (void)state;
    Report r = run_child(call_join_overflow);
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.text, "\"efgh\" does not fit"));
}

static void test_text_table(void **state) {
    (void)state;
    static const CheckText table[] = {{3, "three"}, {7, "seven"}};
    assert_string_equal(CHECK_TEXT(7, table, "other"), "seven");
    assert_string_equal(CHECK_TEXT(3, table, "other"), "three");
    assert_string_equal(CHECK_TEXT(4, table, "other"), "other");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_die_one_line_one_write),
        cmocka_unit_test(test_check_report_one_write),
        cmocka_unit_test(test_checkf_names_the_condition),
        cmocka_unit_test(test_die_truncates_long_message),
        cmocka_unit_test(test_names_joined_once),
        cmocka_unit_test(test_join_overflow_reports),
        cmocka_unit_test(test_text_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
