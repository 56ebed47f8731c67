// kit/ckpt.h: checkpoints: one self-describing, versioned, little-endian file per save.
//
//   header   magic "KITCKPT\0", format version, the model (name, width, input shape, classes), the dataset,
//            where training stood (world size, global batch, step, epoch, batch inside the epoch, seed),
//            the optimizer and schedule, the metrics so far; its own CRC-32
//   table    one entry per tensor: name (the kit's view name, no wrapper prefix), group (params, momentum,
//            buffers), dtype, shape, byte offset, byte count, CRC-32 of its bytes; the table's CRC is in
//            the header
//   data     the three flat buffers, tensor after tensor, starting on a 64-byte boundary
//   trailer  "KITCKEND" and the CRC-32 of every byte before it
// The byte-level layout is in kit/CHECKPOINT.md; tools/ckpt_read.py reads it with numpy alone.
//
// The file holds no device pointer and no device name: a checkpoint written from GPU memory loads onto the
// CPU and the reverse, on any number of ranks. Reading validates EVERYTHING (sizes, magic, version, every
// CRC, and against a model: its config and every tensor's name and shape) before it touches the model, so a
// bad file is one clear error and the model is left as it was: never a crash, never a partial load.
// Saving is atomic: the bytes go to PATH.tmp in the same folder, are fsync'ed, renamed over PATH, and the
// folder is fsync'ed; a crash at any moment leaves either the previous file or the new one.
#ifndef KIT_CKPT_H
#define KIT_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kit/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_MAGIC "KITCKPT"      // 8 bytes with its NUL
#define CKPT_END_MAGIC "KITCKEND" // 8 bytes, no NUL
#define CKPT_VERSION 1u
#define CKPT_MAX_TENSORS 4096     // a sanity bound for readers: the kit's models have a few dozen

typedef enum { CKPT_PARAMS = 0, CKPT_MOMENTUM = 1, CKPT_BUFFERS = 2, CKPT_GROUPS = 3 } CkptGroup;
typedef enum { CKPT_F32 = 0 } CkptDtype;

// Where a training run stood when it was saved: what an exact resume needs besides the tensors.
// The kit's random numbers are counter-based (kit/rng.h): the shuffle of an epoch is a function of
// (seed, epoch), a sample's augmentation of (seed, epoch, sample index), the initialisation of the seed.
// So (seed, epoch, batch_in_epoch) IS the state of every random stream, on every rank.
typedef struct {
    ModelConfig model;      // architecture: name, width, input shape, classes
    char dataset[32];
    int world;              // ranks that saved it (informational: any world size may load it)
    int global_batch;       // images per step over all ranks
    int steps_per_epoch;
    int epochs;             // epochs the run was planned for
    int epoch;              // the epoch in progress, 0-based
    int batch_in_epoch;     // batches of that epoch already trained; == steps_per_epoch: only its evaluation is left
    long long step;         // optimizer steps done since the start (epoch * steps_per_epoch + batch_in_epoch)
    uint64_t seed;          // every random stream (see above)
    // The optimizer and the learning-rate schedule (a resume with other values is not the same run).
    float peak_lr, final_lr;
    int warmup_steps, total_steps, decay;  // decay: kit/optim.h DecayKind
    float momentum, weight_decay;
    int nesterov;
    // Metrics so far.
    double loss_sum;        // the epoch in progress, summed over all ranks
    long long correct, count;
    long long images;       // images trained on since the start, all ranks
    double last_loss, test_acc;  // of the last finished epoch (0 before the first)
} CkptState;

// One entry of the tensor table.
typedef struct {
    char name[48];     // the kit's view name ("03.bn.weight"): no "module." or other wrapper prefix
    CkptGroup group;
    CkptDtype dtype;
    int ndim;          // 1..4
    int shape[4];
    uint64_t offset;   // bytes from the start of the file
    uint64_t nbytes;
    uint32_t crc;      // zlib crc32 of the nbytes
} CkptTensor;

