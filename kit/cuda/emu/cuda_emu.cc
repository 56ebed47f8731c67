// kit/cuda/emu/cuda_emu.cc: the CUDA emulator (see cuda_emu.h and kit/cuda/README.md).
//
// A launch runs its blocks one after another. The threads of a block are fibers (own stacks) on one host
// thread: they take turns, and a fiber gives the CPU away only at __syncthreads() or when its thread
// finishes. Between two barriers the threads run in a random order, drawn again at every barrier (a
// "phase"). Whoever finishes a turn asks next_turn() for the next one; a fiber whose thread finished runs
// the next thread itself when that one has not started yet, even in the next block, so a kernel without
// barriers needs one fiber and two context switches per launch, not two per thread.
#include "kit/cuda/emu/cuda_emu.h"

#include <cblas.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <stdint.h>
#include <ucontext.h>
#include <unistd.h>

#include <mutex>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define KIT_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KIT_EMU_ASAN 1
#endif
#endif
#ifdef KIT_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
// AddressSanitizer must be told when the stack changes, or it would take a fiber's frames for overflows.
#define ASAN_START_SWITCH(save, bottom, size) __sanitizer_start_switch_fiber(save, bottom, size)
#define ASAN_FINISH_SWITCH(save, bottom, size) __sanitizer_finish_switch_fiber(save, bottom, size)
constexpr size_t kStackBytes = 256 << 10;  // instrumented frames are several times larger
// Leaks are the sanitizer build's business (make SANITIZE=1); here they would only bury a kernel's report
// under the allocations a failed test leaves behind. ASAN_OPTIONS=detect_leaks=1 turns it back on.
// Weak: a test that sets its own options (tests/lesson03) keeps them.
extern "C" __attribute__((weak)) const char *__asan_default_options(void) { return "detect_leaks=0"; }
#else
#define ASAN_START_SWITCH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
#define ASAN_FINISH_SWITCH(save, bottom, size) ((void)(save), (void)(bottom), (void)(size))
constexpr size_t kStackBytes = 64 << 10;
#endif

// The scheduler's own bookkeeping runs between every two turns: it is left uninstrumented (its frames would
// cost more than the kernels it schedules). Kernels, the kit and the tests are instrumented as usual.
#define SCHEDULER_CODE __attribute__((no_sanitize_address))

namespace {

// A mistake the emulator cannot run past (on a GPU it would hang or corrupt memory): say it and stop.
[[noreturn]] __attribute__((format(printf, 1, 2), noinline, cold)) void emu_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda-emu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

// ---------------------------------------------------------------- the running thread's indices

uint3 g_thread_idx, g_block_idx;
dim3 g_block_dim, g_grid_dim;

// ---------------------------------------------------------------- random order

// xorshift64*: small and good enough to shuffle threads. Seeded once per process from KIT_EMU_SEED, else
// from the clock and the pid; the seed is printed once so a failing order can be replayed.
uint64_t g_rng;
void rng_seed_once(void) {
    static std::once_flag once;
    std::call_once(once, [] {
        const char *env = getenv("KIT_EMU_SEED");
        uint64_t seed = env && *env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL) * 1000003u + (uint64_t)getpid();
        g_rng = seed ? seed : 1;
        fprintf(stderr, "cuda-emu: CUDA kernels run in the CPU emulator; thread order seed %llu "
                        "(KIT_EMU_SEED=%llu repeats it)\n", (unsigned long long)seed, (unsigned long long)seed);
    });
}
uint64_t rng_next(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545F4914F6CDD1Dull;
}
uint64_t gcd(uint64_t a, uint64_t b) {
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

// ---------------------------------------------------------------- context switches

#if defined(__x86_64__)
// x86-64: push the callee-saved registers, swap stack pointers, pop the other side's. Unlike swapcontext
// it makes no system call (it leaves the signal mask alone), and switches are most of the emulator's time
// in kernels with barriers.
extern "C" void kit_emu_swap(void **save_sp, void *load_sp);
asm(".text\n"
    ".globl kit_emu_swap\n"
    ".type kit_emu_swap, @function\n"
    "kit_emu_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size kit_emu_swap, .-kit_emu_swap\n");

struct Context {
    void *sp;
};

// A fresh stack that "returns" into entry, with rsp as right after a call (8 mod 16) and zeroed registers
// (rbp = 0 ends backtraces there).
void context_make(Context *c, char *stack, size_t size, void (*entry)(void)) {
    void **sp = (void **)((((uintptr_t)(stack + size)) & ~(uintptr_t)15) - 8);
    *--sp = (void *)entry;
    for (int i = 0; i < 6; i++) *--sp = nullptr;
    c->sp = sp;
}

void context_swap(Context *from, Context *to) { kit_emu_swap(&from->sp, to->sp); }
#else
// Elsewhere: ucontext. getcontext/setcontext rather than swapcontext: AddressSanitizer warns about every
// program that calls swapcontext, and the fiber annotations in switch_context are what it needs.
struct Context {
    ucontext_t uc;
};

void context_make(Context *c, char *stack, size_t size, void (*entry)(void)) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    makecontext(&c->uc, entry, 0);
}

