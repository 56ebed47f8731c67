// kit/cli.c: the shared training options (see cli.h).
#include "kit/cli.h"

#include "kit/device.h"

#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kit/data.h"
#include "kit/dist.h"
#include "kit/model.h"

// ---------------------------------------------------------------- the option table

typedef enum { OPT_STRING, OPT_INT, OPT_FLOAT, OPT_DOUBLE, OPT_SEED, OPT_FLAG } OptType;

static const char *device_choices(void) { return "auto|cpu|cuda|cuda-emu"; }
static const char *balance_choices(void) { return "params|time"; }
static const char *schedule_choices(void) { return "gpipe|1f1b"; }
static const char *precision_choices(void) { return "fp32|bf16|fp16"; }
static const char *master_choices(void) { return "fp32|bf16"; }
static const char *lr_rule_choices(void) { return "fixed|linear"; }

// One row per option: adding an option is a TrainOptions field and a row here. Parsing, the range check,
// the default, --help and the "does not apply to this lesson" error all come from the row.
typedef struct {
    const char *name;              // --name
    const char *arg;               // what --help shows for the value (NULL: a flag without a value)
    unsigned group;                // CLI_BASE (every lesson) or the group that accepts it
    OptType type;
    size_t offset;                 // the TrainOptions field it sets
    const char *def;               // default, parsed like a value from the command line (NULL: none here)
    double lo, hi;                 // range of a number
    const char *(*choices)(void);  // the values a string may take, "a|b|c" (NULL: any)
    const char *help;              // for --help; choices come first, " (default DEF)" last
} CliOption;

