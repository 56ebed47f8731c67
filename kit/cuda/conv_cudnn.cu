// kit/cuda/conv_cudnn.cu: conv2d's passes on cuDNN (see conv_cudnn.h), the engine PyTorch's convolutions run on.
//
// Why cuDNN: im2col writes every input value R*R times to memory and reads it back for the GEMM, and the layout
// kernels around the GEMM move the output once more; on an H200 those trips cost more than the GEMM itself
// (bench/results-conv-roofline.md). cuDNN's implicit-GEMM kernels build each tile of the columns in shared memory
// from the input, so the columns never reach memory. It is the well-kept library for this, so the kit calls it
// rather than writing its own implicit-GEMM kernels.
//
// What it may use, and why:
//   - Only GEMM-family algorithms (forward IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM; backward ALGO_1), never
//     FFT or Winograd: their results are sums of the same products in some order, so the kit's tests and bounds
//     (tests/lowp_gemm_cases.h: a summation-order bound) hold for them as for cuBLAS. FFT and Winograd transform
//     the inputs first and round other numbers.
//   - Only deterministic ones: the same step gives the same bits every run (lesson 04's reproducibility), which
//     rules out the backward algorithms that add with atomics (ALGO_0, ALGO_3).
//   - Math type from the GEMM precision (device_gemm_precision), as PyTorch sets it: fp32 is CUDNN_FMA_MATH,
//     float32 arithmetic only; tf32 is CUDNN_DEFAULT_MATH, which on Ampere and later lets cuDNN read float32 data
//     as TF32 (PyTorch's allow_tf32, its default for convolutions); bf16 and fp16 are CUDNN_TENSOR_OP_MATH. 16-bit
//     data is cuDNN's "pseudo" configuration: 16-bit inputs and outputs, float32 sums, as cuBLAS's GEMMs have it.
//   - The algorithm for each (shape, type, math) is cuDNN's heuristic choice (cudnnGet*Algorithm_v7: the first in
//     its ranking that passes the rules above and whose workspace fits conv's work budget, cuda_conv_work_budget),
//     asked once per thread and GPU. The workspace is the CUDA context's conv work (cuda_conv_work), grown to the
//     chosen algorithm's bytes on first use. Not measured (cudnnFind*, PyTorch's cudnn.benchmark): a timed choice
//     can differ from run to run, and a resumed run would then sum in another order than the run it resumes
//     (lesson 04's bit-for-bit check).
// The legacy convolution API used here (cudnn_cnn.h) is marked deprecated in cuDNN 9 in favour of the graph API,
// and is still shipped and supported through 9.x; it keeps this file a page long.
#include "kit/check.h"
#include "kit/cuda/conv_cudnn.h"
#include "kit/cuda/cuda_context.h"
#include "kit/cuda_check.h"
#include "kit/device.h"

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace {

// 1 on, 0 off, -1 not decided yet (the environment decides at the first question).
std::atomic<int> g_use_cudnn{-1};

bool cudnn_wanted() {
    int use = g_use_cudnn.load();
    if (use < 0) {
        const char *env = getenv("KIT_CUDNN");
        CHECKF(!env || !*env || strcmp(env, "0") == 0 || strcmp(env, "1") == 0,
               "KIT_CUDNN is 0 (conv on im2col + cuBLAS) or 1 (on cuDNN where the build has it, the default), or unset",
               "KIT_CUDNN=%s", env);
        use = !(env && strcmp(env, "0") == 0);
        g_use_cudnn.store(use);
    }
    return use == 1;
}

}  // namespace

#ifdef KIT_CUDNN
#include <cudnn.h>

#define CUDNN_CHECK(call)                                                                              \
    do {                                                                                               \
        cudnnStatus_t cudnn_s_ = (call);                                                               \
        if (cudnn_s_ != CUDNN_STATUS_SUCCESS)                                                          \
            check_fail(__FILE__, __LINE__, #call, cudnnGetErrorString(cudnn_s_),                       \
                       "BAD_PARAM: a descriptor does not match the buffers (shapes, types, workspace); " \
                       "NOT_SUPPORTED: this cuDNN has no kernel for the configuration");               \
    } while (0)

namespace {

enum Pass { FORWARD = 0, BACKWARD_DATA = 1, BACKWARD_FILTER = 2 };
constexpr int kUnknown = -2, kNone = -1;

// One shape in one type and math type: its descriptors, and per pass the algorithm chosen (or kNone).
struct Plan {
    Conv2dDims s;
    ConvLayout layout;
    cudnnDataType_t type;
    cudnnMathType_t math;
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    int algo[3] = {kUnknown, kUnknown, kUnknown};
    cudnnMathType_t algo_math[3];
    size_t workspace[3] = {0, 0, 0};

