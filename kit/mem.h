// kit/mem.h: the count of the kit's memory, by what it holds (params, grads, optimizer, activations, comm, other).
//
// Every allocation the kit makes for tensors and their work space is counted here: device_alloc_as (kit/device.h)
// for the model's buffers, and the work buffers that live below it (the GPU's 16-bit GEMM inputs, the CPU's bf16
// scratch), which call mem_count themselves. One count for the process, all devices together: lessons 09-11
// print it by part, lesson 10's peak_mib is its peak. It lives below device.h so that every module of the kit's
// lower layers can count what it allocates (kit/README.md, "Layers").
#ifndef KIT_MEM_H
#define KIT_MEM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// The bytes counted are the bytes asked for, not the allocator's rounding. MEM_OTHER: what is not one of the
// named parts (the loader's batches on a GPU, conv's work and the 16-bit copies the GEMMs read there, a lesson's own
// scratch).
typedef enum { MEM_PARAMS, MEM_GRADS, MEM_OPTIM, MEM_ACTS, MEM_COMM, MEM_OTHER, MEM_PARTS } MemPart;
typedef struct {
    size_t live[MEM_PARTS], peak[MEM_PARTS];  // peak[p]: the most part p held at once
    size_t live_total, peak_total;            // peak_total: the most held at once, all parts (<= sum of peaks)
} MemStats;

// p (non-NULL, not counted yet) now holds `bytes` of `part`. Thread-safe: a loader thread may allocate while
// the trainer does.
void mem_count(const void *p, size_t bytes, MemPart part);
// p is about to be freed: its bytes leave the live count. A pointer that was never counted is ignored.
void mem_uncount(const void *p);
// The live bytes and the peak since the start (or since mem_stats_reset_peak).
MemStats mem_stats(void);
// Peaks := live: what follows measures its own peak (one step's, say).
void mem_stats_reset_peak(void);
// "params", "grads", "optimizer", "activations", "comm", "other".
const char *mem_part_name(MemPart p);

#ifdef __cplusplus
}
#endif

#endif  // KIT_MEM_H
