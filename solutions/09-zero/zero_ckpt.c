// zero_ckpt.c: lesson 09, the sharded checkpoint (given code; the file layout is described in zero_ckpt.h).
//
// Under ZeRO no rank holds the whole training state: stage 1 keeps a shard of the momentum, stage 3 a shard of
// the parameters too. Gathering everything on rank 0 to write lesson 04's one file would need the memory the
// stages saved, so every rank writes what it owns, in parallel:
//
//   save     every rank: its slices -> DIR/step-S/shard-R-of-W.ckpt (lesson 04's atomic write);
//            a barrier (an all-reduce that also brings every file's size and CRC-32 to rank 0);
//            rank 0: DIR/step-S/manifest (atomic), LAST: from this moment the set exists; then old sets pruned
//   load     the newest set whose manifest checks and whose every shard has the size and CRC the manifest
//            names; each rank reads the old shards that cover what it owns NOW (another world: a reshard)
//   consolidate   every unit's shards all-gathered, one lesson-04 file of the whole model (lesson 06 reads it)
//
// PyTorch: torch.distributed.checkpoint (DCP) saves the same way: every rank writes its shards, the
// coordinator writes a `.metadata` file last, and a load onto another world reads the slices it needs;
// FSDP's FULL_STATE_DICT (rank0_only) is the consolidation.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "kit/check.h"
#include "kit/ckpt.h"
#include "kit/device.h"
#include "kit/train.h"
#include "kit/log.h"
#include "zero_ckpt.h"

// Sanity bounds for a reader of arbitrary bytes: a manifest line per rank is under 80 bytes.
enum { MANIFEST_VERSION = 1, MANIFEST_MAX_BYTES = 1 << 23, MAX_WORLD = 1 << 16 };

// ---------------------------------------------------------------- small helpers

static uint32_t crc_bytes(const void *p, size_t n) {
    uint32_t crc = 0;
    const uint8_t *b = p;
    while (n > 0) {  // zlib takes a uInt length: large buffers in pieces
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, b, chunk);
        b += chunk, n -= chunk;
    }
    return crc;
}

// The whole file in a malloc'd buffer (at most `limit` bytes). Returns NULL with the reason in err.
static uint8_t *read_all(const char *path, size_t limit, size_t *n, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        check_reason(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > limit) {
        check_reason(err, errlen, "%s: not a regular file of at most %zu bytes", path, limit);
        fclose(f);
        return NULL;
    }
    *n = (size_t)sb.st_size;
    uint8_t *buf = xmalloc(*n + 1);  // + 1: room for a NUL after a text file
    size_t got = fread(buf, 1, *n, f);
    fclose(f);
    if (got != *n) {
        check_reason(err, errlen, "%s: read %zu of %zu bytes", path, got, *n);
        free(buf);
        return NULL;
    }
    buf[*n] = 0;
    return buf;
}

static void set_path(char *out, size_t outlen, const char *dir, long long step) {
    snprintf(out, outlen, "%s/step-%08lld", dir, step);  // zero-padded: the names sort by step
}

static void shard_name(char *out, size_t outlen, int rank, int world) {
    snprintf(out, outlen, "shard-%d-of-%d.ckpt", rank, world);
}

// Every rank learns whether any rank failed; returns the number of ranks that did.
static int agree(ProcessGroup *pg, bool failed) {
    double f = failed ? 1.0 : 0.0;
    pg_allreduce_sum_double_host(pg, &f, 1);
    return (int)f;
}

// ---------------------------------------------------------------- this rank's slices

// Every slice below is an offset and a count in unit u's padded layout: a layout that does not cover the unit's
// parameters (shard * world < n) would save less than the model and read past the gathered buffer.
static void check_layouts(const Zero *z) {
    size_t world = (size_t)pg_world(z->pg);
    for (int u = 0; u < z->n_units; u++) {
        const ShardLayout *l = &z->layout[u];
        CHECKF(l->padded == l->shard * world && l->padded >= l->n && l->n == z->units[u]->n_params,
               "shard_layout (TODO 1a): shard = ceil(n / world), padded = world * shard",
               "unit %d: n %zu, shard %zu, padded %zu on %zu ranks (its model has %zu parameters)", u, l->n,
               l->shard, l->padded, world, z->units[u]->n_params);
    }
}

// This rank's floats of unit u's padded layout: [lo, lo + count) are real, the rest of its shard is padding.
static size_t own_range(const ShardLayout *l, int rank, size_t *count) {
    size_t lo = (size_t)rank * l->shard;
    *count = lo >= l->n ? 0 : (l->n - lo < l->shard ? l->n - lo : l->shard);
    return lo;
}

// This rank's shard of unit u's parameters and momentum, into host p and v (shard floats each, padding 0).
// Where they live depends on the stage: stage 3 keeps only param_shard between steps, stages 1-3 only
// velocity_shard; a stage-0 rank holds everything and takes its slice of the full buffers.
static void own_slices(const Zero *z, int u, float *p, float *v) {
    const Model *m = z->units[u];
    const ShardLayout *l = &z->layout[u];
    size_t count, lo = own_range(l, pg_rank(z->pg), &count);
    memset(p, 0, l->shard * sizeof *p);
    memset(v, 0, l->shard * sizeof *v);
    if (z->stage == ZERO_PARAMS) device_copy_from(m->device, p, z->param_shard[u], l->shard * sizeof *p);
    else if (count) device_copy_from(m->device, p, m->params + lo, count * sizeof *p);
    if (z->stage >= ZERO_OPTIM) device_copy_from(m->device, v, z->velocity_shard[u], l->shard * sizeof *v);
    else if (count) device_copy_from(m->device, v, m->velocity + lo, count * sizeof *v);
}

// ---------------------------------------------------------------- a shard file

