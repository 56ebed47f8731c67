// kit/cuda/elementwise.cu: ReLU, residual add, scaling, SGD, max-pool and average-pool on the GPU.
// One thread per output element (grid-stride loops), each writing only its own element: no races.
#include <limits.h>

#include "kit/cuda/cuda_internal.h"
#include "kit/ops_impl.h"

// ---------------------------------------------------------------- ReLU
// The activations x and y and their gradients dy and dx are stored as T (float, or 16 bits: the *_act16_cuda
// entry points, kit/ops_impl.h).
template <typename T>
__global__ void relu_forward_kernel(size_t n, const T *x, T *y) {
    KIT_GRID_LOOP(i, n) {
        const float v = kit_load(x[i]);
        y[i] = kit_store<T>(v > 0.0f ? v : 0.0f);
    }
}

// dx += dy where the output was positive (the same test the CPU uses: y > 0).
template <typename T>
__global__ void relu_backward_kernel(size_t n, const T *y, const T *dy,
                                     T *dx) {
    KIT_GRID_LOOP(i, n) {
        if (kit_load(y[i]) > 0.0f) kit_add_to(&dx[i], kit_load(dy[i]));
    }
}

extern "C" void relu_forward_act16_cuda(LowpFormat f, size_t n, const void *x, void *y) {
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        KIT_LAUNCH(relu_forward_kernel<T>, n, n, (const T *)x, (T *)y);
    });
}

extern "C" void relu_backward_act16_cuda(LowpFormat f, size_t n, const void *y, const void *dy,
                                         void *dx) {
    if (!dx) return;
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        KIT_LAUNCH(relu_backward_kernel<T>, n, n, (const T *)y, (const T *)dy, (T *)dx);
    });
}

// float32 storage is the LOWP_FP32 instance of the same kernels, as for every op in this file.
extern "C" void relu_forward_cuda(size_t n, const float *x, float *y) { relu_forward_act16_cuda(LOWP_FP32, n, x, y); }

extern "C" void relu_backward_cuda(size_t n, const float *y, const float *dy, float *dx) {
    relu_backward_act16_cuda(LOWP_FP32, n, y, dy, dx);
}

// ---------------------------------------------------------------- add, scale
template <typename T>
__global__ void add_forward_kernel(size_t n, const T *a, const T *b, T *y) {
    KIT_GRID_LOOP(i, n) { y[i] = kit_store<T>(kit_load(a[i]) + kit_load(b[i])); }
}

// dst += src: a residual's backward, src its output gradient, dst an input's gradient.
template <typename T>
__global__ void add_inplace_kernel(size_t n, T *dst, const T *src) {
    KIT_GRID_LOOP(i, n) { kit_add_to(&dst[i], kit_load(src[i])); }
}

extern "C" void add_forward_act16_cuda(LowpFormat f, size_t n, const void *a, const void *b, void *y) {
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        KIT_LAUNCH(add_forward_kernel<T>, n, n, (const T *)a, (const T *)b, (T *)y);
    });
}

extern "C" void add_inplace_act16_cuda(LowpFormat f, size_t n, void *dst, const void *src) {
    if (!dst) return;  // a NULL gradient is "not needed" (ops.h)
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        KIT_LAUNCH(add_inplace_kernel<T>, n, n, (T *)dst, (const T *)src);
    });
}

extern "C" void add_forward_cuda(size_t n, const float *a, const float *b, float *y) {
    add_forward_act16_cuda(LOWP_FP32, n, a, b, y);
}

extern "C" void add_inplace_cuda(size_t n, float *dst, const float *src) {
    add_inplace_act16_cuda(LOWP_FP32, n, dst, src);
}

// ---------------------------------------------------------------- SGD with momentum (PyTorch's form)
// velocity == NULL is plain SGD (allowed only with momentum 0, checked on the host), as the CPU.
__global__ void sgd_update_kernel(size_t n, float *param, const float *grad, float *velocity, float lr,
                                  float momentum, float weight_decay, int nesterov) {
    KIT_GRID_LOOP(i, n) {
        float g = grad[i] + weight_decay * param[i];
        if (!velocity) {
            param[i] -= lr * g;
            continue;
        }
        float v = momentum * velocity[i] + g;
        velocity[i] = v;
        param[i] -= lr * (nesterov ? g + momentum * v : v);
    }
}

