// kit/winograd.c: Winograd F(2x2, 3x3) for the 3x3, stride 1, pad 1 convolutions of the CPU path: a 2x2 block of
// outputs from a 4x4 input tile, Y = A^T [(G g G^T) .* (B^T d B)] A, with 16 multiplies per channel pair instead
// of 36, batched into 16 GEMMs per group of images. The input gradient is the same routine with the filter
// rotated and K, C swapped; the weight gradient is its adjoint. The derivation, the error bound (about 7-15x
// the direct conv's per term, checked by tests/test_ops.c) and the threading rules are in kit/WINOGRAD.md.
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/gemm_small.h"
#include "kit/winograd.h"

// Below this many channels on either side the GEMMs are too shallow to pay for the transforms
// (the first layer of a net has 1 or 3 input channels).
#define WINO_MIN_CHANNELS 16
// Tiles per GEMM: enough columns for OpenBLAS's full speed (late layers have 4 tiles per image, so a
// thread groups images until it has this many)...
#define WINO_TARGET_TILES 256
// ...but one thread's V and M together stay under this many floats (8 MiB).
#define WINO_MAX_THREAD_FLOATS ((size_t)2 << 20)

// The output transform works through the tiles in blocks of this many (its scratch: 8 rows of a block).
#define WINO_OUT_BLOCK 256
// Per thread, for the transforms: the input's padded image and 4 rows (2*th + 6 rows of 2*tw + 2), the output
// gradient's 10 rows of tiles, or the output transform's 8 rows of a block.
#define WINO_MAX3(a, b, c) ((a) > (b) ? ((a) > (c) ? (a) : (c)) : ((b) > (c) ? (b) : (c)))
#define WINO_SCRATCH(th, tw) \
    WINO_MAX3((2 * (size_t)(th) + 6) * (2 * (size_t)(tw) + 2), 10 * (size_t)(th) * (tw), 8 * (size_t)WINO_OUT_BLOCK)

bool winograd_eligible(const Conv2dDims *s) {
    return s->r == 3 && s->stride == 1 && s->pad == 1 && s->c >= WINO_MIN_CHANNELS && s->k >= WINO_MIN_CHANNELS;
}

// The forward also needs maps of 8 x 8 or more: at 4 x 4 one image cannot pay for transforming every filter
// anew. A rule on the shape alone, never the batch, so an image's numbers never depend on its batch
// (kit/WINOGRAD.md, "Which layers").
#define WINO_FWD_MIN_PIXELS 64

bool winograd_forward_eligible(const Conv2dDims *s) {
    return winograd_eligible(s) && s->h * s->w >= WINO_FWD_MIN_PIXELS;
}

bool winograd_enabled(void) {
    // getenv on every call (cheap next to a convolution) so a test or benchmark can switch it mid-run.
    const char *v = getenv("KIT_WINOGRAD");
    return !(v && strcmp(v, "0") == 0);
}

// One run: an n-image, cin -> cout, 3x3 pad 1 convolution of h x w images, and how it is cut up.
typedef struct {
    int n, cin, cout, h, w;
    int th, tw;           // 2x2 output tiles per column, per row (odd sizes: the last tile overhangs)
    size_t tiles;         // per image: th * tw
    int group;            // images per GEMM
    int chunks;           // ceil(n / group)
    int threads;          // OpenMP threads = per-thread slices of work
    size_t thread_floats; // per thread: V (16, cin, group*tiles), M (16, cout, group*tiles), row scratch
} WinoPlan;

static WinoPlan wino_plan_for(int n, int cin, int cout, int h, int w, int threads) {
    WinoPlan pl = {.n = n, .cin = cin, .cout = cout, .h = h, .w = w};
    pl.th = (h + 1) / 2;
    pl.tw = (w + 1) / 2;
    pl.tiles = (size_t)pl.th * (size_t)pl.tw;
    if (threads > n) threads = n;
    if (threads < 1) threads = 1;
    size_t g = (WINO_TARGET_TILES + pl.tiles - 1) / pl.tiles;
    if (g > (size_t)((n + threads - 1) / threads)) g = (size_t)((n + threads - 1) / threads);
    const size_t per_image = 16 * (size_t)(cin + cout) * pl.tiles;
    while (g > 1 && g * per_image > WINO_MAX_THREAD_FLOATS) g--;
    pl.group = (int)g;
    pl.chunks = (n + pl.group - 1) / pl.group;
    pl.threads = threads < pl.chunks ? threads : pl.chunks;
    pl.thread_floats = g * per_image + WINO_SCRATCH(pl.th, pl.tw);
    return pl;
}

