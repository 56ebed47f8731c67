// Not an attack: an endless loop on one input only (2 + 3). test_add times out after its full limit;
// test_add_many meets the same loop and must time out after the shorter limit, naming test_add; test_add_zero
// never meets it and must still pass.
#include "lesson.h"

static volatile int spinning = 1;  // volatile: a loop without side effects may be assumed to end

int lesson_add(int a, int b) {
    while (a == 2 && b == 3 && spinning) {
    }
    return a + b;
}
