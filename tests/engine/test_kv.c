#include "engine/kv.h"
#include "base/dtype.h"
#include "base/err.h"
#include "testutil.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Rows are filled with a pattern derived from a stamp, so a row read back names the write
 * that produced it. Element j of (stamp, layer, K or V) is pattern(stamp, layer, kv, j). */
static uint32_t pattern(uint32_t stamp, int layer, int is_v, int64_t j)
{
    uint64_t s = ((uint64_t)stamp << 20) ^ ((uint64_t)layer << 8) ^ ((uint64_t)is_v << 4) ^ (uint64_t)j;
    return (uint32_t)test_rand_u64(&s);
}

static void put_row(struct kv_cache *kv, int64_t slot, uint32_t stamp)
{
    const struct kv_config *c = kv_config(kv);
    for (int l = 0; l < c->n_layers; l++)
        for (int is_v = 0; is_v < 2; is_v++) {
            void *r = is_v ? kv_v(kv, l, slot) : kv_k(kv, l, slot);
            for (int64_t j = 0; j < c->kv_dim; j++) {
                uint32_t x = pattern(stamp, l, is_v, j);
                if (c->type_k == DT_F16)
                    ((uint16_t *)r)[j] = (uint16_t)x;
                else
                    ((uint32_t *)r)[j] = x;
            }
        }
}

/* Returns true when the row at slot holds stamp's pattern in every layer, K and V. */
static bool row_is(struct kv_cache *kv, int64_t slot, uint32_t stamp)
{
    const struct kv_config *c = kv_config(kv);
    for (int l = 0; l < c->n_layers; l++)
        for (int is_v = 0; is_v < 2; is_v++) {
            const void *r = is_v ? kv_v(kv, l, slot) : kv_k(kv, l, slot);
            if (!r)
                return false;
            for (int64_t j = 0; j < c->kv_dim; j++) {
                uint32_t x = pattern(stamp, l, is_v, j);
                uint32_t got = c->type_k == DT_F16 ? ((const uint16_t *)r)[j] : ((const uint32_t *)r)[j];
                if (got != (c->type_k == DT_F16 ? (uint16_t)x : x))
                    return false;
            }
        }
    return true;
}

static struct kv_cache *make(int n_layers, int64_t kv_dim, int bt, int64_t n_blocks, int max_seqs,
                             int type)
{
    struct kv_config c = {.n_layers = n_layers, .kv_dim = kv_dim, .block_tokens = bt,
                          .n_blocks = n_blocks, .max_seqs = max_seqs, .type_k = type, .type_v = type};
    struct kv_cache *kv = NULL;
    char err[256] = "";
    int rc = kv_create(&kv, &c, err, sizeof err);
    CHECK(rc == 0, "kv_create: %d %s", rc, err);
    return kv;
}

