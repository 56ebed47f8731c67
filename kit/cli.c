// kit/cli.c: the shared training options (see cli.h).
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "model.h"

void cli_usage(FILE *out, unsigned groups) {
    fprintf(out,
            "usage: train [options]\n"
            "  --dataset NAME      %s (default synthetic)\n"
            "  --data-dir DIR      where the dataset files are (default datasets/data)\n"
            "  --device DEV        auto|cpu|cuda|cuda-emu (default auto: the GPU when one is usable;\n"
            "                      cuda-emu: the CUDA code in the CPU emulator, from a `make EMU=1` build)\n"
            "  --model NAME        %s (default: resnet9 for CIFAR, fmnist for Fashion-MNIST, tiny-bn for synthetic)\n"
            "  --width N           base channel count of the model (default: the model's own)\n"
            "  --epochs N          passes over the training set (default: per dataset, see README)\n"
            "  --batch-size N      images per step, over all devices/ranks (default 128)\n"
            "  --lr X              peak learning rate (default 0.05)\n"
            "  --momentum X        SGD momentum (default 0.9)\n"
            "  --nesterov          use Nesterov momentum\n"
            "  --weight-decay X    L2 penalty on conv/linear weights (default 5e-4)\n"
            "  --label-smoothing X (default 0)\n"
            "  --warmup-epochs N   linear learning-rate warmup, then linear decay to 0 (default 1)\n"
            "  --seed N            seed for initialisation, shuffling and augmentation (default 1)\n"
            "  --metrics FILE      append one CSV row per epoch to FILE\n",
            dataset_names(), model_names());
    if (groups & CLI_DP) fprintf(out, "  --devices N         replicas driven by this process (default 2)\n");
    if (groups & CLI_DIST)
        fprintf(out,
                "  --backend NAME      auto|mpi|nccl (default auto: nccl with one GPU per rank, else mpi)\n"
                "  --bucket-mb X       all-reduce gradients in buckets of X MB during backward (default 25;\n"
                "                      0 = one all-reduce of the whole buffer after backward)\n"
                "  --timeout S         seconds a collective may wait for a peer before the job stops (default 60)\n");
    if (groups & CLI_CKPT) fprintf(out, "  --checkpoint FILE   save to FILE every epoch; resume from it when it exists\n");
    fprintf(out, "  --help              this text\n");
}

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
        snprintf(msg, sizeof msg, "%s needs an integer in [%ld, %ld], got '%%s'", name, lo, hi);
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
        snprintf(msg, sizeof msg, "%s needs a number in [%g, %g], got '%%s'", name, lo, hi);
        usage_error(msg, s);
    }
    return v;
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

void cli_parse(TrainOptions *o, int argc, char **argv, unsigned groups) {
    *o = (TrainOptions){.dataset = "synthetic", .data_dir = "datasets/data", .device = "auto", .batch_size = 128,
                        .warmup_epochs = 1, .lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .seed = 1,
                        .devices = 2, .backend = "auto", .bucket_mb = 25.0, .timeout_s = 60.0};
    usage_groups = groups;
    static const struct option longopts[] = {
        {"dataset", required_argument, 0, 'd'},      {"data-dir", required_argument, 0, 'D'},
        {"device", required_argument, 0, 'v'},       {"model", required_argument, 0, 'm'},
        {"width", required_argument, 0, 'w'},        {"epochs", required_argument, 0, 'e'},
        {"batch-size", required_argument, 0, 'b'},   {"lr", required_argument, 0, 'l'},
        {"momentum", required_argument, 0, 'M'},     {"nesterov", no_argument, 0, 'n'},
        {"weight-decay", required_argument, 0, 'W'}, {"label-smoothing", required_argument, 0, 'S'},
        {"warmup-epochs", required_argument, 0, 'u'}, {"seed", required_argument, 0, 's'},
        {"metrics", required_argument, 0, 'o'},      {"help", no_argument, 0, 'h'},
        {"devices", required_argument, 0, 'N'},      {"backend", required_argument, 0, 'B'},
        {"bucket-mb", required_argument, 0, 'K'},    {"timeout", required_argument, 0, 'T'},
        {"checkpoint", required_argument, 0, 'C'},   {0, 0, 0, 0}};
    opterr = 0;  // we print our own one-line error
    optind = 1;
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", longopts, &li)) != -1) {
        bool dp = groups & CLI_DP, dist = groups & CLI_DIST, ckpt = groups & CLI_CKPT;
        if ((c == 'N' && !dp) || ((c == 'B' || c == 'K' || c == 'T') && !dist) || (c == 'C' && !ckpt))
            usage_error("option --%s does not apply to this lesson", longopts[li].name);
        switch (c) {
        case 'd': o->dataset = optarg; break;
        case 'D': o->data_dir = optarg; break;
        case 'v': o->device = optarg; break;
        case 'm': o->model = optarg; break;
        case 'w': o->width = (int)parse_long("--width", optarg, 1, 4096); break;
        case 'e': o->epochs = (int)parse_long("--epochs", optarg, 1, 100000); break;
        case 'b': o->batch_size = (int)parse_long("--batch-size", optarg, 1, 65536); break;
        case 'l': o->lr = (float)parse_double("--lr", optarg, 0.0, 100.0); break;
        case 'M': o->momentum = (float)parse_double("--momentum", optarg, 0.0, 0.999); break;
        case 'n': o->nesterov = true; break;
        case 'W': o->weight_decay = (float)parse_double("--weight-decay", optarg, 0.0, 1.0); break;
        case 'S': o->label_smoothing = (float)parse_double("--label-smoothing", optarg, 0.0, 0.999); break;
        case 'u': o->warmup_epochs = (int)parse_long("--warmup-epochs", optarg, 0, 100000); break;
        case 's': o->seed = (uint64_t)parse_long("--seed", optarg, 0, 0x7fffffffL); break;
        case 'o': o->metrics = optarg; break;
        case 'N': o->devices = (int)parse_long("--devices", optarg, 1, 64); break;
        case 'B': o->backend = optarg; break;
        case 'K': o->bucket_mb = parse_double("--bucket-mb", optarg, 0.0, 4096.0); break;
        case 'T': o->timeout_s = parse_double("--timeout", optarg, 0.1, 86400.0); break;
        case 'C': o->checkpoint = optarg; break;
        case 'h': cli_usage(stdout, groups); exit(0);
        default: usage_error("unknown option, or an option without its value: '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc) usage_error("unexpected argument '%s'", argv[optind]);
    if (!cli_name_in_list(o->dataset, dataset_names())) usage_error("unknown dataset '%s'", o->dataset);
    if (o->model && !cli_name_in_list(o->model, model_names())) usage_error("unknown model '%s'", o->model);
    if (!cli_name_in_list(o->device, "auto|cpu|cuda|cuda-emu"))
        usage_error("--device must be auto, cpu or cuda (or cuda-emu), got '%s'", o->device);
    if (!cli_name_in_list(o->backend, "auto|mpi|nccl")) usage_error("--backend must be auto, mpi or nccl, got '%s'", o->backend);
}

void cli_apply_dataset_defaults(TrainOptions *o) {
    bool cifar = strncmp(o->dataset, "cifar", 5) == 0;
    bool fmnist = strcmp(o->dataset, "fashion-mnist") == 0;
    if (!o->model) o->model = cifar ? "resnet9" : fmnist ? "fmnist" : "tiny-bn";
    if (!o->epochs) o->epochs = cifar ? 24 : fmnist ? 8 : 3;
}
