/* Out of memory: every allocation made while decoding an event, applying it or copying
 * a state fails in turn. Each call must then fail cleanly (CAIRN_ENOMEM or a refusal,
 * never a crash or a leak), and a refused cluster_apply must leave the state as it was.
 * malloc and friends are replaced for this process, which sanitizers do not allow, so
 * under ASan the test says so and passes without running. */
#include "ctl/event.h"

#include "base/err.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)

int main(void)
{
    return test_skip("allocation failure injection replaces malloc, which ASan owns");
}

#else

void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t n);
void __libc_free(void *p);

/* Allocations left before the next one fails; < 0: none fails. Only this test's
 * single thread allocates while it is set. */
static long fail_after = -1;
static long live; /* allocations not yet freed, to catch leaks on failure paths */

static bool should_fail(void)
{
    if (fail_after < 0)
        return false;
    if (fail_after == 0)
        return true;
    fail_after--;
    return false;
}

void *malloc(size_t n)
{
    if (should_fail())
        return NULL;
    void *p = __libc_malloc(n);
    live += p != NULL;
    return p;
}

void *calloc(size_t n, size_t size)
{
    if (should_fail())
        return NULL;
    void *p = __libc_calloc(n, size);
    live += p != NULL;
    return p;
}

void *realloc(void *p, size_t n)
{
    if (should_fail())
        return NULL;
    void *q = __libc_realloc(p, n);
    live += p == NULL && q != NULL;
    return q;
}

void free(void *p)
{
    live -= p != NULL;
    __libc_free(p);
}

static char *dq(const char *s)
{
    char *d = strdup(s);
    for (char *p = d; *p; p++)
        if (*p == '\'')
            *p = '"';
    return d;
}

#define INFO                                                                                \
    "{'memory_total_bytes':8,'memory_available_bytes':4,'disk_free_bytes':5,"               \
    "'disk_total_bytes':9,'cpu_model':'cpu','cpu_cores':4,'isa':'avx2','os':'Linux',"       \
    "'hostname':'h','interfaces':[{'name':'eth0','loopback':false,'addresses':['10.0.0.1',"  \
    "'10.0.0.2']},{'name':'lo','loopback':true,'addresses':['127.0.0.1']}],"                \
    "'api_port':52415,'cluster_port':52416}"

/* A state with something in every table, reached through these events from (1, 0). */
static const char *const history[] = {
    "{'kind':'NodeGatheredInfo','term':1,'index':1,'node_id':'n1','when_ms':1,'info':" INFO "}",
    "{'kind':'NodeGatheredInfo','term':1,'index':2,'node_id':'n2','when_ms':2,'info':" INFO "}",
    "{'kind':'TopologyEdgeCreated','term':1,'index':3,'from':'n1','to':'n2','rtt_us':5,"
    "'throughput_bytes_per_s':7}",
    "{'kind':'InstanceCreated','term':1,'index':4,'instance':{'instance_id':'i1',"
    "'model_id':'m1','sharding':'pipeline','shards':[{'node_id':'n1','runner_id':'r1',"
    "'rank':0,'world_size':2,'layer_begin':0,'layer_end':3},{'node_id':'n2',"
    "'runner_id':'r2','rank':1,'world_size':2,'layer_begin':3,'layer_end':8}],"
    "'draft_model':null,'num_draft_tokens':4,'epoch':0}}",
    "{'kind':'RunnerStatusUpdated','term':1,'index':5,'runner_id':'r1','instance_id':'i1',"
    "'node_id':'n1','status':'Failed','error':'boom','restart_count':1}",
    "{'kind':'NodeDownloadProgress','term':1,'index':6,'node_id':'n2','model_id':'m1',"
    "'bytes_done':1,'bytes_total':2,'status':'Failed','error':'gone'}",
    "{'kind':'TaskCreated','term':1,'index':7,'task_id':'t1','task_kind':'TextGeneration',"
    "'instance_id':'i1','node_id':'n1','bytes':30}",
    "{'kind':'TaskCreated','term':1,'index':8,'task_id':'t2','task_kind':'TextGeneration',"
    "'instance_id':'i1','node_id':'n2','bytes':2}",
    "{'kind':'TaskStatusUpdated','term':1,'index':9,'task_id':'t2','status':'Failed',"
    "'error':'bad'}",
    "{'kind':'TaskCreated','term':1,'index':10,'task_id':'t0','task_kind':'TextGeneration',"
    "'instance_id':'i1','node_id':'n1','bytes':2}",
};

