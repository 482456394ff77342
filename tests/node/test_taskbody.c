/* Request bodies on their way to a runner (node/taskbody.h): a body is taken only by the
 * task it names and only when it came from the task's requester; malformed, oversized,
 * duplicate and surplus bodies are refused with a reason; unclaimed bodies expire. */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "ctl/state.h"
#include "node/taskbody.h"
#include "testutil.h"

static int put(struct taskbody_store *s, const char *from, const char *msg, int64_t now, char *err, size_t errlen)
{
    return taskbody_put(s, from, msg, strlen(msg), now, err, errlen);
}

static void test_round_trip(void)
{
    struct taskbody_store *s = taskbody_create();
    json_t *params = json_pack("{s:s, s:i}", "prompt", "hello there", "max_tokens", 8);
    char *msg = NULL, err[256] = "";
    size_t len = 0;
    int64_t bytes = 0;
    CHECK_EQ_INT(taskbody_encode("task-1", params, &msg, &len, &bytes, err, sizeof err), 0);
    CHECK(bytes == (int64_t)json_dumpb(params, NULL, 0, JSON_COMPACT), "bytes %lld are params' compact size",
          (long long)bytes);
    CHECK_EQ_INT(taskbody_put(s, "node-a", msg, len, 1000, err, sizeof err), 0);
    CHECK_EQ_INT(taskbody_count(s), 1);
    json_t *got = NULL;
    CHECK_EQ_INT(taskbody_take(s, "task-2", "node-a", &got, err, sizeof err), CAIRN_ENOTFOUND);
    CHECK_EQ_INT(taskbody_take(s, "task-1", "node-a", &got, err, sizeof err), 0);
    CHECK(got && json_equal(got, params), "the params taken are the ones sent");
    CHECK_EQ_INT(taskbody_count(s), 0);
    json_decref(got);
    got = NULL;
    CHECK_EQ_INT(taskbody_take(s, "task-1", "node-a", &got, err, sizeof err), CAIRN_ENOTFOUND);
    free(msg);
    json_decref(params);
    taskbody_release(s);
}

/* A body from a node other than the requester is never handed out, and does not keep the
 * requester's own body out. */
static void test_wrong_sender(void)
{
    struct taskbody_store *s = taskbody_create();
    char err[256] = "";
    json_t *got = NULL;
    CHECK_EQ_INT(put(s, "rogue", "{\"task_id\":\"t1\",\"params\":{\"prompt\":\"EVIL\"}}", 0, err, sizeof err), 0);
    CHECK_EQ_INT(put(s, "node-a", "{\"task_id\":\"t1\",\"params\":{\"prompt\":\"good\"}}", 0, err, sizeof err), 0);
    CHECK_EQ_INT(taskbody_take(s, "t1", "node-a", &got, err, sizeof err), 0);
    CHECK(got && !strcmp(json_string_value(json_object_get(got, "prompt")) ?: "", "good"), "the requester's body");
    json_decref(got);
    got = NULL;
    CHECK_EQ_INT(put(s, "rogue", "{\"task_id\":\"t2\",\"params\":{\"prompt\":\"EVIL\"}}", 0, err, sizeof err), 0);
    err[0] = 0;
    CHECK_EQ_INT(taskbody_take(s, "t2", "node-a", &got, err, sizeof err), CAIRN_EINVAL);
    CHECK(!got && strstr(err, "rogue") && strstr(err, "node-a"), "refused, naming both: %s", err);
    CHECK_EQ_INT(taskbody_count(s), 1); /* the requester's t1 went, the rogue's t1 waits to expire */
    taskbody_release(s);
}

static void test_malformed(void)
{
    struct taskbody_store *s = taskbody_create();
    const char *bad[][2] = {
        {"not json", "not JSON"},
        {"[1,2]", "task body"},
        {"{\"task_id\":\"t1\"}", "params: missing"},
        {"{\"params\":{}}", "task_id: missing"},
        {"{\"task_id\":\"t 1\",\"params\":{}}", "task_id"},
        {"{\"task_id\":7,\"params\":{}}", "task_id"},
        {"{\"task_id\":\"t1\",\"params\":[]}", "params"},
        {"{\"task_id\":\"t1\",\"params\":{},\"x\":1}", "unknown field"},
        {"{\"task_id\":\"t1\",\"task_id\":\"t2\",\"params\":{}}", "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[256] = "";
        int rc = put(s, "node-a", bad[i][0], 0, err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT && strstr(err, bad[i][1]), "%s: %d '%s' (want '%s')", bad[i][0], rc, err,
              bad[i][1]);
    }
    CHECK_EQ_INT(taskbody_count(s), 0);
    /* params over CLUSTER_MAX_PARAMS: refused by the store and by the encoder */
    size_t big = CLUSTER_MAX_PARAMS + 16;
    char *text = malloc(big + 1);
    memset(text, 'a', big);
    text[big] = 0;
    json_t *params = json_pack("{s:s}", "prompt", text);
    char *msg = NULL, err[256] = "";
    size_t len = 0;
    int64_t bytes = 0;
    CHECK_EQ_INT(taskbody_encode("t1", params, &msg, &len, &bytes, err, sizeof err), CAIRN_ERANGE);
    CHECK(!msg, "nothing encoded");
    json_t *m = json_pack("{s:s, s:O}", "task_id", "t1", "params", params);
    char *raw = json_dumps(m, JSON_COMPACT);
    CHECK_EQ_INT(taskbody_put(s, "node-a", raw, strlen(raw), 0, err, sizeof err), CAIRN_EFORMAT);
    free(raw);
    json_decref(m);
    json_decref(params);
    free(text);
    taskbody_release(s);
}

static void test_bounds(void)
{
    struct taskbody_store *s = taskbody_create();
    char err[256] = "", msg[128];
    CHECK_EQ_INT(put(s, "node-a", "{\"task_id\":\"t0\",\"params\":{}}", 0, err, sizeof err), 0);
    CHECK_EQ_INT(put(s, "node-a", "{\"task_id\":\"t0\",\"params\":{}}", 0, err, sizeof err), CAIRN_ESTATE);
    for (int i = 1; i < TASKBODY_MAX; i++) {
        snprintf(msg, sizeof msg, "{\"task_id\":\"t%d\",\"params\":{}}", i);
        if (put(s, "node-a", msg, 0, err, sizeof err))
            break;
    }
    CHECK_EQ_INT(taskbody_count(s), TASKBODY_MAX);
    CHECK_EQ_INT(put(s, "node-a", "{\"task_id\":\"one-more\",\"params\":{}}", 0, err, sizeof err), CAIRN_EFULL);
    /* Unclaimed bodies expire: past the TTL there is room again. */
    CHECK_EQ_INT(put(s, "node-a", "{\"task_id\":\"late\",\"params\":{}}", TASKBODY_TTL_MS + 1, err, sizeof err), 0);
    CHECK_EQ_INT(taskbody_count(s), 1);
    taskbody_release(s);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_round_trip);
    RUN(test_wrong_sender);
    RUN(test_malformed);
    RUN(test_bounds);
    return test_main_end();
}
