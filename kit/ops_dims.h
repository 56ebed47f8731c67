// kit/ops_dims.h: the shapes the operations take and the SyncBN hook type: what the dispatcher (kit/ops.h,
// ops.c) and the per-device implementations (kit/ops_impl.h: ops_cpu.c, winograd.c, kit/cuda/*.cu) share, kept
// below both so that neither needs the other's header.
#ifndef KIT_OPS_DIMS_H
#define KIT_OPS_DIMS_H

#ifdef __cplusplus
extern "C" {
#endif

// conv2d: x (N, C, H, W) * w (K, C, R, R) + b (K) -> y (N, K, P, Q)
typedef struct {
    int n, c, h, w;  // input
    int k, r;        // output channels, square kernel size
    int stride, pad;
} Conv2dDims;

// P and Q: (H + 2*pad - R) / stride + 1 and (W + 2*pad - R) / stride + 1.
static inline int conv2d_out_h(const Conv2dDims *s) { return (s->h + 2 * s->pad - s->r) / s->stride + 1; }
static inline int conv2d_out_w(const Conv2dDims *s) { return (s->w + 2 * s->pad - s->r) / s->stride + 1; }

// batch norm (2-D, per channel)
typedef struct {
    int n, c, hw;      // x is (N, C, HW)
    float eps;         // 1e-5
    float momentum;    // 0.1
} BatchNormDims;

// The hook lesson 05 (SyncBN) fills in: all-reduce (sum) of `count` doubles, in place, on the HOST.
// Forward reduces [sum(x) per channel (C), sum(x*x) per channel (C), element count (1)];
// backward reduces [sum(dy) per channel (C), sum(dy * xhat) per channel (C), element count (1)]
// (the input gradient needs the global count), and only when dx is wanted (not NULL).
// dgamma and dbeta stay LOCAL sums: DDP's gradient all-reduce averages them like every other parameter.
// NULL hook (or a NULL allreduce_sum): statistics of the local batch only (plain BN).
typedef struct {
    void (*allreduce_sum)(double *host_buf, int count, void *ctx);
    void *ctx;
} BatchNormSync;

#ifdef __cplusplus
}
#endif

#endif // KIT_OPS_DIMS_H
