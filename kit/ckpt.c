// kit/ckpt.c: the checkpoint file (see ckpt.h and kit/CHECKPOINT.md for the byte layout).
//
// Every integer and float is written byte by byte, little-endian, by the put_/get_ helpers below, so the
// layout does not depend on the compiler's struct padding. Tensor data is copied as it sits in memory,
// which is little-endian IEEE-754 on every machine the kit builds for (x86-64, AArch64); the static
// assertion stops a big-endian build instead of letting it write files nobody else can read.
#include "kit/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "kit/check.h"
#include "kit/device.h"
#include "kit/trace.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the checkpoint format stores tensors little-endian");
_Static_assert(sizeof(float) == 4, "tensors are stored as 32-bit floats");

enum {
    HEADER_BYTES = 240,  // every field of write_header, its CRC included (checked by the encoder)
    ENTRY_BYTES = 96,    // one tensor-table entry
    TRAILER_BYTES = 16,  // "KITCKEND", CRC-32 of everything before, 4 zero bytes
    DATA_ALIGN = 64,     // the data starts on a 64-byte boundary: numpy/mmap readers can view it in place
};

const char *ckpt_group_name(CkptGroup g) {
    static const char *names[] = {"params", "momentum", "buffers"};
    return (unsigned)g < CKPT_GROUPS ? names[g] : "?";
}

// zlib's crc32 takes a uInt length: feed large buffers in pieces.
static uint32_t crc_of(uint32_t crc, const uint8_t *p, uint64_t n) {
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return crc;
}

uint32_t ckpt_params_crc32(const Model *m) {
    const size_t bytes = m->n_params * sizeof(float);
    uint8_t *h = xmalloc(bytes + 1);
    device_copy_from(m->device, h, m->params, bytes);
    uint32_t crc = crc_of(0, h, bytes);
    free(h);
    return crc;
}

// Two CRCs differ. The fuzzing build (make fuzz) accepts any CRC, so that random bytes reach the parsing
// behind the checks (table entries, bounds, shapes) instead of stopping at the first CRC; CRC-32 itself is zlib's.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define crc_differs(a, b) ((void)(a), (void)(b), false)
#else
#define crc_differs(a, b) ((a) != (b))
#endif

// ---------------------------------------------------------------- byte helpers

typedef struct {
    uint8_t *p;
    size_t at;
} Put;

static void put_bytes(Put *w, const void *src, size_t n) {
    memcpy(w->p + w->at, src, n);
    w->at += n;
}
static void put_u32(Put *w, uint32_t v) {
    for (int i = 0; i < 4; i++) w->p[w->at++] = (uint8_t)(v >> (8 * i));
}
static void put_u64(Put *w, uint64_t v) {
    for (int i = 0; i < 8; i++) w->p[w->at++] = (uint8_t)(v >> (8 * i));
}
static void put_i32(Put *w, int v) { put_u32(w, (uint32_t)v); }
static void put_f32(Put *w, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    put_u32(w, u);
}
static void put_f64(Put *w, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    put_u64(w, u);
}
// A fixed-size, NUL-padded string field (the last byte is always NUL).
static void put_str(Put *w, const char *s, size_t field) {
    memset(w->p + w->at, 0, field);
    size_t len = strnlen(s, field - 1);
    memcpy(w->p + w->at, s, len);
    w->at += field;
}

typedef struct {
    const uint8_t *p;
    size_t at;
} Get;

static uint32_t get_u32(Get *r) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)r->p[r->at++] << (8 * i);
    return v;
}
static uint64_t get_u64(Get *r) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)r->p[r->at++] << (8 * i);
    return v;
}
static int get_i32(Get *r) { return (int)get_u32(r); }
static float get_f32(Get *r) {
    uint32_t u = get_u32(r);
    float v;
    memcpy(&v, &u, 4);
    return v;
}
static double get_f64(Get *r) {
    uint64_t u = get_u64(r);
    double v;
    memcpy(&v, &u, 8);
    return v;
}
// Returns false when the field is not NUL-terminated (a corrupt or foreign file).
static bool get_str(Get *r, char *out, size_t field) {
    bool ok = memchr(r->p + r->at, 0, field) != NULL;
    memcpy(out, r->p + r->at, field);
    out[field - 1] = 0;
    r->at += field;
    return ok;
}

// ---------------------------------------------------------------- layout

typedef struct {
    uint32_t n_tensors, table_crc;
    uint64_t data_offset, data_bytes;
} Layout;