static void test_config(void)
{
    struct kv_config c = {.n_layers = 3, .kv_dim = 128, .block_tokens = 16, .n_blocks = 10,
                          .max_seqs = 4, .type_k = DT_F16, .type_v = DT_F16};
    CHECK(kv_bytes_for(&c) == 2ull * 3 * 10 * 16 * 128 * 2, "F16 bytes %llu",
          (unsigned long long)kv_bytes_for(&c));
    c.type_k = c.type_v = DT_F32;
    CHECK(kv_bytes_for(&c) == 2ull * 3 * 10 * 16 * 128 * 4, "F32 bytes %llu",
          (unsigned long long)kv_bytes_for(&c));

    /* The K and V mappings of a layer are exactly layer-sized, page aligned. */
    struct kv_cache *kv = make(3, 128, 16, 10, 4, DT_F32);
    if (!kv)
        return;
    const struct kv_config *got = kv_config(kv);
    CHECK(got->n_blocks == 10 && got->kv_dim == 128 && got->type_k == DT_F32, "config not kept");
    for (int l = 0; l < 3; l++) {
        uint8_t *first = kv_k(kv, l, 0), *last = kv_k(kv, l, 10 * 16 - 1);
        CHECK(((uintptr_t)first & 63) == 0, "layer %d K not 64-byte aligned", l);
        CHECK(((uintptr_t)kv_v(kv, l, 0) & 63) == 0, "layer %d V not 64-byte aligned", l);
        CHECK(last - first == (10 * 16 - 1) * 128 * 4, "layer %d K span %td", l, last - first);
        CHECK((uint8_t *)kv_k(kv, l, 1) - first == 128 * 4, "rows not contiguous");
    }
    CHECK(kv_k(kv, 3, 0) == NULL && kv_k(kv, 0, 160) == NULL && kv_v(kv, -1, 0) == NULL &&
              kv_v(kv, 0, -1) == NULL,
          "out-of-range rows not NULL");
    CHECK_EQ_INT(kv_free_blocks(kv), 10);
    CHECK_EQ_INT(kv_seq_len(kv, 0), 0);
    CHECK_EQ_INT(kv_seq_len(kv, 4), CAIRN_EINVAL);
    CHECK_EQ_INT(kv_block_refs(kv, 10), CAIRN_EINVAL);
    CHECK_EQ_INT(kv_prepare(kv, 4, 0, 1), CAIRN_EINVAL);
    CHECK_EQ_INT(kv_prepare(kv, 0, 1, 1), CAIRN_EINVAL);  /* pos > len */
    CHECK_EQ_INT(kv_prepare(kv, 0, -1, 1), CAIRN_EINVAL);
    CHECK_EQ_INT(kv_prepare(kv, 0, 0, -1), CAIRN_EINVAL);
    CHECK_EQ_INT(kv_prepare(kv, 0, 0, INT64_MAX), CAIRN_EFULL);
    CHECK_EQ_INT(kv_fork(kv, 0, 0), CAIRN_EINVAL);
    CHECK_EQ_INT(kv_fork(kv, 0, 7), CAIRN_EINVAL);
    int64_t n = 99;
    CHECK(kv_seq_blocks(kv, 9, &n) == NULL && n == 0, "blocks of bad seq");
    kv_release(kv);
    kv_release(NULL);

    struct kv_config bad[] = {
        {.n_layers = 0, .kv_dim = 8, .block_tokens = 4, .n_blocks = 4, .max_seqs = 1, .type_k = DT_F16, .type_v = DT_F16},
        {.n_layers = 1, .kv_dim = 0, .block_tokens = 4, .n_blocks = 4, .max_seqs = 1, .type_k = DT_F16, .type_v = DT_F16},
        {.n_layers = 1, .kv_dim = 8, .block_tokens = -4, .n_blocks = 4, .max_seqs = 1, .type_k = DT_F16, .type_v = DT_F16},
        {.n_layers = 1, .kv_dim = 8, .block_tokens = 4, .n_blocks = 0, .max_seqs = 1, .type_k = DT_F16, .type_v = DT_F16},
        {.n_layers = 1, .kv_dim = 8, .block_tokens = 4, .n_blocks = 4, .max_seqs = 0, .type_k = DT_F16, .type_v = DT_F16},
        {.n_layers = 1, .kv_dim = 8, .block_tokens = 4, .n_blocks = 4, .max_seqs = 1, .type_k = DT_Q4_0, .type_v = DT_F16},
        {.n_layers = 1, .kv_dim = 8, .block_tokens = 4, .n_blocks = 4, .max_seqs = 1, .type_k = 999, .type_v = DT_F16},
        {.n_layers = 1, .kv_dim = INT64_MAX / 2, .block_tokens = 4, .n_blocks = 4, .max_seqs = 1,
         .type_k = DT_F32, .type_v = DT_F32},
        {.n_layers = 1000, .kv_dim = 1 << 20, .block_tokens = 1 << 20, .n_blocks = 1 << 20,
         .max_seqs = 1, .type_k = DT_F16, .type_v = DT_F16},
        {.n_layers = 1, .kv_dim = 8, .block_tokens = 4, .n_blocks = 1ll << 32, .max_seqs = 1,
         .type_k = DT_F16, .type_v = DT_F16},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct kv_cache *k = (struct kv_cache *)1;
        char err[256] = "";
        int rc = kv_create(&k, &bad[i], err, sizeof err);
        CHECK(rc < 0 && err[0], "bad config %zu accepted (rc %d)", i, rc);
        CHECK(k == (struct kv_cache *)1, "bad config %zu wrote *out", i);
        CHECK(kv_bytes_for(&bad[i]) == 0, "bad config %zu has bytes", i);
    }
    CHECK(kv_bytes_for(NULL) == 0, "NULL config has bytes");

    /* A valid but unmappable size fails with a message, not a crash. */
    struct kv_config huge = {.n_layers = 2, .kv_dim = 1 << 20, .block_tokens = 1 << 10,
                             .n_blocks = 1 << 20, .max_seqs = 1, .type_k = DT_F32, .type_v = DT_F32};
    struct kv_cache *k = NULL;
    char err[256] = "";
    int rc = kv_create(&k, &huge, err, sizeof err);
    CHECK(rc == CAIRN_ENOMEM && strstr(err, "mmap"), "2^52-byte cache: rc %d '%s'", rc, err);
    kv_release(k);

    /* A cache bigger than this machine's memory is fine while untouched (lazy commit),
     * unless the kernel refuses to overcommit at all (vm.overcommit_memory = 2). */
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    int mode = f ? fgetc(f) : '0';
    if (f)
        fclose(f);
    if (mode == '2')
        return;
    struct kv_config big = {.n_layers = 32, .kv_dim = 1024, .block_tokens = 16,
                            .n_blocks = 65536, .max_seqs = 256, .type_k = DT_F16, .type_v = DT_F16};
    rc = kv_create(&k, &big, err, sizeof err);
    CHECK(rc == 0, "lazily committed 128 GiB cache: rc %d %s", rc, err);
    if (rc == 0) {
        CHECK_EQ_INT(kv_prepare(k, 255, 0, 100), 0);
        put_row(k, kv_slot(k, 255, 99), 5);
        CHECK(row_is(k, kv_slot(k, 255, 99), 5), "row of big cache");
        kv_release(k);
    }
}

