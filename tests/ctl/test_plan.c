/* plan_compute as a pure function: hand states (placed here -> start with the config;
 * deleted -> stop; shard elsewhere -> nothing; already held -> nothing; unknown model ->
 * a failure with its reason; stopping runners are left alone; a runner of an older epoch
 * of its instance -> stop, then start with the new epoch), and randomized states
 * where applying the actions to the held set reaches a fixed point (no more actions),
 * with the same actions for the same input. */
#include "ctl/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "testutil.h"

static int lookup(void *ctx, const char *model_id, int layer_begin, int layer_end, char *path, size_t pathlen,
                  char *err, size_t errlen)
{
    (void)ctx;
    if (!strncmp(model_id, "missing", 7))
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "no file for %s", model_id);
    /* a model whose file holds only its first layers here (a rank's share of a hub model) */
    if (!strncmp(model_id, "first4", 6) && (layer_begin != 0 || layer_end != 4))
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "layers %d..%d of %s are not here", layer_begin, layer_end,
                          model_id);
    snprintf(path, pathlen, "/models/%s.gguf", model_id);
    return 0;
}

/* Adds an instance with shards on the given nodes (runner ids "<id>-r<rank>"). */
static void put_instance(struct cluster_state *s, const char *id, const char *model,
                         const char *const *nodes, size_t n)
{
    struct cluster_instance in = {0};
    snprintf(in.id, sizeof in.id, "%s", id);
    snprintf(in.model_id, sizeof in.model_id, "%s", model);
    in.shards = calloc(n, sizeof *in.shards);
    in.n_shards = n;
    for (size_t i = 0; i < n; i++) {
        struct cluster_shard *sh = &in.shards[i];
        snprintf(sh->node_id, sizeof sh->node_id, "%s", nodes[i]);
        snprintf(sh->runner_id, sizeof sh->runner_id, "%s-r%zu", id, i);
        sh->rank = (int)i;
        sh->world_size = (int)n;
        sh->layer_begin = (int)i * 4;
        sh->layer_end = (int)i * 4 + 4;
    }
    CHECK(cluster_state_put_instance(s, &in) == 0, "put instance %s", id);
}

static struct plan_runner held_of(const char *runner, const char *instance, enum cluster_runner_status st)
{
    struct plan_runner r = {0};
    snprintf(r.runner_id, sizeof r.runner_id, "%s", runner);
    snprintf(r.instance_id, sizeof r.instance_id, "%s", instance);
    r.status = st;
    return r;
}

