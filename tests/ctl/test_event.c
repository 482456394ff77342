/* Events: every kind round-trips through JSON (and event_copy); malformed input of every
 * sort is refused with a message naming the field, and never crashes: hand cases, every
 * field dropped or given the wrong type, every truncation. */
#include "ctl/event.h"

#include "base/err.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

/* Test JSON is written with ' for " to stay readable. */
static char *dq(const char *s)
{
    char *d = strdup(s);
    for (char *p = d; *p; p++)
        if (*p == '\'')
            *p = '"';
    return d;
}

/* Compact, key-sorted form of JSON text (malloc'd), as event_to_json writes it. */
static char *canon(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j) {
        fprintf(stderr, "bad test JSON: %s: %s\n", je.text, text);
        return strdup("");
    }
    char *out = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    return out;
}

#define INFO                                                                                \
    "{'memory_total_bytes':68719476736,'memory_available_bytes':34359738368,"              \
    "'disk_free_bytes':1000000000,'disk_total_bytes':2000000000,'cpu_model':'AMD EPYC 9654'," \
    "'cpu_cores':16,'isa':'avx2 f16c fma avx512f','os':'Linux 6.1.0 x86_64','hostname':'h1',"  \
    "'interfaces':[{'name':'lo','loopback':true,'addresses':['127.0.0.1','::1']},"           \
    "{'name':'eth0','loopback':false,'addresses':['10.0.0.2']}],'api_port':52415,"           \
    "'cluster_port':52416}"

#define INSTANCE                                                                            \
    "{'instance_id':'i1','model_id':'org/llama-3@q4+x','sharding':'pipeline',"              \
    "'shards':[{'node_id':'n1','runner_id':'r1','rank':0,'world_size':2,'layer_begin':0,"   \
    "'layer_end':10},{'node_id':'n2','runner_id':'r2','rank':1,'world_size':2,"             \
    "'layer_begin':10,'layer_end':22}],'draft_model':'org/tiny','num_draft_tokens':4,"      \
    "'epoch':3}"

#define STATE                                                                               \
    "{'last_applied':{'term':2,'index':7},'master':{'node_id':'n1','term':2},"              \
    "'nodes':{'n1':{'node_id':'n1','last_seen_ms':1700000000000,'info':" INFO "}},"         \
    "'edges':[{'from':'n1','to':'n2','rtt_us':250,'throughput_bytes_per_s':1250000000}],"   \
    "'instances':{'i1':" INSTANCE "},"                                                      \
    "'runners':{'r1':{'runner_id':'r1','instance_id':'i1','node_id':'n1','status':'Failed',"\
    "'error':'oom','restart_count':2,'epoch':2}},"                                                    \
    "'tasks':{'t1':{'task_id':'t1','kind':'TextGeneration','instance_id':'i1','node_id':'n1',"\
    "'status':'Running','acknowledged':true,'error':null,'bytes':24}}," \
    "'downloads':[{'node_id':'n2','model_id':'org/tiny','bytes_done':5,'bytes_total':9,"     \
    "'bytes_per_s':3,'eta_s':2,'status':'Ongoing','error':null}]}"

/* One valid event of each kind, in enum order. */
static const char *const valid[EVENT_KIND_COUNT] = {
    "{'kind':'NodeGatheredInfo','term':1,'index':2,'node_id':'n1','when_ms':1700000000000,"
    "'info':" INFO "}",
    "{'kind':'NodeTimedOut','term':1,'index':3,'node_id':'n1'}",
    "{'kind':'TopologyEdgeCreated','term':1,'index':4,'from':'n1','to':'n2','rtt_us':250,"
    "'throughput_bytes_per_s':1250000000}",
    "{'kind':'TopologyEdgeDeleted','term':1,'index':5,'from':'n1','to':'n2'}",
    "{'kind':'InstanceCreated','term':1,'index':6,'instance':" INSTANCE "}",
    "{'kind':'InstanceDeleted','term':1,'index':7,'instance_id':'i1'}",
    "{'kind':'InstanceDraftModelUpdated','term':1,'index':8,'instance_id':'i1',"
    "'draft_model':null,'num_draft_tokens':0}",
    "{'kind':'RunnerStatusUpdated','term':1,'index':9,'runner_id':'r1','instance_id':'i1',"
    "'node_id':'n1','status':'Failed','error':'exit 137; stderr: killed','restart_count':1,'data_port':4100,"
    "'epoch':3}",
    "{'kind':'RunnerDeleted','term':1,'index':10,'runner_id':'r1'}",
    "{'kind':'NodeDownloadProgress','term':1,'index':11,'node_id':'n2','model_id':'org/tiny',"
    "'bytes_done':0,'bytes_total':0,'bytes_per_s':0,'eta_s':null,'status':'Pending','error':null}",
    "{'kind':'TaskCreated','term':1,'index':12,'task_id':'t1','task_kind':'TextGeneration',"
    "'instance_id':'i1','node_id':'n1','bytes':68}",
    "{'kind':'TaskStatusUpdated','term':1,'index':13,'task_id':'t1','status':'Failed',"
    "'error':'runner r1 failed'}",
    "{'kind':'TaskAcknowledged','term':1,'index':14,'task_id':'t1'}",
    "{'kind':'TaskDeleted','term':1,'index':15,'task_id':'t1'}",
    "{'kind':'MasterElected','term':4,'index':1,'node_id':'n2'}",
    "{'kind':'InstanceEpochAdvanced','term':1,'index':16,'instance_id':'i1','epoch':4}",
    "{'kind':'StateSnapshot','term':3,'index':0,'state':" STATE "}",
};

