// kit/cuda/loss.cu: softmax cross-entropy (with label smoothing) and argmax, one thread per row.
// Rows are short (10 or 100 classes) and there are at most a few thousand of them, so a thread per row
// is plenty, and it keeps the CPU's exact order of operations (double accumulators) for close results.
#include "kit/cuda/cuda_internal.h"
#include "kit/ops_impl.h"

namespace {

// log(sum_j exp(l_j)) as m + log(sum_j exp(l_j - m)), m = max l_j: no overflow, no underflow of the
// largest term.
__device__ double row_logsumexp(int k, const float *l) {
    float m = l[0];
    for (int j = 1; j < k; j++) m = l[j] > m ? l[j] : m;
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += exp((double)l[j] - m);
    return m + log(sum);
}

// A label outside [0, k) would index outside the row: record the first one seen in `bad`
// ([row + 1 (0 = none), label], this thread's cuda_device_flags()) and leave the row alone.
__device__ bool label_ok(int i, int label, int k, int *bad) {
    if (label >= 0 && label < k) return true;
    if (atomicCAS(&bad[0], 0, i + 1) == 0) bad[1] = label;
    return false;
}

// loss = -sum_j target_j * log softmax_j with target = (1 - s) * onehot(label) + s / K
//      = lse - (1 - s) * l_label - s * mean_j(l_j)
__global__ void ce_forward_kernel(int n, int k, const float *logits, const int *labels, float smoothing,
                                  float *loss, int *bad) {
    KIT_GRID_LOOP(i, (size_t)n) {
        const float *l = logits + i * k;
        if (!label_ok((int)i, labels[i], k, bad)) {
            loss[i] = NAN;
            continue;
        }
        double lse = row_logsumexp(k, l);
        double mean_l = 0.0;
        for (int j = 0; j < k; j++) mean_l += l[j];
        mean_l /= k;
        loss[i] = (float)(lse - (1.0 - smoothing) * l[labels[i]] - smoothing * mean_l);
    }
}

// dlogits += scale * (softmax - target)
__global__ void ce_backward_kernel(int n, int k, const float *logits, const int *labels, float smoothing,
                                   float scale, float *dlogits, int *bad) {
    KIT_GRID_LOOP(i, (size_t)n) {
        if (!label_ok((int)i, labels[i], k, bad)) continue;
        const float *l = logits + i * k;
        float *g = dlogits + i * k;
        double lse = row_logsumexp(k, l);
        double off = (double)smoothing / k;  // the smoothed target's share on every class
        for (int j = 0; j < k; j++) {
            double target = off + (j == labels[i] ? 1.0 - smoothing : 0.0);
            g[j] += (float)(scale * (exp((double)l[j] - lse) - target));
        }
    }
}

__global__ void argmax_kernel(int n, int k, const float *logits, int *pred) {
    KIT_GRID_LOOP(i, (size_t)n) {
        const float *l = logits + i * k;
        int best = 0;
        for (int j = 1; j < k; j++)
            if (l[j] > l[best]) best = j;  // strict: the first maximum wins ties, as on the CPU
        pred[i] = best;
    }
}

void ce_check(int n, int k, float smoothing) {
    CHECK(n > 0 && k > 0, "cross_entropy: n and k must be positive");
    CHECK(smoothing >= 0.0f && smoothing <= 1.0f, "cross_entropy: label smoothing must be in [0, 1]");
}

int *bad_label_reset(void) {
    int *flags = cuda_device_flags();
    CUDA_CHECK(cudaMemsetAsync(flags, 0, 2 * sizeof(int), cuda_stream()));
    return flags;
}

// The labels live on the GPU, so they are checked there; reading the flag waits for the kernel. That is
// one short stall per call, the price of the same clear error the CPU gives instead of a silent NaN.
void bad_label_report(const int *flags, int k) {
    int bad[2] = {0, 0};
    cudaStream_t st = cuda_stream();
    CUDA_CHECK(cudaMemcpyAsync(bad, flags, sizeof bad, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    // bad[0]: 1 + the first sample whose label is outside [0, k) (0: none), bad[1]: its label.
    CHECKF(bad[0] == 0, "the dataset has more classes than the model's output: check --classes / the model config",
           "sample %d has label %d, but there are %d classes", bad[0] - 1, bad[1], k);
}

}  // namespace

extern "C" void cross_entropy_forward_cuda(int n, int k, const float *logits, const int *labels, float smoothing,
                                           float *loss) {
    ce_check(n, k, smoothing);
    KIT_CHECK_PTR(logits);
    KIT_CHECK_PTR(labels);
    KIT_CHECK_PTR(loss);
    int *flags = bad_label_reset();
    KIT_LAUNCH(ce_forward_kernel, (size_t)n, n, k, logits, labels, smoothing, loss, flags);
    bad_label_report(flags, k);
}

extern "C" void cross_entropy_backward_cuda(int n, int k, const float *logits, const int *labels,
                                            float smoothing, float scale, float *dlogits) {
    ce_check(n, k, smoothing);
    KIT_CHECK_PTR(logits);
    KIT_CHECK_PTR(labels);
    KIT_CHECK_PTR(dlogits);
    int *flags = bad_label_reset();
    KIT_LAUNCH(ce_backward_kernel, (size_t)n, n, k, logits, labels, smoothing, scale, dlogits, flags);
    bad_label_report(flags, k);
}

extern "C" void argmax_rows_cuda(int n, int k, const float *logits, int *pred) {
    CHECK(n > 0 && k > 0, "argmax_rows: n and k must be positive");
    KIT_CHECK_PTR(logits);
    KIT_CHECK_PTR(pred);
    KIT_LAUNCH(argmax_kernel, (size_t)n, n, k, logits, pred);
}