// The shard file is a kit checkpoint (kit/ckpt.h) of a host-only Model that is never run: no layers, only the
// views and flat buffers ckpt_encode reads. Its "parameters" are this rank's slice of every unit ("unit03"),
// its "momentum" the same slices of the velocity, its "buffers" (rank 0 only) the BN running statistics.
static uint8_t *shard_encode(const Zero *z, const CkptState *st, size_t *bytes) {
    Model *s = xcalloc(1, sizeof *s);
    s->cfg = st->model;
    s->device = DEVICE_CPU;
    size_t total = 0, total_buffers = 0;
    for (int u = 0; u < z->n_units; u++) total += z->layout[u].shard, total_buffers += z->units[u]->n_buffers;
    s->params = xcalloc(total ? total : 1, sizeof(float));
    s->velocity = xcalloc(total ? total : 1, sizeof(float));
    s->n_params = total;
    for (int u = 0, at = 0; u < z->n_units; u++) {
        size_t shard = z->layout[u].shard;
        if (shard == 0) continue;  // a unit without parameters
        TensorView *t = &s->views[s->n_views++];
        snprintf(t->name, sizeof t->name, "unit%02d", u);
        t->ndim = 1, t->shape[0] = (int)shard, t->offset = (size_t)at, t->count = shard;
        own_slices(z, u, s->params + at, s->velocity + at);
        at += (int)shard;
    }
    if (pg_rank(z->pg) == 0 && total_buffers > 0) {  // every rank holds rank 0's statistics (broadcast each step)
        s->buffers = xcalloc(total_buffers, sizeof(float));
        s->n_buffers = total_buffers;
        for (int u = 0; u < z->n_units; u++) {
            const Model *m = z->units[u];
            CHECK(m->buffer_base + m->n_buffers <= total_buffers, "the units' BN buffers must tile the whole model's");
            if (m->n_buffers) device_copy_from(m->device, s->buffers + m->buffer_base, m->buffers, m->n_buffers * sizeof(float));
            for (int i = 0; i < m->n_buffer_views; i++) {
                TensorView *t = &s->buffer_views[s->n_buffer_views++];
                *t = m->buffer_views[i];
                t->offset += m->buffer_base;  // a unit's views count from its own first buffer
            }
        }
    }
    uint8_t *bytes_out = ckpt_encode(s, st, bytes);
    free(s->params), free(s->velocity), free(s->buffers), free(s);
    return bytes_out;
}

// ---------------------------------------------------------------- the manifest

typedef struct {
    int first, last;                 // layers [first, last) of the architecture
    size_t n, shard, param_base;     // its parameters: n floats at param_base of the whole model, shard per rank
    size_t n_buffers, buffer_base;
} ManifestUnit;

typedef struct {
    char file[64];
    unsigned long long bytes;
    uint32_t crc;
} ManifestFile;

typedef struct {
    int world;
    long long step;
    ModelConfig cfg;
    int n_units;
    ManifestUnit unit[ZERO_MAX_UNITS];
    ManifestFile *file;  // (world)
} Manifest;

static void manifest_free(Manifest *m) {
    free(m->file);
    m->file = NULL;
}

// The manifest's text, its CRC-32 as the last line. Returns a malloc'd string.
static char *manifest_text(const Zero *z, const CkptState *st, const double *sizes_crcs, size_t *len) {
    int world = pg_world(z->pg);
    size_t cap = 512 + (size_t)z->n_units * 160 + (size_t)world * 96, n = 0;
    char *t = xmalloc(cap);
#define ADD(...) n += (size_t)snprintf(t + n, cap - n, __VA_ARGS__)
    const ModelConfig *c = &st->model;
    ADD("kit-zero-manifest %d\nworld %d\nstep %lld\n", MANIFEST_VERSION, world, st->step);
    ADD("model %s %d %d %d %d %d\nunits %d\n", c->name, c->width, c->in_c, c->in_h, c->in_w, c->classes, z->n_units);
    for (int u = 0; u < z->n_units; u++) {
        const Model *m = z->units[u];
        ADD("unit %d layers %d %d params %zu shard %zu param_base %zu buffers %zu buffer_base %zu\n", u, z->first[u],
            z->first[u + 1], z->layout[u].n, z->layout[u].shard, m->param_base, m->n_buffers, m->buffer_base);
    }
    for (int r = 0; r < world; r++) {
        char name[64];
        shard_name(name, sizeof name, r, world);
        ADD("file %d %s bytes %.0f crc32 %08" PRIx32 "\n", r, name, sizes_crcs[2 * r], (uint32_t)sizes_crcs[2 * r + 1]);
    }
    uint32_t crc = crc_bytes(t, n);
    ADD("crc32 %08" PRIx32 "\n", crc);
#undef ADD
    CHECK(n < cap, "zero_ckpt.c: the manifest's buffer is too small");
    *len = n;
    return t;
}

// One line of a manifest after its first, into *m (units and files in order: *at and *files count them).
// Returns false on a line this version does not write, or a value out of bounds.
static bool manifest_line(Manifest *m, const char *line, int *at, int *files) {
    int u, r, units;
    ManifestUnit x;
    unsigned long long bytes;
    unsigned crc;
    char name[64], want[64];
    if (sscanf(line, "world %d", &m->world) == 1) {
        if (m->file || m->world < 1 || m->world > MAX_WORLD) return false;  // once, and a sane count
        m->file = xcalloc((size_t)m->world, sizeof *m->file);
        return true;
    }
    if (sscanf(line, "step %lld", &m->step) == 1) return m->step >= 0;
    if (sscanf(line, "model %23s %d %d %d %d %d", m->cfg.name, &m->cfg.width, &m->cfg.in_c, &m->cfg.in_h,
               &m->cfg.in_w, &m->cfg.classes) == 6)
        return true;
    if (sscanf(line, "units %d", &units) == 1) {
        m->n_units = units >= 1 && units <= ZERO_MAX_UNITS ? units : 0;
        return m->n_units > 0;
    }
    if (sscanf(line, "unit %d layers %d %d params %zu shard %zu param_base %zu buffers %zu buffer_base %zu", &u,
               &x.first, &x.last, &x.n, &x.shard, &x.param_base, &x.n_buffers, &x.buffer_base) == 8) {
        size_t w = (size_t)m->world;  // shard = ceil(n / world), as the save computed it
        if (u != *at || u >= m->n_units || w == 0 || x.shard > x.n || x.shard * w < x.n ||
            (x.shard > 0 && (x.shard - 1) * w >= x.n))
            return false;
        m->unit[(*at)++] = x;
        return true;
    }
    if (sscanf(line, "file %d %63s bytes %llu crc32 %8x", &r, name, &bytes, &crc) == 4) {
        shard_name(want, sizeof want, r, m->world);
        if (!m->file || r != *files || r >= m->world || strcmp(name, want) != 0) return false;
        snprintf(m->file[r].file, sizeof m->file[r].file, "%s", name);
        m->file[r].bytes = bytes, m->file[r].crc = (uint32_t)crc;
        (*files)++;
        return true;
    }
    return false;
}