static void test_round_trip(void)
{
    for (int k = 0; k < EVENT_KIND_COUNT; k++) {
        char *text = dq(valid[k]);
        char *want = canon(text);
        char err[512] = "";
        struct event e, c;
        int rc = event_from_json(text, strlen(text), &e, err, sizeof err);
        CHECK(rc == 0, "%s: %s", event_kind_name(k), err);
        CHECK_EQ_INT(e.kind, k);
        char *got = event_to_json(&e);
        CHECK(got && strcmp(got, want) == 0, "%s round trip\n got  %s\n want %s",
              event_kind_name(k), got ? got : "(null)", want);
        CHECK(event_validate(&e, err, sizeof err) == 0, "%s validate: %s", event_kind_name(k), err);
        CHECK(event_copy(&c, &e) == 0, "copy");
        event_clear(&e); /* the copy must not share anything with the original */
        char *again = event_to_json(&c);
        CHECK(again && strcmp(again, want) == 0, "%s copy\n got  %s\n want %s",
              event_kind_name(k), again ? again : "(null)", want);
        event_clear(&c);
        free(again);
        free(got);
        free(want);
        free(text);
    }
}

/* A few fields read back as C values. */
static void test_decoded_values(void)
{
    char err[512] = "";
    struct event e;
    char *text = dq(valid[EVENT_NODE_GATHERED_INFO]);
    CHECK(event_from_json(text, strlen(text), &e, err, sizeof err) == 0, "%s", err);
    CHECK(e.term == 1 && e.index == 2, "position (%lld, %lld)", (long long)e.term,
          (long long)e.index);
    CHECK(e.node_gathered_info.info.memory_total == 68719476736LL, "memory_total %lld",
          (long long)e.node_gathered_info.info.memory_total);
    CHECK_EQ_INT(e.node_gathered_info.info.n_ifaces, 2);
    CHECK(e.node_gathered_info.info.n_ifaces == 2 &&
              strcmp(e.node_gathered_info.info.ifaces[0].addrs[1], "::1") == 0 &&
              e.node_gathered_info.info.ifaces[0].loopback,
          "interfaces[0]");
    CHECK_EQ_INT(e.node_gathered_info.info.api_port, 52415);
    event_clear(&e);
    free(text);

    text = dq(valid[EVENT_INSTANCE_CREATED]);
    CHECK(event_from_json(text, strlen(text), &e, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(e.instance_created.n_shards, 2);
    CHECK(e.instance_created.n_shards == 2 && e.instance_created.shards[1].layer_end == 22 &&
              strcmp(e.instance_created.shards[1].runner_id, "r2") == 0,
          "shard 1");
    CHECK(strcmp(e.instance_created.draft_model, "org/tiny") == 0, "draft %s",
          e.instance_created.draft_model);
    event_clear(&e);
    free(text);

    text = dq(valid[EVENT_INSTANCE_DRAFT_MODEL_UPDATED]);
    CHECK(event_from_json(text, strlen(text), &e, err, sizeof err) == 0, "%s", err);
    CHECK(e.instance_draft_model_updated.draft_model[0] == '\0', "null draft reads as \"\"");
    event_clear(&e);
    free(text);

    text = dq(valid[EVENT_INSTANCE_EPOCH_ADVANCED]);
    CHECK(event_from_json(text, strlen(text), &e, err, sizeof err) == 0, "%s", err);
    CHECK(!strcmp(e.instance_epoch_advanced.instance_id, "i1") && e.instance_epoch_advanced.epoch == 4,
          "epoch advanced: %s %lld", e.instance_epoch_advanced.instance_id,
          (long long)e.instance_epoch_advanced.epoch);
    event_clear(&e);
    free(text);

    text = dq(valid[EVENT_RUNNER_STATUS_UPDATED]);
    CHECK(event_from_json(text, strlen(text), &e, err, sizeof err) == 0, "%s", err);
    CHECK(e.runner_status_updated.epoch == 3 && e.runner_status_updated.data_port == 4100,
          "runner epoch %lld", (long long)e.runner_status_updated.epoch);
    event_clear(&e);
    free(text);

    text = dq(valid[EVENT_STATE_SNAPSHOT]);
    CHECK(event_from_json(text, strlen(text), &e, err, sizeof err) == 0, "%s", err);
    const struct cluster_state *s = e.state_snapshot.state;
    CHECK(s && s->last_term == 2 && s->last_index == 7 && s->n_nodes == 1 && s->n_tasks == 1,
          "snapshot state");
    const struct cluster_task *t = s ? cluster_state_find_task(s, "t1") : NULL;
    CHECK(t && t->acknowledged && t->status == CLUSTER_TASK_RUNNING, "task t1");
    const struct cluster_runner *r = s ? cluster_state_find_runner(s, "r1") : NULL;
    CHECK(r && r->error && strcmp(r->error, "oom") == 0 && r->restart_count == 2, "runner r1");
    event_clear(&e);
    free(text);
}

static bool all_zero(const struct event *e)
{
    static const struct event zero;
    return memcmp(e, &zero, sizeof zero) == 0;
}

/* Refused with CAIRN_EFORMAT, a message holding want, and a zeroed event. */
static void expect_refused(const char *text, size_t len, const char *want, const char *what)
{
    char err[1024] = "";
    struct event e;
    int rc = event_from_json(text, len, &e, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT, "%s: rc %d (%s)", what, rc, err);
    CHECK(strstr(err, want) != NULL, "%s: message \"%s\" lacks \"%s\"", what, err, want);
    CHECK(all_zero(&e), "%s: event not zeroed after refusal", what);
    if (rc == 0)
        event_clear(&e);
}

/* valid[kind] with the text "from" replaced by "to" (both in ' notation). */
static char *edit(int kind, const char *from, const char *to)
{
    char *base = dq(valid[kind]), *f = dq(from), *t = dq(to);
    char *at = strstr(base, f);
    if (!at) {
        fprintf(stderr, "edit: \"%s\" not in %s\n", from, valid[kind]);
        free(f);
        free(t);
        return base;
    }
    size_t n = strlen(base) - strlen(f) + strlen(t) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - base), base, t, at + strlen(f));
    free(base);
    free(f);
    free(t);
    return out;
}

