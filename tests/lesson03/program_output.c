// tests/lesson03/program_output.c: lesson 03's check of the learner's whole program, through its own output.
//
// The autograder binary contains the learner's main() too (train.c renames it ddp_program_main under
// AUTOGRADER), so `test_lesson03 --program ARGS` IS the learner's program. test_only_rank0_prints starts it on
// 2 ranks through scripts/launch.sh, as a learner would, in a fresh job of its own (the test's own launcher
// variables removed, so the new mpirun does not take itself for a rank of the grading job), and counts the
// lines that must appear once: with every rank printing (is_main wrong), each appears once per rank.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/testutil.h"
#define GRADING_HELPERS_ONLY  // test_lesson03.c has main() and the verdict channel
#include "tests/grading.h"

int ddp_program_main(int argc, char **argv);  // the learner's main() (train.c)
void test_only_rank0_prints(void **state);
int lesson03_program_dispatch(int argc, char **argv);

enum { PROGRAM_RANKS = 2, PROGRAM_TIMEOUT_S = 90 };

// `test_lesson03 --program ARGS...` runs the learner's program with ARGS; returns -1 for any other command line.
int lesson03_program_dispatch(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--program") != 0) return -1;
    argv[1] = argv[0];
    return ddp_program_main(argc - 1, argv + 1);
}

// Removes the grading job's variables from this process's environment: the launcher's (Open MPI, PMIx), and the
// driver's verdict channel (tests/grading.h), which belongs to the test, not to the program it starts.
static void forget_launcher(void) {
    extern char **environ;
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e; e++) {
            if (strncmp(*e, "OMPI_", 5) == 0 || strncmp(*e, "PMIX_", 5) == 0 || strncmp(*e, "CMOCKA_", 7) == 0 ||
                strncmp(*e, "GRADING_CHANNEL=", 16) == 0) {
                char name[256];
                size_t len = strcspn(*e, "=");
                snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), *e);
                unsetenv(name);
                again = 1;  // unsetenv moves the entries: start over
                break;
            }
        }
    }
}

// Runs the program on PROGRAM_RANKS ranks with its output in `log`. Returns its exit status (-1: did not finish).
static int run_program(const char *log) {
    const char *root = getenv("GRADING_ROOT");
    char launch[4096], self[4096];
    snprintf(launch, sizeof launch, "%s/scripts/launch.sh", root && *root ? root : ".");
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return -1;
    self[len] = '\0';
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        setpgid(0, 0);  // its own process group, so that a hung run can be stopped whole
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) _exit(126);
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        forget_launcher();
        setenv("KIT_PROGRESS", "plain", 1);
        char np[16];
        snprintf(np, sizeof np, "%d", PROGRAM_RANKS);
        char *args[] = {launch, np, self, "--program", "--dataset", "synthetic", "--model", "tiny", "--epochs", "1",
                        "--batch-size", "64", "--device", "cpu", "--backend", "mpi", NULL};
        execv(launch, args);
        _exit(127);
    }
    int status = 0;
    for (int waited_ms = 0;; waited_ms += 50) {
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) break;
        if (done < 0 || waited_ms >= PROGRAM_TIMEOUT_S * 1000) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// How many lines of the log start with `prefix` (after an mpirun --tag-output tag, if any).
static int count_lines(const char *log, const char *prefix) {
    FILE *f = fopen(log, "r");
    if (!f) return 0;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        const char *text = line;
        if (line[0] == '[' && strstr(line, "]<std")) text = strchr(strstr(line, "]<std"), ':') + 1;
        n += strncmp(text, prefix, strlen(prefix)) == 0;
    }
    fclose(f);
    return n;
}

// The first line of the log that contains `needle`, from the needle on, into out ("" when none).
static void find_line(const char *log, const char *needle, char *out, size_t len) {
    out[0] = '\0';
    FILE *f = fopen(log, "r");
    if (!f) return;
    char line[1024];
    while (!out[0] && fgets(line, sizeof line, f)) {
        const char *at = strstr(line, needle);
        if (at) snprintf(out, len, "%.*s", (int)strcspn(at, "\r\n"), at);
    }
    fclose(f);
}

void test_only_rank0_prints(void **state) {
    if (grading_launcher_rank() != 0) return;  // one run of the program is enough: the test's rank 0 does it
    // The log goes in a folder of its own under $TMPDIR (the grader's sandbox sets it) or /tmp, never in the
    // current folder: a run killed before the unlink below leaves it there, not in the learner's checkout.
    const char *tmp = getenv("TMPDIR");
    char dir[512], log[600];
    snprintf(dir, sizeof dir, "%s/test_lesson03.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    snprintf(log, sizeof log, "%s/program.log", dir);
    int rc = run_program(log);
    // When it stopped, its own complaint: the kit's CHECK and die() lines name the cause, often a TODO.
    char said[512] = "";
    find_line(log, "HINT:", said, sizeof said);
    if (!said[0]) find_line(log, "error:", said, sizeof said);
    int finals = count_lines(log, "final:"), epochs = count_lines(log, "epoch 1:");
    unlink(log);
    rmdir(dir);
    if (rc != 0) {
        char todo[8] = "";
        const char *t = strstr(said, "TODO ");
        if (t) sscanf(t, "TODO %7[0-9a-z]", todo);
        grading_require_todo(!todo[0], todo, "your program stops on %d ranks: %s", PROGRAM_RANKS, said);
        print_error("your program on %d ranks %s: %s\n", PROGRAM_RANKS,
                    rc < 0 ? "did not finish in time" : "exited with an error", said[0] ? said : "(no message)");
        fail();
    }
    if (finals != 1 || epochs != 1) {
        print_error("on %d ranks your program printed its 'epoch 1:' line %d times and its 'final:' line %d times: "
                    "once, by rank 0 only\n", PROGRAM_RANKS, epochs, finals);
        fail();
    }
}
