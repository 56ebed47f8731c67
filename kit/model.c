// kit/model.c: building, initialising and running a network described by a layer table (see model.h).
#include "kit/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/ops_impl.h"
#include "kit/rng.h"

// ---------------------------------------------------------------- building the layer table

static int layer_push(Model *m, Layer l) {
    CHECK(m->n_layers < MODEL_MAX_LAYERS, "the network has more layers than MODEL_MAX_LAYERS");
    l.weight = l.bias_view = l.running = -1;
    m->layers[m->n_layers] = l;
    return m->n_layers++;
}

static int add_conv(Model *m, int in, int out_c, int ksize, int stride, bool bias) {
    Layer l = {.kind = LAYER_CONV, .in = in, .in2 = -1, .out_c = out_c, .ksize = ksize,
               .stride = stride, .pad = ksize / 2, .bias = bias};
    return layer_push(m, l);
}
static int add_simple(Model *m, LayerKind kind, int in) {
    Layer l = {.kind = kind, .in = in, .in2 = -1};
    return layer_push(m, l);
}
static int add_residual(Model *m, int a, int b) {
    Layer l = {.kind = LAYER_ADD, .in = a, .in2 = b};
    return layer_push(m, l);
}
static int add_linear(Model *m, int in, int out) {
    Layer l = {.kind = LAYER_LINEAR, .in = in, .in2 = -1, .out_c = out, .bias = true};
    return layer_push(m, l);
}

// conv 3x3 (+ BN) + ReLU: the building block of every architecture here.
static int conv_block(Model *m, int in, int out_c, bool bn) {
    int x = add_conv(m, in, out_c, 3, 1, !bn);  // a bias before BN would be cancelled by its mean
    if (bn) x = add_simple(m, LAYER_BN, x);
    return add_simple(m, LAYER_RELU, x);
}

// x + block(block(x)): the residual unit of ResNet-9.
static int residual(Model *m, int in, int c) {
    int y = conv_block(m, in, c, true);
    y = conv_block(m, y, c, true);
    return add_residual(m, in, y);
}

// The architectures. Each builds its layers from the model input (-1) and returns the last activation,
// which build_table connects to the linear classifier. w: the base channel count (ModelConfig.width).
static int build_tiny_common(Model *m, int w, bool bn) {
    int x = add_simple(m, LAYER_MAXPOOL, conv_block(m, -1, w / 2, bn));
    x = add_simple(m, LAYER_MAXPOOL, conv_block(m, x, w, bn));
    return add_simple(m, LAYER_AVGPOOL, x);
}
static int build_tiny(Model *m, int w) { return build_tiny_common(m, w, false); }
static int build_tiny_bn(Model *m, int w) { return build_tiny_common(m, w, true); }

static int build_fmnist(Model *m, int w) {
    int x = add_simple(m, LAYER_MAXPOOL, conv_block(m, -1, w, true));
    return add_simple(m, LAYER_MAXPOOL, conv_block(m, x, 2 * w, true));
}

static int build_resnet9(Model *m, int w) {
    int x = conv_block(m, -1, w, true);                               // prep
    x = add_simple(m, LAYER_MAXPOOL, conv_block(m, x, 2 * w, true));  // stage 1
    x = residual(m, x, 2 * w);
    x = add_simple(m, LAYER_MAXPOOL, conv_block(m, x, 4 * w, true));  // stage 2
    x = add_simple(m, LAYER_MAXPOOL, conv_block(m, x, 8 * w, true));  // stage 3
    x = residual(m, x, 8 * w);
    return add_simple(m, LAYER_AVGPOOL, x);
}

// The model table: adding an architecture is a build function and a row (--model, --help and
// model_config follow from it).
static const struct {
    const char *name;
    int default_width;
    int (*build)(Model *m, int w);
} ARCHS[] = {
    {"tiny", 16, build_tiny},        // 2 convs + linear, no BN (tests; a few thousand parameters)
    {"tiny-bn", 16, build_tiny_bn},  // tiny with batch norm after each conv
    {"fmnist", 32, build_fmnist},    // 2 conv-BN-ReLU-pool blocks + linear (Fashion-MNIST)
    {"resnet9", 64, build_resnet9},  // ResNet-9 for CIFAR: prep, 3 stages, 2 residual blocks, linear
};
enum { N_ARCHS = (int)(sizeof ARCHS / sizeof ARCHS[0]) };

static int arch_find(const char *name) {
    for (int i = 0; i < N_ARCHS; i++)
        if (strcmp(name, ARCHS[i].name) == 0) return i;
    return -1;
}

static const char *arch_name(int i) { return ARCHS[i].name; }

const char *model_names(void) {
    static char names[128];
    return check_names(names, sizeof names, N_ARCHS, arch_name);
}

bool model_config(ModelConfig *cfg, const char *name, int width, int in_c, int in_h, int in_w, int classes) {
    int a = arch_find(name);
    if (a < 0) return false;
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->name, sizeof cfg->name, "%s", name);
    cfg->width = width > 0 ? width : ARCHS[a].default_width;
    cfg->in_c = in_c;
    cfg->in_h = in_h;
    cfg->in_w = in_w;
    cfg->classes = classes;
    return true;
}

static void build_table(Model *m) {
    int a = arch_find(m->cfg.name);
    if (a < 0) die("unknown model '%s' (known: %s)", m->cfg.name, model_names());
    add_linear(m, ARCHS[a].build(m, m->cfg.width), m->cfg.classes);
}

// Shape (c, h, w) of activation `idx` (-1 = the model input: a stage's is layer first-1's output).
static void act_shape(const Model *m, int idx, int *c, int *h, int *w) {
    if (idx < 0) {
        *c = m->in_c, *h = m->in_h, *w = m->in_w;
    } else {
        *c = m->layers[idx].c, *h = m->layers[idx].h, *w = m->layers[idx].w;
    }
}

static int view_push(TensorView *views, int *count, size_t *offset, const char *name, int ndim,
                     const int *shape, bool decay) {
    CHECK(*count < MODEL_MAX_VIEWS, "the network has more tensors than MODEL_MAX_VIEWS");
    TensorView *v = &views[*count];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->ndim = ndim;
    v->count = 1;
    for (int i = 0; i < ndim; i++) {
        v->shape[i] = shape[i];
        v->count *= (size_t)shape[i];
    }
    v->offset = *offset;
    v->decay = decay;
    *offset += v->count;
    return (*count)++;
}

