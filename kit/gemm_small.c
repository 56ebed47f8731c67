// kit/gemm_small.c: y = a @ x + bias for a matrix `a` packed once (gemm_pack) and an x of few columns (see
// gemm_small.h). The kernel keeps a 16 x 6 block of y in twelve 8-float registers and walks the shared dimension
// once, reading one packed column of a (16 floats, contiguous) and broadcasting 6 values of x per step: 12 fused
// multiply-adds per 8 loads, and a panel of a (16 x k floats) stays in the cache while every column block uses it.
// AVX2 + FMA only, chosen at run time; gemm_small_available() says whether the caller may use it.
#include "kit/gemm_small.h"

#include <string.h>

#include "kit/check.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GEMM_SMALL_X86 1
#endif

bool gemm_small_available(void) {
#ifdef GEMM_SMALL_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

size_t gemm_packed_floats(int m, int k) {
    return (size_t)((m + GEMM_PANEL - 1) / GEMM_PANEL) * GEMM_PANEL * (size_t)k;
}

void gemm_pack(int m, int k, const float *a, int lda, float *wp) {
    CHECK(m > 0 && k > 0 && lda >= k, "gemm_pack: needs m, k > 0 and lda >= k");
    const int panels = (m + GEMM_PANEL - 1) / GEMM_PANEL;
    for (int p = 0; p < panels; p++) {
        float *dst = wp + (size_t)p * k * GEMM_PANEL;
        for (int r = 0; r < GEMM_PANEL; r++) {
            const int i = p * GEMM_PANEL + r;
            for (int c = 0; c < k; c++) dst[(size_t)c * GEMM_PANEL + r] = i < m ? a[(size_t)i * lda + c] : 0.0f;
        }
    }
}

#ifdef GEMM_SMALL_X86
// The 16 x NB block of y for columns x[., 0 .. NB-1] (NB = 6, 4 or 1), into t (NB, 16): the accumulators are named
// variables, so that they live in registers (an array indexed in a loop went to memory: 4x slower).
#define GEMM_STEP(j, lo, hi)                              \
    do {                                                  \
        const __m256 xb = _mm256_broadcast_ss(xc + (j));  \
        lo = _mm256_fmadd_ps(w0, xb, lo);                 \
        hi = _mm256_fmadd_ps(w1, xb, hi);                 \
    } while (0)
#define GEMM_STORE(j, lo, hi)                  \
    do {                                       \
        _mm256_storeu_ps(t + 16 * (j), lo);     \
        _mm256_storeu_ps(t + 16 * (j) + 8, hi); \
    } while (0)

__attribute__((target("avx2,fma"))) static void gemm_block6(int k, const float *wp, const float *x, int ldx, float *t) {
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0, a4 = a0, b4 = a0;
    __m256 a5 = a0, b5 = a0;
    for (int c = 0; c < k; c++) {
        const float *wc = wp + (size_t)c * GEMM_PANEL;
        const __m256 w0 = _mm256_loadu_ps(wc), w1 = _mm256_loadu_ps(wc + 8);
        const float *xc = x + (size_t)c * ldx;
        GEMM_STEP(0, a0, b0);
        GEMM_STEP(1, a1, b1);
        GEMM_STEP(2, a2, b2);
        GEMM_STEP(3, a3, b3);
        GEMM_STEP(4, a4, b4);
        GEMM_STEP(5, a5, b5);
    }
    GEMM_STORE(0, a0, b0);
    GEMM_STORE(1, a1, b1);
    GEMM_STORE(2, a2, b2);
    GEMM_STORE(3, a3, b3);
    GEMM_STORE(4, a4, b4);
    GEMM_STORE(5, a5, b5);
}

__attribute__((target("avx2,fma"))) static void gemm_block4(int k, const float *wp, const float *x, int ldx, float *t) {
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
    for (int c = 0; c < k; c++) {
        const float *wc = wp + (size_t)c * GEMM_PANEL;
        const __m256 w0 = _mm256_loadu_ps(wc), w1 = _mm256_loadu_ps(wc + 8);
        const float *xc = x + (size_t)c * ldx;
        GEMM_STEP(0, a0, b0);
        GEMM_STEP(1, a1, b1);
        GEMM_STEP(2, a2, b2);
        GEMM_STEP(3, a3, b3);
    }
    GEMM_STORE(0, a0, b0);
    GEMM_STORE(1, a1, b1);
    GEMM_STORE(2, a2, b2);
    GEMM_STORE(3, a3, b3);
}

__attribute__((target("avx2,fma"))) static void gemm_block1(int k, const float *wp, const float *x, int ldx, float *t) {
    __m256 a0 = _mm256_setzero_ps(), b0 = a0;
    for (int c = 0; c < k; c++) {
        const float *wc = wp + (size_t)c * GEMM_PANEL;
        const __m256 w0 = _mm256_loadu_ps(wc), w1 = _mm256_loadu_ps(wc + 8);
        const float *xc = x + (size_t)c * ldx;
        GEMM_STEP(0, a0, b0);
    }
    GEMM_STORE(0, a0, b0);
}

// Panel p of y: blocks of 6 columns, then of 4, then single ones (16 = 6 + 6 + 4; 64 = 10 x 6 + 4).
static void gemm_panel(int m, int n, int k, int p, const float *wp, const float *x, int ldx, const float *bias,
                       float *y, int ldy) {
    const float *panel = wp + (size_t)p * k * GEMM_PANEL;
    const int r0 = p * GEMM_PANEL, rows = m - r0 < GEMM_PANEL ? m - r0 : GEMM_PANEL;
    for (int j0 = 0; j0 < n;) {
        const int nb = n - j0 >= 6 ? 6 : n - j0 >= 4 ? 4 : 1;
        float t[6 * GEMM_PANEL];  // (nb, 16): the block column by column, then out to y's rows
        if (nb == 6) gemm_block6(k, panel, x + j0, ldx, t);
        else if (nb == 4) gemm_block4(k, panel, x + j0, ldx, t);
        else gemm_block1(k, panel, x + j0, ldx, t);
        for (int r = 0; r < rows; r++) {
            const float b = bias ? bias[r0 + r] : 0.0f;
            float *yr = y + (size_t)(r0 + r) * ldy + j0;
            for (int j = 0; j < nb; j++) yr[j] = b + t[16 * j + r];
        }
        j0 += nb;
    }
}
#endif

void gemm_small(int m, int n, int k, const float *wp, const float *x, int ldx, const float *bias, float *y, int ldy,
                int p0, int p1) {
#ifdef GEMM_SMALL_X86
    for (int p = p0; p < p1; p++) gemm_panel(m, n, k, p, wp, x, ldx, bias, y, ldy);
#else
    (void)m, (void)n, (void)k, (void)wp, (void)x, (void)ldx, (void)bias, (void)y, (void)ldy, (void)p0, (void)p1;
    die("gemm_small: not built for this CPU (gemm_small_available() is false here)");
#endif
}
