// kit/cuda/emu/cudnn_emu.cc: cuDNN's convolutions, emulated on the CPU (see cudnn_emu.h).
//
// Each call first checks what cuDNN checks (descriptors set, types alike, the output's dims those of the
// convolution: CUDNN_STATUS_BAD_PARAM; a configuration or algorithm this emulator does not compute:
// CUDNN_STATUS_NOT_SUPPORTED; a workspace smaller than the algorithm asked for: CUDNN_STATUS_BAD_PARAM), then
// reads its inputs as the hardware reads them (kit_emu_widen, and TF32 for float32 data when the math type allows
// tensor cores), computes the convolution in float32 with its own loops (an image's columns, then OpenBLAS's
// SGEMM: the sums in some order, which cuDNN does not specify either), and stores alpha * result + beta * old,
// rounded once to the output's type. It runs on the CPU at once, after the handle's stream's queue.
#include "kit/cuda/emu/cudnn_emu.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "kit/ops_dims.h"

struct KitEmuDnn {
    cudaStream_t stream;
};
struct KitEmuDnnTensor {
    bool set;
    cudnnDataType_t type;
    int n, c, h, w;
    size_t sn, sc, sh, sw;  // element strides of the format
};
struct KitEmuDnnFilter {
    bool set;
    cudnnDataType_t type;
    int k, c, r, s;
    size_t sk, sc, sr, ss;  // element strides of the format: (K, C, R, S) or (K, R, S, C)
};
struct KitEmuDnnConv {
    bool set;
    int pad_h, pad_w, u, v;
    bool flip;  // CUDNN_CONVOLUTION (the filter turned 180 degrees) rather than CROSS_CORRELATION
    cudnnMathType_t math;
};

