// image.c: lesson 06, given: image files (PNG through libpng, raw bytes), the datasets' class names.
#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

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

// ---------------------------------------------------------------- PNG files (libpng's low-level reader)
//
// The network must see the bytes the file stores, as PIL (and torchvision's ImageFolder, which reads through
// it) hands them to a PyTorch model. libpng's simplified reader (png_image_*) does not: it converts to linear
// light and back when it composes, changes depth or honours a gAMA chunk, so an 8-bit file with gAMA 1.0 or a
// 16-bit file came out as other numbers (1 -> 20, 64 -> 136, 128 -> 186). The low-level reader applies only
// the transforms asked for, and none of them touches gamma:
//   - 16-bit samples keep their high byte (v >> 8, png_set_strip_16), as PIL decodes 16-bit colour and as
//     torchvision scales uint16 to uint8; a 16-bit file of an 8-bit picture (v * 257) gives back v exactly.
//     (PIL opens 16-bit gray as "I;16", whose convert("L") clips at 255 -- every such picture turns white --
//     so for gray the kit follows torchvision and PIL's colour rule, not that conversion);
//   - gray of 1, 2 or 4 bits is expanded to 0..255 by repeating its bits (as PIL does);
//   - a palette is expanded to its colours, and a palette whose entries are all gray is a gray image;
//   - alpha (an alpha channel, or tRNS) is dropped, as PIL's convert("RGB") / convert("L") drop it.
// The header is read first, and a size other than the model's is refused before any pixel is decoded.

typedef struct {
    const char *path;
    char *err;
    size_t errlen;
} PngContext;

static void png_on_error(png_structp png, png_const_charp msg) {
    PngContext *ctx = png_get_error_ptr(png);
    check_reason(ctx->err, ctx->errlen, "%s: not a readable PNG: %s", ctx->path, msg);
    png_longjmp(png, 1);
}

// Warnings (an unknown or damaged ancillary chunk such as iCCP) leave the pixels as stored: not worth a line.
static void png_on_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

// True when every entry of the palette is gray (red = green = blue): the picture is then a gray one.
static bool palette_is_gray(png_structp png, png_infop info) {
    png_colorp palette = NULL;
    int entries = 0;
    if (png_get_PLTE(png, info, &palette, &entries) == 0) return false;
    for (int i = 0; i < entries; i++)
        if (palette[i].red != palette[i].green || palette[i].green != palette[i].blue) return false;
    return true;
}

// Reads the PNG open in f (its 8-byte signature already read) into img: c = 1 (gray) or 3 (colour).
static int read_png(FILE *f, const char *path, int want_h, int want_w, Image *img, char *err, size_t errlen) {
    PngContext ctx = {path, err, errlen};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &ctx, png_on_error, png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        png_destroy_read_struct(&png, NULL, NULL);
        return check_reason(err, errlen, "%s: libpng could not start (out of memory?)", path);
    }
    uint8_t *volatile packed = NULL;        // (h, rowbytes): the decoded rows, interleaved as the file has them
    png_bytep *volatile rows = NULL;        // (h): pointers into packed
    if (setjmp(png_jmpbuf(png))) {          // a libpng error: png_on_error wrote the reason
        free(packed), free(rows);
        image_free(img);
        png_destroy_read_struct(&png, &info, NULL);
        return -1;
    }
    png_init_io(png, f);
    png_set_sig_bytes(png, 8);
    png_read_info(png, info);
    png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
    int type = png_get_color_type(png, info), depth = png_get_bit_depth(png, info);
    if (w != (png_uint_32)want_w || h != (png_uint_32)want_h) {
        png_destroy_read_struct(&png, &info, NULL);
        return check_reason(err, errlen, "%s: the image is %ux%u, the model takes %dx%d (read from the PNG header: "
                            "nothing decoded; resize it to the model's size first)", path, (unsigned)w, (unsigned)h,
                            want_w, want_h);
    }
    bool gray_palette = type == PNG_COLOR_TYPE_PALETTE && palette_is_gray(png, info);
    img->c = (type & PNG_COLOR_MASK_COLOR) && !gray_palette ? 3 : 1;
    img->h = (int)h, img->w = (int)w;
    if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (!(type & PNG_COLOR_MASK_COLOR) && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    int stride = png_get_channels(png, info);  // 1..4 bytes per pixel now: the first c are the colour
    size_t rowbytes = png_get_rowbytes(png, info), plane = (size_t)w * h;
    packed = xmalloc(rowbytes * h);
    rows = xmalloc(h * sizeof(png_bytep));
    for (png_uint_32 y = 0; y < h; y++) rows[y] = packed + y * rowbytes;
    png_read_image(png, rows);
    img->pixels = xmalloc(plane * (size_t)img->c);  // (c, h, w): the datasets' order
    for (int ch = 0; ch < img->c; ch++)
        for (png_uint_32 y = 0; y < h; y++)
            for (png_uint_32 x = 0; x < w; x++)
                img->pixels[ch * plane + (size_t)y * w + x] = rows[y][(size_t)x * stride + ch];
    free(packed), free(rows);
    png_destroy_read_struct(&png, &info, NULL);
    return 0;
}

