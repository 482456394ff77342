/* cluster_apply: a hand-written history replayed to known states; the effect of each
 * kind; the position rules (gaps, stale terms, new terms) leaving a refused state
 * byte-identical; and thousands of seeded random events checked for determinism, state
 * JSON round trips and snapshot + replay == full replay. With CAIRN_BENCH=1 it only
 * times cluster_apply over CAIRN_BENCH_EVENTS (1000000) random events and prints
 * "figure: apply N events/s" (bench/cluster.sh); the normal run times 5000. */
#include "ctl/event.h"

#include "base/err.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- helpers ---- */

static char *dq(const char *s)
{
    char *d = strdup(s);
    for (char *p = d; *p; p++)
        if (*p == '\'')
            *p = '"';
    return d;
}

static char *canon(const char *text)
{
    json_error_t je;
    char *d = dq(text);
    json_t *j = json_loads(d, 0, &je);
    free(d);
    if (!j) {
        fprintf(stderr, "bad test JSON: %s at %d: %s\n", je.text, je.column, text);
        return strdup("");
    }
    char *out = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return out;
}

/* Decodes an event written in ' notation and applies it; returns cluster_apply's code. */
static int apply_text(struct cluster_state *s, const char *text, char *err, size_t errlen)
{
    char *d = dq(text);
    struct event e;
    int rc = event_from_json(d, strlen(d), &e, err, errlen);
    free(d);
    if (rc) {
        fprintf(stderr, "bad test event (%s): %s\n", err, text);
        return rc;
    }
    rc = cluster_apply(s, &e, err, errlen);
    event_clear(&e);
    return rc;
}

#define APPLY_OK(s, text)                                                                \
    do {                                                                                 \
        char err_[512] = "";                                                             \
        int rc_ = apply_text(s, text, err_, sizeof err_);                                \
        CHECK(rc_ == 0, "apply %s: rc %d: %s", text, rc_, err_);                         \
    } while (0)

static void check_state(const struct cluster_state *s, const char *want_text, const char *what)
{
    char *want = canon(want_text);
    char *got = cluster_state_to_json(s);
    CHECK(got && strcmp(got, want) == 0, "%s\n got  %s\n want %s", what, got ? got : "(null)",
          want);
    free(got);
    free(want);
}

static struct cluster_state *fresh(void)
{
    struct cluster_state *s = cluster_state_create();
    char err[256];
    CHECK(s != NULL, "create");
    /* A log starts with a snapshot: here, of an empty state. */
    struct event e;
    event_init(&e, EVENT_STATE_SNAPSHOT, 1, 0);
    e.state_snapshot.state = cluster_state_create();
    CHECK(cluster_apply(s, &e, err, sizeof err) == 0, "first snapshot: %s", err);
    event_clear(&e);
    return s;
}

#define INFO(mem)                                                                          \
    "{'memory_total_bytes':" #mem ",'memory_available_bytes':1000,'disk_free_bytes':5,"    \
    "'disk_total_bytes':9,'cpu_model':'cpu','cpu_cores':4,'isa':'avx2','os':'Linux',"      \
    "'hostname':'h','interfaces':[],'api_port':52415,'cluster_port':52416}"

/* ---- a hand-written history ---- */