// Output shapes, parameter views and arena offsets, in one pass over the table.
static void plan_layers(Model *m) {
    size_t act = 0, saved = 0;
    char name[48];
    for (int i = 0; i < m->n_layers; i++) {
        Layer *l = &m->layers[i];
        int c, h, w;
        act_shape(m, l->in, &c, &h, &w);
        l->param_offset = m->n_params;
        switch (l->kind) {
        case LAYER_CONV: {
            Conv2dDims d = {.n = 1, .c = c, .h = h, .w = w, .k = l->out_c, .r = l->ksize,
                            .stride = l->stride, .pad = l->pad};
            l->c = l->out_c, l->h = conv2d_out_h(&d), l->w = conv2d_out_w(&d);
            int ws[4] = {l->out_c, c, l->ksize, l->ksize};
            snprintf(name, sizeof name, "%02d.conv.weight", m->first + i);
            l->weight = view_push(m->views, &m->n_views, &m->n_params, name, 4, ws, true);
            if (l->bias) {
                snprintf(name, sizeof name, "%02d.conv.bias", m->first + i);
                l->bias_view = view_push(m->views, &m->n_views, &m->n_params, name, 1, &l->out_c, false);
            }
            break;
        }
        case LAYER_BN:
            l->c = c, l->h = h, l->w = w;
            snprintf(name, sizeof name, "%02d.bn.weight", m->first + i);
            l->weight = view_push(m->views, &m->n_views, &m->n_params, name, 1, &c, false);
            snprintf(name, sizeof name, "%02d.bn.bias", m->first + i);
            l->bias_view = view_push(m->views, &m->n_views, &m->n_params, name, 1, &c, false);
            snprintf(name, sizeof name, "%02d.bn.running_mean", m->first + i);
            l->running = view_push(m->buffer_views, &m->n_buffer_views, &m->n_buffers, name, 1, &c, false);
            snprintf(name, sizeof name, "%02d.bn.running_var", m->first + i);
            view_push(m->buffer_views, &m->n_buffer_views, &m->n_buffers, name, 1, &c, false);
            l->saved_offset = saved;
            saved += 2 * (size_t)c;
            break;
        case LAYER_RELU:
            l->c = c, l->h = h, l->w = w;
            break;
        case LAYER_MAXPOOL:
            CHECK(h >= 2 && w >= 2, "max-pool on an image smaller than 2x2: too many pooling stages for this input size");
            l->c = c, l->h = h / 2, l->w = w / 2;
            break;
        case LAYER_ADD: {
            int c2, h2, w2;
            act_shape(m, l->in2, &c2, &h2, &w2);
            CHECK(c == c2 && h == h2 && w == w2, "a residual add joins two activations of different shapes");
            l->c = c, l->h = h, l->w = w;
            break;
        }
        case LAYER_AVGPOOL:
            l->c = c, l->h = 1, l->w = 1;
            break;
        case LAYER_LINEAR: {
            int ws[2] = {l->out_c, c * h * w};
            snprintf(name, sizeof name, "%02d.linear.weight", m->first + i);
            l->weight = view_push(m->views, &m->n_views, &m->n_params, name, 2, ws, true);
            snprintf(name, sizeof name, "%02d.linear.bias", m->first + i);
            l->bias_view = view_push(m->views, &m->n_views, &m->n_params, name, 1, &l->out_c, false);
            l->c = l->out_c, l->h = 1, l->w = 1;
            break;
        }
        }
        l->param_count = m->n_params - l->param_offset;
        l->act_offset = act;
        act += (size_t)l->c * l->h * l->w;
    }
    m->act_floats_per_sample = act;
    m->work_floats = 0;
    // The scratch space is shared by all layers: size it for the hungriest one.
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        int c, h, w;
        act_shape(m, l->in, &c, &h, &w);
        size_t need = 0;
        if (l->kind == LAYER_CONV) {
            Conv2dDims d = {.n = m->max_batch, .c = c, .h = h, .w = w, .k = l->out_c, .r = l->ksize,
                            .stride = l->stride, .pad = l->pad};
            need = conv2d_work_floats(m->device, &d);
        } else if (l->kind == LAYER_BN) {
            BatchNormDims d = {.n = m->max_batch, .c = c, .hw = h * w, .eps = 1e-5f, .momentum = 0.1f};
            need = batchnorm_work_floats(m->device, &d);
        }
        if (need > m->work_floats) m->work_floats = need;
    }
    m->saved_floats = saved;
}

// ---------------------------------------------------------------- memory plan
//
// Activations are most of a training run's memory, so the plan shares them: in-place ReLU, fused BN + ReLU on
// both devices, gradient slots reused once dead, a fused BN's dx over its ReLU's dy. None of it changes a number;
// kit/README.md ("The model's memory plan") gives the four rules and why each is safe.

// Which layers read activation i in forward: its consumers, counted, and the last one.
static void layer_consumers(const Model *m, int i, int *count, int *last) {
    *count = 0, *last = -1;
    for (int j = i + 1; j < m->n_layers; j++) {
        const Layer *l = &m->layers[j];
        if (l->in == i || l->in2 == i) (*count)++, *last = j;
    }
}

// True when layer p's backward does not read p's own output, so a sole consumer may overwrite it.
static bool output_unread_by_own_backward(LayerKind k) {
    return k == LAYER_BN || k == LAYER_CONV || k == LAYER_ADD || k == LAYER_LINEAR;
}

// The step of backward that reads the gradient of activation i: its own, or the fused BN's before it.
static int grad_reader(const Model *m, int i) {
    const Layer *l = &m->layers[i];
    return (l->kind == LAYER_RELU && l->in >= 0 && m->layers[l->in].fused_relu) ? l->in : i;
}

// First fit: the lowest offset whose range [off, off + size) meets no placed slot alive at the same time.
static size_t grad_slot(const Model *m, const bool *placed, int i, size_t size) {
    const int hi = m->layers[i].grad_first_write, lo = grad_reader(m, i);
    size_t off = 0;
    for (bool moved = true; moved;) {
        moved = false;
        for (int j = 0; j < m->n_layers; j++) {
            if (!placed[j]) continue;
            const Layer *o = &m->layers[j];
            const size_t osize = (size_t)o->c * o->h * o->w;
            const bool alive_together = lo <= o->grad_first_write && grad_reader(m, j) <= hi;
            if (alive_together && off < o->grad_offset + osize && o->grad_offset < off + size) {
                off = o->grad_offset + osize;
                moved = true;
            }
        }
    }
    return off;
}

// Lesson 05's SyncBN (Model.bn_ops): a replacement batch norm on the CPU, or NULL for the kit's own.
static const BatchNormLayerOps *bn_replacement(const Model *m) {
    return m->bn_ops && m->bn_ops->forward_train && m->device == DEVICE_CPU ? m->bn_ops : NULL;
}

// The all-reduce the kit's own batch norm calls (Model.bn_ops->sync), or NULL: the local batch's statistics.
static const BatchNormSync *bn_sync(const Model *m) { return m->bn_ops ? &m->bn_ops->sync : NULL; }

static void plan_memory(Model *m) {
    const int L = m->n_layers;
    for (int i = 0; i < L; i++) m->layers[i].fused_relu = m->layers[i].grad_in_place = false;  // a re-plan
    // 1 and 2: activations.
    size_t act = 0;
    for (int i = 0; i < L; i++) {
        Layer *l = &m->layers[i];
        int uses = 0, last;
        if (l->kind == LAYER_RELU && l->in >= 0) layer_consumers(m, l->in, &uses, &last);
        const bool in_place = uses == 1 && output_unread_by_own_backward(m->layers[l->in].kind);
        if (in_place) {
            l->act_offset = m->layers[l->in].act_offset;
            // Fused BN + ReLU is the kit's own batch norm (CPU and CUDA): not with a replacement one
            // (model_set_bn_ops, CPU only).
            m->layers[l->in].fused_relu = m->layers[l->in].kind == LAYER_BN && !bn_replacement(m);
            continue;
        }
        l->act_offset = act;
        act += (size_t)l->c * l->h * l->w;
    }
    m->act_floats_per_sample = act;
    // 3: gradients, placed in the order backward brings them to life (latest first write first).
    bool placed[MODEL_MAX_LAYERS] = {false};
    int relu_of[MODEL_MAX_LAYERS];  // fused BN -> its ReLU
    for (int i = 0; i < L; i++) {
        Layer *l = &m->layers[i];
        int uses, last;
        layer_consumers(m, i, &uses, &last);
        // A layer nobody consumes (but the logits) still runs its backward on a zero gradient.
        l->grad_first_write = (i == L - 1 || l->fused_relu) ? -1 : (uses ? last : i);
        relu_of[i] = last;
        // 4; not when the ReLU is the last layer (a stage's): its output gradient is the caller's dlogits.
        if (l->fused_relu && l->in >= 0 && last != L - 1) {
            layer_consumers(m, l->in, &uses, &last);
            l->grad_in_place = uses == 1;
        }
    }
    m->grad_floats_per_sample = 0;
    for (int step = L - 1; step >= 0; step--) {
        for (int i = 0; i < L; i++) {
            Layer *l = &m->layers[i];
            if (l->grad_first_write != step) continue;
            const size_t size = (size_t)l->c * l->h * l->w;
            const Layer *writer = &m->layers[step];
            if (writer->grad_in_place && writer->in == i) l->grad_offset = m->layers[relu_of[step]].grad_offset;
            else l->grad_offset = grad_slot(m, placed, i, size);
            placed[i] = true;
            if (l->grad_offset + size > m->grad_floats_per_sample) m->grad_floats_per_sample = l->grad_offset + size;
        }
    }
}