// The header: magic, version, size, the state, the layout, and its own CRC (HEADER_BYTES in all).
static void write_header(uint8_t *p, const CkptState *s, const Layout *l) {
    Put w = {p, 0};
    put_bytes(&w, CKPT_MAGIC, 8);
    put_u32(&w, CKPT_VERSION);
    put_u32(&w, HEADER_BYTES);
    put_str(&w, s->model.name, sizeof s->model.name);
    put_i32(&w, s->model.width);
    put_i32(&w, s->model.in_c);
    put_i32(&w, s->model.in_h);
    put_i32(&w, s->model.in_w);
    put_i32(&w, s->model.classes);
    put_str(&w, s->dataset, sizeof s->dataset);
    put_i32(&w, s->world);
    put_i32(&w, s->global_batch);
    put_i32(&w, s->steps_per_epoch);
    put_i32(&w, s->epochs);
    put_i32(&w, s->epoch);
    put_i32(&w, s->batch_in_epoch);
    put_u64(&w, (uint64_t)s->step);
    put_u64(&w, s->seed);
    put_f32(&w, s->peak_lr);
    put_f32(&w, s->final_lr);
    put_i32(&w, s->warmup_steps);
    put_i32(&w, s->total_steps);
    put_i32(&w, s->decay);
    put_f32(&w, s->momentum);
    put_f32(&w, s->weight_decay);
    put_i32(&w, s->nesterov);
    put_f64(&w, s->loss_sum);
    put_u64(&w, (uint64_t)s->correct);
    put_u64(&w, (uint64_t)s->count);
    put_u64(&w, (uint64_t)s->images);
    put_f64(&w, s->last_loss);
    put_f64(&w, s->test_acc);
    put_u32(&w, l->n_tensors);
    put_u32(&w, l->table_crc);
    put_u64(&w, l->data_offset);
    put_u64(&w, l->data_bytes);
    put_u32(&w, crc_of(0, p, w.at));
    CHECK(w.at == HEADER_BYTES, "kit/ckpt.c: HEADER_BYTES must equal the bytes write_header puts");
}

// Reads what write_header wrote after the magic, version and size (checked by the caller).
static bool read_header(const uint8_t *p, CkptState *s, Layout *l) {
    Get r = {p, 16};
    memset(s, 0, sizeof *s);
    bool strings = get_str(&r, s->model.name, sizeof s->model.name);
    s->model.width = get_i32(&r);
    s->model.in_c = get_i32(&r);
    s->model.in_h = get_i32(&r);
    s->model.in_w = get_i32(&r);
    s->model.classes = get_i32(&r);
    strings &= get_str(&r, s->dataset, sizeof s->dataset);
    s->world = get_i32(&r);
    s->global_batch = get_i32(&r);
    s->steps_per_epoch = get_i32(&r);
    s->epochs = get_i32(&r);
    s->epoch = get_i32(&r);
    s->batch_in_epoch = get_i32(&r);
    s->step = (long long)get_u64(&r);
    s->seed = get_u64(&r);
    s->peak_lr = get_f32(&r);
    s->final_lr = get_f32(&r);
    s->warmup_steps = get_i32(&r);
    s->total_steps = get_i32(&r);
    s->decay = get_i32(&r);
    s->momentum = get_f32(&r);
    s->weight_decay = get_f32(&r);
    s->nesterov = get_i32(&r);
    s->loss_sum = get_f64(&r);
    s->correct = (long long)get_u64(&r);
    s->count = (long long)get_u64(&r);
    s->images = (long long)get_u64(&r);
    s->last_loss = get_f64(&r);
    s->test_acc = get_f64(&r);
    l->n_tensors = get_u32(&r);
    l->table_crc = get_u32(&r);
    l->data_offset = get_u64(&r);
    l->data_bytes = get_u64(&r);
    return strings;
}

static void write_entry(uint8_t *p, const CkptTensor *t) {
    Put w = {p, 0};
    put_str(&w, t->name, sizeof t->name);
    put_u32(&w, (uint32_t)t->group);
    put_u32(&w, (uint32_t)t->dtype);
    put_u32(&w, (uint32_t)t->ndim);
    for (int d = 0; d < 4; d++) put_i32(&w, d < t->ndim ? t->shape[d] : 0);
    put_u64(&w, t->offset);
    put_u64(&w, t->nbytes);
    put_u32(&w, t->crc);
    CHECK(w.at == ENTRY_BYTES, "kit/ckpt.c: ENTRY_BYTES must equal the bytes write_entry puts");
}

static bool read_entry(const uint8_t *p, CkptTensor *t) {
    Get r = {p, 0};
    bool ok = get_str(&r, t->name, sizeof t->name);
    t->group = (CkptGroup)get_u32(&r);
    t->dtype = (CkptDtype)get_u32(&r);
    t->ndim = (int)get_u32(&r);
    for (int d = 0; d < 4; d++) t->shape[d] = get_i32(&r);
    t->offset = get_u64(&r);
    t->nbytes = get_u64(&r);
    t->crc = get_u32(&r);
    return ok;
}

// ---------------------------------------------------------------- encoding

// The model's three buffers and their views, in file order.
typedef struct {
    const TensorView *views;
    int n;
    const float *data;  // on the device
    size_t count;
} GroupSrc;

static void model_groups(const Model *m, GroupSrc g[CKPT_GROUPS]) {
    g[CKPT_PARAMS] = (GroupSrc){m->views, m->n_views, m->params, m->n_params};
    g[CKPT_MOMENTUM] = (GroupSrc){m->views, m->n_views, m->velocity, m->n_params};
    g[CKPT_BUFFERS] = (GroupSrc){m->buffer_views, m->n_buffer_views, m->buffers, m->n_buffers};
}

// A file in parts, so that a save can write the tensors straight from where they are (no copy of the model
// into one big buffer: allocating and touching it would cost more than the disk write): the prefix (header,
// table, padding), each group's bytes (the model's own memory on the CPU; a host copy of a GPU model), the trailer.
typedef struct {
    uint8_t *prefix;
    size_t prefix_bytes;
    const uint8_t *group[CKPT_GROUPS];
    size_t group_bytes[CKPT_GROUPS];
    uint8_t *staged[CKPT_GROUPS];  // host copies of device buffers (NULL on the CPU)
    uint8_t trailer[TRAILER_BYTES];
} Parts;

