// kit/data.c: dataset readers, the synthetic generator, and batch assembly with augmentation
// (see data.h). The sampler is in sampler.c, the background loader in loader.c.
#include "kit/data.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "kit/check.h"
#include "kit/rng.h"

// ---------------------------------------------------------------- common helpers

static void dataset_alloc(Dataset *ds, const char *name, int n, int c, int h, int w, int classes) {
    memset(ds, 0, sizeof *ds);
    snprintf(ds->name, sizeof ds->name, "%s", name);
    ds->n = n;
    ds->c = c;
    ds->h = h;
    ds->w = w;
    ds->classes = classes;
    ds->images = xmalloc((size_t)n * c * h * w + 1);  // +1: a valid pointer even when n == 0
    ds->labels = xmalloc((size_t)n + 1);
}

void dataset_free(Dataset *ds) {
    if (!ds) return;
    free(ds->images);
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
}

static void dataset_set_stats(Dataset *ds, const float *mean, const float *std) {
    for (int ch = 0; ch < 3; ch++) {
        ds->mean[ch] = ch < ds->c ? mean[ch] : 0.0f;
        ds->std[ch] = ch < ds->c ? std[ch] : 1.0f;
    }
}

int dataset_load(Dataset *ds, const char *name, const char *dir, Split split, char *err, size_t errlen) {
    memset(ds, 0, sizeof *ds);
    const DatasetInfo *info = name ? dataset_info(name) : NULL;
    if (!info) return check_reason(err, errlen, "unknown dataset '%s': expected %s", name ? name : "", dataset_names());
    return info->load(ds, dir ? dir : ".", split, err, errlen);
}

// ---------------------------------------------------------------- CIFAR-10 / CIFAR-100 (binary version)
//
// A file is a plain sequence of records: label byte(s), then 3072 bytes of pixels as three 32x32
// planes (R, G, B), i.e. already (C, H, W). There is no header, so the record count comes from the
// file size; every official file holds 10000 records (CIFAR-100 train.bin: 50000).

enum { CIFAR_PIXELS = 3 * 32 * 32 };

typedef struct {
    const char *dataset;  // for messages
    int label_bytes;      // 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine)
    int label_at;         // which label byte is the class (CIFAR-100: 1 = fine)
    int classes;
    int coarse_classes;   // CIFAR-100's coarse label range, checked too; 0 = none
} CifarFormat;

// Checks that path holds a whole, non-zero number of records; returns the count or -1.
static long cifar_count(const char *path, const CifarFormat *f, char *err, size_t errlen) {
    struct stat st;
    long rec = f->label_bytes + CIFAR_PIXELS;
    if (stat(path, &st) != 0)
        return check_reason(err, errlen, "%s: cannot open (%s): expected a %s binary file (run datasets/fetch.sh)",
                    path, strerror(errno), f->dataset);
    if (!S_ISREG(st.st_mode)) return check_reason(err, errlen, "%s: not a regular file", path);
    if (st.st_size == 0)
        return check_reason(err, errlen, "%s: file is empty: expected records of %ld bytes (10000 per file)", path, rec);
    if (st.st_size % rec != 0)
        return check_reason(err, errlen,
                    "%s: truncated record: expected a multiple of %ld bytes (records of %d label + %d pixel "
                    "bytes), found %lld bytes (%lld whole records + %lld bytes)",
                    path, rec, f->label_bytes, CIFAR_PIXELS, (long long)st.st_size, (long long)(st.st_size / rec),
                    (long long)(st.st_size % rec));
    return (long)(st.st_size / rec);
}