struct bad {
    int kind;
    const char *from, *to; /* replacement in valid[kind] */
    const char *want;      /* substring of the message */
};

static const struct bad bad_cases[] = {
    {EVENT_NODE_TIMED_OUT, "'kind':'NodeTimedOut',", "", "event.kind: missing"},
    {EVENT_NODE_TIMED_OUT, "'NodeTimedOut'", "'NodeLost'", "event.kind: \"NodeLost\" is not one of"},
    {EVENT_NODE_TIMED_OUT, "'NodeTimedOut'", "'nodetimedout'", "event.kind"},
    {EVENT_NODE_TIMED_OUT, "'NodeTimedOut'", "7", "event.kind: must be a string"},
    {EVENT_NODE_TIMED_OUT, "'term':1,", "", "NodeTimedOut.term: missing"},
    {EVENT_NODE_TIMED_OUT, "'term':1", "'term':0", "NodeTimedOut.term: 0 is outside"},
    {EVENT_NODE_TIMED_OUT, "'term':1", "'term':'1'", "NodeTimedOut.term: must be an integer"},
    {EVENT_NODE_TIMED_OUT, "'term':1", "'term':1.5", "NodeTimedOut.term: must be an integer"},
    {EVENT_NODE_TIMED_OUT, "'term':1", "'term':9007199254740992", "NodeTimedOut.term"},
    {EVENT_NODE_TIMED_OUT, "'index':3", "'index':-1", "NodeTimedOut.index: -1 is outside"},
    {EVENT_NODE_TIMED_OUT, "'index':3", "'index':99999999999999999999", "JSON"},
    {EVENT_NODE_TIMED_OUT, ",'node_id':'n1'", "", "NodeTimedOut.node_id: missing"},
    {EVENT_NODE_TIMED_OUT, "'n1'", "'n/1'", "NodeTimedOut.node_id: byte 0x2f at offset 1"},
    {EVENT_NODE_TIMED_OUT, "'n1'", "''", "NodeTimedOut.node_id: empty"},
    {EVENT_NODE_TIMED_OUT, "'n1'", "null", "NodeTimedOut.node_id: must be a string"},
    {EVENT_NODE_TIMED_OUT, "'n1'", "'n1\\u0000x'", "JSON"},
    {EVENT_NODE_TIMED_OUT, "'n1'", "'n1','extra':1", "NodeTimedOut: unknown field \"extra\""},
    {EVENT_NODE_TIMED_OUT, "'n1'", "'n1','node_id':'n2'", "JSON"}, /* duplicate key */
    {EVENT_NODE_GATHERED_INFO, "'memory_total_bytes':68719476736", "'memory_total_bytes':-1",
     "NodeGatheredInfo.info.memory_total_bytes: -1 is outside"},
    {EVENT_NODE_GATHERED_INFO, "'memory_available_bytes':34359738368",
     "'memory_available_bytes':4503599627370497",
     "NodeGatheredInfo.info.memory_available_bytes"},
    {EVENT_NODE_GATHERED_INFO, "'disk_free_bytes':1000000000", "'disk_free_bytes':1e9",
     "NodeGatheredInfo.info.disk_free_bytes: must be an integer"},
    {EVENT_NODE_GATHERED_INFO, "'cpu_cores':16", "'cpu_cores':-4", "NodeGatheredInfo.info.cpu_cores"},
    {EVENT_NODE_GATHERED_INFO, "'api_port':52415", "'api_port':65536", "NodeGatheredInfo.info.api_port"},
    {EVENT_NODE_GATHERED_INFO, "'AMD EPYC 9654'", "'AMD\\tEPYC'",
     "NodeGatheredInfo.info.cpu_model: control byte 0x09"},
    {EVENT_NODE_GATHERED_INFO, "'10.0.0.2'", "'10.0.0.2',7",
     "NodeGatheredInfo.info.interfaces[1].addresses[1]: must be a string"},
    {EVENT_NODE_GATHERED_INFO, "'loopback':true", "'loopback':1",
     "NodeGatheredInfo.info.interfaces[0].loopback: must be a boolean"},
    {EVENT_NODE_GATHERED_INFO, "'name':'eth0',", "", "NodeGatheredInfo.info.interfaces[1].name: missing"},
    {EVENT_NODE_GATHERED_INFO, "'when_ms':1700000000000", "'when_ms':-5", "NodeGatheredInfo.when_ms"},
    {EVENT_NODE_GATHERED_INFO, "'info':{", "'info':[],'x':{", "NodeGatheredInfo: unknown field \"x\""},
    {EVENT_TOPOLOGY_EDGE_CREATED, "'to':'n2'", "'to':'n1'", "TopologyEdgeCreated.to: equals from"},
    {EVENT_TOPOLOGY_EDGE_CREATED, "'rtt_us':250", "'rtt_us':4294967296", "TopologyEdgeCreated.rtt_us"},
    {EVENT_TOPOLOGY_EDGE_DELETED, "'from':'n1',", "", "TopologyEdgeDeleted.from: missing"},
    {EVENT_INSTANCE_CREATED, "'instance':{", "'instance':[],'y':{", "InstanceCreated: unknown field"},
    {EVENT_INSTANCE_CREATED, "'sharding':'pipeline'", "'sharding':'Pipeline'",
     "InstanceCreated.instance.sharding: \"Pipeline\" is not one of pipeline, tensor"},
    {EVENT_INSTANCE_CREATED, "'model_id':'org/llama-3@q4+x'", "'model_id':'org/llama 3'",
     "InstanceCreated.instance.model_id: byte 0x20"},
    {EVENT_INSTANCE_CREATED, "'rank':1,", "'rank':0,",
     "InstanceCreated.instance.shards[1].rank: 0, expected 1"},
    {EVENT_INSTANCE_CREATED, "'rank':1,'world_size':2", "'rank':1,'world_size':3",
     "InstanceCreated.instance.shards[1].world_size: 3, but there are 2 shards"},
    {EVENT_INSTANCE_CREATED, "'node_id':'n2'", "'node_id':'n1'",
     "InstanceCreated.instance.shards[1].node_id: \"n1\" already holds shard 0"},
    {EVENT_INSTANCE_CREATED, "'runner_id':'r2'", "'runner_id':'r1'",
     "InstanceCreated.instance.shards[1].runner_id"},
    {EVENT_INSTANCE_CREATED, "'layer_begin':10,'layer_end':22", "'layer_begin':11,'layer_end':22",
     "InstanceCreated.instance.shards[1].layer_begin: 11, expected 10"},
    {EVENT_INSTANCE_CREATED, "'layer_begin':10,'layer_end':22", "'layer_begin':10,'layer_end':10",
     "InstanceCreated.instance.shards[1].layer_end: 10 is not above layer_begin 10"},
    {EVENT_INSTANCE_CREATED, "'sharding':'pipeline'", "'sharding':'tensor'",
     "InstanceCreated.instance.shards[1]: layers [10, 22), expected [0, 10)"},
    {EVENT_INSTANCE_CREATED, "'num_draft_tokens':4", "'num_draft_tokens':257",
     "InstanceCreated.instance.num_draft_tokens"},
    {EVENT_INSTANCE_CREATED, "'epoch':3", "'epoch':-3", "InstanceCreated.instance.epoch"},
    {EVENT_INSTANCE_DRAFT_MODEL_UPDATED, "'draft_model':null", "'draft_model':''",
     "InstanceDraftModelUpdated.draft_model: empty"},
    {EVENT_RUNNER_STATUS_UPDATED, "'status':'Failed'", "'status':'Crashed'",
     "RunnerStatusUpdated.status: \"Crashed\" is not one of Idle, Connecting"},
    {EVENT_RUNNER_STATUS_UPDATED, "'status':'Failed'", "'status':'Ready'",
     "RunnerStatusUpdated.error: must be null unless status is Failed"},
    {EVENT_RUNNER_STATUS_UPDATED, "'restart_count':1", "'restart_count':-1",
     "RunnerStatusUpdated.restart_count"},
    {EVENT_RUNNER_STATUS_UPDATED, "'data_port':4100", "'data_port':70000", "RunnerStatusUpdated.data_port"},
    {EVENT_RUNNER_STATUS_UPDATED, "'epoch':3", "'epoch':-1", "RunnerStatusUpdated.epoch"},
    {EVENT_RUNNER_STATUS_UPDATED, "'epoch':3", "'epoch':'3'", "RunnerStatusUpdated.epoch: must be an integer"},
    {EVENT_INSTANCE_EPOCH_ADVANCED, "'epoch':4", "'epoch':0", "InstanceEpochAdvanced.epoch"},
    {EVENT_INSTANCE_EPOCH_ADVANCED, "'epoch':4", "'epoch':9007199254740992", "InstanceEpochAdvanced.epoch"},
    {EVENT_INSTANCE_EPOCH_ADVANCED, "'epoch':4", "'epoch':4.5", "InstanceEpochAdvanced.epoch: must be an integer"},
    {EVENT_INSTANCE_EPOCH_ADVANCED, "'epoch':4", "'epoch':null", "InstanceEpochAdvanced.epoch: must be an integer"},
    {EVENT_INSTANCE_EPOCH_ADVANCED, "'instance_id':'i1',", "", "InstanceEpochAdvanced.instance_id: missing"},
    {EVENT_INSTANCE_EPOCH_ADVANCED, "'instance_id':'i1'", "'instance_id':'i 1'", "InstanceEpochAdvanced.instance_id"},
    {EVENT_INSTANCE_EPOCH_ADVANCED, "'epoch':4", "'epoch':4,'rank':1", "InstanceEpochAdvanced: unknown field \"rank\""},
    {EVENT_RUNNER_STATUS_UPDATED, "'error':'exit 137; stderr: killed'", "'error':7",
     "RunnerStatusUpdated.error: must be a string or null"},
    {EVENT_NODE_DOWNLOAD_PROGRESS, "'bytes_done':0", "'bytes_done':1",
     "NodeDownloadProgress.bytes_done: 1 is above bytes_total 0"},
    {EVENT_NODE_DOWNLOAD_PROGRESS, "'status':'Pending'", "'status':'Done'",
     "NodeDownloadProgress.status"},
    {EVENT_TASK_CREATED, "'task_kind':'TextGeneration'", "'task_kind':'ImageGeneration'",
     "TaskCreated.task_kind: \"ImageGeneration\" is not one of TextGeneration"},
    {EVENT_TASK_CREATED, "'bytes':68", "'bytes':68,'params':{'prompt':'hi'}",
     "TaskCreated: unknown field \"params\""},
    {EVENT_TASK_CREATED, "'bytes':68", "'bytes':0", "TaskCreated.bytes"},
    {EVENT_TASK_CREATED, "'bytes':68", "'bytes':1048577", "TaskCreated.bytes"},
    {EVENT_TASK_CREATED, "'instance_id':'i1',", "", "TaskCreated.instance_id: missing"},
    {EVENT_TASK_STATUS_UPDATED, "'status':'Failed'", "'status':'Complete'",
     "TaskStatusUpdated.error: must be null unless status is Failed"},
    {EVENT_TASK_STATUS_UPDATED, "'status':'Failed'", "'status':'TimedOut'",
     "TaskStatusUpdated.status"},
    {EVENT_TASK_ACKNOWLEDGED, "'t1'", "1", "TaskAcknowledged.task_id: must be a string"},
    {EVENT_TASK_DELETED, "'task_id':'t1'", "'task':'t1'", "TaskDeleted: unknown field \"task\""},
    {EVENT_MASTER_ELECTED, "'node_id':'n2'", "'node_id':'n2:7'x", "JSON"},
    {EVENT_STATE_SNAPSHOT, "'cpu_cores':16", "'cpu_cores':'16'",
     "StateSnapshot.state.nodes.n1.info.cpu_cores: must be an integer"},
    {EVENT_STATE_SNAPSHOT, "'nodes':{'n1':{'node_id':'n1'", "'nodes':{'n9':{'node_id':'n1'",
     "StateSnapshot.state.nodes.n9.node_id: \"n1\" differs from its key"},
    {EVENT_STATE_SNAPSHOT, "'last_applied':{'term':2,'index':7}",
     "'last_applied':{'term':2,'index':-7}", "StateSnapshot.state.last_applied.index"},
    {EVENT_STATE_SNAPSHOT, "'master':{'node_id':'n1'", "'master':{'node_id':'n 1'",
     "StateSnapshot.state.master.node_id"},
    {EVENT_STATE_SNAPSHOT, "'acknowledged':true", "'acknowledged':'yes'",
     "StateSnapshot.state.tasks.t1.acknowledged: must be a boolean"},
    {EVENT_STATE_SNAPSHOT, "'bytes':24}", "'bytes':'hi'}",
     "StateSnapshot.state.tasks.t1.bytes: must be an integer"},
    {EVENT_STATE_SNAPSHOT, "'status':'Ongoing','error':null}]",
     "'status':'Ongoing','error':null},{'node_id':'n2','model_id':'org/tiny','bytes_done':5,"
     "'bytes_total':9,'status':'Ongoing','error':null}]",
     "StateSnapshot.state.downloads[1]: a second download of org/tiny on n2"},
    {EVENT_STATE_SNAPSHOT, "'edges':[", "'edges':[{'from':'n1','to':'n2','rtt_us':1,"
     "'throughput_bytes_per_s':1},", "StateSnapshot.state.edges[1]: a second edge n1 -> n2"},
    {EVENT_STATE_SNAPSHOT, "'downloads':[", "'downloadz':[", "StateSnapshot.state: unknown field"},
};

