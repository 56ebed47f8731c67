// allreduce_bf16.c: the gradient all-reduce with 16-bit messages. What you write is marked TODO:
//
//   TODO 4  (stretch) allreduce_bf16_avg: a ring all-reduce whose messages are bf16, its sums in fp32
//
// The gradient all-reduce moves 2 (W-1)/W x 4 bytes per parameter on every rank's link each step (a ring); in
// bf16 half that. What it costs: every message is rounded to bf16 (8 significant bits: a relative error up to
// 2^-8 per hop). The SUMS are not: each rank adds what it receives to its own fp32 values, so the error is one
// rounding per hop, not one per addition of a 16-bit accumulator.
// PyTorch: from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
//          model.register_comm_hook(state, bf16_compress_hook)
//   (which casts the whole gradient to bf16 and all-reduces in bf16: NCCL then sums in bf16 inside its kernels)
#include <stdlib.h>
#include <string.h>

#include "lesson.h"
#include "kit/check.h"

// ---------------------------------------------------------------- given: messages of bf16

enum { RING_TAG = 1016 };  // one tag: MPI keeps the order of messages between two ranks

// Chunk c of n floats cut into `world` nearly equal chunks: [chunk_start(c), chunk_start(c + 1)).
static size_t chunk_start(size_t n, int world, int c) { return n * (size_t)c / (size_t)world; }

// The floats (4 bytes each: what pg_send carries) that a message of n bf16 values takes: two per float.
static size_t bf16_words(size_t n) { return (n + 1) / 2; }

// x (n floats) rounded to bf16 (YOUR bf16_from_float) and packed two to a 4-byte word: msg (bf16_words(n)).
static void bf16_pack(const float *x, size_t n, float *msg) {
    for (size_t i = 0; i < n; i += 2) {
        uint32_t lo = bf16_from_float(x[i]), hi = i + 1 < n ? bf16_from_float(x[i + 1]) : 0;
        uint32_t word = lo | hi << 16;
        memcpy(&msg[i / 2], &word, sizeof word);
    }
}

// The n bf16 values of msg as floats: added to x (add) or stored into it.
static void bf16_unpack(const float *msg, size_t n, float *x, bool add) {
    for (size_t i = 0; i < n; i++) {
        uint32_t word;
        memcpy(&word, &msg[i / 2], sizeof word);
        float v = bf16_to_float((uint16_t)(i % 2 ? word >> 16 : word & 0xFFFFu));
        x[i] = add ? x[i] + v : v;
    }
}

// The messages of one call: host buffers, and device copies when the process group's messages live on a GPU.
typedef struct {
    ProcessGroup *pg;
    float *out, *in;              // (bf16_words(largest chunk)) host
    float *dev_out, *dev_in;      // the same on the device, or NULL on the CPU
} Ring;

// Sends msg_out (send_words) to rank `to` while receiving recv_words into msg_in from rank `from`. The send is
// started first and waited for last: a ring of blocking sends would wait forever once messages are too large for
// MPI to buffer (every rank sending, none receiving).
static void ring_exchange(Ring *ring, size_t send_words, int to, size_t recv_words, int from) {
    ProcessGroup *pg = ring->pg;
    Device d = pg_device(pg);
    const float *out = ring->out;
    float *in = ring->in;
    if (ring->dev_out) {
        device_copy_to(d, ring->dev_out, ring->out, send_words * sizeof(float));
        out = ring->dev_out, in = ring->dev_in;
    }
    PgSend *s = send_words ? pg_send_start(pg, out, send_words, to, RING_TAG) : NULL;
    if (recv_words) pg_recv(pg, in, recv_words, from, RING_TAG, "a bf16 chunk of the gradient all-reduce");
    if (s) pg_send_wait(pg, s, "a bf16 chunk of the gradient all-reduce");
    if (ring->dev_in) device_copy_from(d, ring->in, ring->dev_in, recv_words * sizeof(float));
}

// ---------------------------------------------------------------- the ring (TODO 4)

// TODO 4 (stretch): the average of buf (n floats in host memory) over the ranks, every message in bf16, every rank left
//   with the same values. Cut buf into W chunks (chunk_start) and run the two halves of a ring all-reduce;
//   rank r sends to r + 1 and receives from r - 1 (mod W) at every step:
//     reduce-scatter, W - 1 steps: at step s send your partial sum of chunk (r - s) mod W (bf16_pack rounds it:
//       one rounding per hop), receive chunk (r - s - 1) mod W and ADD it into your fp32 values (bf16_unpack).
//       After the last step, which chunk holds every rank's contribution?
//     that chunk: divide by W (x / W, as pg_allreduce_avg divides), then round it to bf16 HERE too: the other
//       ranks get it as bf16, and the ranks must be identical, so the owner must not keep more digits than it
//       sends;
//     all-gather, W - 1 steps: send the chunk you completed last (first your own), receive the next one and STORE it.
//   One rank (W == 1): nothing to send; the values are still rounded to bf16 (the same result format).
//   ring_exchange moves one message each way; fill ring.out with bf16_pack first, read ring.in after.
// PyTorch: bf16_compress_hook, or NCCL's ring all-reduce on a bf16 tensor (NCCL sums in the tensor's dtype).
void allreduce_bf16_avg(ProcessGroup *pg, float *buf, size_t n) {
    const int W = pg_world(pg), r = pg_rank(pg);
    Device d = pg_device(pg);
    size_t words = bf16_words((n + (size_t)W - 1) / (size_t)W);  // the largest chunk's message
    Ring ring = {.pg = pg, .out = xmalloc(words * sizeof(float) + 1), .in = xmalloc(words * sizeof(float) + 1)};
    if (d != DEVICE_CPU && W > 1) {
        ring.dev_out = device_alloc_as(d, words * sizeof(float) + 1, MEM_COMM);
        ring.dev_in = device_alloc_as(d, words * sizeof(float) + 1, MEM_COMM);
    }
    const int next = (r + 1) % W, prev = (r + W - 1) % W;
    (void)buf, (void)next, (void)prev, (void)chunk_start;
    (void)bf16_pack, (void)bf16_unpack, (void)ring_exchange;
    if (ring.dev_out) device_free(d, ring.dev_out), device_free(d, ring.dev_in);
    free(ring.out);
    free(ring.in);
}
