// tests/test_sampler.c: the DistributedSampler semantics (shards disjoint and covering the data, order new each epoch, every evaluation sample counted once) of kit/data.h:
// disjoint covering shards, PAD/DROP sizes, an order that depends on (seed, epoch) only, and an
// evaluation sampler that sees every sample exactly once.
#include "tests/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kit/data.h"

// The global list as the ranks see it: position k * world + r is rank r's k-th index.
// Returns its length (world * per-rank length, all ranks having the same length in PAD/DROP).
static int global_list(int n, int world, uint64_t seed, int epoch, SamplerMode mode, int *out) {
    int total = 0;
    for (int r = 0; r < world; r++) {
        Sampler s;
        sampler_init(&s, n, r, world, seed, mode);
        sampler_set_epoch(&s, epoch);
        int len = sampler_len(&s);
        int *mine = malloc((size_t)(len + 1) * sizeof *mine);
        assert_int_equal(sampler_indices(&s, mine), len);
        for (int k = 0; k < len; k++) {
            assert_true(mine[k] >= 0 && mine[k] < n);
            out[k * world + r] = mine[k];
        }
        total += len;
        free(mine);
    }
    return total;
}

static void test_pad_and_drop_sizes_and_cover(void **state) {
    int *list = malloc(4096 * sizeof *list), *seen = malloc(1024 * sizeof *seen);
    for (int world = 1; world <= 5; world++)
        for (int n = 0; n <= 41; n++) {
            // PAD: every rank gets ceil(n / world); all samples are covered; the extra positions repeat
            // the head of the permuted list (cycling when n < world).
            int per = (n + world - 1) / world;
            for (int r = 0; r < world; r++) {
                Sampler s;
                sampler_init(&s, n, r, world, 3, SAMPLER_TRAIN_PAD);
                assert_int_equal(sampler_len(&s), per);
            }
            int total = global_list(n, world, 3, 1, SAMPLER_TRAIN_PAD, list);
            assert_int_equal(total, per * world);
            memset(seen, 0, 1024 * sizeof *seen);
            for (int p = 0; p < n; p++) seen[list[p]]++;
            for (int i = 0; i < n; i++) assert_int_equal(seen[i], 1);  // the first n positions: a permutation
            for (int p = n; p < total; p++) assert_int_equal(list[p], list[p % n]);

            // DROP: floor(n / world) each, no index twice, the tail of the permutation dropped.
            int keep = n / world;
            total = global_list(n, world, 3, 1, SAMPLER_TRAIN_DROP, list);
            assert_int_equal(total, keep * world);
            memset(seen, 0, 1024 * sizeof *seen);
            for (int p = 0; p < total; p++) assert_int_equal(seen[list[p]]++, 0);
            int pad_list[64];
            global_list(n, world, 3, 1, SAMPLER_TRAIN_PAD, pad_list);
            for (int p = 0; p < total; p++) assert_int_equal(list[p], pad_list[p]);  // same order, truncated
        }
    free(list);
    free(seen);
}

// EVAL: no shuffle, no padding, every sample exactly once, for sizes not divisible by the world size.
static void test_eval_exactly_once(void **state) {
    int seen[200];
    for (int world = 1; world <= 5; world++)
        for (int n = 0; n <= 103; n += (n < 12 ? 1 : 13)) {
            memset(seen, 0, sizeof seen);
            int total = 0;
            for (int r = 0; r < world; r++) {
                Sampler s;
                sampler_init(&s, n, r, world, 99, SAMPLER_EVAL);
                sampler_set_epoch(&s, 5);
                int len = sampler_len(&s), idx[200];
                // The first n % world ranks get one more.
                assert_int_equal(len, n / world + (r < n % world));
                assert_int_equal(sampler_indices(&s, idx), len);
                for (int k = 0; k < len; k++) {
                    assert_int_equal(idx[k], r + k * world);  // in order: rank r gets r, r + world, ...
                    seen[idx[k]]++;
                }
                total += len;
            }
            assert_int_equal(total, n);
            for (int i = 0; i < n; i++) assert_int_equal(seen[i], 1);
        }
}