static void parts_free(Parts *f) {
    free(f->prefix);
    for (int k = 0; k < CKPT_GROUPS; k++) free(f->staged[k]);
}

static void encode_parts(const Model *m, const CkptState *st, Parts *f) {
    memset(f, 0, sizeof *f);
    GroupSrc g[CKPT_GROUPS];
    model_groups(m, g);
    uint32_t n_tensors = 0;
    uint64_t data_bytes = 0;
    for (int k = 0; k < CKPT_GROUPS; k++) {
        n_tensors += (uint32_t)g[k].n;
        f->group_bytes[k] = g[k].count * sizeof(float);
        data_bytes += f->group_bytes[k];
        if (m->device == DEVICE_CPU || !g[k].count) {
            f->group[k] = (const uint8_t *)g[k].data;
        } else {  // one copy per flat buffer from the device
            f->staged[k] = xmalloc(f->group_bytes[k]);
            device_copy_from(m->device, f->staged[k], g[k].data, f->group_bytes[k]);
            f->group[k] = f->staged[k];
        }
    }
    uint64_t table_end = HEADER_BYTES + (uint64_t)n_tensors * ENTRY_BYTES;
    Layout l = {.n_tensors = n_tensors,
                .data_offset = (table_end + DATA_ALIGN - 1) / DATA_ALIGN * DATA_ALIGN,
                .data_bytes = data_bytes};
    f->prefix_bytes = (size_t)l.data_offset;
    f->prefix = xcalloc(f->prefix_bytes, 1);  // zeroed: the padding is covered by the trailer's CRC

    // Table: one entry per view, pointing into its group's block; the views of a group tile it in order
    // (view_push in kit/model.c lays them end to end), so the data's CRC is the combination of the tensors'.
    uint64_t at = l.data_offset;
    uint32_t e = 0, data_crc = 0;
    for (int k = 0; k < CKPT_GROUPS; k++) {
        size_t next = 0;
        for (int i = 0; i < g[k].n; i++, e++) {
            const TensorView *v = &g[k].views[i];
            CHECK(v->offset == next, "kit/ckpt.c: a model's views must tile its flat buffer in order");
            next += v->count;
            CkptTensor t = {.group = (CkptGroup)k, .dtype = CKPT_F32, .ndim = v->ndim,
                            .offset = at + v->offset * sizeof(float), .nbytes = v->count * sizeof(float)};
            snprintf(t.name, sizeof t.name, "%s", v->name);
            memcpy(t.shape, v->shape, sizeof t.shape);
            t.crc = crc_of(0, f->group[k] + v->offset * sizeof(float), t.nbytes);
            data_crc = (uint32_t)crc32_combine(data_crc, t.crc, (z_off_t)t.nbytes);
            write_entry(f->prefix + HEADER_BYTES + (size_t)e * ENTRY_BYTES, &t);
        }
        CHECK(next == g[k].count, "kit/ckpt.c: a model's views must cover its flat buffer");
        at += f->group_bytes[k];
    }
    l.table_crc = crc_of(0, f->prefix + HEADER_BYTES, (uint64_t)n_tensors * ENTRY_BYTES);
    write_header(f->prefix, st, &l);
    // Trailer: the CRC of every byte before it (header, table, padding, data).
    uint32_t all = (uint32_t)crc32_combine(crc_of(0, f->prefix, f->prefix_bytes), data_crc, (z_off_t)data_bytes);
    Put w = {f->trailer, 0};
    put_bytes(&w, CKPT_END_MAGIC, 8);
    put_u32(&w, all);
    put_u32(&w, 0);
}

uint8_t *ckpt_encode(const Model *m, const CkptState *st, size_t *bytes) {
    Parts f;
    encode_parts(m, st, &f);
    size_t total = f.prefix_bytes + TRAILER_BYTES;
    for (int k = 0; k < CKPT_GROUPS; k++) total += f.group_bytes[k];
    uint8_t *p = xmalloc(total);
    Put w = {p, 0};
    put_bytes(&w, f.prefix, f.prefix_bytes);
    for (int k = 0; k < CKPT_GROUPS; k++)
        if (f.group_bytes[k]) put_bytes(&w, f.group[k], f.group_bytes[k]);
    put_bytes(&w, f.trailer, TRAILER_BYTES);
    parts_free(&f);
    *bytes = total;
    return p;
}

// ---------------------------------------------------------------- atomic write

// write(2) until done: it may write less than asked (signals, pipes, quotas).
static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

// The folder part of path ("." when it has none).
static void dir_of(const char *path, char *out, size_t outlen) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, outlen, ".");
    else if (slash == path) snprintf(out, outlen, "/");
    else snprintf(out, outlen, "%.*s", (int)(slash - path), path);
}

typedef struct {
    const void *p;
    size_t n;
} Piece;

