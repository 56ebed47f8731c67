// kit/cuda/batchnorm.cu: batch norm over (N, HW) per channel, with the SyncBN hook (see kit/ops.h).
//
// Reductions are two-level and deterministic: a grid of (channel, slice) blocks writes one partial
// sum per block (double), then one thread per channel adds the slices in order. Splitting each channel
// into slices keeps the GPU busy when there are few channels and many pixels (64 channels x 32x32 x 512
// images would be only 64 blocks otherwise). Layout of `work` (as doubles, 8-byte aligned):
//   partials (2, C, S)   per-slice sums
//   stats    (2C + 1)    the reduced sums and the element count: what the sync hook all-reduces
//   coef     (3, C)      floats: per-channel coefficients of the input gradient (backward)
// The per-element formulas are the CPU's (kit/ops_cpu.c), written the same way, so the two devices
// differ only by summation order.
#include <limits.h>
#include <stdint.h>

#include "kit/cuda/cuda_internal.h"
#include "kit/ops_impl.h"

namespace {

// Elements per slice, roughly; more slices than 64 per channel do not pay for their partials.
constexpr size_t kSliceTarget = 8192;
constexpr int kMaxSlices = 64;

int bn_slices(const BatchNormDims *s) {
    size_t per_channel = (size_t)s->n * s->hw;
    size_t sl = (per_channel + kSliceTarget - 1) / kSliceTarget;
    if (sl < 1) sl = 1;
    if (sl > (size_t)kMaxSlices) sl = kMaxSlices;
    return (int)sl;
}

void bn_check(const BatchNormDims *s) {
    CHECK(s->n >= 1 && s->c >= 1 && s->hw >= 1, "batchnorm: n, c and hw must be positive");
    CHECK(s->eps > 0.0f, "batchnorm: eps must be positive (PyTorch's default is 1e-5)");
    // The kernels index one channel's values (N * HW) and one image (C * HW) in 32 bits (cuda_internal.h).
    CHECK((size_t)s->n * s->hw <= INT_MAX && (size_t)s->c * s->hw <= INT_MAX,
          "batchnorm: more than 2^31 values per channel or per image; use a smaller batch or image");
}

size_t bn_work_doubles(const BatchNormDims *s, int slices) {
    return 2 * (size_t)s->c * slices + 2 * (size_t)s->c + 1;
}

struct BnWork {
    double *partials;  // (2, C, S)
    double *stats;     // (2C + 1)
    float *coef;       // (3, C)
    int slices;
};

// `work` comes from the caller as floats; doubles need 8-byte alignment, so round up (the size from
// batchnorm_work_floats_cuda includes the slack).
BnWork bn_work(const BatchNormDims *s, float *work) {
    KIT_CHECK_PTR(work);
    BnWork w;
    w.slices = bn_slices(s);
    uintptr_t p = ((uintptr_t)work + 7) & ~(uintptr_t)7;
    w.partials = (double *)p;
    w.stats = w.partials + 2 * (size_t)s->c * w.slices;
    w.coef = (float *)(w.partials + bn_work_doubles(s, w.slices));
    return w;
}

// The elements of slice `slice` of a channel: flat index j over (N, HW), from j0 to j1 (< 2^31: bn_check).
struct Slice {
    unsigned j0, j1;
};
__device__ inline Slice slice_range(unsigned per_channel, int slices, int slice) {
    unsigned len = (per_channel + slices - 1) / slices;  // once per block
    unsigned j0 = (unsigned)slice * len;
    unsigned j1 = j0 + len < per_channel ? j0 + len : per_channel;
    return Slice{j0 < per_channel ? j0 : per_channel, j1};
}

// Offset of element j (over N, HW) of channel c in an (N, C, HW) tensor; div_hw divides by HW.
__device__ inline size_t bn_index(unsigned j, int c, int channels, int hw, KitDiv div_hw) {
    unsigned n = kit_div(j, div_hw);
    return ((size_t)n * channels + c) * hw + (j - n * (unsigned)hw);
}

// Fused BN + ReLU: the gradient reaching BN's output through the ReLU, what relu_backward adds into a
// zeroed buffer (+0.0f where masked; 0.0f + dy turns a -0.0f into +0.0f, as that addition does), so fused
// and plain agree bit for bit.
__device__ inline float bn_relu_grad(float relu_y, float dy) { return relu_y > 0.0f ? 0.0f + dy : 0.0f; }

// The activations (x, y, relu_y) and their gradients (dy, dx) are stored as T: float, or 16 bits (the *_act16_cuda
// entry points, kit/ops_impl.h), read into float32 and written rounded; statistics and parameter gradients are
// float32.

// grid (C, S): partials[0][c][s] = sum x, partials[1][c][s] = sum x^2 over the slice.
template <typename T>
__global__ void bn_stats_partial_kernel(BatchNormDims s, KitDiv div_hw, int slices, const T *x,
                                        double *partials) {
    __shared__ double shared[KIT_BLOCK];
    int c = blockIdx.x, sl = blockIdx.y;
    Slice r = slice_range((unsigned)s.n * (unsigned)s.hw, slices, sl);
    double sum = 0.0, sq = 0.0;
    for (unsigned j = r.j0 + threadIdx.x; j < r.j1; j += blockDim.x) {
        double v = kit_load(x[bn_index(j, c, s.c, s.hw, div_hw)]);
        sum += v;
        sq += v * v;
    }
    sum = kit_block_sum(sum, shared);
    sq = kit_block_sum(sq, shared);
    if (threadIdx.x == 0) {
        partials[(size_t)c * slices + sl] = sum;
        partials[((size_t)s.c + c) * slices + sl] = sq;
    }
}

// grid (C, S): partials[0] = sum dy, partials[1] = sum dy * (x - mean) (times invstd in bn_reduce).
// relu_y != NULL (fused BN + ReLU): dy is the ReLU's output gradient, masked on the fly (bn_relu_grad).
template <typename T>
__global__ void bn_grad_partial_kernel(BatchNormDims s, KitDiv div_hw, int slices, const T *x,
                                       const float *mean, const T *dy, const T *relu_y,
                                       double *partials) {
    __shared__ double shared[KIT_BLOCK];
    int c = blockIdx.x, sl = blockIdx.y;
    Slice r = slice_range((unsigned)s.n * (unsigned)s.hw, slices, sl);
    double m = mean[c];
    double sdy = 0.0, sdxh = 0.0;
    for (unsigned j = r.j0 + threadIdx.x; j < r.j1; j += blockDim.x) {
        size_t k = bn_index(j, c, s.c, s.hw, div_hw);
        double g = relu_y ? bn_relu_grad(kit_load(relu_y[k]), kit_load(dy[k])) : kit_load(dy[k]);
        sdy += g;
        sdxh += g * ((double)kit_load(x[k]) - m);
    }
    sdy = kit_block_sum(sdy, shared);
    sdxh = kit_block_sum(sdxh, shared);
    if (threadIdx.x == 0) {
        partials[(size_t)c * slices + sl] = sdy;
        partials[((size_t)s.c + c) * slices + sl] = sdxh;
    }
}

// One thread per (which, channel): stats[which * C + c] = sum of the slices in order; stats[2C] = count.
// Backward passes invstd, which turns sum dy * (x - mean) into sum dy * xhat.
__global__ void bn_reduce_kernel(int channels, int slices, double count, const double *partials,
                                 const float *invstd, double *stats) {
    KIT_GRID_LOOP(i, (size_t)2 * channels) {
        double t = 0.0;
        for (int k = 0; k < slices; k++) t += partials[i * slices + k];
        if (invstd && i >= (size_t)channels) t *= invstd[i - channels];
        stats[i] = t;
        if (i == 0) stats[2 * channels] = count;
    }
}

// Sends the stats through the hook (lesson 05's all-reduce) and back, when a hook is set. Returns the
// element count after it (the global count under SyncBN).
double bn_sync_stats(const BatchNormDims *s, const BatchNormSync *sync, double *stats_device) {
    if (!sync || !sync->allreduce_sum) return (double)s->n * (double)s->hw;
    int count = 2 * s->c + 1;
    cudaStream_t st = cuda_stream();
    double *host = cuda_host_scratch((size_t)count);
    CUDA_CHECK(cudaMemcpyAsync(host, stats_device, (size_t)count * sizeof(double), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    sync->allreduce_sum(host, count, sync->ctx);
    // From pageable memory, cudaMemcpyAsync returns once `host` has been staged, so the scratch can be
    // reused right away; the copy is still ordered before the kernels that read the stats.
    CUDA_CHECK(cudaMemcpyAsync(stats_device, host, (size_t)count * sizeof(double), cudaMemcpyHostToDevice, st));
    return host[2 * s->c];
}

// One thread per channel: batch mean/variance -> saved mean, invstd and the running statistics.
__global__ void bn_finalize_kernel(BatchNormDims s, const double *stats, float *mean, float *invstd,
                                   float *running_mean, float *running_var) {
    KIT_GRID_LOOP(c, (size_t)s.c) {
        double count = stats[2 * s.c];
        double m = stats[c] / count;
        double var = stats[s.c + c] / count - m * m;  // biased: what normalisation uses
        if (var < 0.0) var = 0.0;                     // rounding can push a constant channel below 0
        mean[c] = (float)m;
        invstd[c] = (float)(1.0 / sqrt(var + (double)s.eps));
        // Unbiased variance for the running estimate, as PyTorch.
        double unbiased = var * count / (count - 1.0);  // count > 1: checked on the host
        if (running_mean && running_var) {
            running_mean[c] = (float)((1.0 - s.momentum) * running_mean[c] + s.momentum * m);
            running_var[c] = (float)((1.0 - s.momentum) * running_var[c] + s.momentum * unbiased);
        }
    }
}

// The per-element kernels below run on a 2-D grid: x over the C * HW elements of one image, y over the
// images. A thread finds its channel once (one KitDiv) and its coefficients once, then loops over images.

// y = gamma * (x - mean) * invstd + beta, as y = x * a + b per channel (the CPU's form); relu: y = max(y, 0)
// in the same pass (fused BN + ReLU), the value relu_forward would compute.
template <typename T>
__global__ void bn_normalize_kernel(BatchNormDims s, KitDiv div_hw, const T *x, const float *gamma,
                                    const float *beta, const float *mean, const float *invstd, int relu,
                                    T *y) {
    const unsigned chw = (unsigned)s.c * (unsigned)s.hw;
    KIT_LOOP_X(i, chw) {
        const unsigned c = kit_div(i, div_hw);
        const float a = gamma[c] * invstd[c], b = beta[c] - mean[c] * a;
        KIT_LOOP_Y(n, s.n) {
            const size_t k = (size_t)n * chw + i;
            const float v = kit_load(x[k]) * a + b;
            y[k] = kit_store<T>(relu ? (v > 0.0f ? v : 0.0f) : v);
        }
    }
}

// Eval: the same with the running statistics (a in double, as the CPU).
template <typename T>
__global__ void bn_eval_kernel(BatchNormDims s, KitDiv div_hw, const T *x, const float *gamma,
                               const float *beta, const float *running_mean, const float *running_var, T *y) {
    const unsigned chw = (unsigned)s.c * (unsigned)s.hw;
    KIT_LOOP_X(i, chw) {
        const unsigned c = kit_div(i, div_hw);
        const float a = (float)(gamma[c] / sqrt((double)running_var[c] + (double)s.eps));
        const float b = beta[c] - running_mean[c] * a;
        KIT_LOOP_Y(n, s.n) {
            const size_t k = (size_t)n * chw + i;
            y[k] = kit_store<T>(kit_load(x[k]) * a + b);
        }
    }
}

// dgamma, dbeta += the LOCAL sums (taken before the hook): with DDP, parameter gradients are averaged
// by the gradient all-reduce afterwards, as in PyTorch's SyncBatchNorm; summing them here too would
// count every rank's share world-size times.
__global__ void bn_param_grad_kernel(int channels, const double *stats, float *dgamma, float *dbeta) {
    KIT_GRID_LOOP(c, (size_t)channels) {
        if (dgamma) dgamma[c] += (float)stats[channels + c];
        if (dbeta) dbeta[c] += (float)stats[c];
    }
}

// dx += gamma * invstd * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M), M = the (global) count,
// expanded per channel into dx += a * dy + b * x + d. One thread per channel computes (a, b, d) in
// double, once, so the per-element kernel is float only (FP64 is slow on most GPUs but the H100).
__global__ void bn_input_coef_kernel(int channels, const float *gamma, const float *mean, const float *invstd,
                                     const double *stats, float *coef) {
    KIT_GRID_LOOP(c, (size_t)channels) {
        double count = stats[2 * channels];
        double A = (double)gamma[c] * invstd[c];
        double B = -A * invstd[c] * stats[channels + c] / count;
        double D = -A * stats[c] / count - B * mean[c];
        coef[c] = (float)A;
        coef[channels + c] = (float)B;
        coef[2 * channels + c] = (float)D;
    }
}

// relu_y != NULL: fused BN + ReLU (dy is the ReLU's output gradient, masked here); dx may then be dy itself,
// and is OVERWRITTEN: 0.0f + (...) is what adding into a zeroed buffer gives (each element is read before
// its own thread writes it).
template <typename T>
__global__ void bn_input_grad_kernel(BatchNormDims s, KitDiv div_hw, const T *x,
                                     const T *dy, const T *relu_y, const float *coef,
                                     T *dx) {
    const unsigned chw = (unsigned)s.c * (unsigned)s.hw;
    const bool overwrite = relu_y && (const void *)dx == (const void *)dy;
    KIT_LOOP_X(i, chw) {
        const unsigned c = kit_div(i, div_hw);
        const float a = coef[c], b = coef[s.c + c], d = coef[2 * s.c + c];
        KIT_LOOP_Y(n, s.n) {
            const size_t k = (size_t)n * chw + i;
            const float g = relu_y ? bn_relu_grad(kit_load(relu_y[k]), kit_load(dy[k])) : kit_load(dy[k]);
            const float before = overwrite ? 0.0f : kit_load(dx[k]);
            dx[k] = kit_store<T>(before + (a * g + b * kit_load(x[k]) + d));
        }
    }
}

// Partial sums -> stats (2C + 1 doubles, count last), on the compute stream.
void bn_reduce(const BatchNormDims *s, const BnWork &w, const float *invstd) {
    KIT_LAUNCH(bn_reduce_kernel, (size_t)2 * s->c, s->c, w.slices, (double)s->n * s->hw, w.partials, invstd,
               w.stats);
}

// Batch statistics (through the sync hook when set), running statistics, then y; relu: the fused ReLU.
template <typename T>
void bn_forward_train(const BatchNormDims *s, const T *x, const float *gamma, const float *beta, bool relu,
                      T *y, float *mean, float *invstd, float *running_mean, float *running_var,
                      const BatchNormSync *sync, float *work) {
    bn_check(s);
    KIT_CHECK_PTR(x);
    KIT_CHECK_PTR(gamma);
    KIT_CHECK_PTR(beta);
    KIT_CHECK_PTR(y);
    KIT_CHECK_PTR(mean);
    KIT_CHECK_PTR(invstd);
    BnWork w = bn_work(s, work);
    const KitDiv div_hw = kit_div_make(s->hw);
    dim3 grid((unsigned)s->c, (unsigned)w.slices);
    KIT_PROFILED(bn_stats_partial_kernel<T>, {
        CUDA_LAUNCH(bn_stats_partial_kernel<T>, grid, KIT_BLOCK, 0, cuda_stream())(*s, div_hw, w.slices, x, w.partials);
        CUDA_CHECK_LAUNCH();
    });
    bn_reduce(s, w, NULL);
    double count = bn_sync_stats(s, sync, w.stats);
    // PyTorch refuses this too: the unbiased variance of a single value is undefined.
    CHECK(count > 1.0, "batchnorm in training mode needs more than one value per channel "
                       "(a batch of 1 with 1x1 feature maps?)");
    KIT_LAUNCH(bn_finalize_kernel, (size_t)s->c, *s, w.stats, mean, invstd, running_mean, running_var);
    KIT_LAUNCH_2D(bn_normalize_kernel<T>, (size_t)s->c * s->hw, s->n, *s, div_hw, x, gamma, beta, mean, invstd,
                  (int)relu, y);
}

// relu_y != NULL: fused BN + ReLU (dy is the gradient of the ReLU's output relu_y; dx may be dy).
template <typename T>
void bn_backward(const BatchNormDims *s, const T *x, const float *gamma, const float *mean,
                 const float *invstd, const T *relu_y, const T *dy,
                 T *dx, float *dgamma, float *dbeta,
                 const BatchNormSync *sync, float *work) {
    bn_check(s);
    if (!dx && !dgamma && !dbeta) return;
    KIT_CHECK_PTR(x);
    KIT_CHECK_PTR(gamma);
    KIT_CHECK_PTR(mean);
    KIT_CHECK_PTR(invstd);
    KIT_CHECK_PTR(dy);
    BnWork w = bn_work(s, work);
    const KitDiv div_hw = kit_div_make(s->hw);
    dim3 grid((unsigned)s->c, (unsigned)w.slices);
    KIT_PROFILED(bn_grad_partial_kernel<T>, {
        CUDA_LAUNCH(bn_grad_partial_kernel<T>, grid, KIT_BLOCK, 0, cuda_stream())(*s, div_hw, w.slices, x, mean, dy,
                                                                                relu_y, w.partials);
        CUDA_CHECK_LAUNCH();
    });
    bn_reduce(s, w, invstd);
    if (dgamma || dbeta) KIT_LAUNCH(bn_param_grad_kernel, (size_t)s->c, s->c, w.stats, dgamma, dbeta);
    // No input gradient wanted: nothing global to compute, so no hook call (the same on every rank, as
    // every rank runs the same layers; the CPU does the same).
    if (!dx) return;
    bn_sync_stats(s, sync, w.stats);
    KIT_LAUNCH(bn_input_coef_kernel, (size_t)s->c, s->c, gamma, mean, invstd, w.stats, w.coef);
    KIT_LAUNCH_2D(bn_input_grad_kernel<T>, (size_t)s->c * s->hw, s->n, *s, div_hw, x, dy, relu_y, w.coef, dx);
}

}  // namespace

extern "C" size_t batchnorm_work_floats_cuda(const BatchNormDims *s) {
    bn_check(s);
    // + 1 float: room to round the start up to 8 bytes.
    return 2 * bn_work_doubles(s, bn_slices(s)) + 3 * (size_t)s->c + 1;
}

extern "C" void batchnorm_forward_train_cuda(const BatchNormDims *s, const float *x, const float *gamma,
                                             const float *beta, float *y, float *mean, float *invstd,
                                             float *running_mean, float *running_var,
                                             const BatchNormSync *sync, float *work) {
    bn_forward_train<float>(s, x, gamma, beta, false, y, mean, invstd, running_mean, running_var, sync, work);
}

extern "C" void batchnorm_relu_forward_train_cuda(const BatchNormDims *s, const float *x, const float *gamma,
                                                  const float *beta, float *y, float *mean, float *invstd,
                                                  float *running_mean, float *running_var,
                                                  const BatchNormSync *sync, float *work) {
    bn_forward_train<float>(s, x, gamma, beta, true, y, mean, invstd, running_mean, running_var, sync, work);
}

extern "C" void batchnorm_forward_eval_act16_cuda(LowpFormat f, const BatchNormDims *s, const void *x,
                                                  const float *gamma, const float *beta, const float *running_mean,
                                                  const float *running_var, void *y) {
    bn_check(s);
    KIT_CHECK_PTR(gamma);
    KIT_CHECK_PTR(beta);
    KIT_CHECK_PTR(running_mean);
    KIT_CHECK_PTR(running_var);
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        KIT_LAUNCH_2D(bn_eval_kernel<T>, (size_t)s->c * s->hw, s->n, *s, kit_div_make(s->hw), (const T *)x, gamma,
                      beta, running_mean, running_var, (T *)y);
    });
}

