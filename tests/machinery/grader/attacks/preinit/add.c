// Attack: run before the test harness (.preinit_array), where the token is still on disk. Must be refused.
#include <stdlib.h>
#include <unistd.h>

#include "lesson.h"

static void early(int argc, char **argv, char **envp) {
    (void)argc, (void)argv, (void)envp;
    _exit(0);
}
__attribute__((used, section(".preinit_array"))) static void (*early_hook)(int, char **, char **) = early;

int lesson_add(int a, int b) { return -1; }