static int write_atomic_pieces(const char *path, const Piece *pieces, int n_pieces, char *err, size_t errlen) {
    char tmp[4096], dir[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return check_reason(err, errlen, "%s: path too long", path);
    dir_of(path, dir, sizeof dir);
    // 1. a temporary file in the SAME folder: rename(2) is atomic only within one file system.
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return check_reason(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
    // 2. the bytes, then 3. fsync: until it returns they may sit in the page cache only.
    const char *step = NULL;
    for (int i = 0; i < n_pieces && !step; i++)
        if (write_all(fd, pieces[i].p, pieces[i].n) != 0) step = "write";
    if (!step && fsync(fd) != 0) step = "fsync";
    int saved = errno;
    if (close(fd) != 0 && !step) step = "close", saved = errno;  // NFS reports write errors at close
    if (step) {
        unlink(tmp);
        return check_reason(err, errlen, "%s: %s failed: %s (the previous %s is untouched)", tmp, step, strerror(saved),
                    path);
    }
    // 4. rename over the old file: readers see the old or the new file, never a mix.
    if (rename(tmp, path) != 0) {
        saved = errno;
        unlink(tmp);
        return check_reason(err, errlen, "rename %s -> %s failed: %s", tmp, path, strerror(saved));
    }
    // 5. fsync the folder: the rename is a change of the folder, and lives in its page cache until then.
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return check_reason(err, errlen, "%s: cannot open the folder to fsync it: %s", dir, strerror(errno));
    int rc = fsync(dfd);
    saved = errno;
    close(dfd);
    if (rc != 0 && saved != EINVAL)  // EINVAL: a file system that cannot sync folders (nothing to wait for)
        return check_reason(err, errlen, "%s: fsync of the folder failed: %s", dir, strerror(saved));
    return 0;
}

int ckpt_save(const char *path, const Model *m, const CkptState *st, char *err, size_t errlen) {
    double t = trace_begin("checkpoint write");
    Parts f;
    encode_parts(m, st, &f);
    Piece pieces[CKPT_GROUPS + 2] = {{f.prefix, f.prefix_bytes}};
    for (int k = 0; k < CKPT_GROUPS; k++) pieces[1 + k] = (Piece){f.group[k], f.group_bytes[k]};
    pieces[CKPT_GROUPS + 1] = (Piece){f.trailer, TRAILER_BYTES};
    int rc = write_atomic_pieces(path, pieces, CKPT_GROUPS + 2, err, errlen);
    parts_free(&f);
    trace_end(t, TRACE_IO, "checkpoint write");
    return rc;
}

// ---------------------------------------------------------------- before the first save

// Creates a file in folder the way a save does (a new name next to the checkpoint) and removes it again.
static int probe_folder(const char *folder, const char *opt, const char *value, char *err, size_t errlen) {
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.ckpt-probe-%ld.tmp", folder, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return check_reason(err, errlen, "%s '%s' cannot be written: no file can be created in the folder '%s': %s",
                            opt, value, folder, strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}

// A folder for outputs of `flag`: created when missing (its parent must exist), and a file can be made in it.
static int check_dir_writable(const char *flag, const char *dir, char *err, size_t errlen) {
    struct stat st;
    if (!*dir) return check_reason(err, errlen, "%s is empty: name a folder", flag);
    if (stat(dir, &st) == 0) {
        if (!S_ISDIR(st.st_mode))
            return check_reason(err, errlen, "%s '%s' is not a folder (a file of that name exists)", flag, dir);
    } else if (errno != ENOENT || mkdir(dir, 0755) != 0) {
        int saved = errno;
        char parent[4096];
        dir_of(dir, parent, sizeof parent);
        bool no_parent = stat(parent, &st) != 0 || !S_ISDIR(st.st_mode);
        return check_reason(err, errlen, "%s '%s': cannot create the folder: %s%s", flag, dir, strerror(saved),
                            no_parent ? " (its parent folder does not exist: create it first)" : "");
    }
    return probe_folder(dir, flag, dir, err, errlen);
}

// A file `flag` writes: not a folder, in a folder that exists and takes a new file (a save writes PATH.tmp
// there and renames it; a report is written in place, so an existing file must be writable too).
static int check_file_writable(const char *flag, const char *file, char *err, size_t errlen) {
    struct stat st;
    if (!*file) return check_reason(err, errlen, "%s is empty: name a file", flag);
    if (stat(file, &st) == 0 && S_ISDIR(st.st_mode))
        return check_reason(err, errlen, "%s '%s' is a folder: name a file (e.g. %s/run.ckpt)%s", flag, file, file,
                            strcmp(flag, "--checkpoint") == 0 ? ", or use --checkpoint-dir" : "");
    char folder[4096];
    dir_of(file, folder, sizeof folder);
    if (stat(folder, &st) != 0 || !S_ISDIR(st.st_mode))
        return check_reason(err, errlen, "%s '%s' cannot be written: its folder '%s' does not exist (create it "
                            "first)", flag, file, folder);
    if (access(file, F_OK) == 0 && access(file, W_OK) != 0)
        return check_reason(err, errlen, "%s '%s' cannot be written: %s", flag, file, strerror(errno));
    return probe_folder(folder, flag, file, err, errlen);
}

int ckpt_check_output(const char *file, const char *dir, char *err, size_t errlen) {
    if (dir) return check_dir_writable("--checkpoint-dir", dir, err, errlen);
    if (file) return check_file_writable("--checkpoint", file, err, errlen);
    return 0;
}

// ---------------------------------------------------------------- whose file is it?

bool ckpt_same_run(const CkptState *st, const CkptState *id, char *why, size_t whylen) {
    char a[CKPT_ESCAPED_LEN], b[CKPT_ESCAPED_LEN];
    const ModelConfig *m = &st->model, *n = &id->model;
    if (strncmp(m->name, n->name, sizeof m->name) != 0 || m->width != n->width || m->in_c != n->in_c ||
        m->in_h != n->in_h || m->in_w != n->in_w || m->classes != n->classes)
        return check_reason(why, whylen, "model %s width %d, this run %s width %d",
                            ckpt_escape(m->name, a, sizeof a), m->width, n->name, n->width), false;
    if (strncmp(st->dataset, id->dataset, sizeof st->dataset) != 0)
        return check_reason(why, whylen, "dataset %s, this run %s", ckpt_escape(st->dataset, b, sizeof b),
                            id->dataset), false;
#define DIFFER(cond, fmt, x, y)                                                                                    \
    if (cond) return check_reason(why, whylen, fmt, x, y), false
    DIFFER(st->seed != id->seed, "seed %llu, this run %llu", (unsigned long long)st->seed, (unsigned long long)id->seed);
    DIFFER(st->global_batch != id->global_batch, "batch size %d, this run %d", st->global_batch, id->global_batch);
    DIFFER(st->epochs != id->epochs, "%d epochs, this run %d", st->epochs, id->epochs);
    DIFFER(st->peak_lr != id->peak_lr, "lr %g, this run %g", (double)st->peak_lr, (double)id->peak_lr);
    DIFFER(st->warmup_steps != id->warmup_steps, "%d warmup steps, this run %d", st->warmup_steps, id->warmup_steps);
    DIFFER(st->momentum != id->momentum, "momentum %g, this run %g", (double)st->momentum, (double)id->momentum);
    DIFFER(st->weight_decay != id->weight_decay, "weight decay %g, this run %g", (double)st->weight_decay,
           (double)id->weight_decay);
    DIFFER(st->nesterov != id->nesterov, "nesterov %d, this run %d", st->nesterov, id->nesterov);
#undef DIFFER
    return true;
}

// What is in the existing checkpoint file `path` may be replaced? 0, or -1 with the reason and the way out.
// folder: the --checkpoint-dir path holds `path` as its newest (NULL: path is the output file itself); what: the
// folder holds "checkpoints" or "sets".
static int check_owner_of(const char *flag, const char *path, const char *folder, const char *what,
                          const CkptOwner *me, char *err, size_t errlen) {
    Ckpt ck;
    char why[1024];
    if (ckpt_read(&ck, path, why, sizeof why) != 0) {
        if (folder)  // a folder's newest is chosen among VALID checkpoints: it cannot be unreadable here
            return check_reason(err, errlen, "%s: cannot read %s: %s", flag, path, why);
        return check_reason(err, errlen, "%s '%s' exists and is not a checkpoint of this kit (%s): this run would "
                            "replace it\n  HINT: --overwrite replaces it; or name another file", flag, path, why);
    }
    const CkptState st = ck.state;
    ckpt_free(&ck);
    bool same = ckpt_same_run(&st, me->id, why, sizeof why);
    if (same && me->resuming) return 0;  // the run it continues: its own file
    // A fresh run is another run even with the same options: the file is the work of the run that wrote it.
    char detail[1200];
    if (same) snprintf(detail, sizeof detail, "step %lld, trained with these same options", st.step);
    else snprintf(detail, sizeof detail, "step %lld; its %s", st.step, why);
    if (folder)
        return check_reason(err, errlen, "%s %s holds the %s of another run (the newest: %s, %s): this run would mix "
                            "its own with them, and prune them\n  HINT: %sgive another folder (or move those files "
                            "away); --overwrite does not apply to a folder", flag, folder, what, path, detail,
                            same && me->can_resume ? "--resume auto continues that run; " : "");
    char resume[1200] = "";
    if (me->can_resume)
        snprintf(resume, sizeof resume, "--resume %s%s continues that run; ", path, same ? "" : " (with its options)");
    return check_reason(err, errlen, "%s '%s' holds a checkpoint of another run (%s): this %s would replace it\n"
                        "  HINT: --overwrite replaces it; %sor name another file", flag, path, detail,
                        me->resuming ? "run" : "fresh run", resume);
}

int ckpt_check_file_owner(const char *flag, const char *path, CkptOutputKind kind, const CkptOwner *me, char *err,
                          size_t errlen) {
    if (check_file_writable(flag, path, err, errlen) != 0) return -1;
    struct stat st;
    if (stat(path, &st) != 0) return 0;  // nothing there: nothing to lose
    if (kind == CKPT_OUT_REPORT) {
        // A report replaces (or appends to) a text file, never a checkpoint: a run's work is not a report.
        char magic[8] = {0};
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(magic, 1, sizeof magic, f) : 0;
        if (f) fclose(f);
        if (n == sizeof magic && memcmp(magic, CKPT_MAGIC, sizeof magic) == 0 && !me->overwrite)
            return check_reason(err, errlen, "%s '%s' is a checkpoint: this run would write its report over it\n"
                                "  HINT: name another file (--overwrite replaces it)", flag, path);
        return 0;
    }
    if (me->overwrite) return 0;
    return check_owner_of(flag, path, NULL, NULL, me, err, errlen);
}

int ckpt_check_dir_owner(const char *flag, const char *dir, const char *newest, const char *what, const CkptOwner *me,
                         char *err, size_t errlen) {
    if (check_dir_writable(flag, dir, err, errlen) != 0) return -1;
    if (!newest) return 0;
    return check_owner_of(flag, newest, dir, what, me, err, errlen);
}

// ---------------------------------------------------------------- names from a file, printed

const char *ckpt_escape(const char *s, char *out, size_t outlen) {
    size_t at = 0;
    for (; *s && at + 5 < outlen; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c < 0x7f && c != '\\') out[at++] = (char)c;
        else at += (size_t)snprintf(out + at, outlen - at, c == '\\' ? "\\\\" : "\\x%02x", c);
    }
    if (outlen) out[at < outlen ? at : outlen - 1] = '\0';
    return out;
}

// ---------------------------------------------------------------- decoding

static bool mul_overflows(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }

// The table entry must be a sane f32 tensor inside the data section with a matching byte count.
static int check_entry(const CkptTensor *t, int i, const Layout *l, char *err, size_t errlen) {
    char name[CKPT_ESCAPED_LEN];  // the file's bytes: a crafted name must not print control characters
    ckpt_escape(t->name, name, sizeof name);
    if ((unsigned)t->group >= CKPT_GROUPS)
        return check_reason(err, errlen, "tensor table entry %d (%s): unknown group %u", i, name, (unsigned)t->group);
    if (t->dtype != CKPT_F32)
        return check_reason(err, errlen, "tensor %s: unknown dtype %u (this kit reads f32 = 0)", name, (unsigned)t->dtype);
    if (t->ndim < 1 || t->ndim > 4)
        return check_reason(err, errlen, "tensor %s: %d dimensions (1..4 expected)", name, t->ndim);
    uint64_t count = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] <= 0 || mul_overflows(count, (uint64_t)t->shape[d], &count))
            return check_reason(err, errlen, "tensor %s: bad shape (dimension %d is %d)", name, d, t->shape[d]);
    }
    uint64_t nbytes, end;
    if (mul_overflows(count, sizeof(float), &nbytes) || nbytes != t->nbytes)
        return check_reason(err, errlen, "tensor %s: %llu bytes for %llu floats", name, (unsigned long long)t->nbytes,
                    (unsigned long long)count);
    if (t->offset < l->data_offset || __builtin_add_overflow(t->offset, t->nbytes, &end) ||
        end > l->data_offset + l->data_bytes)
        return check_reason(err, errlen, "tensor %s: bytes [%llu, +%llu) lie outside the data section [%llu, +%llu)", name,
                    (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                    (unsigned long long)l->data_offset, (unsigned long long)l->data_bytes);
    return 0;
}

