// kit/data.h: datasets, the sampler that shards them across ranks, augmentation, and a
// loader that prepares the next batch on a background thread.
//
// Images are kept as bytes (N, C, H, W) and turned into normalised floats one batch at a time.
#ifndef KIT_DATA_H
#define KIT_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kit/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char name[32];      // "cifar10", "cifar100", "fashion-mnist", "synthetic"
    int n, c, h, w;     // images (N, C, H, W)
    int classes;
    uint8_t *images;    // (N, C, H, W), 0..255
    uint8_t *labels;    // (N), 0..classes-1
    float mean[3];      // per-channel mean and std of the TRAINING split, in [0, 1] units
    float std[3];
} Dataset;

typedef enum { SPLIT_TRAIN, SPLIT_TEST } Split;

// Loads a dataset of the table below (dataset_info) from dir.
// Returns 0, or -1 with a one-line message in err naming the file and what was expected
// (missing, empty, truncated, wrong magic, wrong size, bad label). Never a partial load.
// File layouts (see datasets/README.md):
//   cifar10:  dir/cifar-10-batches-bin/data_batch_{1..5}.bin, test_batch.bin (records of 1 + 3072 bytes)
//   cifar100: dir/cifar-100-binary/train.bin, test.bin (records of 2 + 3072 bytes; the fine label is used)
//   fashion-mnist: dir/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] (IDX, gzip read through zlib)
//   synthetic: generated (dir unused): 10 classes, 3x32x32, 5000 train / 1000 test, seed 1234
// mean/std: published per-channel values of the TRAINING split for the real datasets (the test split
// gets the same numbers); for synthetic, computed from its first 1000 training images for both splits.
int dataset_load(Dataset *ds, const char *name, const char *dir, Split split, char *err, size_t errlen);
int dataset_load_cifar10(Dataset *ds, const char *dir, Split split, char *err, size_t errlen);
int dataset_load_cifar100(Dataset *ds, const char *dir, Split split, char *err, size_t errlen);
int dataset_load_fashion_mnist(Dataset *ds, const char *dir, Split split, char *err, size_t errlen);

#define DATASET_SYNTHETIC_TRAIN 5000
#define DATASET_SYNTHETIC_TEST 1000
#define DATASET_SYNTHETIC_SEED 1234

// A deterministic, LEARNABLE synthetic set shaped like CIFAR: each class has a fixed pattern
// (derived from seed) and every image is its class pattern plus per-image noise and a random shift.
// The train and test splits share the patterns and differ in the noise.
// Pattern of a class: two oriented sinusoidal stripe patterns (class-specific angle, frequency and
// per-channel colour mix), zero-mean, so the mean colour does not give the class away. Per image: a
// random phase of each pattern (the random shift), contrast 0.8..1.2, brightness +-0.1 and pixel noise
// of sigma 0.12 (in [0, 1] units). Image i is a pure function of (seed, split, i). Labels: every block
// of `classes` consecutive indices is a random permutation of the classes (balanced).
// c must be 1..3, classes 1..256. mean/std: from the first 1000 TRAIN images, whatever the split and n.
void dataset_synthetic(Dataset *ds, int n, int classes, int c, int h, int w, uint64_t seed, Split split);
void dataset_free(Dataset *ds);

// ---------------------------------------------------------------- augmentation
typedef struct {
    int crop_pad;  // random crop after zero-padding by this many pixels (0 = none); CIFAR uses 4
    bool flip;     // random horizontal flip
} Augment;

// ---------------------------------------------------------------- the dataset table
// One row per dataset (DATASETS in kit/data.c): everything the kit knows about it. Adding a dataset is a
// reader and a row; --dataset, --help, the default model and epochs and the augmentation follow from it.
typedef struct {
    const char *name;           // --dataset NAME
    int (*load)(Dataset *ds, const char *dir, Split split, char *err, size_t errlen);  // as dataset_load
    const char *default_model;  // --model when not given
    int default_epochs;         // --epochs when not given: the README's reference schedule
    Augment train_augment;      // for the training split ({0}: none); the test split is never augmented
    const char *const *class_names;  // names by label, NULL-terminated ("airplane", ...); NULL: the kit has none
} DatasetInfo;

// The row named `name`, or NULL.
const DatasetInfo *dataset_info(const char *name);
// The names of the table joined by '|' ("synthetic|cifar10|cifar100|fashion-mnist"), for --help.
const char *dataset_names(void);
// Row i of the table, NULL past its end: for (int i = 0; (d = dataset_at(i)) != NULL; i++)
const DatasetInfo *dataset_at(int i);

// Builds a batch on the host: x (b, C, H, W) normalised floats, y (b) labels, from sample indices idx.
// aug == NULL: no augmentation. The random crop/flip of a sample depends only on
// (seed, epoch, sample index), so it is the same on every rank, thread and resumed run.
// Crop offsets are uniform in [-crop_pad, crop_pad] per axis, then a fair coin for the flip, all drawn
// from rng_make(seed, dataset_aug_stream(epoch, index)). An index outside 0..n-1 is a clear error (exit).
void dataset_fill_batch(const Dataset *ds, const int *idx, int b, const Augment *aug, uint64_t seed,
                        int epoch, float *x, int *y);
// The rng stream of sample `index` in `epoch`: DATASET_AUG_TAG | (epoch mod 2^24) << 32 | index. The tag
// keeps it apart from the sampler's streams (SAMPLER_STREAM_TAG | epoch) under the same seed.
#define DATASET_AUG_TAG 0x4100000000000000ull
uint64_t dataset_aug_stream(int epoch, int index);