extern "C" void sgd_update_cuda(size_t n, float *param, const float *grad, float *velocity, float lr,
                                float momentum, float weight_decay, int nesterov) {
    CHECK(velocity || momentum == 0.0f, "sgd_update: momentum needs a velocity buffer");
    KIT_LAUNCH(sgd_update_kernel, n, n, param, grad, velocity, lr, momentum, weight_decay, nesterov);
}

// ---------------------------------------------------------------- 2x2 max-pool, stride 2
// The window of output (p, q) starts at input (2p, 2q); "first maximum" scans it row by row and keeps
// the earliest of equal values (strict >), exactly like the CPU, so ties route the gradient the same way.
// A NaN wins (so it propagates), also as the CPU.
template <typename T>
__device__ inline int maxpool2_argmax(const T *plane, int w, int p, int q) {
    int best = (2 * p) * w + 2 * q;
    const int cand[3] = {best + 1, best + w, best + w + 1};
    for (int t = 0; t < 3; t++) {
        float v = kit_load(plane[cand[t]]), b = kit_load(plane[best]);
        if (v > b || (isnan(v) && !isnan(b))) best = cand[t];
    }
    return best;
}

// The geometry of a pool: a 32-bit index i over one image's C * PH * PW outputs gives its channel and window.
struct PoolGeom {
    int h, w, pw, plane_out;   // input height and width; output width; PH * PW
    unsigned per_image;        // C * PH * PW
    size_t in_image;           // C * H * W
    KitDiv div_plane, div_pw;  // by PH * PW (-> channel), by PW (-> output row)
};

// Offset of output i's input plane within its image, and its (p, q), with two KitDivs.
__device__ inline size_t pool_window(const PoolGeom &g, unsigned i, int *p, int *q) {
    const unsigned c = kit_div(i, g.div_plane), pq = i - c * (unsigned)g.plane_out;
    const unsigned row = kit_div(pq, g.div_pw);
    *p = (int)row;
    *q = (int)(pq - row * (unsigned)g.pw);
    return (size_t)c * g.h * g.w;
}

// Grid: x over one image's outputs, y over images. The maximum is one of the inputs: stored as it is.
template <typename T>
__global__ void maxpool2_forward_kernel(int n_img, PoolGeom g, const T *x, T *y) {
    KIT_LOOP_X(i, g.per_image) {
        int p, q;
        const size_t plane = pool_window(g, i, &p, &q);
        KIT_LOOP_Y(n, n_img) {
            const T *xp = x + (size_t)n * g.in_image + plane;
            y[(size_t)n * g.per_image + i] = xp[maxpool2_argmax(xp, g.w, p, q)];
        }
    }
}

// Windows do not overlap (stride 2 = size 2), so each input element receives from at most one thread.
template <typename T>
__global__ void maxpool2_backward_kernel(int n_img, PoolGeom g, const T *x, const T *dy,
                                         T *dx) {
    KIT_LOOP_X(i, g.per_image) {
        int p, q;
        const size_t plane = pool_window(g, i, &p, &q);
        KIT_LOOP_Y(n, n_img) {
            const size_t base = (size_t)n * g.in_image + plane;
            kit_add_to(&dx[base + maxpool2_argmax(x + base, g.w, p, q)], kit_load(dy[(size_t)n * g.per_image + i]));
        }
    }
}

static PoolGeom maxpool2_geom(int n, int c, int h, int w) {
    CHECK(n > 0 && c > 0 && h >= 2 && w >= 2, "maxpool2: needs n, c > 0 and an input of at least 2x2");
    CHECK((size_t)c * h * w <= INT_MAX, "maxpool2: one image exceeds 2^31 elements (32-bit indices)");
    PoolGeom g;
    g.h = h, g.w = w, g.pw = w / 2, g.plane_out = (h / 2) * (w / 2);
    g.per_image = (unsigned)c * (unsigned)g.plane_out;
    g.in_image = (size_t)c * h * w;
    g.div_plane = kit_div_make(g.plane_out);
    g.div_pw = kit_div_make(g.pw);
    return g;
}

