// infer.c: lesson 06, inference on one device from a checkpoint written on any number of ranks. What you write
// is marked TODO:
//
//   TODO 1  infer_load       a checkpoint -> an inference-only model on this device; refuse what does not fit
//   TODO 2  infer_predict    a batch of images -> classes, the way inference must run the network
//   TODO 3  infer_evaluate   every test image exactly once -> correct count, loss, confusion matrix
//   TODO 4  image_to_input   an image file's bytes -> the model's input, normalised like the training data
//   TODO 5  top_k            logits -> the k most likely classes and their probabilities
//
// The kit supplies the checkpoint file (kit/ckpt.h: ckpt_read validates a file completely, ckpt_check_model
// compares it with a model, ckpt_apply copies it in), the layers (kit/model.h) and the data (kit/data.h).
// train.c calls what you write and prints the report.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kit/check.h"
#include "kit/ops.h"
#include "lesson.h"

// ---------------------------------------------------------------- TODO 1: load

// TODO 1: read the checkpoint at `path` and load it into a NEW model on `dev` that can only infer.
//   - A file that is not a valid checkpoint (truncated, flipped bits, not a checkpoint at all) must be refused
//     before anything is built: the kit's reader checks every byte and says what is wrong.
//   - A checkpoint trained on another dataset has the right shapes for nothing: its classes mean other things
//     and its inputs were normalised with other statistics. The checkpoint says which dataset it was trained on;
//     compare with `dataset` and refuse with a message that names both and the option that fixes it.
//   - Build the model as training built it (cfg), but with no gradients, no momentum, no activation gradients:
//     inference never needs them (kit/model.h has a constructor for that). Then make sure the checkpoint fits
//     this model (another architecture or width must be refused, naming the difference) BEFORE copying it in.
//   - On any refusal: free what you made, put the reason in err (it is printed as "error: <err>"), return NULL.
// PyTorch: model = Net(); model.load_state_dict(torch.load(path, map_location="cpu")) -- the load fails on a
//   mismatched state_dict the way ckpt_check_model does; map_location is what "onto dev" means here.
Model *infer_load(const char *path, const ModelConfig *cfg, const char *dataset, Device dev, int max_batch,
                  CkptState *st, char *err, size_t errlen) {
    // BEGIN SOLUTION
    // STARTER: (void)path, (void)cfg, (void)dataset, (void)dev, (void)max_batch, (void)st;
    // STARTER: snprintf(err, errlen, "TODO 1: infer_load is not written yet (lessons/06-inference/infer.c)");
    // STARTER: return NULL;
    Ckpt ck;
    if (ckpt_read(&ck, path, err, errlen) != 0) return NULL;  // names the path and what is wrong
    if (strcmp(ck.state.dataset, dataset) != 0) {
        snprintf(err, errlen, "%s was trained on %s, this run evaluates %s: pass --dataset %s (a model of one dataset "
                 "means nothing on another: other classes, other normalisation)", path, ck.state.dataset, dataset,
                 ck.state.dataset);
        ckpt_free(&ck);
        return NULL;
    }
    Model *m = model_create_inference(cfg, dev, max_batch);
    char why[512];
    if (ckpt_check_model(&ck, m, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s does not fit this model: %s (pass the --model and --width it was trained with)",
                 path, why);
        model_free(m);
        ckpt_free(&ck);
        return NULL;
    }
    ckpt_apply(&ck, m);
    if (st) *st = ck.state;
    ckpt_free(&ck);
    return m;
    // END SOLUTION
}

// ---------------------------------------------------------------- TODO 2: predict a batch

// TODO 2: the network's answer for n images that sit in host memory, while the model lives on its device.
//   What must hold:
//   - the logits returned are the network's for exactly these n images (the model's buffers are on m->device:
//     what has to move where, and how much of it?);
//   - pred[i] (host memory) is the class of image i's LARGEST logit, over every class, the lower class on a tie;
//   - an image gets the same logits whatever batch it comes in, alone included. Which mode must the forward pass
//     run in for that? In training mode batch norm normalises each channel with the statistics of THIS batch;
//     what did training accumulate for the time after it?
// PyTorch: model.eval(); with torch.no_grad(): logits = model(x.to(device)); pred = logits.argmax(1).cpu()
const float *infer_predict(Model *m, const float *x, int n, int *pred) {
    // BEGIN SOLUTION
    // STARTER: (void)m, (void)x, (void)n, (void)pred;
    // STARTER: return NULL;
    size_t image_floats = (size_t)m->cfg.in_c * m->cfg.in_h * m->cfg.in_w;
    device_copy_to(m->device, m->input, x, (size_t)n * image_floats * sizeof(float));
    const float *logits = model_forward(m, m->input, n, false);  // eval mode: BN uses the running statistics
    argmax_rows(m->device, n, m->cfg.classes, logits, m->pred);
    device_copy_from(m->device, pred, m->pred, (size_t)n * sizeof(int));
    return logits;
    // END SOLUTION
}

// ---------------------------------------------------------------- TODO 3: evaluate a split

