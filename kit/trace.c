// kit/trace.c: the timeline writer (see trace.h): a buffer of fixed-size events, written out as Chrome's Trace
// Event Format (JSON), one event per line, when full and at trace_close; trace_merge joins the ranks' files.
#include "kit/trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kit/check.h"

// NVTX (header-only, CUDA toolkit): the real CUDA build only; the CPU and emulator builds leave it out.
#if defined(KIT_CUDA) && !defined(KIT_CUDA_EMU) && defined(__has_include)
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define KIT_NVTX 1
#endif
#endif

enum { FLAG_JSON = 1u, FLAG_NVTX = 2u, MAX_THREADS = 32, MAX_OPEN_ASYNC = 256 };

unsigned kit_trace_flags = 0;

typedef struct {
    char ph;                     // 'X' complete, 'b' / 'e' async begin / end, 'i' instant
    uint8_t thread;              // index of the thread's track
    const char *cat;             // a TRACE_* literal
    double ts, dur;              // microseconds, ts on rank 0's clock
    uint64_t id;                 // async spans
    char name[TRACE_NAME_MAX];
} TraceEvent;

typedef struct {
    pthread_mutex_t lock;
    FILE *f;
    char path[4096];             // this rank's file
    int rank, world;
    double offset_us, error_us;
    TraceEvent *ev;              // (cap)
    size_t n, cap, written;      // buffered, capacity, written out so far
    long flushes;
    int n_threads;
    char thread_names[MAX_THREADS][32];
    struct { uint64_t id; const char *cat; char name[TRACE_NAME_MAX]; } open_async[MAX_OPEN_ASYNC];
    uint64_t next_id;
    unsigned generation;         // counts trace_open calls: a thread's index is for the file it was given in
} Tracer;

static Tracer T = {.lock = PTHREAD_MUTEX_INITIALIZER};
static _Thread_local int my_thread = -1;
static _Thread_local unsigned my_generation;
static _Thread_local char pending_name[TRACE_NAME_MAX];

#ifdef KIT_NVTX
// Nsight Systems (and other NVTX tools) announce themselves in the environment before the program starts.
__attribute__((constructor)) static void nvtx_detect(void) {
    if (getenv("NVTX_INJECTION64_PATH")) kit_trace_flags |= FLAG_NVTX;
}
#endif

double trace_clock_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

// The calling thread's track; the first to ask (trace_open's caller) is "main". Call with the lock held.
static int thread_index(void) {
    if (my_thread >= 0 && my_generation == T.generation) return my_thread;
    my_generation = T.generation;
    if (T.n_threads >= MAX_THREADS) return MAX_THREADS - 1;  // shared by the threads past the table
    my_thread = T.n_threads++;
    if (my_thread == 0) snprintf(T.thread_names[0], sizeof T.thread_names[0], "main");
    else snprintf(T.thread_names[my_thread], sizeof T.thread_names[my_thread], "thread %d", my_thread);
    return my_thread;
}