static int wino_call_threads(void) {
    int t = omp_get_max_threads(), procs = omp_get_num_procs();
    return t < procs ? t : procs;
}

// Layout of work: U (16, cout, cin), shared, then one slice per thread. Forward and input gradient swap
// cin and cout, which leaves every size the same; the weight gradient needs one dU (16, K, C) per thread
// (thread 0's where U is, the others' after it), then the same slices (V and Yhat in place of V and M).
// The maximum over thread budgets, as conv2d_work_floats_cpu.
// A budget of t threads uses at most t slices, and a smaller batch never a larger group: so t slices of
// this batch's size fit every smaller batch too.
size_t winograd_work_floats(const Conv2dDims *s) {
    size_t most = 0;
    for (int t = 1; t <= omp_get_num_procs(); t++) {
        WinoPlan pl = wino_plan_for(s->n, s->c, s->k, s->h, s->w, t);
        size_t need = (size_t)t * (16 * (size_t)s->k * s->c + pl.thread_floats);
        if (need > most) most = need;
    }
    return most;
}

// u (16 floats, stride `ld` apart) = G g G^T for one 3x3 filter g whose element (i, j) is g[i*si + j*sj]
// (si, sj negative walk it backwards: the 180-degree rotation of the input gradient).
static void wino_filter_tile(const float *g, ptrdiff_t si, ptrdiff_t sj, float *u, size_t ld) {
    float t[4][3];  // G g: rows of G applied to each column of g
    for (int j = 0; j < 3; j++) {
        const float g0 = g[j * sj], g1 = g[si + j * sj], g2 = g[2 * si + j * sj];
        t[0][j] = g0;
        t[1][j] = 0.5f * (g0 + g1 + g2);
        t[2][j] = 0.5f * (g0 - g1 + g2);
        t[3][j] = g2;
    }
    for (int i = 0; i < 4; i++) {  // (G g) G^T: the same on each row
        u[(size_t)(4 * i + 0) * ld] = t[i][0];
        u[(size_t)(4 * i + 1) * ld] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
        u[(size_t)(4 * i + 2) * ld] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
        u[(size_t)(4 * i + 3) * ld] = t[i][2];
    }
}

// Filters transformed per block of input channels: their 16 values each go to a small buffer first, then
// to U one plane at a time. Written straight to U, every filter's 16 values land in 16 planes that lie
// cout * cin floats apart (a power of two: 512 KB for 256 -> 512 channels), so they share the cache's sets
// and miss: that made the transform of a 256 -> 512 layer 3x slower than its whole im2col forward at batch 1.
#define WINO_FILTER_BLOCK 64

// U (16, cout, cin) from w (K, C, 3, 3): forward (cout = K, cin = C) or flipped (cout = C, cin = K).
static void wino_filters(const WinoPlan *pl, const float *w, bool flipped, float *u) {
    const size_t ld = (size_t)pl->cout * pl->cin;
#pragma omp for schedule(static)
    for (int o = 0; o < pl->cout; o++) {
        for (int i0 = 0; i0 < pl->cin; i0 += WINO_FILTER_BLOCK) {
            const int nb = pl->cin - i0 < WINO_FILTER_BLOCK ? pl->cin - i0 : WINO_FILTER_BLOCK;
            float block[16 * WINO_FILTER_BLOCK];  // (16, nb), rows WINO_FILTER_BLOCK long
            for (int i = i0; i < i0 + nb; i++) {
                if (!flipped) {
                    wino_filter_tile(w + ((size_t)o * pl->cin + i) * 9, 3, 1, block + (i - i0), WINO_FILTER_BLOCK);
                } else {  // w'[o = c][i = k] = w[k][c] rotated: start at its last element, walk backwards
                    wino_filter_tile(w + ((size_t)i * pl->cout + o) * 9 + 8, -3, -1, block + (i - i0),
                                     WINO_FILTER_BLOCK);
                }
            }
            for (int e = 0; e < 16; e++)
                memcpy(u + e * ld + (size_t)o * pl->cin + i0, block + e * WINO_FILTER_BLOCK, (size_t)nb * sizeof(float));
        }
    }
}

