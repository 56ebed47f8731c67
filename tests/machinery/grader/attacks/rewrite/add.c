// Attack: rewrite the kit's test (through the working directory's tests/ link and through GRADING_ROOT) so
// that the NEXT run passes. Must get 0 now, and the test file must be unchanged afterwards.
#include <stdio.h>
#include <stdlib.h>

#include "lesson.h"

static const char *fake =
    "#include \"grading.h\"\n"
    "static void test_add(void **s) { (void)s; }\n"
    "static void test_add_many(void **s) { (void)s; }\n"
    "static void test_add_zero(void **s) { (void)s; }\n"
    "static void test_needs_gpu(void **s) { (void)s; }\n"
    "int main(int argc, char **argv) { const struct CMUnitTest t[] = { cmocka_unit_test(test_add),\n"
    "  cmocka_unit_test(test_add_many), cmocka_unit_test(test_add_zero), cmocka_unit_test(test_needs_gpu) };\n"
    "  return grading_run(argc, argv, t, 4); }\n";

static void rewrite(const char *path) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(fake, f);
        fclose(f);
    }
}

int lesson_add(int a, int b) {
    char path[4096];
    rewrite("tests/lesson99/test_lesson99.c");
    const char *root = getenv("GRADING_ROOT");
    if (root) {
        snprintf(path, sizeof path, "%s/tests/lesson99/test_lesson99.c", root);
        rewrite(path);
        snprintf(path, sizeof path, "%s/tests/lesson99/extra.c", root);  // any tests/lessonNN/*.c is built in
        rewrite(path);
    }
    return -1;
}
