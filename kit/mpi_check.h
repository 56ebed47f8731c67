// kit/mpi_check.h: CHECK macros for MPI (and NCCL when KIT_NCCL is defined), in the style of check.h.
// Only for sources compiled with MPI's flags (kit/dist.c, lesson 03's bootstrap, the MPI tests).
//
// On failure they print file:line, the call, the library's message and a HINT, then abort the whole job
// (MPI_Abort), so mpirun stops every rank and exits non-zero instead of leaving the others waiting.
#ifndef KIT_MPI_CHECK_H
#define KIT_MPI_CHECK_H

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "kit/check.h"

#ifdef KIT_NCCL
// nccl.h declares a few functions as f() instead of f(void): not our warning to fix.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define MPI_HINT                                                                                        \
    "a peer rank died (look for its error above), or the ranks called different collectives or sizes " \
    "(every rank must make the same calls in the same order); mpirun --report-bindings / "             \
    "--mca btl self,vader isolate transport problems"

static inline void mpi_check_fail_(const char *file, int line, const char *call, const char *error,
                                   const char *hint) {
    int rank = -1, inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fflush(stdout);
    fprintf(stderr, "rank %d: %s:%d: %s\n  error: %s\n  HINT: %s\n", rank, file, line, call, error, hint);
    fflush(stderr);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

// The communicator must return errors (MPI_ERRORS_RETURN; pg_init sets it), else MPI aborts first.
#define MPI_CHECK(call)                                                                  \
    do {                                                                                 \
        int mpi_e_ = (call);                                                             \
        if (mpi_e_ != MPI_SUCCESS) {                                                     \
            char mpi_msg_[MPI_MAX_ERROR_STRING];                                         \
            int mpi_len_ = 0;                                                            \
            MPI_Error_string(mpi_e_, mpi_msg_, &mpi_len_);                               \
            mpi_check_fail_(__FILE__, __LINE__, #call, mpi_msg_, MPI_HINT);              \
        }                                                                                \
    } while (0)

#ifdef KIT_NCCL
// The usual causes of an NCCL error, in one line.
#define NCCL_HINT_DISAGREE                                                                              \
    "ranks disagree on the call (different collectives, sizes or order), or two ranks share a GPU (use " \
    "--backend mpi for that)"
static inline const char *nccl_hint(ncclResult_t r) {
    static const CheckText hints[] = {
        {ncclUnhandledCudaError,
         "a CUDA call inside NCCL failed: check `nvidia-smi`, and that each rank uses its own GPU"},
        {ncclSystemError, "a system call failed (sockets, shared memory): in containers give /dev/shm room "
                          "(docker --shm-size=1g); NCCL_DEBUG=INFO says more"},
        {ncclInvalidArgument, NCCL_HINT_DISAGREE},
        {ncclInvalidUsage, NCCL_HINT_DISAGREE},
        {ncclRemoteError, "a peer rank failed or was killed: look for its error above"},
        {ncclInternalError, "an NCCL internal error: rerun with NCCL_DEBUG=INFO"},
    };
    return CHECK_TEXT(r, hints, "rerun with NCCL_DEBUG=INFO for details");
}

// ncclInProgress counts as success: it is what a non-blocking communicator (pg_init makes one) returns
// while the call is queued; the caller then polls ncclCommGetAsyncError.
#define NCCL_CHECK(call)                                                                 \
    do {                                                                                 \
        ncclResult_t nccl_r_ = (call);                                                   \
        if (nccl_r_ != ncclSuccess && nccl_r_ != ncclInProgress)                        \
            mpi_check_fail_(__FILE__, __LINE__, #call, ncclGetErrorString(nccl_r_),      \
                            nccl_hint(nccl_r_));                                         \
    } while (0)
#endif

#ifdef __cplusplus
}
#endif

#endif // KIT_MPI_CHECK_H
