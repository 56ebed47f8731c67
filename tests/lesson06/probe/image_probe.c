// tests/lesson06/probe/image_probe.c: lesson 06's image reader (solutions/06-inference/image.c) on one file, for
// tests/lesson06/test_images.py, which compares what it prints with what PIL reads from the same file.
//
//   image_probe FILE C H W      ->  "image C H W" then the bytes (c, h, w) in decimal on one line; exit 0
//                                   "error: <reason>"; exit 1
// (In its own folder: every tests/lesson06/*.c is linked into the autograder.)
#include <stdio.h>
#include <stdlib.h>

#include "lesson.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s FILE C H W\n", argv[0]);
        return 2;
    }
    Image img;
    char err[1024];
    if (image_read(argv[1], atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), &img, err, sizeof err) != 0) {
        printf("error: %s\n", err);
        return 1;
    }
    printf("image %d %d %d\n", img.c, img.h, img.w);
    size_t n = (size_t)img.c * img.h * img.w;
    for (size_t i = 0; i < n; i++) printf("%s%u", i ? " " : "", img.pixels[i]);
    printf("\n");
    image_free(&img);
    return 0;
}
