// lesson.h: the functions you write in lesson 06, shared by train.c, image.c and the autograder.
//
// A checkpoint written by lesson 04 (on any number of ranks, from any device) goes onto ONE device here, in a
// model that can only infer; the test set is evaluated exactly as the training run's last evaluation did, and
// one image file is classified. The kit supplies the file format (kit/ckpt.h) and the layers (kit/model.h).
#ifndef LESSON06_H
#define LESSON06_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kit/ckpt.h"
#include "kit/cli.h"
#include "kit/data.h"
#include "kit/model.h"

#ifdef __cplusplus
extern "C" {
#endif

// What an evaluation of a whole split found.
typedef struct {
    long correct, count;  // arg-max predictions equal to the label; images evaluated
    double loss_sum;      // sum of per-sample cross-entropy losses (no label smoothing)
    int classes;
    long *confusion;      // (classes, classes), row = true class, column = predicted class; malloc'd
} EvalReport;

// One image in memory: bytes (c, h, w), 0..255, channels planar like the datasets (kit/data.h).
typedef struct {
    int c, h, w;
    uint8_t *pixels;  // (c, h, w)
} Image;

// ---------------------------------------------------------------- what you write (infer.c)

// TODO 1: the checkpoint at path, onto device dev, in an inference-only model for batches of up to max_batch.
// cfg: the model this program builds (from --model/--width and the dataset's shape); dataset: the data it will
// evaluate (--dataset). Refuses (NULL, the reason in err) a file that is not a valid checkpoint, a checkpoint of
// another dataset, and one of another model. *st (may be NULL) gets the checkpoint's CkptState.
Model *infer_load(const char *path, const ModelConfig *cfg, const char *dataset, Device dev, int max_batch,
                  CkptState *st, char *err, size_t errlen);

// TODO 2: class predictions for n images x (n, C, H, W) in host memory: copies them to m's device, runs the
// forward pass the way inference must, and writes the arg-max class of each into pred (n). Returns the logits
// (n, classes) on m's device (valid until the next forward).
const float *infer_predict(Model *m, const float *x, int n, int *pred);

// TODO 3: every image of ds, once, in batches of batch_size (the last one may be shorter): correct, count, loss
// and the confusion matrix. The report's confusion matrix is malloc'd here (eval_report_free).
EvalReport infer_evaluate(Model *m, const Dataset *ds, int batch_size);

// TODO 4: an image file's bytes -> the model's input x (C, H, W): checks that it has the model's shape and
// normalises it as the training data was (ds: the dataset's per-channel mean and std). Returns 0, or -1 with
// the reason in err (wrong size, wrong number of channels).
int image_to_input(const Image *img, const Dataset *ds, const ModelConfig *cfg, float *x, char *err, size_t errlen);

// TODO 5: the k most likely classes of one row of logits (classes entries), most likely first: class indices in
// idx (k), softmax probabilities in prob (k). k <= classes.
void top_k(const float *logits, int classes, int k, int *idx, float *prob);

// ---------------------------------------------------------------- given (image.c, train.c)

void eval_report_free(EvalReport *r);

// Reads a PNG (gray or colour, any bit depth, palette; the stored values as PIL gives them: no gamma
// conversion, 16 bits keep their high byte, a palette of gray entries is gray, alpha is dropped) or a raw file of
// c*h*w bytes (raw: when the file does not start with PNG's signature; the shape comes from want_c, want_h,
// want_w, and a file of another size is refused). A PNG whose header gives another size than want_h x want_w is
// refused before it is decoded; its channels are left to image_to_input to check. Returns 0, or -1 with the
// reason in err (a directory, a damaged file, ...). image_free releases the pixels.
int image_read(const char *path, int want_c, int want_h, int want_w, Image *img, char *err, size_t errlen);
// Writes img as an 8-bit PNG (gray for 1 channel, RGB for 3). Returns 0, or -1 with the reason in err.
int image_write_png(const char *path, const Image *img, char *err, size_t errlen);
void image_free(Image *img);
// Image `index` of ds (its bytes, not normalised), as an Image (free with image_free).
Image image_of_sample(const Dataset *ds, int index);
// The name of class k of a dataset ("airplane", "T-shirt/top", ...; "class 7" when the kit has no names).
const char *class_name(const char *dataset, int k);

// Everything main does after parsing: load, evaluate, report, predict --image, measure --latency.
// Returns the exit status (0: done; 1: refused, the reason printed).
int run_inference(const TrainOptions *o);

#ifdef __cplusplus
}
#endif

#endif // LESSON06_H