void context_swap(Context *from, Context *to) {
    volatile bool returning = false;
    getcontext(&from->uc);
    if (!returning) {
        returning = true;
        setcontext(&to->uc);
    }
}
#endif

// ---------------------------------------------------------------- fibers

struct Fiber;
enum ThreadState { NOT_STARTED, RUNNING, AT_BARRIER, FINISHED };
struct Thread {
    uint3 idx;
    ThreadState state;
    Fiber *fiber;  // the fiber it runs on, once started
};
struct Fiber {
    Context ctx;
    char *stack;  // kStackBytes, above one guard page
    Thread *thread;
    void *asan_fake;
};

// Fibers are kept per host thread (lesson 02 launches from several) and reused by every launch.
struct FiberPool {
    std::vector<Fiber *> all, idle;
    Context scheduler;  // the host thread's own context while a fiber runs
    const void *scheduler_stack = nullptr;
    size_t scheduler_stack_size = 0;
    void *asan_fake = nullptr;
    ~FiberPool() {
        for (Fiber *f : all) {
            munmap(f->stack - getpagesize(), kStackBytes + getpagesize());
            delete f;
        }
    }
};
thread_local FiberPool t_pool;

// The one launch running (launches never overlap: g_launch_lock), and the fiber running in it.
struct Launch {
    const char *name;
    void (*body)(void *);
    void *ctx;
    uint64_t blocks, block, a, c;    // block i of the launch is (a i + c) mod blocks: a random order
    Thread threads[1024];            // the block's threads (at most 1024), set up once per launch
    Thread *order[1024];             // this phase's turn order: the threads still running
    size_t nthreads, norder;
    size_t next;                     // the next turn in `order`
    Thread *handed_back;             // a turn a fiber could not take itself (its thread waits at a barrier)
    bool over;                       // every block done
};
std::mutex g_launch_lock;
Launch g_launch;
Fiber *g_running;

