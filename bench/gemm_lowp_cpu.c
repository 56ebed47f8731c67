// bench/gemm_lowp_cpu.c: a real bf16 GEMM on the CPU (oneDNN's matmul: bf16 inputs, fp32 accumulation and
// output) against OpenBLAS sgemm and oneDNN's own fp32 matmul, on the conv-as-GEMM shapes of the kit's
// Fashion-MNIST net and ResNet-9 and a square sweep (bench/gemm_shapes.h).
//
//   build/bench/gemm_lowp_cpu [--set fmnist,resnet9,square] [--images 8] [--max-square 2048]
//                             [--seconds 0.3] [--threads T] [--quick]
//
// Lesson 10 emulates bf16 by rounding fp32 tensors; this measures what the real kernel costs on this CPU. A CPU
// with AVX-512 BF16 (or AMX) multiplies bf16 pairs in hardware at twice the fp32 rate; one without it (AVX2
// only) has oneDNN convert bf16 to fp32 and run an fp32 kernel, or fall back to a reference loop: the
// implementation oneDNN picked is printed for every shape, so the table says which happened.
//
// Timing: per shape, one warm-up call each, then rounds of one call of each kind (the order rotated every
// round, so a burst of other work lands on every kind) until each kind has run --seconds (at least 3 rounds,
// 1 with --quick; a kind slower than 2 s a call stops after its first timed round). Medians are printed; the
// speed ratio is the median of the per-round ratios. Inputs are converted to bf16 before timing (a mixed-
// precision framework stores activations and weights in bf16 already).
//
// Correctness, every shape: the bf16 product against OpenBLAS sgemm of the SAME bf16-rounded inputs. Both sum
// the same exact products (8-bit mantissas: every product fits float32's 24) in float32, so they differ by
// summation order only, at most about 2 K u sum|a||b| (u = 2^-24); the column shows the largest difference
// over sum|a||b| beside K u. This is lesson 10's emulation argument checked against a real bf16 kernel.
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include "bench/gemm_shapes.h"
#include "kit/check.h"
#include "kit/cpu_bf16.h"  // DNNL_CHECK


enum { KIND_SGEMM, KIND_DNNL_F32, KIND_DNNL_BF16, KIND_COUNT };

typedef struct {
    char sets[64];
    int images, max_square, threads;
    double seconds;
    int min_rounds;
} Options;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// float -> bf16 bits, round to nearest even (the inputs here are finite).
static uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

// A oneDNN matmul C (m, n) = A (m, k) @ B (k, n), row-major, inputs of type `in`, fp32 output.
typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
    const char *impl;  // the implementation oneDNN chose ("brg:avx512_core_bf16", "gemm:jit", "ref:any", ...)
} Matmul;

// A CPU without the instructions for `in` may have no implementation at all (oneDNN 2.x has no bf16 matmul on
// AVX2): then mm.prim stays NULL and impl says so; any other refusal is an error.
static Matmul matmul_create(dnnl_engine_t eng, dnnl_data_type_t in, int m, int n, int k, void *a, void *b,
                            float *c) {
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_dims_t a_dims = {m, k}, b_dims = {k, n}, c_dims = {m, n};
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&a_md, 2, a_dims, in, dnnl_ab));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&b_md, 2, b_dims, in, dnnl_ab));
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&c_md, 2, c_dims, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t desc;
    DNNL_CHECK(dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md));
    dnnl_primitive_desc_t pd;
    Matmul mm = {0};
    dnnl_status_t s = dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL);
    if (s == dnnl_unimplemented) {
        mm.impl = "unimplemented on this CPU";
        return mm;
    }
    DNNL_CHECK(s);
    const char *impl = "?";
    DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    // The string belongs to the descriptor, which is destroyed below: the few distinct names are kept.
    static char names[8][64];
    int i = 0;
    while (i < 8 && names[i][0] && strcmp(names[i], impl) != 0) i++;
    CHECK(i < 8, "more than 8 distinct oneDNN implementations: raise the table");
    if (!names[i][0]) snprintf(names[i], sizeof names[i], "%s", impl);
    mm.impl = names[i];
    DNNL_CHECK(dnnl_primitive_create(&mm.prim, pd));
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    DNNL_CHECK(dnnl_memory_create(&mm.a, &a_md, eng, a));
    DNNL_CHECK(dnnl_memory_create(&mm.b, &b_md, eng, b));
    DNNL_CHECK(dnnl_memory_create(&mm.c, &c_md, eng, c));
    return mm;
}