// Parses and checks a manifest (any bytes: a corrupt file is an error, never a crash). Returns 0, or -1 with
// the reason (naming path) in err.
static int manifest_read(const char *path, Manifest *m, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    size_t n;
    char why[512];
    char *t = (char *)read_all(path, MANIFEST_MAX_BYTES, &n, why, sizeof why);
    if (!t) return check_reason(err, errlen, "%s", why);
    // The last line holds the CRC-32 of every byte before it: check it before believing anything else.
    char *last = n >= 2 ? t + n - 2 : t;
    while (last > t && *last != '\n') last--;
    if (last > t) last++;
    unsigned crc;
    char tail;
    int rc = -1, version = 0, at = 0, files = 0;
    if (n == 0 || t[n - 1] != '\n' || sscanf(last, "crc32 %8x%c", &crc, &tail) != 2 || tail != '\n') {
        check_reason(err, errlen, "%s: no CRC line at its end: truncated or not a manifest", path);
    } else if (crc_bytes(t, (size_t)(last - t)) != (uint32_t)crc) {
        check_reason(err, errlen, "%s: CRC-32 mismatch: the manifest is corrupt", path);
    } else {
        *last = 0;  // the text before the CRC line, line by line
        char *save = NULL, *line = strtok_r(t, "\n", &save);
        if (!line || sscanf(line, "kit-zero-manifest %d", &version) != 1 || version != MANIFEST_VERSION) {
            check_reason(err, errlen, "%s: not a version-%d manifest of this kit", path, MANIFEST_VERSION);
        } else {
            bool ok = true;
            while (ok && (line = strtok_r(NULL, "\n", &save)) != NULL) ok = manifest_line(m, line, &at, &files);
            if (ok && m->world > 0 && m->n_units > 0 && at == m->n_units && files == m->world && m->cfg.name[0]) rc = 0;
            else check_reason(err, errlen, "%s: malformed (%s)", path, line ? "a line this version does not write"
                                                                            : "a line is missing");
        }
    }
    free(t);
    if (rc != 0) manifest_free(m);
    return rc;
}

// ---------------------------------------------------------------- checking a set

// The shard file of rank r of the set, read and checked against the manifest (size, CRC-32), then decoded as a
// kit checkpoint (its own CRCs). Returns 0 with *ck owning the bytes, or -1 naming the file.
static int shard_read(const char *set, const Manifest *m, int r, Ckpt *ck, char *err, size_t errlen) {
    char path[2048], why[1024];
    snprintf(path, sizeof path, "%s/%s", set, m->file[r].file);
    size_t n;
    uint8_t *bytes = read_all(path, SIZE_MAX / 2, &n, why, sizeof why);
    if (!bytes) return check_reason(err, errlen, "%s (the manifest names it)", why);
    uint32_t crc = crc_bytes(bytes, n);
    int rc = -1;
    if (n != m->file[r].bytes)
        check_reason(err, errlen, "%s: %zu bytes, the manifest says %llu: the shard is truncated or from another save",
                     path, n, m->file[r].bytes);
    else if (crc != m->file[r].crc)
        check_reason(err, errlen, "%s: CRC-32 %08" PRIx32 ", the manifest says %08" PRIx32 ": the shard is corrupt",
                     path, crc, m->file[r].crc);
    else if (ckpt_decode(ck, bytes, n, why, sizeof why) != 0)
        check_reason(err, errlen, "%s: %s", path, why);
    else if (ck->state.step != m->step || ck->state.world != m->world)
        check_reason(err, errlen, "%s: holds step %lld of %d ranks, the manifest step %lld of %d", path,
                     ck->state.step, ck->state.world, m->step, m->world);
    else rc = 0;
    if (rc != 0) {
        free(bytes);
        memset(ck, 0, sizeof *ck);
    } else {
        ck->owned = bytes;  // ckpt_free releases it
    }
    return rc;
}

int zero_ckpt_check_set(const char *set, char *err, size_t errlen) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", set, ZCKPT_MANIFEST);
    Manifest m;
    if (manifest_read(path, &m, err, errlen) != 0) return -1;
    int rc = 0;
    for (int r = 0; r < m.world && rc == 0; r++) {
        Ckpt ck;
        rc = shard_read(set, &m, r, &ck, err, errlen);
        if (rc == 0) ckpt_free(&ck);
    }
    manifest_free(&m);
    return rc;
}

// ---------------------------------------------------------------- the folder of sets

// The steps of dir's "step-N" folders, newest first (a malloc'd array; count in *n). -1: no such folder.
static int list_sets(const char *dir, long long **steps, int *n) {
    *steps = NULL, *n = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long long s;
        char tail;
        if (sscanf(e->d_name, "step-%lld%c", &s, &tail) != 1 || s < 0) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            *steps = CHECK_ALLOC(realloc(*steps, (size_t)cap * sizeof **steps));
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; i < *n; i++)  // insertion sort, newest first: a handful of folders
        for (int j = i; j > 0 && (*steps)[j] > (*steps)[j - 1]; j--) {
            long long t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1], (*steps)[j - 1] = t;
        }
    return 0;
}

static bool has_manifest(const char *set) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", set, ZCKPT_MANIFEST);
    return access(path, F_OK) == 0;
}

