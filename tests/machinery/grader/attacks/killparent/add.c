// Attack: kill the parent process (in an unsandboxed grader with a process pool: the whole class run).
// Must score 0 and every other student must still be graded.
#include <signal.h>
#include <unistd.h>

#include "lesson.h"

int lesson_add(int a, int b) {
    kill(getppid(), SIGKILL);
    return -1;
}
