/* The master moves a pipelined instance to a new epoch when one of its ranks that served
 * at the instance's epoch reports Failed or a restart: one InstanceEpochAdvanced to the
 * next epoch, none for the other ranks' later reports of the same break, none for a rank that fails before it
 * served, for a rank of an older epoch, for a single-node instance, or for reports that
 * change nothing. Events are applied as the node would. */
#include "ctl/master.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "testutil.h"

static char err[1024];

static void apply_all(struct cluster_state *s, struct master_events *evs)
{
    for (size_t i = 0; i < evs->n; i++) {
        evs->ev[i].term = s->last_term;
        evs->ev[i].index = s->last_index + 1;
        int rc = cluster_apply(s, &evs->ev[i], err, sizeof err);
        CHECK(rc == 0, "apply %s: %s", event_kind_name((int)evs->ev[i].kind), err);
    }
}

/* Instance id with n shards on nodes a, b, c... (runner ids "<id>-r<rank>"), epoch 1. */
static void put_instance(struct cluster_state *s, const char *id, size_t n)
{
    struct cluster_instance in = {0};
    snprintf(in.id, sizeof in.id, "%s", id);
    snprintf(in.model_id, sizeof in.model_id, "m");
    in.shards = calloc(n, sizeof *in.shards);
    in.n_shards = n;
    in.epoch = 1;
    in.num_draft_tokens = 4;
    for (size_t i = 0; i < n; i++) {
        struct cluster_shard *sh = &in.shards[i];
        snprintf(sh->node_id, sizeof sh->node_id, "%c", (char)('a' + i));
        snprintf(sh->runner_id, sizeof sh->runner_id, "%s-r%zu", id, i);
        sh->rank = (int)i;
        sh->world_size = (int)n;
        sh->layer_begin = (int)i * 2;
        sh->layer_end = (int)i * 2 + 2;
    }
    CHECK(cluster_state_put_instance(s, &in) == 0, "put instance %s", id);
}

/* Node's report of one runner; returns the events made (applied to s). */
static size_t report(struct cluster_state *s, const char *node, const char *runner, const char *instance,
                     const char *status, int restarts, int64_t epoch, struct master_events *evs)
{
    master_events_clear(evs);
    json_t *r = json_pack("{s:s, s:s, s:s, s:s, s:o, s:i, s:I}", "runner_id", runner, "instance_id", instance,
                          "node_id", node, "status", status, "error",
                          strcmp(status, "Failed") ? json_null() : json_string("killed by signal 9"),
                          "restart_count", restarts, "epoch", (json_int_t)epoch);
    json_t *rep = json_pack("{s:s, s:n, s:[o], s:n}", "node_id", node, "info", "runners", r, "edges");
    int rc = master_report_events(s, node, rep, 1000, evs, err, sizeof err);
    CHECK(rc == 0, "report of %s %s: %s", runner, status, err);
    json_decref(rep);
    apply_all(s, evs);
    return evs->n;
}

static size_t n_advances(const struct master_events *evs, int64_t *epoch)
{
    size_t k = 0;
    for (size_t i = 0; i < evs->n; i++)
        if (evs->ev[i].kind == EVENT_INSTANCE_EPOCH_ADVANCED) {
            k++;
            *epoch = evs->ev[i].instance_epoch_advanced.epoch;
        }
    return k;
}

static int64_t epoch_of(const struct cluster_state *s, const char *id)
{
    const struct cluster_instance *in = cluster_state_find_instance(s, id);
    return in ? in->epoch : -1;
}

static void test_epochs(void)
{
    struct cluster_state *s = cluster_state_create();
    s->last_term = 1;
    put_instance(s, "p", 2);
    put_instance(s, "q", 1);
    struct master_events evs = {0};
    int64_t e = 0;

    /* Starting up: no rank served yet, failures and restarts leave the epoch. */
    report(s, "a", "p-r0", "p", "Loading", 0, 1, &evs);
    report(s, "b", "p-r1", "p", "Connecting", 0, 1, &evs);
    report(s, "b", "p-r1", "p", "Failed", 0, 1, &evs);
    CHECK(n_advances(&evs, &e) == 0, "a rank failing before it served: no new epoch");
    report(s, "b", "p-r1", "p", "Loading", 1, 1, &evs);
    CHECK(n_advances(&evs, &e) == 0 && epoch_of(s, "p") == 1, "its restart: epoch stays 1");

    /* Both serve; the same report again makes nothing. */
    report(s, "a", "p-r0", "p", "Ready", 0, 1, &evs);
    report(s, "b", "p-r1", "p", "Ready", 1, 1, &evs);
    CHECK(report(s, "b", "p-r1", "p", "Ready", 1, 1, &evs) == 0, "same report: no event (%zu)", evs.n);

    /* Rank 1 killed: Failed at the instance's epoch -> epoch 2, with its status. */
    size_t n = report(s, "b", "p-r1", "p", "Failed", 1, 1, &evs);
    CHECK(n == 2 && evs.ev[0].kind == EVENT_RUNNER_STATUS_UPDATED && n_advances(&evs, &e) == 1 && e == 2 &&
              !strcmp(evs.ev[1].instance_epoch_advanced.instance_id, "p"),
          "a serving rank fails: RunnerStatusUpdated and InstanceEpochAdvanced to 2 (%zu events, epoch %lld)", n,
          (long long)e);
    CHECK(epoch_of(s, "p") == 2, "instance p at epoch 2: %lld", (long long)epoch_of(s, "p"));
    /* Rank 0 notices the broken link a moment later: an old epoch's failure, no more. */
    report(s, "a", "p-r0", "p", "Failed", 0, 1, &evs);
    CHECK(n_advances(&evs, &e) == 0 && epoch_of(s, "p") == 2, "rank 0's failure at epoch 1: still 2");
    report(s, "a", "p-r0", "p", "Idle", 1, 1, &evs);
    CHECK(n_advances(&evs, &e) == 0, "a restart of epoch 1: nothing");

    /* The ranks come back at epoch 2 and serve; then rank 0 restarts without a Failed
     * report seen (its restart count moved): epoch 3. */
    report(s, "a", "p-r0", "p", "Connecting", 0, 2, &evs);
    report(s, "b", "p-r1", "p", "Connecting", 0, 2, &evs);
    CHECK(n_advances(&evs, &e) == 0, "new-epoch ranks starting: nothing");
    report(s, "a", "p-r0", "p", "Ready", 0, 2, &evs);
    report(s, "b", "p-r1", "p", "Ready", 0, 2, &evs);
    report(s, "a", "p-r0", "p", "Loading", 1, 2, &evs);
    CHECK(n_advances(&evs, &e) == 1 && e == 3 && epoch_of(s, "p") == 3, "a restart of a serving rank: epoch 3");

    /* A single-node instance never changes epoch. */
    report(s, "a", "q-r0", "q", "Ready", 0, 1, &evs);
    report(s, "a", "q-r0", "q", "Failed", 0, 1, &evs);
    CHECK(n_advances(&evs, &e) == 0 && epoch_of(s, "q") == 1, "single node: no epoch");

    /* A runner of an instance that is gone: nothing. */
    report(s, "c", "x-r0", "x", "Ready", 0, 1, &evs);
    report(s, "c", "x-r0", "x", "Failed", 0, 1, &evs);
    CHECK(n_advances(&evs, &e) == 0, "unknown instance: no epoch");

    master_events_clear(&evs);
    cluster_state_release(s);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_epochs);
    return test_main_end();
}