    ~Plan() {  // errors ignored: at exit the context may already be gone, and nothing is left to report
        if (conv) cudnnDestroyConvolutionDescriptor(conv);
        if (w) cudnnDestroyFilterDescriptor(w);
        if (y) cudnnDestroyTensorDescriptor(y);
        if (x) cudnnDestroyTensorDescriptor(x);
    }
};

// This thread's cuDNN on one GPU: the handle (bound to the compute stream) and its plans.
struct GpuDnn {
    bool tried = false;
    cudnnHandle_t handle = nullptr;
    std::vector<std::unique_ptr<Plan>> plans;
};

constexpr int kMaxGpus = 64;

struct ThreadDnn {
    GpuDnn gpu[kMaxGpus];
    ~ThreadDnn() {
        for (GpuDnn &g : gpu) {
            g.plans.clear();
            if (g.handle) cudnnDestroy(g.handle);
        }
    }
};

thread_local ThreadDnn tls_dnn;

// Says once per process and reason (`said`: that reason's flag) why a pass left cuDNN.
void say_once(std::atomic<bool> &said, const char *fmt, const char *detail) {
    if (!said.exchange(true)) {
        fprintf(stderr, fmt, detail);
        fprintf(stderr, " (further such notes are not repeated)\n");
    }
}

// This thread's handle on its current GPU, or nullptr when cuDNN does not start here (said once).
cudnnHandle_t dnn_handle(GpuDnn **out) {
    int dev = -1;
    CUDA_CHECK(cudaGetDevice(&dev));
    CHECK(dev >= 0 && dev < kMaxGpus, "more GPUs than the kit supports in one process (64)");
    GpuDnn &g = tls_dnn.gpu[dev];
    *out = &g;
    if (!g.tried) {
        g.tried = true;
        cudnnStatus_t st = cudnnCreate(&g.handle);
        if (st != CUDNN_STATUS_SUCCESS) {
            g.handle = nullptr;
            static std::atomic<bool> said{false};
            say_once(said, "conv2d: cuDNN did not start on this GPU (%s): convolutions run on im2col + cuBLAS",
                     cudnnGetErrorString(st));
        } else {
            CUDNN_CHECK(cudnnSetStream(g.handle, cuda_stream()));
        }
    }
    return g.handle;
}

cudnnDataType_t dnn_type(LowpFormat t) {
    return t == LOWP_BF16 ? CUDNN_DATA_BFLOAT16 : t == LOWP_FP16 ? CUDNN_DATA_HALF : CUDNN_DATA_FLOAT;
}

bool same_dims(const Conv2dDims &a, const Conv2dDims &b) {
    return a.n == b.n && a.c == b.c && a.h == b.h && a.w == b.w && a.k == b.k && a.r == b.r && a.stride == b.stride &&
           a.pad == b.pad;
}

Plan *plan_for(GpuDnn &g, const Conv2dDims *s, ConvLayout layout, cudnnDataType_t type, cudnnMathType_t math) {
    for (auto &p : g.plans)
        if (same_dims(p->s, *s) && p->layout == layout && p->type == type && p->math == math) return p.get();
    auto p = std::make_unique<Plan>();
    p->s = *s;
    p->layout = layout;
    p->type = type;
    p->math = math;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&p->y));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&p->w));
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&p->conv));
    // The sizes are always given as (N, C, H, W) and (K, C, R, S); the format says the order in memory.
    const cudnnTensorFormat_t format = layout == CONV_NHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->x, format, type, s->n, s->c, s->h, s->w));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(p->y, format, type, s->n, s->k, conv2d_out_h(s), conv2d_out_w(s)));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(p->w, type, format, s->k, s->c, s->r, s->r));
    // The kit's conv is a cross-correlation (no filter flip), as every framework's "convolution" is.
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(p->conv, s->pad, s->pad, s->stride, s->stride, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv, math));
    g.plans.push_back(std::move(p));
    return g.plans.back().get();
}

// The rules at the top, in the heuristics' order: a GEMM-family, deterministic algorithm cuDNN has a kernel for,
// float32 arithmetic when that was asked for, and a workspace (asked with the algorithm's math type set) that
// fits conv's work budget. `workspace` asks cuDNN for one algorithm's bytes.
template <typename Perf, typename Ws>
int pick(const Perf *perf, int n, const int *allowed, int n_allowed, Plan *p, Pass pass, Ws workspace) {
    const size_t most = cuda_conv_work_budget() * sizeof(float);
    for (int i = 0; i < n; i++) {  // best first
        const Perf &r = perf[i];
        bool family = false;
        for (int j = 0; j < n_allowed; j++) family = family || (int)r.algo == allowed[j];
        if (!family || r.status != CUDNN_STATUS_SUCCESS || r.determinism != CUDNN_DETERMINISTIC) continue;
        if (p->math == CUDNN_FMA_MATH && r.mathType != CUDNN_FMA_MATH) continue;
        size_t bytes = 0;
        CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv, r.mathType));
        if (workspace(r.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > most) continue;
        p->algo_math[pass] = r.mathType;
        p->workspace[pass] = bytes;
        return (int)r.algo;
    }
    return kNone;
}

