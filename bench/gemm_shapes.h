// bench/gemm_shapes.h: the GEMM shapes the low-precision benchmarks time (gemm_lowp_cpu.c, gemm_lowp.cu).
//
// A convolution run as im2col + GEMM multiplies the filters (Cout, Cin*R*R) by the im2col matrix (Cin*R*R,
// images*P*Q): M = Cout, K = Cin*9, N = images x output pixels. The rows below are the forward GEMMs of every
// distinct conv layer of the kit's Fashion-MNIST net and ResNet-9 (kit/model.c's tables, default widths; the
// linear layers are too small to matter), N given per image and multiplied by --images; then a square sweep.
// Row-major everywhere: C (M, N) = A (M, K) @ B (K, N).
#ifndef BENCH_GEMM_SHAPES_H
#define BENCH_GEMM_SHAPES_H

typedef struct {
    const char *name;  // "fmnist conv2 32->64 14x14"
    int m, k;          // Cout, Cin*9 (square: n)
    int n_per_image;   // output pixels of one image (square: 0, n = m)
} GemmShape;

static const GemmShape GEMM_SHAPES[] = {
    {"fmnist conv1 1->32 28x28", 32, 9, 784},
    {"fmnist conv2 32->64 14x14", 64, 288, 196},
    {"resnet9 prep 3->64 32x32", 64, 27, 1024},
    {"resnet9 64->128 32x32", 128, 576, 1024},
    {"resnet9 128->128 16x16", 128, 1152, 256},
    {"resnet9 128->256 16x16", 256, 1152, 256},
    {"resnet9 256->512 8x8", 512, 2304, 64},
    {"resnet9 512->512 4x4", 512, 4608, 16},
    {"square 256", 256, 256, 0},
    {"square 512", 512, 512, 0},
    {"square 1024", 1024, 1024, 0},
    {"square 2048", 2048, 2048, 0},
    {"square 4096", 4096, 4096, 0},
};
#define GEMM_SHAPE_COUNT ((int)(sizeof(GEMM_SHAPES) / sizeof(GEMM_SHAPES[0])))

// N of a shape for `images` images (a square: its side).
static inline int gemm_shape_n(const GemmShape *s, int images) {
    return s->n_per_image ? s->n_per_image * images : s->m;
}

// The shape's set ("fmnist", "resnet9", "square"): the first word of its name.
static inline int gemm_shape_in(const GemmShape *s, const char *set) {
    int i = 0;
    while (set[i] && s->name[i] == set[i]) i++;
    return set[i] == '\0' && s->name[i] == ' ';
}

#endif // BENCH_GEMM_SHAPES_H
