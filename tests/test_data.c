// tests/test_data.c: the synthetic generator, the dataset readers (good and broken files written to a
// temporary folder), the real Fashion-MNIST when installed, and batch assembly (normalisation, crop, flip).
#include "tests/testutil.h"

#include <ftw.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <omp.h>

#include "kit/data.h"

// ---------------------------------------------------------------- temporary folder with generated files

static char tmp_root[256];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int setup_tmp(void **state) {
    snprintf(tmp_root, sizeof tmp_root, "/tmp/kit-test-data-XXXXXX");
    assert_non_null(mkdtemp(tmp_root));
    return 0;
}

static int teardown_tmp(void **state) {
    nftw(tmp_root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

// A fresh empty sub-folder of the temporary root for one test.
static const char *fresh_dir(const char *name) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmp_root, name);
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    assert_int_equal(mkdir(path, 0755), 0);
    return path;
}

static void write_bytes(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void write_gz(const char *path, const void *data, size_t len) {
    gzFile g = gzopen(path, "wb");
    assert_non_null(g);
    assert_int_equal(gzwrite(g, data, (unsigned)len), (int)len);
    assert_int_equal(gzclose(g), Z_OK);
}

// The pixel byte of record i, channel ch, position p, in every generated file: easy to check back.
static uint8_t pixel_of(int i, int ch, int p) { return (uint8_t)(i * 31 + ch * 7 + p * 13); }

// A CIFAR file of `records` records with label_bytes label bytes; labels[k] of record i is label(i, k).
static void write_cifar(const char *path, int records, int label_bytes, int first, int classes, int truncate_by) {
    size_t rec = (size_t)label_bytes + 3072, len = rec * records;
    uint8_t *buf = malloc(len + 1);
    for (int i = 0; i < records; i++) {
        uint8_t *r = buf + rec * i;
        r[0] = (uint8_t)((first + i) % 20);                         // CIFAR-100: coarse
        r[label_bytes - 1] = (uint8_t)((first + i) * 3 % classes);  // the class
        for (int ch = 0; ch < 3; ch++)
            for (int p = 0; p < 1024; p++) r[label_bytes + ch * 1024 + p] = pixel_of(first + i, ch, p);
    }
    write_bytes(path, buf, len - (size_t)truncate_by);
    free(buf);
}

static void path_join(char *out, size_t len, const char *dir, const char *rest) { snprintf(out, len, "%s/%s", dir, rest); }

// dir/cifar-10-batches-bin with five training batches of `per` records and a test batch of 5.
static void make_cifar10(const char *dir, int per) {
    char p[600];
    path_join(p, sizeof p, dir, "cifar-10-batches-bin");
    assert_int_equal(mkdir(p, 0755), 0);
    for (int b = 1; b <= 5; b++) {
        snprintf(p, sizeof p, "%s/cifar-10-batches-bin/data_batch_%d.bin", dir, b);
        write_cifar(p, per, 1, (b - 1) * per, 10, 0);
    }
    snprintf(p, sizeof p, "%s/cifar-10-batches-bin/test_batch.bin", dir);
    write_cifar(p, 5, 1, 1000, 10, 0);
}

static void assert_contains(const char *text, const char *part) {
    if (!strstr(text, part)) {
        print_error("expected the message to contain \"%s\"; it is \"%s\"\n", part, text);
        fail();
    }
}

static void assert_not_loaded(const Dataset *ds) {
    assert_null(ds->images);
    assert_null(ds->labels);
    assert_int_equal(ds->n, 0);
}

// ---------------------------------------------------------------- synthetic

static void test_synthetic_deterministic(void **state) {
    Dataset a, b, c, t;
    dataset_synthetic(&a, 300, 10, 3, 32, 32, 5, SPLIT_TRAIN);
    dataset_synthetic(&b, 300, 10, 3, 32, 32, 5, SPLIT_TRAIN);
    dataset_synthetic(&c, 300, 10, 3, 32, 32, 6, SPLIT_TRAIN);
    dataset_synthetic(&t, 300, 10, 3, 32, 32, 5, SPLIT_TEST);
    size_t bytes = (size_t)300 * 3 * 32 * 32;
    assert_memory_equal(a.images, b.images, bytes);
    assert_memory_equal(a.labels, b.labels, 300);
    assert_memory_not_equal(a.images, c.images, bytes);
    assert_memory_not_equal(a.images, t.images, bytes);
    // The statistics are the training ones, for both splits.
    for (int ch = 0; ch < 3; ch++) {
        assert_true(a.mean[ch] == t.mean[ch] && a.std[ch] == t.std[ch]);
        assert_true(a.mean[ch] > 0.3f && a.mean[ch] < 0.7f && a.std[ch] > 0.05f && a.std[ch] < 0.5f);
    }
    // The same thread count does not matter: generation is per image.
    omp_set_num_threads(1);
    Dataset d;
    dataset_synthetic(&d, 300, 10, 3, 32, 32, 5, SPLIT_TRAIN);
    omp_set_num_threads(omp_get_num_procs());
    assert_memory_equal(a.images, d.images, bytes);
    // A prefix of a larger set is the smaller set: image i depends on (seed, split, i) only.
    Dataset big;
    dataset_synthetic(&big, 1200, 10, 3, 32, 32, 5, SPLIT_TRAIN);
    assert_memory_equal(a.images, big.images, bytes);
    assert_memory_equal(a.labels, big.labels, 300);
    assert_true(big.mean[0] == a.mean[0] && big.std[2] == a.std[2]);
    dataset_free(&a), dataset_free(&b), dataset_free(&c), dataset_free(&t), dataset_free(&d), dataset_free(&big);
}

static void test_synthetic_class_balance(void **state) {
    Dataset ds;
    char err[256];
    assert_int_equal(dataset_load(&ds, "synthetic", NULL, SPLIT_TRAIN, err, sizeof err), 0);
    assert_int_equal(ds.n, 5000);
    assert_int_equal(ds.classes, 10);
    assert_true(ds.c == 3 && ds.h == 32 && ds.w == 32);
    assert_string_equal(ds.name, "synthetic");
    int count[10] = {0};
    for (int i = 0; i < ds.n; i++) count[ds.labels[i]]++;
    for (int k = 0; k < 10; k++) assert_int_equal(count[k], 500);
    // Not a fixed stride: the labels of positions 0, 10, 20, ... are not all the same class.
    int same = 0;
    for (int i = 10; i < ds.n; i += 10) same += ds.labels[i] == ds.labels[0];
    assert_true(same < 100);
    dataset_free(&ds);

    assert_int_equal(dataset_load(&ds, "synthetic", "ignored", SPLIT_TEST, err, sizeof err), 0);
    assert_int_equal(ds.n, 1000);
    memset(count, 0, sizeof count);
    for (int i = 0; i < ds.n; i++) count[ds.labels[i]]++;
    for (int k = 0; k < 10; k++) assert_int_equal(count[k], 100);
    dataset_free(&ds);

    // A size that is not a multiple of the class count: counts differ by at most one.
    dataset_synthetic(&ds, 1003, 7, 1, 28, 28, 3, SPLIT_TRAIN);
    int c7[7] = {0}, lo = 1 << 30, hi = 0;
    for (int i = 0; i < ds.n; i++) c7[ds.labels[i]]++;
    for (int k = 0; k < 7; k++) lo = c7[k] < lo ? c7[k] : lo, hi = c7[k] > hi ? c7[k] : hi;
    assert_true(hi - lo <= 1 && lo >= 143);
    assert_true(ds.std[0] > 0.05f && ds.mean[1] == 0.0f && ds.std[1] == 1.0f);
    dataset_free(&ds);
}

// Phase-invariant features of one image: per channel, the autocorrelation at a few small shifts, and
// the correlation between channels. They see orientation, frequency and colour mix, not position.
enum { FEAT = 3 * 6 + 3 };
static void texture_features(const uint8_t *img, float *f) {
    static const int lag[6][2] = {{0, 1}, {1, 0}, {1, 1}, {1, -1}, {0, 2}, {2, 0}};
    float z[3][32][32];
    for (int ch = 0; ch < 3; ch++) {
        double m = 0;
        for (int p = 0; p < 1024; p++) m += img[ch * 1024 + p];
        m /= 1024;
        for (int p = 0; p < 1024; p++) z[ch][p / 32][p % 32] = (float)(img[ch * 1024 + p] - m) / 255.0f;
    }
    int k = 0;
    for (int ch = 0; ch < 3; ch++)
        for (int l = 0; l < 6; l++) {
            double s = 0;
            for (int y = 2; y < 30; y++)
                for (int x = 2; x < 30; x++) s += z[ch][y][x] * z[ch][y + lag[l][0]][x + lag[l][1]];
            f[k++] = (float)s;
        }
    for (int a = 0; a < 3; a++) {
        double s = 0;
        for (int y = 0; y < 32; y++)
            for (int x = 0; x < 32; x++) s += z[a][y][x] * z[(a + 1) % 3][y][x];
        f[k++] = (float)s;
    }
}

// Nearest-centroid accuracy on the test split, with centroids from the train split, for a feature.
static double nearest_centroid(const Dataset *tr, const Dataset *te, int dim, void (*feat)(const uint8_t *, float *)) {
    double cen[10][FEAT] = {{0}};
    int cnt[10] = {0};
    float f[FEAT];
    for (int i = 0; i < tr->n; i++) {
        feat(tr->images + (size_t)i * 3072, f);
        for (int d = 0; d < dim; d++) cen[tr->labels[i]][d] += f[d];
        cnt[tr->labels[i]]++;
    }
    for (int k = 0; k < 10; k++)
        for (int d = 0; d < dim; d++) cen[k][d] /= cnt[k];
    int correct = 0;
    for (int i = 0; i < te->n; i++) {
        feat(te->images + (size_t)i * 3072, f);
        int best = 0;
        double best_d = INFINITY;
        for (int k = 0; k < 10; k++) {
            double dist = 0;
            for (int d = 0; d < dim; d++) dist += (f[d] - cen[k][d]) * (f[d] - cen[k][d]);
            if (dist < best_d) best_d = dist, best = k;
        }
        correct += best == te->labels[i];
    }
    return (double)correct / te->n;
}

static void mean_colour(const uint8_t *img, float *f) {
    for (int ch = 0; ch < 3; ch++) {
        double s = 0;
        for (int p = 0; p < 1024; p++) s += img[ch * 1024 + p];
        f[ch] = (float)(s / 1024);
    }
}

// The classes are in the texture (learnable, shared by both splits), not in the mean colour.
static void test_synthetic_learnable_not_by_colour(void **state) {
    Dataset tr, te;
    dataset_synthetic(&tr, 2000, 10, 3, 32, 32, 11, SPLIT_TRAIN);
    dataset_synthetic(&te, 500, 10, 3, 32, 32, 11, SPLIT_TEST);
    double by_texture = nearest_centroid(&tr, &te, FEAT, texture_features);
    double by_colour = nearest_centroid(&tr, &te, 3, mean_colour);
    print_message("nearest centroid on the test split: texture features %.1f%%, mean colour %.1f%% (chance 10%%)\n",
                  100 * by_texture, 100 * by_colour);
    assert_true(by_texture >= 0.8);
    assert_true(by_colour <= 0.25);
    dataset_free(&tr);
    dataset_free(&te);
}

// ---------------------------------------------------------------- CIFAR readers

static void test_cifar10_good(void **state) {
    const char *dir = fresh_dir("c10good");
    make_cifar10(dir, 7);
    Dataset ds;
    char err[512] = "";
    assert_int_equal(dataset_load(&ds, "cifar10", dir, SPLIT_TRAIN, err, sizeof err), 0);
    assert_string_equal(ds.name, "cifar10");
    assert_int_equal(ds.n, 35);
    assert_true(ds.c == 3 && ds.h == 32 && ds.w == 32 && ds.classes == 10);
    for (int i = 0; i < ds.n; i++) {
        assert_int_equal(ds.labels[i], i * 3 % 10);
        for (int ch = 0; ch < 3; ch++)
            for (int p = 0; p < 1024; p += 97) assert_int_equal(ds.images[(size_t)i * 3072 + ch * 1024 + p], pixel_of(i, ch, p));
    }
    float mean0 = ds.mean[0], std2 = ds.std[2];
    // The kit's per-channel constants are CIFAR-10's published ones (4 digits); 1e-3 tells them from CIFAR-100's.
    assert_true(fabsf(mean0 - 0.4914f) < 1e-3f && fabsf(std2 - 0.2616f) < 1e-3f);
    dataset_free(&ds);
    assert_int_equal(dataset_load_cifar10(&ds, dir, SPLIT_TEST, err, sizeof err), 0);
    assert_int_equal(ds.n, 5);
    assert_int_equal(ds.labels[4], 1004 * 3 % 10);
    assert_int_equal(ds.images[3072 * 2 + 1024 + 5], pixel_of(1002, 1, 5));
    assert_true(ds.mean[0] == mean0 && ds.std[2] == std2);  // the test split uses the training statistics
    dataset_free(&ds);
}

static void test_cifar100_good(void **state) {
    const char *dir = fresh_dir("c100good");
    char p[600];
    path_join(p, sizeof p, dir, "cifar-100-binary");
    assert_int_equal(mkdir(p, 0755), 0);
    path_join(p, sizeof p, dir, "cifar-100-binary/train.bin");
    write_cifar(p, 40, 2, 0, 100, 0);
    path_join(p, sizeof p, dir, "cifar-100-binary/test.bin");
    write_cifar(p, 3, 2, 500, 100, 0);
    Dataset ds;
    char err[512] = "";
    assert_int_equal(dataset_load(&ds, "cifar100", dir, SPLIT_TRAIN, err, sizeof err), 0);
    assert_int_equal(ds.n, 40);
    assert_int_equal(ds.classes, 100);
    for (int i = 0; i < 40; i++) assert_int_equal(ds.labels[i], i * 3 % 100);  // the fine label
    assert_int_equal(ds.images[(size_t)39 * 3072 + 2 * 1024 + 1000], pixel_of(39, 2, 1000));
    float m = ds.mean[1];
    dataset_free(&ds);
    assert_int_equal(dataset_load(&ds, "cifar100", dir, SPLIT_TEST, err, sizeof err), 0);
    assert_int_equal(ds.n, 3);
    assert_int_equal(ds.labels[2], 502 * 3 % 100);
    assert_true(ds.mean[1] == m);
    dataset_free(&ds);
}

// Loads and expects failure with a message that contains every given part.
static void expect_error(const char *name, const char *dir, Split split, const char *part1, const char *part2) {
    Dataset ds;
    char err[512] = "";
    memset(&ds, 0x5a, sizeof ds);  // garbage in: the loader must leave a clean, empty dataset
    assert_int_equal(dataset_load(&ds, name, dir, split, err, sizeof err), -1);
    print_message("  expected error: %s\n", err);
    assert_null(strchr(err, '\n'));  // one line
    assert_contains(err, part1);
    if (part2) assert_contains(err, part2);
    assert_not_loaded(&ds);
    dataset_free(&ds);  // harmless on an empty dataset
}

static void test_cifar_errors(void **state) {
    char p[600];
    // Missing folder.
    const char *dir = fresh_dir("c10missing");
    expect_error("cifar10", dir, SPLIT_TRAIN, "data_batch_1.bin: cannot open", "No such file");
    expect_error("cifar100", dir, SPLIT_TEST, "cifar-100-binary/test.bin: cannot open", NULL);

    // Empty file (a failed download).
    dir = fresh_dir("c10empty");
    make_cifar10(dir, 4);
    snprintf(p, sizeof p, "%s/cifar-10-batches-bin/data_batch_3.bin", dir);
    write_bytes(p, "", 0);
    expect_error("cifar10", dir, SPLIT_TRAIN, "data_batch_3.bin: file is empty", "records of 3073 bytes");

    // Truncated record: 4 records minus 100 bytes.
    dir = fresh_dir("c10trunc");
    make_cifar10(dir, 4);
    snprintf(p, sizeof p, "%s/cifar-10-batches-bin/test_batch.bin", dir);
    write_cifar(p, 4, 1, 0, 10, 100);
    expect_error("cifar10", dir, SPLIT_TEST, "test_batch.bin: truncated record: expected a multiple of 3073 bytes",
                 "found 12192 bytes (3 whole records + 2973 bytes)");

    // Wrong size: one training batch cut at a record boundary.
    dir = fresh_dir("c10short");
    make_cifar10(dir, 4);
    snprintf(p, sizeof p, "%s/cifar-10-batches-bin/data_batch_5.bin", dir);
    write_cifar(p, 3, 1, 0, 10, 0);
    expect_error("cifar10", dir, SPLIT_TRAIN, "data_batch_5.bin: wrong size", "expected 4 records like");

    // Bad labels: CIFAR-10 label 10 in record 2; CIFAR-100 fine label 100.
    dir = fresh_dir("c10label");
    make_cifar10(dir, 4);
    snprintf(p, sizeof p, "%s/cifar-10-batches-bin/data_batch_2.bin", dir);
    write_cifar(p, 4, 1, 0, 10, 0);
    FILE *f = fopen(p, "r+b");
    fseek(f, 2 * 3073, SEEK_SET);
    fputc(10, f);
    fclose(f);
    expect_error("cifar10", dir, SPLIT_TRAIN, "data_batch_2.bin: record 2 has label 10", "expected 0..9");

    dir = fresh_dir("c100label");
    snprintf(p, sizeof p, "%s/cifar-100-binary", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/cifar-100-binary/train.bin", dir);
    write_cifar(p, 3, 2, 0, 100, 0);
    f = fopen(p, "r+b");
    fseek(f, 3074 + 1, SEEK_SET);
    fputc(100, f);
    fclose(f);
    expect_error("cifar100", dir, SPLIT_TRAIN, "train.bin: record 1 has label 100", "expected 0..99");
    // CIFAR-100 truncated: 3 records minus one byte.
    write_cifar(p, 3, 2, 0, 100, 1);
    expect_error("cifar100", dir, SPLIT_TRAIN, "train.bin: truncated record", "found 9221 bytes (2 whole records + 3073 bytes)");

    expect_error("imagenet", dir, SPLIT_TRAIN, "unknown dataset 'imagenet'", "synthetic|cifar10|cifar100|fashion-mnist");
}

// ---------------------------------------------------------------- Fashion-MNIST (IDX) reader

static void put_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

typedef struct {
    uint32_t img_magic, lab_magic, rows, cols, n_img, n_lab;
    int bad_label_at;   // -1: none
    int cut_images;     // bytes removed from the end of the image file
    int extra_images;   // bytes appended to the image file
    bool gz;
} IdxSpec;

static IdxSpec idx_good(int n, bool gz) {
    IdxSpec s = {0x803, 0x801, 28, 28, (uint32_t)n, (uint32_t)n, -1, 0, 0, gz};
    return s;
}

// Writes dir/<prefix>-images-idx3-ubyte[.gz] and the labels file from a spec.
static void write_idx(const char *dir, const char *prefix, const IdxSpec *s) {
    size_t pix = (size_t)s->n_img * s->rows * s->cols;
    size_t ilen = 16 + pix + (size_t)s->extra_images - (size_t)s->cut_images;
    uint8_t *img = calloc(16 + pix + (size_t)s->extra_images + 1, 1), *lab = malloc(8 + s->n_lab + 1);
    put_be32(img, s->img_magic), put_be32(img + 4, s->n_img), put_be32(img + 8, s->rows), put_be32(img + 12, s->cols);
    for (size_t i = 0; i < pix; i++) img[16 + i] = pixel_of((int)(i / 784), 0, (int)(i % 784));
    put_be32(lab, s->lab_magic), put_be32(lab + 4, s->n_lab);
    for (uint32_t i = 0; i < s->n_lab; i++) lab[8 + i] = (uint8_t)(i * 7 % 10);
    if (s->bad_label_at >= 0) lab[8 + s->bad_label_at] = 10;
    char p[600];
    snprintf(p, sizeof p, "%s/%s-images-idx3-ubyte%s", dir, prefix, s->gz ? ".gz" : "");
    s->gz ? write_gz(p, img, ilen) : write_bytes(p, img, ilen);
    snprintf(p, sizeof p, "%s/%s-labels-idx1-ubyte%s", dir, prefix, s->gz ? ".gz" : "");
    s->gz ? write_gz(p, lab, 8 + s->n_lab) : write_bytes(p, lab, 8 + s->n_lab);
    free(img);
    free(lab);
}

static void check_idx_loaded(const Dataset *ds, int n) {
    assert_string_equal(ds->name, "fashion-mnist");
    assert_int_equal(ds->n, n);
    assert_true(ds->c == 1 && ds->h == 28 && ds->w == 28 && ds->classes == 10);
    for (int i = 0; i < n; i++) {
        assert_int_equal(ds->labels[i], i * 7 % 10);
        for (int p = 0; p < 784; p += 55) assert_int_equal(ds->images[(size_t)i * 784 + p], pixel_of(i, 0, p));
    }
    // Fashion-MNIST's published constants (4 digits): 1e-3 is their rounding with a margin, and tells them from
    // MNIST's (0.1307, 0.3081).
    assert_true(fabsf(ds->mean[0] - 0.2860f) < 1e-3f && fabsf(ds->std[0] - 0.3530f) < 1e-3f);
}

static void test_idx_plain_and_gz(void **state) {
    Dataset ds;
    char err[512] = "";
    const char *dir = fresh_dir("idxplain");
    IdxSpec s = idx_good(12, false);
    write_idx(dir, "train", &s);
    s.n_img = s.n_lab = 4;
    write_idx(dir, "t10k", &s);
    assert_int_equal(dataset_load(&ds, "fashion-mnist", dir, SPLIT_TRAIN, err, sizeof err), 0);
    check_idx_loaded(&ds, 12);
    dataset_free(&ds);
    assert_int_equal(dataset_load_fashion_mnist(&ds, dir, SPLIT_TEST, err, sizeof err), 0);
    check_idx_loaded(&ds, 4);
    dataset_free(&ds);

    dir = fresh_dir("idxgz");
    s = idx_good(9, true);
    write_idx(dir, "train", &s);
    assert_int_equal(dataset_load(&ds, "fashion-mnist", dir, SPLIT_TRAIN, err, sizeof err), 0);
    check_idx_loaded(&ds, 9);
    dataset_free(&ds);
    // Both present: the .gz is preferred (the plain files here are broken on purpose).
    s = idx_good(9, false);
    s.img_magic = 0x1234;
    write_idx(dir, "train", &s);
    assert_int_equal(dataset_load(&ds, "fashion-mnist", dir, SPLIT_TRAIN, err, sizeof err), 0);
    check_idx_loaded(&ds, 9);
    dataset_free(&ds);
}

static void test_idx_errors(void **state) {
    const char *dir = fresh_dir("idxmissing");
    expect_error("fashion-mnist", dir, SPLIT_TRAIN, "train-images-idx3-ubyte.gz: missing", "dataset-fashion-mnist");

    for (int gz = 0; gz < 2; gz++) {
        IdxSpec s = idx_good(6, gz);
        dir = fresh_dir(gz ? "idxmagic-gz" : "idxmagic");
        s.img_magic = 0x804;
        write_idx(dir, "train", &s);
        expect_error("fashion-mnist", dir, SPLIT_TRAIN, "train-images-idx3-ubyte", "wrong IDX magic: expected 0x00000803, found 0x00000804");

        s = idx_good(6, gz);
        s.lab_magic = 0x803;
        write_idx(dir, "train", &s);
        expect_error("fashion-mnist", dir, SPLIT_TRAIN, "train-labels-idx1-ubyte", "wrong IDX magic: expected 0x00000801, found 0x00000803");

        s = idx_good(6, gz);
        s.rows = 32;
        write_idx(dir, "t10k", &s);
        expect_error("fashion-mnist", dir, SPLIT_TEST, "t10k-images-idx3-ubyte", "wrong dimensions: expected 28x28 images, found 32x28");

        s = idx_good(6, gz);
        s.cut_images = 100;
        write_idx(dir, "train", &s);
        expect_error("fashion-mnist", dir, SPLIT_TRAIN, "train-images-idx3-ubyte", "truncated images: expected 4704 bytes, found 4604");

        s = idx_good(6, gz);
        s.cut_images = 4704 + 10;  // inside the header
        write_idx(dir, "train", &s);
        expect_error("fashion-mnist", dir, SPLIT_TRAIN, "train-images-idx3-ubyte", "truncated IDX header: expected 16 bytes, found 6");

        s = idx_good(6, gz);
        s.extra_images = 3;
        write_idx(dir, "train", &s);
        expect_error("fashion-mnist", dir, SPLIT_TRAIN, "train-images-idx3-ubyte", "trailing bytes after the 4704 bytes");

        s = idx_good(6, gz);
        s.bad_label_at = 4;
        write_idx(dir, "train", &s);
        expect_error("fashion-mnist", dir, SPLIT_TRAIN, "train-labels-idx1-ubyte", "label 10 of record 4: expected 0..9");

        s = idx_good(6, gz);
        s.n_lab = 5;
        write_idx(dir, "train", &s);
        expect_error("fashion-mnist", dir, SPLIT_TRAIN, "train-labels-idx1-ubyte", "wrong size: expected 6 labels");
    }
    // An empty file.
    dir = fresh_dir("idxempty");
    IdxSpec s = idx_good(3, false);
    write_idx(dir, "train", &s);
    char p[600];
    snprintf(p, sizeof p, "%s/train-labels-idx1-ubyte", dir);
    write_bytes(p, "", 0);
    expect_error("fashion-mnist", dir, SPLIT_TRAIN, "train-labels-idx1-ubyte: file is empty", "expected an IDX file");
    // A gzip stream cut in the middle: truncated, whatever zlib says about it.
    dir = fresh_dir("idxgzcut");
    s = idx_good(50, true);
    write_idx(dir, "train", &s);
    snprintf(p, sizeof p, "%s/train-images-idx3-ubyte.gz", dir);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(truncate(p, st.st_size / 2), 0);
    expect_error("fashion-mnist", dir, SPLIT_TRAIN, "train-images-idx3-ubyte.gz: truncated images: expected 39200 bytes", NULL);
}

// ---------------------------------------------------------------- the real Fashion-MNIST (Debian package)

static void test_real_fashion_mnist(void **state) {
    const char *dir = "/usr/share/datasets/fashion-mnist";
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        print_message("[  SKIP    ] %s is not installed (apt install dataset-fashion-mnist)\n", dir);
        skip();
    }
    Dataset tr, te;
    char err[512] = "";
    int rc = dataset_load(&tr, "fashion-mnist", dir, SPLIT_TRAIN, err, sizeof err);
    if (rc != 0) print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(dataset_load(&te, "fashion-mnist", dir, SPLIT_TEST, err, sizeof err), 0);
    assert_int_equal(tr.n, 60000);
    assert_int_equal(te.n, 10000);
    int ctr[10] = {0}, cte[10] = {0};
    for (int i = 0; i < tr.n; i++) ctr[tr.labels[i]]++;  // labels are < 10: the reader checked each
    for (int i = 0; i < te.n; i++) cte[te.labels[i]]++;
    for (int k = 0; k < 10; k++) assert_true(ctr[k] == 6000 && cte[k] == 1000);
    // The published constants agree with the training images themselves.
    double s = 0, s2 = 0, cnt = (double)tr.n * 784;
    for (size_t i = 0; i < (size_t)tr.n * 784; i++) s += tr.images[i], s2 += (double)tr.images[i] * tr.images[i];
    double mean = s / cnt / 255, std = sqrt(s2 / cnt - (s / cnt) * (s / cnt)) / 255;
    print_message("Fashion-MNIST train: mean %.5f std %.5f (constants %.4f %.4f)\n", mean, std, tr.mean[0], tr.std[0]);
    // Computed in double over 47 million pixels (exact to 1e-12); the constants have 4 digits: 5e-5 of rounding,
    // and the published values were computed with slightly different conventions, so 5e-4.
    assert_true(fabs(mean - tr.mean[0]) < 5e-4 && fabs(std - tr.std[0]) < 5e-4);
    assert_true(te.mean[0] == tr.mean[0] && te.std[0] == tr.std[0]);
    dataset_free(&tr);
    dataset_free(&te);
}

// ---------------------------------------------------------------- batches: normalisation and augmentation

// The normalised pixel, (v / 255 - mean) / std, in float: 3 roundings of numbers below 4 in size, so any other
// order of the same operations is within 3 x 4 x u = 7.2e-7 < 1e-6 of it (u = 2^-24); a missing / 255 or a
// swapped channel is off by 0.1 or more. No BLAS: the same on every CPU.
static float norm_ref(const Dataset *ds, int ch, uint8_t v) { return ((float)v / 255.0f - ds->mean[ch]) / ds->std[ch]; }

static void test_fill_normalises(void **state) {
    Dataset ds;
    dataset_synthetic(&ds, 1000, 10, 3, 32, 32, 2, SPLIT_TRAIN);
    enum { B = 1000 };
    int *idx = malloc(B * sizeof *idx), *y = malloc(B * sizeof *y);
    float *x = malloc((size_t)B * 3072 * sizeof *x);
    for (int i = 0; i < B; i++) idx[i] = (i * 7) % 1000;  // a permutation
    dataset_fill_batch(&ds, idx, B, NULL, 1, 0, x, y);
    for (int j = 0; j < B; j += 37) {
        assert_int_equal(y[j], ds.labels[idx[j]]);
        for (int p = 0; p < 3072; p += 11)
            assert_float_equal(x[(size_t)j * 3072 + p], norm_ref(&ds, p / 1024, ds.images[(size_t)idx[j] * 3072 + p]), 1e-6);
    }
    // Over the images the statistics came from, every channel has mean 0 and std 1.
    for (int ch = 0; ch < 3; ch++) {
        double s = 0, s2 = 0;
        for (int j = 0; j < B; j++)
            for (int p = 0; p < 1024; p++) {
                double v = x[(size_t)j * 3072 + ch * 1024 + p];
                s += v, s2 += v * v;
            }
        double m = s / (B * 1024.0), sd = sqrt(s2 / (B * 1024.0) - m * m);
        // B is the whole set the constants were computed from (in double), so mean 0 and std 1 hold up to the
        // constants' rounding to float (u x 0.5 / 0.25 = 1e-7) and the normalisation's (7.2e-7, norm_ref); a
        // constant of another split or channel is off by 1e-2 or more.
        assert_true(fabs(m) < 1e-3 && fabs(sd - 1) < 1e-3);
    }
    free(idx), free(y), free(x);
    dataset_free(&ds);
}

// Finds the crop offset (dy, dx) and flip that turn the raw image into out; returns false if none does.
static bool find_transform(const Dataset *ds, int sample, const float *out, int pad, int *dy, int *dx, int *flip) {
    const uint8_t *src = ds->images + (size_t)sample * ds->c * ds->h * ds->w;
    int H = ds->h, W = ds->w;
    for (int f = 0; f < 2; f++)
        for (int oy = -pad; oy <= pad; oy++)
            for (int ox = -pad; ox <= pad; ox++) {
                bool ok = true;
                for (int ch = 0; ch < ds->c && ok; ch++)
                    for (int y = 0; y < H && ok; y++)
                        for (int x = 0; x < W && ok; x++) {
                            int sy = y + oy, sx = (f ? W - 1 - x : x) + ox;
                            uint8_t raw = (sy < 0 || sy >= H || sx < 0 || sx >= W) ? 0 : src[(ch * H + sy) * W + sx];
                            ok = fabsf(out[(ch * H + y) * W + x] - norm_ref(ds, ch, raw)) <= 1e-6f;
                        }
                if (ok) {
                    *dy = oy, *dx = ox, *flip = f;
                    return true;
                }
            }
    return false;
}

static void test_fill_augmentation(void **state) {
    Dataset ds;
    dataset_synthetic(&ds, 200, 10, 3, 16, 16, 4, SPLIT_TRAIN);
    enum { B = 64, IMG = 3 * 16 * 16 };
    int idx[B], y[B], y2[B];
    static float x[B * IMG], x2[B * IMG], plain[B * IMG];
    for (int i = 0; i < B; i++) idx[i] = 3 * i + 1;
    Augment aug = {.crop_pad = 4, .flip = true};
    dataset_fill_batch(&ds, idx, B, NULL, 9, 2, plain, y);
    dataset_fill_batch(&ds, idx, B, &aug, 9, 2, x, y);

    // Every output is the raw image padded with raw zeros, cropped and maybe mirrored; the moves vary.
    int flips = 0, moved = 0, seen_dx[9] = {0};
    for (int j = 0; j < B; j++) {
        int dy, dx, f;
        assert_true(find_transform(&ds, idx[j], x + (size_t)j * IMG, 4, &dy, &dx, &f));
        flips += f;
        moved += dy != 0 || dx != 0;
        seen_dx[dx + 4] = 1;
        if (f || dy || dx) assert_memory_not_equal(x + (size_t)j * IMG, plain + (size_t)j * IMG, IMG * sizeof(float));
    }
    int distinct = 0;
    for (int k = 0; k < 9; k++) distinct += seen_dx[k];
    print_message("64 samples: %d flipped, %d shifted, %d distinct horizontal offsets\n", flips, moved, distinct);
    assert_true(flips >= 16 && flips <= 48);
    assert_true(moved >= 48 && distinct >= 6);
    // A padded pixel is a raw 0 after normalisation: -mean/std.
    bool saw_pad = false;
    for (int j = 0; j < B && !saw_pad; j++) {
        int dy, dx, f;
        find_transform(&ds, idx[j], x + (size_t)j * IMG, 4, &dy, &dx, &f);
        if (dy < 0) {
            assert_float_equal(x[(size_t)j * IMG], -ds.mean[0] / ds.std[0], 1e-6);
            saw_pad = true;
        }
    }
    assert_true(saw_pad);

    // Deterministic, and a function of (seed, epoch, sample index) only: not of the batch position.
    int rev[B];
    for (int j = 0; j < B; j++) rev[j] = idx[B - 1 - j];
    omp_set_num_threads(1);
    dataset_fill_batch(&ds, rev, B, &aug, 9, 2, x2, y2);
    omp_set_num_threads(omp_get_num_procs());
    for (int j = 0; j < B; j++) {
        assert_memory_equal(x + (size_t)j * IMG, x2 + (size_t)(B - 1 - j) * IMG, IMG * sizeof(float));
        assert_int_equal(y[j], y2[B - 1 - j]);
    }
    // Another epoch or another seed: other crops and flips for most samples.
    for (int variant = 0; variant < 2; variant++) {
        dataset_fill_batch(&ds, idx, B, &aug, variant ? 10 : 9, variant ? 2 : 3, x2, y2);
        int differ = 0;
        for (int j = 0; j < B; j++) differ += memcmp(x + (size_t)j * IMG, x2 + (size_t)j * IMG, IMG * sizeof(float)) != 0;
        assert_true(differ >= B * 3 / 4);
    }
    // Flip alone and crop alone.
    Augment only_flip = {.crop_pad = 0, .flip = true}, only_crop = {.crop_pad = 2, .flip = false};
    dataset_fill_batch(&ds, idx, B, &only_flip, 9, 2, x2, y2);
    int f_count = 0;
    for (int j = 0; j < B; j++) {
        int dy, dx, f;
        assert_true(find_transform(&ds, idx[j], x2 + (size_t)j * IMG, 0, &dy, &dx, &f));
        f_count += f;
    }
    assert_true(f_count > 0 && f_count < B);
    dataset_fill_batch(&ds, idx, B, &only_crop, 9, 2, x2, y2);
    for (int j = 0; j < B; j++) {
        int dy, dx, f;
        assert_true(find_transform(&ds, idx[j], x2 + (size_t)j * IMG, 2, &dy, &dx, &f));
        assert_int_equal(f, 0);
    }
    dataset_free(&ds);
}

// A sample index outside the dataset is a clear error and exit, not a read out of bounds.
static void test_fill_bad_index_exits(void **state) {
    Dataset ds;
    dataset_synthetic(&ds, 20, 10, 3, 8, 8, 4, SPLIT_TRAIN);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(2);  // the child only: its expected error stays quiet
        int idx[2] = {3, 20}, y[2];
        float x[2 * 3 * 8 * 8];
        dataset_fill_batch(&ds, idx, 2, NULL, 1, 0, x, y);
        _exit(0);  // not reached
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    dataset_free(&ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synthetic_deterministic),
        cmocka_unit_test(test_synthetic_class_balance),
        cmocka_unit_test(test_synthetic_learnable_not_by_colour),
        cmocka_unit_test(test_cifar10_good),
        cmocka_unit_test(test_cifar100_good),
        cmocka_unit_test(test_cifar_errors),
        cmocka_unit_test(test_idx_plain_and_gz),
        cmocka_unit_test(test_idx_errors),
        cmocka_unit_test(test_real_fashion_mnist),
        cmocka_unit_test(test_fill_normalises),
        cmocka_unit_test(test_fill_augmentation),
        cmocka_unit_test(test_fill_bad_index_exits),
    };
    return cmocka_run_group_tests(tests, setup_tmp, teardown_tmp);
}