int zero_ckpt_find_latest(const char *dir, char *out, size_t outlen, bool warn, char *err, size_t errlen) {
    long long *steps;
    int n;
    if (list_sets(dir, &steps, &n) != 0) return check_reason(err, errlen, "%s: cannot open the folder: %s", dir, strerror(errno));
    int rc = check_reason(err, errlen, "%s holds no valid set (step-N/ with a manifest whose shards check)", dir);
    for (int i = 0; i < n && rc != 0; i++) {
        char set[1024], why[2048];
        set_path(set, sizeof set, dir, steps[i]);
        if (!has_manifest(set)) {
            if (warn) fprintf(stderr, "warning: skipping %s: no manifest (a save that did not finish)\n", set);
        } else if (zero_ckpt_check_set(set, why, sizeof why) != 0) {
            if (warn) fprintf(stderr, "warning: skipping a corrupt set: %s\n", why);
        } else {
            snprintf(out, outlen, "%s", set);
            rc = 0;
        }
    }
    free(steps);
    return rc;
}

// Removes a set: the manifest first (synced), so that a crash in the middle leaves a folder nobody loads.
static void remove_set(const char *set) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", set, ZCKPT_MANIFEST);
    unlink(path);
    int fd = open(set, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) fsync(fd), close(fd);
    DIR *d = opendir(set);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", set, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(set);
}

// Keeps the `keep` newest sets that have a manifest; removes every other step folder (older sets, and folders
// of saves that never finished). Returns how many were removed.
static int prune_sets(const char *dir, int keep) {
    long long *steps;
    int n, kept = 0, removed = 0;
    if (keep <= 0 || list_sets(dir, &steps, &n) != 0) return 0;
    for (int i = 0; i < n; i++) {
        char set[1024];
        set_path(set, sizeof set, dir, steps[i]);
        if (has_manifest(set) && kept < keep) kept++;
        else remove_set(set), removed++;
    }
    free(steps);
    return removed;
}

// ---------------------------------------------------------------- saving

int zero_ckpt_save(Zero *z, const char *dir, const CkptState *st, int keep, char *out_set, size_t out_len,
                   char *err, size_t errlen) {
    check_layouts(z);
    ProcessGroup *pg = z->pg;
    int rank = pg_rank(pg), world = pg_world(pg);
    char set[1024], path[2048];
    set_path(set, sizeof set, dir, st->step);
    // 1. rank 0 makes the folder. A folder of this step left by an earlier attempt (a killed save, or a run
    //    resumed from before it) is removed first, manifest first: an old manifest must never vouch for a mix
    //    of old and new shards, and shards of another world size must not linger beside the new ones.
    bool failed = false;
    if (rank == 0) {
        struct stat sb;
        if (stat(set, &sb) == 0) remove_set(set);
        if (mkdir(set, 0755) != 0 && errno != EEXIST)
            failed = check_reason(err, errlen, "%s: cannot create the folder: %s", set, strerror(errno)) != 0;
    }
    if (agree(pg, failed)) {
        if (!failed) snprintf(err, errlen, "rank 0 could not create %s (see its error)", set);
        return -1;
    }
    // 2. every rank writes its shard, durably (lesson 04's TODO 1).
    char name[64];
    shard_name(name, sizeof name, rank, world);
    snprintf(path, sizeof path, "%s/%s", set, name);
    size_t n;
    uint8_t *bytes = shard_encode(z, st, &n);
    double *sizes = xcalloc(2 * (size_t)world + 1, sizeof *sizes);  // (world, 2): bytes, CRC-32; then failures
    sizes[2 * rank] = (double)n, sizes[2 * rank + 1] = (double)crc_bytes(bytes, n);
    failed = ckpt_write_file(path, bytes, n, err, errlen) != 0;
    free(bytes);
    // The kill-9 drill (tests/lesson09/ckpt-tests.sh): this rank dies with its shard on disk and the manifest
    // not yet written, the worst moment for the set being saved.
    const char *drill = getenv("ZERO_CKPT_DRILL_KILL_RANK");
    if (drill && atoi(drill) == rank && st->step > 0 && getenv("ZERO_CKPT_DRILL_KILL_STEP") &&
        atoll(getenv("ZERO_CKPT_DRILL_KILL_STEP")) == st->step)
        raise(SIGKILL);
    // 3. the barrier: every shard is durable once this returns, and rank 0 knows every size and CRC.
    sizes[2 * (size_t)world] = failed ? 1.0 : 0.0;
    pg_allreduce_sum_double_host(pg, sizes, 2 * world + 1);
    if (sizes[2 * (size_t)world] != 0.0) {
        if (!failed) snprintf(err, errlen, "%.0f rank(s) could not write their shard of %s (see their errors)",
                              sizes[2 * (size_t)world], set);
        free(sizes);
        return -1;
    }
    // 4. the manifest, last: the set exists from the moment its rename is durable. Then the old sets go.
    if (rank == 0) {
        size_t len;
        char *text = manifest_text(z, st, sizes, &len);
        snprintf(path, sizeof path, "%s/%s", set, ZCKPT_MANIFEST);
        failed = ckpt_write_file(path, text, len, err, errlen) != 0;
        free(text);
        if (!failed) prune_sets(dir, keep);
    }
    free(sizes);
    if (agree(pg, failed)) {
        if (!failed) snprintf(err, errlen, "rank 0 could not write the manifest of %s (see its error)", set);
        return -1;
    }
    if (out_set) snprintf(out_set, out_len, "%s", set);
    return 0;
}

// ---------------------------------------------------------------- loading (any world, stage, units)

// What a load reads: the old set's manifest and the old shards, each read (and checked) once, when needed.
typedef struct {
    const char *set;
    Manifest m;
    Ckpt *shards;   // (m.world)
    bool *opened;
    char *err;
    size_t errlen;
    bool failed;
} OldSet;

static const Ckpt *old_shard(OldSet *o, int r) {
    if (!o->opened[r] && !o->failed) {
        o->failed = shard_read(o->set, &o->m, r, &o->shards[r], o->err, o->errlen) != 0;
        o->opened[r] = !o->failed;
    }
    return o->failed ? NULL : &o->shards[r];
}