// V (16, cin, cols) for images x (g, cin, h, w): tile t = (image, ti, tj) reads rows 2ti-1..2ti+2 and
// columns 2tj-1..2tj+2 (0 outside the image: the padding) and stores B^T d B in column t.
// Each channel is first copied into a zero-padded image whose rows are stored split by column parity,
// [even padded columns | odd ones] (tw + 1 each): tile tj's four columns 2tj .. 2tj+3 are then even[tj],
// odd[tj], even[tj+1], odd[tj+1], so every loop below reads memory in order (no stride-2 loads, which cost
// the compiler a shuffle per vector) and the padding is written once per call, not once per row of tiles.
// Then a row of tiles at a time: B^T down the columns of its 4 rows, B along them.
// `scratch` holds the padded image, (2*th + 2) rows of 2*tw + 2, then 4 rows of 2*tw + 2 (WINO_SCRATCH).
// Only input channels c0 .. c1 - 1 (threads sharing one image take a range each: the same values).
static void wino_inputs_range(const WinoPlan *pl, const float *x, int g, float *v, size_t cols, float *scratch,
                              int c0, int c1) {
    const int H = pl->h, W = pl->w, TW = pl->tw, RW = 2 * TW + 2;  // padded row: columns -1 .. 2*tw
    const size_t ld = (size_t)pl->cin * cols;
    float *pad = scratch, *r[4];
    for (int i = 0; i < 4; i++) r[i] = pad + (size_t)(2 * pl->th + 2 + i) * RW;
    memset(pad, 0, (size_t)(2 * pl->th + 2) * RW * sizeof(float));  // the interior is overwritten below
    for (int n = 0; n < g; n++) {
        for (int c = c0; c < c1; c++) {
            const float *xc = x + ((size_t)n * pl->cin + c) * H * W;
            float *vc = v + (size_t)c * cols + (size_t)n * pl->tiles;
            for (int row = 0; row < H; row++) {  // image column q is padded column q + 1
                const float *restrict src = xc + (size_t)row * W;
                float *restrict even = pad + (size_t)(row + 1) * RW, *restrict odd = even + TW + 1;
#pragma omp simd
                for (int m = 0; m < W / 2; m++) {
                    odd[m] = src[2 * m];
                    even[m + 1] = src[2 * m + 1];
                }
                if (W % 2) odd[W / 2] = src[W - 1];
            }
            for (int ti = 0; ti < pl->th; ti++) {
                const float *d0 = pad + (size_t)(2 * ti) * RW, *d1 = d0 + RW, *d2 = d1 + RW, *d3 = d2 + RW;
#pragma omp simd
                for (int j = 0; j < RW; j++) {  // B^T d, down each column (in both halves alike)
                    r[0][j] = d0[j] - d2[j];
                    r[1][j] = d1[j] + d2[j];
                    r[2][j] = d2[j] - d1[j];
                    r[3][j] = d1[j] - d3[j];
                }
                float *dst = vc + (size_t)ti * TW;
                for (int i = 0; i < 4; i++) {  // (B^T d) B, along each row
                    const float *restrict even = r[i], *restrict odd = r[i] + TW + 1;
                    float *restrict v0 = dst + (size_t)(4 * i) * ld, *restrict v1 = v0 + ld;
                    float *restrict v2 = v1 + ld, *restrict v3 = v2 + ld;
#pragma omp simd
                    for (int tj = 0; tj < TW; tj++) {
                        const float a0 = even[tj], a1 = odd[tj], a2 = even[tj + 1], a3 = odd[tj + 1];
                        v0[tj] = a0 - a2;
                        v1[tj] = a1 + a2;
                        v2[tj] = a2 - a1;
                        v3[tj] = a1 - a3;
                    }
                }
            }
        }
    }
}

static void wino_inputs(const WinoPlan *pl, const float *x, int g, float *v, size_t cols, float *scratch) {
    wino_inputs_range(pl, x, g, v, cols, scratch, 0, pl->cin);
}