/* The next event to apply to that state, one of each kind that allocates or removes. */
static const char *const next[] = {
    "{'kind':'NodeGatheredInfo','term':1,'index':11,'node_id':'n3','when_ms':3,'info':" INFO "}",
    "{'kind':'NodeGatheredInfo','term':1,'index':11,'node_id':'n1','when_ms':3,'info':" INFO "}",
    "{'kind':'NodeTimedOut','term':1,'index':11,'node_id':'n2'}",
    "{'kind':'TopologyEdgeCreated','term':1,'index':11,'from':'n2','to':'n1','rtt_us':5,"
    "'throughput_bytes_per_s':7}",
    "{'kind':'InstanceCreated','term':1,'index':11,'instance':{'instance_id':'i2',"
    "'model_id':'m1','sharding':'tensor','shards':[{'node_id':'n1','runner_id':'r3',"
    "'rank':0,'world_size':1,'layer_begin':0,'layer_end':3}],'draft_model':'d',"
    "'num_draft_tokens':4,'epoch':0}}",
    "{'kind':'RunnerStatusUpdated','term':1,'index':11,'runner_id':'r2','instance_id':'i1',"
    "'node_id':'n2','status':'Failed','error':'oops','restart_count':0}",
    "{'kind':'NodeDownloadProgress','term':1,'index':11,'node_id':'n1','model_id':'m1',"
    "'bytes_done':1,'bytes_total':2,'status':'Failed','error':'gone'}",
    "{'kind':'TaskCreated','term':1,'index':11,'task_id':'t3','task_kind':'TextGeneration',"
    "'instance_id':'i1','node_id':'n1','bytes':21}",
    "{'kind':'TaskStatusUpdated','term':1,'index':11,'task_id':'t1','status':'Failed',"
    "'error':'x'}",
    "{'kind':'StateSnapshot','term':2,'index':0,'state':{'last_applied':{'term':1,'index':1},"
    "'master':{'node_id':'n1','term':1},'nodes':{'n1':{'node_id':'n1','last_seen_ms':1,"
    "'info':" INFO "}},'edges':[],'instances':{},'runners':{'r1':{'runner_id':'r1',"
    "'instance_id':'i1','node_id':'n1','status':'Failed','error':'boom','restart_count':1}},"
    "'tasks':{'t1':{'task_id':'t1','kind':'TextGeneration','instance_id':'i1','node_id':'n1',"
    "'status':'Failed','acknowledged':true,'error':'e','bytes':7}},"
    "'downloads':[{'node_id':'n2','model_id':'m1','bytes_done':1,'bytes_total':2,"
    "'status':'Failed','error':'gone'}]}}",
};

static struct event decode(const char *text)
{
    char *d = dq(text);
    struct event e;
    char err[512] = "";
    if (event_from_json(d, strlen(d), &e, err, sizeof err))
        fprintf(stderr, "bad test event: %s\n", err);
    free(d);
    return e;
}

static struct cluster_state *base_state(void)
{
    struct cluster_state *s = cluster_state_create();
    struct event e;
    char err[512] = "";
    event_init(&e, EVENT_STATE_SNAPSHOT, 1, 0);
    e.state_snapshot.state = cluster_state_create();
    cluster_apply(s, &e, err, sizeof err);
    event_clear(&e);
    for (size_t i = 0; i < sizeof history / sizeof history[0]; i++) {
        e = decode(history[i]);
        if (cluster_apply(s, &e, err, sizeof err))
            fprintf(stderr, "history %zu: %s\n", i, err);
        event_clear(&e);
    }
    return s;
}