// The whole model's floats [a, b) of one group (params or momentum) from the old shards, into host dst.
// Old unit u holds [param_base, param_base + n); its rank k the slice [k * shard, (k + 1) * shard) of it.
static void old_range(OldSet *o, CkptGroup g, size_t a, size_t b, float *dst) {
    for (int u = 0; u < o->m.n_units && !o->failed; u++) {
        const ManifestUnit *x = &o->m.unit[u];
        size_t lo = a > x->param_base ? a : x->param_base, hi = b < x->param_base + x->n ? b : x->param_base + x->n;
        while (lo < hi && !o->failed) {  // offsets inside unit u: [lo - base, hi - base)
            size_t off = lo - x->param_base, k = off / x->shard, in = off - k * x->shard;
            size_t take = x->shard - in < hi - lo ? x->shard - in : hi - lo;
            const Ckpt *ck = old_shard(o, (int)k);
            char name[16];
            snprintf(name, sizeof name, "unit%02d", u);
            const CkptTensor *t = ck ? ckpt_find(ck, g, name) : NULL;
            if (ck && (!t || t->nbytes != x->shard * sizeof(float))) {
                o->failed = check_reason(o->err, o->errlen, "%s/%s: no %s tensor %s of %zu floats", o->set,
                                         o->m.file[k].file, ckpt_group_name(g), name, x->shard) != 0;
            } else if (ck) {  // the file's bytes need not be aligned for floats: copied out
                memcpy(dst + (lo - a), ck->bytes + t->offset + in * sizeof(float), take * sizeof(float));
            }
            lo += take;
        }
    }
}

// Does the old set fit this run: the same architecture, and units that tile the same whole model?
static int old_fits(const OldSet *o, const Zero *z, char *err, size_t errlen) {
    const ModelConfig *a = &o->m.cfg, *b = &z->units[0]->cfg;
    char name[CKPT_ESCAPED_LEN];  // the file's bytes: printed escaped
    if (strcmp(a->name, b->name) != 0 || a->width != b->width || a->in_c != b->in_c || a->in_h != b->in_h ||
        a->in_w != b->in_w || a->classes != b->classes)
        return check_reason(err, errlen, "%s holds a %s of width %d (%dx%dx%d, %d classes), this run a %s of width %d "
                            "(%dx%dx%d, %d classes): same --model, --width and --dataset as the run that saved it",
                            o->set, ckpt_escape(a->name, name, sizeof name), a->width, a->in_c, a->in_h, a->in_w,
                            a->classes, b->name, b->width, b->in_c, b->in_h, b->in_w, b->classes);
    size_t params = 0, buffers = 0, old_params = 0, old_buffers = 0;
    for (int u = 0; u < z->n_units; u++) params += z->layout[u].n, buffers += z->units[u]->n_buffers;
    for (int u = 0; u < o->m.n_units; u++) {
        const ManifestUnit *x = &o->m.unit[u];
        if (x->param_base != old_params || x->buffer_base != old_buffers)
            return check_reason(err, errlen, "%s/manifest: unit %d does not follow unit %d", o->set, u, u - 1);
        old_params += x->n, old_buffers += x->n_buffers;
    }
    if (params != old_params || buffers != old_buffers)
        return check_reason(err, errlen, "%s: %zu parameters and %zu BN buffers, this model %zu and %zu", o->set,
                            old_params, old_buffers, params, buffers);
    return 0;
}

// Puts unit u's state from the old set where this rank keeps it (host scratch `full`: n_u floats).
static void load_unit(OldSet *o, Zero *z, int u, float *full) {
    Model *m = z->units[u];
    const ShardLayout *l = &z->layout[u];
    size_t count, lo = own_range(l, pg_rank(z->pg), &count), base = m->param_base;
    float *shard = xcalloc(l->shard ? l->shard : 1, sizeof *shard);  // padding: zeros
    if (z->stage == ZERO_PARAMS) {  // only this rank's shard of the parameters
        old_range(o, CKPT_PARAMS, base + lo, base + lo + count, shard);
        if (!o->failed) device_copy_to(m->device, z->param_shard[u], shard, l->shard * sizeof *shard);
    } else {  // every rank holds the unit's full parameters between steps
        old_range(o, CKPT_PARAMS, base, base + l->n, full);
        if (!o->failed) device_copy_to(m->device, m->params, full, l->n * sizeof *full);
    }
    if (z->stage >= ZERO_OPTIM) {
        memset(shard, 0, l->shard * sizeof *shard);
        old_range(o, CKPT_MOMENTUM, base + lo, base + lo + count, shard);
        if (!o->failed) device_copy_to(m->device, z->velocity_shard[u], shard, l->shard * sizeof *shard);
    } else {
        old_range(o, CKPT_MOMENTUM, base, base + l->n, full);
        if (!o->failed) device_copy_to(m->device, m->velocity, full, l->n * sizeof *full);
    }
    free(shard);
}

// The BN running statistics of unit u, by name, from the old rank 0's file.
static void load_buffers(OldSet *o, Zero *z, int u) {
    Model *m = z->units[u];
    const Ckpt *ck = m->n_buffer_views ? old_shard(o, 0) : NULL;
    for (int i = 0; ck && i < m->n_buffer_views && !o->failed; i++) {
        const TensorView *v = &m->buffer_views[i];
        const CkptTensor *t = ckpt_find(ck, CKPT_BUFFERS, v->name);
        if (!t || t->nbytes != v->count * sizeof(float)) {
            o->failed = check_reason(o->err, o->errlen, "%s/%s: no BN buffer %s of %zu floats", o->set,
                                     o->m.file[0].file, v->name, v->count) != 0;
            break;
        }
        float *host = xmalloc(v->count * sizeof *host);
        ckpt_tensor_data(ck, t, host);
        device_copy_to(m->device, m->buffers + v->offset, host, v->count * sizeof *host);
        free(host);
    }
}