extern "C" void batchnorm_forward_eval_cuda(const BatchNormDims *s, const float *x, const float *gamma,
                                            const float *beta, const float *running_mean,
                                            const float *running_var, float *y) {
    batchnorm_forward_eval_act16_cuda(LOWP_FP32, s, x, gamma, beta, running_mean, running_var, y);
}

extern "C" void batchnorm_backward_cuda(const BatchNormDims *s, const float *x, const float *gamma,
                                        const float *mean, const float *invstd, const float *dy, float *dx,
                                        float *dgamma, float *dbeta, const BatchNormSync *sync, float *work) {
    bn_backward<float>(s, x, gamma, mean, invstd, NULL, dy, dx, dgamma, dbeta, sync, work);
}

extern "C" void batchnorm_relu_backward_cuda(const BatchNormDims *s, const float *x, const float *gamma,
                                             const float *mean, const float *invstd, const float *y,
                                             const float *dy, float *dx, float *dgamma, float *dbeta,
                                             const BatchNormSync *sync, float *work) {
    KIT_CHECK_PTR(y);
    bn_backward<float>(s, x, gamma, mean, invstd, y, dy, dx, dgamma, dbeta, sync, work);
}

// 16-bit activations (kit/ops_impl.h): x and y (the fused ReLU's output) in format f.
extern "C" void batchnorm_forward_train_act16_cuda(LowpFormat f, bool relu, const BatchNormDims *s, const void *x,
                                                   const float *gamma, const float *beta, void *y, float *mean,
                                                   float *invstd, float *running_mean, float *running_var,
                                                   const BatchNormSync *sync, float *work) {
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        bn_forward_train(s, (const T *)x, gamma, beta, relu, (T *)y, mean, invstd, running_mean, running_var, sync,
                         work);
    });
}

extern "C" void batchnorm_backward_act16_cuda(LowpFormat f, const BatchNormDims *s, const void *x,
                                              const float *gamma, const float *mean, const float *invstd,
                                              const void *relu_y, const void *dy, void *dx, float *dgamma,
                                              float *dbeta, const BatchNormSync *sync, float *work) {
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        bn_backward<T>(s, (const T *)x, gamma, mean, invstd, (const T *)relu_y, (const T *)dy,
                        (T *)dx, dgamma, dbeta, sync, work);
    });
}