SCHEDULER_CODE void shuffle(Thread **v, size_t n) {
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(((rng_next() >> 32) * i) >> 32);  // uniform enough in [0, i), without a division
        Thread *t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

// Starts the next block; false when there is none.
SCHEDULER_CODE bool begin_block(Launch &L) {
    if (L.block == L.blocks) return false;
    uint64_t b = L.blocks > (1ull << 32) ? L.block : (L.a * L.block + L.c) % L.blocks;  // (a i) fits in 64 bits
    L.block++;
    const dim3 &g = g_grid_dim;
    g_block_idx = uint3{(unsigned)(b % g.x), (unsigned)(b / g.x % g.y), (unsigned)(b / g.x / g.y)};
    for (size_t i = 0; i < L.nthreads; i++) {
        L.threads[i].state = NOT_STARTED;
        L.threads[i].fiber = nullptr;
        L.order[i] = &L.threads[i];
    }
    L.norder = L.nthreads;
    shuffle(L.order, L.norder);
    L.next = 0;
    return true;
}

// Ends a phase: when threads wait at a barrier, every thread still running must be among them (the others
// have returned), and the next phase gives them their turns in a new order. False when the block is done.
SCHEDULER_CODE bool next_phase(Launch &L) {
    size_t waiting = 0;
    for (size_t i = 0; i < L.norder; i++)
        if (L.order[i]->state == AT_BARRIER) L.order[waiting++] = L.order[i];  // keeps only those
    if (waiting == 0) return false;
    if (waiting < L.norder)
        emu_die("kernel %s, block (%u, %u, %u): __syncthreads() was reached by %zu of the %zu threads still "
                "running: every thread of a block must reach the same barrier (on a GPU this hangs or "
                "corrupts data)", L.name, g_block_idx.x, g_block_idx.y, g_block_idx.z, waiting, L.norder);
    L.norder = waiting;
    shuffle(L.order, L.norder);
    L.next = 0;
    return true;
}

// The thread whose turn it is, moving on to the next phase or block as needed; null at the end.
SCHEDULER_CODE Thread *next_turn(void) {
    Launch &L = g_launch;
    for (;;) {
        if (L.next < L.norder) return L.order[L.next++];
        if (!next_phase(L) && !begin_block(L)) {
            L.over = true;
            return nullptr;
        }
    }
}

// Saves the current context in `from` and continues `to`; returns when something continues `from` again.
// AddressSanitizer is told about every change of stack, or it would take a fiber's frames for overflows.
void switch_context(Context *from, Context *to, const void *to_stack, size_t to_size, void **fake) {
    ASAN_START_SWITCH(fake, to_stack, to_size);
    context_swap(from, to);
    ASAN_FINISH_SWITCH(*fake, nullptr, nullptr);
}

void to_scheduler(Fiber *self) {
    switch_context(&self->ctx, &t_pool.scheduler, t_pool.scheduler_stack, t_pool.scheduler_stack_size,
                   &self->asan_fake);
}

void fiber_main(void) {
    ASAN_FINISH_SWITCH(nullptr, &t_pool.scheduler_stack, &t_pool.scheduler_stack_size);
    Fiber *self = g_running;
    for (;;) {
        Thread *t = self->thread;
        g_thread_idx = t->idx;
        g_launch.body(g_launch.ctx);  // returns when the thread is done; barriers switch away inside
        t->state = FINISHED;
        t->fiber = nullptr;
        Thread *n = next_turn();
        if (n && n->state == NOT_STARTED) {  // run it here: no switch needed
            n->state = RUNNING;
            n->fiber = self;
            self->thread = n;
            continue;
        }
        g_launch.handed_back = n;  // a thread waiting at a barrier, on its own fiber (or null: the end)
        self->thread = nullptr;
        t_pool.idle.push_back(self);
        to_scheduler(self);
    }
}

Fiber *fiber_get(void) {
    if (!t_pool.idle.empty()) {
        Fiber *f = t_pool.idle.back();
        t_pool.idle.pop_back();
        return f;
    }
    Fiber *f = new Fiber();
    size_t page = (size_t)getpagesize();
    char *mem = (char *)mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) emu_die("kernel %s: cannot map a fiber stack of %zu KiB", g_launch.name, kStackBytes >> 10);
    mprotect(mem, page, PROT_NONE);  // a kernel that overflows its stack stops here
    f->stack = mem + page;
    context_make(&f->ctx, f->stack, kStackBytes, fiber_main);
    t_pool.all.push_back(f);
    return f;
}

// Gives thread t its turn, on a fiber: it runs until its next barrier or its end (and maybe runs others).
void run_turn(Thread *t) {
    if (t->state == NOT_STARTED) {
        t->fiber = fiber_get();
        t->fiber->thread = t;
    } else {
        g_thread_idx = t->idx;  // back from a barrier: the fiber reads its own indices again
    }
    t->state = RUNNING;
    g_running = t->fiber;
    switch_context(&t_pool.scheduler, &t->fiber->ctx, t->fiber->stack, kStackBytes, &t_pool.asan_fake);
    g_running = nullptr;
}

// Runs every block of the launch set up in g_launch.
void run_launch(void) {
    Launch &L = g_launch;
    L.nthreads = 0;
    for (unsigned z = 0; z < g_block_dim.z; z++)
        for (unsigned y = 0; y < g_block_dim.y; y++)
            for (unsigned x = 0; x < g_block_dim.x; x++) L.threads[L.nthreads++] = Thread{uint3{x, y, z}, NOT_STARTED, nullptr};
    L.norder = 0;
    L.next = 0;
    L.block = 0;
    L.over = false;
    L.handed_back = nullptr;
    while (!L.over) {
        Thread *t = L.handed_back ? L.handed_back : next_turn();
        L.handed_back = nullptr;
        if (t) run_turn(t);
    }
}