int ckpt_decode(Ckpt *ck, const void *buf, size_t n, char *err, size_t errlen) {
    memset(ck, 0, sizeof *ck);
    const uint8_t *p = buf;
    if (n < 16) return check_reason(err, errlen, "truncated: %zu bytes, not even a header", n);
    if (memcmp(p, CKPT_MAGIC, 8) != 0)
        return check_reason(err, errlen, "wrong magic: this is not a kit checkpoint (expected \"%s\" at byte 0)", CKPT_MAGIC);
    Get r = {p, 8};
    uint32_t version = get_u32(&r), header_bytes = get_u32(&r);
    if (version != CKPT_VERSION)
        return check_reason(err, errlen, "format version %u; this kit reads version %u", version, CKPT_VERSION);
    if (header_bytes != HEADER_BYTES)
        return check_reason(err, errlen, "header of %u bytes; version %u has %u", header_bytes, version, HEADER_BYTES);
    if (n < HEADER_BYTES) return check_reason(err, errlen, "truncated in the header: %zu of %d bytes", n, HEADER_BYTES);
    Get c = {p, HEADER_BYTES - 4};
    if (crc_differs(get_u32(&c), crc_of(0, p, HEADER_BYTES - 4)))
        return check_reason(err, errlen, "header CRC mismatch: the header is corrupt");
    Layout l;
    if (!read_header(p, &ck->state, &l)) return check_reason(err, errlen, "header: a name field is not NUL-terminated");
    ck->version = version;

    // Sizes: the header says how long the file is; anything else is truncation or garbage.
    if (l.n_tensors > CKPT_MAX_TENSORS)
        return check_reason(err, errlen, "header: %u tensors (more than %d: corrupt)", l.n_tensors, CKPT_MAX_TENSORS);
    uint64_t table_end = HEADER_BYTES + (uint64_t)l.n_tensors * ENTRY_BYTES, total;
    if (l.data_offset < table_end || l.data_offset % DATA_ALIGN != 0 || l.data_offset - table_end >= DATA_ALIGN ||
        __builtin_add_overflow(l.data_offset, l.data_bytes, &total) ||
        __builtin_add_overflow(total, (uint64_t)TRAILER_BYTES, &total))
        return check_reason(err, errlen, "header: inconsistent layout (data at %llu, table ends at %llu)",
                    (unsigned long long)l.data_offset, (unsigned long long)table_end);
    if (n < total)
        return check_reason(err, errlen, "truncated: %zu bytes, the header says %llu (cut in the %s)", n,
                    (unsigned long long)total,
                    n < table_end ? "tensor table" : n < l.data_offset + l.data_bytes ? "tensor data" : "trailer");
    if (n > total)
        return check_reason(err, errlen, "%zu bytes, the header says %llu: trailing bytes after the trailer", n,
                    (unsigned long long)total);
    if (crc_differs(crc_of(0, p + HEADER_BYTES, table_end - HEADER_BYTES), l.table_crc))
        return check_reason(err, errlen, "tensor table CRC mismatch: the table is corrupt");
    size_t trailer = (size_t)(total - TRAILER_BYTES);
    if (memcmp(p + trailer, CKPT_END_MAGIC, 8) != 0)
        return check_reason(err, errlen, "trailer: wrong end magic (expected \"%s\")", CKPT_END_MAGIC);

    // Table entries: bounds, then every tensor's CRC, then the whole file's.
    ck->tensors = xcalloc(l.n_tensors ? l.n_tensors : 1, sizeof *ck->tensors);
    ck->n_tensors = (int)l.n_tensors;
    for (int i = 0; i < ck->n_tensors; i++) {
        CkptTensor *t = &ck->tensors[i];
        if (!read_entry(p + HEADER_BYTES + (size_t)i * ENTRY_BYTES, t)) {
            free(ck->tensors);
            ck->tensors = NULL;
            return check_reason(err, errlen, "tensor table entry %d: the name is not NUL-terminated", i);
        }
        int bad = check_entry(t, i, &l, err, errlen);
        if (!bad && crc_differs(crc_of(0, p + t->offset, t->nbytes), t->crc)) {
            char name[CKPT_ESCAPED_LEN];
            bad = check_reason(err, errlen, "tensor %s (%s): CRC mismatch: its data is corrupt",
                               ckpt_escape(t->name, name, sizeof name), ckpt_group_name(t->group));
        }
        if (bad) {
            free(ck->tensors);
            ck->tensors = NULL;
            return -1;
        }
    }
    // The whole file's CRC: when the tensors tile the data section in table order (every file the kit writes),
    // it is the combination of the CRCs just checked, without a second pass over the data.
    bool tiled = true;
    uint64_t next = l.data_offset;
    uint32_t file_crc = crc_of(0, p, l.data_offset);
    for (int i = 0; i < ck->n_tensors && tiled; i++) {
        tiled = ck->tensors[i].offset == next;
        next += ck->tensors[i].nbytes;
        file_crc = (uint32_t)crc32_combine(file_crc, ck->tensors[i].crc, (z_off_t)ck->tensors[i].nbytes);
    }
    if (!tiled || next != l.data_offset + l.data_bytes) file_crc = crc_of(0, p, trailer);
    Get tr = {p, trailer + 8};
    if (crc_differs(get_u32(&tr), file_crc)) {
        free(ck->tensors);
        ck->tensors = NULL;
        return check_reason(err, errlen, "file CRC mismatch (trailer): bytes outside the header, table and tensors are corrupt");
    }
    ck->bytes = p;
    ck->size = n;
    return 0;
}

