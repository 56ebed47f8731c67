#include "lesson.h"

int lesson_add(int a, int b) { return a + b; }