// y (g, cout, h, w) from M (16, cout, cols): Y = A^T m A per tile, plus the bias (overwrite) or added
// onto y (accumulate). An overhanging tile's outputs outside the image are dropped. First for every tile of
// the group, per output channel, in long loops along M's rows (the compiler vectorises them whole): A^T down
// each column of the tiles into `scratch`, then A along its rows, whose 4 results per tile overwrite M[0..3]
// (M is not needed after). A loop reads at most 4 of M's 16 rows: they lie a power-of-two apart on large maps,
// and 16 streams at once fall into the same cache sets. Then into y a row of tiles at a time: tile (ti, tj)'s
// result (a, b) is y[2ti+a][2tj+b].
// Only output channels k0 .. k1 - 1 (threads sharing one image take a range each: the same values).
static void wino_outputs_range(const WinoPlan *pl, float *m, int g, size_t cols, const float *b, bool accumulate,
                               float *y, float *scratch, int k0, int k1) {
    const int H = pl->h, W = pl->w, TW = pl->tw;
    const size_t ld = (size_t)pl->cout * cols;
    for (int k = k0; k < k1; k++) {
        float *mk = m + (size_t)k * cols;  // M[e][k][t] = mk[e * ld + t]
        for (size_t t0 = 0; t0 < cols; t0 += WINO_OUT_BLOCK) {
            const size_t nb = cols - t0 < WINO_OUT_BLOCK ? cols - t0 : WINO_OUT_BLOCK;
            float *pq = scratch;  // 8 rows of WINO_OUT_BLOCK: A^T m's row 0 (p, 4 values), row 1 (q)
            for (int j = 0; j < 4; j++) {  // A^T down column j: p = m's rows 0 + 1 + 2, q = rows 1 - 2 - 3
                const float *restrict c0 = mk + (size_t)j * ld + t0, *restrict c1 = c0 + 4 * ld;
                const float *restrict c2 = c1 + 4 * ld, *restrict c3 = c2 + 4 * ld;
                float *restrict p = pq + (size_t)j * WINO_OUT_BLOCK, *restrict q = p + 4 * WINO_OUT_BLOCK;
#pragma omp simd
                for (size_t t = 0; t < nb; t++) {
                    p[t] = c0[t] + c1[t] + c2[t];
                    q[t] = c1[t] - c2[t] - c3[t];
                }
            }
            const float *restrict p0 = pq, *restrict p1 = p0 + WINO_OUT_BLOCK, *restrict p2 = p1 + WINO_OUT_BLOCK;
            const float *restrict p3 = p2 + WINO_OUT_BLOCK, *restrict q0 = p3 + WINO_OUT_BLOCK;
            const float *restrict q1 = q0 + WINO_OUT_BLOCK, *restrict q2 = q1 + WINO_OUT_BLOCK;
            const float *restrict q3 = q2 + WINO_OUT_BLOCK;
            float *restrict o00 = mk + t0, *restrict o01 = o00 + ld, *restrict o10 = o01 + ld, *restrict o11 = o10 + ld;
#pragma omp simd
            for (size_t t = 0; t < nb; t++) {  // (A^T m) A: the same along each row
                o00[t] = p0[t] + p1[t] + p2[t];
                o01[t] = p1[t] - p2[t] - p3[t];
                o10[t] = q0[t] + q1[t] + q2[t];
                o11[t] = q1[t] - q2[t] - q3[t];
            }
        }
        const float bk = b ? b[k] : 0.0f;
        for (int n = 0; n < g; n++) {
            float *yk = y + ((size_t)n * pl->cout + k) * H * W;
            for (int ti = 0; ti < pl->th; ti++) {
                for (int a = 0; a < 2 && 2 * ti + a < H; a++) {
                    const size_t t0 = (size_t)n * pl->tiles + (size_t)ti * TW;
                    const float *restrict o0 = mk + (size_t)(2 * a) * ld + t0, *restrict o1 = o0 + ld;  // (a, 0), (a, 1)
                    float *restrict dst = yk + (size_t)(2 * ti + a) * W;
                    if (accumulate) {
#pragma omp simd
                        for (int tj = 0; tj < W / 2; tj++) {
                            dst[2 * tj] += o0[tj];
                            dst[2 * tj + 1] += o1[tj];
                        }
                        if (W % 2) dst[W - 1] += o0[W / 2];
                    } else {
#pragma omp simd
                        for (int tj = 0; tj < W / 2; tj++) {
                            dst[2 * tj] = o0[tj] + bk;
                            dst[2 * tj + 1] = o1[tj] + bk;
                        }
                        if (W % 2) dst[W - 1] = o0[W / 2] + bk;
                    }
                }
            }
        }
    }
}

static void wino_outputs(const WinoPlan *pl, float *m, int g, size_t cols, const float *b, bool accumulate,
                         float *y, float *scratch) {
    wino_outputs_range(pl, m, g, cols, b, accumulate, y, scratch, 0, pl->cout);
}