void trace_thread_name(const char *name) {
    pthread_mutex_lock(&T.lock);
    int i = thread_index();
    snprintf(T.thread_names[i], sizeof T.thread_names[i], "%s", name);
    pthread_mutex_unlock(&T.lock);
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static int tid_of(int thread) { return 1000 * T.rank + 1 + thread; }

static void write_event(const TraceEvent *e) {
    FILE *f = T.f;
    fprintf(f, "%s{\"ph\":\"%c\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,", T.written++ ? ",\n" : "", e->ph, T.rank,
            tid_of(e->thread), e->ts);
    if (e->ph == 'X') fprintf(f, "\"dur\":%.3f,", e->dur);
    if (e->ph == 'b' || e->ph == 'e') fprintf(f, "\"id\":\"0x%llx\",", (unsigned long long)e->id);
    if (e->ph == 'i') fprintf(f, "\"s\":\"t\",");
    fprintf(f, "\"cat\":\"%s\",\"name\":", e->cat);
    json_string(f, e->name);
    fputc('}', f);
}

// Writes the buffer out and empties it; shows the time it took as a span. Call with the lock held.
static void flush_locked(void) {
    double t0 = trace_clock_us();
    for (size_t i = 0; i < T.n; i++) write_event(&T.ev[i]);
    T.n = 0;
    T.flushes++;
    TraceEvent *e = &T.ev[T.n++];
    *e = (TraceEvent){.ph = 'X', .thread = (uint8_t)thread_index(), .cat = TRACE_IO, .ts = t0 + T.offset_us};
    e->dur = trace_clock_us() - t0;
    snprintf(e->name, sizeof e->name, "trace flush");
}

// A free slot of the buffer (flushing it first when full). Call with the lock held.
static TraceEvent *event_new(char ph, const char *cat, double ts_local) {
    if (T.n + 1 >= T.cap) flush_locked();  // + 1: the flush's own span
    TraceEvent *e = &T.ev[T.n++];
    *e = (TraceEvent){.ph = ph, .thread = (uint8_t)thread_index(), .cat = cat, .ts = ts_local + T.offset_us};
    return e;
}

void trace_open(const char *path, int rank, int world) {
    CHECK(path && *path, "--trace needs a file name");
    CHECK(rank >= 0 && rank < world, "trace_open: 0 <= rank < world");
    if (kit_trace_flags & FLAG_JSON) trace_close();
    pthread_mutex_lock(&T.lock);
    snprintf(T.path, sizeof T.path, "%s.rank%d.json", path, rank);
    T.f = fopen(T.path, "w");
    if (!T.f) die("--trace: cannot write %s: %s\n  HINT: does its folder exist and is it writable?", T.path,
                  strerror(errno));
    const char *env = getenv("KIT_TRACE_EVENTS");
    long cap = env ? strtol(env, NULL, 10) : TRACE_DEFAULT_EVENTS;
    T.cap = (size_t)(cap >= 16 ? cap : 16);
    T.ev = xmalloc(T.cap * sizeof *T.ev);
    T.n = T.written = 0;
    T.flushes = 0;
    T.rank = rank;
    T.world = world;
    T.offset_us = 0.0;
    T.error_us = -1.0;
    T.next_id = 1;
    T.generation++;
    T.n_threads = 0;
    thread_index();  // the thread that opens the file is "main", whichever thread records first (the loader's may)
    memset(T.open_async, 0, sizeof T.open_async);
    fprintf(T.f, "{\"traceEvents\":[\n");
    kit_trace_flags |= FLAG_JSON;
    pthread_mutex_unlock(&T.lock);
    // A run that ends with exit() before trace_close (an error, a stop on request) still leaves a complete
    // file of what it recorded: the timeline up to the failure is often what explains it.
    static bool at_exit;
    if (!at_exit) at_exit = atexit(trace_close) == 0;
}

void trace_set_clock(double offset_us, double error_us) {
    pthread_mutex_lock(&T.lock);
    T.offset_us = offset_us;
    T.error_us = error_us;
    pthread_mutex_unlock(&T.lock);
}

// Process and thread names, and the clock's offset and error, as metadata events ("M").
static void write_metadata(void) {
    FILE *f = T.f;
    fprintf(f, "%s{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d\"}}",
            T.written++ ? ",\n" : "", T.rank, tid_of(0), T.rank);
    fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}",
            T.rank, tid_of(0), T.rank);
    char label[128];
    if (T.error_us >= 0) snprintf(label, sizeof label, "clock %+.1f us (+- %.1f us) vs rank 0", T.offset_us, T.error_us);
    else snprintf(label, sizeof label, "clock offset not measured");
    fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"process_labels\",\"args\":{\"labels\":\"%s\"}}", T.rank,
            tid_of(0), label);
    for (int i = 0; i < T.n_threads; i++) {
        fprintf(f, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", T.rank,
                tid_of(i));
        json_string(f, T.thread_names[i]);
        fprintf(f, "}}");
    }
}

void trace_close(void) {
    if (!(kit_trace_flags & FLAG_JSON)) return;
    pthread_mutex_lock(&T.lock);
    kit_trace_flags &= ~FLAG_JSON;
    for (size_t i = 0; i < T.n; i++) write_event(&T.ev[i]);
    T.n = 0;
    write_metadata();
    // otherData: what a reader needs to judge the timestamps (the merged file keeps rank 0's and lists all).
    fprintf(T.f, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"rank\":%d,\"world\":%d,\"clock\":\"CLOCK_MONOTONIC us, "
            "aligned to rank 0\",\"clock_offset_us\":%.3f,\"clock_error_us\":%.3f,\"flushes\":%ld}}\n",
            T.rank, T.world, T.offset_us, T.error_us, T.flushes);
    if (fclose(T.f) != 0) fprintf(stderr, "warning: --trace: writing %s failed: %s\n", T.path, strerror(errno));
    T.f = NULL;
    free(T.ev);
    T.ev = NULL;
    pthread_mutex_unlock(&T.lock);
}

// ---------------------------------------------------------------- events

double trace_begin_(const char *name) {
#ifdef KIT_NVTX
    if (kit_trace_flags & FLAG_NVTX) nvtxRangePushA(name);
#else
    (void)name;
#endif
    return (kit_trace_flags & FLAG_JSON) ? trace_clock_us() : 0.0;
}

static void complete_locked(double t0, double t1, const char *cat, const char *name) {
    TraceEvent *e = event_new('X', cat, t0);
    e->dur = t1 - t0;
    snprintf(e->name, sizeof e->name, "%s", name);
}

void trace_end_(double t0, const char *cat, const char *name) {
#ifdef KIT_NVTX
    if (kit_trace_flags & FLAG_NVTX) nvtxRangePop();
#endif
    // t0 == 0: the span began before tracing was on (nothing to pair it with).
    if (!(kit_trace_flags & FLAG_JSON) || t0 == 0.0) return;
    double t1 = trace_clock_us();
    pthread_mutex_lock(&T.lock);
    complete_locked(t0, t1, cat, name);
    pthread_mutex_unlock(&T.lock);
}