static void test_history(void)
{
    struct cluster_state *s = cluster_state_create();
    check_state(s, "{'last_applied':{'term':0,'index':0},'master':{'node_id':null,'term':0},"
                   "'nodes':{},'edges':[],'instances':{},'runners':{},'tasks':{},'downloads':[]}",
                "empty state");
    APPLY_OK(s, "{'kind':'StateSnapshot','term':1,'index':0,'state':{'last_applied':{'term':0,"
                "'index':0},'master':{'node_id':null,'term':0},'nodes':{},'edges':[],"
                "'instances':{},'runners':{},'tasks':{},'downloads':[]}}");
    APPLY_OK(s, "{'kind':'MasterElected','term':1,'index':1,'node_id':'n1'}");
    APPLY_OK(s, "{'kind':'NodeGatheredInfo','term':1,'index':2,'node_id':'n1','when_ms':1000,"
                "'info':" INFO(8000) "}");
    APPLY_OK(s, "{'kind':'NodeGatheredInfo','term':1,'index':3,'node_id':'n2','when_ms':1001,"
                "'info':" INFO(9000) "}");
    APPLY_OK(s, "{'kind':'TopologyEdgeCreated','term':1,'index':4,'from':'n2','to':'n1',"
                "'rtt_us':300,'throughput_bytes_per_s':100}");
    APPLY_OK(s, "{'kind':'TopologyEdgeCreated','term':1,'index':5,'from':'n1','to':'n2',"
                "'rtt_us':250,'throughput_bytes_per_s':100}");
    APPLY_OK(s, "{'kind':'InstanceCreated','term':1,'index':6,'instance':{'instance_id':'i1',"
                "'model_id':'m1','sharding':'pipeline','shards':[{'node_id':'n1',"
                "'runner_id':'r1','rank':0,'world_size':2,'layer_begin':0,'layer_end':10},"
                "{'node_id':'n2','runner_id':'r2','rank':1,'world_size':2,'layer_begin':10,"
                "'layer_end':22}],'draft_model':null,'num_draft_tokens':4,'epoch':0}}");
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':7,'runner_id':'r1',"
                "'instance_id':'i1','node_id':'n1','status':'Loading','error':null,"
                "'restart_count':0}");
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':8,'runner_id':'r2',"
                "'instance_id':'i1','node_id':'n2','status':'Ready','error':null,"
                "'restart_count':0}");
    APPLY_OK(s, "{'kind':'NodeDownloadProgress','term':1,'index':9,'node_id':'n2',"
                "'model_id':'m1','bytes_done':50,'bytes_total':100,'bytes_per_s':20,'status':'Ongoing',"
                "'error':null}");
    APPLY_OK(s, "{'kind':'TaskCreated','term':1,'index':10,'task_id':'t1',"
                "'task_kind':'TextGeneration','instance_id':'i1','node_id':'n1',"
                "'bytes':15}");
    APPLY_OK(s, "{'kind':'TaskAcknowledged','term':1,'index':11,'task_id':'t1'}");
    APPLY_OK(s, "{'kind':'TaskStatusUpdated','term':1,'index':12,'task_id':'t1',"
                "'status':'Running','error':null}");
    APPLY_OK(s, "{'kind':'InstanceDraftModelUpdated','term':1,'index':13,'instance_id':'i1',"
                "'draft_model':'m1-draft','num_draft_tokens':6}");
    APPLY_OK(s, "{'kind':'TaskAcknowledged','term':1,'index':14,'task_id':'t1'}");
    check_state(s,
                "{'last_applied':{'term':1,'index':14},'master':{'node_id':'n1','term':1},"
                "'nodes':{'n1':{'node_id':'n1','last_seen_ms':1000,'info':" INFO(8000) "},"
                "'n2':{'node_id':'n2','last_seen_ms':1001,'info':" INFO(9000) "}},"
                "'edges':[{'from':'n1','to':'n2','rtt_us':250,'throughput_bytes_per_s':100},"
                "{'from':'n2','to':'n1','rtt_us':300,'throughput_bytes_per_s':100}],"
                "'instances':{'i1':{'instance_id':'i1','model_id':'m1','sharding':'pipeline',"
                "'shards':[{'node_id':'n1','runner_id':'r1','rank':0,'world_size':2,"
                "'layer_begin':0,'layer_end':10},{'node_id':'n2','runner_id':'r2','rank':1,"
                "'world_size':2,'layer_begin':10,'layer_end':22}],'draft_model':'m1-draft',"
                "'num_draft_tokens':6,'epoch':0}},"
                "'runners':{'r1':{'runner_id':'r1','instance_id':'i1','node_id':'n1',"
                "'status':'Loading','error':null,'restart_count':0},'r2':{'runner_id':'r2',"
                "'instance_id':'i1','node_id':'n2','status':'Ready','error':null,"
                "'restart_count':0}},"
                "'tasks':{'t1':{'task_id':'t1','kind':'TextGeneration','instance_id':'i1',"
                "'node_id':'n1','status':'Running','acknowledged':true,'error':null,"
                "'bytes':15}},"
                "'downloads':[{'node_id':'n2','model_id':'m1','bytes_done':50,"
                "'bytes_total':100,'bytes_per_s':20,'eta_s':3,'status':'Ongoing','error':null}]}",
                "after 14 events");

    /* A finished task of i1 stays as it is when i1 goes. */
    APPLY_OK(s, "{'kind':'TaskCreated','term':1,'index':15,'task_id':'t2',"
                "'task_kind':'TextGeneration','instance_id':'i1','node_id':'n2','bytes':2}");
    APPLY_OK(s, "{'kind':'TaskStatusUpdated','term':1,'index':16,'task_id':'t2',"
                "'status':'Complete','error':null}");

    /* A runner on n2 that serves no known instance, and one on n1 that does not serve i1. */
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':17,'runner_id':'r7',"
                "'instance_id':'i7','node_id':'n2','status':'ShuttingDown','error':null,"
                "'restart_count':0}");
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':18,'runner_id':'r8',"
                "'instance_id':'i8','node_id':'n1','status':'Idle','error':null,"
                "'restart_count':0}");

    /* n2 goes quiet: it leaves with its edges, its download, its runners and instance
     * i1, whose runners go too (r1 lives on n1 but serves i1); t1 fails. */
    APPLY_OK(s, "{'kind':'NodeTimedOut','term':1,'index':19,'node_id':'n2'}");
    check_state(s,
                "{'last_applied':{'term':1,'index':19},'master':{'node_id':'n1','term':1},"
                "'nodes':{'n1':{'node_id':'n1','last_seen_ms':1000,'info':" INFO(8000) "}},"
                "'edges':[],'instances':{},'runners':{'r8':{'runner_id':'r8',"
                "'instance_id':'i8','node_id':'n1','status':'Idle','error':null,"
                "'restart_count':0}},"
                "'tasks':{'t1':{'task_id':'t1','kind':'TextGeneration','instance_id':'i1',"
                "'node_id':'n1','status':'Failed','acknowledged':true,"
                "'error':'node n2 timed out','bytes':15},"
                "'t2':{'task_id':'t2','kind':'TextGeneration','instance_id':'i1',"
                "'node_id':'n2','status':'Complete','acknowledged':false,'error':null,"
                "'bytes':2}},'downloads':[]}",
                "after NodeTimedOut");
    APPLY_OK(s, "{'kind':'TaskDeleted','term':1,'index':20,'task_id':'t1'}");
    CHECK(s->n_tasks == 1 && cluster_state_find_task(s, "t2"), "task t1 deleted");
    cluster_state_release(s);
}

/* ---- the effect of each kind ---- */

