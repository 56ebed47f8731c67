#include "kit.h"

int kit_reference_add(int a, int b) { return a + b; }
