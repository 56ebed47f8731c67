// The fake lesson's interface: the learner writes lesson_add.
int lesson_add(int a, int b);
