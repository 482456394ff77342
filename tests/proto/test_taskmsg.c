/* Typed task lines (proto/taskmsg.h): each kind survives encode then decode member for
 * member, and a malformed line (a sequence index out of range or negative, a missing
 * member, a wrong type, an unknown type, a count out of range) is refused naming the
 * member, never read as zeros. */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "proto/taskmsg.h"
#include "testutil.h"

/* Encodes m, decodes the text back into *out (task_msg_clear after). */
static int round_trip(const struct task_msg *m, struct task_msg *out)
{
    json_t *j = task_msg_to_json(m);
    CHECK(j != NULL, "a %s message encodes", runner_msg_type_name(m->type));
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    char err[256] = "";
    int rc = text ? task_msg_decode(text, strlen(text), out, err, sizeof err) : CAIRN_ENOMEM;
    CHECK(rc == 0, "decodes: %s (%s)", err, text ? text : "");
    free(text);
    return rc;
}

static void test_round_trip(void)
{
    struct task_msg m = {.type = RUNNER_MSG_START, .task_id = "t1", .prompt_tokens = 12, .cached_tokens = 4,
                         .has_stats = true,
                         .stats = {.running = 2, .queued = 1, .slots = 8, .kv_blocks_used = 10, .kv_blocks_total = 64,
                                   .preemptions = 3, .pipeline = true, .pipeline_steps = 99, .pipeline_rows_logits = 5}};
    struct task_msg d;
    if (!round_trip(&m, &d)) {
        CHECK(d.type == RUNNER_MSG_START && !strcmp(d.task_id, "t1") && d.prompt_tokens == 12 &&
                  d.cached_tokens == 4 && !d.error && d.status == 0,
              "start");
        CHECK(d.has_stats && d.stats.slots == 8 && d.stats.kv_blocks_total == 64 && d.stats.preemptions == 3 &&
                  d.stats.pipeline && d.stats.pipeline_steps == 99 && d.stats.pipeline_rows_logits == 5,
              "start's stats");
        task_msg_clear(&d);
    }
    m = (struct task_msg){.type = RUNNER_MSG_START, .task_id = "t1", .error = "the prompt is empty", .status = 400};
    if (!round_trip(&m, &d)) {
        CHECK(d.error && !strcmp(d.error, "the prompt is empty") && d.status == 400 && !d.has_stats, "refused start");
        task_msg_clear(&d);
    }
    json_t *lp = json_pack("[{s:s, s:f}]", "token", "a", "logprob", -0.5);
    m = (struct task_msg){.type = RUNNER_MSG_OUTPUT, .task_id = "t1", .seq = 3, .content = "héllo", .reasoning = "",
                          .logprobs = lp};
    if (!round_trip(&m, &d)) {
        CHECK(d.seq == 3 && !strcmp(d.content, "héllo") && !strcmp(d.reasoning, "") && json_equal(d.logprobs, lp),
              "output");
        task_msg_clear(&d);
    }
    json_decref(lp);
    json_t *calls = json_pack("[{s:s}]", "id", "call_1");
    m = (struct task_msg){.type = RUNNER_MSG_SEQ_DONE, .task_id = "t1", .seq = 1, .seq_finish = TASK_SEQ_TOOL_CALLS,
                          .stop_sequence = "END", .tool_calls = calls, .completion_tokens = 7, .prompt_tokens = 12,
                          .draft_tokens = 6, .accepted_draft_tokens = 4, .prompt_ms = 1.5, .predicted_ms = 20.25};
    if (!round_trip(&m, &d)) {
        CHECK(d.seq == 1 && d.seq_finish == TASK_SEQ_TOOL_CALLS && !strcmp(d.stop_sequence, "END") &&
                  json_equal(d.tool_calls, calls) && d.completion_tokens == 7 && d.draft_tokens == 6 &&
                  d.accepted_draft_tokens == 4 && d.prompt_ms == 1.5 && d.predicted_ms == 20.25,
              "seq_done");
        task_msg_clear(&d);
    }
    json_decref(calls);
    m = (struct task_msg){.type = RUNNER_MSG_DONE, .task_id = "t1", .finish = RUNNER_FINISH_LENGTH, .n_generated = 9};
    if (!round_trip(&m, &d)) {
        CHECK(d.finish == RUNNER_FINISH_LENGTH && d.n_generated == 9 && !d.error, "done");
        task_msg_clear(&d);
    }
}