static void test_bad_cases(void)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const struct bad *b = &bad_cases[i];
        char *text = edit(b->kind, b->from, b->to);
        char what[128];
        snprintf(what, sizeof what, "case %zu (%s)", i, event_kind_name(b->kind));
        expect_refused(text, strlen(text), b->want, what);
        free(text);
    }
    expect_refused("[]", 2, "event: must be an object", "array");
    expect_refused("{", 1, "event: JSON", "truncated");
    expect_refused("", 0, "event: JSON", "empty");
    expect_refused("null", 4, "event: JSON", "null"); /* jansson refuses non-containers */
}

/* Arrays one entry over their limit: interfaces, addresses, shards. */
static void test_counts(void)
{
    char *text = dq(valid[EVENT_NODE_GATHERED_INFO]);
    json_t *j = json_loads(text, 0, NULL);
    free(text);
    json_t *info = json_object_get(j, "info");
    json_t *ifaces = json_object_get(info, "interfaces");
    json_t *addrs = json_object_get(json_array_get(ifaces, 1), "addresses");
    char err[512] = "";
    struct event e;
    while (json_array_size(addrs) < CLUSTER_MAX_ADDRS)
        json_array_append_new(addrs, json_string("10.1.1.1"));
    CHECK(event_from_jsonv(j, &e, err, sizeof err) == 0, "%d addresses: %s", CLUSTER_MAX_ADDRS, err);
    event_clear(&e);
    json_array_append_new(addrs, json_string("10.1.1.1"));
    CHECK(event_from_jsonv(j, &e, err, sizeof err) == CAIRN_EFORMAT &&
              strstr(err, "NodeGatheredInfo.info.interfaces[1].addresses: 65 entries, more than 64"),
          "65 addresses: %s", err);
    json_array_remove(addrs, 0);
    while (json_array_size(ifaces) < CLUSTER_MAX_IFACES)
        json_array_append(ifaces, json_array_get(ifaces, 0));
    CHECK(event_from_jsonv(j, &e, err, sizeof err) == 0, "%d interfaces: %s", CLUSTER_MAX_IFACES,
          err);
    event_clear(&e);
    json_array_append(ifaces, json_array_get(ifaces, 0));
    CHECK(event_from_jsonv(j, &e, err, sizeof err) == CAIRN_EFORMAT &&
              strstr(err, "NodeGatheredInfo.info.interfaces: 65 entries, more than 64"),
          "65 interfaces: %s", err);
    json_decref(j);

    text = dq(valid[EVENT_INSTANCE_CREATED]);
    j = json_loads(text, 0, NULL);
    free(text);
    json_t *inst = json_object_get(j, "instance"), *shards = json_array();
    for (int n = 1; n <= CLUSTER_MAX_SHARDS + 1; n++) {
        json_array_clear(shards);
        for (int i = 0; i < n; i++) {
            char node[16], runner[16];
            snprintf(node, sizeof node, "n%d", i);
            snprintf(runner, sizeof runner, "r%d", i);
            json_array_append_new(shards, json_pack("{s:s, s:s, s:i, s:i, s:i, s:i}", "node_id",
                                                    node, "runner_id", runner, "rank", i,
                                                    "world_size", n, "layer_begin", i,
                                                    "layer_end", i + 1));
        }
        json_object_set(inst, "shards", shards);
        if (n != CLUSTER_MAX_SHARDS && n != CLUSTER_MAX_SHARDS + 1 && n != 1)
            continue;
        int rc = event_from_jsonv(j, &e, err, sizeof err);
        if (n <= CLUSTER_MAX_SHARDS)
            CHECK(rc == 0 && e.instance_created.n_shards == (size_t)n, "%d shards: %s", n, err);
        else
            CHECK(rc == CAIRN_EFORMAT && strstr(err, "InstanceCreated.instance.shards: 257 entries"),
                  "257 shards: %s", err);
        event_clear(&e);
    }
    json_array_clear(shards);
    json_object_set(inst, "shards", shards);
    CHECK(event_from_jsonv(j, &e, err, sizeof err) == CAIRN_EFORMAT &&
              strstr(err, "InstanceCreated.instance.shards: 0 entries"),
          "no shards: %s", err);
    json_decref(shards);
    json_decref(j);
}