// The order depends on (seed, epoch) only: the same on every rank and every world size, different
// between epochs and seeds, identical when asked again.
static void test_order_by_seed_and_epoch(void **state) {
    enum { N = 1000 };
    static int a[N + 8], b[N + 8], c[N + 8], one[N];
    global_list(N, 3, 42, 0, SAMPLER_TRAIN_PAD, a);
    global_list(N, 3, 42, 0, SAMPLER_TRAIN_PAD, b);
    assert_memory_equal(a, b, sizeof(int) * 1002);
    // One rank alone sees the same permutation as the three together.
    global_list(N, 1, 42, 0, SAMPLER_TRAIN_PAD, one);
    assert_memory_equal(a, one, sizeof one);
    // Another epoch, another seed: another order (a fixed point count near 1 for a random permutation).
    global_list(N, 3, 42, 1, SAMPLER_TRAIN_PAD, b);
    global_list(N, 3, 43, 0, SAMPLER_TRAIN_PAD, c);
    int same_epoch = 0, same_seed = 0, identity = 0;
    for (int p = 0; p < N; p++) same_epoch += a[p] == b[p], same_seed += a[p] == c[p], identity += a[p] == p;
    print_message("positions equal: epoch 0 vs 1: %d, seed 42 vs 43: %d, vs identity: %d (of %d)\n", same_epoch,
                  same_seed, identity, N);
    assert_true(same_epoch < 20 && same_seed < 20 && identity < 20);
    // Going back to an epoch gives its order back (resume), and the sampler's own epoch is what counts.
    Sampler s;
    sampler_init(&s, N, 1, 3, 42, SAMPLER_TRAIN_DROP);
    assert_int_equal(s.epoch, 0);
    int r1[N], r2[N];
    sampler_set_epoch(&s, 7);
    sampler_indices(&s, r1);
    sampler_set_epoch(&s, 8);
    sampler_indices(&s, r2);
    assert_memory_not_equal(r1, r2, sizeof(int) * 333);
    sampler_set_epoch(&s, 7);
    sampler_indices(&s, r2);
    assert_memory_equal(r1, r2, sizeof(int) * 333);
}

// Rank shards are disjoint in DROP mode, and each one is a fair sample (not, e.g., one class block).
static void test_shards_disjoint(void **state) {
    enum { N = 997, W = 4 };
    static int owner[N];
    for (int i = 0; i < N; i++) owner[i] = -1;
    for (int r = 0; r < W; r++) {
        Sampler s;
        sampler_init(&s, N, r, W, 5, SAMPLER_TRAIN_DROP);
        sampler_set_epoch(&s, 2);
        int idx[N], len = sampler_indices(&s, idx);
        assert_int_equal(len, N / W);
        int low = 0;
        for (int k = 0; k < len; k++) {
            assert_int_equal(owner[idx[k]], -1);
            owner[idx[k]] = r;
            low += idx[k] < N / 2;
        }
        assert_true(low > len / 2 - 40 && low < len / 2 + 40);  // both halves of the data, about evenly
    }
    int unowned = 0;
    for (int i = 0; i < N; i++) unowned += owner[i] < 0;
    assert_int_equal(unowned, N % W);
}

// Bad arguments are a clear error and exit status 1, not a wrong shard.
static void test_bad_arguments_exit(void **state) {
    const int cases[][3] = {{10, 2, 2}, {10, -1, 2}, {10, 0, 0}, {-1, 0, 1}};
    for (int c = 0; c < 4; c++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            if (!freopen("/dev/null", "w", stderr)) _exit(2);  // the child only: its expected error stays quiet
            Sampler s;
            sampler_init(&s, cases[c][0], cases[c][1], cases[c][2], 1, SAMPLER_EVAL);
            _exit(0);
        }
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
    }
}

