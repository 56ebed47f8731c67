// bench/zero_kit.c: lesson 09's memory, bytes and time per step, measured on the kit (the solution's zero.c linked
// in), for bench/zero_bench.py (`make bench-zero`).
//
//   scripts/launch.sh 2 build/bench/zero_kit --model resnet9 --width 16 --batch 8 --zero 3 --steps 3
//
// Options: --model NAME, --width N (0: the model's default), --batch N (LOCAL batch per rank), --zero 0-3,
// --units N (0: the default cut), --recompute, --steps N (timed steps after the first), --seed N.
// Random images and labels (the memory and the bytes do not depend on them; the time barely does).
//
// Step 1 is the measured one for memory and traffic: the counters' peaks are reset to the live bytes just before
// it (what zero_create left: the state the stage keeps between steps), so `peak` is the most each part held at
// once during one step and `live` what it holds after it. Then --steps more steps are timed (rank 0's clock,
// barrier to barrier). Rank 0 prints one JSON line:
//
//   live, peak      per part (params, grads, optimizer, activations, comm, other), bytes, the LARGEST over
//                   the ranks (ranks differ by padding only); peak_total: the largest rank's peak of the sum
//                   (the parts' peaks need not coincide, so it can be below their sum)
//   coll_bytes_per_step, coll_calls_per_step  what step 1 handed to the process group's collectives (pg_traffic:
//                   the input buffers, rank 0), and the ring count of the same calls (Zero.bytes_sent)
//   peak_rss        VmHWM, the largest rank's, after the timed steps (interpreter-free: the whole process)
//   step_s          the timed steps' mean on rank 0; compute_s, comm_s: Zero's split of it (comm_s: the time the
//                   step waited for collectives, i.e. the EXPOSED communication: with the overlap (stages 2-3,
//                   unless KIT_OVERLAP=0) a reduce-scatter's travel during the previous unit's backward is not in it)
//   overlap         1 when stages 2-3 overlap each unit's reduce-scatter with the previous unit's backward
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/device.h"
#include "kit/dist.h"
#include "kit/log.h"
#include "kit/model.h"
#include "lesson.h"

typedef struct {
    const char *model;
    int width, batch, zero, units, steps;
    bool recompute;
    unsigned long seed;
} Opts;

static int int_arg(const char *name, const char *v, int lo, int hi) {
    char *end = NULL;
    long x = v ? strtol(v, &end, 10) : 0;
    CHECKF(v && *end == '\0' && x >= lo && x <= hi, "give the option an integer in its range",
           "%s takes an integer from %d to %d, got '%s'", name, lo, hi, v ? v : "(missing)");
    return (int)x;
}

static Opts opts_parse(int argc, char **argv) {
    Opts o = {.model = "resnet9", .width = 0, .batch = 8, .zero = 0, .units = 0, .steps = 3, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--recompute") == 0) { o.recompute = true; continue; }
        if (strcmp(a, "--model") == 0 && v) o.model = v;
        else if (strcmp(a, "--width") == 0) o.width = int_arg(a, v, 0, 4096);
        else if (strcmp(a, "--batch") == 0) o.batch = int_arg(a, v, 1, 1 << 16);
        else if (strcmp(a, "--zero") == 0) o.zero = int_arg(a, v, 0, 3);
        else if (strcmp(a, "--units") == 0) o.units = int_arg(a, v, 0, ZERO_MAX_UNITS);
        else if (strcmp(a, "--steps") == 0) o.steps = int_arg(a, v, 0, 100000);
        else if (strcmp(a, "--seed") == 0) o.seed = (unsigned long)int_arg(a, v, 0, 1 << 30);
        else CHECKF(false, "options: --model --width --batch --zero --units --recompute --steps --seed",
                    "unknown option or missing value: '%s'", a);
        i++;
    }
    return o;
}

// The input each architecture trains on in the workshop: CIFAR-10's 3x32x32, Fashion-MNIST's 1x28x28.
static ModelConfig config_for(const Opts *o) {
    ModelConfig cfg;
    const bool gray = strcmp(o->model, "fmnist") == 0;
    CHECKF(model_config(&cfg, o->model, o->width, gray ? 1 : 3, gray ? 28 : 32, gray ? 28 : 32, 10),
           "the models are resnet9, fmnist, tiny, tiny-bn", "unknown model '%s'", o->model);
    return cfg;
}

// A batch of random images (roughly the loader's normalised range) and labels, in host memory as a loader gives.
static Batch batch_random(const ModelConfig *cfg, int n, unsigned seed) {
    const size_t per = (size_t)cfg->in_c * cfg->in_h * cfg->in_w;
    Batch b = {.n = n, .x = xmalloc((size_t)n * per * sizeof(float)), .y = xmalloc((size_t)n * sizeof(int))};
    srand(seed);
    for (size_t i = 0; i < (size_t)n * per; i++) b.x[i] = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
    for (int i = 0; i < n; i++) b.y[i] = rand() % cfg->classes;
    return b;
}

