// A correct submission: must score every test that can run here.
#include "lesson.h"

int lesson_add(int a, int b) { return a + b; }