// ---------------------------------------------------------------- stages: a run of the layer table

// May m's table be cut before layer `cut`: is layer cut-1's output the only activation read on both sides?
static bool table_cut_ok(const Model *m, int cut) {
    if (cut <= 0 || cut >= m->n_layers) return false;
    for (int j = cut; j < m->n_layers; j++) {
        const Layer *l = &m->layers[j];
        if (l->in < cut && l->in != cut - 1) return false;
        if (l->kind == LAYER_ADD && l->in2 < cut && l->in2 != cut - 1) return false;
    }
    return true;
}

bool model_cut_ok(const ModelConfig *cfg, int cut) {
    Model *t = xcalloc(1, sizeof *t);  // the table only: no shapes, no memory
    t->cfg = *cfg;
    build_table(t);
    const bool ok = table_cut_ok(t, cut);
    free(t);
    return ok;
}

// Keeps layers [first, last) of m's planned table: numbered from 0, reading layer first-1's output as their
// input (-1), after the parameter and buffer floats of the layers before them (Model.param_base, buffer_base).
// plan_layers must run again: it lays out the views, the parameters and the arena of what is left.
static void table_slice(Model *m, int first, int last) {
    const int n = m->n_layers;
    CHECKF(0 <= first && first < last && last <= n, "a stage is layers [first, last), 0 <= first < last <= the "
           "layer count (model_print lists them)", "stage [%d, %d) of %s, which has %d layers", first, last,
           m->cfg.name, n);
    CHECKF((first == 0 || table_cut_ok(m, first)) && (last == n || table_cut_ok(m, last)),
           "cut only where one activation crosses (model_cut_ok): never inside a residual block",
           "stage [%d, %d) of %s: a residual connection straddles its cut at %d", first, last, m->cfg.name,
           first == 0 || table_cut_ok(m, first) ? last : first);
    if (first > 0) {
        const Layer *before = &m->layers[first - 1];
        m->in_c = before->c, m->in_h = before->h, m->in_w = before->w;
    }
    m->param_base = m->layers[first].param_offset;
    m->buffer_base = 0;
    for (int i = 0; i < first; i++)  // running mean and var, c floats each (plan_layers)
        if (m->layers[i].kind == LAYER_BN) m->buffer_base += 2 * (size_t)m->layers[i].c;
    for (int i = first; i < last; i++) {
        Layer l = m->layers[i];
        l.in = l.in < first ? -1 : l.in - first;  // a valid cut: what comes from before is layer first-1's output
        if (l.kind == LAYER_ADD) l.in2 = l.in2 < first ? -1 : l.in2 - first;
        l.weight = l.bias_view = l.running = -1;
        m->layers[i - first] = l;
    }
    m->first = first;
    m->n_layers = last - first;
    m->n_views = m->n_buffer_views = 0;
    m->n_params = m->n_buffers = 0;
}

// ---------------------------------------------------------------- memory and initialisation

// Floats per sample of the model's output (its logits; a stage's last layer's output).
static size_t out_floats(const Model *m) {
    const Layer *l = &m->layers[m->n_layers - 1];
    return (size_t)l->c * l->h * l->w;
}

// Bytes of an arena element: 2 under 16-bit storage (model_store_activations), else 4.
static size_t act_elem(const Model *m) { return m->act_format == LOWP_FP32 ? sizeof(float) : 2; }
// Bytes of the activation arena, and of the activation-gradient arena.
static size_t acts_bytes(const Model *m) { return (size_t)m->max_batch * m->act_floats_per_sample * act_elem(m); }
static size_t dacts_bytes(const Model *m) { return (size_t)m->max_batch * m->grad_floats_per_sample * act_elem(m); }

// What each batch in flight needs of its own (model_create_view shares the rest): activations, their gradients,
// BN's saved statistics, the input and its gradient, the output gradient, labels, losses and predictions.
static void alloc_batch_buffers(Model *m, bool training) {
    const Device d = m->device;
    const size_t B = (size_t)m->max_batch, F = sizeof(float), in = (size_t)m->in_c * m->in_h * m->in_w;
    m->acts = device_alloc_as(d, acts_bytes(m), MEM_ACTS);
    // Training: activation gradients, BN's saved batch statistics, the output's and the input's gradients.
    m->dacts = training ? device_alloc_as(d, dacts_bytes(m), MEM_ACTS) : NULL;
    m->saved = training ? device_alloc_as(d, m->saved_floats * F, MEM_ACTS) : NULL;
    m->dlogits = training ? device_alloc_as(d, B * out_floats(m) * F, MEM_ACTS) : NULL;
    m->dinput = training && m->first > 0 ? device_alloc_as(d, B * in * F, MEM_ACTS) : NULL;
    m->input = device_alloc_as(d, B * in * F, MEM_ACTS);
    m->labels = device_alloc_as(d, B * sizeof(int), MEM_ACTS);
    m->loss = device_alloc_as(d, B * F, MEM_ACTS);
    m->pred = device_alloc_as(d, B * sizeof(int), MEM_ACTS);
    m->host_loss = xmalloc(B * F);
    m->host_pred = xmalloc(B * sizeof(int));
}

static Conv2dDims conv_dims(const Model *m, const Layer *l, int n);

// An inference model's prepared filters (Model.prepared): one slice per conv layer that has any. Only for
// inference: a training model's weights change every step, and preparing them would cost a pass per step.
static void prepared_alloc(Model *m) {
    size_t total = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind != LAYER_CONV) continue;
        Conv2dDims cd = conv_dims(m, l, m->max_batch);
        m->prepared_offset[i] = total;
        total += conv2d_prepared_floats(m->device, &cd);
    }
    m->prepared = total ? device_alloc_as(m->device, total * sizeof(float), MEM_PARAMS) : NULL;
    m->prepared_floats = total;
}

// Builds the table (range: a stage's [first, last); NULL: every layer) and allocates the buffers; `training`
// adds what only training needs (see model.h).
static Model *model_alloc(const ModelConfig *cfg, Device d, int max_batch, uint64_t seed, bool training,
                          const int *range) {
    CHECK(max_batch > 0, "the batch size must be positive");
    CHECK(cfg->in_c > 0 && cfg->in_h > 0 && cfg->in_w > 0 && cfg->classes > 1,
          "the model config needs the input shape and at least 2 classes (see model_config)");
    Model *m = xcalloc(1, sizeof *m);
    m->cfg = *cfg;
    m->device = d;
    m->max_batch = max_batch;
    m->in_c = cfg->in_c, m->in_h = cfg->in_h, m->in_w = cfg->in_w;
    build_table(m);
    plan_layers(m);
    if (range) {
        table_slice(m, range[0], range[1]);
        plan_layers(m);
    }
    plan_memory(m);

    size_t F = sizeof(float);
    m->params = device_alloc_as(d, m->n_params * F, MEM_PARAMS);
    m->buffers = device_alloc_as(d, m->n_buffers * F, MEM_PARAMS);
    if (training) {  // gradients and momentum
        m->grads = device_alloc_as(d, m->n_params * F, MEM_GRADS);
        m->velocity = device_alloc_as(d, m->n_params * F, MEM_OPTIM);
    }
    m->work = device_alloc_as(d, m->work_floats * F, MEM_ACTS);
    alloc_batch_buffers(m, training);
    if (!training) prepared_alloc(m);
    model_init(m, seed);
    return m;
}

