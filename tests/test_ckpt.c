// tests/test_ckpt.c: the checkpoint file of kit/ckpt.h (what resuming bit for bit needs from the file): a round trip is bit for
// bit; every truncation, a flipped bit in every section, a wrong magic, version or model is refused with a
// message naming what is wrong and leaves the model untouched; a writer killed at random moments always
// leaves a loadable file; a folder of checkpoints gives its latest valid one; and a file saved from one
// device loads onto the other (when a GPU is present).
#include "tests/testutil.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "kit/ckpt.h"
#include "kit/train.h"
#include "kit/model.h"

// The format's fixed sizes (kit/CHECKPOINT.md), restated here so a change of layout fails a test.
enum { HEADER = 240, ENTRY = 96, TRAILER = 16 };

static char g_dir[64];

static int setup(void **state) {
    snprintf(g_dir, sizeof g_dir, "/tmp/test_ckpt.XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in_dir(char *out, size_t len, const char *name) { snprintf(out, len, "%s/%s", g_dir, name); }

// A tiny-bn model (conv, BN, linear: all three groups non-empty) with every buffer filled from `seed`, so
// momentum and running statistics are not their (zero / one) initial values.
static Model *filled_model(uint64_t seed) {
    ModelConfig cfg;
    assert_true(model_config(&cfg, "tiny-bn", 8, 3, 16, 16, 10));
    Model *m = model_create(&cfg, DEVICE_CPU, 4, seed);
    fill_uniform(m->params, m->n_params, -1, 1, seed + 1);
    fill_uniform(m->velocity, m->n_params, -1, 1, seed + 2);
    fill_uniform(m->buffers, m->n_buffers, 0.5f, 2, seed + 3);
    return m;
}

static CkptState some_state(const Model *m, long long step) {
    CkptState s = {.model = m->cfg, .world = 2, .global_batch = 64, .steps_per_epoch = 78, .epochs = 3,
                   .epoch = (int)(step / 78), .batch_in_epoch = (int)(step % 78), .step = step,
                   .seed = 0x123456789abcdefull, .peak_lr = 0.05f, .final_lr = 0, .warmup_steps = 78,
                   .total_steps = 234, .decay = 0, .momentum = 0.9f, .weight_decay = 5e-4f, .nesterov = 1,
                   .loss_sum = 123.456, .correct = 1000, .count = 1234, .images = 64 * step, .last_loss = 0.75,
                   .test_acc = 0.875};
    snprintf(s.dataset, sizeof s.dataset, "synthetic");
    return s;
}

static bool models_equal(const Model *a, const Model *b) {
    return a->n_params == b->n_params && a->n_buffers == b->n_buffers &&
           memcmp(a->params, b->params, a->n_params * sizeof(float)) == 0 &&
           memcmp(a->velocity, b->velocity, a->n_params * sizeof(float)) == 0 &&
           memcmp(a->buffers, b->buffers, a->n_buffers * sizeof(float)) == 0;
}

// ---------------------------------------------------------------- round trip

static void test_round_trip_bit_for_bit(void **state) {
    Model *a = filled_model(1), *b = filled_model(99);
    assert_false(models_equal(a, b));
    CkptState s = some_state(a, 100), got;
    char path[128], err[512];
    path_in_dir(path, sizeof path, "a.ckpt");
    if (ckpt_save(path, a, &s, err, sizeof err) != 0) fail_msg("save: %s", err);
    if (ckpt_load(path, b, &got, err, sizeof err) != 0) fail_msg("load: %s", err);
    assert_true(models_equal(a, b));
    assert_int_equal(got.step, s.step);
    assert_string_equal(got.model.name, "tiny-bn");
    // Encoding the loaded model and state gives the same bytes: every field and tensor came back unchanged.
    size_t n1, n2;
    uint8_t *e1 = ckpt_encode(a, &s, &n1), *e2 = ckpt_encode(b, &got, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(e1, e2, n1);
    // No temporary file is left beside it.
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0);
    free(e1);
    free(e2);
    model_free(a);
    model_free(b);
}

// The table names the kit's views, with no wrapper prefix, one entry per tensor of each group.
static void test_table_names_and_shapes(void **state) {
    Model *m = filled_model(1);
    CkptState s = some_state(m, 5);
    size_t n;
    uint8_t *buf = ckpt_encode(m, &s, &n);
    Ckpt ck;
    char err[512];
    if (ckpt_decode(&ck, buf, n, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(ck.n_tensors, 2 * m->n_views + m->n_buffer_views);
    for (int i = 0; i < m->n_views; i++) {
        const CkptTensor *t = ckpt_find(&ck, CKPT_PARAMS, m->views[i].name);
        assert_non_null(t);
        assert_int_equal(t->ndim, m->views[i].ndim);
        assert_memory_equal(t->shape, m->views[i].shape, (size_t)t->ndim * sizeof(int));
        float *x = xmalloc(t->nbytes);
        ckpt_tensor_data(&ck, t, x);
        assert_memory_equal(x, m->params + m->views[i].offset, t->nbytes);
        free(x);
        assert_non_null(ckpt_find(&ck, CKPT_MOMENTUM, m->views[i].name));
        assert_null(strstr(t->name, "module."));
    }
    assert_non_null(ckpt_find(&ck, CKPT_BUFFERS, "01.bn.running_mean"));  // PyTorch's buffer name, layer-numbered
    ckpt_free(&ck);
    free(buf);
    model_free(m);
}

// ---------------------------------------------------------------- refused files

// Decodes a modified copy; asserts it is refused with a message containing `expect`, and that loading
// the same bytes from a file leaves the model untouched.
static void expect_refused(const uint8_t *buf, size_t n, const char *expect, const char *what) {
    Ckpt ck;
    char err[512] = "";
    if (ckpt_decode(&ck, buf, n, err, sizeof err) == 0) fail_msg("%s: accepted", what);
    if (!strstr(err, expect)) fail_msg("%s: message '%s' does not say '%s'", what, err, expect);
    char path[128];
    path_in_dir(path, sizeof path, "bad.ckpt");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
    Model *m = filled_model(7), *ref = filled_model(7);
    assert_int_equal(ckpt_load(path, m, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, path));  // the message names the file
    assert_true(models_equal(m, ref));
    model_free(m);
    model_free(ref);
}

static uint8_t *good_file(size_t *n, Model **keep) {
    Model *m = filled_model(1);
    CkptState s = some_state(m, 42);
    uint8_t *buf = ckpt_encode(m, &s, n);
    if (keep) *keep = m;
    else model_free(m);
    return buf;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
static uint32_t le32(const uint8_t *p) { return (uint32_t)le64(p) & 0xffffffffu; }
static void set_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

// The layout fields of the header (kit/CHECKPOINT.md): tensor count at 212, table CRC at 216, data offset at 220.
static uint32_t n_tensors_of(const uint8_t *buf) { return le32(buf + 212); }
static uint64_t data_offset_of(const uint8_t *buf) { return le64(buf + 220); }

static void test_truncated_at_every_boundary(void **state) {
    size_t n;
    uint8_t *buf = good_file(&n, NULL);
    size_t table_end = HEADER + (size_t)n_tensors_of(buf) * ENTRY, data = (size_t)data_offset_of(buf);
    Ckpt ck;
    char err[512];
    assert_int_equal(ckpt_decode(&ck, buf, n, err, sizeof err), 0);
    size_t first_tensor_end = (size_t)(ck.tensors[0].offset + ck.tensors[0].nbytes);
    ckpt_free(&ck);
    // Every section boundary, one byte either side, and the empty file.
    size_t cuts[] = {0, 1, 8, 15, 16, HEADER - 1, HEADER, HEADER + 1, HEADER + ENTRY, table_end - 1, table_end,
                     data - 1, data, data + 1, first_tensor_end, n - TRAILER - 1, n - TRAILER, n - TRAILER + 8, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "cut at byte %zu of %zu", cuts[i], n);
        expect_refused(buf, cuts[i], "truncated", what);
    }
    // And a file longer than announced.
    uint8_t *longer = xcalloc(n + 1, 1);
    memcpy(longer, buf, n);
    expect_refused(longer, n + 1, "trailing bytes", "one byte appended");
    free(longer);
    free(buf);
}

static void flip_and_expect(const uint8_t *buf, size_t n, size_t at, int bit, const char *expect) {
    uint8_t *bad = xmalloc(n);
    memcpy(bad, buf, n);
    bad[at] ^= (uint8_t)(1u << bit);
    char what[96];
    snprintf(what, sizeof what, "bit %d of byte %zu flipped", bit, at);
    expect_refused(bad, n, expect, what);
    free(bad);
}

static void test_flipped_bit_in_each_section(void **state) {
    size_t n;
    uint8_t *buf = good_file(&n, NULL);
    size_t table_end = HEADER + (size_t)n_tensors_of(buf) * ENTRY, data = (size_t)data_offset_of(buf);
    // Header: the magic and version are named as such; any other bit breaks the header's CRC.
    flip_and_expect(buf, n, 0, 3, "wrong magic");
    flip_and_expect(buf, n, 8, 1, "version");
    for (size_t at = 16; at < HEADER; at += 7) flip_and_expect(buf, n, at, (int)(at % 8), "header CRC");
    // Tensor table: every entry.
    for (size_t at = HEADER; at < table_end; at += ENTRY / 2 + 1) flip_and_expect(buf, n, at, 5, "table CRC");
    // The padding between the table and the data: only the trailer's CRC covers it.
    if (data > table_end) flip_and_expect(buf, n, table_end, 0, "file CRC");
    // Every tensor: its own CRC names it.
    Ckpt ck;
    char err[512];
    assert_int_equal(ckpt_decode(&ck, buf, n, err, sizeof err), 0);
    for (int i = 0; i < ck.n_tensors; i++) {
        const CkptTensor *t = &ck.tensors[i];
        char expect[80];
        snprintf(expect, sizeof expect, "tensor %s (%s): CRC mismatch", t->name, ckpt_group_name(t->group));
        flip_and_expect(buf, n, (size_t)(t->offset + t->nbytes - 1), 7, expect);
    }
    ckpt_free(&ck);
    // Trailer: its magic, then its CRC.
    flip_and_expect(buf, n, n - TRAILER, 0, "end magic");
    flip_and_expect(buf, n, n - TRAILER + 9, 2, "file CRC");
    free(buf);
}

static void test_wrong_magic_and_version(void **state) {
    size_t n;
    uint8_t *buf = good_file(&n, NULL);
    uint8_t *bad = xmalloc(n);
    memcpy(bad, buf, n);
    memcpy(bad, "PK\3\4\0\0\0\0", 8);  // a zip file, e.g. torch.save's output
    expect_refused(bad, n, "not a kit checkpoint", "zip magic");
    memcpy(bad, buf, n);
    set_le32(bad + 8, 2);  // a newer format
    expect_refused(bad, n, "format version 2; this kit reads version 1", "version 2");
    free(bad);
    free(buf);
}

// A file of another model is a valid FILE: ckpt_read accepts it, ckpt_check_model / ckpt_load refuse it.
static void test_other_model_refused(void **state) {
    Model *a = filled_model(1);
    CkptState s = some_state(a, 3);
    char path[128], err[512];
    path_in_dir(path, sizeof path, "a.ckpt");
    if (ckpt_save(path, a, &s, err, sizeof err) != 0) fail_msg("%s", err);
    const char *others[][2] = {{"tiny", "8"}, {"tiny-bn", "16"}};
    for (int i = 0; i < 2; i++) {
        ModelConfig cfg;
        assert_true(model_config(&cfg, others[i][0], atoi(others[i][1]), 3, 16, 16, 10));
        Model *b = model_create(&cfg, DEVICE_CPU, 4, 5), *ref = model_create(&cfg, DEVICE_CPU, 4, 5);
        assert_int_equal(ckpt_load(path, b, NULL, err, sizeof err), -1);
        if (!strstr(err, "model mismatch")) fail_msg("%s: '%s'", others[i][0], err);
        assert_true(models_equal(b, ref));
        model_free(b);
        model_free(ref);
    }
    // A tensor whose shape differs (same count, CRCs made consistent): named by check_model.
    size_t n;
    uint8_t *buf = ckpt_encode(a, &s, &n);
    uint8_t *e = buf + HEADER;  // the first entry: 00.conv.weight (K, C, R, R)
    assert_string_equal((const char *)e, "00.conv.weight");
    uint32_t k = le32(e + 60), c = le32(e + 64);
    set_le32(e + 60, c);
    set_le32(e + 64, k);
    set_le32(buf + 216, (uint32_t)crc32(0, buf + HEADER, n_tensors_of(buf) * ENTRY));
    set_le32(buf + HEADER - 4, (uint32_t)crc32(0, buf, HEADER - 4));
    set_le32(buf + n - TRAILER + 8, (uint32_t)crc32(0, buf, (uInt)(n - TRAILER)));
    Ckpt ck;
    if (ckpt_decode(&ck, buf, n, err, sizeof err) != 0) fail_msg("a consistent file was refused: %s", err);
    assert_int_equal(ckpt_check_model(&ck, a, err, sizeof err), -1);
    if (!strstr(err, "00.conv.weight has shape (3, 4, 3, 3) in the checkpoint, (4, 3, 3, 3) in the model"))
        fail_msg("'%s'", err);
    ckpt_free(&ck);
    free(buf);
    model_free(a);
}

// A crafted file with consistent CRCs: the names it carries (a tensor's, the model's) reach the refusal escaped,
// one line without control bytes, whatever bytes they hold.
static void test_names_from_the_file_are_escaped(void **state) {
    Model *a = filled_model(1);
    CkptState s = some_state(a, 3);
    size_t n;
    char err[512];
    for (int what = 0; what < 2; what++) {
        uint8_t *buf = ckpt_encode(a, &s, &n);
        if (what == 0) {  // a tensor name with a newline and a terminal escape, and a dtype the kit does not read
            uint8_t *e = buf + HEADER;
            memcpy(e, "00.conv\n\x1b[2Jweight\\", 20);
            set_le32(e + 52, 7);
            set_le32(buf + 216, (uint32_t)crc32(0, buf + HEADER, n_tensors_of(buf) * ENTRY));
        } else {  // the model's name in the header (16, char[24])
            memcpy(buf + 16, "tiny\r\x07", 7);
        }
        set_le32(buf + HEADER - 4, (uint32_t)crc32(0, buf, HEADER - 4));
        set_le32(buf + n - TRAILER + 8, (uint32_t)crc32(0, buf, (uInt)(n - TRAILER)));
        Ckpt ck;
        int rc = ckpt_decode(&ck, buf, n, err, sizeof err);
        if (what == 1) {
            assert_int_equal(rc, 0);
            rc = ckpt_check_model(&ck, a, err, sizeof err);
            ckpt_free(&ck);
        }
        assert_int_equal(rc, -1);
        for (const char *p = err; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p == 0x7f) fail_msg("a control byte 0x%02x in '%s'", *p, err);
        const char *want = what == 0 ? "tensor 00.conv\\x0a\\x1b[2Jweight\\\\: unknown dtype 7" : "holds tiny\\x0d\\x07 ";
        if (!strstr(err, want)) fail_msg("'%s' does not say '%s'", err, want);
        free(buf);
    }
    model_free(a);
}

// Before the first step: the places a training run will save to, checked the way a save writes.
static void test_check_output(void **state) {
    char file[400], dir[200], err[512];
    path_in_dir(dir, sizeof dir, "runs");
    assert_int_equal(ckpt_check_output(NULL, dir, err, sizeof err), 0);  // created
    struct stat st;
    assert_int_equal(stat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(ckpt_check_output(NULL, dir, err, sizeof err), 0);  // exists: fine
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *e; (e = readdir(d));) entries += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(entries, 0);  // the probe file is gone
    snprintf(file, sizeof file, "%s/run.ckpt", dir);
    assert_int_equal(ckpt_check_output(file, NULL, err, sizeof err), 0);
    assert_int_not_equal(access(file, F_OK), 0);  // nothing left behind
    const struct { const char *file, *dir, *expect; } bad[] = {
        {NULL, "", "--checkpoint-dir is empty"},
        {"", NULL, "--checkpoint is empty"},
        {NULL, "/nonexistent-parent/runs", "cannot create the folder"},
        {"/nonexistent-parent/x.ckpt", NULL, "does not exist"},
        {dir, NULL, "is a folder"},
        {NULL, "/proc/version", "is not a folder"},
        {"/proc/x.ckpt", NULL, "cannot be written"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        if (ckpt_check_output(bad[i].file, bad[i].dir, err, sizeof err) != -1 || !strstr(err, bad[i].expect))
            fail_msg("file '%s' dir '%s': expected an error saying '%s', got '%s'", bad[i].file ? bad[i].file : "(none)",
                     bad[i].dir ? bad[i].dir : "(none)", bad[i].expect, err);
    }
}

// Invariant 13, the kit's one check: what is at an output path may be replaced only when it is nothing, this
// run's own checkpoint under --resume, or anything with --overwrite (a file; never a folder). Every refusal
// names the flag passed and the way out.
static void test_owner_of_outputs(void **state) {
    Model *m = filled_model(7);
    CkptState ours = some_state(m, 40), theirs = ours, err_state;
    theirs.seed = 99;  // another run: the same model, another seed
    char mine[400], other[400], text[400], absent[400], dir[400], err[2048];
    path_in_dir(mine, sizeof mine, "mine.ckpt");
    path_in_dir(other, sizeof other, "other.ckpt");
    path_in_dir(text, sizeof text, "notes.txt");
    path_in_dir(absent, sizeof absent, "absent.ckpt");
    path_in_dir(dir, sizeof dir, "runs");
    assert_int_equal(ckpt_save(mine, m, &ours, err, sizeof err), 0);
    assert_int_equal(ckpt_save(other, m, &theirs, err, sizeof err), 0);
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    fputs("a,b\n1,2\n", f);
    fclose(f);
    // train_identity of this run equals what it saves: ckpt_same_run says so, and names a difference.
    TrainOptions o = {.dataset = "synthetic", .batch_size = 64, .epochs = 3, .seed = ours.seed, .momentum = 0.9f,
                      .weight_decay = 5e-4f, .nesterov = true};
    LrSchedule sched = {.peak_lr = 0.05f, .warmup_steps = 78, .total_steps = 234};
    CkptState id;
    train_identity(&id, &m->cfg, &o, &sched);
    char why[256];
    assert_true(ckpt_same_run(&ours, &id, why, sizeof why));
    assert_false(ckpt_same_run(&theirs, &id, why, sizeof why));
    assert_non_null(strstr(why, "seed 99"));
    err_state = ours, err_state.model.width = 16;
    assert_false(ckpt_same_run(&err_state, &id, why, sizeof why));
    assert_non_null(strstr(why, "width 16"));

    CkptOwner fresh = {.id = &id, .can_resume = true}, resuming = fresh, forced = fresh;
    resuming.resuming = true, forced.overwrite = true;
    const struct { const char *path; CkptOutputKind kind; const CkptOwner *me; const char *expect; } cases[] = {
        {absent, CKPT_OUT_CHECKPOINT, &fresh, NULL},
        {mine, CKPT_OUT_CHECKPOINT, &resuming, NULL},             // this run, continued
        {mine, CKPT_OUT_CHECKPOINT, &fresh, "these same options"},  // a fresh run is another run
        {other, CKPT_OUT_CHECKPOINT, &resuming, "seed 99"},
        {other, CKPT_OUT_CHECKPOINT, &fresh, "--overwrite"},
        {other, CKPT_OUT_CHECKPOINT, &forced, NULL},
        {text, CKPT_OUT_CHECKPOINT, &fresh, "not a checkpoint of this kit"},
        {text, CKPT_OUT_CHECKPOINT, &forced, NULL},
        {text, CKPT_OUT_REPORT, &fresh, NULL},                     // a report replaces a report
        {other, CKPT_OUT_REPORT, &resuming, "is a checkpoint"},    // never a run's work
        {"/nonexistent-parent/x.ckpt", CKPT_OUT_CHECKPOINT, &forced, "--save-params '/nonexistent-parent"},
        {g_dir, CKPT_OUT_CHECKPOINT, &forced, "is a folder"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err[0] = 0;
        int rc = ckpt_check_file_owner("--save-params", cases[i].path, cases[i].kind, cases[i].me, err, sizeof err);
        if (cases[i].expect ? rc != -1 || !strstr(err, cases[i].expect) || !strstr(err, "--save-params") : rc != 0)
            fail_msg("case %zu (%s): expected %s%s, got %d '%s'", i, cases[i].path, cases[i].expect ? "an error saying " : "0",
                     cases[i].expect ? cases[i].expect : "", rc, err);
    }
    // A folder: its newest checkpoint says whose it is; --overwrite never gives it over.
    assert_int_equal(ckpt_check_dir_owner("--checkpoint-dir", dir, NULL, "checkpoints", &fresh, err, sizeof err), 0);
    assert_int_equal(ckpt_check_dir_owner("--checkpoint-dir", dir, mine, "checkpoints", &resuming, err, sizeof err), 0);
    assert_int_equal(ckpt_check_dir_owner("--checkpoint-dir", dir, mine, "checkpoints", &fresh, err, sizeof err), -1);
    assert_non_null(strstr(err, "--resume auto"));
    assert_int_equal(ckpt_check_dir_owner("--checkpoint-dir", dir, other, "sets", &forced, err, sizeof err), -1);
    assert_non_null(strstr(err, "holds the sets of another run"));
    // Nothing was written by any check.
    Ckpt ck;
    assert_int_equal(ckpt_read(&ck, other, err, sizeof err), 0);
    assert_true(ck.state.seed == 99);
    ckpt_free(&ck);
    model_free(m);
}

static void test_save_errors(void **state) {
    Model *m = filled_model(1);
    CkptState s = some_state(m, 1);
    char path[160], err[512];
    snprintf(path, sizeof path, "%s/no/such/folder/x.ckpt", g_dir);
    assert_int_equal(ckpt_save(path, m, &s, err, sizeof err), -1);
    if (!strstr(err, "cannot create") || !strstr(err, "No such file")) fail_msg("'%s'", err);
    // A folder where the file should be: rename fails, the temporary file is removed.
    path_in_dir(path, sizeof path, "adir");
    assert_int_equal(mkdir(path, 0755), 0);
    assert_int_equal(ckpt_save(path, m, &s, err, sizeof err), -1);
    if (!strstr(err, "rename")) fail_msg("'%s'", err);
    char tmp[200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0);
    // A missing file to load.
    path_in_dir(path, sizeof path, "missing.ckpt");
    assert_int_equal(ckpt_load(path, m, NULL, err, sizeof err), -1);
    if (!strstr(err, "missing.ckpt: cannot open")) fail_msg("'%s'", err);
    model_free(m);
}

// ---------------------------------------------------------------- a crash during save

// A child saves checkpoints of increasing step to one path, forever; the parent kills it with SIGKILL after a
// random delay. Whatever moment the kill lands on, the path must hold a complete checkpoint: the previous one
// or the new one. (bench/ckpt_drill.sh runs the same drill with the real training program, many more trials.)
static void test_kill_during_save_leaves_a_valid_file(void **state) {
    Model *m = filled_model(1);
    char path[128], err[512];
    path_in_dir(path, sizeof path, "killed.ckpt");
    CkptState s = some_state(m, 0);
    m->params[0] = 0.0f;  // the first weight of every file is its step
    if (ckpt_save(path, m, &s, err, sizeof err) != 0) fail_msg("%s", err);
    srand((unsigned)time(NULL));
    enum { TRIALS = 30 };
    int bad = 0;
    long long last = 0;
    for (int trial = 0; trial < TRIALS; trial++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            for (long long step = last + 1;; step++) {
                CkptState t = some_state(m, step);
                m->params[0] = (float)step;  // the tensors change too
                if (ckpt_save(path, m, &t, err, sizeof err) != 0) _exit(3);
            }
        }
        usleep((useconds_t)(rand() % 20000));
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        assert_true(WIFSIGNALED(status));
        Ckpt ck;
        if (ckpt_read(&ck, path, err, sizeof err) != 0) {
            print_error("trial %d: no valid checkpoint after the kill: %s\n", trial, err);
            bad++;
            continue;
        }
        const CkptTensor *t = ckpt_find(&ck, CKPT_PARAMS, m->views[0].name);
        float *w = xmalloc(t->nbytes);
        ckpt_tensor_data(&ck, t, w);
        if (ck.state.step < last || w[0] != (float)ck.state.step) {  // never older, never mixed
            print_error("trial %d: step %lld (before the kill: %lld), first weight %g\n", trial, ck.state.step, last,
                        (double)w[0]);
            bad++;
        }
        free(w);
        last = ck.state.step;
        ckpt_free(&ck);
    }
    print_message("%d kills during save: %d left no valid checkpoint; last step saved %lld\n", TRIALS, bad, last);
    assert_int_equal(bad, 0);
    model_free(m);
}

// ---------------------------------------------------------------- a folder of checkpoints

static void test_latest_skips_corrupt_and_prune(void **state) {
    Model *m = filled_model(1);
    char dir[128], path[256], err[512];
    path_in_dir(dir, sizeof dir, "run");
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_int_equal(ckpt_find_latest(dir, path, sizeof path, err, sizeof err), -1);  // empty folder
    long long steps[] = {10, 20, 30};
    for (int i = 0; i < 3; i++) {
        CkptState s = some_state(m, steps[i]);
        ckpt_path_for_step(path, sizeof path, dir, steps[i]);
        if (ckpt_save(path, m, &s, err, sizeof err) != 0) fail_msg("%s", err);
    }
    // The newest is cut short (a full disk): auto-resume must take step 20, warning about 30.
    ckpt_path_for_step(path, sizeof path, dir, 30);
    assert_int_equal(truncate(path, 1000), 0);
    char stray[300];
    snprintf(stray, sizeof stray, "%s/ckpt-00000099.ckpt.tmp", dir);  // a save killed mid-way: not a candidate
    FILE *f = fopen(stray, "w");
    fclose(f);
    char latest[256];
    if (ckpt_find_latest(dir, latest, sizeof latest, err, sizeof err) != 0) fail_msg("%s", err);
    ckpt_path_for_step(path, sizeof path, dir, 20);
    assert_string_equal(latest, path);
    assert_int_equal(ckpt_prune(dir, 1), 2);  // keeps the highest step's file (30), removes 20 and 10
    ckpt_path_for_step(path, sizeof path, dir, 10);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(access(stray, F_OK), 0);  // not a checkpoint name: left alone
    model_free(m);
}

// ---------------------------------------------------------------- across devices

// Saved from the CPU, loaded onto the GPU, saved from there, loaded back onto the CPU: same bits.
static void test_cpu_gpu_round_trip(void **state) {
    skip_without_gpu();
    Model *a = filled_model(1);
    Model *g = model_create(&a->cfg, DEVICE_CUDA, 4, 9), *b = filled_model(5);
    CkptState s = some_state(a, 7);
    char p1[128], p2[128], err[512];
    path_in_dir(p1, sizeof p1, "cpu.ckpt");
    path_in_dir(p2, sizeof p2, "gpu.ckpt");
    if (ckpt_save(p1, a, &s, err, sizeof err) || ckpt_load(p1, g, NULL, err, sizeof err) ||
        ckpt_save(p2, g, &s, err, sizeof err) || ckpt_load(p2, b, NULL, err, sizeof err))
        fail_msg("%s", err);
    assert_true(models_equal(a, b));
    model_free(a);
    model_free(b);
    model_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_bit_for_bit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_table_names_and_shapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_at_every_boundary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_bit_in_each_section, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_magic_and_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_model_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_names_from_the_file_are_escaped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_output, setup, teardown),
        cmocka_unit_test_setup_teardown(test_owner_of_outputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_save_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kill_during_save_leaves_a_valid_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_latest_skips_corrupt_and_prune, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cpu_gpu_round_trip, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