static void test_kinds(void)
{
    struct cluster_state *s = fresh();
    char err[512];

    /* A worker's report of a runner the state does not know creates it. */
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':1,'runner_id':'r9',"
                "'instance_id':'i9','node_id':'n9','status':'Running','error':null,"
                "'restart_count':3}");
    const struct cluster_runner *r = cluster_state_find_runner(s, "r9");
    CHECK(r && r->status == CLUSTER_RUNNER_RUNNING && r->restart_count == 3 &&
              strcmp(r->node_id, "n9") == 0,
          "runner r9 created");
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':2,'runner_id':'r9',"
                "'instance_id':'i9','node_id':'n9','status':'Failed','error':'segfault',"
                "'restart_count':3}");
    r = cluster_state_find_runner(s, "r9");
    CHECK(r && r->status == CLUSTER_RUNNER_FAILED && r->error && !strcmp(r->error, "segfault"),
          "runner r9 failed");
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':3,'runner_id':'r9',"
                "'instance_id':'i9','node_id':'n9','status':'Idle','error':null,"
                "'restart_count':4}");
    r = cluster_state_find_runner(s, "r9");
    CHECK(r && r->status == CLUSTER_RUNNER_IDLE && !r->error && r->restart_count == 4,
          "restart clears the error");
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':4,'runner_id':'r9',"
                "'instance_id':'i9','node_id':'n9','status':'Shutdown','error':null,"
                "'restart_count':4}");
    CHECK(!cluster_state_find_runner(s, "r9"), "Shutdown removes the runner");
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':5,'runner_id':'r8',"
                "'instance_id':'i9','node_id':'n9','status':'Ready','error':null,"
                "'restart_count':0}");
    APPLY_OK(s, "{'kind':'RunnerDeleted','term':1,'index':6,'runner_id':'r8'}");
    CHECK(s->n_runners == 0, "RunnerDeleted");

    /* InstanceDeleted keeps the runners: their workers report them shutting down. */
    APPLY_OK(s, "{'kind':'InstanceCreated','term':1,'index':7,'instance':{'instance_id':'i1',"
                "'model_id':'m1','sharding':'tensor','shards':[{'node_id':'n1',"
                "'runner_id':'r1','rank':0,'world_size':1,'layer_begin':0,'layer_end':4}],"
                "'draft_model':null,'num_draft_tokens':4,'epoch':7}}");
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':8,'runner_id':'r1',"
                "'instance_id':'i1','node_id':'n1','status':'Ready','error':null,"
                "'restart_count':0}");
    const struct cluster_instance *in = cluster_state_find_instance(s, "i1");
    CHECK(in && in->sharding == CLUSTER_SHARDING_TENSOR && in->epoch == 7 && in->n_shards == 1,
          "instance i1");
    APPLY_OK(s, "{'kind':'InstanceDeleted','term':1,'index':9,'instance_id':'i1'}");
    CHECK(!cluster_state_find_instance(s, "i1") && cluster_state_find_runner(s, "r1"),
          "InstanceDeleted keeps runner r1");

    /* Updates of what is absent change nothing but the position. */
    char *before = cluster_state_to_json(s);
    APPLY_OK(s, "{'kind':'TaskStatusUpdated','term':1,'index':10,'task_id':'nope',"
                "'status':'Complete','error':null}");
    APPLY_OK(s, "{'kind':'TaskAcknowledged','term':1,'index':11,'task_id':'nope'}");
    APPLY_OK(s, "{'kind':'InstanceDraftModelUpdated','term':1,'index':12,'instance_id':'nope',"
                "'draft_model':null,'num_draft_tokens':0}");
    APPLY_OK(s, "{'kind':'TopologyEdgeDeleted','term':1,'index':13,'from':'a','to':'b'}");
    APPLY_OK(s, "{'kind':'NodeTimedOut','term':1,'index':14,'node_id':'nope'}");
    APPLY_OK(s, "{'kind':'TaskDeleted','term':1,'index':15,'task_id':'nope'}");
    CHECK(s->last_index == 15, "position advanced to %lld", (long long)s->last_index);
    s->last_index = 9; /* compare everything else */
    char *after = cluster_state_to_json(s);
    s->last_index = 15;
    CHECK(before && after && strcmp(before, after) == 0, "no-ops changed the state\n %s\n %s",
          before, after);
    free(before);
    free(after);

    /* Edge refresh replaces the measurement; TopologyEdgeDeleted removes one direction. */
    APPLY_OK(s, "{'kind':'TopologyEdgeCreated','term':1,'index':16,'from':'a','to':'b',"
                "'rtt_us':10,'throughput_bytes_per_s':1}");
    APPLY_OK(s, "{'kind':'TopologyEdgeCreated','term':1,'index':17,'from':'b','to':'a',"
                "'rtt_us':10,'throughput_bytes_per_s':1}");
    APPLY_OK(s, "{'kind':'TopologyEdgeCreated','term':1,'index':18,'from':'a','to':'b',"
                "'rtt_us':20,'throughput_bytes_per_s':2}");
    const struct cluster_edge *ed = cluster_state_find_edge(s, "a", "b");
    CHECK(s->n_edges == 2 && ed && ed->rtt_us == 20 && ed->throughput == 2, "edge refreshed");
    APPLY_OK(s, "{'kind':'TopologyEdgeDeleted','term':1,'index':19,'from':'a','to':'b'}");
    CHECK(s->n_edges == 1 && cluster_state_find_edge(s, "b", "a"), "one direction left");

    /* Downloads: one entry per (node, model), replaced by progress. */
    APPLY_OK(s, "{'kind':'NodeDownloadProgress','term':1,'index':20,'node_id':'n1',"
                "'model_id':'m1','bytes_done':0,'bytes_total':10,'status':'Pending','error':null}");
    APPLY_OK(s, "{'kind':'NodeDownloadProgress','term':1,'index':21,'node_id':'n1',"
                "'model_id':'m1','bytes_done':10,'bytes_total':10,'status':'Completed',"
                "'error':null}");
    APPLY_OK(s, "{'kind':'NodeDownloadProgress','term':1,'index':22,'node_id':'n1',"
                "'model_id':'m2','bytes_done':3,'bytes_total':10,'status':'Failed',"
                "'error':'peer gone'}");
    const struct cluster_download *d = cluster_state_find_download(s, "n1", "m1");
    CHECK(s->n_downloads == 2 && d && d->status == CLUSTER_DOWNLOAD_COMPLETED, "downloads");

    /* A task failing carries its error; another status clears it. */
    APPLY_OK(s, "{'kind':'TaskCreated','term':1,'index':23,'task_id':'t1',"
                "'task_kind':'TextGeneration','instance_id':'i1','node_id':'n1','bytes':2}");
    const struct cluster_task *t = cluster_state_find_task(s, "t1");
    CHECK(t && t->status == CLUSTER_TASK_PENDING && !t->acknowledged && !t->error &&
              t->bytes == 2,
          "new task");
    APPLY_OK(s, "{'kind':'TaskStatusUpdated','term':1,'index':24,'task_id':'t1',"
                "'status':'Failed','error':'no runner'}");
    t = cluster_state_find_task(s, "t1");
    CHECK(t && t->status == CLUSTER_TASK_FAILED && t->error && !strcmp(t->error, "no runner"),
          "task failed");
    APPLY_OK(s, "{'kind':'TaskStatusUpdated','term':1,'index':25,'task_id':'t1',"
                "'status':'Cancelled','error':null}");
    t = cluster_state_find_task(s, "t1");
    CHECK(t && t->status == CLUSTER_TASK_CANCELLED && !t->error && !t->acknowledged,
          "task cancelled");

    /* MasterElected takes the event's term. */
    APPLY_OK(s, "{'kind':'MasterElected','term':1,'index':26,'node_id':'n7'}");
    CHECK(!strcmp(s->master_node_id, "n7") && s->master_term == 1, "master n7");

    /* An error reported with a status other than Failed (only an event built in C can
     * say so) is dropped. */
    struct event e;
    event_init(&e, EVENT_RUNNER_STATUS_UPDATED, 1, 27);
    snprintf(e.runner_status_updated.id, sizeof e.runner_status_updated.id, "r5");
    snprintf(e.runner_status_updated.instance_id, sizeof e.runner_status_updated.instance_id, "i");
    snprintf(e.runner_status_updated.node_id, sizeof e.runner_status_updated.node_id, "n");
    e.runner_status_updated.status = CLUSTER_RUNNER_READY;
    e.runner_status_updated.error = strdup("stale");
    CHECK(cluster_apply(s, &e, err, sizeof err) == 0, "%s", err);
    r = cluster_state_find_runner(s, "r5");
    CHECK(r && r->status == CLUSTER_RUNNER_READY && !r->error, "error kept with Ready");
    event_clear(&e);

    /* An event with an impossible position built in C. */
    event_init(&e, EVENT_TASK_DELETED, 0, 28);
    snprintf(e.task_deleted.task_id, sizeof e.task_deleted.task_id, "t1");
    CHECK(cluster_apply(s, &e, err, sizeof err) == CAIRN_EINVAL, "term 0: %s", err);
    cluster_state_release(s);
}

