// syncbn.c: lesson 05, batch norm over the GLOBAL batch of a data-parallel run. What you write is marked TODO:
//
//   TODO 1  syncbn_forward_train   local sums -> ONE all-reduce of 2C + 1 doubles -> the global mean and variance
//   TODO 2  syncbn_backward        the all-reduce of sum(dy) and sum(dy * xhat) that makes dx the global one
//   TODO 3  syncbn_update_running  running statistics from the global batch: identical on every rank
//   TODO 4  (in TODO 1 and 2)      ranks may hold different numbers of images: the count is all-reduced too
//   TODO 5  syncbn_convert         one call puts SyncBN into every BN layer of a model
//
// The kit's model calls syncbn_forward_train and syncbn_backward for every BN layer once syncbn_convert has
// installed them (Model.bn_ops). On a GPU the kit's own CUDA batch norm runs instead, with syncbn_allreduce as
// its all-reduce (Model.bn_ops->sync): the same arithmetic, which the autograder compares yours against on the CPU.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/log.h"
#include "lesson.h"

// ---------------------------------------------------------------- given

void syncbn_allreduce(SyncBn *sb, double *buf, int n) {
    double start = time_now();
    pg_allreduce_sum_double_host(sb->pg, buf, n);
    sb->seconds += time_now() - start;
    sb->allreduces++;
    sb->bytes += (double)n * sizeof(double);
}

// The kit's CUDA batch norm calls this with its 2C + 1 statistics, already copied to the host.
static void syncbn_hook(double *host_buf, int n, void *ctx) { syncbn_allreduce((SyncBn *)ctx, host_buf, n); }

void syncbn_free(SyncBn *sb, Model *m) {
    if (!sb) return;
    if (m && m->bn_ops == &sb->ops) model_set_bn_ops(m, NULL);
    free(sb->buf);
    free(sb);
}

// ---------------------------------------------------------------- TODO 3: running statistics

// TODO 3: PyTorch's rule: running = (1 - momentum) * running + momentum * batch, where the batch variance kept
//   is the UNBIASED one (var_biased * count / (count - 1)) and count is the number of values over ALL ranks.
//   Computed from global numbers, the result is the same on every rank: eval mode then needs no
//   communication, and the checkpoint that rank 0 saves holds every rank's statistics.
void syncbn_update_running(float momentum, double mean, double var_biased, double count, float *running_mean,
                           float *running_var) {
    (void)momentum, (void)mean, (void)var_biased, (void)count, (void)running_mean, (void)running_var;
}

// ---------------------------------------------------------------- TODO 1 + 4: forward

// TODO 1: y = gamma * (x - mean) * invstd + beta per channel, with mean and invstd = 1 / sqrt(var + eps) of
//   the values of the channel over (N, HW) on EVERY rank. Plan:
//   - per channel c, this rank's sum of x and sum of x^2, in sb->buf: [sum x (C), sum x^2 (C), count (1)]
//     (the layout of the kit's hook, kit/ops.h). Mind what these sums do to the variance E[x^2] - E[x]^2 when
//     the mean is large against the spread: README section 2 (the autograder tries mean 1e3, std 1e-2).
//   - ONE syncbn_allreduce of the 2C + 1 values: one message per layer, not three.
//   - mean and the biased variance (what normalises the batch, as PyTorch) from the global sums; a rounding
//     can make a constant channel's variance a hair below 0.
//   - keep mean and invstd for backward, update the running statistics (TODO 3), then normalise x.
// TODO 4: the count is part of the all-reduce: the last batch of an epoch may leave ranks with different
//   numbers of images, so world * (N * HW) is not the global count.
void syncbn_forward_train(void *ctx, const BatchNormDims *s, const float *x, const float *gamma, const float *beta,
                          float *y, float *mean, float *invstd, float *running_mean, float *running_var) {
    SyncBn *sb = ctx;
    const int C = s->c;
    const size_t hw = (size_t)s->hw;
    CHECK(C <= sb->max_c, "syncbn: a BN layer wider than the model syncbn_convert saw");
    double *buf = sb->buf;  // (2C + 1)
    (void)buf, (void)x, (void)gamma, (void)beta, (void)running_mean, (void)running_var;
    memset(y, 0, (size_t)s->n * (size_t)C * hw * sizeof *y);
    memset(mean, 0, (size_t)C * sizeof *mean);
    memset(invstd, 0, (size_t)C * sizeof *invstd);
}

// ---------------------------------------------------------------- TODO 2: backward

// TODO 2: with xhat = (x - mean) * invstd and M values per channel over ALL ranks:
//     dbeta  += sum dy                 dgamma += sum dy * xhat        (this rank's sums: see lesson.h)
//     dx     += gamma * invstd * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M)
//   The two sums in dx are over the global batch: every image's normalisation depended on every other
//   image's values through the mean and variance, on every rank. One syncbn_allreduce of
//   [sum dy (C), sum dy * xhat (C), count (1)] (TODO 4: the count again; backward has no other way to know M).
//   Sum in double, as in forward. When dx is NULL nothing global is needed: return before the all-reduce
//   (every rank's model is the same, so every rank skips it alike).
void syncbn_backward(void *ctx, const BatchNormDims *s, const float *x, const float *gamma, const float *mean,
                     const float *invstd, const float *dy, float *dx, float *dgamma, float *dbeta) {
    SyncBn *sb = ctx;
    const int C = s->c;
    const size_t hw = (size_t)s->hw;
    CHECK(C <= sb->max_c, "syncbn: a BN layer wider than the model syncbn_convert saw");
    double *buf = sb->buf;  // (2C + 1)
    (void)buf, (void)hw, (void)x, (void)gamma, (void)mean, (void)invstd, (void)dy, (void)dx, (void)dgamma,
    (void)dbeta;
}

// ---------------------------------------------------------------- TODO 5: converting a model

// TODO 5: make every BN layer of m use SyncBN over pg, and return the SyncBn that they use:
//   - the all-reduce buffer, sized for the widest BN layer of the model (m->layers[i].kind == LAYER_BN,
//     its channels in .c): 2C + 1 doubles;
//   - sb->ops, installed with model_set_bn_ops (Model.bn_ops): on the CPU the model's BN layers call your
//     syncbn_forward_train and syncbn_backward, with sb as their ctx;
//   - on a GPU the kit's CUDA batch norm runs, with sb->ops.sync as its all-reduce: syncbn_hook calls
//     syncbn_allreduce, so the communication is counted the same way.
//   Call it on every rank, BEFORE the initial broadcast and before the gradient buckets (train.c): README
//   section 5 says why.
SyncBn *syncbn_convert(Model *m, ProcessGroup *pg) {
    CHECK(m->on_grads_ready == NULL, "syncbn_convert after the gradient buckets were attached: convert the model "
                                     "first (README section 5), then broadcast it and build the buckets");
    SyncBn *sb = xcalloc(1, sizeof *sb);
    sb->pg = pg;
    (void)syncbn_hook;
    return sb;
}