#define FIELD(f) offsetof(TrainOptions, f)
#define TEXT_OF_(x) #x
#define TEXT_OF(x) TEXT_OF_(x)  // a macro's value as a string: TEXT_OF(PG_DEFAULT_TIMEOUT_S) is "25"
static const CliOption OPTIONS[] = {
    {"dataset", "NAME", CLI_BASE, OPT_STRING, FIELD(dataset), "synthetic", 0, 0, dataset_names, ""},
    {"data-dir", "DIR", CLI_BASE, OPT_STRING, FIELD(data_dir), "datasets/data", 0, 0, NULL,
     "where the dataset files are"},
    {"device", "DEV", CLI_BASE, OPT_STRING, FIELD(device), "auto", 0, 0, device_choices,
     "; auto: the GPU when one is usable;\ncuda-emu: the CUDA code in the CPU emulator (a `make EMU=1` build)"},
    {"model", "NAME", CLI_BASE, OPT_STRING, FIELD(model), NULL, 0, 0, model_names,
     " (default: the dataset's, see below)"},
    {"width", "N", CLI_BASE, OPT_INT, FIELD(width), NULL, 1, 4096, NULL,
     "base channel count of the model (default: the model's own)"},
    {"epochs", "N", CLI_BASE, OPT_INT, FIELD(epochs), NULL, 1, 100000, NULL,
     "passes over the training set (default: the dataset's, see below)"},
    {"batch-size", "N", CLI_BASE, OPT_INT, FIELD(batch_size), "128", 1, 65536, NULL,
     "images per step, over all devices/ranks"},
    {"lr", "X", CLI_BASE, OPT_FLOAT, FIELD(lr), "0.05", 0.0, 100.0, NULL, "peak learning rate"},
    {"momentum", "X", CLI_BASE, OPT_FLOAT, FIELD(momentum), "0.9", 0.0, 0.999, NULL, "SGD momentum"},
    {"nesterov", NULL, CLI_BASE, OPT_FLAG, FIELD(nesterov), NULL, 0, 0, NULL, "use Nesterov momentum"},
    {"weight-decay", "X", CLI_BASE, OPT_FLOAT, FIELD(weight_decay), "5e-4", 0.0, 1.0, NULL,
     "L2 penalty on conv/linear weights"},
    {"label-smoothing", "X", CLI_BASE, OPT_FLOAT, FIELD(label_smoothing), "0", 0.0, 0.999, NULL,
     "label smoothing of the cross-entropy"},
    {"warmup-epochs", "N", CLI_BASE, OPT_INT, FIELD(warmup_epochs), "1", 0, 100000, NULL,
     "linear learning-rate warmup, then linear decay to 0"},
    {"seed", "N", CLI_BASE, OPT_SEED, FIELD(seed), "1", 0, 0x7fffffff, NULL,
     "seed for initialisation, shuffling and augmentation"},
    {"metrics", "FILE", CLI_BASE, OPT_STRING, FIELD(metrics), NULL, 0, 0, NULL,
     "append one CSV row per epoch to FILE"},
    {"tf32", NULL, CLI_BASE, OPT_FLAG, FIELD(tf32), NULL, 0, 0, NULL,
     "CUDA: the convolutions' GEMMs on TF32 tensor cores (10-bit mantissa\ninputs, float32 sums), linear in float32: "
     "PyTorch's default\n(cuDNN convolutions TF32, matmuls not); refused on the CPU"},
    {"devices", "N", CLI_DP, OPT_INT, FIELD(devices), "2", 1, 64, NULL, "replicas driven by this process"},
    {"backend", "NAME", CLI_DIST, OPT_STRING, FIELD(backend), "auto", 0, 0, pg_backend_choices,
     "; auto: nccl with one GPU per rank, else mpi\n(socket in a job started from a rendezvous store: lesson 07)"},
    {"bucket-mb", "X", CLI_DIST, OPT_DOUBLE, FIELD(bucket_mb), "25", 0.0, 4096.0, NULL,
     "all-reduce gradients in buckets of X MB during backward;\n0 = one all-reduce of the whole buffer after backward"},
    {"timeout", "S", CLI_DIST, OPT_DOUBLE, FIELD(timeout_s), TEXT_OF(PG_DEFAULT_TIMEOUT_S), 0.1, 86400.0, NULL,
     "seconds a collective may wait for a peer before the job stops"},
    {"keep-last-batch", NULL, CLI_DIST, OPT_FLAG, FIELD(keep_last_batch), NULL, 0, 0, NULL,
     "train on the last, short batch of every epoch too; the shards are\npadded to equal length from the epoch's start "
     "(PyTorch's\nDistributedSampler(drop_last=False)); default: both dropped"},
    {"trace", "FILE", CLI_BASE, OPT_STRING, FIELD(trace), NULL, 0, 0, NULL,
     "write a timeline of every rank to FILE (Chrome trace format:\nopen it at ui.perfetto.dev; kit/TRACING.md)"},
    {"checkpoint", "FILE", CLI_CKPT | CLI_INFER, OPT_STRING, FIELD(checkpoint), NULL, 0, 0, NULL,
     "training: save to FILE at the end of every epoch (and every\n--save-every steps); inference: the checkpoint to load"},
    {"checkpoint-dir", "DIR", CLI_CKPT, OPT_STRING, FIELD(checkpoint_dir), NULL, 0, 0, NULL,
     "or save DIR/ckpt-STEP.ckpt files, keeping the newest --keep"},
    {"save-every", "N", CLI_CKPT, OPT_INT, FIELD(save_every), "0", 0, 1 << 30, NULL,
     "also save every N steps (0: at the end of every epoch only)"},
    {"keep", "K", CLI_CKPT, OPT_INT, FIELD(keep), "3", 1, 1000000, NULL, "checkpoints kept in --checkpoint-dir"},
    {"resume", "FILE|auto", CLI_CKPT, OPT_STRING, FIELD(resume), NULL, 0, 0, NULL,
     "resume from FILE, or from the newest valid checkpoint of\n--checkpoint-dir (none there: start from step 0)"},
    {"stop-at", "STEP", CLI_CKPT | CLI_PREC | CLI_TP, OPT_INT, FIELD(stop_at), "0", 0, 0x7fffffff, NULL,
     "stop after global (optimizer) step STEP, 0: never; a run\nthat checkpoints saves first (to chain jobs)"},
    {"overwrite", NULL, CLI_CKPT | CLI_PREC | CLI_INFER, OPT_FLAG, FIELD(overwrite), NULL, 0, 0, NULL,
     "an output file (--checkpoint, --consolidate, --save-params,\n--confusion) may replace a file that is not this run's:\n"
     "another run's checkpoint, or any other file (never a folder)"},
    // lesson 07: how ranks started without mpirun find each other (torch.distributed's init_method)
    {"init-method", "URL", CLI_RDZV, OPT_STRING, FIELD(init_method), "env", 0, 0, NULL,
     "without mpirun: env (tcp://MASTER_ADDR:MASTER_PORT), tcp://HOST:PORT\nor file:///SHARED/PATH"},
    // lesson 06 (inference)
    {"image", "FILE", CLI_INFER, OPT_STRING, FIELD(image), NULL, 0, 0, NULL,
     "predict one image: a PNG, or raw bytes (C, H, W) like a CIFAR record"},
    {"confusion", "FILE", CLI_INFER, OPT_STRING, FIELD(confusion), NULL, 0, 0, NULL,
     "write the confusion matrix as CSV to FILE (make plot draws it)"},
    {"latency", NULL, CLI_INFER, OPT_FLAG, FIELD(latency), NULL, 0, 0, NULL,
     "measure latency (batch 1: p50, p99) and throughput (batch 256)\ninstead of evaluating the test set"},
    // lesson 10 (precision and large batches)
    {"precision", "FMT", CLI_PREC, OPT_STRING, FIELD(precision), "fp32", 0, 0, precision_choices,
     ": what activations, weights and gradients are\nrounded to (emulated in float32 containers)"},
    {"loss-scale", "S", CLI_PREC, OPT_STRING, FIELD(loss_scale), "dynamic", 0, 0, NULL,
     "dynamic (fp16's: grows, backs off on inf), none, or a\nnumber (a static scale); bf16 and fp32 need none"},
    {"scale-window", "N", CLI_PREC, OPT_INT, FIELD(scale_window), "2000", 1, 1000000, NULL,
     "good steps in a row before a dynamic scale doubles"},
    {"master", "FMT", CLI_PREC, OPT_STRING, FIELD(master), "fp32", 0, 0, master_choices,
     ": the master weights' format (bf16: updates vanish)"},
    {"allreduce", "FMT", CLI_PREC, OPT_STRING, FIELD(allreduce), "fp32", 0, 0, master_choices,
     ": the gradient all-reduce's wire format"},
    {"accumulate", "K", CLI_PREC, OPT_INT, FIELD(accumulate), "1", 1, 1024, NULL,
     "micro-batches per optimizer step, 1..1024 (each rank's\nbatch split K ways: the activation memory of a K times\nsmaller batch)"},
    {"lr-rule", "RULE", CLI_PREC, OPT_STRING, FIELD(lr_rule), "fixed", 0, 0, lr_rule_choices,
     ": linear = --lr x --batch-size / --lr-ref-batch"},
    {"lr-ref-batch", "N", CLI_PREC, OPT_INT, FIELD(lr_ref_batch), "128", 1, 65536, NULL,
     "the global batch the base --lr was tuned for"},
    {"save-params", "FILE", CLI_PREC, OPT_STRING, FIELD(save_params), NULL, 0, 0, NULL,
     "at the end, rank 0 writes the fp32 master weights, the\nmomentum and the BN statistics to FILE (lesson 04's\nformat: build/tests/ckpt_compare A B)"},
    // lesson 08 (pipelines; the ranges are its PIPE_MAX_STAGES and PIPE_MAX_MICRO)
    {"stages", "N", CLI_PIPE, OPT_INT, FIELD(stages), "2", 1, 8, NULL, "stages the model is cut into, 1..8"},
    {"micro-batches", "M", CLI_PIPE, OPT_INT, FIELD(micro_batches), "4", 1, 64, NULL,
     "micro-batches per batch, 1..64 (1: naive model parallelism)"},
    {"balance", "RULE", CLI_PIPE, OPT_STRING, FIELD(balance), "params", 0, 0, balance_choices,
     ": cut by parameter count or by measured\nforward+backward time"},
    {"schedule", "NAME", CLI_PIPE, OPT_STRING, FIELD(schedule), "gpipe", 0, 0, schedule_choices,
     ": the order of each stage's forwards and\nbackwards (several ranks)"},
    {"stage-devices", "L", CLI_PIPE, OPT_STRING, FIELD(stage_devices), NULL, 0, 0, NULL,
     "one process: the list of the stages' devices, e.g. cpu,cuda\n(default: --device for all)"},
    {"bench", "STEPS", CLI_PIPE, OPT_INT, FIELD(bench), "0", 0, 100000, NULL,
     "several ranks: time STEPS steps on one batch, print a\n`bench:` line, no training (0: train)"},
    // lesson 09 (ZeRO, FSDP, recomputation; the --units range is its ZERO_MAX_UNITS, which train.c asserts)
    {"zero", "N", CLI_ZERO, OPT_INT, FIELD(zero), "0", 0, 3, NULL,
     "0..3, what the ranks shard: 0 nothing (DDP), 1 the momentum,\n2 + the gradients, 3 + the parameters"},
    {"units", "N", CLI_ZERO, OPT_INT, FIELD(units), NULL, 1, 32, NULL,
     "units the model is cut into, 1..32, balanced by parameter\ncount (default: one per layer with parameters)"},
    {"recompute", NULL, CLI_ZERO, OPT_FLAG, FIELD(recompute), NULL, 0, 0, NULL,
     "keep only each unit's output in forward; recompute its\nactivations in backward"},
    {"memory", NULL, CLI_ZERO | CLI_TP, OPT_FLAG, FIELD(memory), NULL, 0, 0, NULL,
     "print every rank's memory by part (live, peak) after the\nfirst step, beside the arithmetic"},
    {"tp", "T", CLI_TP, OPT_INT, FIELD(tp), "0", 0, 64, NULL,
     "ranks of a tensor group, 1..64 (0: every rank): each residual\nblock split over T ranks; the world is T x data replicas"},
    {"consolidate", "FILE", CLI_ZERO, OPT_STRING, FIELD(consolidate), NULL, 0, 0, NULL,
     "after the training, one lesson-04 checkpoint of the whole\nmodel (lesson 06 reads it)"},
};
#undef FIELD
enum { N_OPTIONS = (int)(sizeof OPTIONS / sizeof OPTIONS[0]), OPT_HELP = 'h', OPT_FIRST = 256 };