static void test_fill_and_rollback(int type)
{
    enum { S = 3, BT = 4, NB = 32 };
    struct kv_cache *kv = make(2, 24, BT, NB, S, type);
    if (!kv)
        return;
    /* Fill seq s with len 5 + 4s, stamp 100*s + pos, a few tokens per prepare. */
    for (int s = 0; s < S; s++) {
        int64_t len = 5 + 4 * s;
        for (int64_t pos = 0; pos < len; pos += 3) {
            int64_t n = len - pos < 3 ? len - pos : 3;
            CHECK_EQ_INT(kv_prepare(kv, s, pos, n), 0);
            for (int64_t i = pos; i < pos + n; i++)
                put_row(kv, kv_slot(kv, s, i), (uint32_t)(100 * s + i));
        }
        CHECK_EQ_INT(kv_seq_len(kv, s), len);
    }
    int used = 0;
    for (int s = 0; s < S; s++) {
        int64_t len = kv_seq_len(kv, s), nb;
        const int32_t *blocks = kv_seq_blocks(kv, s, &nb);
        CHECK_EQ_INT(nb, (len + BT - 1) / BT);
        used += (int)nb;
        for (int64_t p = 0; p < len; p++) {
            int64_t slot = kv_slot(kv, s, p);
            CHECK(slot == (int64_t)blocks[p / BT] * BT + p % BT, "seq %d pos %lld slot %lld", s,
                  (long long)p, (long long)slot);
            CHECK(row_is(kv, slot, (uint32_t)(100 * s + p)), "seq %d pos %lld wrong row", s, (long long)p);
        }
        CHECK_EQ_INT(kv_slot(kv, s, len), -1);
    }
    CHECK_EQ_INT(kv_free_blocks(kv), NB - used);

    /* Rollback of seq 2 (len 13) to 6, rewrite 6..10: same as writing 0..10 once. */
    CHECK_EQ_INT(kv_prepare(kv, 2, 6, 5), 0);
    CHECK_EQ_INT(kv_seq_len(kv, 2), 11);
    for (int64_t i = 6; i < 11; i++)
        put_row(kv, kv_slot(kv, 2, i), (uint32_t)(7000 + i));
    for (int64_t p = 0; p < 11; p++)
        CHECK(row_is(kv, kv_slot(kv, 2, p), (uint32_t)(p < 6 ? 200 + p : 7000 + p)),
              "after rollback pos %lld", (long long)p);
    CHECK_EQ_INT(kv_free_blocks(kv), NB - used + 1); /* 13 -> 11 positions: 4 -> 3 blocks */

    /* Truncate and clear give every block back. */
    kv_truncate(kv, 2, 4);
    CHECK_EQ_INT(kv_seq_len(kv, 2), 4);
    kv_truncate(kv, 2, 9); /* beyond len: no-op */
    CHECK_EQ_INT(kv_seq_len(kv, 2), 4);
    for (int64_t p = 0; p < 4; p++)
        CHECK(row_is(kv, kv_slot(kv, 2, p), (uint32_t)(200 + p)), "after truncate pos %lld", (long long)p);
    for (int s = 0; s < S; s++)
        kv_seq_clear(kv, s);
    CHECK_EQ_INT(kv_free_blocks(kv), NB);
    for (int32_t b = 0; b < NB; b++)
        CHECK_EQ_INT(kv_block_refs(kv, b), 0);
    kv_release(kv);
}