/* InstanceEpochAdvanced raises an instance's epoch and nothing else; epochs never go
 * back, and an unknown instance is a no-op. Runners carry the epoch they started for. */
static void test_epoch(void)
{
    struct cluster_state *s = fresh();
    APPLY_OK(s, "{'kind':'InstanceCreated','term':1,'index':1,'instance':{'instance_id':'i1',"
                "'model_id':'m1','sharding':'pipeline','shards':[{'node_id':'n1','runner_id':'r1',"
                "'rank':0,'world_size':2,'layer_begin':0,'layer_end':2},{'node_id':'n2',"
                "'runner_id':'r2','rank':1,'world_size':2,'layer_begin':2,'layer_end':4}],"
                "'draft_model':null,'num_draft_tokens':4,'epoch':1}}");
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':2,'runner_id':'r1',"
                "'instance_id':'i1','node_id':'n1','status':'Ready','error':null,"
                "'restart_count':0,'data_port':4100,'epoch':1}");
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':3,'runner_id':'r2',"
                "'instance_id':'i1','node_id':'n2','status':'Failed','error':'killed',"
                "'restart_count':0,'epoch':1}");
    const struct cluster_runner *r = cluster_state_find_runner(s, "r1");
    CHECK(r && r->epoch == 1 && r->data_port == 4100, "runner r1 at epoch 1");
    APPLY_OK(s, "{'kind':'InstanceEpochAdvanced','term':1,'index':4,'instance_id':'i1','epoch':2}");
    const struct cluster_instance *in = cluster_state_find_instance(s, "i1");
    CHECK(in && in->epoch == 2, "epoch 2, got %lld", in ? (long long)in->epoch : -1LL);
    check_state(s,
                "{'last_applied':{'term':1,'index':4},'master':{'node_id':null,'term':0},'nodes':{},"
                "'edges':[],'instances':{'i1':{'instance_id':'i1','model_id':'m1','sharding':'pipeline',"
                "'shards':[{'node_id':'n1','runner_id':'r1','rank':0,'world_size':2,'layer_begin':0,"
                "'layer_end':2},{'node_id':'n2','runner_id':'r2','rank':1,'world_size':2,'layer_begin':2,"
                "'layer_end':4}],'draft_model':null,'num_draft_tokens':4,'epoch':2}},"
                "'runners':{'r1':{'runner_id':'r1','instance_id':'i1','node_id':'n1','status':'Ready',"
                "'error':null,'restart_count':0,'data_port':4100,'epoch':1},'r2':{'runner_id':'r2',"
                "'instance_id':'i1','node_id':'n2','status':'Failed','error':'killed','restart_count':0,"
                "'epoch':1}},'tasks':{},'downloads':[]}",
                "only the instance's epoch moved; runners keep theirs");
    /* The same epoch again, an older one, an unknown instance: only the position moves. */
    char *before = cluster_state_to_json(s);
    APPLY_OK(s, "{'kind':'InstanceEpochAdvanced','term':1,'index':5,'instance_id':'i1','epoch':2}");
    APPLY_OK(s, "{'kind':'InstanceEpochAdvanced','term':1,'index':6,'instance_id':'i1','epoch':1}");
    APPLY_OK(s, "{'kind':'InstanceEpochAdvanced','term':1,'index':7,'instance_id':'i9','epoch':9}");
    s->last_index = 4;
    char *after = cluster_state_to_json(s);
    s->last_index = 7;
    CHECK(before && after && !strcmp(before, after), "no-op epochs changed the state\n %s\n %s", before, after);
    free(before);
    free(after);
    APPLY_OK(s, "{'kind':'InstanceEpochAdvanced','term':1,'index':8,'instance_id':'i1','epoch':5}");
    in = cluster_state_find_instance(s, "i1");
    CHECK(in && in->epoch == 5, "a jump to epoch 5: %lld", in ? (long long)in->epoch : -1LL);
    /* A runner reported again at the new epoch. */
    APPLY_OK(s, "{'kind':'RunnerStatusUpdated','term':1,'index':9,'runner_id':'r2',"
                "'instance_id':'i1','node_id':'n2','status':'Connecting','error':null,"
                "'restart_count':0,'data_port':4200,'epoch':5}");
    r = cluster_state_find_runner(s, "r2");
    CHECK(r && r->epoch == 5 && r->status == CLUSTER_RUNNER_CONNECTING && !r->error, "r2 at epoch 5");
    cluster_state_release(s);
}

/* ---- position rules ---- */

static void expect_refused(struct cluster_state *s, const char *text, int code, const char *want)
{
    char *before = cluster_state_to_json(s);
    char err[512] = "";
    int rc = apply_text(s, text, err, sizeof err);
    CHECK(rc == code, "%s: rc %d, want %d (%s)", text, rc, code, err);
    CHECK(strstr(err, want) != NULL, "%s: message \"%s\" lacks \"%s\"", text, err, want);
    char *after = cluster_state_to_json(s);
    CHECK(before && after && strcmp(before, after) == 0, "%s changed the state", text);
    free(before);
    free(after);
}

#define EMPTY_STATE                                                                          \
    "{'last_applied':{'term':0,'index':0},'master':{'node_id':null,'term':0},'nodes':{},"    \
    "'edges':[],'instances':{},'runners':{},'tasks':{},'downloads':[]}"

