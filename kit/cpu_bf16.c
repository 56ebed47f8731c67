// kit/cpu_bf16.c: bf16 GEMMs on the CPU through oneDNN's matmul primitive (see cpu_bf16.h).
//
// oneDNN compiles a kernel for each problem (shape, strides, data types, post-ops) when its primitive is created,
// which costs far more than a small GEMM. So each thread keeps the primitives it has made, keyed by the problem,
// with their memory objects, and only swaps the data pointers at each call. Per thread, because a primitive's
// scratchpad is handed in by the caller here (scratchpad_mode_user: this thread's buffer) and a stream is not
// shared between threads; oneDNN's own primitive cache makes the second thread's copy of a kernel cheap.
#include "kit/cpu_bf16.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/mem.h"

static _Atomic int g_storage = CPU_BF16_2BYTES;

void cpu_bf16_set_storage(CpuBf16Storage s) { g_storage = (int)s; }
CpuBf16Storage cpu_bf16_storage(void) { return (CpuBf16Storage)g_storage; }
size_t cpu_bf16_elem_bytes(void) { return g_storage == CPU_BF16_IN_FP32 ? 4 : 2; }

// What a thread keeps: its scratch buffers, and (with oneDNN) its stream and primitives. Listed, so exit frees all.
// A training step of ResNet-9 asks for about 60 problems (three GEMMs per layer, a last group of another width);
// the cache holds twice that, so a step never makes a primitive again once warm.
enum { CACHE_SIZE = 128 };

#ifdef KIT_HAVE_DNNL

// One problem's primitive: the key, then what serves it.
typedef struct {
    int dt, ta, tb, m, n, k, lda, ldb, ldc, accumulate;  // the key (dt: dnnl_data_type_t)
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, pad;  // pad: the scratchpad, NULL when it needs none
    size_t pad_bytes;
} Entry;
#endif

typedef struct ThreadState {
    void *scratch[CPU_BF16_SCRATCH_SLOTS];
    size_t scratch_bytes[CPU_BF16_SCRATCH_SLOTS];
#ifdef KIT_HAVE_DNNL
    dnnl_stream_t stream;
    Entry cache[CACHE_SIZE];
    int used, next;  // entries filled; the one to replace when full (round robin)
    void *pad;       // the scratchpad every primitive of this thread shares (one runs at a time)
    size_t pad_bytes;
#endif
    struct ThreadState *next_state;
} ThreadState;

static pthread_mutex_t g_states_lock = PTHREAD_MUTEX_INITIALIZER;
static ThreadState *g_states;
static _Thread_local ThreadState *t_state;

static void states_free(void);

static void buffer_free(void *buf) {
    mem_uncount(buf);
    free(buf);
}

static ThreadState *thread_state(void) {
    if (t_state) return t_state;
    ThreadState *s = CHECK_ALLOC(calloc(1, sizeof *s));
    pthread_mutex_lock(&g_states_lock);
    if (!g_states) atexit(states_free);
    s->next_state = g_states;
    g_states = s;
    pthread_mutex_unlock(&g_states_lock);
    t_state = s;
    return s;
}

// *buf, of *have bytes, grown to at least `bytes` (its contents not kept), 64-byte aligned. Counted in the kit's
// memory (kit/mem.h, `other`): bf16 copies of the GEMM inputs are what this path adds to a step's peak.
static void *buffer_grow(void **buf, size_t *have, size_t bytes) {
    if (bytes > *have) {
        buffer_free(*buf);
        *buf = CHECK_ALLOC(aligned_alloc(64, (bytes + 63) / 64 * 64));
        mem_count(*buf, bytes, MEM_OTHER);
        *have = bytes;
    }
    return *buf;
}

void *cpu_bf16_scratch(int slot, size_t bytes) {
    CHECKF(slot >= 0 && slot < CPU_BF16_SCRATCH_SLOTS, "a scratch slot is 0..CPU_BF16_SCRATCH_SLOTS-1", "slot %d",
           slot);
    ThreadState *s = thread_state();
    return buffer_grow(&s->scratch[slot], &s->scratch_bytes[slot], bytes);
}

#ifndef KIT_HAVE_DNNL

static const char *const NO_DNNL = "this build has no oneDNN (install libdnnl-dev, then rebuild: make deps; make)";

bool cpu_bf16_available(const char **why) {
    if (why) *why = NO_DNNL;
    return false;
}

bool cpu_bf16_kernel_exists(void) { return false; }

bool cpu_bf16_ready(const char **why) {
    if (why) *why = NO_DNNL;
    return false;
}
const char *cpu_bf16_isa(void) { return "none"; }
const char *cpu_bf16_impl(void) { return "none"; }

void cpu_bf16_gemm(bool ta, bool tb, int m, int n, int k, const void *a, int lda, const void *b, int ldb, float beta,
                   float *c, int ldc) {
    die("cpu_bf16_gemm: %s\n", NO_DNNL);
}

#else