/* Values no reader takes are not written either. */
static void test_encode_refuses(void)
{
    struct task_msg bad[] = {
        {.type = RUNNER_MSG_OUTPUT, .task_id = "t1", .seq = RUNNER_MAX_SEQS},
        {.type = RUNNER_MSG_OUTPUT, .task_id = "t1", .seq = -1},
        {.type = RUNNER_MSG_OUTPUT, .task_id = "bad id"},
        {.type = RUNNER_MSG_START, .task_id = "t1", .error = "x", .status = 200},
        {.type = RUNNER_MSG_START, .task_id = "t1", .prompt_tokens = 1, .cached_tokens = 2},
        {.type = RUNNER_MSG_SEQ_DONE, .task_id = "t1", .draft_tokens = 1, .accepted_draft_tokens = 2},
        {.type = RUNNER_MSG_SEQ_DONE, .task_id = "t1", .predicted_ms = -1},
        {.type = RUNNER_MSG_DONE, .task_id = "t1", .n_generated = -5},
        {.type = RUNNER_MSG_HEARTBEAT, .task_id = "t1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *j = task_msg_to_json(&bad[i]);
        CHECK(j == NULL, "bad message %zu is not encoded", i);
        json_decref(j);
    }
}

/* An embedding line: the vector as base64 of little-endian float32, the same text
 * Python's base64.b64encode(struct.pack('<3f', 0.5, -2.0, 1/3)) gives; malformed
 * vectors refused. */
static void test_embedding(void)
{
    const float v[3] = {0.5f, -2.0f, 1.0f / 3};
    char *b64 = task_embedding_encode(v, 3);
    CHECK(b64 && !strcmp(b64, "AAAAPwAAAMCrqqo+"), "base64 of 3 floats: %s", b64 ? b64 : "(null)");
    struct task_msg m = {.type = RUNNER_MSG_EMBEDDING, .task_id = "t1", .index = 7, .prompt_tokens = 5, .embedding = b64};
    struct task_msg got;
    if (round_trip(&m, &got) == 0) {
        float w[3];
        char err[128];
        CHECK(got.index == 7 && got.prompt_tokens == 5 && got.dim == 3, "index %d tokens %lld dim %d", got.index,
              (long long)got.prompt_tokens, got.dim);
        CHECK(task_embedding_decode(&got, w, err, sizeof err) == 0 && !memcmp(v, w, sizeof v), "decode: %s", err);
        task_msg_clear(&got);
    }
    free(b64);
    const char *bad[][2] = {
        {"\"AAAAPwAAAMCrqqo\"", "not base64"},   /* not a multiple of 4 characters */
        {"\"AAAAPwAAAMCrqq==\"", "not base64"},  /* 10 bytes: not whole floats */
        {"\"AAAA*wAAAMCrqqo+\"", "not base64"},  /* a character outside the alphabet */
        {"\"AA=APwAAAMCrqqo+\"", "not base64"},  /* padding inside */
        {"\"\"", "not base64"},
        {"7", "must be a string"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[256], err[256] = "";
        snprintf(line, sizeof line, "{\"type\":\"embedding\",\"task_id\":\"t\",\"index\":0,\"prompt_tokens\":1,"
                 "\"embedding\":%s}", bad[i][0]);
        struct task_msg x;
        int rc = task_msg_decode(line, strlen(line), &x, err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT && strstr(err, bad[i][1]), "%s: rc %d, %s", line, rc, err);
    }
    char line[256], err[256] = "";
    snprintf(line, sizeof line, "{\"type\":\"embedding\",\"task_id\":\"t\",\"index\":2048,\"prompt_tokens\":1,"
             "\"embedding\":\"AAAAPw==\"}");
    struct task_msg x;
    CHECK(task_msg_decode(line, strlen(line), &x, err, sizeof err) == CAIRN_EFORMAT && strstr(err, "embedding.index"),
          "index out of range: %s", err);
    /* a NaN decodes only to a refusal */
    snprintf(line, sizeof line, "{\"type\":\"embedding\",\"task_id\":\"t\",\"index\":0,\"prompt_tokens\":1,"
             "\"embedding\":\"AADAfw==\"}");
    if (task_msg_decode(line, strlen(line), &x, err, sizeof err) == 0) {
        float w[1];
        CHECK(task_embedding_decode(&x, w, err, sizeof err) == CAIRN_EFORMAT && strstr(err, "finite"), "NaN: %s", err);
        task_msg_clear(&x);
    } else {
        CHECK(0, "a NaN's line is well formed: %s", err);
    }
}

static void test_malformed(void)
{
    const char *cases[][2] = {
        {"{\"type\":\"output\",\"task_id\":\"t\",\"seq\":2147483648,\"content\":\"x\",\"reasoning\":\"\"}", "output.seq"},
        {"{\"type\":\"output\",\"task_id\":\"t\",\"seq\":-1,\"content\":\"x\",\"reasoning\":\"\"}", "output.seq"},
        {"{\"type\":\"output\",\"task_id\":\"t\",\"seq\":256,\"content\":\"x\",\"reasoning\":\"\"}", "output.seq"},
        {"{\"type\":\"output\",\"task_id\":\"t\",\"seq\":\"0\",\"content\":\"x\",\"reasoning\":\"\"}", "output.seq"},
        {"{\"type\":\"output\",\"task_id\":\"t\",\"seq\":0.5,\"content\":\"x\",\"reasoning\":\"\"}", "output.seq"},
        {"{\"type\":\"output\",\"task_id\":\"t\",\"content\":\"x\",\"reasoning\":\"\"}", "output.seq: missing"},
        {"{\"type\":\"output\",\"task_id\":\"t\",\"seq\":0,\"reasoning\":\"\"}", "output.content: missing"},
        {"{\"type\":\"output\",\"task_id\":\"t\",\"seq\":0,\"content\":7,\"reasoning\":\"\"}", "output.content"},
        {"{\"type\":\"output\",\"task_id\":\"t\",\"seq\":0,\"content\":\"\",\"reasoning\":\"\",\"logprobs\":{}}",
         "output.logprobs"},
        {"{\"type\":\"output\",\"seq\":0,\"content\":\"\",\"reasoning\":\"\"}", "output.task_id"},
        {"{\"type\":\"start\",\"task_id\":\"t\"}", "start.prompt_tokens"},
        {"{\"type\":\"start\",\"task_id\":\"t\",\"prompt_tokens\":5,\"cached_tokens\":6}", "start.cached_tokens"},
        {"{\"type\":\"start\",\"task_id\":\"t\",\"error\":\"no\",\"status\":200}", "start.status"},
        {"{\"type\":\"start\",\"task_id\":\"t\",\"error\":\"no\"}", "start.status"},
        {"{\"type\":\"start\",\"task_id\":\"t\",\"prompt_tokens\":1,\"cached_tokens\":0,\"stats\":[]}", "start.stats"},
        {"{\"type\":\"start\",\"task_id\":\"t\",\"prompt_tokens\":1,\"cached_tokens\":0,\"stats\":{\"running\":1}}",
         "start.stats.queued"},
        {"{\"type\":\"seq_done\",\"task_id\":\"t\",\"seq\":0,\"finish\":\"boom\",\"completion_tokens\":1}",
         "seq_done.finish"},
        {"{\"type\":\"seq_done\",\"task_id\":\"t\",\"seq\":0,\"finish\":\"stop\"}", "seq_done.completion_tokens"},
        {"{\"type\":\"seq_done\",\"task_id\":\"t\",\"seq\":0,\"finish\":\"stop\",\"completion_tokens\":1,"
         "\"tool_calls\":\"x\"}", "seq_done.tool_calls"},
        {"{\"type\":\"seq_done\",\"task_id\":\"t\",\"seq\":0,\"finish\":\"stop\",\"completion_tokens\":1,"
         "\"prompt_ms\":-3}", "seq_done.prompt_ms"},
        {"{\"type\":\"seq_done\",\"task_id\":\"t\",\"seq\":0,\"finish\":\"stop\",\"completion_tokens\":1,"
         "\"draft_tokens\":1,\"accepted_draft_tokens\":3}", "seq_done.accepted_draft_tokens"},
        {"{\"type\":\"done\",\"task_id\":\"t\",\"finish\":\"stop\"}", "done.n_generated"},
        {"{\"type\":\"done\",\"task_id\":\"t\",\"finish\":\"tool_calls\",\"n_generated\":1}", "done.finish"},
        {"{\"type\":\"done\",\"task_id\":\"t\",\"finish\":\"stop\",\"n_generated\":1,\"error\":5}", "done.error"},
        {"{\"type\":\"heartbeat\"}", "not one of"},
        {"{\"task_id\":\"t\"}", "type"},
        {"[1]", "type"},
        {"nonsense", "not JSON"},
        {"{\"type\":\"done\",\"type\":\"done\",\"task_id\":\"t\",\"finish\":\"stop\",\"n_generated\":1}", "not JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct task_msg m;
        char err[256] = "";
        int rc = task_msg_decode(cases[i][0], strlen(cases[i][0]), &m, err, sizeof err);
        CHECK(rc == CAIRN_EFORMAT && strstr(err, cases[i][1]), "%s: %d '%s' (want '%s')", cases[i][0], rc, err,
              cases[i][1]);
        CHECK(m.root == NULL && m.type == 0 && m.task_id[0] == 0, "a refused line leaves nothing behind");
    }
    /* Unknown members are ignored: a newer runner may add some. */
    const char *newer = "{\"type\":\"done\",\"task_id\":\"t\",\"finish\":\"stop\",\"n_generated\":1,\"colour\":\"red\"}";
    struct task_msg m;
    char err[256] = "";
    CHECK(task_msg_decode(newer, strlen(newer), &m, err, sizeof err) == 0, "an unknown member is ignored: %s", err);
    task_msg_clear(&m);
}

/* Random corruptions of valid lines: decode either refuses or gives values in range. */
static void test_fuzz(void)
{
    const char *valid[] = {
        "{\"type\":\"output\",\"task_id\":\"t1\",\"seq\":3,\"content\":\"ab\",\"reasoning\":\"\"}",
        "{\"type\":\"seq_done\",\"task_id\":\"t1\",\"seq\":0,\"finish\":\"length\",\"stop_sequence\":null,"
        "\"tool_calls\":null,\"completion_tokens\":5,\"draft_tokens\":2,\"accepted_draft_tokens\":1}",
        "{\"type\":\"start\",\"task_id\":\"t1\",\"prompt_tokens\":9,\"cached_tokens\":3}",
    };
    uint64_t rng = 42;
    int refused = 0, taken = 0;
    for (int it = 0; it < 20000; it++) {
        const char *v = valid[it % 3];
        size_t n = strlen(v);
        char buf[512];
        memcpy(buf, v, n);
        for (int k = 0; k < 1 + (int)(test_rand_u64(&rng) % 3); k++)
            buf[test_rand_u64(&rng) % n] = "0123456789-\"{}[],:e.x"[test_rand_u64(&rng) % 21];
        struct task_msg m;
        char err[256];
        if (task_msg_decode(buf, n, &m, err, sizeof err)) {
            refused++;
            continue;
        }
        taken++;
        bool ok = m.seq >= 0 && m.seq < RUNNER_MAX_SEQS && m.prompt_tokens >= 0 && m.cached_tokens <= m.prompt_tokens &&
                  m.completion_tokens >= 0 && m.accepted_draft_tokens <= m.draft_tokens;
        if (!ok)
            CHECK(ok, "a decoded line has values out of range: %.*s", (int)n, buf);
        task_msg_clear(&m);
    }
    CHECK(refused > 0 && taken > 0, "the corruptions were both refused (%d) and taken (%d)", refused, taken);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_round_trip);
    RUN(test_encode_refuses);
    RUN(test_embedding);
    RUN(test_malformed);
    RUN(test_fuzz);
    return test_main_end();
}
