// zero_ckpt.h: lesson 09, the sharded checkpoint (given code: zero_ckpt.c). Every rank saves only what it owns;
// a manifest written last makes the set valid; a set loads onto any world size, and consolidates into one file.
//
// ---------------------------------------------------------------- the files (--checkpoint-dir DIR)
//
//   DIR/step-00000040/shard-0-of-3.ckpt    rank 0's shard of the run at step 40 (3 ranks saved it)
//   DIR/step-00000040/shard-1-of-3.ckpt
//   DIR/step-00000040/shard-2-of-3.ckpt
//   DIR/step-00000040/manifest             written LAST, by rank 0, once every shard is durable
//   DIR/step-00000080/...                  the newest --keep sets are kept (default of lesson 04's --keep)
//
// A shard file IS a kit checkpoint file (kit/CHECKPOINT.md: header, tensor table, data, trailer, every part
// CRC-checked; tools/ckpt_read.py reads it), whose tensors are one rank's slices instead of a model's:
//   params    "unit00" .. "unit<U-1>": rank r's floats [r*shard_u, (r+1)*shard_u) of unit u's padded flat
//             parameters (shard_u = ceil(n_u / world); floats past n_u are padding, saved as 0)
//   momentum  the same names and slices of the SGD velocity
//   buffers   rank 0's file only: the whole model's BN running statistics under their own names ("01.bn.running_mean")
//   header    lesson 04's run state (CkptState: position, schedule, optimizer, metrics; world = the ranks that saved)
// Each rank writes its file with lesson 04's ckpt_write_file (tmp + fsync + rename + fsync of the folder).
//
// The manifest is text (cat it), one item per line, its own CRC-32 last:
//   kit-zero-manifest 1
//   world 3
//   step 40
//   model tiny-bn 8 3 32 32 10                 name, width, input C H W, classes
//   units 4
//   unit 0 layers 0 3 params 216 shard 72 param_base 0 buffers 16 buffer_base 0
//   ...                                        (one line per unit: its layers, n_u, shard_u, where it sits in the
//                                               whole model's flat parameters and BN buffers)
//   file 0 shard-0-of-3.ckpt bytes 4352 crc32 9a3f01c2
//   ...                                        (one line per rank: the shard file, its size and zlib CRC-32)
//   crc32 5d0e77a1                             of every byte before this line
// A set is valid when its manifest checks and every shard file has the size and CRC-32 the manifest names.
// The order of a save makes a crash at ANY moment harmless: shards (new names, in a new folder), a barrier,
// the manifest (atomic), then the oldest sets are pruned, manifest first. A folder without a manifest (a save
// that was killed) is never loaded, and is removed by the next prune.
//
// ---------------------------------------------------------------- loading onto another world (reshard)
//
// Unit u's parameters are the whole model's floats [param_base_u, param_base_u + n_u): any range of the whole
// model is found in the old set as (unit, old rank, offset) slices. A rank of the new run reads the old shard
// files that cover what IT must hold (stage 3: its new parameter shard; stages 0-2: every unit's parameters;
// momentum: its new shard, or everything under stage 0), so a set saved by 3 ranks under --zero 3 loads onto 2
// ranks under --zero 1, or onto 1. A new padding is zeros again.
//
// ---------------------------------------------------------------- consolidation (--consolidate FILE)
//
// After the training (or right after --resume of a finished run: nothing left to train), every unit's shards of
// parameters and momentum are all-gathered and rank 0 writes ONE lesson-04 checkpoint of the whole model with
// lesson 04's ckpt_save_rank0: lesson 06 evaluates it, and lesson 04's program resumes from it.
#ifndef ZERO_CKPT_H
#define ZERO_CKPT_H

#include "lesson.h"
#include "solutions/04-checkpoint/lesson.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZCKPT_MANIFEST "manifest"

// A sharded checkpoint run: where it saves, what it loaded, and the hooks of lesson 03's loop it wraps.
typedef struct {
    const TrainOptions *o;
    const char *consolidate;   // --consolidate FILE (NULL: none), from TrainOptions
    Zero *z;                   // set by zero_ckpt_begin
    TrainHooks inner;          // the lesson's own hooks, called first by the wrappers (zero_ckpt_attach)
    char last_set[1024];       // the folder of the last set saved or loaded ("" before)
    long long last_step;       // its step (-1: none)
    long long resumed_from;    // -1: a fresh run
    double save_seconds;       // rank 0's time in saves
    bool failed;               // a save failed: the loop was stopped
    bool stopped;              // --stop-at or a signal stopped the loop after a save
    bool nonfinite;            // the loss became NaN or Inf: stopped without saving (the run ends non-zero)
} ZeroCkpt;

// Before ddp_run_open: sets *c up from the options (o->consolidate: the kit's --consolidate) and wraps h so
// that the loop saves a set after every epoch (and every --save-every steps, at --stop-at, and at the step after
// a SIGTERM or SIGINT, as lesson 04 does; a NaN loss stops every rank without saving); every other
// hook of h is called as before (c keeps them in c->inner and becomes h->ctx).
void zero_ckpt_attach(ZeroCkpt *c, TrainHooks *h, const TrainOptions *o);
// After ddp_run_open, before the first step, on every rank: checks the options and every output (kit/ckpt.h: a
// folder that holds another run's sets, a --consolidate file of another run, are refused), then --resume (auto: the newest valid set of
// --checkpoint-dir; or a set's folder or its manifest): every rank takes what it owns from the old shards and
// r->run its position. Returns 0, or -1 on EVERY rank after an "error:" line.
int zero_ckpt_begin(ZeroCkpt *c, DdpRun *r, Zero *z);
// After the training and its report: --consolidate FILE. Returns 0, or -1 on every rank.
int zero_ckpt_end(ZeroCkpt *c, DdpRun *r);

// ---------------------------------------------------------------- the parts (the autograder calls them too)

// Saves the run as the set DIR/step-STEP/ (collective). Returns 0, or -1 on every rank with the reason in err.
int zero_ckpt_save(Zero *z, const char *dir, const CkptState *st, int keep, char *out_set, size_t out_len,
                   char *err, size_t errlen);
// Checks the set in folder `set` (its manifest, every shard's size and CRC-32) without loading it; any rank,
// not collective. Returns 0, or -1 with one line in err naming the file and what is wrong.
int zero_ckpt_check_set(const char *set, char *err, size_t errlen);
// The newest valid set of dir into out (invalid ones are skipped with a "warning:" line naming the file, when
// warn). Returns 0, or -1 (err: none valid, or no folder).
int zero_ckpt_find_latest(const char *dir, char *out, size_t outlen, bool warn, char *err, size_t errlen);
// Loads the set onto z (any world size, stage, units; the same architecture), its run state into *st.
// Collective. Returns 0, or -1 on every rank (err: this rank's reason, or that another rank failed).
int zero_ckpt_load(Zero *z, const char *set, CkptState *st, char *err, size_t errlen);
// The whole model (params, momentum, BN buffers) on rank 0's `whole` (the CPU, model_create's layout) from
// every rank's shards. Collective; `whole` is used on rank 0 only.
void zero_ckpt_gather(Zero *z, Model *whole);

#ifdef __cplusplus
}
#endif

#endif // ZERO_CKPT_H
