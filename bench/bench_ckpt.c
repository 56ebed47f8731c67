// bench/bench_ckpt.c: checkpoint save/load speed against a plain write of the same bytes, and the kill -9 drill.
//
//   bench_ckpt [--out FILE.md] [--trials N] [--model resnet9] [--width 64] [--dir DIR]
//
// Speed: the file of a model (default resnet9 width 64: parameters + momentum + BN buffers, ~52 MB) is
//   saved with ckpt_save (encode with its CRCs, temp file, write, fsync, rename, fsync of the folder) and
//   compared with the floor: write(2) of the same bytes to a new file + fsync. Loading (ckpt_load: read,
//   check every CRC, check against the model, copy in) is compared with read(2) of the same file. Both reads
//   come from the page cache (the file was just written): they measure the CPU cost of loading, not the disk.
//   Median of 5 runs each.
// Drill: a child process saves checkpoints of increasing step to one path in a loop; the parent kills it with
//   SIGKILL after a random delay, then reads the path back. Count of trials where no valid checkpoint remains
//   must be 0. SIGKILL tests a process dying at any instruction of the save; a power cut (what the two fsyncs
//   are for) cannot be simulated by a process.
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kit/check.h"
#include "kit/ckpt.h"
#include "kit/log.h"
#include "kit/model.h"

enum { RUNS = 5 };

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

// Over the previous file, as a naive save does (open with O_TRUNC frees its blocks, inside the timing, as
// ckpt_save's rename frees the old checkpoint's).
static double raw_write(const char *path, const void *buf, size_t n) {
    double t0 = time_now();
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK_SYS(fd, "the bench folder must be writable");
    const char *p = buf;
    size_t left = n;
    while (left) {
        ssize_t k = write(fd, p, left);
        CHECK_SYS(k, "disk full?");
        p += k, left -= (size_t)k;
    }
    CHECK_SYS(fsync(fd), "fsync");
    CHECK_SYS(close(fd), "close");
    return time_now() - t0;
}

// Into fresh memory, as any loader does (np.fromfile, torch.load): the page faults are part of reading.
static double raw_read(const char *path, size_t n) {
    double t0 = time_now();
    char *buf = xmalloc(n);
    int fd = open(path, O_RDONLY);
    CHECK_SYS(fd, "the file was just written");
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        CHECK_SYS(k, "read");
        if (k == 0) break;
        got += (size_t)k;
    }
    close(fd);
    free(buf);
    return time_now() - t0;
}

static CkptState state_of(const Model *m, long long step) {
    CkptState s = {.model = m->cfg, .world = 1, .global_batch = 128, .steps_per_epoch = 390, .epochs = 24,
                   .epoch = (int)(step / 390), .batch_in_epoch = (int)(step % 390), .step = step, .seed = 1};
    snprintf(s.dataset, sizeof s.dataset, "cifar10");
    return s;
}

// Returns the number of trials that left no valid checkpoint (or an older one than before the kill).
static int drill(Model *m, const char *dir, int trials, double save_seconds, int *tmp_left) {
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/drill.ckpt", dir);
    CkptState s = state_of(m, 0);
    m->params[0] = 0.0f;
    if (ckpt_save(path, m, &s, err, sizeof err) != 0) die("%s", err);
    long long last = 0;
    int bad = 0;
    *tmp_left = 0;
    float *w = xmalloc(m->views[0].count * sizeof(float));
    for (int t = 0; t < trials; t++) {
        fflush(NULL);
        pid_t pid = fork();
        CHECK_SYS(pid, "fork");
        if (pid == 0) {
            for (long long step = last + 1;; step++) {
                CkptState st = state_of(m, step);
                m->params[0] = (float)step;  // the tensors change with the step too: a mixed file is caught
                if (ckpt_save(path, m, &st, err, sizeof err) != 0) _exit(3);
            }
        }
        // A random moment within the first ~3 saves: the start of a save, its middle, its rename, ...
        usleep((useconds_t)(1e6 * save_seconds * 3.0 * rand() / RAND_MAX));
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        Ckpt ck;
        if (ckpt_read(&ck, path, err, sizeof err) != 0) {
            fprintf(stderr, "trial %d: NO VALID CHECKPOINT: %s\n", t, err);
            bad++;
            continue;
        }
        ckpt_tensor_data(&ck, ckpt_find(&ck, CKPT_PARAMS, m->views[0].name), w);
        if (ck.state.step < last || w[0] != (float)ck.state.step) {
            fprintf(stderr, "trial %d: step %lld after %lld, first weight %g: an old or mixed file\n", t,
                    ck.state.step, last, (double)w[0]);
            bad++;
        }
        last = ck.state.step;
        ckpt_free(&ck);
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        *tmp_left += access(tmp, F_OK) == 0;
    }
    free(w);
    return bad;
}