static dnnl_engine_t g_engine;
static pthread_once_t g_probe_once = PTHREAD_ONCE_INIT;
static bool g_kernel, g_available;  // oneDNN has a bf16 matmul here; and the CPU multiplies bf16 natively
static char g_why[160], g_impl[64];
static const char *g_isa = "none";

// C (m, n) = op(A) op(B) (+ C), row-major with leading dimensions, as strides: op(A) is (m, k) with A's element
// (i, j) at i * lda + j, or, transposed, at j * lda + i. oneDNN takes any such strides.
static dnnl_status_t matmul_desc(const Entry *e, dnnl_primitive_desc_t *pd) {
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_dims_t a_dims = {e->m, e->k}, b_dims = {e->k, e->n}, c_dims = {e->m, e->n};
    dnnl_dims_t a_str = {e->ta ? 1 : e->lda, e->ta ? e->lda : 1}, b_str = {e->tb ? 1 : e->ldb, e->tb ? e->ldb : 1};
    dnnl_dims_t c_str = {e->ldc, 1};
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, (dnnl_data_type_t)e->dt, a_str));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, (dnnl_data_type_t)e->dt, b_str));
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_str));
    dnnl_matmul_desc_t desc;
    DNNL_CHECK(dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md));
    dnnl_primitive_attr_t attr;
    DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (e->accumulate) {  // beta = 1: oneDNN's "sum" post-op adds what C held
        dnnl_post_ops_t po;
        DNNL_CHECK(dnnl_post_ops_create(&po));
        DNNL_CHECK(dnnl_post_ops_append_sum(po, 1.0f));
        DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
        DNNL_CHECK(dnnl_post_ops_destroy(po));
    }
    dnnl_status_t st = dnnl_primitive_desc_create(pd, &desc, attr, g_engine, NULL);
    DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
    return st;
}