/* Strings far over their limits are refused by length, not copied. */
static void test_huge_strings(void)
{
    size_t big = (size_t)2 << 20;
    char *s = malloc(big + 1);
    memset(s, 'a', big);
    s[big] = '\0';
    const char *cases[][3] = {
        {"{\"kind\":\"NodeTimedOut\",\"term\":1,\"index\":0,\"node_id\":\"", "\"}",
         "NodeTimedOut.node_id: 2097152 bytes, more than 64"},
        {"{\"kind\":\"TaskStatusUpdated\",\"term\":1,\"index\":0,\"task_id\":\"t\","
         "\"status\":\"Failed\",\"error\":\"",
         "\"}", "TaskStatusUpdated.error: 2097152 bytes, more than 8192"},
        {"{\"kind\":\"\"", "\"}", "event.kind: 2097152 bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = strlen(cases[i][0]) + big + strlen(cases[i][1]) + 1;
        char *text = malloc(n);
        snprintf(text, n, "%s%s%s", cases[i][0], s, cases[i][1]);
        if (i == 2) /* a huge kind: the string opens inside the prefix */
            snprintf(text, n, "{\"kind\":\"%s\"}", s);
        char what[32];
        snprintf(what, sizeof what, "huge %zu", i);
        expect_refused(text, strlen(text), cases[i][2], what);
        free(text);
    }
    free(s);

    /* Nesting deeper than the parser's limit. */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 200);
    size_t n = (size_t)sprintf(deep, "{\"kind\":\"TaskCreated\",\"params\":");
    for (size_t i = 0; i < depth; i++)
        deep[n++] = '[';
    for (size_t i = 0; i < depth; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    expect_refused(deep, n, "JSON", "deep nesting");
    free(deep);
}

/* Collects (parent, key) of every object member below j, skipping the entries of the state's id-keyed maps (a state may well lack any one of them). */
struct member {
    json_t *parent;
    char key[64];
};

static bool id_map(const char *key)
{
    return !strcmp(key, "nodes") || !strcmp(key, "instances") || !strcmp(key, "runners") ||
           !strcmp(key, "tasks");
}

static void collect(json_t *j, bool is_map, struct member *out, size_t *n, size_t max)
{
    if (json_is_object(j)) {
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) {
            if (*n < max && !is_map) {
                out[*n].parent = j;
                snprintf(out[*n].key, sizeof out[*n].key, "%s", key);
                (*n)++;
            }
            collect(v, !is_map && id_map(key), out, n, max);
        }
    } else if (json_is_array(j)) {
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) collect(v, false, out, n, max);
    }
}