// ---------------------------------------------------------------- sampler (DistributedSampler, explicit)
typedef enum {
    SAMPLER_TRAIN_PAD,   // shuffle; pad by repeating the first indices so every rank gets ceil(n / world)
    SAMPLER_TRAIN_DROP,  // shuffle; drop the tail so every rank gets floor(n / world)
    SAMPLER_EVAL,        // no shuffle, no padding: rank r gets r, r + world, ...; every sample exactly once
} SamplerMode;

typedef struct {
    int n, rank, world;
    uint64_t seed;
    SamplerMode mode;
    int epoch;
} Sampler;

// n >= 0, world >= 1, 0 <= rank < world (else a clear error and exit). The epoch starts at 0.
void sampler_init(Sampler *s, int n, int rank, int world, uint64_t seed, SamplerMode mode);
// The order depends on (seed, epoch) only: the same on every rank, different every epoch.
// It is rng_shuffle of 0..n-1 with rng_make(seed, SAMPLER_STREAM_TAG | epoch). PAD appends the first
// entries of that permutation again (cycling when n < world) up to ceil(n / world) * world; DROP keeps
// the first floor(n / world) * world; rank r then takes positions r, r + world, r + 2 * world, ...
// PAD and DROP are torch.utils.data.DistributedSampler's drop_last=False and True on that permutation
// (tests/test_sampler.c compares the shards with the real one when torch is installed).
#define SAMPLER_STREAM_TAG 0x5300000000000000ull
void sampler_set_epoch(Sampler *s, int epoch);
// How many indices this rank gets per epoch.
int sampler_len(const Sampler *s);
// Writes this rank's indices for the current epoch into out (sampler_len entries); returns the count.
int sampler_indices(const Sampler *s, int *out);

// ---------------------------------------------------------------- loader
typedef struct Loader Loader;

typedef struct {
    int n;              // samples in this batch (the last one of an epoch may be short)
    float *x;           // (n, C, H, W) host memory (pinned when CUDA is usable)
    int *y;             // (n)
    int index;          // batch number within the epoch
    Loader *loader;     // the loader that owns it (NULL for a Batch made by hand): see batch_on_device
} Batch;

// Batches of batch_size from the sampler's indices; drop_last drops a short final batch.
// A background thread fills the next batch while the caller computes on the current one.
// The loader keeps its own copy of *s (and of *aug; aug may be NULL); ds must outlive the loader.
// Batch k of an epoch holds positions k*batch_size .. of sampler_indices for that epoch, filled with
// dataset_fill_batch(ds, ..., aug, seed, epoch, ...), so it equals a direct fill.
Loader *loader_create(const Dataset *ds, const Sampler *s, int batch_size, bool drop_last,
                      const Augment *aug, uint64_t seed);
// Starts an epoch (reshuffles through the sampler) at batch number start_batch (0, or more on resume;
// 0 <= start_batch <= loader_batches_per_epoch, else a clear error). Cancels the rest of the last one.
void loader_start_epoch(Loader *L, int epoch, int start_batch);
// The next batch, or NULL at the end of the epoch. Valid until the next call.
// *wait_seconds (if not NULL) is the time spent waiting for the background thread; with --trace the call is a
// "data wait" span on the caller's track (kit/trace.h).
// Calling it before the first loader_start_epoch is a clear error.
const Batch *loader_next(Loader *L, double *wait_seconds);
int loader_batches_per_epoch(const Loader *L);
void loader_free(Loader *L);

// ---------------------------------------------------------------- the copy to the device, overlapped (CUDA)
// On CUDA the loader can also copy each batch to the GPU ahead of time, so that the copy of batch k+1 runs
// on the copy engine while the GPU computes batch k. It starts on demand: the first time a consumer asks
// batch_on_device for a batch of this loader on CUDA, the loader allocates two device buffers (one per host
// slot), a non-blocking copy stream and two pairs of events, and from then on the background thread, right
// after filling a slot, queues its copy (cudaMemcpyAsync from the pinned slot) and records copied[slot]:
//
//   worker (batch k+1):  wait copied[s] (the last copy out of host slot s is done), fill host slot s,
//                        copy stream: wait consumed[s], copy s -> device slot s, record copied[s]
//   loader_next (k+1):   record consumed[slot of batch k-1] on the legacy stream (after all the compute
//                        queued on it), hand over batch k+1
//   consumer (step k+1): compute stream waits copied[s] (its own copy only), reads device slot s
//
// Why events and not a synchronize: the host never blocks on the copy, and the compute stream waits only
// for the copy of its own batch, not for the one of the next batch queued behind it.
// Why a NON-BLOCKING stream: a stream created with default flags is ordered with the legacy default stream
// that device_copy_from and device_memset_zero use, so every synchronous call would wait for the copy.

// Where a consumer on device d finds b's images (n, C, H, W) and labels (n) on the device. When the loader
// staged b on the calling thread's GPU: sets *x and *y to its device copies, makes this thread's compute
// stream (cuda_stream()) wait for their copy, and returns true; they stay valid until the next loader_next.
// Otherwise returns false (CPU, a Batch not handed out by a loader, such as lesson 02's chunks, another
// GPU, or a loader that was not staging yet) and the caller copies b->x and b->y itself; when b came from
// a loader and d is CUDA, the loader starts staging the batches that follow.
// Used by train_forward_backward and train_evaluate (kit/train.c): every lesson from 03 on gets the overlap
// there. Lesson 01's train_step copies the batch itself (the exercise), and lesson 02 scatters it.
bool batch_on_device(const Batch *b, Device d, const float **x, const int **y);
// Allows (default) or forbids staging. KIT_OVERLAP=0 in the environment forbids it for every loader, to
// compare a run with and without the overlap. Forbidding it after it started stops it for the batches
// filled from then on.
void loader_set_overlap(Loader *L, bool allowed);

#ifdef __cplusplus
}
#endif

#endif // KIT_DATA_H