static void test_fork_cow(void)
{
    enum { BT = 4, NB = 8 };
    struct kv_cache *kv = make(2, 8, BT, NB, 3, DT_F16);
    if (!kv)
        return;
    CHECK_EQ_INT(kv_prepare(kv, 0, 0, 6), 0); /* blocks: full + half */
    for (int64_t i = 0; i < 6; i++)
        put_row(kv, kv_slot(kv, 0, i), (uint32_t)(10 + i));
    CHECK_EQ_INT(kv_fork(kv, 0, 1), 0);
    CHECK_EQ_INT(kv_fork(kv, 0, 1), CAIRN_ESTATE); /* dst not empty */
    int64_t n0, n1;
    const int32_t *b0 = kv_seq_blocks(kv, 0, &n0);
    const int32_t *b1 = kv_seq_blocks(kv, 1, &n1);
    CHECK(n0 == 2 && n1 == 2 && b0[0] == b1[0] && b0[1] == b1[1], "fork did not share blocks");
    CHECK_EQ_INT(kv_block_refs(kv, b0[0]), 2);
    CHECK_EQ_INT(kv_block_refs(kv, b0[1]), 2);
    CHECK_EQ_INT(kv_free_blocks(kv), NB - 2);
    int32_t shared_tail = b0[1];

    /* Seq 1 rewrites from pos 5 (inside the shared half block): it gets a copy of it. */
    CHECK_EQ_INT(kv_prepare(kv, 1, 5, 2), 0);
    b1 = kv_seq_blocks(kv, 1, &n1);
    CHECK(b1[1] != shared_tail, "writer kept the shared block");
    CHECK_EQ_INT(kv_block_refs(kv, shared_tail), 1);
    CHECK_EQ_INT(kv_block_refs(kv, b1[1]), 1);
    CHECK_EQ_INT(kv_block_refs(kv, b1[0]), 2);
    CHECK_EQ_INT(kv_free_blocks(kv), NB - 3);
    put_row(kv, kv_slot(kv, 1, 5), 555);
    put_row(kv, kv_slot(kv, 1, 6), 556);
    for (int64_t i = 0; i < 6; i++)
        CHECK(row_is(kv, kv_slot(kv, 0, i), (uint32_t)(10 + i)), "seq 0 pos %lld changed", (long long)i);
    for (int64_t i = 0; i < 5; i++)
        CHECK(row_is(kv, kv_slot(kv, 1, i), (uint32_t)(10 + i)), "seq 1 kept pos %lld lost", (long long)i);
    CHECK(row_is(kv, kv_slot(kv, 1, 5), 555) && row_is(kv, kv_slot(kv, 1, 6), 556), "seq 1 new rows");

    /* Now seq 0 owns its tail alone: appending writes in place, no copy. */
    CHECK_EQ_INT(kv_prepare(kv, 0, 6, 1), 0);
    b0 = kv_seq_blocks(kv, 0, &n0);
    CHECK(b0[1] == shared_tail, "sole owner copied its block");
    CHECK_EQ_INT(kv_free_blocks(kv), NB - 3);

    /* Fork at a block boundary, then the child appends: new block, nothing copied. */
    kv_truncate(kv, 0, 4);
    CHECK_EQ_INT(kv_free_blocks(kv), NB - 2); /* shared_tail freed: seq 1 has its own */
    CHECK_EQ_INT(kv_fork(kv, 0, 2), 0);
    CHECK_EQ_INT(kv_prepare(kv, 2, 4, 1), 0);
    CHECK_EQ_INT(kv_block_refs(kv, kv_seq_blocks(kv, 2, &n1)[0]), 3);
    CHECK_EQ_INT(kv_free_blocks(kv), NB - 3);

    /* A fork of a truncated-to-mid-block prefix: truncation alone copies nothing. */
    kv_seq_clear(kv, 2);
    kv_truncate(kv, 1, 2);
    CHECK_EQ_INT(kv_block_refs(kv, kv_seq_blocks(kv, 1, &n1)[0]), 2);
    CHECK_EQ_INT(kv_prepare(kv, 1, 2, 1), 0); /* writes pos 2 of the shared block: copy */
    CHECK(kv_seq_blocks(kv, 1, &n1)[0] != kv_seq_blocks(kv, 0, &n0)[0], "no copy on write at pos 2");
    put_row(kv, kv_slot(kv, 1, 2), 999);
    CHECK(row_is(kv, kv_slot(kv, 0, 2), 12), "seq 0 pos 2 changed by seq 1");
    CHECK(row_is(kv, kv_slot(kv, 1, 1), 11), "copied block lost pos 1");

    kv_seq_clear(kv, 0);
    kv_seq_clear(kv, 1);
    CHECK_EQ_INT(kv_free_blocks(kv), NB);
    kv_release(kv);
}

/* Snapshot of everything observable, to check that a failed call changed nothing. */
struct snap {
    int64_t len[4], nb[4], free;
    int32_t blocks[4][16];
    int refs[16];
};

static void take(struct kv_cache *kv, int S, struct snap *s)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < S; i++) {
        const int32_t *b = kv_seq_blocks(kv, i, &s->nb[i]);
        s->len[i] = kv_seq_len(kv, i);
        memcpy(s->blocks[i], b, (size_t)s->nb[i] * sizeof *b);
    }
    for (int b = 0; b < kv_config(kv)->n_blocks; b++)
        s->refs[b] = kv_block_refs(kv, b);
    s->free = kv_free_blocks(kv);
}