extern "C" void maxpool2_forward_act16_cuda(LowpFormat f, int n, int c, int h, int w, const void *x, void *y) {
    PoolGeom g = maxpool2_geom(n, c, h, w);
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        KIT_LAUNCH_2D(maxpool2_forward_kernel<T>, g.per_image, n, n, g, (const T *)x, (T *)y);
    });
}

extern "C" void maxpool2_backward_act16_cuda(LowpFormat f, int n, int c, int h, int w,
                                             const void *x, const void *dy, void *dx) {
    PoolGeom g = maxpool2_geom(n, c, h, w);
    if (!dx) return;
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        KIT_LAUNCH_2D(maxpool2_backward_kernel<T>, g.per_image, n, n, g, (const T *)x, (const T *)dy,
                      (T *)dx);
    });
}

extern "C" void maxpool2_forward_cuda(int n, int c, int h, int w, const float *x, float *y) {
    maxpool2_forward_act16_cuda(LOWP_FP32, n, c, h, w, x, y);
}

extern "C" void maxpool2_backward_cuda(int n, int c, int h, int w, const float *x, const float *y,
                                       const float *dy, float *dx) {
    (void)y;  // the argmax is found again in x, as on the CPU
    maxpool2_backward_act16_cuda(LOWP_FP32, n, c, h, w, x, dy, dx);
}

// ---------------------------------------------------------------- global average pool
// One thread per (n, c): the planes are small (4x4 .. 8x8 in the kit's models), and a sequential sum
// keeps the order of the CPU's loop. Accumulated in double so long planes lose nothing.
template <typename T>
__global__ void avgpool_forward_kernel(size_t rows, int hw, const T *x, T *y) {
    KIT_GRID_LOOP(i, rows) {
        const T *p = x + i * (size_t)hw;
        double s = 0.0;
        for (int j = 0; j < hw; j++) s += kit_load(p[j]);
        y[i] = kit_store<T>((float)(s / hw));
    }
}

// Grid: x over the (c, pixel) of one image, y over images; one KitDiv finds the channel.
template <typename T>
__global__ void avgpool_backward_kernel(int n_img, int c, int hw, KitDiv div_hw, const T *dy,
                                        T *dx) {
    const unsigned chw = (unsigned)c * (unsigned)hw;
    KIT_LOOP_X(i, chw) {
        const unsigned ch = kit_div(i, div_hw);
        KIT_LOOP_Y(n, n_img) { kit_add_to(&dx[(size_t)n * chw + i], kit_load(dy[(size_t)n * c + ch]) / (float)hw); }
    }
}

extern "C" void avgpool_forward_act16_cuda(LowpFormat f, int n, int c, int hw, const void *x, void *y) {
    CHECK(n > 0 && c > 0 && hw > 0, "avgpool: n, c and hw must be positive");
    size_t rows = (size_t)n * c;
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        KIT_LAUNCH(avgpool_forward_kernel<T>, rows, rows, hw, (const T *)x, (T *)y);
    });
}

extern "C" void avgpool_forward_cuda(int n, int c, int hw, const float *x, float *y) {
    avgpool_forward_act16_cuda(LOWP_FP32, n, c, hw, x, y);
}

extern "C" void avgpool_backward_act16_cuda(LowpFormat f, int n, int c, int hw, const void *dy,
                                            void *dx) {
    CHECK(n > 0 && c > 0 && hw > 0, "avgpool: n, c and hw must be positive");
    if (!dx) return;
    CHECK((size_t)c * hw <= INT_MAX, "avgpool: one image exceeds 2^31 elements (32-bit indices)");
    kit_with_type(f, [&](auto t) {
        using T = typename decltype(t)::type;
        KIT_LAUNCH_2D(avgpool_backward_kernel<T>, (size_t)c * hw, n, n, c, hw, kit_div_make(hw),
                      (const T *)dy, (T *)dx);
    });
}