namespace {

// The geometry of one call, once its descriptors agree.
struct Geo {
    int n, c, h, w, k, r, s, p, q;
    const KitEmuDnnConv *conv;
    cudaDataType type;
    bool tf32;
};

bool known_type(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT || t == CUDNN_DATA_HALF || t == CUDNN_DATA_BFLOAT16; }

cudaDataType cuda_type(cudnnDataType_t t) {
    return t == CUDNN_DATA_HALF ? CUDA_R_16F : t == CUDNN_DATA_BFLOAT16 ? CUDA_R_16BF : CUDA_R_32F;
}

// x (N, C, H, W) with filter w (K, C, R, S) and output y (N, K, P, Q): the checks cuDNN makes.
cudnnStatus_t geometry(const KitEmuDnnTensor *x, const KitEmuDnnFilter *w, const KitEmuDnnConv *conv,
                       const KitEmuDnnTensor *y, Geo *g) {
    if (!x || !w || !conv || !y || !x->set || !w->set || !conv->set || !y->set) return CUDNN_STATUS_BAD_PARAM;
    if (x->type != w->type || y->type != x->type) return CUDNN_STATUS_BAD_PARAM;
    if (x->c != w->c || y->c != w->k || y->n != x->n) return CUDNN_STATUS_BAD_PARAM;
    if (x->h + 2 * conv->pad_h < w->r || x->w + 2 * conv->pad_w < w->s) return CUDNN_STATUS_BAD_PARAM;
    const int p = (x->h + 2 * conv->pad_h - w->r) / conv->u + 1, q = (x->w + 2 * conv->pad_w - w->s) / conv->v + 1;
    if (y->h != p || y->w != q) return CUDNN_STATUS_BAD_PARAM;
    *g = Geo{x->n, x->c, x->h, x->w, w->k, w->r, w->s, p, q, conv, cuda_type(x->type),
             // float32 data on tensor cores: every math type but FMA lets cuDNN read it as TF32 (on Ampere and
             // later), so the emulator does, and a float32 path that forgot CUDNN_FMA_MATH shows in its tests.
             x->type == CUDNN_DATA_FLOAT && conv->math != CUDNN_FMA_MATH};
    return CUDNN_STATUS_SUCCESS;
}

// A tensor's elements as float32 in (N, C, H, W) order, read as the hardware reads them.
std::vector<float> read_tensor(const KitEmuDnnTensor *d, const void *p, bool tf32) {
    std::vector<float> out((size_t)d->n * d->c * d->h * d->w);
    size_t i = 0;
    for (int n = 0; n < d->n; n++)
        for (int c = 0; c < d->c; c++)
            for (int h = 0; h < d->h; h++)
                for (int w = 0; w < d->w; w++, i++) {
                    float v = kit_emu_widen(cuda_type(d->type), p, n * d->sn + c * d->sc + h * d->sh + w * d->sw);
                    out[i] = tf32 ? kit_emu_tf32(v) : v;
                }
    return out;
}

// Where element (k, c, r, s) of a filter is in its memory.
size_t filter_at(const KitEmuDnnFilter *d, int k, int c, int r, int s) {
    return k * d->sk + c * d->sc + r * d->sr + s * d->ss;
}

// A filter's elements as float32 in (K, C, R, S) order, read as the hardware reads them.
std::vector<float> read_filter(const KitEmuDnnFilter *d, const void *p, bool tf32) {
    std::vector<float> out((size_t)d->k * d->c * d->r * d->s);
    size_t i = 0;
    for (int k = 0; k < d->k; k++)
        for (int c = 0; c < d->c; c++)
            for (int r = 0; r < d->r; r++)
                for (int s = 0; s < d->s; s++, i++) {
                    float v = kit_emu_widen(cuda_type(d->type), p, filter_at(d, k, c, r, s));
                    out[i] = tf32 ? kit_emu_tf32(v) : v;
                }
    return out;
}

// dst[at] = alpha * v + beta * dst[at] (beta 0: the old value is not read, as cuDNN has it), in float32,
// rounded once to the type.
void store(cudnnDataType_t type, void *dst, size_t at, float v, float alpha, float beta) {
    float out = alpha * v;
    if (beta != 0.0f) out += beta * kit_emu_widen(cuda_type(type), dst, at);
    uint32_t u;
    memcpy(&u, &out, sizeof u);
    if (type == CUDNN_DATA_FLOAT) ((float *)dst)[at] = out;
    else if (type == CUDNN_DATA_BFLOAT16) ((uint16_t *)dst)[at] = (uint16_t)(lowp_bf16_bits(u) >> 16);
    else ((uint16_t *)dst)[at] = lowp_fp16_pack(lowp_fp16_bits(u));
}

// One image's columns (C*R*S, P*Q) of x_img (C, H, W): column pq holds the input that output pq reads with
// each filter tap (0 in the padding). CUDNN_CONVOLUTION reads tap (R-1-r, S-1-s) where cross-correlation
// reads (r, s).
void columns(const Geo &g, const float *x_img, float *cols) {
    for (int c = 0; c < g.c; c++)
        for (int r = 0; r < g.r; r++)
            for (int s = 0; s < g.s; s++) {
                const int fr = g.conv->flip ? g.r - 1 - r : r, fs = g.conv->flip ? g.s - 1 - s : s;
                float *row = cols + (((size_t)c * g.r + fr) * g.s + fs) * g.p * g.q;
                for (int p = 0; p < g.p; p++)
                    for (int q = 0; q < g.q; q++) {
                        const int ih = p * g.conv->u - g.conv->pad_h + r, iw = q * g.conv->v - g.conv->pad_w + s;
                        row[p * g.q + q] =
                            ih >= 0 && ih < g.h && iw >= 0 && iw < g.w ? x_img[((size_t)c * g.h + ih) * g.w + iw] : 0.0f;
                    }
            }
}

// The workspace each algorithm asks for (what the heuristics and Get*WorkspaceSize report, and the runs check).
size_t fwd_workspace(const Geo &g, int algo) {
    if (algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM) return sizeof(int) * (size_t)g.c * g.r * g.s;
    if (algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM) return sizeof(float) * (size_t)g.c * g.r * g.s * g.p * g.q;
    return 0;
}

bool fwd_computed(int algo) { return algo >= 0 && algo <= CUDNN_CONVOLUTION_FWD_ALGO_GEMM; }
bool bwd_data_computed(int algo) { return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1; }
bool bwd_filter_computed(int algo) {
    return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
           algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
}

// The heuristics' list (Get*Algorithm_v7): every algorithm, the ones computed here first (in the order given,
// a non-deterministic one first where there is one, so a caller that wants determinism must look), the rest
// NOT_SUPPORTED.
template <typename Perf, typename Algo>
void find_list(int count, const int *order, int order_n, bool (*computed)(int), size_t (*ws)(const Geo &, int),
               const Geo &g, const int *nondet, int nondet_n, int requested, int *returned, Perf *perf) {
    std::vector<int> all(order, order + order_n);
    for (int a = 0; a < count; a++)
        if (!computed(a)) all.push_back(a);
    int n = 0;
    for (size_t i = 0; i < all.size() && n < requested; i++, n++) {
        Perf &r = perf[n];
        memset(&r, 0, sizeof r);
        r.algo = (Algo)all[i];
        r.status = computed(all[i]) ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
        r.time = r.status == CUDNN_STATUS_SUCCESS ? 0.1f * (float)(i + 1) : -1.0f;
        r.memory = ws(g, all[i]);
        r.determinism = CUDNN_DETERMINISTIC;
        for (int j = 0; j < nondet_n; j++)
            if (nondet[j] == all[i]) r.determinism = CUDNN_NON_DETERMINISTIC;
        r.mathType = g.conv->math;
    }
    *returned = n;
}

size_t no_workspace(const Geo &, int) { return 0; }

// The Create / Destroy pairs: a new object, value-initialised (a descriptor reads as not set).
template <typename T>
cudnnStatus_t make(T **out) {
    if (!out) return CUDNN_STATUS_BAD_PARAM;
    *out = new T{};
    return CUDNN_STATUS_SUCCESS;
}
template <typename T>
cudnnStatus_t destroy(T *p) {
    delete p;
    return CUDNN_STATUS_SUCCESS;
}

bool handle_ok(cudnnHandle_t h) {
    if (!h) return false;
    kit_emu_stream_flush(h->stream);  // the call runs now, after what its stream has queued
    return true;
}

// KIT_EMU_CUDNN_REFUSE=1: every convolution run answers CUDNN_STATUS_NOT_SUPPORTED, as a real cuDNN does when the
// kernel behind an algorithm its heuristics offered cannot take the buffers it is given (tests/test_cuda.c checks
// that the kit then runs the pass on im2col + cuBLAS). Read at each run.
bool refuse_runs() {
    const char *v = getenv("KIT_EMU_CUDNN_REFUSE");
    return v && strcmp(v, "1") == 0;
}

// The Get*WorkspaceSize calls: the bytes algorithm `algo` asks for on these descriptors.
cudnnStatus_t workspace_size(cudnnHandle_t h, const KitEmuDnnTensor *x, const KitEmuDnnFilter *w,
                             const KitEmuDnnConv *conv, const KitEmuDnnTensor *y, bool computed,
                             size_t (*ws)(const Geo &, int), int algo, size_t *bytes) {
    if (!h) return CUDNN_STATUS_NOT_INITIALIZED;
    Geo g;
    cudnnStatus_t st = geometry(x, w, conv, y, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!bytes) return CUDNN_STATUS_BAD_PARAM;
    if (!computed) return CUDNN_STATUS_NOT_SUPPORTED;
    *bytes = ws(g, algo);
    return CUDNN_STATUS_SUCCESS;
}

// The three convolutions, on float32 (N, C, H, W) inputs already read.
// y (N, K, P*Q): per image, w (K, C*R*S) @ cols (C*R*S, P*Q).
std::vector<float> conv_forward(const Geo &g, const std::vector<float> &x, const std::vector<float> &w) {
    const int crs = g.c * g.r * g.s, pq = g.p * g.q;
    std::vector<float> cols((size_t)crs * pq), y((size_t)g.n * g.k * pq);
    for (int n = 0; n < g.n; n++) {
        columns(g, x.data() + (size_t)n * g.c * g.h * g.w, cols.data());
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g.k, pq, crs, 1.0f, w.data(), crs, cols.data(), pq,
                    0.0f, y.data() + (size_t)n * g.k * pq, pq);
    }
    return y;
}

