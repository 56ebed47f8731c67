// kit/trace.h: a timeline of the run (--trace FILE), in Chrome's Trace Event Format, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open.
//
//   double t = trace_begin("forward");           // 0 and nothing else when tracing is off
//   model_forward(...);
//   trace_end(t, TRACE_COMPUTE, "forward");       // one complete span ("X") on this thread's track
//
//   uint64_t id = trace_async_begin(TRACE_COMM, "all-reduce bucket %d", b);   // a span that outlives the call
//   ...                                                                      // that started it ("b" ... "e")
//   trace_async_end(id);
//   trace_instant(TRACE_STEP, "skipped step %d", k);                         // a point in time ("i")
//
// One process per rank (pid = rank, named "rank R"), one track per thread (tid = 1000 R + 1 + the thread's
// number here, named by trace_thread_name). Timestamps: CLOCK_MONOTONIC in microseconds plus this rank's clock
// offset against rank 0 (trace_set_clock; kit/dist.h's pg_trace_open measures it), so the ranks' files line up.
//
// Cost. Off: every call is one test of a global flag (the macros below) and returns; no clock read, no
// allocation, no lock. On: a clock read and a mutex-guarded copy into a buffer of TRACE_DEFAULT_EVENTS events
// (KIT_TRACE_EVENTS overrides), allocated once by trace_open. When the buffer is full it is written out to the
// rank's file and reused: memory stays bounded, and the write shows on the timeline as a "trace flush" span
// (its time is the tracer's, not the program's). Nothing is ever dropped.
//
// Files: trace_open(FILE) writes FILE.rankR.json; trace_close ends it; trace_merge (rank 0, after every rank
// closed: pg_trace_close) joins them into FILE. Each event is one line, so the files are easy to read in a
// shell as well as in Perfetto.
//
// NVTX: in the CUDA build (not the emulator), trace_begin/trace_end also push and pop an NVTX range of the
// same name when a tool listens (Nsight Systems sets NVTX_INJECTION64_PATH), so the kit's phases show over
// its kernels in `nsys profile`; with no tool attached they cost nothing more than the flag test.
#ifndef KIT_TRACE_H
#define KIT_TRACE_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The categories (Chrome's "cat"): what a span is, and the colour `make plot-trace` gives it.
#define TRACE_COMPUTE "compute"  // forward, backward, optimizer step
#define TRACE_COMM "comm"        // a collective or a message, from its start to its completion
#define TRACE_WAIT "wait"        // blocked: a barrier, pg_work_wait, a receive
#define TRACE_DATA "data"        // waiting for the loader
#define TRACE_EVAL "eval"        // evaluation
#define TRACE_IO "io"            // checkpoint saves
#define TRACE_STEP "step"        // instants: skipped steps, loss-scale changes

#define TRACE_DEFAULT_EVENTS (1 << 16)  // events held before a flush (about 5 MB)
#define TRACE_NAME_MAX 56               // a name's bytes, with its NUL; longer names are cut

// Bit 0: the JSON timeline is on; bit 1: an NVTX tool listens. 0: every call below returns at once.
extern unsigned kit_trace_flags;

// Starts tracing this rank into FILE.rankR.json (a clear error when it cannot be written). rank < world.
void trace_open(const char *path, int rank, int world);
// This rank's clock against rank 0's: ts written = CLOCK_MONOTONIC (us) + offset_us. error_us: what remains
// uncertain (+- half the best round trip), < 0 when not measured. Recorded in the file's metadata; call it
// before the first event.
void trace_set_clock(double offset_us, double error_us);
// Writes the buffered events, the metadata (process and thread names, the clock) and ends the rank's file.
// Tracing is off afterwards. Nothing happens when it was not open.
void trace_close(void);
// Joins FILE.rank0.json .. FILE.rank{world-1}.json into FILE (one JSON object; the timestamps are already on
// rank 0's clock). Returns the events written, -1 (and a message on stderr) when a rank's file is missing.
long trace_merge(const char *path, int world);
// The timeline of a program that is one process without a process group (lessons 01, 02 and 06): trace_open_process
// is trace_open(path, 0, 1); trace_close_process closes its file, merges it into path (trace_merge) and names the
// file on stdout. A NULL path (no --trace): both do nothing.
void trace_open_process(const char *path);
void trace_close_process(const char *path);
// Names the calling thread's track ("main" for the first thread that records, "thread N" otherwise).
void trace_thread_name(const char *name);
// Gives the next async span this thread begins with a NULL name its name: the caller knows what a collective
// carries ("all-reduce bucket 3"), the process group that starts it does not. Formatted only when on.
#define trace_name_next(...) do { if (kit_trace_flags) trace_name_next_(__VA_ARGS__); } while (0)

// The clock of the timeline, in microseconds (CLOCK_MONOTONIC, without the offset).
double trace_clock_us(void);

// ---------------------------------------------------------------- the calls (macros: the flag test inline)
#define trace_begin(name) (kit_trace_flags ? trace_begin_(name) : 0.0)
#define trace_end(t0, cat, name) do { if (kit_trace_flags) trace_end_((t0), (cat), (name)); } while (0)
// trace_end with a formatted name ("forward micro-batch 3").
#define trace_endf(t0, cat, ...) do { if (kit_trace_flags) trace_endf_((t0), (cat), __VA_ARGS__); } while (0)
// Async spans: the id (0 when off) goes to trace_async_end, on any thread. A NULL format takes trace_name_next's
// name, or `fallback`.
#define trace_async_begin(cat, ...) (kit_trace_flags ? trace_async_begin_((cat), __VA_ARGS__) : (uint64_t)0)
#define trace_async_end(id) do { if (kit_trace_flags) trace_async_end_(id); } while (0)
#define trace_instant(cat, ...) do { if (kit_trace_flags) trace_instant_((cat), __VA_ARGS__); } while (0)

double trace_begin_(const char *name);
void trace_end_(double t0, const char *cat, const char *name);
void trace_endf_(double t0, const char *cat, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
uint64_t trace_async_begin_(const char *cat, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// The same with the pending trace_name_next name, or `fallback` when none is pending.
uint64_t trace_async_begin_named(const char *cat, const char *fallback);
void trace_async_end_(uint64_t id);
void trace_instant_(const char *cat, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void trace_name_next_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// A complete span at given local times (tests, and spans measured elsewhere): ts = start_us + offset.
void trace_complete_at(double start_us, double dur_us, const char *cat, const char *name);

#ifdef __cplusplus
}
#endif

#endif // KIT_TRACE_H
