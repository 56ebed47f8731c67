// Attack: the same forgery from a constructor, before main() and before any test runs; then exit(0).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lesson.h"

__attribute__((constructor)) static void forge(void) {
    const char *path = getenv("CMOCKA_XML_FILE");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f) {
        fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\" ?>\n<testsuites><testsuite name=\"t\" tests=\"4\" "
                   "failures=\"0\" errors=\"0\" skipped=\"0\"><testcase name=\"test_add\"/><testcase "
                   "name=\"test_add_many\"/><testcase name=\"test_add_zero\"/><testcase name=\"test_needs_gpu\"/></testsuite></testsuites>\n");
        fclose(f);
    }
    _exit(0);
}

int lesson_add(int a, int b) { return -1; }