static void test_positions(void)
{
    struct cluster_state *s = cluster_state_create();
    expect_refused(s, "{'kind':'NodeTimedOut','term':1,'index':0,'node_id':'n1'}", CAIRN_ESTATE,
                   "term 1 must start with a StateSnapshot");
    APPLY_OK(s, "{'kind':'StateSnapshot','term':2,'index':5,'state':" EMPTY_STATE "}");
    CHECK(s->last_term == 2 && s->last_index == 5, "snapshot sets the position");
    APPLY_OK(s, "{'kind':'NodeTimedOut','term':2,'index':6,'node_id':'n1'}");
    expect_refused(s, "{'kind':'NodeTimedOut','term':2,'index':8,'node_id':'n1'}", CAIRN_ESTATE,
                   "expected index 7 in term 2 (gap)");
    expect_refused(s, "{'kind':'NodeTimedOut','term':2,'index':6,'node_id':'n1'}", CAIRN_ESTATE,
                   "(already applied)");
    expect_refused(s, "{'kind':'NodeTimedOut','term':1,'index':7,'node_id':'n1'}", CAIRN_ESTATE,
                   "stale term");
    expect_refused(s, "{'kind':'StateSnapshot','term':1,'index':99,'state':" EMPTY_STATE "}",
                   CAIRN_ESTATE, "stale term");
    expect_refused(s, "{'kind':'NodeTimedOut','term':3,'index':0,'node_id':'n1'}", CAIRN_ESTATE,
                   "term 3 must start with a StateSnapshot");
    expect_refused(s, "{'kind':'StateSnapshot','term':2,'index':6,'state':" EMPTY_STATE "}",
                   CAIRN_ESTATE, "not after the state's position (2, 6)");
    /* A later snapshot in the same term: a reader catching up behind compaction. */
    APPLY_OK(s, "{'kind':'StateSnapshot','term':2,'index':40,'state':" EMPTY_STATE "}");
    APPLY_OK(s, "{'kind':'NodeTimedOut','term':2,'index':41,'node_id':'n1'}");
    /* A new term: the snapshot's content replaces everything, the position is the
     * event's, whatever the snapshot says of its own. */
    APPLY_OK(s, "{'kind':'StateSnapshot','term':3,'index':0,'state':{'last_applied':{'term':2,"
                "'index':41},'master':{'node_id':'n4','term':2},'nodes':{},'edges':[{'from':'x',"
                "'to':'y','rtt_us':1,'throughput_bytes_per_s':1}],'instances':{},'runners':{},"
                "'tasks':{},'downloads':[]}}");
    check_state(s, "{'last_applied':{'term':3,'index':0},'master':{'node_id':'n4','term':2},"
                   "'nodes':{},'edges':[{'from':'x','to':'y','rtt_us':1,"
                   "'throughput_bytes_per_s':1}],'instances':{},'runners':{},'tasks':{},"
                   "'downloads':[]}",
                "after the term 3 snapshot");
    APPLY_OK(s, "{'kind':'MasterElected','term':3,'index':1,'node_id':'n5'}");
    CHECK(!strcmp(s->master_node_id, "n5") && s->master_term == 3, "master of term 3");
    cluster_state_release(s);
}

/* ---- random histories ---- */

struct gen {
    uint64_t rng;
    int64_t term, index, clock_ms;
};

static uint64_t rnd(struct gen *g, uint64_t n) { return test_rand_u64(&g->rng) % n; }

static void pick_id(struct gen *g, char *dst, const char *prefix, int pool)
{
    snprintf(dst, IDS_ID_MAX + 1, "%s%d", prefix, (int)rnd(g, (uint64_t)pool));
}

static char *maybe_text(struct gen *g, const char *what)
{
    if (rnd(g, 3) == 0)
        return NULL;
    char buf[64];
    snprintf(buf, sizeof buf, "%s %u \"quoted\" \xc3\xa9\n", what, (unsigned)rnd(g, 1000));
    return strdup(buf);
}

static void random_info(struct gen *g, struct cluster_node_info *info)
{
    info->memory_total = (int64_t)rnd(g, (uint64_t)1 << 40);
    info->memory_available = (int64_t)rnd(g, (uint64_t)info->memory_total + 1);
    info->disk_total = (int64_t)rnd(g, (uint64_t)1 << 42);
    info->disk_free = (int64_t)rnd(g, (uint64_t)info->disk_total + 1);
    snprintf(info->cpu_model, sizeof info->cpu_model, "CPU %u", (unsigned)rnd(g, 5));
    info->cpu_cores = (int)rnd(g, 128) + 1;
    snprintf(info->isa, sizeof info->isa, "%s", rnd(g, 2) ? "avx2 fma" : "avx512f avx2");
    snprintf(info->os, sizeof info->os, "Linux 6.%u", (unsigned)rnd(g, 9));
    snprintf(info->hostname, sizeof info->hostname, "host-%u", (unsigned)rnd(g, 9));
    info->api_port = (int)rnd(g, 65536);
    info->cluster_port = (int)rnd(g, 65536);
    info->n_ifaces = rnd(g, 3);
    info->ifaces = info->n_ifaces ? calloc(info->n_ifaces, sizeof *info->ifaces) : NULL;
    for (size_t i = 0; i < info->n_ifaces; i++) {
        struct cluster_iface *f = &info->ifaces[i];
        snprintf(f->name, sizeof f->name, "eth%zu", i);
        f->loopback = rnd(g, 4) == 0;
        f->n_addrs = rnd(g, 3);
        f->addrs = f->n_addrs ? calloc(f->n_addrs, sizeof *f->addrs) : NULL;
        for (size_t k = 0; k < f->n_addrs; k++)
            snprintf(f->addrs[k], sizeof f->addrs[k], "10.0.%zu.%u", i, (unsigned)rnd(g, 256));
    }
}