// Raw: exactly c*h*w bytes, (c, h, w) like a CIFAR record without its label.
static int read_raw(FILE *f, off_t size, const char *path, int want_c, int want_h, int want_w, Image *img,
                    char *err, size_t errlen) {
    size_t want = (size_t)want_c * want_h * want_w;
    if ((size_t)size != want)
        return check_reason(err, errlen, "%s: not a PNG, and %lld bytes is not a raw image of the model's shape "
                            "(%d x %d x %d = %zu bytes, channels first)%s", path, (long long)size, want_c, want_h,
                            want_w, want, want_c > 1 && size > 0 && (size_t)size * (size_t)want_c == want
                                ? ": it has the size of a one-channel image" : "");
    img->c = want_c, img->h = want_h, img->w = want_w;
    img->pixels = xmalloc(want);
    rewind(f);
    size_t got = fread(img->pixels, 1, want, f);
    if (got != want) {
        image_free(img);
        return check_reason(err, errlen, "%s: read %zu of %zu bytes%s%s", path, got, want, ferror(f) ? ": " : "",
                            ferror(f) ? strerror(errno) : "");
    }
    return 0;
}

int image_read(const char *path, int want_c, int want_h, int want_w, Image *img, char *err, size_t errlen) {
    memset(img, 0, sizeof *img);
    FILE *f = fopen(path, "rb");
    if (!f) return check_reason(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        int rc = check_reason(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        fclose(f);
        return rc;
    }
    if (!S_ISREG(sb.st_mode)) {  // a directory opens, then fails every read: say what it is
        int rc = check_reason(err, errlen, "%s: %s, not an image file (give a PNG, or a raw file of %d x %d x %d "
                              "bytes)", path, S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file", want_c,
                              want_h, want_w);
        fclose(f);
        return rc;
    }
    uint8_t sig[8] = {0};
    size_t got = fread(sig, 1, sizeof sig, f);
    int rc = got == sizeof sig && png_sig_cmp(sig, 0, sizeof sig) == 0
                 ? read_png(f, path, want_h, want_w, img, err, errlen)
                 : read_raw(f, sb.st_size, path, want_c, want_h, want_w, img, err, errlen);
    fclose(f);
    return rc;
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

// The names live in the kit's dataset table (kit/data.c), the one place that knows a dataset.
const char *class_name(const char *dataset, int k) {
    const DatasetInfo *info = dataset_info(dataset);
    const char *const *names = info ? info->class_names : NULL;
    for (int i = 0; names && names[i]; i++)
        if (i == k) return names[i];
    static _Thread_local char name[32];  // no names (CIFAR-100), or k past them
    snprintf(name, sizeof name, "class %d", k);
    return name;
}