// ---------------------------------------------------------------- runtime state

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_device = 0;

cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) t_last_error = e;
    return e;
}

int emulated_gpus(void) {
    const char *env = getenv("KIT_EMU_GPUS");
    int n = env && *env ? atoi(env) : 1;
    return n >= 1 && n <= 64 ? n : 1;
}

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

}  // namespace

const uint3 &threadIdx = g_thread_idx;
const uint3 &blockIdx = g_block_idx;
const dim3 &blockDim = g_block_dim;
const dim3 &gridDim = g_grid_dim;

// ---------------------------------------------------------------- lazy streams
// A stream created with cudaStreamNonBlocking is LAZY: copies, memsets and event records queued on it run as
// late as CUDA allows, i.e. only when something must see them (cudaStreamSynchronize, cudaEventSynchronize or
// cudaEventQuery on an event behind them, cudaStreamWaitEvent, cudaDeviceSynchronize, a kernel or SGEMM
// queued behind them on the same stream). A program that reads a buffer before waiting for the event of the
// copy into it then reads the old contents, every time, instead of working by luck as it does on a GPU
// when the copy happens to be quick. Nothing else waits for a lazy stream: the legacy default stream (the
// synchronous cudaMemcpy and cudaMemset) does not, exactly as CUDA says of non-blocking streams.
// Everything else (the null stream, streams with default flags, every kernel) runs when it is called.
// One lock for the queues: the kit's loader queues copies from its own thread.
struct EmuOp {
    enum Kind { COPY, SET, RECORD, WAIT } kind;
    unsigned long seq;       // position in its stream
    void *dst;
    const void *src;         // COPY: the source; for a pageable source, `staged` holds its bytes
    std::vector<unsigned char> staged;
    size_t bytes;
    int value;               // SET
    cudaEvent_t event;       // RECORD (nullptr once the event is destroyed)
    unsigned long wait_stream, wait_seq;  // WAIT: run that stream up to that op first
};

struct KitEmuStream {
    unsigned flags;
    unsigned long id;        // never reused, unlike the address, so a WAIT can outlive the stream it names
    unsigned long next_seq;
    std::vector<EmuOp> queue;  // in order, not yet run
};
struct KitEmuEvent {
    double ms;               // host time when last completed, for cudaEventElapsedTime
    unsigned long stream, seq;  // the pending record (stream id, op), stream 0 when complete
};
struct KitEmuBlas {
    cudaStream_t stream;
    cublasMath_t math;  // CUBLAS_TF32_TENSOR_OP_MATH: float32 inputs read as TF32
};

namespace {

std::recursive_mutex g_stream_lock;
std::vector<KitEmuStream *> g_lazy_streams;  // every live lazy stream
unsigned long g_next_stream_id = 1;
std::vector<std::pair<const char *, size_t>> g_pinned;  // cudaMallocHost ranges

bool is_lazy(cudaStream_t s) { return s && (s->flags & cudaStreamNonBlocking); }

KitEmuStream *lazy_stream_by_id(unsigned long id) {
    for (KitEmuStream *s : g_lazy_streams)
        if (s->id == id) return s;
    return nullptr;  // destroyed: it ran everything it had first
}

bool is_pinned(const void *p) {
    const char *c = (const char *)p;
    for (auto &r : g_pinned)
        if (c >= r.first && c < r.first + r.second) return true;
    return false;
}

void run_stream_until(KitEmuStream *s, unsigned long seq);

void run_op(EmuOp &op) {
    switch (op.kind) {
    case EmuOp::COPY: memcpy(op.dst, op.staged.empty() ? op.src : op.staged.data(), op.bytes); break;
    case EmuOp::SET: memset(op.dst, op.value, op.bytes); break;
    case EmuOp::RECORD:
        if (op.event && op.event->seq == op.seq) {  // not re-recorded since: this record completes it
            op.event->ms = now_ms();
            op.event->stream = 0;
        }
        break;
    case EmuOp::WAIT:
        if (KitEmuStream *other = lazy_stream_by_id(op.wait_stream)) run_stream_until(other, op.wait_seq);
        break;
    }
}

// Runs s's queued ops with seq <= `seq`, in order (all of them for ~0ul).
void run_stream_until(KitEmuStream *s, unsigned long seq) {
    std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
    while (!s->queue.empty() && s->queue.front().seq <= seq) {
        EmuOp op = std::move(s->queue.front());
        s->queue.erase(s->queue.begin());
        run_op(op);
    }
}

// The work an event's pending record stands for has to be done now: run its stream up to the record.
void complete_event(cudaEvent_t e) {
    std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
    if (e->stream == 0) return;
    if (KitEmuStream *s = lazy_stream_by_id(e->stream)) run_stream_until(s, e->seq);
    e->stream = 0;
}

void enqueue(cudaStream_t s, EmuOp op) {
    std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
    op.seq = s->next_seq++;
    s->queue.push_back(std::move(op));
}

}  // namespace
void __syncthreads(void) {
    Fiber *self = g_running;
    if (!self) emu_die("__syncthreads() called outside a kernel");
    Thread *t = self->thread;
    t->state = AT_BARRIER;
    to_scheduler(self);
    g_thread_idx = t->idx;
}