// The plan's algorithm for pass `pass`, chosen on first use; kNone when there is none (said once).
int choose(GpuDnn &g, Plan *p, Pass pass) {
    if (p->algo[pass] != kUnknown) return p->algo[pass];
    int n = 0, algo = kNone;
    if (pass == FORWARD) {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(g.handle, p->x, p->w, p->conv, p->y,
                                                           CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf));
        const int allowed[] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                               CUDNN_CONVOLUTION_FWD_ALGO_GEMM};
        algo = pick(perf, n, allowed, 3, p, pass, [&](cudnnConvolutionFwdAlgo_t a, size_t *bytes) {
            return cudnnGetConvolutionForwardWorkspaceSize(g.handle, p->x, p->w, p->conv, p->y, a, bytes);
        });
    } else if (pass == BACKWARD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(g.handle, p->w, p->y, p->conv, p->x,
                                                                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf));
        const int allowed[] = {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1};
        algo = pick(perf, n, allowed, 1, p, pass, [&](cudnnConvolutionBwdDataAlgo_t a, size_t *bytes) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(g.handle, p->w, p->y, p->conv, p->x, a, bytes);
        });
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(g.handle, p->x, p->y, p->conv, p->w,
                                                                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf));
        const int allowed[] = {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1};
        algo = pick(perf, n, allowed, 1, p, pass, [&](cudnnConvolutionBwdFilterAlgo_t a, size_t *bytes) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(g.handle, p->x, p->y, p->conv, p->w, a, bytes);
        });
    }
    if (algo == kNone) {
        char shape[160];
        snprintf(shape, sizeof shape, "pass %d of (N %d, C %d, H %d, W %d, K %d, R %d, stride %d, pad %d) in %s",
                 (int)pass, p->s.n, p->s.c, p->s.h, p->s.w, p->s.k, p->s.r, p->s.stride, p->s.pad,
                 p->layout == CONV_NHWC ? "NHWC" : "NCHW");
        static std::atomic<bool> said{false};
        say_once(said, "conv2d: cuDNN has no deterministic GEMM-family algorithm within conv's work budget for %s: "
                 "it runs on im2col + cuBLAS", shape);
    }
    p->algo[pass] = algo;
    return algo;
}

// The handle and plan for a pass in storage t, or nullptr when cuDNN does not take it.
Plan *ready(LowpFormat t, ConvLayout layout, const Conv2dDims *s, Pass pass, GpuDnn **g) {
    if (!cudnn_wanted()) return nullptr;
    // cuDNN indexes a tensor with 32-bit integers: a larger one (a batch of 2^31 values or more) stays on im2col,
    // which cuts the batch into chunks.
    const size_t most = (size_t)INT_MAX;
    if ((size_t)s->n * s->c * s->h * s->w > most || (size_t)s->n * s->k * conv2d_out_h(s) * conv2d_out_w(s) > most)
        return nullptr;
    GemmPrecision prec = device_gemm_precision(DEVICE_CUDA);
    // 16-bit data needs 16-bit GEMMs of the same format (conv.cu checked it for 16-bit storage); float32 data
    // with 16-bit GEMMs (lesson 10's real path on float32 storage) rounds its inputs first: im2col does that.
    const bool data16 = t != LOWP_FP32, gemm16 = prec == GEMM_BF16 || prec == GEMM_FP16;
    if (data16 != gemm16) return nullptr;
    if (!dnn_handle(g)) return nullptr;
    const cudnnMathType_t math = prec == GEMM_FP32   ? CUDNN_FMA_MATH
                                 : prec == GEMM_TF32 ? CUDNN_DEFAULT_MATH
                                                     : CUDNN_TENSOR_OP_MATH;
    Plan *p = plan_for(**g, s, layout, dnn_type(t), math);
    if (choose(**g, p, pass) == kNone) return nullptr;
    CUDNN_CHECK(cudnnSetConvolutionMathType(p->conv, p->algo_math[pass]));
    return p;
}

// A run's status: success, or NOT_SUPPORTED, which cuDNN answers when the kernel behind the chosen algorithm cannot
// take these particular buffers (the heuristics see no pointers: an operand's alignment, say). Then the plan's pass
// is marked as having no algorithm and the caller runs it on im2col + cuBLAS, said once. Anything else is an error
// of the call, reported with CUDNN_CHECK's hint.
bool ran(cudnnStatus_t st, Plan *p, Pass pass, const char *what) {
    if (st == CUDNN_STATUS_NOT_SUPPORTED) {
        static std::atomic<bool> said{false};
        p->algo[pass] = kNone;
        say_once(said, "conv2d: cuDNN's %s could not run this call (CUDNN_STATUS_NOT_SUPPORTED): that pass runs on "
                 "im2col + cuBLAS", what);
        return false;
    }
    CUDNN_CHECK(st);
    return true;
}