/* A value of another JSON type than v's, which no field accepts in v's place. */
static json_t *wrong_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return json_integer(7);
    case JSON_INTEGER: return json_string("7");
    case JSON_OBJECT: return json_array();
    case JSON_ARRAY: return json_object();
    case JSON_NULL: return json_integer(7);
    default: return json_string("true");
    }
}

/* Every field of every kind, dropped (unless optional) and then given the wrong type, is
 * refused with a message naming it. */
static void test_every_field(void)
{
    enum { MAX = 512 };
    struct member *m = malloc(MAX * sizeof *m);
    for (int k = 0; k < EVENT_KIND_COUNT; k++) {
        char *text = dq(valid[k]);
        json_t *root = json_loads(text, 0, NULL);
        size_t n = 0;
        collect(root, false, m, &n, MAX);
        int failures = 0;
        for (size_t i = 0; i < n; i++) {
            json_t *orig = json_incref(json_object_get(m[i].parent, m[i].key));
            /* optional fields (a runner's data_port and epoch, a download's rate and
             * ETA): only a wrong type is refused */
            bool optional = !strcmp(m[i].key, "data_port") || !strcmp(m[i].key, "bytes_per_s") ||
                            !strcmp(m[i].key, "eta_s") ||
                            (!strcmp(m[i].key, "epoch") && json_object_get(m[i].parent, "restart_count"));
            for (int mode = optional; mode < 2; mode++) {
                if (mode == 0)
                    json_object_del(m[i].parent, m[i].key);
                else
                    json_object_set_new(m[i].parent, m[i].key, wrong_type(orig));
                char err[1024] = "";
                struct event e;
                int rc = event_from_jsonv(root, &e, err, sizeof err);
                /* A kind of another type is refused before anything else is read. */
                bool named = strstr(err, m[i].key) != NULL;
                if (rc != CAIRN_EFORMAT || !named || !all_zero(&e)) {
                    if (failures++ < 5)
                        CHECK(false, "%s: %s field \"%s\": rc %d, message \"%s\"",
                              event_kind_name(k), mode ? "mistyped" : "dropped", m[i].key, rc,
                              err);
                } else {
                    test_passed++;
                }
                if (rc == 0)
                    event_clear(&e);
            }
            json_object_set_new(m[i].parent, m[i].key, orig);
        }
        CHECK(failures == 0, "%s: %d field mutations not refused by name", event_kind_name(k),
              failures);
        /* Restored: still valid. */
        struct event e;
        char err[512] = "";
        CHECK(event_from_jsonv(root, &e, err, sizeof err) == 0, "%s restored: %s",
              event_kind_name(k), err);
        event_clear(&e);
        json_decref(root);
        free(text);
    }
    free(m);
}

