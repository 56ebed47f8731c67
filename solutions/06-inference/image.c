// image.c: lesson 06, given: image files (PNG through libpng, raw bytes), the datasets' class names.
#include <errno.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "lesson.h"

void eval_report_free(EvalReport *r) {
    free(r->confusion);
    r->confusion = NULL;
}

void image_free(Image *img) {
    free(img->pixels);
    img->pixels = NULL;
}

Image image_of_sample(const Dataset *ds, int index) {
    CHECK(index >= 0 && index < ds->n, "image_of_sample: the index is outside the dataset");
    Image img = {.c = ds->c, .h = ds->h, .w = ds->w};
    size_t bytes = (size_t)ds->c * ds->h * ds->w;
    img.pixels = xmalloc(bytes);
    memcpy(img.pixels, ds->images + (size_t)index * bytes, bytes);
    return img;
}

// libpng's simplified API: the file's own format tells gray or colour; 16-bit and palette images come out as
// 8-bit, alpha is composited onto black (background NULL), so c is 1 or 3.
static int read_png(const char *path, Image *img, char *err, size_t errlen) {
    png_image pi;
    memset(&pi, 0, sizeof pi);
    pi.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_file(&pi, path))
        return check_reason(err, errlen, "%s: not a readable PNG: %s", path, pi.message);
    img->c = (pi.format & PNG_FORMAT_FLAG_COLOR) ? 3 : 1;
    img->h = (int)pi.height, img->w = (int)pi.width;
    pi.format = img->c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
    size_t plane = (size_t)pi.width * pi.height;
    uint8_t *packed = xmalloc(PNG_IMAGE_SIZE(pi));  // (h, w, c): PNG's order
    if (!png_image_finish_read(&pi, NULL, packed, 0, NULL)) {
        free(packed);
        return check_reason(err, errlen, "%s: PNG decoding failed: %s", path, pi.message);
    }
    img->pixels = xmalloc(plane * (size_t)img->c);  // (c, h, w): the datasets' order
    for (int ch = 0; ch < img->c; ch++)
        for (size_t i = 0; i < plane; i++) img->pixels[ch * plane + i] = packed[i * (size_t)img->c + ch];
    free(packed);
    png_image_free(&pi);
    return 0;
}

int image_read(const char *path, int want_c, int want_h, int want_w, Image *img, char *err, size_t errlen) {
    memset(img, 0, sizeof *img);
    FILE *f = fopen(path, "rb");
    if (!f) return check_reason(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    uint8_t sig[8] = {0};
    size_t got = fread(sig, 1, sizeof sig, f);
    if (got == sizeof sig && png_sig_cmp(sig, 0, sizeof sig) == 0) {
        fclose(f);
        return read_png(path, img, err, errlen);
    }
    // Raw: exactly c*h*w bytes, (c, h, w) like a CIFAR record without its label.
    size_t want = (size_t)want_c * want_h * want_w;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    if (size < 0 || (size_t)size != want) {
        fclose(f);
        return check_reason(err, errlen, "%s: not a PNG, and %ld bytes is not a raw image of the model's shape "
                            "(%d x %d x %d = %zu bytes, channels first)%s", path, size, want_c, want_h, want_w, want,
                            want_c > 1 && size > 0 && (size_t)size * (size_t)want_c == want
                                ? ": it has the size of a one-channel image" : "");
    }
    rewind(f);
    img->c = want_c, img->h = want_h, img->w = want_w;
    img->pixels = xmalloc(want);
    got = fread(img->pixels, 1, want, f);
    fclose(f);
    if (got != want) {
        image_free(img);
        return check_reason(err, errlen, "%s: read %zu of %zu bytes", path, got, want);
    }
    return 0;
}

int image_write_png(const char *path, const Image *img, char *err, size_t errlen) {
    CHECK(img->c == 1 || img->c == 3, "image_write_png: 1 or 3 channels");
    png_image pi;
    memset(&pi, 0, sizeof pi);
    pi.version = PNG_IMAGE_VERSION;
    pi.width = (png_uint_32)img->w, pi.height = (png_uint_32)img->h;
    pi.format = img->c == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
    size_t plane = (size_t)img->h * img->w;
    uint8_t *packed = xmalloc(plane * (size_t)img->c);  // (h, w, c)
    for (int ch = 0; ch < img->c; ch++)
        for (size_t i = 0; i < plane; i++) packed[i * (size_t)img->c + ch] = img->pixels[ch * plane + i];
    int ok = png_image_write_to_file(&pi, path, 0, packed, 0, NULL);
    free(packed);
    if (!ok) return check_reason(err, errlen, "%s: cannot write the PNG: %s", path, pi.message);
    return 0;
}

// ---------------------------------------------------------------- class names

static const char *const CIFAR10[] = {"airplane", "automobile", "bird", "cat", "deer",
                                      "dog", "frog", "horse", "ship", "truck"};
static const char *const FASHION[] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                      "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};

const char *class_name(const char *dataset, int k) {
    if (k >= 0 && k < 10 && strcmp(dataset, "cifar10") == 0) return CIFAR10[k];
    if (k >= 0 && k < 10 && strcmp(dataset, "fashion-mnist") == 0) return FASHION[k];
    static _Thread_local char name[32];  // the synthetic set's classes are patterns; CIFAR-100: by number
    snprintf(name, sizeof name, "%s %d", strcmp(dataset, "synthetic") == 0 ? "pattern" : "class", k);
    return name;
}