// Reads count records of path into images/labels (already allocated); checks every label.
static int cifar_read(const char *path, long count, const CifarFormat *f, uint8_t *images, uint8_t *labels,
                      char *err, size_t errlen) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return check_reason(err, errlen, "%s: cannot open (%s)", path, strerror(errno));
    int rc = 0;
    for (long i = 0; i < count && rc == 0; i++) {
        uint8_t lab[2];
        uint8_t *img = images + (size_t)i * CIFAR_PIXELS;
        if (fread(lab, 1, (size_t)f->label_bytes, fp) != (size_t)f->label_bytes ||
            fread(img, 1, CIFAR_PIXELS, fp) != CIFAR_PIXELS) {
            rc = check_reason(err, errlen, "%s: truncated record %ld: expected %ld records, the file ended early", path,
                      i, count);
        } else if (f->coarse_classes && lab[0] >= f->coarse_classes) {
            rc = check_reason(err, errlen, "%s: record %ld has coarse label %d: expected 0..%d", path, i, lab[0],
                      f->coarse_classes - 1);
        } else if (lab[f->label_at] >= f->classes) {
            rc = check_reason(err, errlen, "%s: record %ld has label %d: expected 0..%d", path, i, lab[f->label_at],
                      f->classes - 1);
        } else {
            labels[i] = lab[f->label_at];
        }
    }
    if (rc == 0 && fgetc(fp) != EOF)  // the file grew since stat(): do not silently ignore bytes
        rc = check_reason(err, errlen, "%s: trailing bytes after %ld records", path, count);
    fclose(fp);
    return rc;
}

// Loads a list of CIFAR files into one dataset. same_count: every file must hold as many records as
// the first (CIFAR-10's five training batches), which catches a file cut at a record boundary.
static int cifar_load(Dataset *ds, const char *name, const CifarFormat *f, char paths[][1024], int files,
                      bool same_count, char *err, size_t errlen) {
    long counts[8], total = 0;
    memset(ds, 0, sizeof *ds);
    for (int i = 0; i < files; i++) {
        counts[i] = cifar_count(paths[i], f, err, errlen);
        if (counts[i] < 0) return -1;
        if (same_count && counts[i] != counts[0])
            return check_reason(err, errlen, "%s: wrong size: expected %ld records like %s, found %ld", paths[i], counts[0],
                        paths[0], counts[i]);
        total += counts[i];
    }
    if (total > 0x7fffffffL / CIFAR_PIXELS) return check_reason(err, errlen, "%s: too many records (%ld)", paths[0], total);
    dataset_alloc(ds, name, (int)total, 3, 32, 32, f->classes);
    long at = 0;
    for (int i = 0; i < files; i++) {
        if (cifar_read(paths[i], counts[i], f, ds->images + (size_t)at * CIFAR_PIXELS, ds->labels + at, err,
                       errlen) != 0) {
            dataset_free(ds);
            return -1;
        }
        at += counts[i];
    }
    return 0;
}

int dataset_load_cifar10(Dataset *ds, const char *dir, Split split, char *err, size_t errlen) {
    static const CifarFormat fmt = {"CIFAR-10", 1, 0, 10, 0};
    char paths[5][1024];
    int files = split == SPLIT_TRAIN ? 5 : 1;
    for (int i = 0; i < files; i++) {
        if (split == SPLIT_TRAIN) snprintf(paths[i], sizeof paths[i], "%s/cifar-10-batches-bin/data_batch_%d.bin", dir, i + 1);
        else snprintf(paths[i], sizeof paths[i], "%s/cifar-10-batches-bin/test_batch.bin", dir);
    }
    if (cifar_load(ds, "cifar10", &fmt, paths, files, true, err, errlen) != 0) return -1;
    // Per-channel mean and std over all pixels of the 50000 CIFAR-10 training images, in [0, 1] units:
    // the values common PyTorch CIFAR recipes use, reproducible with the one-liner in datasets/README.md.
    // (The (0.2023, 0.1994, 0.2010) seen in some recipes is not this pixel std.) Used for both splits.
    static const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, std[3] = {0.2470f, 0.2435f, 0.2616f};
    dataset_set_stats(ds, mean, std);
    return 0;
}