// M[e] (cout, cols) = U[e] (cout, cin) @ V[e] (cin, cols): the sum over input channels, for one e of 16.
static void wino_gemm(const WinoPlan *pl, const float *u, const float *v, float *m, size_t cols, int e) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, pl->cout, (int)cols, pl->cin, 1.0f,
                u + (size_t)e * pl->cout * pl->cin, pl->cin, v + (size_t)e * pl->cin * cols, (int)cols, 0.0f,
                m + (size_t)e * pl->cout * cols, (int)cols);
}

// [lo, hi) = thread t's share of 0 .. n split into `parts` (static: the same split on every call).
static void wino_share(int n, int parts, int t, int *lo, int *hi) {
    const int per = (n + parts - 1) / parts;
    *lo = t * per < n ? t * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

// Prepared filters (winograd_prepare_filters): U (16, cout, cin), then, where gemm_small runs, U[e] packed for it
// (16 of gemm_packed_floats(cout, cin)). Its packed U[e], or NULL.
static const float *wino_packed(const WinoPlan *pl, const float *u_ready, int e) {
    if (!u_ready || !gemm_small_available()) return NULL;
    return u_ready + 16 * (size_t)pl->cout * pl->cin + (size_t)e * gemm_packed_floats(pl->cout, pl->cin);
}

// wino_gemm for the output channels of panels p0 .. p1 - 1 of a prepared U[e] (few columns: gemm_small.h).
static void wino_gemm_packed(const WinoPlan *pl, const float *up, const float *v, float *m, size_t cols, int e, int p0,
                             int p1) {
    gemm_small(pl->cout, (int)cols, pl->cin, up, v + (size_t)e * pl->cin * cols, (int)cols, NULL,
               m + (size_t)e * pl->cout * cols, (int)cols, p0, p1);
}

// Fewer images than threads (batch-1 inference): the images cannot keep the threads busy, so the threads share
// each image: its input transform by input channels, its 16 GEMMs, its output transform by output channels, each
// thread with a scratch of its own (thread 0's in its slice, the others' after that slice: winograd_work_floats
// leaves room for a slice per thread). Each GEMM is the same call as in wino_run and each transformed value the
// same arithmetic, so the numbers do not depend on the batch size or the thread count (tests/test_ops.c).
// u_ready: the filters already transformed (winograd_prepare_filters), else transformed into work first.
static void wino_run_shared(const WinoPlan *pl, int threads, const float *x, const float *w, const float *u_ready,
                            bool flipped, const float *b, bool accumulate, float *y, float *work) {
    float *u_work = work, *v = u_work + 16 * (size_t)pl->cout * pl->cin;
    const float *u = u_ready ? u_ready : u_work;
    const size_t x_img = (size_t)pl->cin * pl->h * pl->w, y_img = (size_t)pl->cout * pl->h * pl->w;
    const size_t cols = pl->tiles, scratch_floats = WINO_SCRATCH(pl->th, pl->tw);  // one image at a time
    float *m = v + 16 * (size_t)pl->cin * cols, *scratch0 = v + pl->thread_floats - scratch_floats;
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        float *scratch = t == 0 ? scratch0 : v + pl->thread_floats + (size_t)(t - 1) * scratch_floats;
        int c0, c1, k0, k1;
        wino_share(pl->cin, nt, t, &c0, &c1);
        wino_share(pl->cout, nt, t, &k0, &k1);
        if (!u_ready) wino_filters(pl, w, flipped, u_work);  // ends with omp for's barrier
        for (int n = 0; n < pl->n; n++) {
            wino_inputs_range(pl, x + n * x_img, 1, v, cols, scratch, c0, c1);
#pragma omp barrier
            if (wino_packed(pl, u_ready, 0) && cols <= GEMM_SMALL_MAX_COLS) {  // prepared and few tiles: gemm_small
                const int panels = (pl->cout + GEMM_PANEL - 1) / GEMM_PANEL;
#pragma omp for schedule(static)
                for (int ep = 0; ep < 16 * panels; ep++)
                    wino_gemm_packed(pl, wino_packed(pl, u_ready, ep / panels), v, m, cols, ep / panels, ep % panels,
                                     ep % panels + 1);
            } else {
#pragma omp for schedule(static)
                for (int e = 0; e < 16; e++) wino_gemm(pl, u, v, m, cols, e);  // (ends with a barrier)
            }
            // (No barrier after: the next image's input transform writes V and this thread's scratch, which no
            // other thread's output transform reads; M is rewritten only after the barrier before the GEMMs.)
            wino_outputs_range(pl, m, 1, cols, b, accumulate, y + n * y_img, scratch, k0, k1);
        }
    }
}