static bool option_applies(const CliOption *opt, unsigned groups) {
    return opt->group == CLI_BASE || (opt->group & groups) != 0;
}

// ---------------------------------------------------------------- --help

// Prints `text` with every line after the first indented to the help column.
static void print_help_text(FILE *out, const char *text) {
    for (const char *p = text; *p; p++) {
        fputc(*p, out);
        if (*p == '\n') fprintf(out, "%22s", "");
    }
}

void cli_usage(FILE *out, unsigned groups) {
    fprintf(out, "usage: train [options]\n");
    for (int i = 0; i < N_OPTIONS; i++) {
        const CliOption *opt = &OPTIONS[i];
        if (!option_applies(opt, groups)) continue;
        char flag[64];
        snprintf(flag, sizeof flag, "--%s%s%s", opt->name, opt->arg ? " " : "", opt->arg ? opt->arg : "");
        fprintf(out, "  %-19s ", flag);
        if (opt->choices) fputs(opt->choices(), out);
        print_help_text(out, opt->help);
        if (opt->def) fprintf(out, " (default %s)", opt->def);
        fputc('\n', out);
    }
    fprintf(out, "  %-19s this text\n", "--help");
    fprintf(out, "datasets (their default model and epochs):\n");
    const DatasetInfo *d;
    for (int i = 0; (d = dataset_at(i)) != NULL; i++)
        fprintf(out, "  %-19s --model %s --epochs %d%s\n", d->name, d->default_model, d->default_epochs,
                d->train_augment.crop_pad || d->train_augment.flip ? ", training images cropped and flipped" : "");
}