static void random_instance(struct gen *g, struct cluster_instance *in)
{
    pick_id(g, in->id, "i", 6);
    snprintf(in->model_id, sizeof in->model_id, "org/m%u", (unsigned)rnd(g, 4));
    in->sharding = rnd(g, 4) ? CLUSTER_SHARDING_PIPELINE : CLUSTER_SHARDING_TENSOR;
    in->n_shards = rnd(g, 3) + 1;
    in->shards = calloc(in->n_shards, sizeof *in->shards);
    int node0 = (int)rnd(g, 8), runner0 = (int)rnd(g, 16), layers = 0;
    for (size_t i = 0; i < in->n_shards; i++) {
        struct cluster_shard *sh = &in->shards[i];
        snprintf(sh->node_id, sizeof sh->node_id, "n%d", (node0 + (int)i) % 8);
        snprintf(sh->runner_id, sizeof sh->runner_id, "r%d", (runner0 + (int)i) % 16);
        sh->rank = (int)i;
        sh->world_size = (int)in->n_shards;
        if (in->sharding == CLUSTER_SHARDING_PIPELINE) {
            sh->layer_begin = layers;
            layers += (int)rnd(g, 20) + 1;
            sh->layer_end = layers;
        } else {
            sh->layer_begin = 0;
            sh->layer_end = 32;
        }
    }
    if (rnd(g, 2))
        snprintf(in->draft_model, sizeof in->draft_model, "org/draft%u", (unsigned)rnd(g, 2));
    in->num_draft_tokens = (int)rnd(g, 9);
    in->epoch = (int64_t)rnd(g, 5);
    if (rnd(g, 2))
        in->kv.ctx_len = (int64_t)1 << (8 + rnd(g, 10));
    static const char *const kv_types[] = {"", "f32", "q8_0", "q4_0"};
    snprintf(in->kv.type_k, sizeof in->kv.type_k, "%s", kv_types[rnd(g, 4)]);
    snprintf(in->kv.type_v, sizeof in->kv.type_v, "%s", kv_types[rnd(g, 4)]);
}

/* A valid random event at the generator's next position; often about ids the state
 * holds, sometimes about unknown ones. Every ~200 events a new term starts with a
 * snapshot of s. */
static void random_event(struct gen *g, const struct cluster_state *s, struct event *e)
{
    if (rnd(g, 200) == 0) {
        g->term++;
        g->index = (int64_t)rnd(g, 3);
        event_init(e, EVENT_STATE_SNAPSHOT, g->term, g->index);
        e->state_snapshot.state = cluster_state_copy(s);
        return;
    }
    g->index++;
    enum event_kind kind = (enum event_kind)rnd(g, EVENT_STATE_SNAPSHOT);
    event_init(e, kind, g->term, g->index);
    switch (kind) {
    case EVENT_NODE_GATHERED_INFO:
        pick_id(g, e->node_gathered_info.node_id, "n", 8);
        g->clock_ms += (int64_t)rnd(g, 5000);
        e->node_gathered_info.when_ms = g->clock_ms;
        random_info(g, &e->node_gathered_info.info);
        break;
    case EVENT_NODE_TIMED_OUT:
        /* rarer in effect: only some picks name a node that exists */
        pick_id(g, e->node_timed_out.node_id, "n", 24);
        break;
    case EVENT_TOPOLOGY_EDGE_CREATED: {
        struct cluster_edge *x = &e->topology_edge_created;
        int a = (int)rnd(g, 8), b = (a + 1 + (int)rnd(g, 7)) % 8;
        snprintf(x->from, sizeof x->from, "n%d", a);
        snprintf(x->to, sizeof x->to, "n%d", b);
        x->rtt_us = (int64_t)rnd(g, 100000);
        x->throughput = (int64_t)rnd(g, (uint64_t)1 << 34);
        break;
    }
    case EVENT_TOPOLOGY_EDGE_DELETED:
        if (s->n_edges && rnd(g, 4)) {
            const struct cluster_edge *x = &s->edges[rnd(g, s->n_edges)];
            memcpy(e->topology_edge_deleted.from, x->from, sizeof x->from);
            memcpy(e->topology_edge_deleted.to, x->to, sizeof x->to);
        } else {
            pick_id(g, e->topology_edge_deleted.from, "n", 8);
            pick_id(g, e->topology_edge_deleted.to, "n", 8);
        }
        break;
    case EVENT_INSTANCE_CREATED:
        random_instance(g, &e->instance_created);
        break;
    case EVENT_INSTANCE_DELETED:
        pick_id(g, e->instance_deleted.instance_id, "i", 8);
        break;
    case EVENT_INSTANCE_DRAFT_MODEL_UPDATED:
        pick_id(g, e->instance_draft_model_updated.instance_id, "i", 6);
        if (rnd(g, 2))
            snprintf(e->instance_draft_model_updated.draft_model,
                     sizeof e->instance_draft_model_updated.draft_model, "org/d%u",
                     (unsigned)rnd(g, 3));
        e->instance_draft_model_updated.num_draft_tokens = (int)rnd(g, 17);
        break;
    case EVENT_RUNNER_STATUS_UPDATED: {
        struct cluster_runner *r = &e->runner_status_updated;
        pick_id(g, r->id, "r", 16);
        pick_id(g, r->instance_id, "i", 6);
        pick_id(g, r->node_id, "n", 8);
        r->status = (enum cluster_runner_status)rnd(g, CLUSTER_RUNNER_STATUS_COUNT);
        r->error = r->status == CLUSTER_RUNNER_FAILED ? maybe_text(g, "runner") : NULL;
        r->restart_count = (int)rnd(g, 6);
        r->epoch = (int64_t)rnd(g, 4);
        break;
    }
    case EVENT_RUNNER_DELETED:
        pick_id(g, e->runner_deleted.runner_id, "r", 16);
        break;
    case EVENT_NODE_DOWNLOAD_PROGRESS: {
        struct cluster_download *d = &e->node_download_progress;
        pick_id(g, d->node_id, "n", 8);
        snprintf(d->model_id, sizeof d->model_id, "org/m%u", (unsigned)rnd(g, 4));
        d->bytes_total = (int64_t)rnd(g, (uint64_t)1 << 36);
        d->bytes_done = (int64_t)rnd(g, (uint64_t)d->bytes_total + 1);
        d->status = (enum cluster_download_status)rnd(g, CLUSTER_DOWNLOAD_STATUS_COUNT);
        d->error = d->status == CLUSTER_DOWNLOAD_FAILED ? maybe_text(g, "download") : NULL;
        break;
    }
    case EVENT_TASK_CREATED: {
        pick_id(g, e->task_created.task_id, "t", 10);
        e->task_created.kind = CLUSTER_TASK_TEXT_GENERATION;
        pick_id(g, e->task_created.instance_id, "i", 6);
        pick_id(g, e->task_created.node_id, "n", 8);
        e->task_created.bytes = 1 + (int64_t)rnd(g, CLUSTER_MAX_PARAMS);
        break;
    }
    case EVENT_TASK_STATUS_UPDATED:
        pick_id(g, e->task_status_updated.task_id, "t", 10);
        e->task_status_updated.status = (enum cluster_task_status)rnd(g, CLUSTER_TASK_STATUS_COUNT);
        if (e->task_status_updated.status == CLUSTER_TASK_FAILED)
            e->task_status_updated.error = maybe_text(g, "task");
        break;
    case EVENT_TASK_ACKNOWLEDGED:
        pick_id(g, e->task_acknowledged.task_id, "t", 10);
        break;
    case EVENT_TASK_DELETED:
        pick_id(g, e->task_deleted.task_id, "t", 12);
        break;
    case EVENT_MASTER_ELECTED:
        pick_id(g, e->master_elected.node_id, "n", 8);
        break;
    case EVENT_INSTANCE_EPOCH_ADVANCED:
        pick_id(g, e->instance_epoch_advanced.instance_id, "i", 7);
        e->instance_epoch_advanced.epoch = 1 + (int64_t)rnd(g, 6);
        break;
    default:
        break;
    }
}