extern "C" {

void kit_emu_run(const char *kernel, KitEmuDim grid, KitEmuDim block, size_t shmem, cudaStream_t stream,
                 void (*body)(void *), void *ctx) {
    // Kernels run now, so whatever is queued before this one on a lazy stream must run first.
    if (is_lazy(stream)) run_stream_until(stream, ~0ul);
    // The limits of every GPU since Volta: a launch outside them fails at once, as on a GPU.
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0 ||
        block.x > 1024 || block.y > 1024 || block.z > 64 || threads > 1024 || grid.x > 2147483647u ||
        grid.y > 65535 || grid.z > 65535) {
        set_error(cudaErrorInvalidConfiguration);
        return;
    }
    if (shmem > 48 * 1024) {
        set_error(cudaErrorInvalidValue);
        return;
    }
    std::lock_guard<std::mutex> lock(g_launch_lock);
    rng_seed_once();
    g_launch.name = kernel;
    g_launch.body = body;
    g_launch.ctx = ctx;
    g_grid_dim = dim3(grid.x, grid.y, grid.z);
    g_block_dim = dim3(block.x, block.y, block.z);
    // Blocks in a random order too (a GPU promises none): b -> (a b + c) mod N with a coprime to N visits
    // every block once without a table, even for 2^31 of them.
    Launch &L = g_launch;
    L.blocks = (uint64_t)grid.x * grid.y * grid.z;
    L.a = rng_next() % L.blocks + 1;
    L.c = rng_next() % L.blocks;
    while (gcd(L.a, L.blocks) != 1) L.a++;
    run_launch();
}

// ---------------------------------------------------------------- errors

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoKernelImageForDevice: return "cudaErrorNoKernelImageForDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (grid or block size)";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return cudaGetErrorName(e);
    }
}

cudaError_t cudaGetLastError(void) {
    cudaError_t e = t_last_error;
    t_last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

// ---------------------------------------------------------------- devices

cudaError_t cudaGetDeviceCount(int *count) {
    *count = emulated_gpus();
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = t_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= emulated_gpus()) return set_error(cudaErrorInvalidDevice);
    t_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device < 0 || device >= emulated_gpus()) return set_error(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "cuda-emu %d (the kit's CUDA emulator, on the CPU)", device);
    prop->totalGlobalMem = (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    prop->sharedMemPerBlock = 48 * 1024;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 2147483647;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->multiProcessorCount = 1;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device) {
    if (device < 0 || device >= emulated_gpus()) return set_error(cudaErrorInvalidDevice);
    snprintf(id, (size_t)len, "0000:%02x:00.0", device);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
    for (size_t i = 0; i < g_lazy_streams.size(); i++) run_stream_until(g_lazy_streams[i], ~0ul);
    return cudaSuccess;
}

// ---------------------------------------------------------------- memory

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    // Fresh device memory is not zero on a GPU either: all bits set reads as NaN (floats) or -1 (ints),
    // so a kernel that reads what nobody wrote goes wrong visibly.
    *ptr = malloc(bytes ? bytes : 1);
    if (!*ptr) return set_error(cudaErrorMemoryAllocation);
    memset(*ptr, 0xff, bytes);
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    free(ptr);
    return cudaSuccess;
}

