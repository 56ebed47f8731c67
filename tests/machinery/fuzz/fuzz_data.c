// tests/machinery/fuzz/fuzz_data.c: libFuzzer target over the dataset readers (kit/data.c).
//
// The first input byte picks the reader: CIFAR-10 (test_batch.bin), CIFAR-100 (test.bin) or Fashion-MNIST
// (t10k-images-idx3-ubyte + t10k-labels-idx1-ubyte: the next two bytes give the images file's length, the
// rest is the labels file; IDX may also be gzip, which zlib detects). The files are written to a private
// temporary folder and read with dataset_load, which must return 0 or -1 with a message: never crash.
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kit/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[64];

static void put(const char *name, const uint8_t *p, size_t n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

static void cleanup(void) {
    const char *names[] = {"cifar-10-batches-bin/test_batch.bin", "cifar-10-batches-bin", "cifar-100-binary/test.bin",
                           "cifar-100-binary", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    char path[256];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, names[i]);
        if (unlink(path) != 0) rmdir(path);
    }
    rmdir(g_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/fuzz_data.XXXXXX");
        if (!mkdtemp(g_dir)) abort();
        char sub[128];
        snprintf(sub, sizeof sub, "%s/cifar-10-batches-bin", g_dir);
        mkdir(sub, 0700);
        snprintf(sub, sizeof sub, "%s/cifar-100-binary", g_dir);
        mkdir(sub, 0700);
        atexit(cleanup);
    }
    if (size < 1) return 0;
    int which = data[0] % 3;
    data++, size--;
    const char *name;
    if (which == 0) {
        put("cifar-10-batches-bin/test_batch.bin", data, size);
        name = "cifar10";
    } else if (which == 1) {
        put("cifar-100-binary/test.bin", data, size);
        name = "cifar100";
    } else {
        if (size < 2) return 0;
        size_t n_images = (size_t)data[0] | (size_t)data[1] << 8;
        data += 2, size -= 2;
        if (n_images > size) n_images = size;
        put("t10k-images-idx3-ubyte", data, n_images);
        put("t10k-labels-idx1-ubyte", data + n_images, size - n_images);
        name = "fashion-mnist";
    }
    Dataset ds;
    char err[512];
    if (dataset_load(&ds, name, g_dir, SPLIT_TEST, err, sizeof err) == 0) dataset_free(&ds);
    return 0;
}
