// bench/bench_zeromem.c: what the kit itself allocates for a model cut into units, for bench/zero_memory.py.
//
//   bench_zeromem --model resnet9 [--width 64] [--in 3,32,32] [--classes 10] [--batch 64] [--cuts 0,3,7,...,L]
//
// Without --cuts: one JSON line for the whole model, then one per layer ({"layer": i, "kind", "in", "in2",
// "params", "buffers", "out": [c, h, w]}). With --cuts: one line per unit ({"unit": u, "first", "last", "params", "buffers", "arena_bytes"}): unit u is
// model_create_stage(first, last), as lesson 09 builds its units. arena_bytes is what that stage model allocates
// besides its parameters, BN buffers, gradients and momentum (model_device_bytes minus those): activations,
// their gradients, BN's saved statistics, the conv/BN scratch, the input (and its gradient after a cut), the
// output's gradient, labels, losses and predictions; the memory a rank holds for activations whatever the ZeRO
// stage; work_bytes is the part of it that is the conv/BN scratch (Model.work). bench/zero_memory.py checks the parameter counts against its own copy of the layer table.
// Allocation is lazy on the CPU (untouched pages cost nothing), so only params, grads and momentum are written.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/model.h"

static const char *kind_name(LayerKind k) {
    static const char *names[] = {[LAYER_CONV] = "conv",       [LAYER_BN] = "bn",   [LAYER_RELU] = "relu",
                                  [LAYER_MAXPOOL] = "maxpool", [LAYER_ADD] = "add", [LAYER_AVGPOOL] = "avgpool",
                                  [LAYER_LINEAR] = "linear"};
    return names[k];
}

// Bytes a training model allocated beyond its params, BN buffers, grads and momentum.
static size_t arena_bytes(const Model *m) {
    return model_device_bytes(m) - sizeof(float) * (3 * m->n_params + m->n_buffers);
}

static void print_layers(const Model *m) {
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        size_t buffers = l->kind == LAYER_BN ? 2 * (size_t)l->c : 0;  // running mean and variance
        printf("{\"layer\": %d, \"kind\": \"%s\", \"in\": %d, \"in2\": %d, \"params\": %zu, \"buffers\": %zu, "
               "\"out\": [%d, %d, %d]}\n", i, kind_name(l->kind), l->in, l->kind == LAYER_ADD ? l->in2 : -2,
               l->param_count, buffers, l->c, l->h, l->w);
    }
}

static int parse_ints(const char *s, int *out, int max) {
    int n = 0;
    char *end;
    while (*s) {
        CHECKF(n < max, "at most that many numbers", "more than %d numbers in '%s'", max, s);
        long v = strtol(s, &end, 10);
        CHECKF(end != s && (*end == ',' || *end == '\0'), "a comma-separated list of integers", "bad list '%s'", s);
        out[n++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *name = "resnet9", *cuts_arg = NULL;
    int width = 0, shape[3] = {3, 32, 32}, classes = 10, batch = 64;
    for (int i = 1; i < argc; i += 2) {  // --option value pairs
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        CHECKF(v != NULL, "every option takes a value (bench/bench_zeromem.c's header lists them)", "%s has no value", a);
        if (strcmp(a, "--model") == 0) name = v;
        else if (strcmp(a, "--width") == 0) width = atoi(v);
        else if (strcmp(a, "--in") == 0) CHECK(parse_ints(v, shape, 3) == 3, "--in C,H,W");
        else if (strcmp(a, "--classes") == 0) classes = atoi(v);
        else if (strcmp(a, "--batch") == 0) batch = atoi(v);
        else if (strcmp(a, "--cuts") == 0) cuts_arg = v;
        else CHECKF(false, "options: --model --width --in --classes --batch --cuts", "unknown option %s", a);
    }
    ModelConfig cfg;
    CHECKF(model_config(&cfg, name, width, shape[0], shape[1], shape[2], classes), "a model of the kit's table",
           "unknown model '%s' (known: %s)", name, model_names());
    // The whole model's table only when no cuts are given: with cuts, one unit at a time is in memory.
    int cuts[MODEL_MAX_LAYERS + 1] = {0, 0}, n_cuts = 0;
    if (cuts_arg) {
        n_cuts = parse_ints(cuts_arg, cuts, MODEL_MAX_LAYERS + 1);
    } else {
        Model *whole = model_create(&cfg, DEVICE_CPU, batch, 1);
        printf("{\"model\": \"%s\", \"width\": %d, \"layers\": %d, \"params\": %zu, \"buffers\": %zu, "
               "\"batch\": %d, \"arena_bytes\": %zu}\n", cfg.name, cfg.width, whole->n_layers, whole->n_params,
               whole->n_buffers, batch, arena_bytes(whole));
        print_layers(whole);
        model_free(whole);
    }
    for (int u = 0; u + 1 < n_cuts; u++) {
        Model *s = model_create_stage(&cfg, DEVICE_CPU, batch, 1, cuts[u], cuts[u + 1]);
        printf("{\"unit\": %d, \"first\": %d, \"last\": %d, \"params\": %zu, \"buffers\": %zu, \"arena_bytes\": %zu, "
               "\"work_bytes\": %zu}\n", u, cuts[u], cuts[u + 1], s->n_params, s->n_buffers, arena_bytes(s),
               s->work_floats * sizeof(float));
        model_free(s);
    }
    return 0;
}
