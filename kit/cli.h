// kit/cli.h: the command-line options every training program of the workshop shares.
//
// One option table for all lessons, so `--epochs` means the same thing everywhere. A lesson says which
// extra groups of options it accepts (CLI_DP for lesson 02's --devices, CLI_DIST for DDP's --backend
// and --bucket-mb, CLI_CKPT for lesson 04's checkpoint options, CLI_INFER for lesson 06's, CLI_RDZV for
// lesson 07's rendezvous, CLI_PIPE, CLI_ZERO, CLI_PREC and CLI_TP for lessons 08-11's); an option outside
// those groups is an error like any unknown option. An option may belong to several groups (--stop-at: CLI_CKPT
// and CLI_PREC), and every program parses its options here, with no second parser.
// A wrong option or value prints one line saying what is wrong, then the usage, and exits with status 2.
//
// Adding an option: a field below and a row of the option table in kit/cli.c (name, group, type, field,
// default, range or choices, help). A new group (a lesson's own options): one more CLI_* bit here.
#ifndef KIT_CLI_H
#define KIT_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// Lesson 10's precision options (--precision, --loss-scale, --master, --allreduce, --accumulate, --lr-rule, ...).
enum { CLI_PREC = 1 << 7, CLI_TP = 1 << 8 };

enum { CLI_BASE = 0, CLI_DP = 1 << 0, CLI_DIST = 1 << 1, CLI_CKPT = 1 << 2, CLI_RDZV = 1 << 3, CLI_INFER = 1 << 4,
       CLI_PIPE = 1 << 5, CLI_ZERO = 1 << 6 };

typedef struct {
    const char *dataset, *data_dir, *device, *model, *metrics;
    int width, epochs, batch_size, warmup_epochs;
    float lr, momentum, weight_decay, label_smoothing;
    bool nesterov;
    uint64_t seed;
    bool tf32;                // --tf32: the convolutions' GEMMs on TF32 tensor cores (PyTorch's default); CUDA only
    int devices;              // CLI_DP: replicas driven by one process
    const char *backend;      // CLI_DIST: auto|mpi|nccl|socket (pg_backend_choices, kit/dist_plan.h)
    double bucket_mb;         // CLI_DIST: gradient bucket size (0: one flat all-reduce after backward)
    double timeout_s;         // CLI_DIST: collective timeout
    bool keep_last_batch;     // CLI_DIST: keep the epoch's last short batch, shards padded (drop_last=False)
    const char *trace;        // write a timeline of every rank to this file (kit/trace.h; NULL: none)
    const char *checkpoint;      // CLI_CKPT: file to save to (overwritten at every save)
    const char *checkpoint_dir;  // CLI_CKPT: or a folder of ckpt-STEP.ckpt files, the newest --keep kept
    const char *resume;          // CLI_CKPT: a checkpoint file to resume from, or "auto" (newest valid in the folder)
    int save_every;              // CLI_CKPT: also save every N steps (0: at the end of every epoch only)
    int keep;                    // CLI_CKPT: checkpoints kept in --checkpoint-dir
    int stop_at;                 // CLI_CKPT, CLI_PREC, CLI_TP: stop after this global (optimizer) step (0: never); a run
                                 //   that checkpoints saves first, e.g. to chain jobs
    bool overwrite;              // CLI_CKPT, CLI_PREC, CLI_INFER: an output file may replace another run's (ckpt.h)
    const char *init_method;     // CLI_RDZV (lesson 07): env (MASTER_ADDR/MASTER_PORT), tcp://HOST:PORT or file:///PATH
    // lesson 06 (inference) reads --checkpoint FILE too
    const char *image;           // CLI_INFER: predict this image file (PNG, or raw C*H*W bytes)
    const char *confusion;       // CLI_INFER: write the confusion matrix as CSV to this file (make plot draws it)
    bool latency;                // CLI_INFER: measure latency (batch 1) and throughput (batch 256)
    // lesson 10 (precision and large batches; the format names are lowp_name's, kit/ops.h: lowp_parse reads them)
    const char *precision;       // CLI_PREC: fp32|bf16|fp16, what activations, weights and gradients are rounded to
    const char *loss_scale;      // CLI_PREC: dynamic (PyTorch's GradScaler: what fp16 needs), none (1), or a number
                                 //   (a static scale), checked by cli_parse: "dynamic", "none" or in (0, 1e30]
    int scale_window;            // CLI_PREC: good steps in a row before a dynamic scale grows (GradScaler's 2000)
    const char *master;          // CLI_PREC: fp32|bf16, the master weights' format (bf16: the failure to show)
    const char *allreduce;       // CLI_PREC: fp32|bf16, the gradient all-reduce's wire format
    int accumulate;              // CLI_PREC: micro-batches per optimizer step (each rank's batch split K ways)
    const char *lr_rule;         // CLI_PREC: fixed|linear, linear: --lr x global batch / --lr-ref-batch
    int lr_ref_batch;            // CLI_PREC: the global batch the base --lr was tuned for
    const char *save_params;     // CLI_PREC: at the end, rank 0 writes the master weights, momentum, BN statistics here
    // lesson 08 (pipelines)
    int stages, micro_batches;   // CLI_PIPE: stages the model is cut into, micro-batches per batch
    const char *balance;         // CLI_PIPE: params|time, what a cut balances
    const char *schedule;        // CLI_PIPE: gpipe|1f1b, the order of a stage's forwards and backwards
    const char *stage_devices;   // CLI_PIPE: one process, the device of every stage ("cpu,cuda"; NULL: --device)
    int bench;                   // CLI_PIPE: > 0, time this many steps on one batch instead of training
    // lesson 09 (ZeRO, FSDP, recomputation)
    int zero;                    // CLI_ZERO: 0..3, what is sharded: nothing, momentum, + gradients, + parameters
    int units;                   // CLI_ZERO: units the model is cut into, 1..ZERO_MAX_UNITS (0: one per layer)
    bool recompute;              // CLI_ZERO: keep a unit's output only, recompute its activations in backward
    bool memory;                 // CLI_ZERO, CLI_TP: print every rank's memory by part (live, peak) after the first step
    const char *consolidate;     // CLI_ZERO: after the training, one lesson-04 checkpoint of the whole model
    // lesson 11 (tensor parallelism)
    int tp;                      // CLI_TP: ranks of a tensor group, 1..64, 0: the world (the world: tp x replicas)
} TrainOptions;

// Parses argv into *o (the table's defaults first). `groups` is CLI_BASE or'ed with the extra groups
// accepted. --help prints the usage and exits 0.
void cli_parse(TrainOptions *o, int argc, char **argv, unsigned groups);
void cli_usage(FILE *out, unsigned groups);
// Dataset-dependent defaults, applied after parsing, from the dataset table (kit/data.h): the model and
// the epoch count of the README's reference schedule, when the command line did not set them.
void cli_apply_dataset_defaults(TrainOptions *o);
// Is name one of the entries of "a|b|c"?
bool cli_name_in_list(const char *name, const char *list);

#ifdef __cplusplus
}
#endif

#endif // KIT_CLI_H