// ---------------------------------------------------------------- parsing

static unsigned usage_groups;  // for usage_error's usage text

static void usage_error(const char *fmt, const char *arg) __attribute__((noreturn));
static void usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "train: ");
    fprintf(stderr, fmt, arg);
    fputc('\n', stderr);
    cli_usage(stderr, usage_groups);
    exit(2);
}

static long parse_long(const char *name, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        char msg[160];
        snprintf(msg, sizeof msg, "--%s needs an integer in [%ld, %ld], got '%%s'", name, lo, hi);
        usage_error(msg, s);
    }
    return v;
}

static double parse_double(const char *name, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        char msg[160];
        snprintf(msg, sizeof msg, "--%s needs a number in [%g, %g], got '%%s'", name, lo, hi);
        usage_error(msg, s);
    }
    return v;
}

// "--device must be auto, cpu or cuda, got 'tpu'": the choices "a|b|c" read as a sentence.
static void choice_error(const char *name, const char *choices, const char *value) __attribute__((noreturn));
static void choice_error(const char *name, const char *choices, const char *value) {
    char msg[512];
    int used = snprintf(msg, sizeof msg, "--%s must be ", name);
    const char *last_bar = strrchr(choices, '|');
    for (const char *p = choices; *p && used < (int)sizeof msg - 8; p++) {
        if (*p != '|') msg[used++] = *p;
        else used += snprintf(msg + used, sizeof msg - (size_t)used, "%s", p == last_bar ? " or " : ", ");
    }
    snprintf(msg + used, sizeof msg - (size_t)used, ", got '%%s'");
    usage_error(msg, value);
}