/* JSON text of s; a round trip through cluster_state_from_json must give it back. */
static char *state_text_checked(const struct cluster_state *s, int *bad_round_trips)
{
    char *text = cluster_state_to_json(s);
    struct cluster_state *back = NULL;
    char err[512] = "";
    if (cluster_state_from_json(text, strlen(text), &back, err, sizeof err)) {
        if ((*bad_round_trips)++ < 3)
            CHECK(false, "state does not parse back: %s", err);
        return text;
    }
    char *again = cluster_state_to_json(back);
    if (strcmp(text, again) != 0 && (*bad_round_trips)++ < 3)
        CHECK(false, "state round trip differs\n %s\n %s", text, again);
    free(again);
    cluster_state_release(back);
    return text;
}

static void test_random(uint64_t seed, int n)
{
    struct gen g = {.rng = seed, .term = 1, .index = -1, .clock_ms = 1700000000000};
    struct event *log = calloc((size_t)n + 1, sizeof *log);
    struct cluster_state *a = cluster_state_create(), *b = cluster_state_create();
    char err[512];

    /* The log starts with a snapshot of an empty state. */
    g.index = 0;
    event_init(&log[0], EVENT_STATE_SNAPSHOT, 1, 0);
    log[0].state_snapshot.state = cluster_state_create();

    int bad_events = 0, bad_applies = 0, bad_round_trips = 0, refusals_missed = 0;
    enum { SNAPS = 4 };
    int snap_at[SNAPS];
    char *snap_text[SNAPS] = {0};
    for (int k = 0; k < SNAPS; k++)
        snap_at[k] = (int)((uint64_t)(k + 1) * (uint64_t)n / (SNAPS + 1));
    int kinds_seen[EVENT_KIND_COUNT] = {0};

    for (int i = 0; i <= n; i++) {
        if (i > 0)
            random_event(&g, a, &log[i]);
        struct event *e = &log[i];
        kinds_seen[e->kind]++;

        /* The event survives JSON: text -> event -> same text. */
        char *text = event_to_json(e);
        struct event back;
        int rc = text ? event_from_json(text, strlen(text), &back, err, sizeof err) : -1;
        char *again = rc == 0 ? event_to_json(&back) : NULL;
        if ((!again || strcmp(text, again) != 0) && bad_events++ < 3)
            CHECK(false, "event %d round trip: %s\n %s\n %s", i, err, text ? text : "(null)",
                  again ? again : "(null)");

        /* a applies the C event, b the decoded one. */
        if (cluster_apply(a, e, err, sizeof err) && bad_applies++ < 3)
            CHECK(false, "event %d refused by a: %s", i, err);
        if (rc == 0 && cluster_apply(b, &back, err, sizeof err) && bad_applies++ < 3)
            CHECK(false, "event %d refused by b: %s", i, err);
        if (rc == 0)
            event_clear(&back);
        free(text);
        free(again);

        /* Now and then: a wrong position is refused and changes nothing. */
        if (i % 97 == 0) {
            char *before = cluster_state_to_json(a);
            struct event wrong;
            event_init(&wrong, EVENT_TASK_DELETED, a->last_term, a->last_index + 2 + i % 3);
            snprintf(wrong.task_deleted.task_id, sizeof wrong.task_deleted.task_id, "t1");
            int wrc = cluster_apply(a, &wrong, err, sizeof err);
            wrong.index = a->last_index;
            int drc = cluster_apply(a, &wrong, err, sizeof err);
            char *after = cluster_state_to_json(a);
            if ((wrc != CAIRN_ESTATE || drc != CAIRN_ESTATE || strcmp(before, after) != 0) &&
                refusals_missed++ < 3)
                CHECK(false, "event %d: gap rc %d, duplicate rc %d, state %s", i, wrc, drc,
                      strcmp(before, after) ? "changed" : "kept");
            free(before);
            free(after);
        }

        if (i % 50 == 0 || i == n) {
            char *ta = state_text_checked(a, &bad_round_trips);
            char *tb = cluster_state_to_json(b);
            CHECK(strcmp(ta, tb) == 0, "after event %d the two replicas differ\n %s\n %s", i, ta,
                  tb);
            free(ta);
            free(tb);
        }
        for (int k = 0; k < SNAPS; k++)
            if (i == snap_at[k])
                snap_text[k] = cluster_state_to_json(a);
    }
    char *final = state_text_checked(a, &bad_round_trips);
    CHECK(bad_events == 0 && bad_applies == 0 && bad_round_trips == 0 && refusals_missed == 0,
          "seed %llu: %d event round trips, %d refused applies, %d state round trips, %d "
          "position refusals missed",
          (unsigned long long)seed, bad_events, bad_applies, bad_round_trips, refusals_missed);
    for (int k = 0; k < EVENT_KIND_COUNT; k++)
        CHECK(kinds_seen[k] > 0, "seed %llu never made a %s", (unsigned long long)seed,
              event_kind_name(k));
    CHECK(a->n_nodes > 0 && a->n_runners > 0 && a->n_tasks > 0,
          "the history should leave something: %zu nodes, %zu runners, %zu tasks", a->n_nodes,
          a->n_runners, a->n_tasks);

    /* The same log on a third, fresh state gives the same bytes. */
    struct cluster_state *c = cluster_state_create();
    for (int i = 0; i <= n; i++)
        cluster_apply(c, &log[i], err, sizeof err);
    char *tc = cluster_state_to_json(c);
    CHECK(strcmp(final, tc) == 0, "replay on a fresh state differs");
    free(tc);
    cluster_state_release(c);

    /* A snapshot taken after event k, parsed back, plus events k+1.. == the full replay. */
    for (int k = 0; k < SNAPS; k++) {
        struct cluster_state *r = NULL;
        CHECK(cluster_state_from_json(snap_text[k], strlen(snap_text[k]), &r, err, sizeof err) == 0,
              "snapshot %d: %s", k, err);
        if (!r)
            continue;
        int refused = 0;
        for (int i = snap_at[k] + 1; i <= n; i++)
            refused += cluster_apply(r, &log[i], err, sizeof err) != 0;
        char *tr = cluster_state_to_json(r);
        CHECK(refused == 0 && strcmp(final, tr) == 0,
              "snapshot at %d + replay: %d refused, %s", snap_at[k], refused,
              strcmp(final, tr) ? "differs" : "same");
        free(tr);
        cluster_state_release(r);
        free(snap_text[k]);
    }

    /* Copies are independent and equal. */
    struct cluster_state *copy = cluster_state_copy(a);
    char *tcopy = copy ? cluster_state_to_json(copy) : NULL;
    CHECK(tcopy && strcmp(final, tcopy) == 0, "copy differs");
    cluster_state_release(a);
    free(tcopy);
    tcopy = copy ? cluster_state_to_json(copy) : NULL;
    CHECK(tcopy && strcmp(final, tcopy) == 0, "copy changed when the original was released");
    free(tcopy);
    cluster_state_release(copy);

    for (int i = 0; i <= n; i++)
        event_clear(&log[i]);
    free(log);
    free(final);
    cluster_state_release(b);
}

