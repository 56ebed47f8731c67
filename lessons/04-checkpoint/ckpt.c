// ckpt.c: lesson 04, what makes a distributed training run survive being stopped. What you write is marked TODO:
//
//   TODO 1  ckpt_write_file    bytes -> a file that is never half written and is on disk when the call returns
//   TODO 2  ckpt_save_rank0    one writer (rank 0), after the step, and every rank learns whether it worked
//   TODO 3  ckpt_capture       what an EXACT resume needs besides the weights, and ckpt_restore, the way back
//   TODO 4  ckpt_load_all      every rank loads onto its own device; one rank failing stops them all
//   TODO 5  ckpt_stop_flags    a signal or a NaN on ANY rank stops EVERY rank at the same step
//
// The kit supplies the file format (kit/ckpt.h): ckpt_encode turns a model and a CkptState into the file's
// bytes, ckpt_load checks a file completely and copies it onto a model on its device. train.c calls what you
// write from lesson 03's training loop.
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lesson.h"

// ---------------------------------------------------------------- TODO 1: an atomic, durable write

// TODO 1: write the n bytes of buf to `path` so that a crash (kill -9, power cut, full disk) at ANY moment
//   leaves at `path` either the previous complete file or the new complete one -- never a mix, never a
//   truncated file -- and so that when this returns 0 the new file is really on the disk.
//   Think about what each step protects against:
//   - writing straight into `path` destroys the previous checkpoint at the first byte: write somewhere else
//     first. Where? rename(2) replaces a file atomically, but only within one file system.
//   - write(2) may write fewer bytes than asked; and it only hands them to the page cache: a power cut
//     loses them unless you wait for the disk.
//   - the rename is a change of the FOLDER, which sits in the page cache too until it is synced.
//   On any failure: remove what you created, leave `path` alone, and put the step that failed and the
//   system's reason (strerror(errno)) in err (snprintf(err, errlen, ...)); return -1.
// PyTorch: torch.save(state, path) writes path directly (not atomic); the usual fix is to save to a temporary
//   name and os.replace() it, as this function does, plus the fsyncs torch never does.
int ckpt_write_file(const char *path, const void *buf, size_t n, char *err, size_t errlen) {
    FILE *f = fopen(path, "wb");  // writes over the previous checkpoint: see the TODO
    if (!f) { snprintf(err, errlen, "%s: %s", path, strerror(errno)); return -1; }
    fwrite(buf, 1, n, f);
    fclose(f);
    return 0;
}

// ---------------------------------------------------------------- TODO 2: one writer, and everyone knows

// TODO 2: save m and *st to `path` as ONE file (its bytes: ckpt_encode, kit/ckpt.h; written by TODO 1).
//   What must hold when this returns, on every rank:
//   - exactly one process wrote the file, whatever the world size (N writers to one path on a shared file
//     system corrupt each other, or pay N times): the replicas are identical, so any one holds the bytes;
//   - the file is durable: no rank is past this call before the writer has finished;
//   - every rank returns the same result: 0, or -1 when the writer failed (a full disk), with the reason in
//     the writer's err and, on the others, a line saying which rank failed. A rank that trained on without
//     knowing would leave no checkpoint at the next SIGTERM.
// PyTorch: if dist.get_rank() == 0: torch.save(model.module.state_dict(), path)
//          dist.barrier()          (the barrier is the wait; the failure is usually NOT propagated)
int ckpt_save_rank0(ProcessGroup *pg, const char *path, const Model *m, const CkptState *st, char *err,
                    size_t errlen) {
    size_t n;
    uint8_t *bytes = ckpt_encode(m, st, &n);  // every rank writes, and nobody waits: see the TODO
    int rc = ckpt_write_file(path, bytes, n, err, errlen);
    free(bytes);
    return rc;
}

// ---------------------------------------------------------------- TODO 3: what an exact resume needs