static void option_set(TrainOptions *o, const CliOption *opt, const char *value) {
    void *field = (char *)o + opt->offset;
    switch (opt->type) {
    case OPT_STRING:
        if (opt->choices && !cli_name_in_list(value, opt->choices())) choice_error(opt->name, opt->choices(), value);
        *(const char **)field = value;
        break;
    case OPT_INT: *(int *)field = (int)parse_long(opt->name, value, (long)opt->lo, (long)opt->hi); break;
    case OPT_SEED: *(uint64_t *)field = (uint64_t)parse_long(opt->name, value, (long)opt->lo, (long)opt->hi); break;
    case OPT_FLOAT: *(float *)field = (float)parse_double(opt->name, value, opt->lo, opt->hi); break;
    case OPT_DOUBLE: *(double *)field = parse_double(opt->name, value, opt->lo, opt->hi); break;
    case OPT_FLAG: *(bool *)field = true; break;
    }
}

// --metrics FILE is written after the first epoch, which may be an hour away: check now that it can be,
// without creating anything (parsing has no side effects): its folder exists and is writable, and the
// file, if it exists, is a writable regular file. Returns NULL when fine, else why not.
static const char *metrics_unwritable(const char *path, char *why, size_t len) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = '\0';  // "/file": the root folder
    else *slash = '\0';
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, len, "its folder '%s' does not exist (create it first)", dir);
    } else if (access(dir, W_OK | X_OK) != 0) {
        snprintf(why, len, "its folder '%s' is not writable: %s", dir, strerror(errno));
    } else if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(why, len, "it is not a regular file");
    } else if (stat(path, &st) == 0 && access(path, W_OK) != 0) {
        snprintf(why, len, "the file is not writable: %s", strerror(errno));
    } else {
        return NULL;
    }
    return why;
}