// dx (N, C, H, W): per image, dcols = w^T (C*R*S, K) @ dy (K, P*Q), each column's values added back where
// they were read from.
std::vector<float> conv_backward_data(const Geo &g, const std::vector<float> &w, const std::vector<float> &dy) {
    const int crs = g.c * g.r * g.s, pq = g.p * g.q;
    std::vector<float> dcols((size_t)crs * pq), dx((size_t)g.n * g.c * g.h * g.w, 0.0f);
    for (int n = 0; n < g.n; n++) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, crs, pq, g.k, 1.0f, w.data(), crs,
                    dy.data() + (size_t)n * g.k * pq, pq, 0.0f, dcols.data(), pq);
        float *img = dx.data() + (size_t)n * g.c * g.h * g.w;
        for (int c = 0; c < g.c; c++)
            for (int r = 0; r < g.r; r++)
                for (int s = 0; s < g.s; s++) {
                    const int fr = g.conv->flip ? g.r - 1 - r : r, fs = g.conv->flip ? g.s - 1 - s : s;
                    const float *row = dcols.data() + (((size_t)c * g.r + fr) * g.s + fs) * pq;
                    for (int p = 0; p < g.p; p++)
                        for (int q = 0; q < g.q; q++) {
                            const int ih = p * g.conv->u - g.conv->pad_h + r, iw = q * g.conv->v - g.conv->pad_w + s;
                            if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
                                img[((size_t)c * g.h + ih) * g.w + iw] += row[p * g.q + q];
                        }
                }
    }
    return dx;
}