void model_set_bn_ops(Model *m, const BatchNormLayerOps *ops) {
    CHECK(!ops || (ops->forward_train == NULL) == (ops->backward == NULL),
          "a replacement batch norm gives forward_train and backward, or neither (the kit's own, with `sync`)");
    model_require(m, MODEL_ACTS, "model_set_bn_ops (it re-allocates the activations)");
    CHECK(m->act_format == LOWP_FP32, "model_set_bn_ops after model_store_activations: install the BN ops first");
    m->bn_ops = ops;
    // The fused CPU BN + ReLU would bypass `ops`, and its memory plan gives a fused BN's output gradient no slot
    // of its own: plan again (with or without fusion) and re-allocate the arena, which holds nothing between steps.
    plan_memory(m);
    device_free(m->device, m->acts);
    m->acts = device_alloc_as(m->device, acts_bytes(m), MEM_ACTS);
    if (m->dacts) {  // an inference model (model_create_inference) has none
        device_free(m->device, m->dacts);
        m->dacts = device_alloc_as(m->device, dacts_bytes(m), MEM_ACTS);
    }
}

Model *model_create(const ModelConfig *cfg, Device d, int max_batch, uint64_t seed) {
    return model_alloc(cfg, d, max_batch, seed, true, NULL);
}

Model *model_create_stage(const ModelConfig *cfg, Device d, int max_batch, uint64_t seed, int first, int last) {
    const int range[2] = {first, last};
    return model_alloc(cfg, d, max_batch, seed, true, range);
}

// The view copies the owner's table, plan and hooks, and points at its parameters, gradients, momentum, buffers
// and scratch (a view of a view: at the first owner's).
Model *model_create_view(Model *owner, int max_batch) {
    if (owner->owner) owner = owner->owner;
    CHECKF(max_batch > 0 && max_batch <= owner->max_batch, "a view shares its owner's scratch, sized for the "
           "owner's max_batch: create the owner for the largest batch", "view for %d samples of a model made "
           "for %d", max_batch, owner->max_batch);
    CHECK(owner->act_format == LOWP_FP32, "views of a model with 16-bit activations: not supported (make the views "
          "first, or keep float32 storage)");
    Model *v = xmalloc(sizeof *v);
    *v = *owner;
    v->owner = owner;
    v->max_batch = max_batch;
    alloc_batch_buffers(v, owner->grads != NULL);
    return v;
}

const float *model_input_grad(const Model *m) { return m->dinput; }

void model_set_round_hook(Model *m, ModelRoundHook hook, void *ctx) {
    m->round_hook = hook;
    m->round_hook_ctx = ctx;
}

// Under 16-bit storage, may activation i's gradient live in 2 bytes and give the numbers of the float32 path? That
// path sums the shares of its writers in float32 and rounds once (ROUND_DOUT); in 2 bytes each writer rounds what
// it adds. The same when at most one share is not a 16-bit value already and it is added last: one writer, or two
// where the first to write (the later layer) is a residual add passing its own 16-bit dy through exactly, which
// is ResNet-9's residual input (its add, then its block's first conv). Anything else would round twice.
static bool grad16_exact(const Model *m, int i) {
    int uses, last;
    layer_consumers(m, i, &uses, &last);
    return uses <= 1 || (uses == 2 && m->layers[last].kind == LAYER_ADD);
}

void model_store_activations(Model *m, LowpFormat f) {
    CHECKF(m->device == DEVICE_CUDA || f == LOWP_FP32, "16-bit activation storage is the GPU's: on the CPU, lesson "
           "10 emulates it (round_lowp on float32 containers)", "model_store_activations(%s) on %s", lowp_name(f),
           device_name(m->device));
    CHECK(!m->owner, "model_store_activations on a view (model_create_view): set it on the owner, before any view");
    CHECK(m->first == 0, "model_store_activations on a stage (model_create_stage): its input and output cross a "
          "cut in float32; store activations in 16 bits on whole models only");
    model_require(m, MODEL_ACTS, "model_store_activations (it re-allocates the activations)");
    const GemmPrecision want = f == LOWP_BF16 ? GEMM_BF16 : GEMM_FP16;
    CHECKF(f == LOWP_FP32 || device_gemm_precision(m->device) == want, "the GEMMs read the 16-bit activations as "
           "they are: set them to the same format first (device_set_gemm_precision, kit/device.h)",
           "activations in %s, GEMMs in %s", lowp_name(f), gemm_precision_name(device_gemm_precision(m->device)));
    for (int i = 0; i < m->n_layers; i++) {  // the float32 input is read by convs only; the logits are float32
        CHECK(f == LOWP_FP32 || ((m->layers[i].in >= 0 || m->layers[i].kind == LAYER_CONV) &&
                                 (i < m->n_layers - 1 || m->layers[i].kind == LAYER_LINEAR)),
              "16-bit activations: the model's input must feed convolutions only, and its last layer be linear");
        CHECK(f == LOWP_FP32 || grad16_exact(m, i), "16-bit activations: an activation read by more layers than a "
              "conv and a residual add would have its gradient rounded twice (not supported: keep float32 storage)");
    }
    if (f == m->act_format) return;
    const bool training = m->dacts != NULL;  // an inference model has no gradients
    float **bufs[] = {&m->acts, &m->logits, &m->dacts};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) device_free(m->device, *bufs[k]), *bufs[k] = NULL;
    m->act_format = f;
    m->acts = device_alloc_as(m->device, acts_bytes(m), MEM_ACTS);
    if (f != LOWP_FP32)
        m->logits = device_alloc_as(m->device, (size_t)m->max_batch * out_floats(m) * sizeof(float), MEM_ACTS);
    if (training) m->dacts = device_alloc_as(m->device, dacts_bytes(m), MEM_ACTS);
}

// The rounding hook at one point, when one is installed (lesson 10; kit/model.h, RoundPoint).
static void round_at(const Model *m, int layer, RoundPoint at, float *buf, size_t n) {
    if (m->round_hook) m->round_hook(m->round_hook_ctx, m, layer, at, buf, n);
}

// Inference only (lesson 06): no grads, velocity, dacts, saved statistics or dlogits (NULL). Forward in eval
// mode is all such a model can do: model_forward(train = true) and model_backward refuse it. The parameters
// get model_init's values (seed 0) until a checkpoint is applied (kit/ckpt.h: ckpt_apply skips momentum).
Model *model_create_inference(const ModelConfig *cfg, Device d, int max_batch) {
    return model_alloc(cfg, d, max_batch, 0, false, NULL);
}