void trace_endf_(double t0, const char *cat, const char *fmt, ...) {
    char name[TRACE_NAME_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    trace_end_(t0, cat, name);
}

void trace_complete_at(double start_us, double dur_us, const char *cat, const char *name) {
    if (!(kit_trace_flags & FLAG_JSON)) return;
    pthread_mutex_lock(&T.lock);
    complete_locked(start_us, start_us + dur_us, cat, name);
    pthread_mutex_unlock(&T.lock);
}

static uint64_t async_begin_locked(const char *cat, const char *name) {
    double now = trace_clock_us();
    uint64_t id = T.next_id++;
    TraceEvent *e = event_new('b', cat, now);
    e->id = id;
    snprintf(e->name, sizeof e->name, "%s", name);
    // Remembered for the end (Perfetto pairs "e" with its "b" by id and category); a full table forgets the
    // oldest, whose end is then written without a name.
    int slot = (int)(id % MAX_OPEN_ASYNC);
    T.open_async[slot].id = id;
    T.open_async[slot].cat = cat;
    snprintf(T.open_async[slot].name, sizeof T.open_async[slot].name, "%s", name);
    return id;
}

uint64_t trace_async_begin_(const char *cat, const char *fmt, ...) {
    if (!(kit_trace_flags & FLAG_JSON)) return 0;
    char name[TRACE_NAME_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&T.lock);
    uint64_t id = async_begin_locked(cat, name);
    pthread_mutex_unlock(&T.lock);
    return id;
}

uint64_t trace_async_begin_named(const char *cat, const char *fallback) {
    if (!(kit_trace_flags & FLAG_JSON)) return 0;
    pthread_mutex_lock(&T.lock);
    uint64_t id = async_begin_locked(cat, pending_name[0] ? pending_name : fallback);
    pthread_mutex_unlock(&T.lock);
    pending_name[0] = '\0';
    return id;
}

void trace_name_next_(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pending_name, sizeof pending_name, fmt, ap);
    va_end(ap);
}

void trace_async_end_(uint64_t id) {
    if (!(kit_trace_flags & FLAG_JSON) || id == 0) return;  // 0: begun while tracing was off
    double now = trace_clock_us();
    pthread_mutex_lock(&T.lock);
    int slot = (int)(id % MAX_OPEN_ASYNC);
    bool known = T.open_async[slot].id == id;
    TraceEvent *e = event_new('e', known ? T.open_async[slot].cat : TRACE_COMM, now);
    e->id = id;
    snprintf(e->name, sizeof e->name, "%s", known ? T.open_async[slot].name : "");
    if (known) T.open_async[slot].id = 0;
    pthread_mutex_unlock(&T.lock);
}

void trace_instant_(const char *cat, const char *fmt, ...) {
    char name[TRACE_NAME_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
#ifdef KIT_NVTX
    if (kit_trace_flags & FLAG_NVTX) nvtxMarkA(name);
#endif
    if (!(kit_trace_flags & FLAG_JSON)) return;
    double now = trace_clock_us();
    pthread_mutex_lock(&T.lock);
    TraceEvent *e = event_new('i', cat, now);
    snprintf(e->name, sizeof e->name, "%s", name);
    pthread_mutex_unlock(&T.lock);
}

// ---------------------------------------------------------------- merging the ranks' files

// Copies the event lines of one rank's file (the lines that start with {"ph") to out. Returns their count,
// -1 when the file cannot be read.
static long merge_one(FILE *out, const char *path, long written) {
    FILE *in = fopen(path, "r");
    if (!in) return -1;
    char line[1024];
    long n = 0;
    while (fgets(line, sizeof line, in)) {
        if (strncmp(line, "{\"ph\"", 5) != 0) continue;
        size_t len = strcspn(line, "\n");
        if (len > 0 && line[len - 1] == ',') len--;  // the separator: written again below
        fprintf(out, "%s%.*s", written + n ? ",\n" : "", (int)len, line);
        n++;
    }
    fclose(in);
    return n;
}

long trace_merge(const char *path, int world) {
    char tmp[4200], part[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) {
        fprintf(stderr, "error: --trace: cannot write %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    fprintf(out, "{\"traceEvents\":[\n");
    long total = 0;
    for (int r = 0; r < world; r++) {
        snprintf(part, sizeof part, "%s.rank%d.json", path, r);
        long n = merge_one(out, part, total);
        if (n < 0) {
            fprintf(stderr, "error: --trace: rank %d's file %s is missing: %s\n", r, part, strerror(errno));
            fclose(out);
            remove(tmp);
            return -1;
        }
        total += n;
    }
    fprintf(out, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"world\":%d,\"clock\":\"CLOCK_MONOTONIC us, each rank "
            "aligned to rank 0 by ping-pong (see process_labels)\"}}\n", world);
    if (fclose(out) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, "error: --trace: writing %s failed: %s\n", path, strerror(errno));
        return -1;
    }
    return total;
}

void trace_open_process(const char *path) {
    if (path) trace_open(path, 0, 1);
}

void trace_close_process(const char *path) {
    if (!path) return;
    trace_close();
    long n = trace_merge(path, 1);
    if (n >= 0) printf("trace: %s (%ld events, 1 process): open it at https://ui.perfetto.dev\n", path, n);
}