static void test_hand(void)
{
    struct cluster_state *s = cluster_state_create();
    const char *here[] = {"me"}, *pair[] = {"other", "me"}, *away[] = {"other"};
    put_instance(s, "i1", "m1", here, 1);
    put_instance(s, "i2", "m2", pair, 2);
    put_instance(s, "i3", "m3", away, 1);
    put_instance(s, "i4", "missing-m4", here, 1);
    struct plan_action *a = NULL;
    size_t n = 0;
    /* The lookup hears each shard's layers: rank 0 of first4 starts, rank 1 (layers 4..8)
     * fails, and its action carries those layers for the fetch that follows. */
    struct cluster_state *f4 = cluster_state_create();
    const char *two_here[] = {"me", "me2"};
    put_instance(f4, "f1", "first4-m", two_here, 2);
    put_instance(f4, "f2", "first4-m", pair, 2);
    int rc = plan_compute(f4, "me", NULL, 0, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 2 && a[0].kind == PLAN_START && a[1].kind == PLAN_FAIL && a[1].cfg.layer_begin == 4 &&
              a[1].cfg.layer_end == 8 && strstr(a[1].reason, "layers 4..8"),
          "shard layers reach the lookup: rc %d n %zu", rc, n);
    free(a);
    cluster_state_release(f4);
    rc = plan_compute(s, "me", NULL, 0, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 3, "nothing held: 3 actions, got rc %d n %zu", rc, n);
    if (n == 3) {
        CHECK(a[0].kind == PLAN_START && !strcmp(a[0].runner_id, "i1-r0") &&
                  !strcmp(a[0].cfg.runner_id, "i1-r0") && !strcmp(a[0].cfg.instance_id, "i1") &&
                  !strcmp(a[0].cfg.model_path, "/models/m1.gguf") && a[0].cfg.layer_begin == 0 &&
                  a[0].cfg.layer_end == 4 && a[0].cfg.slots == RUNNER_DEFAULT_SLOTS,
              "start i1: kind %d %s %s %s %d..%d", a[0].kind, a[0].cfg.runner_id, a[0].cfg.instance_id,
              a[0].cfg.model_path, a[0].cfg.layer_begin, a[0].cfg.layer_end);
        CHECK(a[1].kind == PLAN_START && !strcmp(a[1].runner_id, "i2-r1") && a[1].cfg.layer_begin == 4 &&
                  a[1].cfg.layer_end == 8 && !strcmp(a[1].cfg.model_path, "/models/m2.gguf"),
              "start rank 1 of i2: %d %s %d..%d", a[1].kind, a[1].runner_id, a[1].cfg.layer_begin,
              a[1].cfg.layer_end);
        CHECK(a[2].kind == PLAN_FAIL && !strcmp(a[2].runner_id, "i4-r0") &&
                  strstr(a[2].reason, "missing-m4") && strstr(a[2].reason, "no file"),
              "unknown model fails with a reason: %d %s '%s'", a[2].kind, a[2].runner_id, a[2].reason);
    }
    free(a);

    /* Everything held: nothing to do. Extra runners: stopped; stopping ones left alone. */
    struct plan_runner held[] = {
        held_of("i1-r0", "i1", CLUSTER_RUNNER_READY),
        held_of("i2-r1", "i2", CLUSTER_RUNNER_LOADING),
        held_of("i4-r0", "i4", CLUSTER_RUNNER_FAILED),
    };
    rc = plan_compute(s, "me", held, 3, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 0 && !a, "all held: no actions, got %zu", n);
    free(a);

    cluster_state_del_instance(s, "i1");
    rc = plan_compute(s, "me", held, 3, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 1 && a[0].kind == PLAN_STOP && !strcmp(a[0].runner_id, "i1-r0") &&
              !strcmp(a[0].instance_id, "i1"),
          "deleted instance: stop its runner, n %zu kind %d", n, n ? (int)a[0].kind : -1);
    free(a);
    held[0].status = CLUSTER_RUNNER_SHUTTING_DOWN;
    rc = plan_compute(s, "me", held, 3, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 0, "a stopping runner is not stopped again: %zu", n);
    free(a);

    /* The shard moves to another node (same runner id): stop it here. */
    const char *moved[] = {"other", "third"};
    put_instance(s, "i2", "m2", moved, 2);
    rc = plan_compute(s, "me", held + 1, 2, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 1 && a[0].kind == PLAN_STOP && !strcmp(a[0].runner_id, "i2-r1"),
          "shard moved away: stop, n %zu", n);
    free(a);

    /* A node with nothing placed: nothing. */
    rc = plan_compute(s, "nobody", NULL, 0, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 0, "nothing placed on a node: %zu", n);
    free(a);
    CHECK(plan_compute(NULL, "me", NULL, 0, lookup, NULL, &a, &n) == CAIRN_EINVAL, "NULL state");
    cluster_state_release(s);
}

/* Applies actions the way the worker does: start adds it (Idle), fail adds it Failed,
 * stop marks a running one ShuttingDown and drops a failed one; stopping ones may end. */
static size_t apply_actions(struct plan_runner *held, size_t n, const struct plan_action *a, size_t na,
                            uint64_t *rng)
{
    for (size_t i = 0; i < na; i++) {
        if (a[i].kind == PLAN_START || a[i].kind == PLAN_FAIL) {
            held[n] = held_of(a[i].runner_id, a[i].instance_id,
                              a[i].kind == PLAN_START ? CLUSTER_RUNNER_IDLE : CLUSTER_RUNNER_FAILED);
            held[n++].epoch = a[i].cfg.epoch;
            continue;
        }
        for (size_t k = 0; k < n; k++)
            if (!strcmp(held[k].runner_id, a[i].runner_id)) {
                if (held[k].status == CLUSTER_RUNNER_FAILED) {
                    held[k] = held[--n];
                } else {
                    held[k].status = CLUSTER_RUNNER_SHUTTING_DOWN;
                }
                break;
            }
    }
    /* Some stopping runners end (the supervisor reports Shutdown and the id is free). */
    for (size_t k = 0; k < n;)
        if ((held[k].status == CLUSTER_RUNNER_SHUTTING_DOWN || held[k].status == CLUSTER_RUNNER_SHUTDOWN) &&
            test_rand_u64(rng) % 2)
            held[k] = held[--n];
        else
            k++;
    return n;
}