// Pinned memory is remembered: an asynchronous copy reads a pinned source when it runs, a pageable one
// when it is queued (CUDA stages pageable memory through a driver buffer before the call returns).
cudaError_t cudaMallocHost(void **ptr, size_t bytes) {
    *ptr = malloc(bytes ? bytes : 1);
    if (!*ptr) return set_error(cudaErrorMemoryAllocation);
    std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
    g_pinned.push_back({(const char *)*ptr, bytes ? bytes : 1});
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
    {
        std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
        for (size_t i = 0; i < g_pinned.size(); i++)
            if (g_pinned[i].first == ptr) {
                g_pinned.erase(g_pinned.begin() + (long)i);
                break;
            }
    }
    free(ptr);
    return cudaSuccess;
}

// memcpy, not memmove: overlapping copies are undefined in CUDA too, and AddressSanitizer reports them.
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src || kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return set_error(cudaErrorInvalidValue);
    memcpy(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    if (!is_lazy(s) || bytes == 0) return cudaMemcpy(dst, src, bytes, kind);
    if (!dst || !src || kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return set_error(cudaErrorInvalidValue);
    if (kind == cudaMemcpyDeviceToHost && !is_pinned(dst)) {
        // Into pageable memory CUDA returns only when the copy is done.
        run_stream_until(s, ~0ul);
        return cudaMemcpy(dst, src, bytes, kind);
    }
    EmuOp op{};
    op.kind = EmuOp::COPY;
    op.dst = dst;
    op.src = src;
    op.bytes = bytes;
    if (kind == cudaMemcpyHostToDevice && !is_pinned(src))
        op.staged.assign((const unsigned char *)src, (const unsigned char *)src + bytes);
    enqueue(s, std::move(op));
    return cudaSuccess;
}

cudaError_t cudaMemset(void *ptr, int value, size_t bytes) {
    if (bytes == 0) return cudaSuccess;
    if (!ptr) return set_error(cudaErrorInvalidValue);
    memset(ptr, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t bytes, cudaStream_t s) {
    if (!is_lazy(s) || bytes == 0) return cudaMemset(ptr, value, bytes);
    if (!ptr) return set_error(cudaErrorInvalidValue);
    EmuOp op{};
    op.kind = EmuOp::SET;
    op.dst = ptr;
    op.value = value;
    op.bytes = bytes;
    enqueue(s, std::move(op));
    return cudaSuccess;
}

// ---------------------------------------------------------------- streams and events (lazy streams: see above)

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
    *s = new KitEmuStream{flags, g_next_stream_id++, 1, {}};
    if (is_lazy(*s)) g_lazy_streams.push_back(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
// CUDA lets the queued work finish after the stream is destroyed; here it runs first.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return set_error(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
    if (is_lazy(s)) {
        run_stream_until(s, ~0ul);
        for (size_t i = 0; i < g_lazy_streams.size(); i++)
            if (g_lazy_streams[i] == s) g_lazy_streams.erase(g_lazy_streams.begin() + (long)i);
    }
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (is_lazy(s)) run_stream_until(s, ~0ul);
    return cudaSuccess;
}
// s waits for the event's record as it stands NOW (a later cudaEventRecord does not move the wait).
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)flags;
    if (!e) return set_error(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
    if (e->stream == 0) return cudaSuccess;  // nothing pending: no wait
    if (!is_lazy(s)) {
        complete_event(e);  // s runs its next op now, so the awaited work runs now
        return cudaSuccess;
    }
    EmuOp op{};
    op.kind = EmuOp::WAIT;
    op.wait_stream = e->stream;
    op.wait_seq = e->seq;
    enqueue(s, std::move(op));
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    (void)flags;
    *e = new KitEmuEvent{now_ms(), 0, 0};
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return set_error(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
    for (KitEmuStream *s : g_lazy_streams)  // a pending record completes nothing once the event is gone
        for (EmuOp &op : s->queue)
            if (op.kind == EmuOp::RECORD && op.event == e) op.event = nullptr;
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return set_error(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lock(g_stream_lock);
    if (!is_lazy(s)) {
        e->ms = now_ms();
        e->stream = 0;
        return cudaSuccess;
    }
    EmuOp op{};
    op.kind = EmuOp::RECORD;
    op.event = e;
    enqueue(s, std::move(op));
    e->stream = s->id;
    e->seq = s->queue.back().seq;
    return cudaSuccess;
}
// A GPU finishes queued work on its own; the emulator does it when asked, so a query completes the event
// (a polling loop ends, as it would on a GPU).
cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e) return set_error(cudaErrorInvalidValue);
    complete_event(e);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return cudaEventQuery(e); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!start || !end) return set_error(cudaErrorInvalidValue);
    complete_event(start);
    complete_event(end);
    *ms = (float)(end->ms - start->ms);
    return cudaSuccess;
}

