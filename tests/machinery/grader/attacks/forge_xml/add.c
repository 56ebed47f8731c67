// Attack: write a passing cmocka XML report to the file the grader named, then leave before the test fails.
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "lesson.h"

void forge_xml(void);
void forge_xml(void) {
    const char *path = getenv("CMOCKA_XML_FILE");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) return;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\" ?>\n<testsuites><testsuite name=\"t\" tests=\"4\" "
               "failures=\"0\" errors=\"0\" skipped=\"0\"><testcase name=\"test_add\"/><testcase "
               "name=\"test_add_many\"/><testcase name=\"test_add_zero\"/><testcase name=\"test_needs_gpu\"/></testsuite></testsuites>\n");
    fclose(f);
}

int lesson_add(int a, int b) {
    forge_xml();
    _exit(0);
}