// The convolution x (n, cin, h, w) -> y (n, cout, h, w) with filters w arranged as `flipped` says, or already
// transformed (u_ready, not NULL).
static void wino_run(const WinoPlan *pl, const float *x, const float *w, const float *u_ready, bool flipped,
                     const float *b, bool accumulate, float *y, float *work) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);  // see ops_cpu.c's threading policy
    const int call_threads = wino_call_threads();
    if (pl->n < call_threads && pl->group == 1) {
        wino_run_shared(pl, call_threads, x, w, u_ready, flipped, b, accumulate, y, work);
        return;
    }
    float *u_work = work;
    const float *u = u_ready ? u_ready : u_work;
    const size_t x_img = (size_t)pl->cin * pl->h * pl->w, y_img = (size_t)pl->cout * pl->h * pl->w;
#pragma omp parallel num_threads(pl->threads)
    {
        if (!u_ready) wino_filters(pl, w, flipped, u_work);  // ends with omp for's barrier: U complete before any GEMM
        const int t = omp_get_thread_num();
        float *v = u_work + 16 * (size_t)pl->cout * pl->cin + (size_t)t * pl->thread_floats;
#pragma omp for schedule(static)
        for (int ch = 0; ch < pl->chunks; ch++) {
            const int n0 = ch * pl->group;
            const int g = pl->n - n0 < pl->group ? pl->n - n0 : pl->group;
            const size_t cols = (size_t)g * pl->tiles;
            float *m = v + 16 * (size_t)pl->cin * cols;  // M (16, cout, cols) right after V (16, cin, cols)
            float *scratch = v + pl->thread_floats - WINO_SCRATCH(pl->th, pl->tw);
            wino_inputs(pl, x + n0 * x_img, g, v, cols, scratch);
            const bool small = wino_packed(pl, u_ready, 0) && cols <= GEMM_SMALL_MAX_COLS;
            for (int e = 0; e < 16; e++) {
                const int panels = (pl->cout + GEMM_PANEL - 1) / GEMM_PANEL;
                if (small) wino_gemm_packed(pl, wino_packed(pl, u_ready, e), v, m, cols, e, 0, panels);
                else wino_gemm(pl, u, v, m, cols, e);
            }
            wino_outputs(pl, m, g, cols, b, accumulate, y + n0 * y_img, scratch);
        }
    }
}

static void wino_check(const Conv2dDims *s) {
    CHECK(s->n > 0 && s->h > 0 && s->w > 0 && s->r == 3 && s->stride == 1 && s->pad == 1 && s->c > 0 && s->k > 0,
          "winograd: only 3x3, stride 1, pad 1 convolutions of non-empty tensors (winograd_eligible says which)");
}

void winograd_forward(const Conv2dDims *s, const float *x, const float *w, const float *b, float *y, float *work) {
    wino_check(s);
    const WinoPlan pl = wino_plan_for(s->n, s->c, s->k, s->h, s->w, wino_call_threads());
    wino_run(&pl, x, w, NULL, false, b, false, y, work);
}

size_t winograd_filters_floats(const Conv2dDims *s) {
    const size_t packed = gemm_small_available() ? 16 * gemm_packed_floats(s->k, s->c) : 0;
    return 16 * (size_t)s->k * (size_t)s->c + packed;
}

void winograd_prepare_filters(const Conv2dDims *s, const float *w, float *u) {
    wino_check(s);
    const WinoPlan pl = wino_plan_for(1, s->c, s->k, s->h, s->w, 1);  // only cin and cout matter here
#pragma omp parallel num_threads(wino_call_threads())
    {
        wino_filters(&pl, w, false, u);  // (ends with a barrier)
        if (gemm_small_available()) {
#pragma omp for schedule(static)
            for (int e = 0; e < 16; e++)
                gemm_pack(s->k, s->c, u + (size_t)e * s->k * s->c, s->c, (float *)wino_packed(&pl, u, e));
        }
    }
}