static const char *isa_name(dnnl_cpu_isa_t isa) {
    if ((isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx) return "AMX-BF16";
    if ((isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16) return "AVX512-BF16";
    if ((isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core)
        return "AVX-512 (bf16 converted to float32 in the kernel: no bf16 instructions on this CPU)";
    return "none";
}

// Once: the engine, KIT_CPU_BF16 (cpu_bf16.h), and whether a bf16 matmul exists here (a 16 x 16 x 16 one, which
// oneDNN must plan for).
static void probe(void) {
    DNNL_CHECK(dnnl_engine_create(&g_engine, dnnl_cpu, 0));
    const char *env = getenv("KIT_CPU_BF16");
    if (env && strcmp(env, "0") == 0) {
        snprintf(g_why, sizeof g_why, "switched off (KIT_CPU_BF16=0)");
        return;
    }
    if (env && strcmp(env, "fp32") == 0) {
        cpu_bf16_set_storage(CPU_BF16_IN_FP32);
        g_isa = "float32 containers (KIT_CPU_BF16=fp32: the bf16 path's numerics on oneDNN's float32 matmul, not its "
                "speed)";
        snprintf(g_impl, sizeof g_impl, "stand-in");
        g_kernel = g_available = true;
        return;
    }
    CHECKF(!env || !*env, "KIT_CPU_BF16 is 0 (the CPU's bf16 GEMMs off) or fp32 (the tests' stand-in), or unset",
           "KIT_CPU_BF16=%s", env);
    Entry e = {.dt = dnnl_bf16, .m = 16, .n = 16, .k = 16, .lda = 16, .ldb = 16, .ldc = 16};
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = matmul_desc(&e, &pd);
    const dnnl_version_t *v = dnnl_version();
    if (st == dnnl_unimplemented) {
        snprintf(g_why, sizeof g_why, "oneDNN %d.%d has no bf16 matmul for this CPU (it needs AVX-512 or AMX)",
                 v->major, v->minor);
        return;
    }
    DNNL_CHECK(st);
    const char *impl = "?";
    DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    snprintf(g_impl, sizeof g_impl, "%s", impl);
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    g_isa = isa_name(isa);
    g_kernel = true;
    // AVX-512 without its BF16 extension: oneDNN widens bf16 to float32 inside an fp32 kernel, which buys nothing
    // over the emulation (OpenBLAS's SGEMM on rounded values). Such a CPU has no bf16, and keeps the emulation.
    g_available = (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
    if (!g_available)
        snprintf(g_why, sizeof g_why, "this CPU has AVX-512 but no bf16 instructions (AVX512-BF16, AMX-BF16): "
                 "oneDNN's bf16 matmul would widen to float32 in its kernel, no faster than the emulation");
}

bool cpu_bf16_available(const char **why) {
    pthread_once(&g_probe_once, probe);
    if (!g_available && why) *why = g_why;
    return g_available;
}

bool cpu_bf16_kernel_exists(void) {
    pthread_once(&g_probe_once, probe);
    return g_kernel;
}

bool cpu_bf16_ready(const char **why) {
    if (cpu_bf16_storage() == CPU_BF16_IN_FP32 || cpu_bf16_kernel_exists()) return true;
    if (why) *why = g_why;
    return false;
}

const char *cpu_bf16_isa(void) { return cpu_bf16_kernel_exists() ? g_isa : "none"; }
const char *cpu_bf16_impl(void) { return cpu_bf16_kernel_exists() ? g_impl : "none"; }

static void entry_free(Entry *e) {
    dnnl_primitive_destroy(e->prim);
    dnnl_memory_destroy(e->a);
    dnnl_memory_destroy(e->b);
    dnnl_memory_destroy(e->c);
    if (e->pad) dnnl_memory_destroy(e->pad);
    memset(e, 0, sizeof *e);
}


static bool same_problem(const Entry *a, const Entry *b) {
    return a->dt == b->dt && a->ta == b->ta && a->tb == b->tb && a->m == b->m && a->n == b->n && a->k == b->k &&
           a->lda == b->lda && a->ldb == b->ldb && a->ldc == b->ldc && a->accumulate == b->accumulate;
}

// This thread's primitive for the problem `key`: found, or made (replacing the oldest when the cache is full).
static Entry *entry_for(ThreadState *s, const Entry *key) {
    for (int i = 0; i < s->used; i++)
        if (same_problem(&s->cache[i], key)) return &s->cache[i];
    Entry *e;
    if (s->used < CACHE_SIZE) {
        e = &s->cache[s->used++];
    } else {
        e = &s->cache[s->next];
        s->next = (s->next + 1) % CACHE_SIZE;
        entry_free(e);
    }
    *e = *key;
    dnnl_primitive_desc_t pd;
    DNNL_CHECK(matmul_desc(e, &pd));
    DNNL_CHECK(dnnl_primitive_create(&e->prim, pd));
    const dnnl_query_t mds[3] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md};
    dnnl_memory_t *mems[3] = {&e->a, &e->b, &e->c};
    for (int i = 0; i < 3; i++)
        DNNL_CHECK(dnnl_memory_create(mems[i], dnnl_primitive_desc_query_md(pd, mds[i], 0), g_engine,
                                      DNNL_MEMORY_NONE));
    const dnnl_memory_desc_t *pad_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->pad_bytes = pad_md ? dnnl_memory_desc_get_size(pad_md) : 0;
    if (e->pad_bytes) DNNL_CHECK(dnnl_memory_create(&e->pad, pad_md, g_engine, DNNL_MEMORY_NONE));
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    return e;
}

void cpu_bf16_gemm(bool ta, bool tb, int m, int n, int k, const void *a, int lda, const void *b, int ldb, float beta,
                   float *c, int ldc) {
    CHECKF(beta == 0.0f || beta == 1.0f, "cpu_bf16_gemm: C is overwritten (beta 0) or added to (beta 1)",
           "beta %g", (double)beta);
    if (m == 0 || n == 0) return;
    const bool real = cpu_bf16_storage() == CPU_BF16_2BYTES;
    const char *why = NULL;
    if (!cpu_bf16_ready(&why)) die("cpu_bf16_gemm: %s\n", why);  // also the probe: the engine
    ThreadState *s = thread_state();
    if (!s->stream) DNNL_CHECK(dnnl_stream_create(&s->stream, g_engine, dnnl_stream_default_flags));
    const Entry key = {.dt = real ? dnnl_bf16 : dnnl_f32, .ta = ta, .tb = tb, .m = m, .n = n, .k = k, .lda = lda,
                       .ldb = ldb, .ldc = ldc, .accumulate = beta != 0.0f};
    Entry *e = entry_for(s, &key);
    buffer_grow(&s->pad, &s->pad_bytes, e->pad_bytes);
    // oneDNN takes non-const handles; it only reads the sources.
    DNNL_CHECK(dnnl_memory_set_data_handle(e->a, (void *)(uintptr_t)a));
    DNNL_CHECK(dnnl_memory_set_data_handle(e->b, (void *)(uintptr_t)b));
    DNNL_CHECK(dnnl_memory_set_data_handle(e->c, c));
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    int nargs = 3;
    if (e->pad) {
        DNNL_CHECK(dnnl_memory_set_data_handle(e->pad, s->pad));
        args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, e->pad};
    }
    DNNL_CHECK(dnnl_primitive_execute(e->prim, s->stream, nargs, args));
    DNNL_CHECK(dnnl_stream_wait(s->stream));
}

#endif  // KIT_HAVE_DNNL

// At exit: every thread's primitives, stream and buffers.
static void states_free(void) {
    for (ThreadState *s = g_states, *next; s; s = next) {
        next = s->next_state;
#ifdef KIT_HAVE_DNNL
        for (int i = 0; i < s->used; i++) entry_free(&s->cache[i]);
        if (s->stream) dnnl_stream_destroy(s->stream);
        buffer_free(s->pad);
#endif
        for (int i = 0; i < CPU_BF16_SCRATCH_SLOTS; i++) buffer_free(s->scratch[i]);
        free(s);
    }
    g_states = NULL;
}