// Device bytes of the buffers model_alloc made (params to pred; host_loss and host_pred are on the host).
// A view (model_create_view) counts only its own: the shared buffers are its owner's.
size_t model_device_bytes(const Model *m) {
    size_t B = (size_t)m->max_batch, F = sizeof(float), in = (size_t)m->in_c * m->in_h * m->in_w, floats = 0;
    if (!m->owner) floats += m->n_params + m->n_buffers + m->work_floats + (m->grads ? 2 * m->n_params : 0);
    floats += B * in + B;
    if (m->logits) floats += B * out_floats(m);
    if (m->grads) floats += m->saved_floats + B * out_floats(m);
    if (m->dinput) floats += B * in;
    if (!m->owner) floats += m->prepared_floats;
    return floats * F + acts_bytes(m) + (m->grads ? dacts_bytes(m) : 0) + 2 * B * sizeof(int);  // + labels, pred
}

void model_free(Model *m) {
    if (!m) return;
    float *bufs[] = {m->acts, m->logits, m->dacts, m->saved, m->input, m->loss, m->dlogits, m->dinput};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) device_free(m->device, bufs[i]);
    if (!m->owner) {  // a view's shared buffers are its owner's to free
        float *owned[] = {m->params, m->grads, m->velocity, m->buffers, m->work, m->prepared};
        for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) device_free(m->device, owned[i]);
    }
    device_free(m->device, m->labels);
    device_free(m->device, m->pred);
    free(m->host_loss);
    free(m->host_pred);
    free(m);
}

// ---------------------------------------------------------------- releasing and materializing parts

static const char *part_label(unsigned part) {
    switch (part) {
    case MODEL_PARAMS: return "parameters (MODEL_PARAMS)";
    case MODEL_GRADS: return "gradients (MODEL_GRADS)";
    case MODEL_VELOCITY: return "momentum (MODEL_VELOCITY)";
    default: return "activations (MODEL_ACTS)";
    }
}

void model_require(const Model *m, unsigned parts, const char *what) {
    unsigned gone = parts & m->released;
    for (unsigned part = MODEL_PARAMS; part <= MODEL_ACTS; part <<= 1)
        CHECKF(!(gone & part), "bring the part back with model_materialize before using it (model_release freed it)",
               "%s: the model's %s are released", what, part_label(part));
}

// The buffers that MODEL_ACTS covers (everything a batch needs: the arena, the input, labels, losses,
// predictions), and their sizes in bytes (a model that does not start at the image: also its input gradient).
static int acts_buffers(Model *m, void ***ptr, size_t *bytes) {
    const size_t B = (size_t)m->max_batch, F = sizeof(float), in = (size_t)m->in_c * m->in_h * m->in_w;
    int k = 0;
    ptr[k] = (void **)&m->acts, bytes[k++] = acts_bytes(m);
    if (m->act_format != LOWP_FP32) ptr[k] = (void **)&m->logits, bytes[k++] = B * out_floats(m) * F;
    ptr[k] = (void **)&m->dacts, bytes[k++] = dacts_bytes(m);
    ptr[k] = (void **)&m->saved, bytes[k++] = m->saved_floats * F;
    ptr[k] = (void **)&m->work, bytes[k++] = m->work_floats * F;
    ptr[k] = (void **)&m->dlogits, bytes[k++] = B * out_floats(m) * F;
    ptr[k] = (void **)&m->input, bytes[k++] = B * in * F;
    ptr[k] = (void **)&m->labels, bytes[k++] = B * sizeof(int);
    ptr[k] = (void **)&m->loss, bytes[k++] = B * F;
    ptr[k] = (void **)&m->pred, bytes[k++] = B * sizeof(int);
    if (m->first > 0) ptr[k] = (void **)&m->dinput, bytes[k++] = B * in * F;
    return k;
}
enum { ACTS_BUFFERS = 11 };

static void check_releasable(const Model *m, unsigned parts, const char *what) {
    CHECKF(!m->owner, "a view shares its owner's buffers: release or materialize the owner (with no view alive)",
           "%s on a view (model_create_view)", what);
    CHECKF(!(parts & ~(unsigned)(MODEL_PARAMS | MODEL_GRADS | MODEL_VELOCITY | MODEL_ACTS)),
           "parts are MODEL_PARAMS | MODEL_GRADS | MODEL_VELOCITY | MODEL_ACTS", "%s: parts 0x%x", what, parts);
    CHECKF(m->dacts || (m->released & MODEL_ACTS) || !(parts & (MODEL_GRADS | MODEL_VELOCITY | MODEL_ACTS)),
           "an inference model (model_create_inference) has only its parameters to release",
           "%s: parts 0x%x", what, parts);
}

void model_release(Model *m, unsigned parts) {
    check_releasable(m, parts, "model_release");
    parts &= ~m->released;
    const Device d = m->device;
    if (parts & MODEL_PARAMS) device_free(d, m->params), m->params = NULL;
    if (parts & MODEL_GRADS) device_free(d, m->grads), m->grads = NULL;
    if (parts & MODEL_VELOCITY) device_free(d, m->velocity), m->velocity = NULL;
    if (parts & MODEL_ACTS) {
        void **ptr[ACTS_BUFFERS];
        size_t bytes[ACTS_BUFFERS];
        for (int i = 0, k = acts_buffers(m, ptr, bytes); i < k; i++) device_free(d, *ptr[i]), *ptr[i] = NULL;
    }
    m->released |= parts;
}

void model_materialize(Model *m, unsigned parts) {
    check_releasable(m, parts, "model_materialize");
    parts &= m->released;
    const Device d = m->device;
    const size_t P = m->n_params * sizeof(float);
    if (parts & MODEL_PARAMS) m->params = device_alloc_as(d, P, MEM_PARAMS);
    if (parts & MODEL_GRADS) {
        m->grads = device_alloc_as(d, P, MEM_GRADS);
        device_memset_zero(d, m->grads, P);
    }
    if (parts & MODEL_VELOCITY) m->velocity = device_alloc_as(d, P, MEM_OPTIM);
    if (parts & MODEL_ACTS) {
        void **ptr[ACTS_BUFFERS];
        size_t bytes[ACTS_BUFFERS];
        for (int i = 0, k = acts_buffers(m, ptr, bytes); i < k; i++) *ptr[i] = device_alloc_as(d, bytes[i], MEM_ACTS);
    }
    m->released &= ~parts;
}

// Fan-in of the layer that owns weight view v: inputs feeding one output unit.
static int view_fan_in(const TensorView *v) {
    return v->ndim == 4 ? v->shape[1] * v->shape[2] * v->shape[3] : v->shape[1];
}

void model_init(Model *m, uint64_t seed) {
    model_require(m, MODEL_PARAMS, "model_init");
    // Initialise on the host with a counter-based RNG, one stream per layer: the same numbers on every
    // device and every rank, whatever the order of allocation.
    float *host = xmalloc((m->n_params > m->n_buffers ? m->n_params : m->n_buffers) * sizeof(float) + 1);
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->weight < 0) continue;
        const TensorView *w = &m->views[l->weight];
        if (l->kind == LAYER_BN) {  // scale 1, shift 0
            for (size_t j = 0; j < w->count; j++) host[w->offset + j] = 1.0f;
            memset(host + m->views[l->bias_view].offset, 0, m->views[l->bias_view].count * sizeof(float));
            continue;
        }
        // PyTorch's default for Conv2d and Linear: weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        float bound = 1.0f / sqrtf((float)view_fan_in(w));
        Rng r = rng_make(seed, (uint64_t)(m->first + i));  // the architecture's layer index: stages agree
        for (size_t j = 0; j < w->count; j++) host[w->offset + j] = bound * (2.0f * rng_uniform(&r) - 1.0f);
        if (l->bias_view >= 0) {
            const TensorView *b = &m->views[l->bias_view];
            for (size_t j = 0; j < b->count; j++) host[b->offset + j] = bound * (2.0f * rng_uniform(&r) - 1.0f);
        }
    }
    device_copy_to(m->device, m->params, host, m->n_params * sizeof(float));
    // Running statistics: mean 0, variance 1.
    for (int i = 0; i < m->n_buffer_views; i += 2) {
        const TensorView *mean = &m->buffer_views[i], *var = &m->buffer_views[i + 1];
        for (size_t j = 0; j < mean->count; j++) host[mean->offset + j] = 0.0f;
        for (size_t j = 0; j < var->count; j++) host[var->offset + j] = 1.0f;
    }
    device_copy_to(m->device, m->buffers, host, m->n_buffers * sizeof(float));
    free(host);
    if (m->grads) device_memset_zero(m->device, m->grads, m->n_params * sizeof(float));  // NULL: inference, released
    if (m->velocity) device_memset_zero(m->device, m->velocity, m->n_params * sizeof(float));
    model_prepare_inference(m);
}

