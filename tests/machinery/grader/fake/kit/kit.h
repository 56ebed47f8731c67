// The fake kit: one function the fake lesson's test uses as its reference.
int kit_reference_add(int a, int b);