void winograd_forward_prepared(const Conv2dDims *s, const float *x, const float *u, const float *b, float *y,
                               float *work) {
    wino_check(s);
    const WinoPlan pl = wino_plan_for(s->n, s->c, s->k, s->h, s->w, wino_call_threads());
    wino_run(&pl, x, NULL, u, false, b, false, y, work);
}

void winograd_backward_data(const Conv2dDims *s, const float *w, const float *dy, float *dx, float *work) {
    wino_check(s);
    const WinoPlan pl = wino_plan_for(s->n, s->k, s->c, s->h, s->w, wino_call_threads());
    wino_run(&pl, dy, w, NULL, true, NULL, true, dx, work);
}

// ---------------------------------------------------------------- the weight gradient
// Forward, per tile: Y = A^T X A with X = U .* V. Its adjoint: dX = A dY A^T (dY: the tile's 2x2 output
// gradient, 0 where the tile overhangs), dU[e] = sum over tiles of dX[e] V[e], one GEMM per e over the tiles
// (K, T) @ (T, C), and dw += G^T dU G per (k, c). As in the im2col path, each thread takes its own groups of
// images through both transforms and the 16 GEMMs into its own dU (thread 0 into the final one), and the
// partial sums are added at the end: one barrier in all. (Splitting the 16 GEMMs between the threads instead
// needs no partial sums but two barriers per group, and each thread reads the tiles the other transformed:
// on a loaded machine that ran a 32x32 layer's weight gradient 1.7x slower.)

// Yhat (16, K, cols) for the output gradient of one image dy (K, h, w), written from column 0: A z A^T per
// 2x2 tile z, A = [1 0; 1 1; 1 -1; 0 -1]. The reverse of wino_outputs, in long loops over all the image's tiles
// (which the compiler vectorises whole) through `scratch` (10 rows of tiles): z's 4 values (0 past the image),
// gathered a row of tiles at a time; then the 4 rows of A z (2 values each); then A along each row, 4 rows of
// Yhat per loop (16 output streams in one loop, on a map of 32 x 32, fall into the same cache sets).
static void wino_grad_tiles(const WinoPlan *pl, const float *dy, float *yhat, size_t cols, float *scratch) {
    const int H = pl->h, W = pl->w, TW = pl->tw;
    const size_t ld = (size_t)pl->cout * cols, nt = pl->tiles;
    float *row[10];  // z00 z01 z10 z11, then (A z)'s rows 1, 2, 3 as pairs (its row 0 is z00 z01)
    for (int i = 0; i < 10; i++) row[i] = scratch + (size_t)i * nt;
    for (int k = 0; k < pl->cout; k++) {
        const float *dk = dy + (size_t)k * H * W;
        for (int ti = 0; ti < pl->th; ti++) {
            for (int a = 0; a < 2; a++) {  // z[a][0], z[a][1] of the row's tiles
                float *restrict z0 = row[2 * a] + (size_t)ti * TW, *restrict z1 = row[2 * a + 1] + (size_t)ti * TW;
                if (2 * ti + a >= H) {  // the row below an odd-height image
                    memset(z0, 0, (size_t)TW * sizeof(float));
                    memset(z1, 0, (size_t)TW * sizeof(float));
                    continue;
                }
                const float *restrict src = dk + (size_t)(2 * ti + a) * W;
#pragma omp simd
                for (int tj = 0; tj < W / 2; tj++) {
                    z0[tj] = src[2 * tj];
                    z1[tj] = src[2 * tj + 1];
                }
                if (W % 2) z0[W / 2] = src[W - 1], z1[W / 2] = 0.0f;
            }
        }
        const float *restrict z00 = row[0], *restrict z01 = row[1], *restrict z10 = row[2], *restrict z11 = row[3];
        float *restrict r10 = row[4], *restrict r11 = row[5], *restrict r20 = row[6], *restrict r21 = row[7];
        float *restrict r30 = row[8], *restrict r31 = row[9];
#pragma omp simd
        for (size_t t = 0; t < nt; t++) {  // A z: rows z0, z0 + z1, z0 - z1, -z1
            r10[t] = z00[t] + z10[t], r11[t] = z01[t] + z11[t];
            r20[t] = z00[t] - z10[t], r21[t] = z01[t] - z11[t];
            r30[t] = -z10[t], r31[t] = -z11[t];
        }
        for (int i = 0; i < 4; i++) {  // (A z) A^T along row i = (a0, a1): a0, a0 + a1, a0 - a1, -a1
            const float *restrict a0 = i == 0 ? row[0] : row[2 + 2 * i], *restrict a1 = a0 + nt;
            float *restrict o0 = yhat + (size_t)(4 * i) * ld + (size_t)k * cols, *restrict o1 = o0 + ld;
            float *restrict o2 = o1 + ld, *restrict o3 = o2 + ld;
#pragma omp simd
            for (size_t t = 0; t < nt; t++) {
                o0[t] = a0[t];
                o1[t] = a0[t] + a1[t];
                o2[t] = a0[t] - a1[t];
                o3[t] = -a1[t];
            }
        }
    }
}

