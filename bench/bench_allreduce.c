// bench/bench_allreduce.c: all-reduce bandwidth of the kit's process group, 1 KB to 64 MB.
//
//   mpirun -np 2 bench_allreduce [--backend mpi|nccl|auto] [--device cpu|cuda|auto] [--min 1K] [--max 64M]
//                                [--factor 2] [--raw] [--seconds 0.2]
//
// As nccl-tests define them: time = the slowest rank's mean time per all-reduce; algbw = bytes / time;
// busbw = algbw * 2 (n - 1) / n, the traffic each rank's link must carry in a ring all-reduce, which
// makes numbers comparable across rank counts and with the link's hardware bandwidth.
// --factor F: each size F times the one before (4 with --min 1M --max 64M: 1, 4, 16, 64 MB).
// --raw adds plain MPI on the same host buffers (MPI backend, CPU only): blocking MPI_Allreduce, and
// MPI_Iallreduce + MPI_Wait. The kit's busbw vs the last column is the cost of its timeout-watching
// poll loop; the last two columns differ by Open MPI's own non-blocking algorithms (libnbc).
// Prints a Markdown table on rank 0.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kit/check.h"
#include "kit/dist.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// "64M", "1K", "4096" -> bytes.
static size_t parse_bytes(const char *s) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024, end++;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024, end++;
    else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024, end++;
    if (*end != '\0' || v < 4) die("bad size '%s': use e.g. 1K, 64M", s);
    return (size_t)v;
}

// The slowest rank's value.
static double max_over_ranks(ProcessGroup *pg, double mine) {
    int world = pg_world(pg);
    double *all = xcalloc((size_t)world, sizeof *all);
    all[pg_rank(pg)] = mine;
    pg_allreduce_sum_double_host(pg, all, world);
    double m = all[0];
    for (int r = 1; r < world; r++) m = all[r] > m ? all[r] : m;
    free(all);
    return m;
}

// Seconds per all-reduce of n floats: `iters` calls after a barrier, the slowest rank's mean.
static double time_pg(ProcessGroup *pg, float *buf, size_t n, int iters) {
    pg_barrier(pg);
    double t0 = now_s();
    for (int i = 0; i < iters; i++) pg_allreduce_sum(pg, buf, n);
    device_synchronize(pg_device(pg));
    return max_over_ranks(pg, (now_s() - t0) / iters);
}

// Plain MPI for comparison: blocking MPI_Allreduce, or MPI_Iallreduce + MPI_Wait (what the kit starts,
// completed without the timeout-watching loop).
static double time_raw(ProcessGroup *pg, float *buf, size_t n, int iters, bool nonblocking) {
    pg_barrier(pg);
    double t0 = now_s();
    for (int i = 0; i < iters; i++) {
        if (nonblocking) {
            MPI_Request req;
            MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
            MPI_Wait(&req, MPI_STATUS_IGNORE);
        } else {
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
    }
    return max_over_ranks(pg, (now_s() - t0) / iters);
}

static void size_label(size_t bytes, char *out, size_t len) {
    if (bytes >= ((size_t)1 << 20)) snprintf(out, len, "%zu MB", bytes >> 20);
    else if (bytes >= 1024) snprintf(out, len, "%zu KB", bytes >> 10);
    else snprintf(out, len, "%zu B", bytes);
}

int main(int argc, char **argv) {
    const char *backend = "auto", *device = "cpu";
    size_t min_bytes = 1024, max_bytes = (size_t)64 << 20;
    double seconds = 0.2;
    int factor = 2;
    bool raw = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) backend = argv[++i];
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) device = argv[++i];
        else if (strcmp(argv[i], "--min") == 0 && i + 1 < argc) min_bytes = parse_bytes(argv[++i]);
        else if (strcmp(argv[i], "--max") == 0 && i + 1 < argc) max_bytes = parse_bytes(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "--factor") == 0 && i + 1 < argc) factor = atoi(argv[++i]);
        else if (strcmp(argv[i], "--raw") == 0) raw = true;
        else die("unknown option %s (see the comment at the top of bench/bench_allreduce.c)", argv[i]);
    }
    if (factor < 2) die("--factor needs an integer >= 2");
    Device dev;
    if (!device_parse(device, &dev, true)) die("--device %s: use cpu, cuda or auto", device);
    ProcessGroup *pg = pg_init(&argc, &argv, backend, dev, 0);
    int world = pg_world(pg);
    if (raw && (pg_backend(pg) != PG_BACKEND_MPI || dev != DEVICE_CPU)) {
        if (pg_rank(pg) == 0) printf("(--raw ignored: it compares on host buffers with the MPI backend only)\n");
        raw = false;
    }
    float *buf = device_alloc(dev, max_bytes);
    device_memset_zero(dev, buf, max_bytes);  // zeros: sums stay finite however many iterations run

    if (pg_rank(pg) == 0) {
        printf("\n| size | floats | time (us) | algbw (GB/s) | busbw (GB/s) |%s\n", raw ? " MPI_Allreduce busbw | MPI_Iallreduce+Wait busbw |" : "");
        printf("|-----:|-------:|----------:|-------------:|-------------:|%s\n", raw ? "-------------------:|-------------------------:|" : "");
    }
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= (size_t)factor) {
        size_t n = bytes / sizeof(float);
        // Warm up (connections, staging buffers), then pick the count that fills about `seconds`.
        double t = time_pg(pg, buf, n, 3);
        int iters = (int)(seconds / (t > 1e-7 ? t : 1e-7));
        iters = iters < 5 ? 5 : iters > 2000 ? 2000 : iters;
        t = time_pg(pg, buf, n, iters);
        double algbw = (double)(n * sizeof(float)) / t / 1e9;
        double busbw = algbw * 2.0 * (world - 1) / world;
        double raw_busbw[2] = {0, 0};
        for (int k = 0; raw && k < 2; k++) {
            time_raw(pg, buf, n, 3, k == 1);
            double tr = time_raw(pg, buf, n, iters, k == 1);
            raw_busbw[k] = (double)(n * sizeof(float)) / tr / 1e9 * 2.0 * (world - 1) / world;
        }
        if (pg_rank(pg) == 0) {
            char label[32];
            size_label(bytes, label, sizeof label);
            printf("| %s | %zu | %.1f | %.3f | %.3f |", label, n, t * 1e6, algbw, busbw);
            if (raw) printf(" %.3f | %.3f |", raw_busbw[0], raw_busbw[1]);
            printf("\n");
            fflush(stdout);
        }
    }
    device_free(dev, buf);
    pg_finalize(pg);
    return 0;
}