static size_t n_held_stopping(const struct plan_runner *held, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += held[i].status == CLUSTER_RUNNER_SHUTTING_DOWN || held[i].status == CLUSTER_RUNNER_SHUTDOWN;
    return k;
}

/* An instance moved to a new epoch (a rank failed): every rank held here that was
 * started for an older one stops, whatever its status, and starts again once gone with
 * the new epoch in its config; runners of other instances are left alone. */
static void test_epoch(void)
{
    struct cluster_state *s = cluster_state_create();
    const char *pair[] = {"me", "other"}, *here[] = {"me"};
    put_instance(s, "p", "m1", pair, 2);
    put_instance(s, "q", "m2", here, 1);
    struct cluster_instance *in = (struct cluster_instance *)cluster_state_find_instance(s, "p");
    in->epoch = 1;
    ((struct cluster_instance *)cluster_state_find_instance(s, "q"))->epoch = 1;
    struct plan_action *a = NULL;
    size_t n = 0;
    int rc = plan_compute(s, "me", NULL, 0, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 2 && a[0].kind == PLAN_START && a[0].cfg.epoch == 1 && a[0].cfg.rank == 0 &&
              a[0].cfg.world_size == 2,
          "first start carries epoch 1: n %zu epoch %lld", n, n ? (long long)a[0].cfg.epoch : -1LL);
    free(a);

    struct plan_runner held[] = {held_of("p-r0", "p", CLUSTER_RUNNER_READY), held_of("q-r0", "q", CLUSTER_RUNNER_READY)};
    held[0].epoch = held[1].epoch = 1;
    rc = plan_compute(s, "me", held, 2, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 0, "same epoch: nothing to do, %zu actions", n);
    free(a);

    in->epoch = 2;
    static const enum cluster_runner_status live[] = {CLUSTER_RUNNER_IDLE, CLUSTER_RUNNER_CONNECTING,
                                                      CLUSTER_RUNNER_LOADING, CLUSTER_RUNNER_WARMING_UP,
                                                      CLUSTER_RUNNER_READY, CLUSTER_RUNNER_RUNNING,
                                                      CLUSTER_RUNNER_FAILED};
    for (size_t i = 0; i < sizeof live / sizeof live[0]; i++) {
        held[0].status = live[i];
        rc = plan_compute(s, "me", held, 2, lookup, NULL, &a, &n);
        CHECK(rc == 0 && n == 1 && a[0].kind == PLAN_STOP && !strcmp(a[0].runner_id, "p-r0"),
              "epoch 1 runner (%s) of an epoch 2 instance: stopped, n %zu kind %d",
              cluster_runner_status_name(live[i]), n, n ? (int)a[0].kind : -1);
        free(a);
    }
    held[0].status = CLUSTER_RUNNER_SHUTTING_DOWN;
    rc = plan_compute(s, "me", held, 2, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 0, "stopping for the new epoch: nothing until it is gone, %zu", n);
    free(a);
    rc = plan_compute(s, "me", held + 1, 1, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 1 && a[0].kind == PLAN_START && !strcmp(a[0].runner_id, "p-r0") && a[0].cfg.epoch == 2 &&
              a[0].cfg.layer_begin == 0 && a[0].cfg.layer_end == 4,
          "gone: started again with epoch 2, n %zu epoch %lld", n, n ? (long long)a[0].cfg.epoch : -1LL);
    free(a);
    held[0].status = CLUSTER_RUNNER_CONNECTING;
    held[0].epoch = 2;
    rc = plan_compute(s, "me", held, 2, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 0, "the new epoch's runner stays, %zu", n);
    free(a);

    /* A shard that cannot start gets the instance's epoch with its failure. */
    put_instance(s, "r", "missing-m3", pair, 2);
    ((struct cluster_instance *)cluster_state_find_instance(s, "r"))->epoch = 5;
    rc = plan_compute(s, "me", held, 2, lookup, NULL, &a, &n);
    CHECK(rc == 0 && n == 1 && a[0].kind == PLAN_FAIL && a[0].cfg.epoch == 5, "fail with epoch 5: n %zu", n);
    free(a);
    cluster_state_release(s);
}

