// Attack through a header: a grading.h and a lesson.h of its own that the TEST would include instead of
// the kit's. Both must be left out; the wrong lesson_add then fails.
#include "lesson.h"

int lesson_add(int a, int b) { return -1; }
