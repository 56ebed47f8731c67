// bench/ring_allreduce.c: lesson 07's ring all-reduce over TCP sockets (the solution's ring.c) against
// MPI_Allreduce on the same buffers, run under mpirun (MPI only shares the store's port and times).
//
//   scripts/launch.sh 4 build/bench/ring_allreduce [MAX_MB]          (bench/run-ring.sh writes the table)
//
// Per size: the slowest rank's mean time per all-reduce (after warm-up), algbw = bytes / time and
// busbw = algbw * 2 (n - 1) / n (what each rank's link carries in a ring: the nccl-tests definition).
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/log.h"
#include "kit/store.h"
#include "solutions/07-scale-out/lesson.h"

typedef int (*Reduce)(void *ctx, float *buf, size_t n);

static int ring_fn(void *ctx, float *buf, size_t n) {
    char err[512];
    if (ring_allreduce(ctx, buf, n, err, sizeof err) < 0) die("ring_allreduce: %s", err);
    return 0;
}
static int mpi_fn(void *ctx, float *buf, size_t n) {
    (void)ctx;
    return MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

// The slowest rank's mean seconds per call: iterations chosen so that one size takes about 0.3 s.
static double time_it(Reduce f, void *ctx, float *buf, size_t n) {
    for (int i = 0; i < 2; i++) f(ctx, buf, n);  // warm-up: connections, page faults
    MPI_Barrier(MPI_COMM_WORLD);
    double t = time_now();
    f(ctx, buf, n);
    double one = time_now() - t;
    MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int iters = one > 0 ? (int)(0.3 / one) : 100;
    iters = iters < 3 ? 3 : iters > 200 ? 200 : iters;
    MPI_Barrier(MPI_COMM_WORLD);
    t = time_now();
    for (int i = 0; i < iters; i++) f(ctx, buf, n);
    double mean = (time_now() - t) / iters;
    MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return mean;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    double max_mb = argc > 1 ? atof(argv[1]) : 16.0;
    char err[1024], url[64];
    // Rank 0 serves the store on a port the system picks (port 0) and MPI tells the others which: no port is
    // chosen first and bound later, when another program may have taken it.
    Store *s = NULL;
    int port = -1;
    if (rank == 0) {
        s = store_open("tcp://127.0.0.1:0", "bench-ring", rank, world, 30.0, err, sizeof err);
        if (!s) fprintf(stderr, "rank 0: %s\n", err);
        port = s ? store_port(s) : -1;
    }
    MPI_Bcast(&port, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (port < 0) die("rank 0 could not open the store (its reason is above)");
    if (rank != 0) {
        snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
        s = store_open(url, "bench-ring", rank, world, 30.0, err, sizeof err);
        if (!s) die("%s", err);
    }
    Ring ring;
    if (ring_connect(s, &ring, err, sizeof err) < 0) die("%s", err);
    if (rank == 0) {
        printf("| size | floats | ring time (us) | ring busbw (GB/s) | MPI_Allreduce time (us) | MPI_Allreduce busbw (GB/s) |\n");
        printf("|-----:|-------:|---------------:|------------------:|------------------------:|---------------------------:|\n");
    }
    for (double mb = 1.0 / 16; mb <= max_mb + 1e-9; mb *= 4) {
        size_t n = (size_t)(mb * (1 << 20)) / sizeof(float);
        // Cache-line aligned, as PyTorch's tensors (gloo's side) and the kit's (device_alloc) are: the kernel's
        // socket copies out of and into a buffer 16 bytes into a line, where malloc puts a large block, ran at
        // about half the speed on the development machine (AMD EPYC).
        float *buf = CHECK_ALLOC(aligned_alloc(64, n * sizeof *buf));  // (n); n * 4 is a multiple of 64 KB
        memset(buf, 0, n * sizeof *buf);
        double tr = time_it(ring_fn, &ring, buf, n), tm = time_it(mpi_fn, NULL, buf, n);
        double bytes = (double)n * sizeof(float), factor = 2.0 * (world - 1) / world;
        if (rank == 0) {
            char size[32];
            if (mb < 1) snprintf(size, sizeof size, "%.0f KB", mb * 1024);
            else snprintf(size, sizeof size, "%.0f MB", mb);
            printf("| %s | %zu | %.0f | %.3f | %.0f | %.3f |\n", size, n, tr * 1e6, bytes / tr * factor / 1e9, tm * 1e6,
                   bytes / tm * factor / 1e9);
        }
        free(buf);
    }
    ring_close(&ring);
    store_close(s);
    MPI_Finalize();
    return 0;
}