static void test_full(void)
{
    enum { BT = 4, NB = 6 };
    struct kv_cache *kv = make(1, 8, BT, NB, 3, DT_F32);
    if (!kv)
        return;
    struct snap a, b;
    CHECK_EQ_INT(kv_prepare(kv, 0, 0, 10), 0); /* 3 blocks */
    for (int64_t i = 0; i < 10; i++)
        put_row(kv, kv_slot(kv, 0, i), (uint32_t)i);
    CHECK_EQ_INT(kv_fork(kv, 0, 1), 0);
    CHECK_EQ_INT(kv_prepare(kv, 2, 0, 8), 0); /* 2 blocks: 1 free left */
    take(kv, 3, &a);
    /* Seq 1 at pos 9 needs a copy + 1 new block for 9..13: 2 > 1 free. */
    CHECK_EQ_INT(kv_prepare(kv, 1, 9, 5), CAIRN_EFULL);
    take(kv, 3, &b);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "EFULL changed state (copy on write case)");
    /* Seq 2 at 0 for 13 positions: dropping its 2 blocks frees 2, needs 4 > 3. */
    CHECK_EQ_INT(kv_prepare(kv, 2, 0, 13), CAIRN_EFULL);
    take(kv, 3, &b);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "EFULL changed state (rollback case)");
    /* ... but 12 positions fit exactly, counting the blocks the rollback frees. */
    CHECK_EQ_INT(kv_prepare(kv, 2, 0, 12), 0);
    CHECK_EQ_INT(kv_free_blocks(kv), 0);
    /* Rolling seq 1 back (shared blocks) frees nothing: EFULL. */
    take(kv, 3, &a);
    CHECK_EQ_INT(kv_prepare(kv, 1, 4, 1), CAIRN_EFULL);
    take(kv, 3, &b);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "EFULL changed state (shared rollback)");
    for (int64_t i = 0; i < 10; i++)
        CHECK(row_is(kv, kv_slot(kv, 0, i), (uint32_t)i) && row_is(kv, kv_slot(kv, 1, i), (uint32_t)i),
              "pos %lld lost after EFULL", (long long)i);
    /* Truncating to a prefix (n = 0) always works. */
    CHECK_EQ_INT(kv_prepare(kv, 1, 4, 0), 0);
    CHECK_EQ_INT(kv_seq_len(kv, 1), 4);
    kv_release(kv);
}

/* Model-based test: random operations against a plain array of stamps per sequence. */
enum { RS = 4, RBT = 4, RNB = 12, RMAX = RNB * RBT };

struct model {
    int64_t len[RS];
    uint32_t stamp[RS][RMAX]; /* 0: prepared but never written */
};

static int check_against(struct kv_cache *kv, const struct model *m, int step)
{
    int bad = 0;
    int refs[RNB] = {0};
    int64_t used = 0;
    for (int s = 0; s < RS; s++) {
        int64_t len = kv_seq_len(kv, s), nb;
        const int32_t *b = kv_seq_blocks(kv, s, &nb);
        if (len != m->len[s] || nb != (len + RBT - 1) / RBT) {
            fprintf(stderr, "step %d seq %d: len %lld blocks %lld, model len %lld\n", step, s,
                    (long long)len, (long long)nb, (long long)m->len[s]);
            bad++;
            continue;
        }
        for (int64_t i = 0; i < nb; i++) {
            for (int64_t j = 0; j < i; j++)
                if (b[i] == b[j]) {
                    fprintf(stderr, "step %d seq %d: block %d twice\n", step, s, b[i]);
                    bad++;
                }
            if (b[i] < 0 || b[i] >= RNB) {
                fprintf(stderr, "step %d seq %d: block id %d\n", step, s, b[i]);
                return bad + 1;
            }
            used += refs[b[i]]++ == 0;
        }
        for (int64_t p = 0; p < len; p++)
            if (m->stamp[s][p] && !row_is(kv, kv_slot(kv, s, p), m->stamp[s][p])) {
                fprintf(stderr, "step %d seq %d pos %lld: row is not stamp %u\n", step, s,
                        (long long)p, m->stamp[s][p]);
                bad++;
            }
    }
    for (int b = 0; b < RNB; b++)
        if (kv_block_refs(kv, b) != refs[b]) {
            fprintf(stderr, "step %d block %d: refs %d, tables hold it %d times\n", step, b,
                    kv_block_refs(kv, b), refs[b]);
            bad++;
        }
    if (kv_free_blocks(kv) != RNB - used) {
        fprintf(stderr, "step %d: free %lld, expected %lld\n", step, (long long)kv_free_blocks(kv),
                (long long)(RNB - used));
        bad++;
    }
    return bad;
}