void model_prepare_inference(Model *m) {
    if (!m->prepared) return;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        if (l->kind != LAYER_CONV) continue;
        Conv2dDims cd = conv_dims(m, l, m->max_batch);
        if (conv2d_prepared_floats(m->device, &cd))
            conv2d_prepare(m->device, &cd, m->params + m->views[l->weight].offset, m->prepared + m->prepared_offset[i]);
    }
}

void model_zero_grad(Model *m) {
    model_require(m, MODEL_GRADS, "model_zero_grad");
    CHECK(m->grads != NULL, "model_zero_grad on an inference-only model (model_create_inference has no gradients)");
    device_memset_zero(m->device, m->grads, m->n_params * sizeof(float));
}

// ---------------------------------------------------------------- forward and backward

// Activation idx for the current batch: (n, c, h, w); -1 is the input. In act_format (2 bytes an element under
// 16-bit storage), but the input and the logits (Model.logits then), which are float32.
static void *act_at(const Model *m, int idx, const float *x) {
    if (idx < 0) return (void *)x;
    if (m->logits && idx == m->n_layers - 1) return m->logits;
    const size_t elem = m->act_format == LOWP_FP32 ? sizeof(float) : 2;
    return (char *)m->acts + m->layers[idx].act_offset * (size_t)m->max_batch * elem;
}
// The same, where it is float32 (float32 storage; the input and the logits always).
static float *act_ptr(const Model *m, int idx, const float *x) { return act_at(m, idx, x); }
static float *dact_ptr(const Model *m, int idx) {
    if (idx < 0) return m->dinput;  // a stage's input gradient; NULL: nobody needs the image's
    return m->dacts + m->layers[idx].grad_offset * (size_t)m->max_batch;
}
static const float *view_ptr(const float *base, const Model *m, int view) {
    return view < 0 ? NULL : base + m->views[view].offset;
}
static float *view_mut(float *base, const Model *m, int view) {
    return view < 0 ? NULL : base + m->views[view].offset;
}

// A ReLU whose work its BN does (fused BN + ReLU, training only: plan_memory).
static bool relu_fused(const Model *m, const Layer *l) { return l->in >= 0 && m->layers[l->in].fused_relu; }

static Conv2dDims conv_dims(const Model *m, const Layer *l, int n) {
    int c, h, w;
    act_shape(m, l->in, &c, &h, &w);
    Conv2dDims d = {.n = n, .c = c, .h = h, .w = w, .k = l->out_c, .r = l->ksize,
                    .stride = l->stride, .pad = l->pad};
    return d;
}
static BatchNormDims bn_dims(const Layer *l, int n) {
    BatchNormDims d = {.n = n, .c = l->c, .hw = l->h * l->w, .eps = 1e-5f, .momentum = 0.1f};
    return d;
}

// The batch norm layer l of a forward: in training the batch's statistics (fused with the ReLU after it where
// plan_memory fused them, or lesson 05's replacement), in eval mode the running ones.
static void forward_bn(Model *m, const Layer *l, int n, const float *in, float *out, bool train) {
    const Device d = m->device;
    BatchNormDims bd = bn_dims(l, n);
    const float *gamma = view_ptr(m->params, m, l->weight), *beta = view_ptr(m->params, m, l->bias_view);
    float *run_mean = m->buffers + m->buffer_views[l->running].offset;
    float *run_var = m->buffers + m->buffer_views[l->running + 1].offset;
    if (!train) {
        batchnorm_forward_eval(d, &bd, in, gamma, beta, run_mean, run_var, out);
        return;
    }
    float *mean = m->saved + l->saved_offset, *invstd = mean + l->c;
    const BatchNormLayerOps *ops = bn_replacement(m);
    if (l->fused_relu)  // the ReLU after it is done here (plan_memory)
        batchnorm_relu_forward_train(d, &bd, in, gamma, beta, out, mean, invstd, run_mean, run_var, bn_sync(m),
                                     m->work);
    else if (ops)  // lesson 05: the learner's SyncBN
        ops->forward_train(ops->ctx, &bd, in, gamma, beta, out, mean, invstd, run_mean, run_var);
    else
        batchnorm_forward_train(d, &bd, in, gamma, beta, out, mean, invstd, run_mean, run_var, bn_sync(m), m->work);
}

#ifdef KIT_CUDA
// Layer i of a forward under 16-bit activation storage (model_store_activations; CUDA): forward_layer's switch
// with each op's 16-bit version (kit/ops_impl.h). Storing an output rounds it, to the values the round hook's
// ROUND_OUTPUT would give, so the hook is called only for the float32 logits.
static void forward_layer_act16(Model *m, int i, const float *x, int n, bool train) {
    const Layer *l = &m->layers[i];
    const LowpFormat f = m->act_format, f_in = l->in < 0 ? LOWP_FP32 : f;  // the model's input is float32
    const void *in = act_at(m, l->in, x);
    void *out = act_at(m, i, x);
    int c, h, w;
    act_shape(m, l->in, &c, &h, &w);
    const size_t count = (size_t)n * l->c * l->h * l->w;
    const float *weight = view_ptr(m->params, m, l->weight), *bias = view_ptr(m->params, m, l->bias_view);
    switch (l->kind) {
    case LAYER_CONV: {
        Conv2dDims cd = conv_dims(m, l, n);
        conv2d_forward_act16_cuda(f, f_in, &cd, in, weight, bias, out);
        break;
    }
    case LAYER_BN: {
        BatchNormDims bd = bn_dims(l, n);
        float *run_mean = m->buffers + m->buffer_views[l->running].offset;
        float *run_var = m->buffers + m->buffer_views[l->running + 1].offset;
        float *mean = train ? m->saved + l->saved_offset : NULL;
        if (train)  // weight and bias are gamma and beta
            batchnorm_forward_train_act16_cuda(f, l->fused_relu, &bd, in, weight, bias, out, mean, mean + l->c,
                                               run_mean, run_var, bn_sync(m), m->work);
        else
            batchnorm_forward_eval_act16_cuda(f, &bd, in, weight, bias, run_mean, run_var, out);
        break;
    }
    case LAYER_RELU:
        if (!(train && relu_fused(m, l))) relu_forward_act16_cuda(f, count, in, out);
        break;
    case LAYER_MAXPOOL: maxpool2_forward_act16_cuda(f, n, c, h, w, in, out); break;
    case LAYER_ADD: add_forward_act16_cuda(f, count, in, act_at(m, l->in2, x), out); break;
    case LAYER_AVGPOOL: avgpool_forward_act16_cuda(f, n, c, h * w, in, out); break;
    case LAYER_LINEAR: linear_forward_act16_cuda(f, n, c * h * w, l->out_c, in, weight, bias, out); break;
    }
    if (i == m->n_layers - 1) round_at(m, i, ROUND_OUTPUT, out, count);  // the logits: float32 (Model.logits)
}
#endif