int zero_ckpt_load(Zero *z, const char *set, CkptState *st, char *err, size_t errlen) {
    check_layouts(z);
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", set, ZCKPT_MANIFEST);
    OldSet o = {.set = set, .err = err, .errlen = errlen};
    o.failed = manifest_read(path, &o.m, err, errlen) != 0 || old_fits(&o, z, err, errlen) != 0;
    if (!o.failed) {
        o.shards = xcalloc((size_t)o.m.world, sizeof *o.shards);
        o.opened = xcalloc((size_t)o.m.world, sizeof *o.opened);
        size_t most = 1;
        for (int u = 0; u < z->n_units; u++) most = z->layout[u].n > most ? z->layout[u].n : most;
        float *full = xmalloc(most * sizeof *full);
        // Unit by unit; old_range stops at the first bad file. A failed load may leave some units loaded and
        // others not: the caller never trains from that, every rank stops (the verdict below is shared).
        for (int u = 0; u < z->n_units && !o.failed; u++) load_unit(&o, z, u, full), load_buffers(&o, z, u);
        const Ckpt *first = o.failed ? NULL : old_shard(&o, 0);
        if (first && st) *st = first->state;
        free(full);
        for (int r = 0; r < o.m.world; r++)
            if (o.opened[r]) ckpt_free(&o.shards[r]);
        free(o.shards), free(o.opened);
    }
    manifest_free(&o.m);
    bool mine = o.failed;
    int others = agree(z->pg, mine);
    if (others && !mine) snprintf(err, errlen, "%s: %d other rank(s) could not load it (see their errors)", set, others);
    return others ? -1 : 0;
}

// ---------------------------------------------------------------- consolidation

void zero_ckpt_gather(Zero *z, Model *whole) {
    check_layouts(z);
    ProcessGroup *pg = z->pg;
    bool root = pg_rank(pg) == 0;
    for (int u = 0; u < z->n_units; u++) {
        Model *m = z->units[u];
        const ShardLayout *l = &z->layout[u];
        if (l->shard == 0) continue;
        float *p = xmalloc(l->shard * sizeof *p), *v = xmalloc(l->shard * sizeof *v);
        float *all = xmalloc(l->padded * sizeof *all);
        own_slices(z, u, p, v);
        // Collectives run on the group's device: the slices go there, the padded unit comes back.
        float *send = device_alloc(m->device, l->shard * sizeof(float));
        float *recv = device_alloc(m->device, l->padded * sizeof(float));
        float *dst[2] = {root ? whole->params + m->param_base : NULL, root ? whole->velocity + m->param_base : NULL};
        const float *src[2] = {p, v};
        for (int k = 0; k < 2; k++) {
            device_copy_to(m->device, send, src[k], l->shard * sizeof(float));
            pg_allgather(pg, send, recv, l->shard);  // rank r's block at r * shard: the padded layout itself
            if (root) {
                device_copy_from(m->device, all, recv, l->padded * sizeof(float));
                memcpy(dst[k], all, l->n * sizeof(float));  // the padding is dropped
            }
        }
        device_free(m->device, send), device_free(m->device, recv);
        free(p), free(v), free(all);
        if (root && m->n_buffers)
            device_copy_from(m->device, whole->buffers + m->buffer_base, m->buffers, m->n_buffers * sizeof(float));
    }
}

// ---------------------------------------------------------------- the program's side: options and hooks

// Saves the run where it stands (every rank). epoch_local: this rank's sums over the epoch in progress.
static int save_now(ZeroCkpt *c, DdpRun *r, Metrics epoch_local) {
    CkptState st = ckpt_capture(r->pg, r->o, r->ddp.model, &r->run, &r->sched, r->steps_per_epoch, epoch_local);
    char err[2048];
    double start = time_now();
    if (zero_ckpt_save(c->z, r->o->checkpoint_dir, &st, r->o->keep, c->last_set, sizeof c->last_set, err,
                       sizeof err) != 0) {
        progress_end(&r->log.bar);
        fprintf(stderr, "error: rank %d: checkpoint not saved: %s\n", pg_rank(r->pg), err);
        c->failed = true;
        return -1;
    }
    c->save_seconds += time_now() - start;
    c->last_step = st.step;
    return 0;
}

static Model *w_make_model(void *ctx, DdpRun *r, const ModelConfig *cfg) {
    ZeroCkpt *c = ctx;
    return c->inner.make_model(c->inner.ctx, r, cfg);
}
static void w_model_built(void *ctx, ProcessGroup *pg, Model *m) {
    ZeroCkpt *c = ctx;
    c->inner.model_built(c->inner.ctx, pg, m);
}
static Metrics w_step(void *ctx, DdpRun *r, const Batch *b) {
    ZeroCkpt *c = ctx;
    return c->inner.step(c->inner.ctx, r, b);
}
static Metrics w_evaluate(void *ctx, DdpRun *r) {
    ZeroCkpt *c = ctx;
    return c->inner.evaluate(c->inner.ctx, r);
}
static void w_check_replicas(void *ctx, DdpRun *r, const char *what) {
    ZeroCkpt *c = ctx;
    c->inner.check_replicas(c->inner.ctx, r, what);
}

// After every step: the lesson's own hook; then, as lesson 04 does (its ckpt_stop_flags: one all-reduce, the
// same answers on every rank), a stop without saving on a NaN loss, and a save when --save-every, --stop-at or
// a signal (SIGTERM: a preemption, SIGINT: Ctrl-C) asks for one: a preempted ZeRO run loses at most one step.
static bool w_after_step(void *ctx, DdpRun *r, const Batch *b, const Metrics *batch) {
    ZeroCkpt *c = ctx;
    if (c->inner.after_step && c->inner.after_step(c->inner.ctx, r, b, batch)) return true;
    const TrainOptions *o = r->o;
    bool signalled, nonfinite;
    ckpt_stop_flags(r->pg, batch, &signalled, &nonfinite);
    if (nonfinite) {  // before any save: the last good set must survive
        progress_end(&r->log.bar);
        if (r->is_main)
            fprintf(stderr, "error: the loss is NaN or Inf at step %lld (epoch %d, batch %d): stopping without saving."
                    "\n  The last good set: %s\n  HINT: a lower --lr, or more --warmup-epochs\n", r->run.step,
                    r->run.epoch + 1, b->index + 1, c->last_set[0] ? c->last_set : "none");
        c->nonfinite = true;
        return true;
    }
    bool stop = signalled || (o->stop_at > 0 && r->run.step >= o->stop_at);
    bool due = o->save_every > 0 && r->run.step % o->save_every == 0;
    if ((stop || due) && o->checkpoint_dir && save_now(c, r, r->log.local) != 0) return true;
    if (stop) {
        progress_end(&r->log.bar);
        c->stopped = true;
        if (r->is_main)
            printf("stopped after step %lld by %s; checkpoint %s\nresume with the same command and: --resume "
                   "auto\n", r->run.step, signalled ? "SIGTERM or SIGINT" : "--stop-at",
                   c->last_set[0] ? c->last_set : "none (no --checkpoint-dir)");
    }
    return stop;
}