static void test_random(int type, uint64_t seed, int steps)
{
    struct kv_cache *kv = make(2, 6, RBT, RNB, RS, type);
    if (!kv)
        return;
    static struct model m;
    memset(&m, 0, sizeof m);
    uint64_t rng = seed;
    uint32_t next_stamp = 1;
    int bad = 0, fulls = 0, cows = 0, ok_prepares = 0;
    for (int step = 0; step < steps && bad == 0; step++) {
        int s = (int)(test_rand_u64(&rng) % RS);
        int op = (int)(test_rand_u64(&rng) % 10);
        if (op < 6) { /* prepare + write */
            int64_t pos = (int64_t)(test_rand_u64(&rng) % (uint64_t)(m.len[s] + 1));
            if (test_rand_u64(&rng) % 3 == 0)
                pos = m.len[s]; /* plain append, the common case */
            int64_t n = (int64_t)(test_rand_u64(&rng) % 13);
            struct snap before, after;
            take(kv, RS, &before);
            int64_t nb;
            const int32_t *tb = kv_seq_blocks(kv, s, &nb);
            int32_t old_block = pos % RBT && n ? tb[pos / RBT] : -1;
            int rc = kv_prepare(kv, s, pos, n);
            if (rc == CAIRN_EFULL) {
                fulls++;
                take(kv, RS, &after);
                if (memcmp(&before, &after, sizeof before)) {
                    fprintf(stderr, "step %d: EFULL changed the state\n", step);
                    bad++;
                }
                /* It really was full: blocks needed exceed free ones plus those freed. */
                int64_t keep = (pos + RBT - 1) / RBT, avail = before.free;
                for (int64_t i = keep; i < before.nb[s]; i++)
                    avail += before.refs[before.blocks[s][i]] == 1;
                int64_t need = (pos + n + RBT - 1) / RBT - keep +
                               (old_block >= 0 && before.refs[old_block] > 1);
                if (need <= avail) {
                    fprintf(stderr, "step %d: EFULL with %lld needed, %lld available\n", step,
                            (long long)need, (long long)avail);
                    bad++;
                }
                continue;
            }
            if (rc != 0) {
                fprintf(stderr, "step %d: prepare(%d, %lld, %lld) = %d\n", step, s, (long long)pos,
                        (long long)n, rc);
                bad++;
                break;
            }
            ok_prepares++;
            tb = kv_seq_blocks(kv, s, &nb);
            cows += old_block >= 0 && tb[pos / RBT] != old_block;
            m.len[s] = pos + n;
            for (int64_t i = pos; i < pos + n; i++) {
                int64_t slot = kv_slot(kv, s, i);
                if (kv_block_refs(kv, (int32_t)(slot / RBT)) != 1) {
                    fprintf(stderr, "step %d: writing seq %d pos %lld into a shared block\n", step,
                            s, (long long)i);
                    bad++;
                }
                /* Sometimes leave a prepared row unwritten: its content is unspecified. */
                if (test_rand_u64(&rng) % 8 == 0) {
                    m.stamp[s][i] = 0;
                    continue;
                }
                m.stamp[s][i] = next_stamp;
                put_row(kv, slot, next_stamp++);
            }
        } else if (op == 6) {
            int64_t pos = (int64_t)(test_rand_u64(&rng) % (uint64_t)(m.len[s] + 2));
            kv_truncate(kv, s, pos);
            if (pos < m.len[s])
                m.len[s] = pos;
        } else if (op == 7) {
            kv_seq_clear(kv, s);
            m.len[s] = 0;
        } else {
            int d = (int)(test_rand_u64(&rng) % RS);
            int rc = kv_fork(kv, s, d);
            int want = d == s ? CAIRN_EINVAL : m.len[d] ? CAIRN_ESTATE : 0;
            if (rc != want) {
                fprintf(stderr, "step %d: fork(%d, %d) = %d, want %d\n", step, s, d, rc, want);
                bad++;
            }
            if (rc == 0) {
                m.len[d] = m.len[s];
                memcpy(m.stamp[d], m.stamp[s], sizeof m.stamp[s]);
            }
        }
        bad += check_against(kv, &m, step);
    }
    CHECK(bad == 0, "random test (type %d seed %llu) found %d mismatches", type,
          (unsigned long long)seed, bad);
    /* The run must have exercised the interesting paths. */
    printf("random type %d seed %llu: %d steps, %d prepares, %d EFULL, %d copies on write\n", type,
           (unsigned long long)seed, steps, ok_prepares, fulls, cows);
    CHECK(fulls > steps / 200 && cows > steps / 200 && ok_prepares > steps / 4,
          "coverage: %d EFULL, %d copies on write, %d prepares", fulls, cows, ok_prepares);
    for (int s = 0; s < RS; s++)
        kv_seq_clear(kv, s);
    CHECK_EQ_INT(kv_free_blocks(kv), RNB);
    kv_release(kv);
}

/* ---- observer: a second cache replaying the recorded ops stays identical ---- */

struct oplog {
    struct kv_op ops[64];
    int n, dropped;
};

