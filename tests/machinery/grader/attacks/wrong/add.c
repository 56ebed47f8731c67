// An honest mistake: must score 0 with a FAIL that shows the numbers in decimal.
#include "lesson.h"

int lesson_add(int a, int b) { return a - b + 10; }