// The chosen algorithm's workspace for pass `pass`: the context's conv work, grown to its bytes (none for none).
void *workspace(const Plan *p, Pass pass) { return p->workspace[pass] ? cuda_conv_work(p->workspace[pass]) : nullptr; }

}  // namespace

bool cudnn_conv_forward(LowpFormat t, ConvLayout layout, const Conv2dDims *s, const void *x, const void *w, void *y) {
    GpuDnn *g;
    Plan *p = ready(t, layout, s, FORWARD, &g);
    if (!p) return false;
    const float one = 1.0f, zero = 0.0f;
    return ran(cudnnConvolutionForward(g->handle, &one, p->x, x, p->w, w, p->conv,
                                       (cudnnConvolutionFwdAlgo_t)p->algo[FORWARD], workspace(p, FORWARD),
                                       p->workspace[FORWARD], &zero, p->y, y),
               p, FORWARD, "forward");
}

bool cudnn_conv_backward_data(LowpFormat t, ConvLayout layout, const Conv2dDims *s, const void *w, const void *dy,
                              void *dx) {
    GpuDnn *g;
    Plan *p = ready(t, layout, s, BACKWARD_DATA, &g);
    if (!p) return false;
    const float one = 1.0f;
    return ran(cudnnConvolutionBackwardData(g->handle, &one, p->w, w, p->y, dy, p->conv,
                                            (cudnnConvolutionBwdDataAlgo_t)p->algo[BACKWARD_DATA],
                                            workspace(p, BACKWARD_DATA), p->workspace[BACKWARD_DATA], &one, p->x, dx),
               p, BACKWARD_DATA, "backward data");
}

bool cudnn_conv_backward_filter(LowpFormat t, ConvLayout layout, const Conv2dDims *s, const void *x, const void *dy,
                                void *dw, float beta) {
    GpuDnn *g;
    Plan *p = ready(t, layout, s, BACKWARD_FILTER, &g);
    if (!p) return false;
    const float one = 1.0f;
    return ran(cudnnConvolutionBackwardFilter(g->handle, &one, p->x, x, p->y, dy, p->conv,
                                              (cudnnConvolutionBwdFilterAlgo_t)p->algo[BACKWARD_FILTER],
                                              workspace(p, BACKWARD_FILTER), p->workspace[BACKWARD_FILTER], &beta,
                                              p->w, dw),
               p, BACKWARD_FILTER, "backward filter");
}

extern "C" const char *cuda_conv_engine(void) {
    thread_local static char name[96];
    if (!cudnn_wanted()) return "im2col + cuBLAS (cuDNN switched off: KIT_CUDNN=0 or cuda_conv_use_cudnn)";
    GpuDnn *g;
    if (!dnn_handle(&g)) return "im2col + cuBLAS (cuDNN did not start on this GPU)";
#ifdef KIT_CUDA_EMU
    (void)name;
    return "cuDNN's convolutions as the emulator computes them (kit/cuda/emu/cudnn_emu.cc)";
#else
    size_t v = cudnnGetVersion();
    snprintf(name, sizeof name, "cuDNN %zu.%zu.%zu (im2col + cuBLAS where it has no algorithm)", v / 10000,
             v / 100 % 100, v % 100);
    return name;
#endif
}

#else  // no cuDNN in this build: every pass is conv.cu's

bool cudnn_conv_forward(LowpFormat, ConvLayout, const Conv2dDims *, const void *, const void *, void *) {
    return false;
}
bool cudnn_conv_backward_data(LowpFormat, ConvLayout, const Conv2dDims *, const void *, const void *, void *) {
    return false;
}
bool cudnn_conv_backward_filter(LowpFormat, ConvLayout, const Conv2dDims *, const void *, const void *, void *,
                                float) {
    return false;
}
extern "C" const char *cuda_conv_engine(void) {
    return cudnn_wanted() ? "im2col + cuBLAS (no cuDNN in this build)" : "im2col + cuBLAS (cuDNN switched off)";
}

#endif  // KIT_CUDNN

bool cudnn_conv_wanted(void) {
#ifdef KIT_CUDNN
    return cudnn_wanted();
#else
    return false;
#endif
}

extern "C" bool cuda_conv_use_cudnn(bool on) {
    const bool was = cudnn_wanted();
    g_use_cudnn.store(on ? 1 : 0);
    return was;
}
