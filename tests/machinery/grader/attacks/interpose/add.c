// Attack: replace cmocka's assertion so that every assert_int_equal passes. Must be refused.
#include <stdint.h>

#include "lesson.h"

void _assert_int_equal(uintmax_t a, uintmax_t b, const char *file, int line);
void _assert_int_equal(uintmax_t a, uintmax_t b, const char *file, int line) {
    (void)a, (void)b, (void)file, (void)line;
}

int lesson_add(int a, int b) { return -1; }