int main(int argc, char **argv) {
    const char *out = NULL, *model = "resnet9", *dir = NULL;
    int trials = 200, width = 64, drill_width = 16;
    static const struct option opts[] = {{"out", required_argument, 0, 'o'},   {"trials", required_argument, 0, 't'},
                                         {"model", required_argument, 0, 'm'}, {"width", required_argument, 0, 'w'},
                                         {"dir", required_argument, 0, 'd'},   {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 't': trials = atoi(optarg); break;
        case 'm': model = optarg; break;
        case 'w': width = atoi(optarg); break;
        case 'd': dir = optarg; break;
        default: die("usage: %s [--out FILE.md] [--trials N] [--model NAME] [--width N] [--dir DIR]", argv[0]);
        }
    }
    char tmpdir[64] = "bench-ckpt.XXXXXX";  // in the working folder: the disk the kit's runs write to
    if (!dir) {
        CHECK(mkdtemp(tmpdir) != NULL, "the working folder must be writable");
        dir = tmpdir;
    }
    ModelConfig cfg;
    if (!model_config(&cfg, model, width, 3, 32, 32, 10)) die("unknown model %s", model);
    Model *m = model_create(&cfg, DEVICE_CPU, 1, 1);
    CkptState s = state_of(m, 1234);
    size_t n;
    uint8_t *bytes = ckpt_encode(m, &s, &n);
    double mb = (double)n / 1e6;
    char path[1024], raw[1024], err[512];
    snprintf(path, sizeof path, "%s/bench.ckpt", dir);
    snprintf(raw, sizeof raw, "%s/raw.bin", dir);

    double t_raw[RUNS], t_save[RUNS], t_read[RUNS], t_load[RUNS], t_encode[RUNS];
    for (int r = 0; r < RUNS; r++) {
        t_raw[r] = raw_write(raw, bytes, n);
        double t0 = time_now();
        size_t n2;
        free(ckpt_encode(m, &s, &n2));
        t_encode[r] = time_now() - t0;
        t0 = time_now();
        if (ckpt_save(path, m, &s, err, sizeof err) != 0) die("%s", err);
        t_save[r] = time_now() - t0;
        t_read[r] = raw_read(path, n);
        t0 = time_now();
        if (ckpt_load(path, m, NULL, err, sizeof err) != 0) die("%s", err);
        t_load[r] = time_now() - t0;
    }
    double raw_s = median(t_raw, RUNS), save_s = median(t_save, RUNS), read_s = median(t_read, RUNS);
    double load_s = median(t_load, RUNS), enc_s = median(t_encode, RUNS);
    free(bytes);
    unlink(raw);

    // The drill on a smaller model, so that a save is short and many trials fit in a minute.
    ModelConfig dcfg;
    model_config(&dcfg, model, drill_width, 3, 32, 32, 10);
    Model *dm = model_create(&dcfg, DEVICE_CPU, 1, 1);
    CkptState ds = state_of(dm, 0);
    double t0 = time_now();
    snprintf(path, sizeof path, "%s/one.ckpt", dir);
    for (int r = 0; r < 5; r++)
        if (ckpt_save(path, dm, &ds, err, sizeof err) != 0) die("%s", err);
    double dsave = (time_now() - t0) / 5;
    size_t dn;
    free(ckpt_encode(dm, &ds, &dn));
    srand((unsigned)time(NULL));
    int tmp_left = 0;
    t0 = time_now();
    int bad = drill(dm, dir, trials, dsave, &tmp_left);
    double drill_s = time_now() - t0;

    double load1 = 0;
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf", &load1) != 1) load1 = -1;
        fclose(la);
    }
    char report[4096];
    snprintf(report, sizeof report,
             "## Checkpoint save/load (bench/bench_ckpt.c)\n\n"
             "Model %s width %d: %.1f MB file (parameters, momentum, BN buffers). Median of %d runs. Folder: %s.\n"
             "Load average (1 min) at the end: %.2f.\n\n"
             "| operation | seconds | MB/s | vs the plain operation |\n|---|---|---|---|\n"
             "| plain write(2) + fsync of the same bytes over the previous file | %.3f | %.0f | 1.00x |\n"
             "| ckpt_save (encode + CRCs + temp + fsync + rename + fsync dir) | %.3f | %.0f | %.2fx |\n"
             "| ckpt_encode alone (into one new buffer: not used by ckpt_save) | %.3f | %.0f | |\n"
             "| plain read(2) of the file into new memory (page cache) | %.3f | %.0f | 1.00x |\n"
             "| ckpt_load (read + every CRC + model check + copy in) | %.3f | %.0f | %.2fx |\n\n"
             "## kill -9 drill\n\n"
             "%d trials: a child saves %s width %d (%.1f MB, %.1f ms per save) to one path in a loop and is killed\n"
             "with SIGKILL after a random delay in [0, 3 saves]. Trials where no valid checkpoint remained (or an\n"
             "older or mixed one): **%d**. A temporary file was left beside it in %d trials (overwritten by the\n"
             "next save; never a candidate for --resume auto). %.0f s in all.\n",
             model, width, mb, RUNS, dir, load1, raw_s, mb / raw_s, save_s, mb / save_s, save_s / raw_s, enc_s,
             mb / enc_s, read_s, mb / read_s, load_s, mb / load_s, load_s / read_s, trials, model, drill_width,
             (double)dn / 1e6, 1e3 * dsave, bad, tmp_left, drill_s);
    fputs(report, stdout);
    if (out) {
        FILE *f = fopen(out, "w");
        CHECK(f != NULL, "cannot write the report");
        fputs(report, f);
        fclose(f);
    }
    model_free(m);
    model_free(dm);
    if (dir == tmpdir) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return bad == 0 ? 0 : 1;
}