// The real torch.utils.data.distributed.DistributedSampler (shuffle=False: positions 0..n-1, padded or cut by
// drop_last, then every world-th from rank) against the kit's PAD/DROP shards of the same epoch. The kit
// shuffles with its own generator, so its shard must be torch's positions read through the kit's permutation
// (the world-1 shard: all n indices in the epoch's order). Skipped, saying why, when torch cannot be imported.
static const char TORCH_SHARDS[] =
    "python3 - 2>/dev/null <<'EOF'\n"
    "import sys\n"
    "try:\n"
    "    from torch.utils.data.distributed import DistributedSampler\n"
    "except Exception as e:\n"
    "    print('SKIP', type(e).__name__, e); sys.exit(0)\n"
    "for n in (1, 3, 10, 11, 13, 64, 101):\n"
    "    for world in (1, 2, 3, 4, 5, 8):\n"
    "        for drop in (0, 1):\n"
    "            for rank in range(world):\n"
    "                s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False, drop_last=bool(drop))\n"
    "                print(n, world, drop, rank, len(s), *list(s))\n"
    "EOF\n";

static void test_shards_equal_torch_distributed_sampler(void **state) {
    FILE *p = popen(TORCH_SHARDS, "r");
    assert_non_null(p);
    char line[4096];
    int compared = 0;
    const uint64_t seed = 7;
    const int epoch = 3;
    while (fgets(line, sizeof line, p)) {
        if (strncmp(line, "SKIP", 4) == 0) {
            pclose(p);
            line[strcspn(line, "\n")] = 0;
            print_message("torch not importable (%s): the kit's PAD/DROP shards are not compared with PyTorch\n", line + 5);
            skip();
        }
        char *at = line, *end;
        int f[5];
        for (int i = 0; i < 5; i++, at = end) f[i] = (int)strtol(at, &end, 10);
        int n = f[0], world = f[1], drop = f[2], rank = f[3], len = f[4];
        Sampler all, mine;
        sampler_init(&all, n, 0, 1, seed, SAMPLER_TRAIN_DROP);
        sampler_init(&mine, n, rank, world, seed, drop ? SAMPLER_TRAIN_DROP : SAMPLER_TRAIN_PAD);
        sampler_set_epoch(&all, epoch);
        sampler_set_epoch(&mine, epoch);
        int *perm = malloc((size_t)n * sizeof *perm), *got = malloc((size_t)(len + n + 1) * sizeof *got);
        assert_int_equal(sampler_indices(&all, perm), n);
        if (sampler_len(&mine) != len)
            fail_msg("n %d world %d rank %d drop_last=%d: the kit's shard has %d indices, torch's %d", n, world, rank,
                     drop, sampler_len(&mine), len);
        sampler_indices(&mine, got);
        for (int k = 0; k < len; k++) {
            int pos = (int)strtol(at, &end, 10);
            at = end;
            if (got[k] != perm[pos])
                fail_msg("n %d world %d rank %d drop_last=%d: index %d of the shard is %d, torch's position %d -> %d", n,
                         world, rank, drop, k, got[k], pos, perm[pos]);
        }
        free(perm);
        free(got);
        compared++;
    }
    int rc = pclose(p);
    if (rc != 0 || compared == 0) fail_msg("the PyTorch script failed (status %d) after %d shards", rc, compared);
    print_message("%d shards equal to torch's DistributedSampler (drop_last True and False)\n", compared);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pad_and_drop_sizes_and_cover),
        cmocka_unit_test(test_eval_exactly_once),
        cmocka_unit_test(test_order_by_seed_and_epoch),
        cmocka_unit_test(test_shards_disjoint),
        cmocka_unit_test(test_bad_arguments_exit),
        cmocka_unit_test(test_shards_equal_torch_distributed_sampler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