int ckpt_read(Ckpt *ck, const char *path, char *err, size_t errlen) {
    memset(ck, 0, sizeof *ck);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return check_reason(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return check_reason(err, errlen, "%s: not a regular file", path);
    }
    size_t n = (size_t)sb.st_size;
    uint8_t *buf = xmalloc(n ? n : 1);
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    char why[400];
    if (got != n || ckpt_decode(ck, buf, n, why, sizeof why) != 0) {
        if (got != n) snprintf(why, sizeof why, "read %zu of %zu bytes", got, n);
        free(buf);
        return check_reason(err, errlen, "%s: %s", path, why);
    }
    ck->owned = buf;
    return 0;
}

void ckpt_free(Ckpt *ck) {
    free(ck->tensors);
    free(ck->owned);
    memset(ck, 0, sizeof *ck);
}

const CkptTensor *ckpt_find(const Ckpt *ck, CkptGroup g, const char *name) {
    for (int i = 0; i < ck->n_tensors; i++)
        if (ck->tensors[i].group == g && strcmp(ck->tensors[i].name, name) == 0) return &ck->tensors[i];
    return NULL;
}

void ckpt_tensor_data(const Ckpt *ck, const CkptTensor *t, float *out) { memcpy(out, ck->bytes + t->offset, t->nbytes); }