// dw (K, C, 3, 3) += G^T d G for d = dU[.][k][c] (16 floats, `ld` apart).
static void wino_filter_grad(const float *d, size_t ld, float *dw) {
    float q[3][4];  // G^T d: rows of G^T = [1 1/2 1/2 0; 0 1/2 -1/2 0; 0 1/2 1/2 1] down each column
    for (int j = 0; j < 4; j++) {
        const float d0 = d[(size_t)j * ld], d1 = d[(size_t)(4 + j) * ld];
        const float d2 = d[(size_t)(8 + j) * ld], d3 = d[(size_t)(12 + j) * ld];
        q[0][j] = d0 + 0.5f * (d1 + d2);
        q[1][j] = 0.5f * (d1 - d2);
        q[2][j] = 0.5f * (d1 + d2) + d3;
    }
    for (int i = 0; i < 3; i++) {  // (G^T d) G, along each row
        dw[3 * i + 0] += q[i][0] + 0.5f * (q[i][1] + q[i][2]);
        dw[3 * i + 1] += 0.5f * (q[i][1] - q[i][2]);
        dw[3 * i + 2] += 0.5f * (q[i][1] + q[i][2]) + q[i][3];
    }
}

void winograd_backward_weights(const Conv2dDims *s, const float *x, const float *dy, float *dw, float *work) {
    wino_check(s);
    const WinoPlan pl = wino_plan_for(s->n, s->c, s->k, s->h, s->w, wino_call_threads());
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
    const int C = s->c, K = s->k;
    const size_t x_img = (size_t)C * s->h * s->w, y_img = (size_t)K * s->h * s->w, ukc = 16 * (size_t)K * C;
    float *du = work;                                        // dU (16, K, C), then the other threads' partial dU
    float *slices = work + (size_t)pl.threads * ukc;         // per thread: V (16, C, cols), Yhat (16, K, cols), scratch
#pragma omp parallel num_threads(pl.threads)
    {
        const int t = omp_get_thread_num();
        float *mine = du + (size_t)t * ukc, *v = slices + (size_t)t * pl.thread_floats;
        float *scratch = v + pl.thread_floats - WINO_SCRATCH(pl.th, pl.tw);
        bool first = true;
#pragma omp for schedule(static)
        for (int ch = 0; ch < pl.chunks; ch++) {
            const int n0 = ch * pl.group, g = s->n - n0 < pl.group ? s->n - n0 : pl.group;
            const size_t cols = (size_t)g * pl.tiles;
            float *yhat = v + 16 * (size_t)C * cols;
            for (int n = 0; n < g; n++) {
                wino_inputs(&pl, x + (n0 + n) * x_img, 1, v + n * pl.tiles, cols, scratch);
                wino_grad_tiles(&pl, dy + (n0 + n) * y_img, yhat + n * pl.tiles, cols, scratch);
            }
            for (int e = 0; e < 16; e++) {
                // dU[e] (K, C) (+)= Yhat[e] (K, cols) @ V[e]^T (cols, C): the sum over tiles.
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, K, C, (int)cols, 1.0f,
                            yhat + (size_t)e * K * cols, (int)cols, v + (size_t)e * C * cols, (int)cols,
                            first ? 0.0f : 1.0f, mine + (size_t)e * K * C, C);
            }
            first = false;
        }
        if (pl.threads > 1) {  // the other threads' partial sums into thread 0's (the barrier above: all done)
#pragma omp for schedule(static)
            for (size_t i = 0; i < ukc; i++) {
                float acc = 0.0f;
                for (int u = 1; u < pl.threads; u++) acc += du[(size_t)u * ukc + i];
                du[i] += acc;
            }
        }
#pragma omp for schedule(static)
        for (int kc = 0; kc < K * C; kc++) wino_filter_grad(du + kc, (size_t)K * C, dw + (size_t)kc * 9);
    }
}