bool cli_name_in_list(const char *name, const char *list) {
    size_t len = strlen(name);
    const char *p = list;
    while (*p) {
        if (strncmp(p, name, len) == 0 && (p[len] == '|' || p[len] == '\0')) return true;
        const char *bar = strchr(p, '|');
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

// --loss-scale: a word or a positive number (a scale of 0 would zero every gradient; above 1e30 the scaled
// loss of a float32 run is inf before anything is rounded).
static bool loss_scale_ok(const char *s) {
    if (strcmp(s, "dynamic") == 0 || strcmp(s, "none") == 0) return true;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    return !errno && end != s && !*end && v > 0.0 && v <= 1e30;
}

void cli_parse(TrainOptions *o, int argc, char **argv, unsigned groups) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < N_OPTIONS; i++)
        if (OPTIONS[i].def) option_set(o, &OPTIONS[i], OPTIONS[i].def);
    usage_groups = groups;
    struct option longopts[N_OPTIONS + 2];
    for (int i = 0; i < N_OPTIONS; i++)
        longopts[i] = (struct option){OPTIONS[i].name, OPTIONS[i].arg ? required_argument : no_argument, 0,
                                      OPT_FIRST + i};
    longopts[N_OPTIONS] = (struct option){"help", no_argument, 0, OPT_HELP};
    longopts[N_OPTIONS + 1] = (struct option){0, 0, 0, 0};
    opterr = 0;  // we print our own one-line error
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (c == OPT_HELP) {
            cli_usage(stdout, groups);
            exit(0);
        }
        if (c < OPT_FIRST || c >= OPT_FIRST + N_OPTIONS)
            usage_error("unknown option, or an option without its value: '%s'", argv[optind - 1]);
        const CliOption *opt = &OPTIONS[c - OPT_FIRST];
        if (!option_applies(opt, groups)) usage_error("option --%s does not apply to this lesson", opt->name);
        option_set(o, opt, optarg);
    }
    if (optind < argc) usage_error("unexpected argument '%s'", argv[optind]);
    char why[4200];
    if (o->metrics && metrics_unwritable(o->metrics, why, sizeof why)) {
        char msg[4400];
        snprintf(msg, sizeof msg, "--metrics '%%s' cannot be written: %s", why);
        usage_error(msg, o->metrics);
    }
    // An empty path is a slip of a script (an unset variable): '' would name the root folder or nothing at all.
    if (o->checkpoint && !*o->checkpoint) usage_error("--checkpoint '%s' is empty: name a file", o->checkpoint);
    if (o->checkpoint_dir && !*o->checkpoint_dir)
        usage_error("--checkpoint-dir '%s' is empty: name a folder", o->checkpoint_dir);
    if (o->resume && !*o->resume) usage_error("--resume '%s' is empty: name a checkpoint file, or auto", o->resume);
    if (o->trace && !*o->trace) usage_error("--trace '%s' is empty: name a file", o->trace);
    if (o->consolidate && !*o->consolidate)
        usage_error("--consolidate '%s' is empty: name a file", o->consolidate);
    if (o->save_params && !*o->save_params) usage_error("--save-params '%s' is empty: name a file", o->save_params);
    if (o->checkpoint && o->checkpoint_dir) usage_error("give --checkpoint FILE or --checkpoint-dir DIR, not both%s", "");
    if (o->resume && strcmp(o->resume, "auto") == 0 && !o->checkpoint_dir)
        usage_error("--resume auto takes the newest checkpoint of --checkpoint-dir: give that folder too%s", "");
    device_request_tf32(o->tf32);  // applied by device_parse, where the device is known (kit/device.h)
    if ((groups & CLI_PREC) && !loss_scale_ok(o->loss_scale))
        usage_error("--loss-scale must be dynamic, none or a number in (0, 1e30], got '%s'", o->loss_scale);
}

void cli_apply_dataset_defaults(TrainOptions *o) {
    const DatasetInfo *d = dataset_info(o->dataset);  // cli_parse accepted only names of the table
    if (!o->model) o->model = d->default_model;
    if (!o->epochs) o->epochs = d->default_epochs;
}