// ---------------------------------------------------------------- cuBLAS

cublasStatus_t cublasCreate(cublasHandle_t *handle) {
    *handle = new KitEmuBlas{nullptr, CUBLAS_DEFAULT_MATH};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t s) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (mode != CUBLAS_DEFAULT_MATH && mode != CUBLAS_PEDANTIC_MATH && mode != CUBLAS_TF32_TENSOR_OP_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

namespace {

// How a tensor core reads its inputs. The products of two such inputs are exact in float32 (at most 11 + 11
// significant bits against float32's 24), so after this reading the GEMM is an ordinary float32 GEMM, which is
// what OpenBLAS computes (in its own summation order; see kit/cuda/README.md for what that leaves out).
//   bf16: float32's top 16 bits, widened exactly (the low 16 bits 0).
//   fp16: IEEE binary16 (5 exponent bits, bias 15; 10 mantissa bits; subnormals, inf, NaN), widened exactly.
//   TF32: a float32 of which the tensor core reads only the sign, the exponent and the TOP 10 mantissa bits:
//         the low 13 bits are dropped (truncation toward zero), not rounded. Source: PyTorch's numerical
//         accuracy notes ("only the first 10 bits of the input mantissa are read", docs/source/notes/
//         numerical_accuracy.rst, pytorch/pytorch#79537). A kernel may round before the tensor core instead
//         (PTX cvt.rna.tf32.f32, nearest, ties away); that is within one TF32 unit of this, which is what the
//         tests' GPU bound allows for (tests/test_cuda.c, tf32). NaN and inf stay as they are.
static float emu_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
static float emu_fp16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, u;
    if (e == 0x1Fu) u = sign | 0x7F800000u | (mant << 13);  // inf, NaN (payload kept)
    else if (e != 0) u = sign | ((e + 112u) << 23) | (mant << 13);  // normal: rebias 15 -> 127
    else if (mant == 0) u = sign;
    else {  // subnormal: mant x 2^-24, exact in float32
        float x = ldexpf((float)mant, -24);
        memcpy(&u, &x, sizeof u);
        u |= sign;
    }
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
static float emu_tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7F800000u) != 0x7F800000u) u &= 0xFFFFE000u;  // finite: drop the low 13 mantissa bits
    memcpy(&x, &u, sizeof x);
    return x;
}

// op(X) is (rows x cols) as stored: rows with leading dimension ld, column-major. Returns its elements read
// as the tensor core reads them, packed with leading dimension `rows` (only what the GEMM reads is touched,
// so a short last column is not read past its end).
static std::vector<float> emu_read(const void *X, cudaDataType type, bool tf32, int rows, int cols, int ld) {
    std::vector<float> out((size_t)rows * cols);
    for (int j = 0; j < cols; j++)
        for (int i = 0; i < rows; i++) {
            size_t at = (size_t)j * ld + i;
            float v = type == CUDA_R_16BF  ? emu_bf16(((const uint16_t *)X)[at])
                      : type == CUDA_R_16F ? emu_fp16(((const uint16_t *)X)[at])
                                           : ((const float *)X)[at];
            out[(size_t)j * rows + i] = tf32 ? emu_tf32(v) : v;
        }
    return out;
}