static void record_op(void *arg, const struct kv_op *op)
{
    struct oplog *l = arg;
    if (l->n < (int)(sizeof l->ops / sizeof l->ops[0]))
        l->ops[l->n++] = *op;
    else
        l->dropped++;
}

static int replay(struct kv_cache *kv, const struct kv_op *op)
{
    switch (op->kind) {
    case KV_OP_PREPARE: return kv_prepare(kv, op->seq, op->pos, op->n);
    case KV_OP_TRUNCATE: kv_truncate(kv, op->seq, op->pos); return 0;
    case KV_OP_FORK: return kv_fork(kv, op->seq, op->seq2);
    }
    return -1;
}

/* Block tables, lengths, refs and free count of a and b are equal; prints the first difference. */
static bool same_caches(struct kv_cache *a, struct kv_cache *b, int step)
{
    const struct kv_config *c = kv_config(a);
    for (int s = 0; s < c->max_seqs; s++) {
        int64_t na, nb;
        const int32_t *ta = kv_seq_blocks(a, s, &na), *tb = kv_seq_blocks(b, s, &nb);
        if (kv_seq_len(a, s) != kv_seq_len(b, s) || na != nb || memcmp(ta, tb, (size_t)na * sizeof *ta)) {
            fprintf(stderr, "step %d seq %d: len %lld/%lld, %lld/%lld blocks, tables %s\n", step, s,
                    (long long)kv_seq_len(a, s), (long long)kv_seq_len(b, s), (long long)na, (long long)nb,
                    na == nb && !memcmp(ta, tb, (size_t)na * sizeof *ta) ? "equal" : "differ");
            return false;
        }
    }
    for (int32_t blk = 0; blk < c->n_blocks; blk++)
        if (kv_block_refs(a, blk) != kv_block_refs(b, blk)) {
            fprintf(stderr, "step %d block %d: refs %d/%d\n", step, blk, kv_block_refs(a, blk),
                    kv_block_refs(b, blk));
            return false;
        }
    if (kv_free_blocks(a) != kv_free_blocks(b)) {
        fprintf(stderr, "step %d: free %lld/%lld\n", step, (long long)kv_free_blocks(a),
                (long long)kv_free_blocks(b));
        return false;
    }
    return true;
}

static void test_observer(uint64_t seed, int steps)
{
    enum { S = 5, BT = 4, NB = 14 };
    struct kv_cache *a = make(1, 4, BT, NB, S, DT_F32), *b = make(1, 4, BT, NB, S, DT_F32);
    if (!a || !b) {
        kv_release(a);
        kv_release(b);
        return;
    }
    static struct oplog log;
    memset(&log, 0, sizeof log);
    kv_set_observer(a, record_op, &log);
    uint64_t rng = seed;
    int bad = 0, cows = 0, fulls = 0, noops = 0, recorded = 0, kinds[4] = {0};
    for (int step = 0; step < steps && !bad; step++) {
        int s = (int)(test_rand_u64(&rng) % S), op = (int)(test_rand_u64(&rng) % 10);
        int64_t len = kv_seq_len(a, s);
        int before = log.n;
        if (op < 5) {
            int64_t pos = test_rand_u64(&rng) % 2 ? len : (int64_t)(test_rand_u64(&rng) % (uint64_t)(len + 1));
            int64_t n = (int64_t)(test_rand_u64(&rng) % 9), nb;
            const int32_t *t = kv_seq_blocks(a, s, &nb);
            bool shared = n > 0 && pos % BT && kv_block_refs(a, t[pos / BT]) > 1;
            int rc = kv_prepare(a, s, pos, n);
            fulls += rc == CAIRN_EFULL;
            cows += rc == 0 && shared;
            if ((rc == 0) != (log.n == before + 1)) {
                fprintf(stderr, "step %d: prepare returned %d and recorded %d ops\n", step, rc, log.n - before);
                bad++;
            }
        } else if (op < 7) {
            int64_t pos = op == 6 ? 0 : (int64_t)(test_rand_u64(&rng) % (uint64_t)(len + 2));
            if (op == 6)
                kv_seq_clear(a, s);
            else
                kv_truncate(a, s, pos);
            bool changed = pos < len;
            noops += !changed;
            if (log.n != before + changed) {
                fprintf(stderr, "step %d: truncate(%d, %lld) of len %lld recorded %d ops\n", step, s, (long long)pos,
                        (long long)len, log.n - before);
                bad++;
            }
        } else {
            int d = (int)(test_rand_u64(&rng) % S);
            if (test_rand_u64(&rng) % 2)
                kv_seq_clear(a, d); /* so that most forks succeed */
            before = log.n;
            int rc = kv_fork(a, s, d);
            if ((rc == 0) != (log.n == before + 1)) {
                fprintf(stderr, "step %d: fork returned %d and recorded %d ops\n", step, rc, log.n - before);
                bad++;
            }
        }
        /* Replay in batches of a few steps, as a pipeline sends them once per forward. */
        if (test_rand_u64(&rng) % 4 == 0 || step == steps - 1) {
            for (int i = 0; i < log.n; i++) {
                kinds[log.ops[i].kind]++;
                int rc = replay(b, &log.ops[i]);
                if (rc) {
                    fprintf(stderr, "step %d: replaying op %d (kind %d) failed: %d\n", step, i, log.ops[i].kind, rc);
                    bad++;
                }
            }
            recorded += log.n;
            log.n = 0;
            if (!same_caches(a, b, step))
                bad++;
        }
    }
    CHECK(bad == 0 && log.dropped == 0, "observer replay (seed %llu): %d mismatches, %d ops dropped",
          (unsigned long long)seed, bad, log.dropped);
    CHECK(cows > 10 && fulls > 10 && noops > 10 && kinds[KV_OP_FORK] > 10 && kinds[KV_OP_TRUNCATE] > 10,
          "coverage: %d copies on write, %d EFULL, %d no-op truncates, %d forks, %d truncates", cows, fulls, noops,
          kinds[KV_OP_FORK], kinds[KV_OP_TRUNCATE]);
    printf("observer seed %llu: %d ops replayed, %d copies on write, %d EFULL\n", (unsigned long long)seed, recorded,
           cows, fulls);
    /* Removed, it sees nothing more. */
    kv_set_observer(a, NULL, &log);
    CHECK_EQ_INT(kv_prepare(a, 0, 0, 1), 0);
    kv_seq_clear(a, 0);
    CHECK_EQ_INT(log.n, 0);
    kv_release(a);
    kv_release(b);
}