// A checkpoint in host memory, validated as a file (format, sizes, every CRC): no model needed.
typedef struct {
    CkptState state;
    uint32_t version;
    int n_tensors;
    CkptTensor *tensors;    // (n_tensors)
    const uint8_t *bytes;   // the whole file
    size_t size;
    uint8_t *owned;         // what ckpt_free releases (NULL when decoding a caller's buffer)
} Ckpt;

// ---------------------------------------------------------------- writing

// The file's exact bytes for m's parameters, momentum (velocity) and buffers, copied from m's device, and *st.
// Returns a malloc'd buffer (free it) of *bytes bytes.
uint8_t *ckpt_encode(const Model *m, const CkptState *st, size_t *bytes);

// ckpt_encode, written atomically and durably: PATH.tmp in the same folder, write, fsync, close, rename over
// PATH, fsync of the folder (for tools and tests; a training program saves through lesson 04's
// ckpt_write_file, which the learner writes). Returns 0, or -1 with the failing step and errno's text in err.
int ckpt_save(const char *path, const Model *m, const CkptState *st, char *err, size_t errlen);
// The CRC-32 (zlib's, the one the file's sections carry) of m's parameters, wherever they live: a fingerprint two
// runs can print to show that they trained the same numbers, bit for bit (lessons 09 and 11).
uint32_t ckpt_params_crc32(const Model *m);

// Before the first step: can checkpoints be saved to `file` (--checkpoint) or in `dir` (--checkpoint-dir,
// created when missing; its parent must exist)? Either may be NULL. Tries what a save does: creates a file in
// the folder, and removes it. Returns 0, or -1 with one line in err naming the option and the reason.
int ckpt_check_output(const char *file, const char *dir, char *err, size_t errlen);

// ---------------------------------------------------------------- whose file is it? (before the first step)
//
// A program never replaces another run's work. Every output a training program writes (a checkpoint file,
// a folder of checkpoints or of shard sets, a consolidated file, saved parameters) is checked by rank 0
// before the first step with ckpt_check_file_owner / ckpt_check_dir_owner, and the verdict agreed on every
// rank. Who wrote a checkpoint is in its header: the run's identity is what a resume must match (the model,
// the dataset, the global batch, the epochs, the seed, the optimizer and the schedule's peak and warmup;
// kit/train.h's train_identity makes it from a run's options).
//
//   what is at the path                        verdict
//   nothing                                    ok (when a file can be created there)
//   a checkpoint of this run, under --resume   ok: the run continues and replaces its own file
//   a checkpoint of this run, a fresh run      refused: --resume continues it, --overwrite starts over
//   another run's checkpoint                   refused: --overwrite replaces it (a file only)
//   a file that is no checkpoint of this kit   refused: --overwrite replaces it
// A folder is never given over with --overwrite: two runs' checkpoints in one folder would leave its newest
// (what --resume auto loads) to chance; the message names --resume auto or another folder.

// Was st written by the run id names? true, or false with the first difference in why ("seed 2, this run 1").
bool ckpt_same_run(const CkptState *st, const CkptState *id, char *why, size_t whylen);

typedef enum {
    CKPT_OUT_CHECKPOINT,  // the path gets a kit checkpoint (--checkpoint, --consolidate, --save-params)
    CKPT_OUT_REPORT,      // a text report written or appended (--metrics, --confusion): anything but a checkpoint
} CkptOutputKind;

// Who is asking: this run, and what the user allowed.
typedef struct {
    const CkptState *id;  // this run (kit/train.h: train_identity)
    bool resuming;        // --resume given: a checkpoint of this same run may be replaced (it is continued)
    bool overwrite;       // --overwrite given: a file (not a folder) may be replaced whoever wrote it
    bool can_resume;      // the program has --resume for this output: the refusal names it as the way to continue
} CkptOwner;