// dw (K, C*R*S) = the sum over images of dy (K, P*Q) @ cols^T (P*Q, C*R*S).
std::vector<float> conv_backward_filter(const Geo &g, const std::vector<float> &x, const std::vector<float> &dy) {
    const int crs = g.c * g.r * g.s, pq = g.p * g.q;
    std::vector<float> cols((size_t)crs * pq), dw((size_t)g.k * crs, 0.0f);
    for (int n = 0; n < g.n; n++) {
        columns(g, x.data() + (size_t)n * g.c * g.h * g.w, cols.data());
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, g.k, crs, pq, 1.0f, dy.data() + (size_t)n * g.k * pq, pq,
                    cols.data(), pq, 1.0f, dw.data(), crs);
    }
    return dw;
}

void store_tensor(const KitEmuDnnTensor *d, void *p, const std::vector<float> &v, float alpha, float beta) {
    size_t i = 0;
    for (int n = 0; n < d->n; n++)
        for (int c = 0; c < d->c; c++)
            for (int h = 0; h < d->h; h++)
                for (int w = 0; w < d->w; w++, i++)
                    store(d->type, p, n * d->sn + c * d->sc + h * d->sh + w * d->sw, v[i], alpha, beta);
}

}  // namespace

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char *cudnnGetErrorString(cudnnStatus_t status) {
    switch (status) {
    case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
    case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_INTERNAL_ERROR: return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    }
    return "CUDNN_STATUS_UNKNOWN";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle) { return make(handle); }
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) { return destroy(handle); }
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
    if (!handle) return CUDNN_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *desc) { return make(desc); }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) { return destroy(desc); }
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t format, cudnnDataType_t type,
                                         int n, int c, int h, int w) {
    if (!d || n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
    if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_BAD_PARAM;
    if (!known_type(type)) return CUDNN_STATUS_NOT_SUPPORTED;
    const size_t hw = (size_t)h * w;
    *d = format == CUDNN_TENSOR_NCHW ? KitEmuDnnTensor{true, type, n, c, h, w, c * hw, hw, (size_t)w, 1}
                                     : KitEmuDnnTensor{true, type, n, c, h, w, c * hw, 1, (size_t)w * c, (size_t)c};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *desc) { return make(desc); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) { return destroy(desc); }
// (K, C, R, S) filters (CUDNN_TENSOR_NCHW, the kit's weights) and (K, R, S, C) ones (CUDNN_TENSOR_NHWC).
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t type, cudnnTensorFormat_t format,
                                         int k, int c, int h, int w) {
    if (!d || k <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
    if (format != CUDNN_TENSOR_NCHW && format != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_BAD_PARAM;
    if (!known_type(type)) return CUDNN_STATUS_NOT_SUPPORTED;
    const size_t crs = (size_t)c * h * w, rs = (size_t)h * w;
    *d = format == CUDNN_TENSOR_NCHW ? KitEmuDnnFilter{true, type, k, c, h, w, crs, rs, (size_t)w, 1}
                                     : KitEmuDnnFilter{true, type, k, c, h, w, crs, 1, (size_t)w * c, (size_t)c};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *desc) { return make(desc); }
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) { return destroy(desc); }
// Float32 compute only (the PSEUDO configurations for 16-bit data), and no dilation: the emulated subset.
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute_type) {
    if (!d || pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0)
        return CUDNN_STATUS_BAD_PARAM;
    if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_BAD_PARAM;
    if (dilation_h != 1 || dilation_w != 1 || compute_type != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
    *d = KitEmuDnnConv{true, pad_h, pad_w, u, v, mode == CUDNN_CONVOLUTION, d->math};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t math) {
    if (!d || math < CUDNN_DEFAULT_MATH || math > CUDNN_FMA_MATH) return CUDNN_STATUS_BAD_PARAM;
    d->math = math;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                   const cudnnFilterDescriptor_t wDesc,
                                                   const cudnnConvolutionDescriptor_t convDesc,
                                                   const cudnnTensorDescriptor_t yDesc, const int requested,
                                                   int *returned, cudnnConvolutionFwdAlgoPerf_t *perf) {
    if (!handle_ok(handle)) return CUDNN_STATUS_NOT_INITIALIZED;
    Geo g;
    cudnnStatus_t st = geometry(xDesc, wDesc, convDesc, yDesc, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (requested <= 0 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
    const int order[] = {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                         CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM};
    find_list<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, order, 3, fwd_computed, fwd_workspace, g, nullptr, 0, requested, returned,
        perf);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                        const cudnnTensorDescriptor_t dyDesc,
                                                        const cudnnConvolutionDescriptor_t convDesc,
                                                        const cudnnTensorDescriptor_t dxDesc, const int requested,
                                                        int *returned, cudnnConvolutionBwdDataAlgoPerf_t *perf) {
    if (!handle_ok(handle)) return CUDNN_STATUS_NOT_INITIALIZED;
    Geo g;
    cudnnStatus_t st = geometry(dxDesc, wDesc, convDesc, dyDesc, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (requested <= 0 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
    const int order[] = {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1};
    const int nondet[] = {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0};
    find_list<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, order, 2, bwd_data_computed, no_workspace, g, nondet, 1, requested,
        returned, perf);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                          const cudnnTensorDescriptor_t dyDesc,
                                                          const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnFilterDescriptor_t dwDesc, const int requested,
                                                          int *returned, cudnnConvolutionBwdFilterAlgoPerf_t *perf) {
    if (!handle_ok(handle)) return CUDNN_STATUS_NOT_INITIALIZED;
    Geo g;
    cudnnStatus_t st = geometry(xDesc, dwDesc, convDesc, dyDesc, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (requested <= 0 || !returned || !perf) return CUDNN_STATUS_BAD_PARAM;
    const int order[] = {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
                         CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1};
    const int nondet[] = {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3};
    find_list<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, order, 3, bwd_filter_computed, no_workspace, g, nondet, 2, requested,
        returned, perf);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc, cudnnConvolutionFwdAlgo_t algo,
                                                      size_t *bytes) {
    return workspace_size(handle, xDesc, wDesc, convDesc, yDesc, fwd_computed(algo), fwd_workspace, algo, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t *bytes) {
    return workspace_size(handle, dxDesc, wDesc, convDesc, dyDesc, bwd_data_computed(algo), no_workspace, algo, bytes);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t dwDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t *bytes) {
    return workspace_size(handle, xDesc, dwDesc, convDesc, dyDesc, bwd_filter_computed(algo), no_workspace, algo, bytes);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void *x, const cudnnFilterDescriptor_t wDesc, const void *w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void *workspace, size_t workspace_bytes, const void *beta,
                                      const cudnnTensorDescriptor_t yDesc, void *y) {
    if (!handle_ok(handle)) return CUDNN_STATUS_NOT_INITIALIZED;
    if (refuse_runs()) return CUDNN_STATUS_NOT_SUPPORTED;
    Geo g;
    cudnnStatus_t st = geometry(xDesc, wDesc, convDesc, yDesc, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!fwd_computed(algo)) return CUDNN_STATUS_NOT_SUPPORTED;
    if (!alpha || !beta || !x || !w || !y || workspace_bytes < fwd_workspace(g, algo) || (workspace_bytes && !workspace))
        return CUDNN_STATUS_BAD_PARAM;
    std::vector<float> out = conv_forward(g, read_tensor(xDesc, x, g.tf32), read_filter(wDesc, w, g.tf32));
    store_tensor(yDesc, y, out, *(const float *)alpha, *(const float *)beta);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha, const cudnnFilterDescriptor_t wDesc,
                                           const void *w, const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void *workspace,
                                           size_t workspace_bytes, const void *beta,
                                           const cudnnTensorDescriptor_t dxDesc, void *dx) {
    if (!handle_ok(handle)) return CUDNN_STATUS_NOT_INITIALIZED;
    if (refuse_runs()) return CUDNN_STATUS_NOT_SUPPORTED;
    Geo g;
    cudnnStatus_t st = geometry(dxDesc, wDesc, convDesc, dyDesc, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!bwd_data_computed(algo)) return CUDNN_STATUS_NOT_SUPPORTED;
    if (!alpha || !beta || !w || !dy || !dx || (workspace_bytes && !workspace)) return CUDNN_STATUS_BAD_PARAM;
    std::vector<float> out = conv_backward_data(g, read_filter(wDesc, w, g.tf32), read_tensor(dyDesc, dy, g.tf32));
    store_tensor(dxDesc, dx, out, *(const float *)alpha, *(const float *)beta);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void *x,
                                             const cudnnTensorDescriptor_t dyDesc, const void *dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void *workspace,
                                             size_t workspace_bytes, const void *beta,
                                             const cudnnFilterDescriptor_t dwDesc, void *dw) {
    if (!handle_ok(handle)) return CUDNN_STATUS_NOT_INITIALIZED;
    if (refuse_runs()) return CUDNN_STATUS_NOT_SUPPORTED;
    Geo g;
    cudnnStatus_t st = geometry(xDesc, dwDesc, convDesc, dyDesc, &g);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    if (!bwd_filter_computed(algo)) return CUDNN_STATUS_NOT_SUPPORTED;
    if (!alpha || !beta || !x || !dy || !dw || (workspace_bytes && !workspace)) return CUDNN_STATUS_BAD_PARAM;
    std::vector<float> out = conv_backward_filter(g, read_tensor(xDesc, x, g.tf32), read_tensor(dyDesc, dy, g.tf32));
    const float a = *(const float *)alpha, b = *(const float *)beta;
    size_t i = 0;
    for (int k = 0; k < g.k; k++)
        for (int c = 0; c < g.c; c++)
            for (int r = 0; r < g.r; r++)
                for (int s = 0; s < g.s; s++, i++) store(dwDesc->type, dw, filter_at(dwDesc, k, c, r, s), out[i], a, b);
    return CUDNN_STATUS_SUCCESS;
}

}  // extern "C"
