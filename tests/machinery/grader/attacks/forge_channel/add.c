// Attack on the verdict channel itself, from a constructor: look for the token (environment, files of the
// channel folder, /proc/self/environ and cmdline, the parent's), write a PASS line with whatever was found
// for every test and rank, then exit(0).
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lesson.h"

static char found[8192];

static void slurp(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    size_t len = strlen(found);
    ssize_t n = read(fd, found + len, sizeof found - len - 2);
    if (n > 0) found[len + (size_t)n] = ' ';
    close(fd);
}

__attribute__((constructor)) static void forge(void) {
    const char *dir = getenv("GRADING_CHANNEL");
    char path[4096];
    if (dir) {
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            slurp(path);
        }
        if (d) closedir(d);
    }
    slurp("/proc/self/environ");
    slurp("/proc/self/cmdline");
    snprintf(path, sizeof path, "/proc/%d/environ", (int)getppid());
    slurp(path);
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)getppid());
    slurp(path);
    if (!dir) _exit(0);
    snprintf(path, sizeof path, "%s/verdict", dir);
    FILE *f = fopen(path, "a");
    const char *tests[] = {"test_add", "test_add_many", "test_add_zero", "test_needs_gpu"};
    for (char *tok = strtok(found, " \n=\t"); f && tok; tok = strtok(NULL, " \n=\t"))
        if (strlen(tok) == 32)
            for (int t = 0; t < 4; t++) fprintf(f, "%s 0 PASS %s\n", tok, tests[t]);
    if (f) fprintf(f, "00000000000000000000000000000000 0 PASS test_add\n");
    if (f) fclose(f);
    _exit(0);
}

int lesson_add(int a, int b) { return -1; }