// TODO 3: evaluate EVERY image of ds exactly once, in batches of batch_size, and fill the report. What must hold:
//   - count == ds->n: no image dropped (a short last batch included), none counted twice;
//   - correct and the confusion matrix are those of the training run's own evaluation of these weights, whatever
//     batch_size: rows are the TRUE class, columns the predicted one (lesson.h);
//   - loss_sum is the sum over images of the loss the model is MEASURED by, not the one it was trained with;
//   - a test image reaches the network as it is stored: the same image must get the same answer wherever it sits
//     in the dataset and whatever the dataset's training augmentation is.
//   The kit's sampler and loader (kit/data.h) give you the batches: which of their settings decide the points
//   above (which sampler mode never shuffles, pads or drops? which augmentation, which drop_last)?
// PyTorch: DataLoader(test_set, batch_size, shuffle=False, drop_last=False), and a loop under torch.no_grad().
EvalReport infer_evaluate(Model *m, const Dataset *ds, int batch_size) {
    EvalReport r;
    memset(&r, 0, sizeof r);
    r.classes = m->cfg.classes;
    r.confusion = xcalloc((size_t)r.classes * r.classes, sizeof(long));  // (classes, classes)
    // BEGIN SOLUTION
    // STARTER: (void)ds, (void)batch_size;
    Sampler s;
    sampler_init(&s, ds->n, 0, 1, 0, SAMPLER_EVAL);  // in order, every image once
    Loader *L = loader_create(ds, &s, batch_size, false, NULL, 0);  // keep the short last batch; no augmentation
    int *pred = xmalloc((size_t)batch_size * sizeof(int));
    loader_start_epoch(L, 0, 0);
    const Batch *b;
    while ((b = loader_next(L, NULL)) != NULL) {
        const float *logits = infer_predict(m, b->x, b->n, pred);
        device_copy_to(m->device, m->labels, b->y, (size_t)b->n * sizeof(int));
        cross_entropy_forward(m->device, b->n, r.classes, logits, m->labels, 0.0f, m->loss);
        device_copy_from(m->device, m->host_loss, m->loss, (size_t)b->n * sizeof(float));
        for (int i = 0; i < b->n; i++) {
            r.loss_sum += m->host_loss[i];
            r.correct += pred[i] == b->y[i];
            r.confusion[(size_t)b->y[i] * r.classes + pred[i]]++;
        }
        r.count += b->n;
    }
    free(pred);
    loader_free(L);
    // END SOLUTION
    return r;
}

// ---------------------------------------------------------------- TODO 4: an image file -> the model's input

// TODO 4: an image file's bytes -> exactly the input the network saw in training for such an image. What must hold:
//   - an image of another shape than the model's input -- other channels (gray for a colour model, or the
//     reverse) as much as another height or width -- is REFUSED with a message giving both shapes: resizing or
//     converting silently would classify something the model never saw;
//   - x equals what the training loader makes of the same bytes (dataset_fill_batch, kit/data.h): the same
//     units and this dataset's own per-channel statistics (ds). An image given in any other units is, to the
//     network, another picture.
// PyTorch: transforms.Compose([ToTensor(), Normalize(mean, std)]), with the training set's mean and std.
int image_to_input(const Image *img, const Dataset *ds, const ModelConfig *cfg, float *x, char *err, size_t errlen) {
    // BEGIN SOLUTION
    // STARTER: (void)img, (void)ds, (void)cfg, (void)x;
    // STARTER: snprintf(err, errlen, "TODO 4: image_to_input is not written yet (lessons/06-inference/infer.c)");
    // STARTER: return -1;
    if (img->c != cfg->in_c || img->h != cfg->in_h || img->w != cfg->in_w) {
        snprintf(err, errlen, "the image is %dx%d with %d channel%s, the model takes %dx%d with %d channel%s (%s)",
                 img->w, img->h, img->c, img->c == 1 ? "" : "s", cfg->in_w, cfg->in_h, cfg->in_c,
                 cfg->in_c == 1 ? "" : "s", ds->name);
        return -1;
    }
    size_t plane = (size_t)img->h * img->w;
    for (int ch = 0; ch < img->c; ch++)
        for (size_t i = 0; i < plane; i++)
            x[ch * plane + i] = ((float)img->pixels[ch * plane + i] / 255.0f - ds->mean[ch]) / ds->std[ch];
    return 0;
    // END SOLUTION
}

// ---------------------------------------------------------------- TODO 5: the k most likely classes

// TODO 5: the softmax of the logits gives each class's probability; return the k largest, most likely first
//   (ties: the lower class index first, as the arg-max does). Logits can be large: exp() of 100 is Inf in
//   float. Softmax does not change when the same number is subtracted from every logit -- which number keeps
//   every exp() finite?
// PyTorch: torch.softmax(logits, 1).topk(k)
void top_k(const float *logits, int classes, int k, int *idx, float *prob) {
    // BEGIN SOLUTION
    // STARTER: (void)logits, (void)classes;
    // STARTER: for (int t = 0; t < k; t++) idx[t] = -1, prob[t] = 0.0f;
    float max = logits[0];
    for (int j = 1; j < classes; j++) max = logits[j] > max ? logits[j] : max;
    double sum = 0;
    for (int j = 0; j < classes; j++) sum += exp((double)(logits[j] - max));
    for (int t = 0; t < k; t++) {  // selection: k is small, and this keeps ties in index order
        int best = -1;
        for (int j = 0; j < classes; j++) {
            bool taken = false;
            for (int u = 0; u < t; u++) taken = taken || idx[u] == j;
            if (!taken && (best < 0 || logits[j] > logits[best])) best = j;
        }
        idx[t] = best;
        prob[t] = (float)(exp((double)(logits[best] - max)) / sum);
    }
    // END SOLUTION
}