// Layer i of a forward of n images, in training or eval mode: what model_forward runs for each layer in turn.
static void forward_layer(Model *m, int i, const float *x, int n, bool train) {
#ifdef KIT_CUDA
    if (m->act_format != LOWP_FP32) {
        forward_layer_act16(m, i, x, n, train);
        return;
    }
#endif
    const Layer *l = &m->layers[i];
    const float *in = act_ptr(m, l->in, x);
    float *out = act_ptr(m, i, x);
    int c, h, w;
    act_shape(m, l->in, &c, &h, &w);
    const size_t count = (size_t)n * l->c * l->h * l->w;
    const Device d = m->device;
    switch (l->kind) {
    case LAYER_CONV: {
        Conv2dDims cd = conv_dims(m, l, n);
        const float *weight = view_ptr(m->params, m, l->weight), *bias = view_ptr(m->params, m, l->bias_view);
        if (train) {
            conv2d_forward(d, &cd, in, weight, bias, out, m->work);
        } else {  // an inference model's prepared filters: conv2d_forward's result up to rounding, sooner
            const bool has = m->prepared && conv2d_prepared_floats(d, &cd);
            conv2d_forward_prepared(d, &cd, in, weight, has ? m->prepared + m->prepared_offset[i] : NULL, bias, out,
                                    m->work);
        }
        break;
    }
    case LAYER_BN: forward_bn(m, l, n, in, out, train); break;
    case LAYER_RELU:
        if (!(train && relu_fused(m, l))) relu_forward(d, count, in, out);  // in may be out: in place
        break;
    case LAYER_MAXPOOL: maxpool2_forward(d, n, c, h, w, in, out); break;
    case LAYER_ADD: add_forward(d, count, in, act_ptr(m, l->in2, x), out); break;
    case LAYER_AVGPOOL: avgpool_forward(d, n, c, h * w, in, out); break;
    case LAYER_LINEAR:
        linear_forward(d, n, c * h * w, l->out_c, in, view_ptr(m->params, m, l->weight),
                       view_ptr(m->params, m, l->bias_view), out);
        break;
    }
    // A fused BN wrote its ReLU's output into the ReLU's (in-place) slot: the hook sees that buffer for the BN
    // and again for the ReLU, whose forward was done there. Rounding commutes with max(., 0), so the numbers
    // are those of rounding the BN's output and then the ReLU's.
    round_at(m, i, ROUND_OUTPUT, out, count);
}

void model_forward_layer_eval(Model *m, int i, const float *x, int n) { forward_layer(m, i, x, n, false); }

const float *model_forward(Model *m, const float *x, int n, bool train) {
    CHECK(n > 0 && n <= m->max_batch, "batch larger than the model's max_batch (model_create)");
    model_require(m, MODEL_PARAMS | MODEL_ACTS, train ? "model_forward (train)" : "model_forward (eval)");
    CHECK(!train || m->grads != NULL || (m->released & MODEL_GRADS), "forward in training mode on an inference-only model (model_create_inference): "
          "pass train = false (eval mode: BN uses its running statistics)");
    for (int i = 0; i < m->n_layers; i++) forward_layer(m, i, x, n, train);
    return act_ptr(m, m->n_layers - 1, x);
}

// The gradient of layer i's output as its backward reads it, for the rounding hook: its own slot, or for a BN
// fused with its ReLU the ReLU's output gradient, which the fused backward masks itself (rounding commutes with
// the mask). NULL where that is the caller's dlogits (the last layer's), which the caller rounds.
static float *dout_for_hook(Model *m, int i) {
    const Layer *l = &m->layers[i];
    int reader = i;
    if (l->kind == LAYER_BN && l->fused_relu) {
        int uses;
        layer_consumers(m, i, &uses, &reader);
    }
    return reader == m->n_layers - 1 ? NULL : dact_ptr(m, reader);
}

#ifdef KIT_CUDA
// Under 16-bit storage: the gradient of activation idx in its 2-byte slot, which its reader reads and its writers
// add into (grad16_exact says why that is exact).
static void *grad16_at(const Model *m, int idx) {
    if (idx < 0) return NULL;  // the model's input: nobody needs its gradient (a whole model: first = 0)
    return (char *)m->dacts + m->layers[idx].grad_offset * (size_t)m->max_batch * 2;
}

// Layer i's backward under 16-bit storage (CUDA): backward_layer's switch with each op's 16-bit version
// (kit/ops_impl.h): activations and output gradients read in 2 bytes (the logits' gradient, dlogits, in float32),
// input gradients added into their 2-byte slots, each addition rounded (grad16_exact).
static void backward_layer_act16(Model *m, int i, const float *x, const float *dlogits, int n) {
    const Layer *l = &m->layers[i];
    const LowpFormat f = m->act_format, f_in = l->in < 0 ? LOWP_FP32 : f;
    const void *in = act_at(m, l->in, x), *out = act_at(m, i, x);
    const void *dy = i == m->n_layers - 1 ? (const void *)dlogits : grad16_at(m, i);
    void *dx = grad16_at(m, l->in);
    int c, h, w;
    act_shape(m, l->in, &c, &h, &w);
    const size_t count = (size_t)n * l->c * l->h * l->w;
    const float *weight = view_ptr(m->params, m, l->weight);
    float *dweight = view_mut(m->grads, m, l->weight), *dbias = view_mut(m->grads, m, l->bias_view);
    switch (l->kind) {
    case LAYER_CONV: {
        Conv2dDims cd = conv_dims(m, l, n);
        conv2d_backward_act16_cuda(f, f_in, &cd, in, weight, dy, dx, dweight, dbias);
        break;
    }
    case LAYER_BN: {
        BatchNormDims bd = bn_dims(l, n);
        const float *mean = m->saved + l->saved_offset;
        const void *relu_y = NULL;
        if (l->fused_relu) {  // dy and the mask are the ReLU's: its output gradient and output (in place)
            int uses, relu;
            layer_consumers(m, i, &uses, &relu);
            dy = grad16_at(m, relu);  // not the last layer: that is linear (model_store_activations)
            relu_y = out;
        }
        batchnorm_backward_act16_cuda(f, &bd, in, weight, mean, mean + l->c, relu_y, dy, dx, dweight, dbias,
                                      bn_sync(m), m->work);
        break;
    }
    case LAYER_RELU:
        if (!relu_fused(m, l)) relu_backward_act16_cuda(f, count, out, dy, dx);
        break;
    case LAYER_MAXPOOL: maxpool2_backward_act16_cuda(f, n, c, h, w, in, dy, dx); break;
    case LAYER_ADD:
        add_inplace_act16_cuda(f, count, dx, dy);
        add_inplace_act16_cuda(f, count, grad16_at(m, l->in2), dy);
        break;
    case LAYER_AVGPOOL: avgpool_backward_act16_cuda(f, n, c, h * w, dy, dx); break;
    case LAYER_LINEAR:
        linear_backward_act16_cuda(f, n, c * h * w, l->out_c, in, weight, dlogits, dx, dweight, dbias);
        break;
    }
}
#endif