static void test_random(void)
{
    uint64_t rng = 12345;
    const char *nodes[] = {"me", "n1", "n2"};
    int fixed = 0, rounds = 300;
    for (int round = 0; round < rounds; round++) {
        struct cluster_state *s = cluster_state_create();
        size_t n_inst = test_rand_u64(&rng) % 6;
        for (size_t i = 0; i < n_inst; i++) {
            char id[16], model[32];
            snprintf(id, sizeof id, "i%zu", i);
            snprintf(model, sizeof model, "%sm%zu", test_rand_u64(&rng) % 5 ? "" : "missing-", i);
            size_t ns = 1 + test_rand_u64(&rng) % 3;
            const char *on[3];
            size_t first = test_rand_u64(&rng) % 3;
            for (size_t k = 0; k < ns; k++)
                on[k] = nodes[(first + k) % 3];
            put_instance(s, id, model, on, ns);
            ((struct cluster_instance *)cluster_state_find_instance(s, id))->epoch = 1 + (int64_t)(test_rand_u64(&rng) % 3);
        }
        /* A held set: some right, some stale (instances that no longer exist). */
        struct plan_runner held[64];
        size_t n = 0;
        size_t n_stale = test_rand_u64(&rng) % 4;
        for (size_t k = 0; k < n_stale; k++) {
            char rid[32], iid[16];
            snprintf(iid, sizeof iid, "i%zu", 6 + k);
            snprintf(rid, sizeof rid, "%s-r0", iid);
            held[n++] = held_of(rid, iid, (enum cluster_runner_status)(test_rand_u64(&rng) % CLUSTER_RUNNER_STATUS_COUNT));
        }
        /* And some of this node's shards held for an epoch that may be older. */
        for (size_t i = 0; i < s->n_instances; i++)
            for (size_t k = 0; k < s->instances[i].n_shards; k++)
                if (!strcmp(s->instances[i].shards[k].node_id, "me") && test_rand_u64(&rng) % 2) {
                    held[n] = held_of(s->instances[i].shards[k].runner_id, s->instances[i].id, CLUSTER_RUNNER_READY);
                    held[n++].epoch = 1 + (int64_t)(test_rand_u64(&rng) % 3);
                }
        struct plan_action *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        int steps = 0;
        for (; steps < 64; steps++) {
            int rc = plan_compute(s, "me", held, n, lookup, NULL, &a, &na);
            int rc2 = plan_compute(s, "me", held, n, lookup, NULL, &b, &nb);
            bool same = rc == 0 && rc2 == 0 && na == nb;
            for (size_t i = 0; same && i < na; i++)
                same = a[i].kind == b[i].kind && !strcmp(a[i].runner_id, b[i].runner_id);
            CHECK(same, "round %d step %d: deterministic (%zu vs %zu actions)", round, steps, na, nb);
            free(b);
            /* Never start a runner twice or start one that is held. */
            for (size_t i = 0; i < na; i++)
                if (a[i].kind != PLAN_STOP)
                    for (size_t k = 0; k < n; k++)
                        if (!strcmp(held[k].runner_id, a[i].runner_id))
                            CHECK(0, "round %d: starts held runner %s", round, a[i].runner_id);
            if (na == 0 && n_held_stopping(held, n) == 0) {
                free(a);
                break;
            }
            n = apply_actions(held, n, a, na, &rng);
            free(a);
        }
        if (steps < 64)
            fixed++;
        /* At the fixed point: every shard on "me" is held, and every held runner has one. */
        for (size_t i = 0; i < s->n_instances; i++)
            for (size_t k = 0; k < s->instances[i].n_shards; k++) {
                const struct cluster_shard *sh = &s->instances[i].shards[k];
                if (strcmp(sh->node_id, "me"))
                    continue;
                bool found = false;
                for (size_t h = 0; h < n; h++)
                    found = found || (!strcmp(held[h].runner_id, sh->runner_id) &&
                                      held[h].epoch == s->instances[i].epoch);
                CHECK(found, "round %d: shard %s held at its instance's epoch", round, sh->runner_id);
            }
        CHECK(n <= 64, "round %d: held set bounded (%zu)", round, n);
        cluster_state_release(s);
    }
    CHECK(fixed == rounds, "every round reached a fixed point: %d of %d", fixed, rounds);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_hand);
    RUN(test_epoch);
    RUN(test_random);
    return test_main_end();
}