static void matmul_run(const Matmul *mm, dnnl_stream_t st) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, mm->a}, {DNNL_ARG_WEIGHTS, mm->b}, {DNNL_ARG_DST, mm->c}};
    DNNL_CHECK(dnnl_primitive_execute(mm->prim, st, 3, args));
    DNNL_CHECK(dnnl_stream_wait(st));
}

static void matmul_free(Matmul *mm) {
    if (!mm->prim) return;
    dnnl_primitive_destroy(mm->prim);
    dnnl_memory_destroy(mm->a);
    dnnl_memory_destroy(mm->b);
    dnnl_memory_destroy(mm->c);
}

static void sgemm(int m, int n, int k, const float *a, const float *b, float *c) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k, b, n, 0.0f, c, n);
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One shape's buffers: A (m, k), B (k, n) in fp32, their bf16 copies, and C for each kind.
typedef struct {
    int m, n, k;
    float *a, *b, *a_lo, *b_lo;   // fp32 inputs; the same rounded to bf16 (values) for the reference
    uint16_t *a16, *b16;          // bf16 bits for oneDNN
    float *c[KIND_COUNT], *ref;   // outputs; sgemm of the rounded inputs
} Problem;

static float *falloc(size_t n) { return CHECK_ALLOC(malloc(n * sizeof(float))); }

static Problem problem_create(int m, int n, int k, unsigned seed) {
    Problem p = {.m = m, .n = n, .k = k};
    size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
    p.a = falloc(na), p.b = falloc(nb), p.a_lo = falloc(na), p.b_lo = falloc(nb), p.ref = falloc(nc);
    p.a16 = CHECK_ALLOC(malloc(na * sizeof(uint16_t)));
    p.b16 = CHECK_ALLOC(malloc(nb * sizeof(uint16_t)));
    for (int i = 0; i < KIND_COUNT; i++) p.c[i] = falloc(nc);
    srand(seed);
    // Uniform in [-1, 1): a sign mix, so sums cancel as activations times weights do.
    for (size_t i = 0; i < na; i++) p.a[i] = 2.0f * (float)rand() / (float)RAND_MAX - 1.0f;
    for (size_t i = 0; i < nb; i++) p.b[i] = 2.0f * (float)rand() / (float)RAND_MAX - 1.0f;
    for (size_t i = 0; i < na; i++) p.a16[i] = bf16_bits(p.a[i]), p.a_lo[i] = bf16_value(p.a16[i]);
    for (size_t i = 0; i < nb; i++) p.b16[i] = bf16_bits(p.b[i]), p.b_lo[i] = bf16_value(p.b16[i]);
    return p;
}

static void problem_free(Problem *p) {
    free(p->a), free(p->b), free(p->a_lo), free(p->b_lo), free(p->ref), free(p->a16), free(p->b16);
    for (int i = 0; i < KIND_COUNT; i++) free(p->c[i]);
}

// max |bf16 result - sgemm of the rounded inputs| / max sum|a||b| (the scale the order error is bound by),
// and the bf16 result's largest difference from the fp32 product of the unrounded inputs, relative alike.
static void problem_errors(Problem *p, double *order_err, double *rounding_err) {
    size_t na = (size_t)p->m * p->k, nb = (size_t)p->k * p->n, nc = (size_t)p->m * p->n;
    float *abs_a = falloc(na), *abs_b = falloc(nb), *mag = falloc(nc);
    for (size_t i = 0; i < na; i++) abs_a[i] = fabsf(p->a_lo[i]);
    for (size_t i = 0; i < nb; i++) abs_b[i] = fabsf(p->b_lo[i]);
    sgemm(p->m, p->n, p->k, p->a_lo, p->b_lo, p->ref);
    sgemm(p->m, p->n, p->k, abs_a, abs_b, mag);   // (m, n) sum |a||b|
    double scale = 0, d_order = 0, d_round = 0;
    for (size_t i = 0; i < nc; i++) {
        scale = fmax(scale, mag[i]);
        d_order = fmax(d_order, fabs((double)p->c[KIND_DNNL_BF16][i] - p->ref[i]));
        d_round = fmax(d_round, fabs((double)p->c[KIND_DNNL_BF16][i] - p->c[KIND_SGEMM][i]));
    }
    *order_err = scale > 0 ? d_order / scale : 0;
    *rounding_err = scale > 0 ? d_round / scale : 0;
    free(abs_a), free(abs_b), free(mag);
}