int dataset_load_cifar100(Dataset *ds, const char *dir, Split split, char *err, size_t errlen) {
    static const CifarFormat fmt = {"CIFAR-100", 2, 1, 100, 20};
    char paths[1][1024];
    snprintf(paths[0], sizeof paths[0], "%s/cifar-100-binary/%s", dir, split == SPLIT_TRAIN ? "train.bin" : "test.bin");
    if (cifar_load(ds, "cifar100", &fmt, paths, 1, false, err, errlen) != 0) return -1;
    // Per-channel mean and std of the 50000 CIFAR-100 training images, same method as CIFAR-10.
    static const float mean[3] = {0.5071f, 0.4865f, 0.4409f}, std[3] = {0.2673f, 0.2564f, 0.2762f};
    dataset_set_stats(ds, mean, std);
    return 0;
}

// ---------------------------------------------------------------- Fashion-MNIST (IDX through zlib)
//
// IDX: a big-endian header (magic 0x00000803 for 3-d unsigned-byte images, 0x00000801 for 1-d labels,
// then one u32 per dimension), then the bytes. gzopen reads gzip and plain files alike.

// Picks dir/base.gz, else dir/base. Returns -1 when neither exists.
static int idx_path(char *out, size_t outlen, const char *dir, const char *base, char *err, size_t errlen) {
    snprintf(out, outlen, "%s/%s.gz", dir, base);
    if (access(out, F_OK) == 0) return 0;
    snprintf(out, outlen, "%s/%s", dir, base);
    if (access(out, F_OK) == 0) return 0;
    return check_reason(err, errlen, "%s/%s.gz: missing (and no uncompressed %s): expected a Fashion-MNIST IDX file "
                "(apt install dataset-fashion-mnist)", dir, base, base);
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

// Reads exactly len bytes or explains why not (truncated, or zlib's error for a corrupt gzip stream).
static int gz_read_all(gzFile gz, const char *path, void *buf, size_t len, const char *what, char *err,
                       size_t errlen) {
    size_t got = 0;
    while (got < len) {
        size_t chunk = len - got > (1u << 30) ? (1u << 30) : len - got;
        int r = gzread(gz, (uint8_t *)buf + got, (unsigned)chunk);
        if (r < 0) {
            int zerr = 0;
            const char *msg = gzerror(gz, &zerr);
            return check_reason(err, errlen, "%s: corrupt gzip data while reading the %s (zlib: %s)", path, what, msg);
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    if (got < len) {
        int zerr = 0;
        const char *msg = gzerror(gz, &zerr);
        return check_reason(err, errlen, "%s: truncated %s: expected %zu bytes, found %zu%s%s%s", path, what, len, got,
                    zerr ? " (zlib: " : "", zerr ? msg : "", zerr ? ")" : "");
    }
    return 0;
}

// Opens an IDX file and checks its header: magic, and dims (a dim of 0 in `expect` means any).
// Fills dims[] with what the file says. Returns the open file, or NULL with err set.
static gzFile idx_open(const char *path, uint32_t magic, int ndims, const uint32_t *expect, uint32_t *dims,
                       char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) {
        check_reason(err, errlen, "%s: cannot open (%s)", path, strerror(errno));
        return NULL;
    }
    if (st.st_size == 0) {
        check_reason(err, errlen, "%s: file is empty: expected an IDX file (magic 0x%08x)", path, magic);
        return NULL;
    }
    gzFile gz = gzopen(path, "rb");
    if (!gz) {
        check_reason(err, errlen, "%s: cannot open (%s)", path, errno ? strerror(errno) : "zlib could not allocate");
        return NULL;
    }
    uint8_t head[4 + 4 * 3];
    size_t head_len = 4 + 4 * (size_t)ndims;
    if (gz_read_all(gz, path, head, head_len, "IDX header", err, errlen) != 0) {
        gzclose(gz);
        return NULL;
    }
    if (be32(head) != magic) {
        check_reason(err, errlen, "%s: wrong IDX magic: expected 0x%08x, found 0x%08x", path, magic, be32(head));
        gzclose(gz);
        return NULL;
    }
    for (int d = 0; d < ndims; d++) dims[d] = be32(head + 4 + 4 * d);
    for (int d = 0; d < ndims; d++) {
        if (expect[d] && dims[d] != expect[d]) {
            if (ndims == 3)
                check_reason(err, errlen, "%s: wrong dimensions: expected %ux%u images, found %ux%u", path, expect[1],
                     expect[2], dims[1], dims[2]);
            else
                check_reason(err, errlen, "%s: wrong dimension %d: expected %u, found %u", path, d, expect[d], dims[d]);
            gzclose(gz);
            return NULL;
        }
    }
    return gz;
}

// After the payload: anything more is a wrong file (e.g. images of another size with a wrong header).
static int idx_no_trailing(gzFile gz, const char *path, size_t payload, char *err, size_t errlen) {
    uint8_t extra;
    int r = gzread(gz, &extra, 1);
    if (r > 0) return check_reason(err, errlen, "%s: trailing bytes after the %zu bytes the IDX header announces", path, payload);
    if (r < 0) {
        int zerr = 0;
        return check_reason(err, errlen, "%s: corrupt gzip data at the end (zlib: %s)", path, gzerror(gz, &zerr));
    }
    return 0;
}

int dataset_load_fashion_mnist(Dataset *ds, const char *dir, Split split, char *err, size_t errlen) {
    const char *prefix = split == SPLIT_TRAIN ? "train" : "t10k";
    char base[64], img_path[1024], lab_path[1024];
    memset(ds, 0, sizeof *ds);
    snprintf(base, sizeof base, "%s-images-idx3-ubyte", prefix);
    if (idx_path(img_path, sizeof img_path, dir, base, err, errlen) != 0) return -1;
    snprintf(base, sizeof base, "%s-labels-idx1-ubyte", prefix);
    if (idx_path(lab_path, sizeof lab_path, dir, base, err, errlen) != 0) return -1;

    const uint32_t img_expect[3] = {0, 28, 28}, lab_expect[1] = {0};
    uint32_t img_dims[3], lab_dims[1];
    gzFile gi = idx_open(img_path, 0x00000803u, 3, img_expect, img_dims, err, errlen);
    if (!gi) return -1;
    gzFile gl = idx_open(lab_path, 0x00000801u, 1, lab_expect, lab_dims, err, errlen);
    if (!gl) {
        gzclose(gi);
        return -1;
    }
    int rc = 0;
    if (lab_dims[0] != img_dims[0]) {
        rc = check_reason(err, errlen, "%s: wrong size: expected %u labels (one per image in %s), found %u", lab_path,
                  img_dims[0], img_path, lab_dims[0]);
    } else if (img_dims[0] == 0 || img_dims[0] > 0x7fffffffu / (28 * 28)) {
        rc = check_reason(err, errlen, "%s: wrong size: expected 1..%u images, found %u", img_path,
                  0x7fffffffu / (28 * 28), img_dims[0]);
    }
    if (rc == 0) {
        int n = (int)img_dims[0];
        size_t pixels = (size_t)n * 28 * 28;
        dataset_alloc(ds, "fashion-mnist", n, 1, 28, 28, 10);
        rc = gz_read_all(gi, img_path, ds->images, pixels, "images", err, errlen);
        if (rc == 0) rc = idx_no_trailing(gi, img_path, pixels, err, errlen);
        if (rc == 0) rc = gz_read_all(gl, lab_path, ds->labels, (size_t)n, "labels", err, errlen);
        if (rc == 0) rc = idx_no_trailing(gl, lab_path, (size_t)n, err, errlen);
        for (int i = 0; rc == 0 && i < n; i++)
            if (ds->labels[i] >= 10)
                rc = check_reason(err, errlen, "%s: label %d of record %d: expected 0..9", lab_path, ds->labels[i], i);
        if (rc != 0) dataset_free(ds);
    }
    gzclose(gi);
    gzclose(gl);
    if (rc != 0) return -1;
    // Mean and std of the 60000 Fashion-MNIST training images (pixels in [0, 1]): the values used by the
    // common PyTorch Fashion-MNIST recipes; tests/test_data.c recomputes them from the real train split.
    static const float mean[3] = {0.2860f, 0, 0}, std[3] = {0.3530f, 1, 1};
    dataset_set_stats(ds, mean, std);
    return 0;
}

// ---------------------------------------------------------------- synthetic
//
// Each class owns a texture: two oriented sinusoidal waves, each with a class-specific angle, spatial
// frequency and colour mix (a signed amplitude per channel, e.g. red stripes over cyan ones). An image
// draws its own phase for each wave (a random shift of the stripes), contrast, brightness and
// pixel noise. So the class is in the orientation, frequency and colour of the stripes, never in the
// mean colour (every wave averages to zero) nor at a fixed pixel (the phase is random): a linear model
// on pixels or on the mean colour stays near chance, a small conv net (oriented filters, ReLU, pooling)
// learns it in a few hundred steps. Every image is a pure function of (seed, split, index), so the
// generation parallelises and the two splits share the textures but not the draws.

enum { SYN_STATS_SAMPLE = 1000, SYN_WAVES = 2 };  // mean/std: the first 1000 TRAIN images, for both splits

// Stream tags keep the generator's random streams apart from each other and from other modules'.
#define SYN_TAG_CLASS 0x5359430000000000ull  // "SYC"
#define SYN_TAG_IMAGE 0x5359490000000000ull  // "SYI"
#define SYN_TAG_LABEL 0x53594c0000000000ull  // "SYL"

typedef struct {
    float ky, kx;     // wave vector, radians per pixel
    float amp[3];     // per-channel amplitude, in [0, 1] pixel units
} SynWave;

typedef struct {
    int classes, c, h, w;
    SynWave wave[256][SYN_WAVES];
} SynClasses;

static void syn_classes(SynClasses *t, int classes, int c, int h, int w, uint64_t seed) {
    t->classes = classes;
    t->c = c;
    t->h = h;
    t->w = w;
    const float pi = 3.14159265f;
    for (int k = 0; k < classes; k++) {
        Rng r = rng_make(seed, SYN_TAG_CLASS | (uint64_t)k);
        for (int v = 0; v < SYN_WAVES; v++) {
            // Wave 0's angles spread the classes evenly over half a turn; wave 1 is free.
            float angle = v == 0 ? pi * ((float)k + 0.4f * rng_uniform(&r)) / (float)classes : pi * rng_uniform(&r);
            float cycles = 1.5f + 4.0f * rng_uniform(&r);  // per image width
            float omega = 2.0f * pi * cycles / (float)w;
            t->wave[k][v].ky = omega * sinf(angle);
            t->wave[k][v].kx = omega * cosf(angle);
            // A single channel still carries the stripes: its amplitude is never near zero.
            for (int ch = 0; ch < 3; ch++) {
                float a = 0.1f + 0.1f * rng_uniform(&r);
                t->wave[k][v].amp[ch] = (c == 1 || rng_below(&r, 2)) ? a : -a;
            }
        }
    }
}

// The label of sample i: classes are dealt in blocks of `classes` consecutive indices, each block a
// random permutation, so every class appears equally often (up to one) and never in a fixed stride.
static int syn_label(uint64_t seed, Split split, int classes, int i) {
    int block = i / classes, pos = i % classes;
    Rng r = rng_make(seed, SYN_TAG_LABEL | (uint64_t)split << 40 | (uint64_t)block);
    int perm[256];
    for (int k = 0; k < classes; k++) perm[k] = k;
    rng_shuffle(&r, perm, classes);
    return perm[pos];
}

// Writes image i of a split into out (c, h, w) and returns its label.
static int syn_image(const SynClasses *t, uint64_t seed, Split split, int i, float *rows, uint8_t *out) {
    int label = syn_label(seed, split, t->classes, i);
    Rng r = rng_make(seed, SYN_TAG_IMAGE | (uint64_t)split << 40 | (uint64_t)i);
    const int H = t->h, W = t->w;
    // sin(ky*y + kx*x + phase) = sin(ky*y + phase) cos(kx*x) + cos(ky*y + phase) sin(kx*x): 4 short tables
    // per wave instead of a sine per pixel.
    float *sy = rows, *cy = sy + SYN_WAVES * H, *sx = cy + SYN_WAVES * H, *cx = sx + SYN_WAVES * W;
    for (int v = 0; v < SYN_WAVES; v++) {
        const SynWave *wv = &t->wave[label][v];
        float phase = 6.28318530718f * rng_uniform(&r);
        for (int y = 0; y < H; y++) {
            sy[v * H + y] = sinf(wv->ky * (float)y + phase);
            cy[v * H + y] = cosf(wv->ky * (float)y + phase);
        }
        for (int x = 0; x < W; x++) {
            sx[v * W + x] = sinf(wv->kx * (float)x);
            cx[v * W + x] = cosf(wv->kx * (float)x);
        }
    }
    float contrast = 0.8f + 0.4f * rng_uniform(&r);
    float bright = 0.5f + 0.2f * (rng_uniform(&r) - 0.5f);
    const float sigma = 0.12f;
    for (int ch = 0; ch < t->c; ch++) {
        float a0 = contrast * t->wave[label][0].amp[ch], a1 = contrast * t->wave[label][1].amp[ch];
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) {
                float s0 = sy[y] * cx[x] + cy[y] * sx[x];
                float s1 = sy[H + y] * cx[W + x] + cy[H + y] * sx[W + x];
                // Near-Gaussian noise from one draw: the sum of four 16-bit uniforms (mean 2, variance 1/3).
                uint64_t u = rng_next_u64(&r);
                float s = (float)((u & 0xffff) + (u >> 16 & 0xffff) + (u >> 32 & 0xffff) + (u >> 48)) / 65536.0f;
                float v = bright + a0 * s0 + a1 * s1 + sigma * 1.7320508f * (s - 2.0f);
                int q = (int)lrintf(v * 255.0f);
                out[((size_t)ch * H + y) * W + x] = (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
            }
    }
    return label;
}

// Generates images first..first+count-1 of a split into images/labels (labels may be NULL).
static void syn_range(const SynClasses *t, uint64_t seed, Split split, int count, uint8_t *images, uint8_t *labels) {
    size_t img = (size_t)t->c * t->h * t->w;
#pragma omp parallel
    {
        float *rows = xmalloc(sizeof(float) * 2 * SYN_WAVES * (size_t)(t->h + t->w));
#pragma omp for schedule(static)
        for (int i = 0; i < count; i++) {
            int label = syn_image(t, seed, split, i, rows, images + (size_t)i * img);
            if (labels) labels[i] = (uint8_t)label;
        }
        free(rows);
    }
}

// Per-channel mean and std, in [0, 1] units, of count images (c, hw) bytes each.
static void stats_of(const uint8_t *images, int count, int c, size_t hw, float *mean, float *std) {
    for (int ch = 0; ch < c; ch++) {
        double s = 0.0, s2 = 0.0;
        for (int i = 0; i < count; i++) {
            const uint8_t *p = images + ((size_t)i * c + ch) * hw;
            for (size_t j = 0; j < hw; j++) {
                s += p[j];
                s2 += (double)p[j] * p[j];
            }
        }
        double cnt = (double)count * (double)hw, m = s / cnt, var = s2 / cnt - m * m;
        mean[ch] = (float)(m / 255.0);
        std[ch] = (float)(sqrt(var > 0 ? var : 0) / 255.0);
        if (std[ch] < 1e-3f) std[ch] = 1e-3f;  // a constant channel must not divide by zero
    }
}

void dataset_synthetic(Dataset *ds, int n, int classes, int c, int h, int w, uint64_t seed, Split split) {
    CHECK(n >= 0 && h > 0 && w > 0, "dataset_synthetic: n must be >= 0 and the image size positive");
    CHECK(c >= 1 && c <= 3, "dataset_synthetic: 1 to 3 channels (Dataset keeps 3 means/stds)");
    CHECK(classes >= 1 && classes <= 256, "dataset_synthetic: labels are bytes, so 1..256 classes");
    dataset_alloc(ds, "synthetic", n, c, h, w, classes);
    SynClasses *t = xmalloc(sizeof *t);
    syn_classes(t, classes, c, h, w, seed);
    syn_range(t, seed, split, n, ds->images, ds->labels);

    // The statistics always come from the same training images, so both splits normalise alike.
    float mean[3] = {0}, std[3] = {1, 1, 1};
    if (split == SPLIT_TRAIN && n >= SYN_STATS_SAMPLE) {
        stats_of(ds->images, SYN_STATS_SAMPLE, c, (size_t)h * w, mean, std);
    } else {
        uint8_t *ref = xmalloc(SYN_STATS_SAMPLE * (size_t)c * h * w);
        syn_range(t, seed, SPLIT_TRAIN, SYN_STATS_SAMPLE, ref, NULL);
        stats_of(ref, SYN_STATS_SAMPLE, c, (size_t)h * w, mean, std);
        free(ref);
    }
    dataset_set_stats(ds, mean, std);
    free(t);
}

// ---------------------------------------------------------------- batches with augmentation

// The augmentation stream of one sample in one epoch (see data.h): tag | epoch | sample index.
uint64_t dataset_aug_stream(int epoch, int index) {
    return DATASET_AUG_TAG | ((uint64_t)(uint32_t)epoch & 0xffffffull) << 32 | (uint64_t)(uint32_t)index;
}

void dataset_fill_batch(const Dataset *ds, const int *idx, int b, const Augment *aug, uint64_t seed, int epoch,
                        float *x, int *y) {
    CHECK(ds && ds->images, "dataset_fill_batch: the dataset is not loaded");
    CHECK(ds->c >= 1 && ds->c <= 3, "dataset_fill_batch: 1 to 3 channels");
    for (int j = 0; j < b; j++)
        CHECKF(idx[j] >= 0 && idx[j] < ds->n, "indices come from the sampler of THIS dataset",
               "sample index %d at batch position %d is outside 0..%d", idx[j], j, ds->n - 1);
    const int C = ds->c, H = ds->h, W = ds->w;
    const size_t img = (size_t)C * H * W;
    // Byte -> normalised float, one table per channel: (v / 255 - mean) / std. A padding pixel is a raw 0,
    // so it becomes lut[ch][0] = -mean / std, exactly what torchvision's zero padding before Normalize gives.
    float lut[3][256];
    for (int ch = 0; ch < C; ch++)
        for (int v = 0; v < 256; v++) lut[ch][v] = ((float)v / 255.0f - ds->mean[ch]) / ds->std[ch];
    const int pad = aug ? aug->crop_pad : 0;
    const bool flip = aug && aug->flip;
    CHECK(pad >= 0 && pad <= H && pad <= W, "Augment.crop_pad must be between 0 and the image size");

#pragma omp parallel for schedule(static)
    for (int j = 0; j < b; j++) {
        const uint8_t *src = ds->images + (size_t)idx[j] * img;
        float *dst = x + (size_t)j * img;  // (C, H, W)
        y[j] = ds->labels[idx[j]];
        int dy = 0, dx = 0, mirror = 0;    // crop offset within the padded image, relative to the original
        if (pad > 0 || flip) {
            Rng r = rng_make(seed, dataset_aug_stream(epoch, idx[j]));
            if (pad > 0) {
                dy = (int)rng_below(&r, (uint32_t)(2 * pad + 1)) - pad;
                dx = (int)rng_below(&r, (uint32_t)(2 * pad + 1)) - pad;
            }
            if (flip) mirror = (int)rng_below(&r, 2);
        }
        for (int ch = 0; ch < C; ch++) {
            const float *t = lut[ch];
            const float zero = t[0];
            for (int yy = 0; yy < H; yy++) {
                int sy = yy + dy;
                float *row = dst + ((size_t)ch * H + yy) * W;
                if (sy < 0 || sy >= H) {
                    for (int xx = 0; xx < W; xx++) row[xx] = zero;
                    continue;
                }
                const uint8_t *srow = src + ((size_t)ch * H + sy) * W;
                for (int xx = 0; xx < W; xx++) {
                    int ox = mirror ? W - 1 - xx : xx;  // flip after the crop, as RandomCrop -> RandomHorizontalFlip
                    int sx = ox + dx;
                    row[xx] = (sx < 0 || sx >= W) ? zero : t[srow[sx]];
                }
            }
        }
    }
}

// ---------------------------------------------------------------- the dataset table

static int load_synthetic(Dataset *ds, const char *dir, Split split, char *err, size_t errlen) {
    (void)dir, (void)err, (void)errlen;  // generated, never fails
    int n = split == SPLIT_TRAIN ? DATASET_SYNTHETIC_TRAIN : DATASET_SYNTHETIC_TEST;
    dataset_synthetic(ds, n, 10, 3, 32, 32, DATASET_SYNTHETIC_SEED, split);
    return 0;
}

// Class names in label order: the datasets' own (CIFAR-10's batches.meta.txt, Fashion-MNIST's README); the
// synthetic set's classes are patterns. CIFAR-100's 100 names are left out: its classes print as numbers.
static const char *const SYNTHETIC_CLASSES[] = {"pattern 0", "pattern 1", "pattern 2", "pattern 3", "pattern 4",
                                                "pattern 5", "pattern 6", "pattern 7", "pattern 8", "pattern 9",
                                                NULL};
static const char *const CIFAR10_CLASSES[] = {"airplane", "automobile", "bird", "cat", "deer",
                                              "dog", "frog", "horse", "ship", "truck", NULL};
static const char *const FASHION_CLASSES[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                              "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot", NULL};

// Crop + flip suit natural photos; Fashion-MNIST's centred items and the synthetic patterns get neither.
static const DatasetInfo DATASETS[] = {
    {"synthetic", load_synthetic, "tiny-bn", 3, {0}, SYNTHETIC_CLASSES},
    {"cifar10", dataset_load_cifar10, "resnet9", 24, {.crop_pad = 4, .flip = true}, CIFAR10_CLASSES},
    {"cifar100", dataset_load_cifar100, "resnet9", 24, {.crop_pad = 4, .flip = true}, NULL},
    {"fashion-mnist", dataset_load_fashion_mnist, "fmnist", 8, {0}, FASHION_CLASSES},
};
enum { N_DATASETS = (int)(sizeof DATASETS / sizeof DATASETS[0]) };

const DatasetInfo *dataset_at(int i) { return i >= 0 && i < N_DATASETS ? &DATASETS[i] : NULL; }

const DatasetInfo *dataset_info(const char *name) {
    for (int i = 0; i < N_DATASETS; i++)
        if (strcmp(name, DATASETS[i].name) == 0) return &DATASETS[i];
    return NULL;
}

static const char *dataset_name(int i) { return DATASETS[i].name; }

const char *dataset_names(void) {
    static char names[128];
    return check_names(names, sizeof names, N_DATASETS, dataset_name);
}