// Layer i's backward: its input gradient added into its slot, its parameter gradients into grads.
static void backward_layer(Model *m, int i, const float *x, const float *dlogits, int n) {
#ifdef KIT_CUDA
    if (m->act_format != LOWP_FP32) {
        backward_layer_act16(m, i, x, dlogits, n);
        return;
    }
#endif
    const Device d = m->device;
    const Layer *l = &m->layers[i];
    const float *in = act_ptr(m, l->in, x);
    const float *out = act_ptr(m, i, x);
    const float *dy = i == m->n_layers - 1 ? dlogits : dact_ptr(m, i);
    float *dx = dact_ptr(m, l->in);
    int c, h, w;
    act_shape(m, l->in, &c, &h, &w);
    const size_t count = (size_t)n * l->c * l->h * l->w;
    switch (l->kind) {
    case LAYER_CONV: {
        Conv2dDims cd = conv_dims(m, l, n);
        conv2d_backward(d, &cd, in, view_ptr(m->params, m, l->weight), dy, dx,
                        view_mut(m->grads, m, l->weight), view_mut(m->grads, m, l->bias_view), m->work);
        break;
    }
    case LAYER_BN: {
        BatchNormDims bd = bn_dims(l, n);
        const float *mean = m->saved + l->saved_offset, *invstd = mean + l->c;
        if (l->fused_relu) {  // dy and the mask are the ReLU's: its output gradient and output (in place)
            int uses, relu;
            layer_consumers(m, i, &uses, &relu);
            const float *relu_dy = relu == m->n_layers - 1 ? dlogits : dact_ptr(m, relu);  // a stage's last
            batchnorm_relu_backward(d, &bd, in, view_ptr(m->params, m, l->weight), mean, invstd, out, relu_dy,
                                    dx, view_mut(m->grads, m, l->weight), view_mut(m->grads, m, l->bias_view),
                                    bn_sync(m), m->work);
        } else if (bn_replacement(m)) {  // lesson 05: the learner's SyncBN (never fused)
            const BatchNormLayerOps *ops = bn_replacement(m);
            ops->backward(ops->ctx, &bd, in, view_ptr(m->params, m, l->weight), mean, invstd, dy, dx,
                          view_mut(m->grads, m, l->weight), view_mut(m->grads, m, l->bias_view));
        } else {
            batchnorm_backward(d, &bd, in, view_ptr(m->params, m, l->weight), mean, invstd, dy, dx,
                               view_mut(m->grads, m, l->weight), view_mut(m->grads, m, l->bias_view),
                               bn_sync(m), m->work);
        }
        break;
    }
    case LAYER_RELU:
        if (!relu_fused(m, l)) relu_backward(d, count, out, dy, dx);
        break;
    case LAYER_MAXPOOL: maxpool2_backward(d, n, c, h, w, in, out, dy, dx); break;
    case LAYER_ADD:
        if (dx) add_inplace(d, count, dx, dy);
        if (dact_ptr(m, l->in2)) add_inplace(d, count, dact_ptr(m, l->in2), dy);
        break;
    case LAYER_AVGPOOL:
        if (dx) avgpool_backward(d, n, c, h * w, dy, dx);
        break;
    case LAYER_LINEAR:
        linear_backward(d, n, c * h * w, l->out_c, in, view_ptr(m->params, m, l->weight), dy, dx,
                        view_mut(m->grads, m, l->weight), view_mut(m->grads, m, l->bias_view));
        break;
    }
}

// The gradient of activation j starts from zero (its first writer is next): its slot, 2 bytes an element under
// 16-bit storage.
static void grad_zero(Model *m, int j, size_t count) {
#ifdef KIT_CUDA
    if (m->act_format != LOWP_FP32) {
        device_memset_zero(m->device, grad16_at(m, j), count * 2);
        return;
    }
#endif
    device_memset_zero(m->device, dact_ptr(m, j), count * sizeof(float));
}

void model_backward(Model *m, const float *x, const float *dlogits, int n) {
    CHECK(n > 0 && n <= m->max_batch, "batch larger than the model's max_batch (model_create)");
    model_require(m, MODEL_PARAMS | MODEL_GRADS | MODEL_ACTS, "model_backward");
    CHECK(m->grads != NULL, "model_backward on an inference-only model (model_create_inference has no gradients)");
    Device d = m->device;
    if (m->dinput)  // its consumers add into it, like into any activation gradient
        device_memset_zero(d, m->dinput, (size_t)n * m->in_c * m->in_h * m->in_w * sizeof(float));
    for (int i = m->n_layers - 1; i >= 0; i--) {
        const Layer *l = &m->layers[i];
        // Backward ops accumulate into activation gradients (a residual input receives two shares), so
        // each starts from zero, set when its slot comes alive (plan_memory). dlogits is the last layer's.
        for (int j = 0; j < i + 1; j++) {
            const Layer *lj = &m->layers[j];
            if (lj->grad_first_write == i && !(l->grad_in_place && j == l->in))  // 4: overwritten, not added to
                grad_zero(m, j, (size_t)n * lj->c * lj->h * lj->w);
        }
        const size_t count = (size_t)n * l->c * l->h * l->w;
        // Every consumer of layer i's output has added its share by now (they come after it). Under 16-bit storage
        // the hook's rounding of dy was done by storing it (model.h).
        if (m->round_hook && m->act_format == LOWP_FP32) {
            float *dout = dout_for_hook(m, i);
            if (dout) round_at(m, i, ROUND_DOUT, dout, count);
        }
        backward_layer(m, i, x, dlogits, n);
        if (l->param_count > 0) round_at(m, i, ROUND_DPARAMS, m->grads + l->param_offset, l->param_count);
        if (l->param_count > 0 && m->on_grads_ready)  // after the rounding: a bucket sends what the hook left
            m->on_grads_ready(m->on_grads_ready_ctx, l->param_offset, l->param_count);
    }
}

// ---------------------------------------------------------------- inspection

static const char *layer_kind_name(LayerKind k) {
    static const char *names[] = {[LAYER_CONV] = "conv",       [LAYER_BN] = "bn",   [LAYER_RELU] = "relu",
                                  [LAYER_MAXPOOL] = "maxpool", [LAYER_ADD] = "add", [LAYER_AVGPOOL] = "avgpool",
                                  [LAYER_LINEAR] = "linear"};
    return names[k];
}

// A stage's layers are printed with the whole model's numbers (those of its tensor names).
void model_print(const Model *m, FILE *out) {
    fprintf(out, "model %s (width %d): %d layers, %zu parameters, input %dx%dx%d, %d classes\n", m->cfg.name,
            m->cfg.width, m->n_layers, m->n_params, m->in_c, m->in_h, m->in_w, m->cfg.classes);
    if (m->first > 0 || m->layers[m->n_layers - 1].kind != LAYER_LINEAR)  // the classifier ends every architecture
        fprintf(out, "  a stage: layers %d..%d of the architecture\n", m->first, m->first + m->n_layers - 1);
    const int f = m->first;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        fprintf(out, "  %2d %-8s in=%-3d", f + i, layer_kind_name(l->kind), l->in < 0 ? f - 1 : f + l->in);
        if (l->kind == LAYER_ADD) fprintf(out, " +%-3d", l->in2 < 0 ? f - 1 : f + l->in2);
        else fprintf(out, "     ");
        fprintf(out, " -> (%d, %d, %d)", l->c, l->h, l->w);
        if (l->param_count) fprintf(out, "  %zu params", l->param_count);
        fputc('\n', out);
    }
}

double model_forward_macs(const Model *m) {
    double macs = 0;
    for (int i = 0; i < m->n_layers; i++) {
        const Layer *l = &m->layers[i];
        int c, h, w;
        act_shape(m, l->in, &c, &h, &w);
        if (l->kind == LAYER_CONV) macs += (double)l->c * l->h * l->w * c * l->ksize * l->ksize;
        if (l->kind == LAYER_LINEAR) macs += (double)l->out_c * c * h * w;
    }
    return macs;
}