/* kB of transparent huge pages (AnonHugePages) in the mappings of /proc/self/smaps that
 * overlap [k, k + len) or [v, v + len), each counted once; -1 when smaps cannot be read.
 * A mapping that reaches past them counts whole: adjacent maps with the same advice merge. */
static int64_t thp_kb_over(const void *k, const void *v, size_t len)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    uintptr_t k0 = (uintptr_t)k, v0 = (uintptr_t)v;
    bool in = false;
    int64_t kb = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        long long n;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2)
            in = (a < k0 + len && b > k0) || (a < v0 + len && b > v0);
        else if (in && sscanf(line, "AnonHugePages: %lld kB", &n) == 1)
            kb += n;
    }
    fclose(f);
    return kb;
}

/* A sliding-window layer gives its passed blocks back page by page, so its K and V maps
 * must hold no huge page (kv_set_window advises MADV_NOHUGEPAGE), while the other layers'
 * maps keep the huge-page advice of kv_create. */
static void test_window_no_thp(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char mode[128] = "";
    if (f) {
        if (!fgets(mode, sizeof mode, f))
            mode[0] = 0;
        fclose(f);
    }
    if (!f || strstr(mode, "[never]")) {
        test_skip("window_no_thp: transparent huge pages are off here (%s)",
                  f ? "enabled = never" : "no /sys/kernel/mm/transparent_hugepage/enabled");
        return;
    }
    /* 2 layers of 8 MiB K and 8 MiB V: each holds whole aligned 2 MiB ranges */
    struct kv_cache *kv = make(2, 1024, 16, 128, 1, DT_F32);
    size_t bytes = (size_t)128 * 16 * 1024 * 4;
    CHECK(kv_set_window(kv, 1, 64) == 0, "kv_set_window");
    for (int l = 0; l < 2; l++) { /* commit every page of both layers */
        memset(kv_k(kv, l, 0), 1, bytes);
        memset(kv_v(kv, l, 0), 1, bytes);
    }
    int64_t full = thp_kb_over(kv_k(kv, 0, 0), kv_v(kv, 0, 0), bytes);
    int64_t window = thp_kb_over(kv_k(kv, 1, 0), kv_v(kv, 1, 0), bytes);
    if (full <= 0) {
        test_skip("window_no_thp: the full layer got no huge page (THP mode: %.*s; memory fragmented?)",
                  (int)strcspn(mode, "\n"), mode);
    } else {
        CHECK(window == 0, "the window layer's K/V maps hold %lld kB of huge pages (the full layer %lld kB)",
              (long long)window, (long long)full);
    }
    kv_release(kv);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_config);
    RUN(test_fill_and_rollback, DT_F16);
    RUN(test_fill_and_rollback, DT_F32);
    RUN(test_fork_cow);
    RUN(test_full);
    RUN(test_random, DT_F16, 1, 20000);
    RUN(test_random, DT_F32, 2, 20000);
    RUN(test_random, DT_F16, 3, 20000);
    RUN(test_observer, 4, 5000);
    RUN(test_observer, 5, 5000);
    RUN(test_window_no_thp);
    return test_main_end();
}
