// Attack: leave a process behind that escaped the test's session (fork + setsid, then fork again).
// It must not be alive after grading (the test looks for its name, grader-escapee).
#include <sys/prctl.h>
#include <unistd.h>

#include "lesson.h"

int lesson_add(int a, int b) {
    if (fork() == 0) {
        setsid();
        if (fork() == 0) {
            prctl(PR_SET_NAME, "grader-escapee");
            for (;;) sleep(1);
        }
        _exit(0);
    }
    return a + b;
}