/* cluster_apply under every failing allocation in turn. */
static void test_apply_oom(void)
{
    struct cluster_state *s = base_state();
    char *before = cluster_state_to_json(s);
    CHECK(s->n_nodes == 2 && s->n_tasks == 3 && s->n_downloads == 1, "base state");
    for (size_t k = 0; k < sizeof next / sizeof next[0]; k++) {
        struct event e = decode(next[k]);
        /* Expected result, without failures. */
        struct cluster_state *w = cluster_state_copy(s);
        char err[512] = "";
        CHECK(cluster_apply(w, &e, err, sizeof err) == 0, "next %zu: %s", k, err);
        char *want = cluster_state_to_json(w);
        cluster_state_release(w);

        int nomem = 0, bad = 0;
        for (long n = 0;; n++) {
            long live0 = live;
            struct cluster_state *t = cluster_state_copy(s);
            fail_after = n;
            int rc = cluster_apply(t, &e, err, sizeof err);
            bool failed_alloc = fail_after == 0;
            fail_after = -1;
            char *got = cluster_state_to_json(t);
            const char *expect = rc == 0 ? want : before;
            if ((rc != 0 && rc != CAIRN_ENOMEM) || strcmp(got, expect) != 0) {
                if (bad++ < 3)
                    CHECK(false, "next %zu, allocation %ld fails: rc %d (%s), state %s", k, n, rc,
                          err, strcmp(got, expect) ? "wrong" : "right");
            }
            nomem += rc == CAIRN_ENOMEM;
            free(got);
            cluster_state_release(t);
            if (live != live0 && bad++ < 3)
                CHECK(false, "next %zu, allocation %ld fails: %ld blocks leaked", k, n,
                      live - live0);
            if (!failed_alloc) /* every allocation of the call succeeded: done */
                break;
        }
        CHECK(bad == 0, "next %zu (%s): %d wrong results (%d refused for memory)", k,
              event_kind_name(e.kind), bad, nomem);
        event_clear(&e);
        free(want);
    }
    cluster_state_release(s);
    free(before);
}

/* Decoding, encoding and copying under every failing allocation: failures are clean and
 * leak nothing. */
static void test_codec_oom(void)
{
    const char *all[sizeof history / sizeof history[0] + sizeof next / sizeof next[0]];
    size_t n_all = 0;
    for (size_t i = 0; i < sizeof history / sizeof history[0]; i++)
        all[n_all++] = history[i];
    for (size_t i = 0; i < sizeof next / sizeof next[0]; i++)
        all[n_all++] = next[i];
    for (size_t k = 0; k < n_all; k++) {
        char *text = dq(all[k]);
        int leaks = 0, wrong = 0;
        for (long n = 0;; n++) {
            long live0 = live;
            struct event e, c;
            char err[512] = "";
            fail_after = n;
            int rc = event_from_json(text, strlen(text), &e, err, sizeof err);
            int crc = rc == 0 ? event_copy(&c, &e) : -1;
            char *out = rc == 0 ? event_to_json(&e) : NULL;
            bool failed_alloc = fail_after == 0;
            fail_after = -1;
            if (rc != 0 && rc != CAIRN_ENOMEM && rc != CAIRN_EFORMAT)
                wrong++;
            if (crc == 0)
                event_clear(&c);
            if (rc == 0)
                event_clear(&e);
            free(out);
            if (live != live0 && leaks++ < 3)
                CHECK(false, "event %zu, allocation %ld fails: %ld blocks leaked (rc %d %s)", k, n,
                      live - live0, rc, err);
            if (!failed_alloc)
                break;
        }
        CHECK(leaks == 0 && wrong == 0, "event %zu: %d leaks, %d wrong codes", k, leaks, wrong);
        free(text);
    }

    struct cluster_state *s = base_state();
    int leaks = 0;
    for (long n = 0;; n++) {
        long live0 = live;
        fail_after = n;
        struct cluster_state *c = cluster_state_copy(s);
        char *text = cluster_state_to_json(s);
        bool failed_alloc = fail_after == 0;
        fail_after = -1;
        cluster_state_release(c);
        free(text);
        if (live != live0 && leaks++ < 3)
            CHECK(false, "state copy, allocation %ld fails: %ld blocks leaked", n, live - live0);
        if (!failed_alloc)
            break;
    }
    CHECK(leaks == 0, "state copy and JSON: %d leaks", leaks);
    cluster_state_release(s);
}

int main(void)
{
    test_apply_oom();
    test_codec_oom();
    return test_main_end();
}

#endif
