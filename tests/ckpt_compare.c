// tests/ckpt_compare.c: compares the tensors of two checkpoints (the lesson 04 checks of tests/lesson04/).
//
//   ckpt_compare A B [TOLERANCE]
//
// Prints "identical" when every tensor (params, momentum, buffers) is equal bit for bit, else the largest
// difference of the parameters relative to the largest parameter (lesson 03's measure). Exit 0 when identical,
// or when that difference is <= TOLERANCE; 1 otherwise; 2 when a file cannot be read or the two hold different
// tensors.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/ckpt.h"

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) die("usage: %s A.ckpt B.ckpt [TOLERANCE]", argv[0]);
    double tol = argc == 4 ? atof(argv[3]) : -1.0;
    Ckpt a, b;
    char err[1024];
    if (ckpt_read(&a, argv[1], err, sizeof err) != 0 || ckpt_read(&b, argv[2], err, sizeof err) != 0) {
        fprintf(stderr, "ckpt_compare: %s\n", err);
        return 2;
    }
    if (a.n_tensors != b.n_tensors) {
        fprintf(stderr, "ckpt_compare: %d vs %d tensors\n", a.n_tensors, b.n_tensors);
        return 2;
    }
    bool identical = true;
    double max_diff = 0.0, max_param = 0.0;
    for (int i = 0; i < a.n_tensors; i++) {
        const CkptTensor *ta = &a.tensors[i], *tb = ckpt_find(&b, ta->group, ta->name);
        if (!tb || tb->nbytes != ta->nbytes) {
            fprintf(stderr, "ckpt_compare: %s (%s) is missing or shaped differently in %s\n", ta->name,
                    ckpt_group_name(ta->group), argv[2]);
            return 2;
        }
        float *x = xmalloc(ta->nbytes), *y = xmalloc(ta->nbytes);
        ckpt_tensor_data(&a, ta, x);
        ckpt_tensor_data(&b, tb, y);
        if (memcmp(x, y, ta->nbytes) != 0) identical = false;
        if (ta->group == CKPT_PARAMS)
            for (size_t k = 0; k < ta->nbytes / sizeof(float); k++) {
                double d = fabs((double)x[k] - (double)y[k]);
                max_diff = d > max_diff || isnan(d) ? (isnan(d) ? INFINITY : d) : max_diff;
                max_param = fabs((double)y[k]) > max_param ? fabs((double)y[k]) : max_param;
            }
        free(x);
        free(y);
    }
    double rel = max_param > 0 ? max_diff / max_param : max_diff;
    if (identical) printf("identical (step %lld and %lld)\n", a.state.step, b.state.step);
    else printf("differ: max parameter difference %.3g of the largest parameter (step %lld and %lld)\n", rel,
                a.state.step, b.state.step);
    ckpt_free(&a);
    ckpt_free(&b);
    return identical || rel <= tol ? 0 : 1;
}