extern "C" void avgpool_backward_cuda(int n, int c, int hw, const float *dy, float *dx) {
    avgpool_backward_act16_cuda(LOWP_FP32, n, c, hw, dy, dx);
}

// ---------------------------------------------------------------- low precision (round_lowp, lesson 10)
// The rounding is kit/ops_dims.h's lowp_round_bits, the very function the CPU loop calls: the same bits.
__global__ void round_lowp_kernel(size_t n, LowpFormat f, float *x) {
    KIT_GRID_LOOP(i, n) { x[i] = __uint_as_float(lowp_round_bits(f, __float_as_uint(x[i]))); }
}

// The counting version: each thread counts its elements, then adds its three counts to the device counters
// (integer atomics: exact, in any order). counters: nonzero, underflow, overflow.
__global__ void round_lowp_count_kernel(size_t n, LowpFormat f, float *x, unsigned long long *counters) {
    unsigned long long nonzero = 0, underflow = 0, overflow = 0;
    KIT_GRID_LOOP(i, n) {
        unsigned before = __float_as_uint(x[i]), after = lowp_round_bits(f, before);
        x[i] = __uint_as_float(after);
        before &= 0x7FFFFFFFu;
        after &= 0x7FFFFFFFu;
        bool finite = before < 0x7F800000u;
        nonzero += before != 0;
        underflow += finite && before != 0 && after == 0;
        overflow += finite && after == 0x7F800000u;
    }
    if (nonzero) atomicAdd(&counters[0], nonzero);
    if (underflow) atomicAdd(&counters[1], underflow);
    if (overflow) atomicAdd(&counters[2], overflow);
}

__global__ void scale_inplace_kernel(size_t n, float *x, float s) {
    KIT_GRID_LOOP(i, n) { x[i] *= s; }
}

// inf or NaN: the exponent bits all ones.
__global__ void count_nonfinite_kernel(size_t n, const float *x, unsigned long long *counter) {
    unsigned long long bad = 0;
    KIT_GRID_LOOP(i, n) { bad += (__float_as_uint(x[i]) & 0x7F800000u) == 0x7F800000u; }
    if (bad) atomicAdd(counter, bad);
}

// The counters back on the host: the copy on the compute stream, then a wait for it (the caller needs them now).
static void counters_read(const unsigned long long *counters, unsigned long long *host, int count) {
    cudaStream_t st = cuda_stream();
    CUDA_CHECK(cudaMemcpyAsync(host, counters, (size_t)count * sizeof *host, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
}

extern "C" void round_lowp_cuda(LowpFormat f, size_t n, float *x, LowpStats *stats) {
    CHECK(f == LOWP_FP32 || f == LOWP_BF16 || f == LOWP_FP16, "round_lowp: unknown format");
    if (!stats) {
        if (f != LOWP_FP32) KIT_LAUNCH(round_lowp_kernel, n, n, f, x);
        return;
    }
    if (n == 0) return;
    unsigned long long *counters = cuda_device_counters(), host[3];
    CUDA_CHECK(cudaMemsetAsync(counters, 0, 3 * sizeof *counters, cuda_stream()));
    KIT_LAUNCH(round_lowp_count_kernel, n, n, f, x, counters);
    counters_read(counters, host, 3);
    stats->nonzero += (size_t)host[0];
    stats->underflow += (size_t)host[1];
    stats->overflow += (size_t)host[2];
}

extern "C" void scale_inplace_cuda(size_t n, float *x, float s) {
    KIT_LAUNCH(scale_inplace_kernel, n, n, x, s);
}

extern "C" size_t count_nonfinite_cuda(size_t n, const float *x) {
    if (n == 0) return 0;
    unsigned long long *counter = cuda_device_counters(), host = 0;
    CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof *counter, cuda_stream()));
    KIT_LAUNCH(count_nonfinite_kernel, n, n, x, counter);
    counters_read(counter, &host, 1);
    return (size_t)host;
}