// Times the three kinds on one shape; prints its row of the table.
static void bench_shape(const Options *o, dnnl_engine_t eng, dnnl_stream_t st, const GemmShape *s) {
    int m = s->m, k = s->k, n = gemm_shape_n(s, o->images);
    Problem p = problem_create(m, n, k, 1234u);
    Matmul f32 = matmul_create(eng, dnnl_f32, m, n, k, p.a, p.b, p.c[KIND_DNNL_F32]);
    Matmul b16 = matmul_create(eng, dnnl_bf16, m, n, k, p.a16, p.b16, p.c[KIND_DNNL_BF16]);
    enum { MAX_ROUNDS = 1000 };
    static double t[KIND_COUNT][MAX_ROUNDS], ratio[MAX_ROUNDS];
    double spent[KIND_COUNT] = {0};
    bool have[KIND_COUNT] = {true, f32.prim != NULL, b16.prim != NULL};
    int rounds = 0;
    bool slow = false;
    for (int r = -1; r < MAX_ROUNDS; r++) {   // r = -1: the warm-up round, not recorded
        for (int j = 0; j < KIND_COUNT; j++) {
            int kind = (j + (r < 0 ? 0 : r)) % KIND_COUNT;
            if (!have[kind]) continue;
            double t0 = now_s();
            if (kind == KIND_SGEMM) sgemm(m, n, k, p.a, p.b, p.c[KIND_SGEMM]);
            else matmul_run(kind == KIND_DNNL_F32 ? &f32 : &b16, st);
            double dt = now_s() - t0;
            if (r >= 0) t[kind][r] = dt, spent[kind] += dt;
            if (dt > 2.0) slow = true;
        }
        if (r < 0) continue;
        ratio[r] = have[KIND_DNNL_BF16] ? t[KIND_SGEMM][r] / t[KIND_DNNL_BF16][r] : 0;
        rounds = r + 1;
        bool enough = true;
        for (int kind = 0; kind < KIND_COUNT; kind++) enough = enough && (!have[kind] || spent[kind] >= o->seconds);
        if (slow || (enough && rounds >= o->min_rounds)) break;
    }
    char cell[KIND_COUNT][48], speed[24] = "-", errs[64] = "-", round_err[16] = "-";
    double gflop = 2.0 * m * n * (double)k * 1e-9;
    for (int kind = 0; kind < KIND_COUNT; kind++) {
        double ms = have[kind] ? 1e3 * median(t[kind], rounds) : 0;
        if (have[kind]) snprintf(cell[kind], sizeof cell[kind], "%.2f (%.1f)", ms, gflop / ms * 1e3);
        else snprintf(cell[kind], sizeof cell[kind], "none");
    }
    if (have[KIND_DNNL_BF16]) {
        double order_err, rounding_err;
        problem_errors(&p, &order_err, &rounding_err);
        snprintf(speed, sizeof speed, "**%.2fx**", median(ratio, rounds));
        snprintf(errs, sizeof errs, "%.1e (K u %.1e)", order_err, k * 0x1p-24);
        snprintf(round_err, sizeof round_err, "%.1e", rounding_err);
    }
    printf("| %s | %d x %d x %d | %.2f | %s | %s | %s | %s | %s | %s | %d | %s / %s |\n", s->name, m, n, k, gflop,
           cell[KIND_SGEMM], cell[KIND_DNNL_F32], cell[KIND_DNNL_BF16], speed, errs, round_err, rounds, f32.impl,
           b16.impl);
    fflush(stdout);
    matmul_free(&f32), matmul_free(&b16);
    problem_free(&p);
}

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