/* Every proper prefix of each valid event is refused (none is a whole JSON object). */
static void test_truncations(void)
{
    for (int k = 0; k < EVENT_KIND_COUNT; k++) {
        char *text = dq(valid[k]);
        size_t len = strlen(text);
        int accepted = 0;
        for (size_t cut = 0; cut < len; cut++) {
            char *copy = malloc(cut ? cut : 1); /* exact size so ASan sees overreads */
            memcpy(copy, text, cut);
            char err[256];
            struct event e;
            if (event_from_json(copy, cut, &e, err, sizeof err) == 0) {
                accepted++;
                event_clear(&e);
            }
            free(copy);
        }
        CHECK(accepted == 0, "%s: %d truncations accepted", event_kind_name(k), accepted);
        free(text);
    }
}

/* Events built in C: event_validate applies the decoder's rules. */
static void test_validate(void)
{
    char err[512] = "";
    struct event e;
    event_init(&e, EVENT_NODE_TIMED_OUT, 1, 0);
    snprintf(e.node_timed_out.node_id, sizeof e.node_timed_out.node_id, "bad id");
    CHECK(event_validate(&e, err, sizeof err) == CAIRN_EFORMAT &&
              strstr(err, "NodeTimedOut.node_id: byte 0x20"),
          "bad id: %s", err);

    event_init(&e, EVENT_TASK_STATUS_UPDATED, 0, 0);
    snprintf(e.task_status_updated.task_id, sizeof e.task_status_updated.task_id, "t1");
    CHECK(event_validate(&e, err, sizeof err) == CAIRN_EFORMAT && strstr(err, "term"),
          "term 0: %s", err);

    event_init(&e, EVENT_STATE_SNAPSHOT, 1, 0);
    CHECK(event_validate(&e, err, sizeof err) == CAIRN_EFORMAT && strstr(err, "StateSnapshot"),
          "snapshot without state: %s", err);

    event_init(&e, EVENT_RUNNER_STATUS_UPDATED, 1, 0);
    snprintf(e.runner_status_updated.id, sizeof e.runner_status_updated.id, "r1");
    snprintf(e.runner_status_updated.instance_id, sizeof e.runner_status_updated.instance_id, "i1");
    snprintf(e.runner_status_updated.node_id, sizeof e.runner_status_updated.node_id, "n1");
    e.runner_status_updated.status = (enum cluster_runner_status)99;
    CHECK(event_validate(&e, err, sizeof err) == CAIRN_EFORMAT, "status out of range: %s", err);
    e.runner_status_updated.status = CLUSTER_RUNNER_READY;
    CHECK(event_validate(&e, err, sizeof err) == 0, "runner ok: %s", err);

    event_init(&e, (enum event_kind)EVENT_KIND_COUNT, 1, 0);
    CHECK(event_validate(&e, err, sizeof err) == CAIRN_EFORMAT, "unknown kind: %s", err);
    CHECK(event_kind_name(-1) == NULL && event_kind_name(EVENT_KIND_COUNT) == NULL, "names");
}