// The output FILE `path` of the option `flag` ("--checkpoint", "--consolidate", "--save-params", "--metrics"):
// writable (its folder exists and takes a new file; not a folder itself), and replacing it loses nobody's work
// (the table above). Returns 0, or -1 with one line (and a HINT line) in err naming flag and path.
int ckpt_check_file_owner(const char *flag, const char *path, CkptOutputKind kind, const CkptOwner *me, char *err,
                          size_t errlen);
// The output FOLDER `dir` of `flag` (--checkpoint-dir): created when missing (its parent must exist), writable,
// and `newest` (the newest valid checkpoint file in it, which says whose the folder is; NULL: none) this run's
// under --resume. what: "checkpoints", "sets". Returns 0, or -1 with the reason in err.
int ckpt_check_dir_owner(const char *flag, const char *dir, const char *newest, const char *what, const CkptOwner *me,
                         char *err, size_t errlen);

// ---------------------------------------------------------------- reading

// Validates n bytes as a checkpoint file and fills *ck (pointing into buf, which must outlive it).
// Returns 0, or -1 with one line in err saying what is wrong (truncated, wrong magic, version, a CRC
// mismatch naming the section or tensor, a table entry out of bounds, ...). Safe on arbitrary bytes.
int ckpt_decode(Ckpt *ck, const void *buf, size_t n, char *err, size_t errlen);
// Reads the whole file and decodes it (*ck owns the bytes). Errors name the path.
int ckpt_read(Ckpt *ck, const char *path, char *err, size_t errlen);
void ckpt_free(Ckpt *ck);

// Does the checkpoint fit m? Same config (name, width, input shape, classes), and every tensor of m's three
// buffers present with the same shape, and nothing else. Returns 0, or -1 naming the first difference.
int ckpt_check_model(const Ckpt *ck, const Model *m, char *err, size_t errlen);
// Copies the tensors into m's buffers on m's device (call ckpt_check_model first: it exits on a mismatch).
void ckpt_apply(const Ckpt *ck, Model *m);

// ckpt_read + ckpt_check_model + ckpt_apply, state into *st (may be NULL). On error m is untouched.
int ckpt_load(const char *path, Model *m, CkptState *st, char *err, size_t errlen);

// The tensor of this group and name, or NULL; its data as floats (copied out: the file need not be aligned).
const CkptTensor *ckpt_find(const Ckpt *ck, CkptGroup g, const char *name);
void ckpt_tensor_data(const Ckpt *ck, const CkptTensor *t, float *out);

const char *ckpt_group_name(CkptGroup g);

// A name read from a file (tensor, model, dataset) made safe to print on one line: bytes outside printable
// ASCII and the backslash become \xNN and \\. Returns out. CKPT_ESCAPED_LEN holds any 48-byte name escaped.
enum { CKPT_ESCAPED_LEN = 4 * 48 + 1 };
const char *ckpt_escape(const char *s, char *out, size_t outlen);  // "params", "momentum", "buffers"

// ---------------------------------------------------------------- a folder of checkpoints

// The file name for a save at `step` in dir: "DIR/ckpt-00001234.ckpt" (zero-padded, so names sort by step).
void ckpt_path_for_step(char *out, size_t outlen, const char *dir, long long step);
// The valid checkpoint of highest step in dir (files ckpt-*.ckpt), into out. Corrupt ones are skipped with a
// warning on stderr naming the file and the reason. Returns 0, or -1 (err says why: no folder, none valid).
int ckpt_find_latest(const char *dir, char *out, size_t outlen, char *err, size_t errlen);
// Removes all but the `keep` highest-step ckpt-*.ckpt files of dir (keep <= 0: removes nothing).
// Returns how many were removed.
int ckpt_prune(const char *dir, int keep);

#ifdef __cplusplus
}
#endif

#endif // KIT_CKPT_H
