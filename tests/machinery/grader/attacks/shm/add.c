// Attack: memory that RLIMIT_DATA does not count (MAP_SHARED | MAP_ANONYMOUS), 512 MiB touched and held,
// under --mem-mb 128. Must be stopped for memory (0 points), not pass.
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "lesson.h"

int lesson_add(int a, int b) {
    size_t n = (size_t)512 << 20;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
        memset(p, 1, n);
        sleep(1);
    }
    return a + b;
}