// After every epoch and its evaluation: the lesson's own hook, then a save.
static bool w_after_epoch(void *ctx, DdpRun *r) {
    ZeroCkpt *c = ctx;
    if (c->inner.after_epoch && c->inner.after_epoch(c->inner.ctx, r)) return true;
    if (!r->o->checkpoint_dir) return false;
    if (save_now(c, r, (Metrics){0, 0, 0}) != 0) return true;
    if (r->is_main) printf("checkpoint: %s (%d shards + manifest)\n", c->last_set, pg_world(r->pg));
    return false;
}

void zero_ckpt_attach(ZeroCkpt *c, TrainHooks *h, const TrainOptions *o) {
    memset(c, 0, sizeof *c);
    c->last_step = -1, c->resumed_from = -1;
    c->o = o, c->consolidate = o->consolidate;
    c->inner = *h;
    TrainHooks w = {.ctx = c, .after_step = w_after_step, .after_epoch = w_after_epoch};
    // A hook the lesson leaves NULL stays NULL: the loop's default runs there.
    if (h->make_model) w.make_model = w_make_model;
    if (h->model_built) w.model_built = w_model_built;
    if (h->step) w.step = w_step;
    if (h->evaluate) w.evaluate = w_evaluate;
    if (h->check_replicas) w.check_replicas = w_check_replicas;
    *h = w;
}

// ---------------------------------------------------------------- before the first step

// The shard file of the newest set of dir that says whose the folder is (rank 0's: every shard's header holds
// the run state), into out; false when dir has no valid set.
static bool newest_set_file(const char *dir, char *out, size_t outlen) {
    char set[1024], why[1024];
    if (zero_ckpt_find_latest(dir, set, sizeof set, false, why, sizeof why) != 0) return false;
    Manifest m;
    char path[2100];
    snprintf(path, sizeof path, "%s/" ZCKPT_MANIFEST, set);
    if (manifest_read(path, &m, why, sizeof why) != 0) return false;
    char name[64];
    shard_name(name, sizeof name, 0, m.world);
    manifest_free(&m);
    snprintf(out, outlen, "%s/%s", set, name);
    return true;
}

// Rank 0's verdict on the options and every output, before anything is trained; every rank gets it. No output
// replaces another run's work (the kit's check, kit/ckpt.h): a folder of another run's sets (also under
// --resume: a set of this run resumed into another run's folder would mix the two), a --consolidate file that
// is another run's (--overwrite replaces it), --metrics over a checkpoint.
static int check_options(ZeroCkpt *c, DdpRun *r) {
    const TrainOptions *o = r->o;
    char err[2400] = "";
    if (r->is_main) {
        CkptState id;
        train_identity(&id, &r->ddp.model->cfg, o, &r->sched);
        CkptOwner me = {.id = &id, .resuming = o->resume != NULL, .overwrite = o->overwrite, .can_resume = true};
        char newest[2200];
        if (o->checkpoint)
            snprintf(err, sizeof err, "--checkpoint FILE: lesson 09 saves sharded sets, one file per rank\n"
                     "  HINT: --checkpoint-dir DIR saves them; --consolidate FILE writes one file of the whole model");
        else if (o->resume && !o->resume[0])
            snprintf(err, sizeof err, "--resume '' is empty: give a set's folder (DIR/step-N), or auto");
        else if (o->resume && strcmp(o->resume, "auto") == 0 && !o->checkpoint_dir)
            snprintf(err, sizeof err, "--resume auto needs --checkpoint-dir (the folder to look in)");
        else if (o->checkpoint_dir &&
                 ckpt_check_dir_owner("--checkpoint-dir", o->checkpoint_dir,
                                      newest_set_file(o->checkpoint_dir, newest, sizeof newest) ? newest : NULL,
                                      "sets", &me, err, sizeof err) != 0) {
        } else if (c->consolidate) {
            CkptOwner whole = me;
            whole.can_resume = false;  // lesson 04's program resumes a consolidated file, this one does not
            if (ckpt_check_file_owner("--consolidate", c->consolidate, CKPT_OUT_CHECKPOINT, &whole, err, sizeof err) == 0 &&
                o->metrics)
                ckpt_check_file_owner("--metrics", o->metrics, CKPT_OUT_REPORT, &me, err, sizeof err);
        } else if (o->metrics) {
            ckpt_check_file_owner("--metrics", o->metrics, CKPT_OUT_REPORT, &me, err, sizeof err);
        }
        if (err[0]) fprintf(stderr, "error: %s\n", err);
    }
    return agree(r->pg, err[0] != 0) ? -1 : 0;
}

// A set continues THE SAME run: every option that changes what a step computes must match (the world size,
// the stage and the units need not: they change where the state lives, not what it is).
static int check_resumable(const CkptState *st, const DdpRun *r, char *err, size_t errlen) {
    const TrainOptions *o = r->o;
    char name[CKPT_ESCAPED_LEN];
    if (strcmp(st->dataset, o->dataset) != 0)
        return check_reason(err, errlen, "the set was trained on --dataset %s, this run asks for %s",
                            ckpt_escape(st->dataset, name, sizeof name), o->dataset);
    if (st->global_batch != o->batch_size || st->steps_per_epoch != r->steps_per_epoch)
        return check_reason(err, errlen, "the set has --batch-size %d and %d steps per epoch, this run %d and %d",
                            st->global_batch, st->steps_per_epoch, o->batch_size, r->steps_per_epoch);
    if (st->epochs != o->epochs || st->seed != o->seed || st->peak_lr != r->sched.peak_lr ||
        st->warmup_steps != r->sched.warmup_steps || st->momentum != r->opt.momentum ||
        st->weight_decay != r->opt.weight_decay || st->nesterov != (int)r->opt.nesterov)
        return check_reason(err, errlen, "the set was trained with other --epochs, --seed, --lr, --momentum, "
                            "--weight-decay or warmup (saved: %d epochs, seed %llu, lr %g; asked: %d, %llu, %g): "
                            "another value is another run", st->epochs, (unsigned long long)st->seed,
                            (double)st->peak_lr, o->epochs, (unsigned long long)o->seed, (double)r->sched.peak_lr);
    return 0;
}

