// tests/grading.h: the main() of every autograder test binary (header-only).
//
//   int main(int argc, char **argv) {
//       const struct CMUnitTest tests[] = { cmocka_unit_test(test_sgd_step), ... };
//       return grading_run(argc, argv, tests, sizeof tests / sizeof tests[0]);
//   }
//
// The binary then understands:
//   (no options)   run every test, cmocka's usual output
//   --list         print the test names, one per line, and exit
//   --only NAME    run only the test NAME (exit 2 when there is no such test)
// The grading driver (tests/grade.py) runs each test in its own process with --only and reads the
// result from the XML file it names (CMOCKA_MESSAGE_OUTPUT=XML, CMOCKA_XML_FILE=path), never from stdout.
// Under mpirun/srun, rank r > 0 writes its XML to "<path>.rank<r>" so ranks do not overwrite each other.
// The exit status is the number of failed tests (0 = all passed), 2 for a usage error.
#ifndef GRADING_H
#define GRADING_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

// This process's rank when started by mpirun (Open MPI), srun (Slurm) or another PMIx launcher; 0 otherwise.
static inline int grading_launcher_rank(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

// Gives ranks other than 0 their own XML file, so every rank's verdict reaches the driver.
static inline void grading_split_xml_by_rank(void) {
    const char *xml = getenv("CMOCKA_XML_FILE");
    int rank = grading_launcher_rank();
    if (!xml || !*xml || rank <= 0) return;
    size_t len = strlen(xml) + 32;
    char *path = malloc(len);
    if (!path) return;
    snprintf(path, len, "%s.rank%d", xml, rank);
    setenv("CMOCKA_XML_FILE", path, 1);
    free(path);
}

// The group name in reports: the program's file name ("test_lesson01").
static inline const char *grading_group_name(const char *argv0) {
    const char *slash = argv0 ? strrchr(argv0, '/') : NULL;
    return slash ? slash + 1 : (argv0 ? argv0 : "tests");
}

static inline int grading_usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--list | --only TEST_NAME]\n", argv0);
    return 2;
}

static inline int grading_run(int argc, char **argv, const struct CMUnitTest *tests, size_t n) {
    // Line-buffered stdout: what a test prints lands in the log in the order it happened, next to
    // cmocka's (unbuffered) error text, so the grader can show the line that explains a failure.
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0) {
            for (size_t t = 0; t < n; t++) printf("%s\n", tests[t].name);
            return 0;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            return grading_usage(argv[0]);
        }
    }
    if (only) {
        size_t t = 0;
        while (t < n && strcmp(tests[t].name, only) != 0) t++;
        if (t == n) {
            fprintf(stderr, "%s: no test named '%s' (--list shows the names)\n", argv[0], only);
            return 2;
        }
        // cmocka's filter is a glob; test names are C identifiers, so the exact name matches only itself.
        cmocka_set_test_filter(only);
    }
    grading_split_xml_by_rank();
    return _cmocka_run_group_tests(grading_group_name(argv[0]), tests, n, NULL, NULL);
}

#endif // GRADING_H
