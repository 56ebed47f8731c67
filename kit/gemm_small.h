// kit/gemm_small.h: the product of a matrix packed once with a matrix of few columns, for batch-1 inference on the
// CPU (internal to the kit; kit/gemm_small.c).
//
// At batch 1 a late conv layer's GEMM has few columns (16 for a 4 x 4 map) against millions of weights, and
// OpenBLAS packs the whole weight matrix on every call: perf put that packing at 38% of ResNet-9's batch-1 forward,
// more than its multiplications. An inference model's weights are fixed, so they are packed ONCE here (gemm_pack),
// and gemm_small multiplies straight from the packed panels.
#ifndef KIT_GEMM_SMALL_H
#define KIT_GEMM_SMALL_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Rows per panel of the packed matrix.
#define GEMM_PANEL 16
// Up to this many columns gemm_small is the faster route (kit/ops_cpu.c, kit/winograd.c choose by it).
#define GEMM_SMALL_MAX_COLS 64

// True when this CPU runs gemm_small's kernel (AVX2 and FMA, checked at run time: the kit is built for x86-64-v2).
bool gemm_small_available(void);
// Floats of the packed form of an (m, k) matrix: m rounded up to whole panels, times k.
size_t gemm_packed_floats(int m, int k);
// wp = a (m, k), row-major with rows lda apart, as panels (ceil(m / 16), k, 16): panel p, column c holds rows
// 16p .. 16p + 15 of column c (0 past row m).
void gemm_pack(int m, int k, const float *a, int lda, float *wp);
// y[i][j] = bias[i] (0 when bias is NULL) + sum over c = 0 .. k-1, in that order, of a[i][c] * x[c][j] (one fused
// multiply-add per term), for the rows of panels p0 .. p1 - 1 and every column j < n; x (k, n) with rows ldx apart,
// y rows ldy apart. Each element's arithmetic is the same whatever n, the panels or the thread computing it.
void gemm_small(int m, int n, int k, const float *wp, const float *x, int ldx, const float *bias, float *y, int ldy,
                int p0, int p1);

#ifdef __cplusplus
}
#endif

#endif