// The set --resume names: auto (the newest valid set, chosen by rank 0 and shared), a folder, or its manifest.
// Returns 1 with the set in out, 0 when auto finds none (a fresh start), -1 on every rank when it is refused.
static int resume_set(DdpRun *r, char *out, size_t outlen) {
    const TrainOptions *o = r->o;
    char err[2048] = "";
    double step = -1.0;
    if (strcmp(o->resume, "auto") != 0) {
        snprintf(out, outlen, "%s", o->resume);
        size_t n = strlen(out), m = strlen("/" ZCKPT_MANIFEST);
        if (n > m && strcmp(out + n - m, "/" ZCKPT_MANIFEST) == 0) out[n - m] = 0;  // the manifest names its set
        if (r->is_main && zero_ckpt_check_set(out, err, sizeof err) != 0) fprintf(stderr, "error: cannot resume: %s\n", err);
        return agree(r->pg, err[0] != 0) ? -1 : 1;
    }
    if (r->is_main) {
        char set[1024];
        if (zero_ckpt_find_latest(o->checkpoint_dir, set, sizeof set, true, err, sizeof err) == 0)
            step = (double)atoll(strrchr(set, '-') + 1);
        else printf("resume: nothing to resume (%s): starting from step 0\n", err);
    }
    if (!r->is_main) step = 0.0;
    else step += 1.0;  // the others add 0: the sum is rank 0's step + 1 (0: none)
    pg_allreduce_sum_double_host(r->pg, &step, 1);
    if (step < 1.0) return 0;
    set_path(out, outlen, o->checkpoint_dir, (long long)step - 1);
    return 1;
}

// SIGTERM and SIGINT ask for a save at the next step (lesson 04's handler and flag, g_stop_signal), when there
// is a folder to save in; zero_ckpt_end puts the old handlers back (restore_signals).
static struct sigaction old_term, old_int;
static bool handling;

static void on_stop_signal(int sig) { g_stop_signal = sig; }

static void handle_signals(void) {
    if (!handling) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, &old_term);
        sigaction(SIGINT, &sa, &old_int);
    }
    handling = true;
}

// After the loop. After a stop on a signal the handler stays (a scheduler may send its SIGTERM again while the
// job step ends: lesson 04's reason); a second Ctrl-C ends the program at once.
static void restore_signals(bool stopped) {
    if (!handling) return;
    if (!stopped) sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    handling = false;
}

int zero_ckpt_begin(ZeroCkpt *c, DdpRun *r, Zero *z) {
    c->z = z;
    if (check_options(c, r) != 0) return -1;
    if (r->o->checkpoint_dir) handle_signals();
    if (!r->o->resume) return 0;
    char set[1024], err[2048];
    int found = resume_set(r, set, sizeof set);
    if (found <= 0) return found;
    CkptState st;
    bool failed = zero_ckpt_load(z, set, &st, err, sizeof err) != 0 || check_resumable(&st, r, err, sizeof err) != 0;
    if (failed) fprintf(stderr, "error: rank %d: cannot resume from %s: %s\n", pg_rank(r->pg), set, err);
    if (agree(r->pg, failed)) return -1;
    r->run = ckpt_restore(&st);  // lesson 04's way back: the position, the schedule's step, the metrics so far
    c->resumed_from = st.step, c->last_step = st.step;
    snprintf(c->last_set, sizeof c->last_set, "%s", set);
    if (r->is_main)
        printf("resumed from %s: step %lld (epoch %d, batch %d of %d), saved by %d rank%s, now %d (ZeRO stage %d)\n",
               set, st.step, st.epoch + 1, st.batch_in_epoch, st.steps_per_epoch, st.world, st.world == 1 ? "" : "s",
               pg_world(r->pg), (int)z->stage);
    return 0;
}

// ---------------------------------------------------------------- after the training

int zero_ckpt_end(ZeroCkpt *c, DdpRun *r) {
    if (r->is_main && r->o->checkpoint_dir && c->last_step >= 0)
        printf("checkpoints: %.2f s spent saving; the last set: %s (step %lld)\n", c->save_seconds, c->last_set,
               c->last_step);
    restore_signals(c->stopped);
    if (c->failed || c->nonfinite) return -1;  // a run that ends on a NaN never recovered: non-zero, nothing written
    if (!c->consolidate) return 0;
    bool root = r->is_main;
    Model *whole = root ? model_create(&r->ddp.model->cfg, DEVICE_CPU, 1, r->o->seed) : NULL;
    zero_ckpt_gather(c->z, whole);
    // The epoch in progress (a --stop-at in its middle) counts in the state; at an epoch's end it is empty.
    Metrics local = r->run.batch_in_epoch ? r->log.local : (Metrics){0, 0, 0};
    CkptState st = ckpt_capture(r->pg, r->o, r->ddp.model, &r->run, &r->sched, r->steps_per_epoch, local);
    char err[2048];
    int rc = ckpt_save_rank0(r->pg, c->consolidate, root ? whole : r->ddp.model, &st, err, sizeof err);
    model_free(whole);
    if (rc != 0) {
        fprintf(stderr, "error: rank %d: --consolidate %s: %s\n", pg_rank(r->pg), c->consolidate, err);
        return -1;
    }
    if (root)
        printf("consolidated: %s (the whole model at step %lld from %d rank(s)' shards: lesson 06 evaluates it)\n",
               c->consolidate, st.step, pg_world(r->pg));
    return 0;
}