// ---------------------------------------------------------------- against a model

static void shape_str(char *out, size_t len, int ndim, const int *shape) {
    size_t at = (size_t)snprintf(out, len, "(");
    for (int d = 0; d < ndim && at < len; d++) at += (size_t)snprintf(out + at, len - at, d ? ", %d" : "%d", shape[d]);
    if (at < len) snprintf(out + at, len - at, ")");
}

int ckpt_check_model(const Ckpt *ck, const Model *m, char *err, size_t errlen) {
    const ModelConfig *a = &ck->state.model, *b = &m->cfg;
    if (strcmp(a->name, b->name) != 0 || a->width != b->width || a->in_c != b->in_c || a->in_h != b->in_h ||
        a->in_w != b->in_w || a->classes != b->classes) {
        char name[CKPT_ESCAPED_LEN];
        return check_reason(err, errlen,
                    "model mismatch: the checkpoint holds %s (width %d, input %dx%dx%d, %d classes), this program "
                    "built %s (width %d, input %dx%dx%d, %d classes)",
                    ckpt_escape(a->name, name, sizeof name), a->width, a->in_c, a->in_h, a->in_w, a->classes,
                    b->name, b->width, b->in_c, b->in_h, b->in_w, b->classes);
    }
    GroupSrc g[CKPT_GROUPS];
    model_groups(m, g);
    for (int k = 0; k < CKPT_GROUPS; k++) {
        int in_file = 0;
        for (int i = 0; i < ck->n_tensors; i++) in_file += ck->tensors[i].group == (CkptGroup)k;
        for (int i = 0; i < g[k].n; i++) {
            const TensorView *v = &g[k].views[i];
            const CkptTensor *t = ckpt_find(ck, (CkptGroup)k, v->name);
            if (!t) return check_reason(err, errlen, "%s: tensor %s is missing from the checkpoint", ckpt_group_name(k), v->name);
            if (t->ndim != v->ndim || memcmp(t->shape, v->shape, (size_t)v->ndim * sizeof(int)) != 0) {
                char want[64], got[64];
                shape_str(want, sizeof want, v->ndim, v->shape);
                shape_str(got, sizeof got, t->ndim, t->shape);
                return check_reason(err, errlen, "%s: tensor %s has shape %s in the checkpoint, %s in the model",
                            ckpt_group_name(k), v->name, got, want);
            }
        }
        if (in_file != g[k].n)
            return check_reason(err, errlen, "%s: the checkpoint has %d tensors, the model %d", ckpt_group_name(k), in_file,
                        g[k].n);
    }
    return 0;
}