/* Tables stay sorted by key whatever the order of events. */
static void test_sorted(void)
{
    struct cluster_state *s = fresh();
    const char *ids[] = {"n5", "n1", "n9", "n3", "n10", "n0"};
    char text[1024];
    for (int i = 0; i < 6; i++) {
        snprintf(text, sizeof text,
                 "{'kind':'NodeGatheredInfo','term':1,'index':%d,'node_id':'%s','when_ms':1,"
                 "'info':" INFO(1) "}",
                 i + 1, ids[i]);
        APPLY_OK(s, text);
    }
    bool sorted = s->n_nodes == 6;
    for (size_t i = 1; i < s->n_nodes; i++)
        sorted = sorted && strcmp(s->nodes[i - 1].id, s->nodes[i].id) < 0;
    CHECK(sorted, "nodes sorted by id");
    CHECK(cluster_state_find_node(s, "n10") && !cluster_state_find_node(s, "n2"), "find");
    cluster_state_release(s);
}

/* ---- speed ---- */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Applies n random events (the generator's term snapshots among them) to a fresh state
 * and prints the rate. The events are made beforehand in chunks (each applied to the
 * generator's own state, which they need), so only cluster_apply is timed; the timed
 * state must end equal to the generator's. */
static void bench_apply(int n)
{
    enum { CHUNK = 4096 };
    struct gen g = {.rng = 7, .term = 1, .index = 0, .clock_ms = 1700000000000};
    struct event *log = calloc(CHUNK, sizeof *log);
    struct cluster_state *gs = cluster_state_create(), *s = cluster_state_create();
    char err[512];
    int done = 0, snapshots = 0, refused = 0;
    double all_s = 0, snap_s = 0;
    while (log && gs && s && done < n) {
        int m = 0;
        for (; m < CHUNK && done + m < n; m++) {
            if (done + m == 0) {
                event_init(&log[0], EVENT_STATE_SNAPSHOT, 1, 0);
                log[0].state_snapshot.state = cluster_state_create();
            } else {
                random_event(&g, gs, &log[m]);
            }
            if (cluster_apply(gs, &log[m], err, sizeof err) && refused++ < 3)
                CHECK(false, "event %d refused by the generator's state: %s", done + m, err);
        }
        int bad = 0;
        double t0 = mono_s();
        for (int i = 0; i < m; i++) {
            if (log[i].kind != EVENT_STATE_SNAPSHOT) {
                bad += cluster_apply(s, &log[i], err, sizeof err) != 0;
                continue;
            }
            double ts = mono_s();
            bad += cluster_apply(s, &log[i], err, sizeof err) != 0;
            snap_s += mono_s() - ts;
            snapshots++;
        }
        all_s += mono_s() - t0;
        if (bad && refused++ < 3)
            CHECK(false, "%d events of %d..%d refused, the last: %s", bad, done, done + m - 1, err);
        refused += bad;
        for (int i = 0; i < m; i++)
            event_clear(&log[i]);
        done += m;
    }
    char *a = gs ? cluster_state_to_json(gs) : NULL, *b = s ? cluster_state_to_json(s) : NULL;
    CHECK(done == n && refused == 0 && a && b && !strcmp(a, b),
          "%d of %d events applied, %d refused, states %s", done, n, refused,
          a && b && !strcmp(a, b) ? "equal" : "differ");
    CHECK(s && s->n_nodes > 0 && s->n_runners > 0, "the history leaves nodes and runners");
    if (all_s > 0 && all_s > snap_s)
        printf("figure: apply %.0f events/s (%d random events, %d of them term snapshots; "
               "%.0f events/s without those)\n",
               done / all_s, done, snapshots, (done - snapshots) / (all_s - snap_s));
    free(a);
    free(b);
    free(log);
    cluster_state_release(gs);
    cluster_state_release(s);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    const char *bench = getenv("CAIRN_BENCH");
    if (bench && *bench && strcmp(bench, "0")) {
        const char *ev = getenv("CAIRN_BENCH_EVENTS");
        long n = ev ? strtol(ev, NULL, 10) : 1000000;
        bench_apply(n > 0 && n <= 100000000 ? (int)n : 1000000);
        return test_main_end();
    }
    RUN(test_history);
    RUN(test_kinds);
    RUN(test_epoch);
    RUN(test_positions);
    RUN(test_sorted);
    RUN(test_random, 1, 3000);
    RUN(test_random, 0xcafef00d, 3000);
    RUN(test_random, 42, 1500);
    bench_apply(5000);
    return test_main_end();
}