// This process's peak resident memory (VmHWM) in bytes: what the OS saw, counters or not; 0 if unreadable.
static double peak_rss_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) kb = atof(line + 6);
    if (f) fclose(f);
    return kb * 1024.0;
}

// Per rank: live[6], peak[6], peak_total, VmHWM; summed into rank 0's table (each rank fills its own row).
enum { COLS = 2 * MEM_PARTS + 2 };

static void print_json(const Opts *o, const Zero *z, const double *t, int W, PgTraffic tr, double ring_bytes,
                       double step_s, double compute_s, double comm_s) {
    printf("{\"model\": \"%s\", \"width\": %d, \"local_batch\": %d, \"units\": %d, \"stage\": %d, \"world\": %d, "
           "\"recompute\": %d, \"overlap\": %d",
           o->model, z->units[0]->cfg.width, o->batch, z->n_units, o->zero, W, o->recompute ? 1 : 0, z->overlap ? 1 : 0);
    const char *kind[2] = {"live", "peak"};
    for (int k = 0; k < 2; k++) {
        printf(", \"%s\": {", kind[k]);
        for (int p = 0; p < MEM_PARTS; p++) {
            double most = 0;
            for (int r = 0; r < W; r++)
                if (t[r * COLS + k * MEM_PARTS + p] > most) most = t[r * COLS + k * MEM_PARTS + p];
            printf("%s\"%s\": %.0f", p ? ", " : "", mem_part_name((MemPart)p), most);
        }
        printf("}");
    }
    double most = 0, rss = 0;
    for (int r = 0; r < W; r++) {
        if (t[r * COLS + 2 * MEM_PARTS] > most) most = t[r * COLS + 2 * MEM_PARTS];
        if (t[r * COLS + 2 * MEM_PARTS + 1] > rss) rss = t[r * COLS + 2 * MEM_PARTS + 1];
    }
    size_t n_params = 0;
    for (int u = 0; u < z->n_units; u++) n_params += z->layout[u].n;
    printf(", \"peak_total\": %.0f, \"peak_rss\": %.0f, \"n_params\": %zu, \"coll_bytes_per_step\": %llu, \"coll_calls_per_step\": %llu, "
           "\"ring_bytes_per_step\": %.0f, \"steps\": %d, \"step_s\": %.6f, \"compute_s\": %.6f, \"comm_s\": %.6f}\n",
           most, rss, n_params, (unsigned long long)tr.coll_bytes_in, (unsigned long long)tr.coll_calls, ring_bytes,
           o->steps, step_s, compute_s, comm_s);
}

int main(int argc, char **argv) {
    ProcessGroup *pg = pg_init(&argc, &argv, "auto", DEVICE_CPU, 120.0);
    Opts o = opts_parse(argc, argv);
    ModelConfig cfg = config_for(&o);
    const int W = pg_world(pg), rank = pg_rank(pg);
    Zero *z = zero_create(pg, &cfg, pg_device(pg), o.batch, o.seed, (ZeroStage)o.zero, o.units, o.recompute);
    Batch b = batch_random(&cfg, o.batch, 1000u + (unsigned)rank);
    SgdConfig opt = {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = false};

    // Step 1: memory and traffic.
    mem_stats_reset_peak();
    PgTraffic t0 = pg_traffic(pg);
    const double ring0 = z->bytes_sent;
    zero_step(z, &b, &opt, 0.0f);
    PgTraffic t1 = pg_traffic(pg);
    const double ring = z->bytes_sent - ring0;
    MemStats s = mem_stats();
    PgTraffic tr = {.coll_bytes_in = t1.coll_bytes_in - t0.coll_bytes_in, .coll_calls = t1.coll_calls - t0.coll_calls};

    // The timed steps, barrier to barrier.
    pg_barrier(pg);
    const double c0 = z->compute_seconds, m0 = z->comm_seconds, start = time_now();
    for (int i = 0; i < o.steps; i++) zero_step(z, &b, &opt, 0.0f);
    pg_barrier(pg);
    const double n = o.steps > 0 ? o.steps : 1;
    const double step_s = (time_now() - start) / n, compute_s = (z->compute_seconds - c0) / n,
                 comm_s = (z->comm_seconds - m0) / n;

    double *t = xcalloc((size_t)W * COLS, sizeof(double));
    for (int p = 0; p < MEM_PARTS; p++) t[rank * COLS + p] = (double)s.live[p], t[rank * COLS + MEM_PARTS + p] = (double)s.peak[p];
    t[rank * COLS + 2 * MEM_PARTS] = (double)s.peak_total;
    t[rank * COLS + 2 * MEM_PARTS + 1] = peak_rss_bytes();
    pg_allreduce_sum_double_host(pg, t, W * COLS);
    if (rank == 0) print_json(&o, z, t, W, tr, ring, step_s, compute_s, comm_s);
    fflush(stdout);
    free(t);
    free(b.x), free(b.y);
    zero_free(z);
    pg_finalize(pg);
    return 0;
}
