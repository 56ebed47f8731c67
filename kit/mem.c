// kit/mem.c: the count of the kit's memory by part (see mem.h).
#include "kit/mem.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "kit/check.h"

// mem_uncount (device_free) is given only the pointer, so the counters keep a table of the live allocations (pointer ->
// bytes, part): open addressing with linear probing, at most half full, O(1) on average. One lock guards it:
// a loader thread may allocate while the trainer does.
typedef struct {
    uintptr_t ptr;  // 0: an empty slot
    size_t bytes;
    MemPart part;
} LiveAlloc;

static struct {
    pthread_mutex_t lock;
    LiveAlloc *slots;
    size_t cap, used;  // cap: a power of two (or 0 before the first allocation)
    MemStats st;
} g_mem = {.lock = PTHREAD_MUTEX_INITIALIZER};

static size_t mem_slot_of(uintptr_t p, size_t cap) {
    uint64_t h = (uint64_t)p * 0x9E3779B97F4A7C15ull;  // Fibonacci hashing: device pointers share low bits
    return (size_t)(h >> 17) & (cap - 1);
}

static void mem_table_put(LiveAlloc e);

static void mem_table_grow(void) {
    LiveAlloc *old = g_mem.slots;
    size_t old_cap = g_mem.cap;
    g_mem.cap = old_cap ? 2 * old_cap : 256;
    g_mem.slots = CHECK_ALLOC(calloc(g_mem.cap, sizeof *g_mem.slots));
    g_mem.used = 0;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].ptr) mem_table_put(old[i]);
    free(old);
}

static void mem_table_put(LiveAlloc e) {
    if (2 * (g_mem.used + 1) > g_mem.cap) mem_table_grow();
    size_t i = mem_slot_of(e.ptr, g_mem.cap);
    while (g_mem.slots[i].ptr) i = (i + 1) & (g_mem.cap - 1);
    g_mem.slots[i] = e;
    g_mem.used++;
}

// Removes p's entry into *out; false when p is not in the table. Deletion shifts the following run back so
// that no probe sequence is broken (no tombstones).
static bool mem_table_take(uintptr_t p, LiveAlloc *out) {
    if (!g_mem.cap) return false;
    size_t mask = g_mem.cap - 1, i = mem_slot_of(p, g_mem.cap);
    while (g_mem.slots[i].ptr && g_mem.slots[i].ptr != p) i = (i + 1) & mask;
    if (!g_mem.slots[i].ptr) return false;
    *out = g_mem.slots[i];
    size_t hole = i;
    for (size_t j = (i + 1) & mask; g_mem.slots[j].ptr; j = (j + 1) & mask) {
        size_t home = mem_slot_of(g_mem.slots[j].ptr, g_mem.cap);
        // j's entry may move to the hole only if its home is not inside (hole, j], cyclically.
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (stays) continue;
        g_mem.slots[hole] = g_mem.slots[j];
        hole = j;
    }
    g_mem.slots[hole].ptr = 0;
    g_mem.used--;
    return true;
}

void mem_count(const void *p, size_t bytes, MemPart part) {
    CHECKF((unsigned)part < MEM_PARTS, "the part is one of MemPart (kit/mem.h)", "part %d", (int)part);
    CHECK(p != NULL, "mem_count is given the pointer of a live allocation");  // 0 marks an empty slot
    pthread_mutex_lock(&g_mem.lock);
    mem_table_put((LiveAlloc){(uintptr_t)p, bytes, part});
    MemStats *st = &g_mem.st;
    st->live[part] += bytes;
    st->live_total += bytes;
    if (st->live[part] > st->peak[part]) st->peak[part] = st->live[part];
    if (st->live_total > st->peak_total) st->peak_total = st->live_total;
    pthread_mutex_unlock(&g_mem.lock);
}

void mem_uncount(const void *p) {
    if (!p) return;
    LiveAlloc e;
    pthread_mutex_lock(&g_mem.lock);
    if (mem_table_take((uintptr_t)p, &e)) {  // a pointer the kit did not allocate is simply not counted
        g_mem.st.live[e.part] -= e.bytes;
        g_mem.st.live_total -= e.bytes;
    }
    pthread_mutex_unlock(&g_mem.lock);
}

MemStats mem_stats(void) {
    pthread_mutex_lock(&g_mem.lock);
    MemStats st = g_mem.st;
    pthread_mutex_unlock(&g_mem.lock);
    return st;
}

void mem_stats_reset_peak(void) {
    pthread_mutex_lock(&g_mem.lock);
    for (int p = 0; p < MEM_PARTS; p++) g_mem.st.peak[p] = g_mem.st.live[p];
    g_mem.st.peak_total = g_mem.st.live_total;
    pthread_mutex_unlock(&g_mem.lock);
}

const char *mem_part_name(MemPart p) {
    static const char *const names[MEM_PARTS] = {"params", "grads", "optimizer", "activations", "comm", "other"};
    return (unsigned)p < MEM_PARTS ? names[p] : "?";
}
