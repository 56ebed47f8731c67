// tests/mpi_testutil.h: the process group of a multi-rank autograder (lesson 03 on), shared by its tests.
//
// One per process, made by the first test that asks (test_pg), finalized at exit: MPI_Init and MPI_Finalize
// may each happen once per process, and mpirun treats a rank that exits without MPI_Finalize as failed.
// Include it once, from the test file (it defines the process's state).
#ifndef TESTS_MPI_TESTUTIL_H
#define TESTS_MPI_TESTUTIL_H

#include <math.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "kit/check.h"
#include "kit/dist.h"

// Under SANITIZE=1, AddressSanitizer stays on but its leak check does not: Open MPI keeps memory until exit in
// plugins it has already unloaded, so no suppression can name it, and the leak report would turn every passing
// test into a failed exit status. (The kit's own buffers are leak-checked by its single-process tests.)
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "detect_leaks=0"; }

static ProcessGroup *g_pg;  // the test process group (test_pg), or NULL

static void finish_mpi(void) {
    if (g_pg) {
        pg_finalize(g_pg);
        g_pg = NULL;
        return;
    }
    int init = 0, fin = 0;  // MPI started by the learner's own setup code (lesson 03's ddp_setup test)
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Finalize();
}

// Finalizes MPI at exit, however it was started; call before anything that may start it.
static void register_exit(void) {
    static bool done = false;
    if (!done) atexit(finish_mpi);
    done = true;
}

// The process group on the CPU with the MPI backend, made on first use; `name` is the program name MPI sees.
static ProcessGroup *test_pg_named(const char *name, double timeout_s) {
    if (!g_pg) {
        static char arg0[64];
        snprintf(arg0, sizeof arg0, "%s", name);
        static char *args[] = {arg0, NULL};
        int argc = 1;
        char **argv = args;
        register_exit();
        g_pg = pg_init(&argc, &argv, "mpi", DEVICE_CPU, timeout_s);
    }
    return g_pg;
}

// The largest of every rank's x, known to every rank (NaN counts as infinite).
static inline double max_over_ranks(ProcessGroup *pg, double x) {
    int world = pg_world(pg);
    double *v = xcalloc((size_t)world, sizeof *v);
    v[pg_rank(pg)] = isnan(x) ? INFINITY : x;
    pg_allreduce_sum_double_host(pg, v, world);
    double most = v[0];
    for (int r = 1; r < world; r++) most = v[r] > most ? v[r] : most;
    free(v);
    return most;
}

// True on every rank when ok holds on every rank: a test decides from values every rank has, so that the ranks
// call the same collectives and leave the test together.
static inline bool all_ranks(ProcessGroup *pg, bool ok) { return max_over_ranks(pg, ok ? 0.0 : 1.0) == 0.0; }

// The MPI communicator of a process group: a test's references talk to MPI directly, over a communicator of
// their own with the same ranks, so that their messages can never meet the learner's. The color: the group's
// lowest world rank (a minimum over the group); ranked as in the group.
static inline MPI_Comm reference_comm(ProcessGroup *pg) {
    int wr = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &wr);
    MPI_Comm comm;
    double low = -max_over_ranks(pg, -(double)wr);
    MPI_Comm_split(MPI_COMM_WORLD, (int)low, pg_rank(pg), &comm);
    return comm;
}

// Which ranks of `world` (at most 32) are in its sub-group g, as a bit per world rank: summed over the group, so
// every member knows (lessons 08 and 11's grids). group_members_text: "{0, 2}".
static inline unsigned group_members(ProcessGroup *world, ProcessGroup *g) {
    double v[32] = {0};
    const int n = pg_world(world);
    CHECK(n <= 32, "group_members: a world of at most 32 ranks");
    v[pg_rank(world)] = 1.0;
    pg_allreduce_sum_double_host(g, v, n);
    unsigned bits = 0;
    for (int r = 0; r < n; r++) bits |= (v[r] > 0.5 ? 1u : 0u) << r;
    return bits;
}

static inline void members_text(unsigned bits, char *out, size_t len) {
    size_t used = (size_t)snprintf(out, len, "{");
    for (int r = 0; r < 32; r++)
        if (bits >> r & 1u) used += (size_t)snprintf(out + used, len - used, "%s%d", used > 1 ? ", " : "", r);
    snprintf(out + used, len - used, "}");
}

#endif  // TESTS_MPI_TESTUTIL_H