// TODO 3: fill the checkpoint's description of the run. ckpt_encode stores the three buffers (weights,
//   momentum, BN running statistics); everything else that decides what the next step computes is yours
//   to put here. Ask of every field of CkptState (kit/ckpt.h): if the resumed run got it wrong, would the
//   next step differ, or the next epoch line? The lesson text (section 4) walks through what breaks without each.
//   What must hold: a run resumed from it takes the same next step (the position, the random state, the
//   schedule, the optimizer; kit/rng.h says what the random state is), and its epoch line and final line
//   report the same numbers as an uninterrupted run: the metrics of the epoch in progress are those of ALL
//   ranks, including what was trained before this process (re)started, and `images` counts every image
//   trained on since the start. Every rank calls this function: what you need from the other ranks, ask here.
// PyTorch: {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
//           "epoch": epoch, "step": step, "sampler_epoch": epoch, "rng": torch.get_rng_state(), ...}
CkptState ckpt_capture(ProcessGroup *pg, const TrainOptions *o, const Model *m, const RunState *run,
                       const LrSchedule *sched, int steps_per_epoch, Metrics epoch_local) {
    CkptState st;
    memset(&st, 0, sizeof st);
    st.model = m->cfg;
    snprintf(st.dataset, sizeof st.dataset, "%s", o->dataset);
    st.world = pg_world(pg);
    st.global_batch = o->batch_size;
    st.steps_per_epoch = steps_per_epoch;
    st.epochs = o->epochs;
    (void)run;
    (void)epoch_local;
    return st;
}

// TODO 3 (the way back): the run's position and metrics from a checkpoint: where training goes on, and the
//   epoch's metrics so far (they become run.carry, added to this session's at the end of the epoch).
RunState ckpt_restore(const CkptState *st) {
    RunState run;
    memset(&run, 0, sizeof run);
    (void)st;  // starts again from step 0
    return run;
}

// ---------------------------------------------------------------- TODO 4: load on every rank

// TODO 4: every rank loads the checkpoint into its own model, on its own device (the kit reads and checks
//   the file, and copies it onto any device: kit/ckpt.h). What must hold when this returns:
//   - on success, every rank holds the checkpoint's model, and the replicas are identical: ranks that read
//     different files (node-local folders gone out of step) must be refused here, not train apart;
//   - on failure on ANY rank (a node without the file, a read error, different replicas), every rank returns
//     -1 and leaves the step to the caller, with this rank's reason in err (or that another rank failed).
//   Every rank reading the same file costs N reads of the file system; rank 0 reading and broadcasting
//   (lesson 03's TODO 4) costs one read plus a broadcast. Either is right.
// PyTorch: state = torch.load(path, map_location=f"cuda:{local_rank}"); model.module.load_state_dict(state)
int ckpt_load_all(ProcessGroup *pg, const char *path, Model *m, CkptState *st, char *err, size_t errlen) {
    if (pg_rank(pg) != 0) return 0;  // only rank 0 loads: the others keep their fresh weights
    return ckpt_load(path, m, st, err, errlen);
}

// ---------------------------------------------------------------- TODO 5: stop together

volatile sig_atomic_t g_stop_signal = 0;

// TODO 5: called by every rank after every step. Two reasons to stop:
//   - SIGTERM (what Slurm sends before preempting a job) or SIGINT (Ctrl-C): the handler in train.c sets
//     g_stop_signal, on the ranks the signal reached -- not necessarily all of them, nor at the same step.
//   - the step's loss is NaN or Inf (batch->loss_sum): the weights are poisoned from now on, and saving them
//     would overwrite the last good checkpoint.
//   What must hold: every rank gets the same two answers after the same step (one rank stopping alone
//   leaves the others waiting for it in the next all-reduce until the timeout), at the cost of one message
//   per step, not two.
// PyTorch: a signal handler sets a flag; stop = torch.tensor([flag]); dist.all_reduce(stop, op=MAX)
void ckpt_stop_flags(ProcessGroup *pg, const Metrics *batch, bool *signalled, bool *nonfinite) {
    (void)pg;
    *signalled = g_stop_signal != 0;  // this rank only
    *nonfinite = false;
}