/* The id and model alphabets, NUL bytes inside strings built in C, random ids. */
static void test_ids(void)
{
    CHECK(ids_valid_id("Az09._:-") && ids_valid_id("a") && !ids_valid_id("") &&
              !ids_valid_id("a/b") && !ids_valid_id("a b") && !ids_valid_id("a@b") &&
              !ids_valid_id("\xc3\xa9") && !ids_valid_id(NULL),
          "id alphabet");
    char id65[66];
    memset(id65, 'x', 65);
    id65[65] = '\0';
    CHECK(!ids_valid_id(id65) && ids_valid_id(id65 + 1), "id length");
    CHECK(ids_valid_model("org/Model-7B.Q4_K:v1@main+x") && !ids_valid_model("a b") &&
              !ids_valid_model("") && !ids_valid_model("a\"b") && !ids_valid_model("a?b"),
          "model alphabet");

    char a[IDS_ID_MAX + 1], b[IDS_ID_MAX + 1], err[256] = "";
    CHECK(ids_random(a, err, sizeof err) == 0 && ids_random(b, err, sizeof err) == 0, "%s", err);
    CHECK(strlen(a) == 32 && ids_valid_id(a) && strspn(a, "0123456789abcdef") == 32 &&
              strcmp(a, b) != 0,
          "random ids %s %s", a, b);

    /* Through the decoder: every id character, and a NUL only JSON built in C can hold. */
    struct event e;
    const char *text = "{\"kind\":\"NodeTimedOut\",\"term\":1,\"index\":0,"
                       "\"node_id\":\"Az09._:-\"}";
    CHECK(event_from_json(text, strlen(text), &e, err, sizeof err) == 0 &&
              strcmp(e.node_timed_out.node_id, "Az09._:-") == 0,
          "id alphabet through JSON: %s", err);
    event_clear(&e);
    json_t *j = json_pack("{s:s, s:i, s:i, s:o}", "kind", "NodeTimedOut", "term", 1, "index", 0,
                          "node_id", json_stringn("n\0x", 3));
    CHECK(event_from_jsonv(j, &e, err, sizeof err) == CAIRN_EFORMAT &&
              strstr(err, "NodeTimedOut.node_id: holds a NUL byte"),
          "NUL in id: %s", err);
    json_object_set_new(j, "kind", json_stringn("NodeTimedOut\0", 13));
    CHECK(event_from_jsonv(j, &e, err, sizeof err) == CAIRN_EFORMAT &&
              strstr(err, "event.kind: holds a NUL byte"),
          "NUL in kind: %s", err);
    json_decref(j);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_ids);
    RUN(test_round_trip);
    RUN(test_decoded_values);
    RUN(test_bad_cases);
    RUN(test_counts);
    RUN(test_huge_strings);
    RUN(test_every_field);
    RUN(test_truncations);
    RUN(test_validate);
    return test_main_end();
}