static void usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--set fmnist,resnet9,square] [--images N] [--max-square N] [--seconds S] "
            "[--threads T] [--quick]\n", argv0);
    exit(2);
}

static Options parse(int argc, char **argv) {
    Options o = {.images = 8, .max_square = 2048, .threads = omp_get_max_threads(), .seconds = 0.3,
                 .min_rounds = 3};
    snprintf(o.sets, sizeof o.sets, "fmnist,resnet9,square");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quick")) {
            o.images = 1, o.max_square = 256, o.seconds = 0.0, o.min_rounds = 1;
            continue;
        }
        if (!v) usage(argv[0]);
        i++;
        if (!strcmp(a, "--set")) snprintf(o.sets, sizeof o.sets, "%s", v);
        else if (!strcmp(a, "--images")) o.images = atoi(v);
        else if (!strcmp(a, "--max-square")) o.max_square = atoi(v);
        else if (!strcmp(a, "--seconds")) o.seconds = atof(v);
        else if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else usage(argv[0]);
    }
    if (o.images < 1 || o.threads < 1 || o.max_square < 1 || o.seconds < 0) usage(argv[0]);
    return o;
}

static bool shape_selected(const Options *o, const GemmShape *s) {
    char sets[64];
    snprintf(sets, sizeof sets, "%s", o->sets);
    if (!s->n_per_image && s->m > o->max_square) return false;
    for (char *save = NULL, *w = strtok_r(sets, ",", &save); w; w = strtok_r(NULL, ",", &save))
        if (gemm_shape_in(s, w)) return true;
    return false;
}

int main(int argc, char **argv) {
    Options o = parse(argc, argv);
    // One pool of threads for both libraries, the same size: OpenBLAS's own, oneDNN's OpenMP.
    openblas_set_num_threads(o.threads);
    omp_set_num_threads(o.threads);
    // oneDNN's default ISA ceiling leaves out the ISAs it lists as "initial support" (dnnl_cpu_isa_all's comment in
    // dnnl_types.h), which in the 2.x releases could include AMX. Raising the ceiling to AMX explicitly, before any
    // kernel is generated, makes AMX usable whichever way this version lists it; a CPU without AMX is unaffected
    // (oneDNN takes the lower of the ceiling and what the CPU has). ONEDNN_MAX_CPU_ISA in the environment wins.
    dnnl_status_t ceiling = getenv("ONEDNN_MAX_CPU_ISA") || getenv("DNNL_MAX_CPU_ISA")
                                ? dnnl_success
                                : dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx512_core_amx);
    if (ceiling != dnnl_success)
        fprintf(stderr, "gemm_lowp_cpu: oneDNN kept its default ISA ceiling (dnnl_set_max_cpu_isa: status %d)\n",
                (int)ceiling);
    dnnl_engine_t eng;
    dnnl_stream_t st;
    DNNL_CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&st, eng, dnnl_stream_default_flags));
    const dnnl_version_t *v = dnnl_version();
    printf("gemm_lowp_cpu: oneDNN %d.%d.%d, effective ISA %s; OpenBLAS core %s; %d thread(s); images per conv "
           "GEMM %d\n\n", v->major, v->minor, v->patch, isa_name(dnnl_get_effective_cpu_isa()),
           openblas_get_corename(), o.threads, o.images);
    printf("| shape | M x N x K | GFLOP | OpenBLAS sgemm ms (GFLOP/s) | oneDNN f32 ms (GFLOP/s) | oneDNN bf16 ms "
           "(GFLOP/s) | bf16 speed / sgemm | bf16 vs sgemm of rounded inputs | bf16 vs fp32 inputs | rounds | "
           "oneDNN impl f32 / bf16 |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (int i = 0; i < GEMM_SHAPE_COUNT; i++)
        if (shape_selected(&o, &GEMM_SHAPES[i])) bench_shape(&o, eng, st, &GEMM_SHAPES[i]);
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return 0;
}