// cuBLAS's own checks: op(A) is m x k, op(B) is k x n, C is m x n, all column-major, so a leading dimension
// is at least the number of ROWS of the matrix as stored.
bool emu_gemm_args_ok(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, int lda, int ldb,
                      int ldc) {
    int rows_a = transa == CUBLAS_OP_N ? m : k, rows_b = transb == CUBLAS_OP_N ? k : n;
    return m >= 0 && n >= 0 && k >= 0 && lda >= (rows_a > 1 ? rows_a : 1) && ldb >= (rows_b > 1 ? rows_b : 1) &&
           ldc >= (m > 1 ? m : 1);
}

// The GEMM itself, after the checks: C (m x n) = alpha op(A) op(B) + beta C, A and B read as `type` (TF32 when
// tf32). Plain float32 goes to OpenBLAS as it is, so cublasSgemm keeps its bits.
void emu_gemm(cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, float alpha, const void *A,
              int lda, const void *B, int ldb, cudaDataType type, bool tf32, float beta, float *C, int ldc) {
    CBLAS_TRANSPOSE ta = transa == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    CBLAS_TRANSPOSE tb = transb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
    if (type == CUDA_R_32F && !tf32) {
        cblas_sgemm(CblasColMajor, ta, tb, m, n, k, alpha, (const float *)A, lda, (const float *)B, ldb, beta, C, ldc);
        return;
    }
    int rows_a = transa == CUBLAS_OP_N ? m : k, cols_a = transa == CUBLAS_OP_N ? k : m;
    int rows_b = transb == CUBLAS_OP_N ? k : n, cols_b = transb == CUBLAS_OP_N ? n : k;
    std::vector<float> a = emu_read(A, type, tf32, rows_a, cols_a, lda);
    std::vector<float> b = emu_read(B, type, tf32, rows_b, cols_b, ldb);
    cblas_sgemm(CblasColMajor, ta, tb, m, n, k, alpha, a.data(), rows_a > 1 ? rows_a : 1, b.data(),
                rows_b > 1 ? rows_b : 1, beta, C, ldc);
}

}  // namespace

// For the emulated cuDNN (cudnn_emu.cc): one element read as a tensor core reads it, the TF32 reading, and
// running a lazy stream's queue before a library call that runs at once.
float kit_emu_widen(cudaDataType type, const void *p, size_t i) {
    return type == CUDA_R_16BF  ? emu_bf16(((const uint16_t *)p)[i])
           : type == CUDA_R_16F ? emu_fp16(((const uint16_t *)p)[i])
                                : ((const float *)p)[i];
}
float kit_emu_tf32(float x) { return emu_tf32(x); }
void kit_emu_stream_flush(cudaStream_t s) {
    if (is_lazy(s)) run_stream_until(s, ~0ul);
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (is_lazy(handle->stream)) run_stream_until(handle->stream, ~0ul);  // it runs now, after its queue
    if (!emu_gemm_args_ok(transa, transb, m, n, k, lda, ldb, ldc) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    emu_gemm(transa, transb, m, n, k, *alpha, A, lda, B, ldb, CUDA_R_32F, handle->math == CUBLAS_TF32_TENSOR_OP_MATH,
             *beta, C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (is_lazy(handle->stream)) run_stream_until(handle->stream, ~0ul);
    // The combinations this emulator computes (cuBLAS supports more; a kit call outside these is a mistake).
    bool known = Atype == CUDA_R_32F || Atype == CUDA_R_16BF || Atype == CUDA_R_16F;
    if (!known || Btype != Atype || Ctype != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 && Atype != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (algo != CUBLAS_GEMM_DEFAULT && algo != CUBLAS_GEMM_DEFAULT_TENSOR_OP) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!emu_gemm_args_ok(transa, transb, m, n, k, lda, ldb, ldc) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    // TF32 on float32 inputs: asked for by the compute type, or allowed by the handle's math mode for
    // CUBLAS_COMPUTE_32F (as cublasSgemm). 16-bit inputs are already exact in TF32.
    bool tf32 = Atype == CUDA_R_32F &&
                (computeType == CUBLAS_COMPUTE_32F_FAST_TF32 || handle->math == CUBLAS_TF32_TENSOR_OP_MATH);
    emu_gemm(transa, transb, m, n, k, *(const float *)alpha, A, lda, B, ldb, Atype, tf32, *(const float *)beta,
             (float *)C, ldc);
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