void ckpt_apply(const Ckpt *ck, Model *m) {
    char err[512];
    if (ckpt_check_model(ck, m, err, sizeof err) != 0) die("ckpt_apply: %s", err);
    GroupSrc g[CKPT_GROUPS];
    model_groups(m, g);
    float *dst[CKPT_GROUPS] = {m->params, m->velocity, m->buffers};
    for (int k = 0; k < CKPT_GROUPS; k++) {
        // An inference-only model (model_create_inference) has no velocity: the momentum is checked, not loaded.
        if (!g[k].count || !dst[k]) continue;
        // A file whose tensors lie in the model's order, end to end (every file the kit writes), goes to the
        // device in one copy per flat buffer; any other order, tensor by tensor.
        const CkptTensor *first = ckpt_find(ck, (CkptGroup)k, g[k].views[0].name);
        bool in_order = true;
        for (int i = 0; i < g[k].n && in_order; i++)
            in_order = ckpt_find(ck, (CkptGroup)k, g[k].views[i].name)->offset ==
                       first->offset + g[k].views[i].offset * sizeof(float);
        if (in_order) {
            device_copy_to(m->device, dst[k], ck->bytes + first->offset, g[k].count * sizeof(float));
            continue;
        }
        for (int i = 0; i < g[k].n; i++) {
            const TensorView *v = &g[k].views[i];
            const CkptTensor *t = ckpt_find(ck, (CkptGroup)k, v->name);
            device_copy_to(m->device, dst[k] + v->offset, ck->bytes + t->offset, t->nbytes);
        }
    }
    model_prepare_inference(m);  // an inference model's prepared filters follow the new weights
}

int ckpt_load(const char *path, Model *m, CkptState *st, char *err, size_t errlen) {
    Ckpt ck;
    if (ckpt_read(&ck, path, err, errlen) != 0) return -1;
    char why[400];
    if (ckpt_check_model(&ck, m, why, sizeof why) != 0) {
        ckpt_free(&ck);
        return check_reason(err, errlen, "%s: %s", path, why);
    }
    ckpt_apply(&ck, m);
    if (st) *st = ck.state;
    ckpt_free(&ck);
    return 0;
}

// ---------------------------------------------------------------- a folder of checkpoints

void ckpt_path_for_step(char *out, size_t outlen, const char *dir, long long step) {
    snprintf(out, outlen, "%s/ckpt-%08lld.ckpt", dir, step);
}

// The step in a "ckpt-NNNNNNNN.ckpt" name, or -1 for any other name (temporary files included).
static long long step_of_name(const char *name) {
    unsigned long long step;
    int end = 0;
    if (sscanf(name, "ckpt-%llu.ckpt%n", &step, &end) != 1 || name[end] != 0 || strncmp(name, "ckpt-", 5) != 0)
        return -1;
    return (long long)step;
}

// The steps of dir's checkpoint files, highest first. Returns the count (-1: no such folder).
static int list_steps(const char *dir, long long **steps) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0, cap = 16;
    *steps = xmalloc((size_t)cap * sizeof **steps);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long s = step_of_name(e->d_name);
        if (s < 0) continue;
        if (n == cap) *steps = CHECK_ALLOC(realloc(*steps, (size_t)(cap *= 2) * sizeof **steps));
        (*steps)[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++)  // insertion sort, descending: a folder holds a handful
        for (int j = i; j > 0 && (*steps)[j] > (*steps)[j - 1]; j--) {
            long long t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return n;
}

int ckpt_find_latest(const char *dir, char *out, size_t outlen, char *err, size_t errlen) {
    long long *steps = NULL;
    int n = list_steps(dir, &steps);
    if (n < 0) return check_reason(err, errlen, "%s: cannot open the checkpoint folder: %s", dir, strerror(errno));
    for (int i = 0; i < n; i++) {
        ckpt_path_for_step(out, outlen, dir, steps[i]);
        Ckpt ck;
        char why[512];
        if (ckpt_read(&ck, out, why, sizeof why) == 0) {
            ckpt_free(&ck);
            free(steps);
            return 0;
        }
        fprintf(stderr, "warning: skipping a corrupt checkpoint: %s\n", why);
    }
    free(steps);
    return check_reason(err, errlen, "%s: no valid checkpoint (ckpt-*.ckpt) in this folder (%d corrupt)", dir, n);
}

int ckpt_prune(const char *dir, int keep) {
    if (keep <= 0) return 0;
    long long *steps = NULL;
    int n = list_steps(dir, &steps), removed = 0;
    char path[4096];
    for (int i = keep; i < n; i++) {
        ckpt_path_for_step(path, sizeof path, dir, steps[i]);
        removed += unlink(path) == 0;
    }
    free(steps);
    return removed;
}
