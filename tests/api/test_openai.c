/* OpenAI front-end tests: a real HTTP server on 127.0.0.1 with openai_register over the
 * fake generation backend (fake_gen.h), playing scripts written here: text of n
 * sequences with logprobs, reasoning, tool calls, errors, a flood, or a generation
 * that never ends so that cancel can be watched. The fake's cancel waits for a callback
 * in flight, as a real backend's must, so the front-end's lifetime rules are tested
 * against the strict contract. Every wait is bounded. */
#define _GNU_SOURCE
#include "api/openai.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api/http.h"
#include "base/err.h"
#include "fake_gen.h"
#include "rawhttp.h"
#include "testutil.h"
#include "tok/grammar.h"


/* ---------- the scripts ---------- */

enum fake_mode {
    FAKE_TEXT,         /* per sequence s: "Hel", "lo", " s<s>", then stop */
    FAKE_REASONING,    /* reasoning "think" first, then the text */
    FAKE_TOOLS,        /* no text, two tool calls, finish "tool_calls" */
    FAKE_ERROR_BEFORE, /* ERROR 503 before START */
    FAKE_ERROR_AFTER,  /* START, a delta, ERROR 500 */
    FAKE_SEQ_ERROR,    /* START, a delta, SEQ_DONE "error", END */
    FAKE_HANG,         /* START, a delta per sequence, then waits for cancel */
    FAKE_SYNC,         /* FAKE_TEXT, played inside submit (the fake's sync) */
    FAKE_FLOOD,        /* 4 KiB deltas, FLOOD_DELTAS of them (seconds) unless cancelled */
};

#define FLOOD_DELTAS 20000

static void sleep_us(long us)
{
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static json_t *fake_logprobs(const char *token)
{
    return json_pack("[{s:s,s:f,s:[i],s:[{s:s,s:f,s:[i]}]}]", "token", token, "logprob", -0.5,
                     "bytes", (int)(unsigned char)token[0], "top_logprobs", "token", token,
                     "logprob", -0.5, "bytes", (int)(unsigned char)token[0]);
}

static void play(struct fake_gen_req *q)
{
    struct fake_gen *f = q->f;
    int n = q->n;
    bool lp = q->logprobs;
    struct gen_event ev = {.kind = GEN_EVENT_START, .usage = {.prompt_tokens = 7, .cached_tokens = 3}};
    if (q->script == FAKE_ERROR_BEFORE) {
        ev = (struct gen_event){.kind = GEN_EVENT_ERROR, .status = 503, .message = "all runners busy"};
        fake_gen_emit(q, &ev);
        return;
    }
    if (!fake_gen_emit(q, &ev))
        return;
    if (q->script == FAKE_FLOOD) {
        static char big[4097];
        memset(big, 'x', sizeof big - 1);
        for (int i = 0; i < FLOOD_DELTAS; i++) {
            ev = (struct gen_event){.kind = GEN_EVENT_DELTA, .content = big, .reasoning = ""};
            if (!fake_gen_emit(q, &ev))
                return;
            if (f->delta_sleep_us)
                sleep_us(f->delta_sleep_us);
        }
        ev = (struct gen_event){.kind = GEN_EVENT_SEQ_DONE, .finish = "length"};
        if (fake_gen_emit(q, &ev)) {
            ev = (struct gen_event){.kind = GEN_EVENT_END};
            fake_gen_emit(q, &ev);
        }
        return;
    }
    if (q->script == FAKE_HANG || q->script == FAKE_ERROR_AFTER || q->script == FAKE_SEQ_ERROR) {
        for (int s = 0; s < n; s++) {
            ev = (struct gen_event){.kind = GEN_EVENT_DELTA, .seq = s, .content = "Hel", .reasoning = ""};
            if (!fake_gen_emit(q, &ev))
                return;
        }
        if (q->script == FAKE_ERROR_AFTER) {
            ev = (struct gen_event){.kind = GEN_EVENT_ERROR, .status = 500, .message = "runner crashed"};
            fake_gen_emit(q, &ev);
            return;
        }
        if (q->script == FAKE_SEQ_ERROR) {
            for (int s = 0; s < n; s++) {
                ev = (struct gen_event){.kind = GEN_EVENT_SEQ_DONE, .seq = s, .finish = "error"};
                if (!fake_gen_emit(q, &ev))
                    return;
            }
            ev = (struct gen_event){.kind = GEN_EVENT_END};
            fake_gen_emit(q, &ev);
            return;
        }
        /* Waits for cancel (3 s at most: a front-end that never cancels gets END and
         * fails the test instead of hanging it). */
        fake_gen_wait_cancel(q, 3000);
        ev = (struct gen_event){.kind = GEN_EVENT_END};
        fake_gen_emit(q, &ev);
        return;
    }
    for (int s = 0; s < n; s++) {
        char last[16];
        snprintf(last, sizeof last, " s%d", s);
        const char *parts[] = {"Hel", "lo", last};
        int nparts = q->script == FAKE_TOOLS ? 0 : 3;
        if (q->script == FAKE_REASONING) {
            ev = (struct gen_event){.kind = GEN_EVENT_DELTA, .seq = s, .content = "", .reasoning = "think"};
            if (!fake_gen_emit(q, &ev))
                return;
        }
        for (int i = 0; i < nparts; i++) {
            json_t *l = lp ? fake_logprobs(parts[i]) : NULL;
            ev = (struct gen_event){.kind = GEN_EVENT_DELTA, .seq = s, .content = parts[i],
                                    .reasoning = "", .logprobs = l};
            bool go = fake_gen_emit(q, &ev);
            json_decref(l);
            if (!go)
                return;
            if (f->delta_sleep_us)
                sleep_us(f->delta_sleep_us);
        }
        json_t *calls = NULL;
        if (q->script == FAKE_TOOLS)
            calls = json_pack("[{s:s,s:s,s:{s:s,s:s}},{s:s,s:s,s:{s:s,s:s}}]", "id", "call_abc", "type",
                              "function", "function", "name", "get_weather", "arguments", "{\"city\":\"Paris\"}",
                              "id", "call_def", "type", "function", "function", "name", "get_time", "arguments",
                              "{}");
        ev = (struct gen_event){.kind = GEN_EVENT_SEQ_DONE, .seq = s,
                                .finish = calls ? "tool_calls" : "stop", .tool_calls = calls,
                                .usage = {.completion_tokens = 3}};
        bool go = fake_gen_emit(q, &ev);
        json_decref(calls);
        if (!go)
            return;
    }
    ev = (struct gen_event){.kind = GEN_EVENT_END,
                            .usage = {.prompt_tokens = 7, .cached_tokens = 3,
                                      .completion_tokens = 3 * n, .draft_tokens = 4,
                                      .accepted_draft_tokens = 2}};
    fake_gen_emit(q, &ev);
}

/* ---------- reading replies ---------- */

/* The data of each SSE event of body, in order (a JSON array of strings). */
static json_t *sse_data(const char *body)
{
    json_t *out = json_array();
    const char *p = body;
    while (p && *p) {
        const char *end = strstr(p, "\n\n");
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 6 && strncmp(p, "data: ", 6) == 0)
            json_array_append_new(out, json_stringn(p + 6, len - 6));
        p = end ? end + 2 : NULL;
    }
    return out;
}

static const char *jpath_str(const json_t *j, const char *k1, const char *k2)
{
    const json_t *v = json_object_get(j, k1);
    if (k2)
        v = json_object_get(v, k2);
    return json_string_value(v);
}

/* ---------- fixture ---------- */

struct fixture {
    struct fake_gen fake;
    struct gen gen;
    struct http_server *srv;
    uint16_t port;
};

static bool fixture_start(struct fixture *fx, size_t stream_queue)
{
    fake_gen_init(&fx->fake);
    fx->fake.play = play;
    json_decref(fx->fake.models);
    fx->fake.models = json_pack("[{s:s,s:b,s:n},{s:s,s:b,s:n},{s:b}]", "id", "tiny-model", "ready", 1,
                                "chat_template", "id", "org/other-7b", "ready", 0, "chat_template",
                                "ready", 0);
    fx->gen = (struct gen){.ops = &fake_gen_ops, .self = &fx->fake};
    struct http_config cfg = {.stop_grace_ms = 500, .stream_queue_bytes = stream_queue};
    char err[256] = "";
    int rc = http_server_create(&fx->srv, &cfg, err, sizeof err);
    CHECK(rc == 0, "http_server_create: %s", err);
    if (rc) {
        fake_gen_release(&fx->fake);
        return false;
    }
    rc = openai_register(fx->srv, &fx->gen, err, sizeof err);
    CHECK(rc == 0, "openai_register: %s", err);
    CHECK_EQ_INT(openai_register(fx->srv, &fx->gen, err, sizeof err), CAIRN_EINVAL);
    rc = rc ? rc : http_server_start(fx->srv, err, sizeof err);
    CHECK(rc == 0, "http_server_start: %s", err);
    fx->port = http_server_port(fx->srv);
    return rc == 0;
}

static void fixture_stop(struct fixture *fx)
{
    http_server_release(fx->srv);
    CHECK_EQ_INT(fx->fake.cancels_in_callback, 0);
    fake_gen_release(&fx->fake);
}

/* ---------- tests ---------- */

static void test_params_mapping(struct fixture *fx)
{
    struct fake_gen *f = &fx->fake;
    fake_gen_reset(f, FAKE_TEXT);
    struct rh_resp r;
    rh_post(fx->port, "/v1/chat/completions",
            "{\"model\":\"tiny-model\",\"messages\":["
            "{\"role\":\"developer\",\"content\":\"be brief\"},"
            "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"part one\"},"
            "{\"type\":\"text\",\"text\":\"part two\"}],\"name\":\"bob\"},"
            "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
            "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
            "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}],"
            "\"max_tokens\":10,\"max_completion_tokens\":33,\"temperature\":0.5,\"top_p\":0.9,"
            "\"top_k\":7,\"min_p\":0.1,\"seed\":42,\"presence_penalty\":0.5,"
            "\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,\"stop\":[\"a\",\"bb\"],"
            "\"n\":2,\"logit_bias\":{\"15\":-100,\"7\":2.5},\"logprobs\":true,\"top_logprobs\":3,"
            "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
            "\"description\":\"d\",\"parameters\":{\"type\":\"object\"}}}],\"tool_choice\":\"auto\","
            "\"user\":\"u1\",\"response_format\":{\"type\":\"text\"},\"some_future_field\":[1],"
            "\"reasoning_effort\":\"none\",\"chat_template_kwargs\":{\"foo\":1},\"ignore_eos\":true}",
            &r);
    CHECK(r.status == 200, "status %d body %s", r.status, r.body);
    fake_gen_join(f);
    pthread_mutex_lock(&f->mu);
    const struct textgen_params *p = &f->last;
    CHECK(strcmp(p->model, "tiny-model") == 0, "model %s", p->model);
    CHECK(p->prompt == NULL, "prompt set");
    CHECK_EQ_INT(json_array_size(p->messages), 4);
    const json_t *m = p->messages;
    CHECK(rh_streq(jpath_str(json_array_get(m, 0), "role", NULL), "system"), "developer -> system");
    CHECK(rh_streq(jpath_str(json_array_get(m, 0), "content", NULL), "be brief"), "content 0");
    const char *flat = jpath_str(json_array_get(m, 1), "content", NULL);
    CHECK(flat && strcmp(flat, "part one\npart two") == 0, "flattened [%s]", flat ? flat : "(null)");
    CHECK(rh_streq(jpath_str(json_array_get(m, 1), "name", NULL), "bob"), "name kept");
    const json_t *a = json_array_get(m, 2);
    CHECK(json_is_null(json_object_get(a, "content")), "assistant content null kept");
    const json_t *tc = json_array_get(json_object_get(a, "tool_calls"), 0);
    CHECK(tc && rh_streq(jpath_str(tc, "function", "name"), "f") &&
              rh_streq(jpath_str(tc, "id", NULL), "c1"),
          "assistant tool_calls kept");
    CHECK(rh_streq(jpath_str(json_array_get(m, 3), "role", NULL), "tool") &&
              rh_streq(jpath_str(json_array_get(m, 3), "tool_call_id", NULL), "c1"),
          "tool message");
    CHECK_EQ_INT(p->max_tokens, 33);
    CHECK(p->sampling.temperature == 0.5f && p->sampling.top_p == 0.9f && p->sampling.top_k == 7 &&
              p->sampling.min_p == 0.1f && p->sampling.presence_penalty == 0.5f &&
              p->sampling.frequency_penalty == -0.5f && p->sampling.repeat_penalty == 1.1f,
          "sampling %g %g %d %g %g %g %g", p->sampling.temperature, p->sampling.top_p,
          p->sampling.top_k, p->sampling.min_p, p->sampling.presence_penalty,
          p->sampling.frequency_penalty, p->sampling.repeat_penalty);
    CHECK_EQ_INT(p->sampling.seed, 42);
    CHECK(p->n_stop == 2 && strcmp(p->stop[0], "a") == 0 && strcmp(p->stop[1], "bb") == 0,
          "stop list (%d)", p->n_stop);
    CHECK_EQ_INT(p->n, 2);
    bool b15 = false, b7 = false;
    for (int i = 0; i < p->n_bias; i++) {
        b15 |= p->bias[i].token == 15 && p->bias[i].bias == -100.0f;
        b7 |= p->bias[i].token == 7 && p->bias[i].bias == 2.5f;
    }
    CHECK(p->n_bias == 2 && b15 && b7, "logit_bias (%d)", p->n_bias);
    CHECK(p->logprobs && p->top_logprobs == 3, "logprobs %d %d", p->logprobs, p->top_logprobs);
    CHECK(json_array_size(p->tools) == 1 &&
              rh_streq(jpath_str(json_array_get(p->tools, 0), "function", "name"), "get_weather") &&
              json_is_object(json_object_get(json_object_get(json_array_get(p->tools, 0), "function"),
                                             "parameters")),
          "tools");
    CHECK(json_is_false(json_object_get(p->template_kwargs, "enable_thinking")) &&
              json_integer_value(json_object_get(p->template_kwargs, "foo")) == 1,
          "template_kwargs from reasoning_effort none and chat_template_kwargs");
    CHECK(p->ignore_eos && p->reasoning && p->add_generation_prompt, "flags");
    pthread_mutex_unlock(&f->mu);
    rh_free(&r);

    /* Small variations, one field at a time. */
    struct {
        const char *extra;
        int check;
    } cases[] = {
        {"\"stop\":\"END\"", 1},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"t\"}}],\"tool_choice\":\"none\"", 2},
        {"\"enable_thinking\":false", 3},
        {"\"reasoning_effort\":\"high\"", 4},
        {"\"reasoning_effort\":\"none\",\"chat_template_kwargs\":{\"enable_thinking\":true}", 5},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"t\"}}],"
         "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"t\"}}", 6},
        {"\"max_tokens\":5,\"top_k\":-1,\"temperature\":0", 7},
        {"\"seed\":-1", 8},
        {"\"enable_thinking\":true,\"reasoning_effort\":\"none\"", 9},
        {"\"max_tokens\":null,\"stop\":null,\"tools\":null,\"n\":null", 10},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
         "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]}}}", 11},
        {"\"response_format\":{\"type\":\"json_object\"}", 12},
        {"\"grammar\":\"root ::= [a-z]+\\n\"", 13},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"t\"}}],\"tool_choice\":\"required\"", 14},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[1024];
        snprintf(body, sizeof body,
                 "{\"model\":\"tiny-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],%s}",
                 cases[i].extra);
        rh_post(fx->port, "/v1/chat/completions", body, &r);
        CHECK(r.status == 200, "case %zu: status %d %s", i, r.status, r.body);
        fake_gen_join(f);
        pthread_mutex_lock(&f->mu);
        const json_t *kw = p->template_kwargs;
        switch (cases[i].check) {
        case 1:
            CHECK(p->n_stop == 1 && strcmp(p->stop[0], "END") == 0, "stop string");
            break;
        case 2:
            CHECK(p->tools == NULL, "tool_choice none drops tools");
            break;
        case 3:
            CHECK(json_is_false(json_object_get(kw, "enable_thinking")) && json_object_size(kw) == 1,
                  "enable_thinking false");
            break;
        case 4:
            CHECK(rh_streq(json_string_value(json_object_get(kw, "reasoning_effort")), "high") &&
                      !json_object_get(kw, "enable_thinking"),
                  "reasoning_effort high");
            break;
        case 5:
            CHECK(json_is_true(json_object_get(kw, "enable_thinking")), "kwargs win");
            break;
        case 6:
            CHECK(json_array_size(p->tools) == 1 && p->force_tool && strcmp(p->force_tool, "t") == 0,
                  "named tool_choice keeps tools and forces the call");
            break;
        case 11:
        case 12:
        case 13: {
            /* The grammar the runner gets: compiled, it takes what the request asked for. */
            struct grammar *g = NULL;
            char gerr[256];
            const char *yes = cases[i].check == 11 ? "{\"a\": 5}" : cases[i].check == 12 ? "{\"x\":[]}" : "abc";
            const char *no = cases[i].check == 11 ? "{\"a\": \"5\"}" : cases[i].check == 12 ? "[1]" : "ab1";
            CHECK(p->grammar && grammar_parse(&g, p->grammar, strlen(p->grammar), "root", gerr, sizeof gerr) == 0 &&
                      grammar_matches(g, yes, strlen(yes)) && !grammar_matches(g, no, strlen(no)) && !p->force_tool,
                  "case %d: grammar %s", cases[i].check, p->grammar ? p->grammar : "(none)");
            grammar_release(g);
            break;
        }
        case 14:
            CHECK(p->force_tool && p->force_tool[0] == 0 && !p->grammar, "tool_choice required forces a call");
            break;
        case 7:
            CHECK(p->max_tokens == 5 && p->sampling.top_k == 0 && p->sampling.temperature == 0.0f,
                  "max_tokens %lld top_k %d", (long long)p->max_tokens, p->sampling.top_k);
            break;
        case 8:
        case 10:
            CHECK(p->sampling.seed <= (uint64_t)IDS_COUNTER_MAX, "seed in range");
            CHECK(p->n == 1 && p->max_tokens == 0 && p->n_stop == 0 && !p->tools &&
                      !p->template_kwargs && !p->logprobs,
                  "defaults");
            break;
        case 9:
            CHECK(json_is_true(json_object_get(kw, "enable_thinking")), "enable_thinking over effort");
            break;
        }
        pthread_mutex_unlock(&f->mu);
        rh_free(&r);
    }

    /* Unseeded requests draw different seeds. */
    uint64_t seeds[3];
    for (int i = 0; i < 3; i++) {
        rh_post(fx->port, "/v1/chat/completions",
                "{\"model\":\"tiny-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
        fake_gen_join(f);
        pthread_mutex_lock(&f->mu);
        seeds[i] = f->last.sampling.seed;
        pthread_mutex_unlock(&f->mu);
        rh_free(&r);
    }
    CHECK(seeds[0] != seeds[1] || seeds[1] != seeds[2], "seeds %llu %llu %llu",
          (unsigned long long)seeds[0], (unsigned long long)seeds[1], (unsigned long long)seeds[2]);

    /* Completions: a raw prompt, no template, legacy integer logprobs. */
    const char *prompts[] = {"\"prompt\":\"Once upon\"", "\"prompt\":[\"Once upon\"]"};
    for (int i = 0; i < 2; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"tiny-model\",%s,\"logprobs\":2,\"max_tokens\":4}",
                 prompts[i]);
        rh_post(fx->port, "/v1/completions", body, &r);
        CHECK(r.status == 200, "completions %d: %d %s", i, r.status, r.body);
        fake_gen_join(f);
        pthread_mutex_lock(&f->mu);
        CHECK(p->prompt && strcmp(p->prompt, "Once upon") == 0 && !p->messages, "prompt %d", i);
        CHECK(p->logprobs && p->top_logprobs == 2 && p->max_tokens == 4 && !p->reasoning,
              "completion params");
        pthread_mutex_unlock(&f->mu);
        rh_free(&r);
    }
}

static void check_usage(const json_t *u, int n)
{
    CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) == 7 &&
              json_integer_value(json_object_get(u, "completion_tokens")) == 3 * n &&
              json_integer_value(json_object_get(u, "total_tokens")) == 7 + 3 * n &&
              json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                 "cached_tokens")) == 3 &&
              json_integer_value(json_object_get(u, "draft_tokens")) == 4 &&
              json_integer_value(json_object_get(u, "accepted_draft_tokens")) == 2,
          "usage %s", u ? json_dumps(u, JSON_COMPACT) : "(none)");
}

static void test_nonstream(struct fixture *fx)
{
    struct fake_gen *f = &fx->fake;
    enum fake_mode modes[] = {FAKE_TEXT, FAKE_SYNC, FAKE_REASONING};
    for (size_t k = 0; k < 3; k++) {
        fake_gen_reset(f, modes[k]);
        f->sync = modes[k] == FAKE_SYNC;
        struct rh_resp r;
        rh_post(fx->port, "/v1/chat/completions",
             "{\"model\":\"tiny-model\",\"n\":2,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
             &r);
        CHECK(r.status == 200, "mode %zu status %d %s", k, r.status, r.body);
        json_t *j = rh_json(&r);
        CHECK(j && rh_streq(jpath_str(j, "object", NULL), "chat.completion"), "object");
        CHECK(jpath_str(j, "id", NULL) && strncmp(jpath_str(j, "id", NULL), "chatcmpl-", 9) == 0, "id");
        CHECK(j && rh_streq(jpath_str(j, "model", NULL), "tiny-model"), "model");
        CHECK(j && json_integer_value(json_object_get(j, "created")) > 1600000000, "created");
        const json_t *ch = json_object_get(j, "choices");
        CHECK_EQ_INT(json_array_size(ch), 2);
        for (int i = 0; i < 2 && j; i++) {
            const json_t *c = json_array_get(ch, (size_t)i);
            char want[32];
            snprintf(want, sizeof want, "Hello s%d", i);
            const json_t *msg = json_object_get(c, "message");
            CHECK(json_integer_value(json_object_get(c, "index")) == i, "index");
            CHECK(rh_streq(jpath_str(msg, "role", NULL), "assistant"), "role");
            const char *content = jpath_str(msg, "content", NULL);
            CHECK(content && strcmp(content, want) == 0, "content [%s] want [%s]",
                  content ? content : "(null)", want);
            CHECK(rh_streq(jpath_str(c, "finish_reason", NULL), "stop"), "finish");
            CHECK(json_is_null(json_object_get(c, "logprobs")), "logprobs null");
            CHECK(!json_object_get(msg, "tool_calls"), "no tool_calls");
            const char *rc = jpath_str(msg, "reasoning_content", NULL);
            if (modes[k] == FAKE_REASONING)
                CHECK(rc && strcmp(rc, "think") == 0, "reasoning [%s]", rc ? rc : "(none)");
            else
                CHECK(!rc, "no reasoning_content");
        }
        check_usage(json_object_get(j, "usage"), 2);
        json_decref(j);
        rh_free(&r);
    }

    /* Logprobs, chat form. */
    fake_gen_reset(f, FAKE_TEXT);
    struct rh_resp r;
    rh_post(fx->port, "/v1/chat/completions",
            "{\"model\":\"tiny-model\",\"logprobs\":true,\"top_logprobs\":1,"
            "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &r);
    json_t *j = rh_json(&r);
    const json_t *lc = json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                       "logprobs"), "content");
    CHECK(json_array_size(lc) == 3 && rh_streq(jpath_str(json_array_get(lc, 1), "token", NULL), "lo"),
          "chat logprobs %s", r.body);
    json_decref(j);
    rh_free(&r);

    /* Completions, with legacy logprobs. */
    fake_gen_reset(f, FAKE_TEXT);
    rh_post(fx->port, "/v1/completions", "{\"model\":\"tiny-model\",\"prompt\":\"x\",\"logprobs\":1}", &r);
    CHECK(r.status == 200, "completions %d %s", r.status, r.body);
    j = rh_json(&r);
    const json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK(j && rh_streq(jpath_str(j, "object", NULL), "text_completion") &&
              jpath_str(j, "id", NULL) && strncmp(jpath_str(j, "id", NULL), "cmpl-", 5) == 0,
          "completion object");
    CHECK(c0 && rh_streq(jpath_str(c0, "text", NULL), "Hello s0") &&
              rh_streq(jpath_str(c0, "finish_reason", NULL), "stop"),
          "completion choice %s", r.body);
    const json_t *lp = json_object_get(c0, "logprobs");
    const json_t *offs = json_object_get(lp, "text_offset");
    CHECK(json_array_size(json_object_get(lp, "tokens")) == 3 &&
              json_integer_value(json_array_get(offs, 0)) == 0 &&
              json_integer_value(json_array_get(offs, 1)) == 3 &&
              json_integer_value(json_array_get(offs, 2)) == 5 &&
              json_is_object(json_array_get(json_object_get(lp, "top_logprobs"), 0)) &&
              json_array_size(json_object_get(lp, "token_logprobs")) == 3,
          "completion logprobs %s", r.body);
    check_usage(json_object_get(j, "usage"), 1);
    json_decref(j);
    rh_free(&r);
}

/* Parses a streamed reply: every event but [DONE] as JSON into *chunks; true when the
 * last event was [DONE]. */
static bool stream_chunks(const struct rh_resp *r, json_t **chunks)
{
    json_t *data = sse_data(r->body);
    *chunks = json_array();
    bool done = false;
    size_t i;
    json_t *d;
    json_array_foreach(data, i, d) {
        done = rh_streq(json_string_value(d), "[DONE]");
        if (!done)
            json_array_append_new(*chunks, json_loads(json_string_value(d), 0, NULL));
    }
    json_decref(data);
    return done;
}

static void test_stream(struct fixture *fx)
{
    struct fake_gen *f = &fx->fake;
    for (int usage = 0; usage < 2; usage++) {
        fake_gen_reset(f, FAKE_REASONING);
        f->delta_sleep_us = 1000;
        struct rh_resp r;
        char body[512];
        snprintf(body, sizeof body,
                 "{\"model\":\"tiny-model\",\"n\":2,\"stream\":true,%s\"messages\":"
                 "[{\"role\":\"user\",\"content\":\"hi\"}]}",
                 usage ? "\"stream_options\":{\"include_usage\":true}," : "");
        rh_post(fx->port, "/v1/chat/completions", body, &r);
        char ct[128];
        CHECK(r.status == 200 && rh_header(&r, "Content-Type", ct, sizeof ct) &&
                  strncmp(ct, "text/event-stream", 17) == 0,
              "stream status %d", r.status);
        json_t *chunks;
        bool done = stream_chunks(&r, &chunks);
        CHECK(done, "stream ends with [DONE]: %s", r.body);
        char content[2][64] = {"", ""}, reasoning[2][64] = {"", ""};
        bool first_seen[2] = {false, false}, role_first[2] = {false, false};
        int finishes[2] = {0, 0};
        const char *id0 = jpath_str(json_array_get(chunks, 0), "id", NULL);
        bool ids_same = id0 != NULL, objects_ok = true, usage_ok = true, after_finish = false;
        size_t i;
        json_t *c;
        size_t n = json_array_size(chunks);
        json_array_foreach(chunks, i, c) {
            const char *id = jpath_str(c, "id", NULL);
            ids_same &= id && id0 && strcmp(id, id0) == 0;
            objects_ok &= jpath_str(c, "object", NULL) &&
                          rh_streq(jpath_str(c, "object", NULL), "chat.completion.chunk");
            const json_t *ch = json_object_get(c, "choices");
            if (usage && i == n - 1) {
                CHECK(json_array_size(ch) == 0, "usage chunk has no choices");
                check_usage(json_object_get(c, "usage"), 2);
                continue;
            }
            usage_ok &= usage ? json_is_null(json_object_get(c, "usage")) : !json_object_get(c, "usage");
            const json_t *choice = json_array_get(ch, 0);
            int idx = (int)json_integer_value(json_object_get(choice, "index"));
            if (idx < 0 || idx > 1) {
                CHECK(0, "bad index %d", idx);
                continue;
            }
            const json_t *delta = json_object_get(choice, "delta");
            if (!first_seen[idx]) {
                first_seen[idx] = true;
                role_first[idx] = jpath_str(delta, "role", NULL) &&
                                  rh_streq(jpath_str(delta, "role", NULL), "assistant");
            }
            if (finishes[idx])
                after_finish = true;
            const char *t = jpath_str(delta, "content", NULL);
            if (t)
                strncat(content[idx], t, sizeof content[idx] - strlen(content[idx]) - 1);
            t = jpath_str(delta, "reasoning_content", NULL);
            if (t)
                strncat(reasoning[idx], t, sizeof reasoning[idx] - strlen(reasoning[idx]) - 1);
            const char *fr = jpath_str(choice, "finish_reason", NULL);
            if (fr) {
                finishes[idx]++;
                CHECK(strcmp(fr, "stop") == 0, "finish %s", fr);
            }
        }
        CHECK(ids_same && objects_ok, "ids and objects of chunks");
        CHECK(usage_ok, "usage member of chunks (include_usage %d)", usage);
        CHECK(!after_finish, "no chunk after a choice's finish");
        for (int s = 0; s < 2; s++) {
            char want[32];
            snprintf(want, sizeof want, "Hello s%d", s);
            CHECK(role_first[s], "first chunk of choice %d has role assistant", s);
            CHECK(strcmp(content[s], want) == 0, "choice %d content [%s]", s, content[s]);
            CHECK(strcmp(reasoning[s], "think") == 0, "choice %d reasoning [%s]", s, reasoning[s]);
            CHECK_EQ_INT(finishes[s], 1);
        }
        json_decref(chunks);
        rh_free(&r);
    }

    /* Completions stream. */
    fake_gen_reset(f, FAKE_TEXT);
    struct rh_resp r;
    rh_post(fx->port, "/v1/completions",
            "{\"model\":\"tiny-model\",\"prompt\":\"x\",\"stream\":true,\"logprobs\":0}", &r);
    json_t *chunks;
    CHECK(stream_chunks(&r, &chunks), "completion stream [DONE]");
    char text[64] = "";
    const char *last_finish = NULL;
    size_t i;
    json_t *c;
    json_array_foreach(chunks, i, c) {
        CHECK(rh_streq(jpath_str(c, "object", NULL), "text_completion"), "object");
        const json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
        const char *t = jpath_str(ch, "text", NULL);
        if (t)
            strncat(text, t, sizeof text - strlen(text) - 1);
        if (jpath_str(ch, "finish_reason", NULL))
            last_finish = jpath_str(ch, "finish_reason", NULL);
        if (t && t[0])
            CHECK(json_array_size(json_object_get(json_object_get(ch, "logprobs"), "tokens")) == 1,
                  "chunk logprobs");
    }
    CHECK(strcmp(text, "Hello s0") == 0 && last_finish && strcmp(last_finish, "stop") == 0,
          "completion stream text [%s]", text);
    json_decref(chunks);
    rh_free(&r);
}

static void test_tool_calls(struct fixture *fx)
{
    struct fake_gen *f = &fx->fake;
    const char *req = "{\"model\":\"tiny-model\",%s\"messages\":[{\"role\":\"user\",\"content\":\"w?\"}],"
                      "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}]}";
    char body[512];
    fake_gen_reset(f, FAKE_TOOLS);
    snprintf(body, sizeof body, req, "");
    struct rh_resp r;
    rh_post(fx->port, "/v1/chat/completions", body, &r);
    json_t *j = rh_json(&r);
    const json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    const json_t *msg = json_object_get(c, "message");
    const json_t *tc = json_array_get(json_object_get(msg, "tool_calls"), 0);
    CHECK(r.status == 200 && json_is_null(json_object_get(msg, "content")), "content null: %s", r.body);
    CHECK(rh_streq(jpath_str(c, "finish_reason", NULL), "tool_calls"), "finish tool_calls");
    CHECK(tc && rh_streq(jpath_str(tc, "id", NULL), "call_abc") &&
              rh_streq(jpath_str(tc, "type", NULL), "function") &&
              rh_streq(jpath_str(tc, "function", "name"), "get_weather") &&
              rh_streq(jpath_str(tc, "function", "arguments"), "{\"city\":\"Paris\"}") &&
              !json_object_get(tc, "index"),
          "tool call %s", r.body);
    json_decref(j);
    rh_free(&r);

    fake_gen_reset(f, FAKE_TOOLS);
    snprintf(body, sizeof body, req, "\"stream\":true,");
    rh_post(fx->port, "/v1/chat/completions", body, &r);
    json_t *chunks;
    CHECK(stream_chunks(&r, &chunks), "[DONE]");
    bool saw_call = false, saw_finish = false;
    size_t i;
    json_t *ch;
    json_array_foreach(chunks, i, ch) {
        const json_t *choice = json_array_get(json_object_get(ch, "choices"), 0);
        const json_t *calls = json_object_get(json_object_get(choice, "delta"), "tool_calls");
        const json_t *t0 = json_array_get(calls, 0);
        if (t0) {
            saw_call = json_integer_value(json_object_get(t0, "index")) == 0 &&
                       json_is_integer(json_object_get(t0, "index")) &&
                       rh_streq(jpath_str(t0, "id", NULL), "call_abc") &&
                       rh_streq(jpath_str(t0, "function", "name"), "get_weather") &&
                       rh_streq(jpath_str(t0, "function", "arguments"), "{\"city\":\"Paris\"}");
        }
        const char *fr = jpath_str(choice, "finish_reason", NULL);
        if (fr)
            saw_finish = strcmp(fr, "tool_calls") == 0;
    }
    CHECK(saw_call && saw_finish, "streamed tool call and finish: %s", r.body);
    json_decref(chunks);
    rh_free(&r);

    /* parallel_tool_calls false: only the first call, whole and streamed */
    for (int stream = 0; stream < 2; stream++) {
        for (int parallel = 0; parallel < 2; parallel++) {
            char opts[80];
            snprintf(opts, sizeof opts, "%s\"parallel_tool_calls\":%s,", stream ? "\"stream\":true," : "",
                     parallel ? "true" : "false");
            fake_gen_reset(f, FAKE_TOOLS);
            snprintf(body, sizeof body, req, opts);
            rh_post(fx->port, "/v1/chat/completions", body, &r);
            size_t n_calls = 0;
            if (stream) {
                json_t *cs = NULL;
                CHECK(stream_chunks(&r, &cs), "[DONE]");
                json_array_foreach(cs, i, ch) {
                    const json_t *choice = json_array_get(json_object_get(ch, "choices"), 0);
                    n_calls += json_array_size(json_object_get(json_object_get(choice, "delta"), "tool_calls"));
                }
                json_decref(cs);
            } else {
                json_t *w = rh_json(&r);
                const json_t *m = json_object_get(json_array_get(json_object_get(w, "choices"), 0), "message");
                n_calls = json_array_size(json_object_get(m, "tool_calls"));
                json_decref(w);
            }
            CHECK(r.status == 200 && n_calls == (parallel ? 2u : 1u), "stream %d parallel %d: %zu calls: %s", stream,
                  parallel, n_calls, r.body);
            rh_free(&r);
        }
    }
    fake_gen_reset(f, FAKE_TEXT);
    rh_post(fx->port, "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                              "\"parallel_tool_calls\":1}", &r);
    CHECK(r.status == 400 && strstr(r.body, "parallel_tool_calls"), "parallel_tool_calls 1: %s", r.body);
    rh_free(&r);
}

static void test_bad_requests(struct fixture *fx)
{
    struct fake_gen *f = &fx->fake;
    fake_gen_reset(f, FAKE_TEXT);
    const char *msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    static const struct {
        const char *path, *ctype, *body, *param; /* param NULL: JSON null */
    } cases[] = {
        {"/v1/chat/completions", NULL, "{\"model\":\"m\",", NULL},
        {"/v1/chat/completions", NULL, "[1,2]", NULL},
        {"/v1/chat/completions", NULL, "", NULL},
        {"/v1/chat/completions", NULL, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", NULL},
        {"/v1/chat/completions", "application/json", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "model"},
        {"/v1/chat/completions", "application/json", "{\"model\":7,%s}", "model"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"bad model\",%s}", "model"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\"}", "messages"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":[]}", "messages"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":{}}", "messages"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":[\"hi\"]}", "messages[0]"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0].role"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":[{\"content\":\"x\"}]}", "messages[0].role"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":5}]}", "messages[1].content"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}", "messages[0].content"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", "messages[0].content[0].type"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":3}]}]}", "messages[0].content[0].text"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":{}}]}]}", "messages[0].tool_calls[0].function"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",\"messages\":[{\"role\":\"tool\",\"content\":\"1\",\"tool_call_id\":5}]}", "messages[0].tool_call_id"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"max_tokens\":-3}", "max_tokens"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"max_tokens\":0}", "max_tokens"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"max_completion_tokens\":\"5\"}", "max_completion_tokens"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"max_tokens\":1.5}", "max_tokens"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"temperature\":2.5}", "temperature"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"temperature\":\"hot\"}", "temperature"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"top_p\":0}", "top_p"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"top_p\":1.01}", "top_p"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"top_k\":true}", "top_k"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"min_p\":-0.1}", "min_p"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"seed\":-7}", "seed"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"presence_penalty\":3}", "presence_penalty"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"frequency_penalty\":-2.01}", "frequency_penalty"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"repetition_penalty\":0}", "repetition_penalty"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"stop\":5}", "stop"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"stop\":[\"a\",7]}", "stop[1]"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"stop\":[\"\"]}", "stop[0]"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\",\"11\",\"12\",\"13\",\"14\",\"15\",\"16\",\"17\"]}", "stop"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"logit_bias\":[1]}", "logit_bias"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"logit_bias\":{\"abc\":1}}", "logit_bias.abc"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"logit_bias\":{\"-5\":1}}", "logit_bias.-5"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"logit_bias\":{\"5\":101}}", "logit_bias.5"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"logit_bias\":{\"5\":\"x\"}}", "logit_bias.5"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"logit_bias\":{\"7\":1,\"07\":2}}", "logit_bias.07"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"logprobs\":1}", "logprobs"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"logprobs\":true,\"top_logprobs\":50}", "top_logprobs"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"n\":100}", "n"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"n\":0}", "n"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"stream\":\"yes\"}", "stream"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"stream\":true,\"stream_options\":{\"include_usage\":1}}", "stream_options.include_usage"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"tools\":{}}", "tools"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"tools\":[{\"type\":\"retrieval\"}]}", "tools[0]"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"tools\":[{\"type\":\"function\",\"function\":{\"description\":\"x\"}}]}", "tools[0].function"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"tool_choice\":\"sometimes\"}", "tool_choice"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"response_format\":{\"type\":\"yaml\"}}", "response_format"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":\"x\"}}", "response_format.json_schema"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"multipleOf\":2}}}}}}", "response_format.json_schema.schema"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"grammar\":\"root ::= foo\"}", "grammar"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"chat_template_kwargs\":[]}", "chat_template_kwargs"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"enable_thinking\":\"no\"}", "enable_thinking"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"reasoning_effort\":\"extreme\"}", "reasoning_effort"},
        {"/v1/chat/completions", "application/json", "{\"model\":\"m\",%s,\"reasoning_effort\":3}", "reasoning_effort"},
        {"/v1/completions", "application/json", "{\"model\":\"m\"}", "prompt"},
        {"/v1/completions", "application/json", "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"],\"n\":9}", "prompt"},
        {"/v1/completions", "application/json", "{\"model\":\"m\",\"prompt\":[[1,-2]]}", "prompt[0][1]"},
        {"/v1/completions", "application/json", "{\"model\":\"m\",\"prompt\":[[1],[2],\"x\",{}]}", "prompt[3]"},
        {"/v1/completions", "application/json", "{\"model\":\"m\",\"prompt\":[]}", "prompt"},
        {"/v1/completions", "application/json", "{\"model\":\"m\",\"prompt\":[{}]}", "prompt[0]"},
        {"/v1/completions", "application/json", "{\"model\":\"m\",\"prompt\":5}", "prompt"},
        {"/v1/completions", "application/json", "{\"model\":\"m\",\"prompt\":\"x\",\"logprobs\":21}", "logprobs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[2048];
        snprintf(body, sizeof body, cases[i].body, msgs);
        struct rh_resp r;
        rh_request(fx->port, "POST", cases[i].path, cases[i].ctype, body, &r);
        json_t *j = rh_json(&r);
        const json_t *e = json_object_get(j, "error");
        const json_t *param = json_object_get(e, "param");
        bool param_ok = cases[i].param ? json_is_string(param) &&
                                             rh_streq(json_string_value(param), cases[i].param)
                                       : json_is_null(param);
        CHECK(r.status == 400 && param_ok && json_is_string(json_object_get(e, "message")) &&
                  rh_streq(jpath_str(e, "type", NULL), "invalid_request_error") &&
                  json_is_null(json_object_get(e, "code")),
              "case %zu (%s): status %d, want param %s, got %s", i, cases[i].body, r.status,
              cases[i].param ? cases[i].param : "null", r.body);
        json_decref(j);
        rh_free(&r);
    }
    CHECK_EQ_INT(fake_gen_count(f, &f->submits), 0);

    /* A JSON body that does not parse, sent as JSON, is refused by the server itself. */
    struct rh_resp r;
    rh_post(fx->port, "/v1/chat/completions", "{\"model\":", &r);
    CHECK(r.status == 400, "malformed JSON as application/json: %d", r.status);
    rh_free(&r);
    rh_post(fx->port, "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", &r);
    CHECK(r.status == 400, "invalid UTF-8 as application/json: %d", r.status);
    rh_free(&r);
}

static void check_error(const struct rh_resp *r, int status, const char *type, const char *code)
{
    json_t *j = rh_json(r);
    const json_t *e = json_object_get(j, "error");
    const json_t *c = json_object_get(e, "code");
    bool code_ok = code ? json_is_string(c) && rh_streq(json_string_value(c), code) : json_is_null(c);
    CHECK(r->status == status && jpath_str(e, "type", NULL) &&
              rh_streq(jpath_str(e, "type", NULL), type) && code_ok &&
              json_is_string(json_object_get(e, "message")),
          "want %d %s %s, got %d %s", status, type, code ? code : "null", r->status, r->body);
    json_decref(j);
}

static void test_backend_errors(struct fixture *fx)
{
    struct fake_gen *f = &fx->fake;
    const char *chat = "{\"model\":\"tiny-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]%s}";
    char body[256];
    for (int stream = 0; stream < 2; stream++) {
        snprintf(body, sizeof body, chat, stream ? ",\"stream\":true" : "");
        struct rh_resp r;
        char ra[16];
        fake_gen_reset(f, FAKE_TEXT);
        f->refuse_status = 404;
        rh_post(fx->port, "/v1/chat/completions", body, &r);
        check_error(&r, 404, "invalid_request_error", "model_not_found");
        CHECK(!rh_header(&r, "Retry-After", ra, sizeof ra), "no Retry-After on 404");
        rh_free(&r);

        fake_gen_reset(f, FAKE_TEXT);
        f->refuse_status = 413;
        rh_post(fx->port, "/v1/chat/completions", body, &r);
        check_error(&r, 413, "invalid_request_error", "context_length_exceeded");
        rh_free(&r);

        fake_gen_reset(f, FAKE_TEXT);
        f->refuse_status = 503;
        rh_post(fx->port, "/v1/chat/completions", body, &r);
        check_error(&r, 503, "server_error", NULL);
        CHECK(rh_header(&r, "Retry-After", ra, sizeof ra) && strcmp(ra, "1") == 0, "Retry-After: 1");
        rh_free(&r);

        /* An ERROR before START is a plain JSON error, streamed or not. */
        fake_gen_reset(f, FAKE_ERROR_BEFORE);
        rh_post(fx->port, "/v1/chat/completions", body, &r);
        check_error(&r, 503, "server_error", NULL);
        CHECK(rh_header(&r, "Retry-After", ra, sizeof ra) && strcmp(ra, "1") == 0,
              "Retry-After on ERROR 503");
        CHECK(strstr(r.body, "all runners busy") != NULL, "message kept: %s", r.body);
        rh_free(&r);

        /* After START: an error object (the stream's last event, no [DONE]). */
        enum fake_mode late[] = {FAKE_ERROR_AFTER, FAKE_SEQ_ERROR};
        for (int k = 0; k < 2; k++) {
            fake_gen_reset(f, late[k]);
            rh_post(fx->port, "/v1/chat/completions", body, &r);
            if (!stream) {
                check_error(&r, 500, "server_error", NULL);
            } else {
                json_t *chunks;
                bool done = stream_chunks(&r, &chunks);
                const json_t *last = json_array_get(chunks, json_array_size(chunks) - 1);
                CHECK(r.status == 200 && !done && json_is_object(json_object_get(last, "error")) &&
                          rh_streq(jpath_str(json_object_get(last, "error"), "type", NULL),
                                 "server_error"),
                      "late error %d: %s", k, r.body);
                json_decref(chunks);
            }
            rh_free(&r);
        }
    }
}

/* Opens a stream and reads until marker; the socket (the caller closes it), or -1. */
static int open_until(uint16_t port, const char *path, const char *body, const char *marker)
{
    int fd = rh_open(port, "POST", path, "application/json", body);
    if (fd < 0)
        return -1;
    char *raw = NULL;
    rh_read_all(fd, &raw, marker);
    CHECK(strstr(raw, marker) != NULL, "marker %s not seen: %s", marker, raw);
    free(raw);
    return fd;
}

static void test_disconnect(struct fixture *fx)
{
    struct fake_gen *f = &fx->fake;
    const char *stream_body = "{\"model\":\"tiny-model\",\"stream\":true,\"n\":2,"
                              "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    /* Streamed: the client reads the first content and hangs up. */
    fake_gen_reset(f, FAKE_HANG);
    int fd = open_until(fx->port, "/v1/chat/completions", stream_body, "\"content\":\"Hel\"");
    CHECK(fd >= 0, "connect");
    if (fd >= 0)
        close(fd);
    CHECK(fake_gen_wait_count(f, &f->cancels, 1, 5000), "cancel after hang-up");
    sleep_us(100000);
    CHECK_EQ_INT(fake_gen_count(f, &f->cancels), 1);
    CHECK_EQ_INT(fake_gen_count(f, &f->cancels_after_end), 0);
    CHECK_EQ_INT(fake_gen_count(f, &f->double_cancels), 0);
    CHECK(fake_gen_join(f), "script ended");

    /* Not streamed: the client gives up while waiting. */
    fake_gen_reset(f, FAKE_HANG);
    fd = rh_open(fx->port, "POST", "/v1/chat/completions", "application/json",
                 "{\"model\":\"tiny-model\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}");
    CHECK(fake_gen_wait_count(f, &f->submits, 1, 5000), "submitted");
    sleep_us(20000);
    if (fd >= 0)
        close(fd);
    CHECK(fake_gen_wait_count(f, &f->cancels, 1, 5000), "cancel after hang-up (not streamed)");
    sleep_us(50000);
    CHECK_EQ_INT(fake_gen_count(f, &f->cancels), 1);
    CHECK(fake_gen_join(f), "script ended");

    /* A request that ended normally is not cancelled when its client leaves. */
    fake_gen_reset(f, FAKE_TEXT);
    struct rh_resp r;
    rh_post(fx->port, "/v1/chat/completions", stream_body, &r);
    CHECK(r.status == 200, "status %d", r.status);
    rh_free(&r);
    fake_gen_join(f);
    sleep_us(20000);
    CHECK_EQ_INT(fake_gen_count(f, &f->cancels) + fake_gen_count(f, &f->cancels_after_end), 0);

    /* Hang-ups at random points of a stream racing its end: at most one cancel each,
     * never a callback after it (the fake counts), nothing leaked (ASan). */
    uint64_t seed = 12345;
    int total_cancels = 0, total_submits = 0;
    for (int it = 0; it < 40; it++) {
        fake_gen_reset(f, FAKE_TEXT);
        f->delta_sleep_us = (int)(test_rand_u64(&seed) % 3000);
        fd = rh_open(fx->port, "POST", "/v1/chat/completions", "application/json", stream_body);
        if (fd < 0) {
            CHECK(0, "connect %d", it);
            continue;
        }
        sleep_us((long)(test_rand_u64(&seed) % 12000));
        close(fd);
        CHECK(fake_gen_join(f), "script %d ended", it);
        sleep_us(2000);
        CHECK(fake_gen_count(f, &f->double_cancels) == 0, "iteration %d: cancelled twice", it);
        total_cancels += fake_gen_count(f, &f->cancels);
        total_submits += fake_gen_count(f, &f->submits);
    }
    printf("hang-ups: %d requests reached the backend, %d were cancelled\n", total_submits,
           total_cancels);
}

static void test_stop_cancels(void)
{
    struct fixture fx;
    if (!fixture_start(&fx, 0))
        return;
    fake_gen_reset(&fx.fake, FAKE_HANG);
    int fd = open_until(fx.port, "/v1/chat/completions",
                        "{\"model\":\"tiny-model\",\"stream\":true,\"messages\":[{\"role\":"
                        "\"user\",\"content\":\"hi\"}]}",
                        "\"content\":\"Hel\"");
    http_server_stop(fx.srv);
    CHECK_EQ_INT(fake_gen_count(&fx.fake, &fx.fake.cancels), 1);
    if (fd >= 0)
        close(fd);
    fixture_stop(&fx);
}

/* A client that stops reading overflows its stream's queue: the stream is cut off and
 * the generation cancelled (else the fake floods on to FLOOD_DELTAS and ends). */
static void test_too_slow(void)
{
    struct fixture fx;
    if (!fixture_start(&fx, 4096))
        return;
    struct fake_gen *f = &fx.fake;
    fake_gen_reset(f, FAKE_FLOOD);
    f->delta_sleep_us = 200; /* the cancel has time to come */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(fx.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const char *body = "{\"model\":\"tiny-model\",\"stream\":true,\"prompt\":\"x\"}";
    char head[256];
    int n = snprintf(head, sizeof head,
                     "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    bool sent = connect(fd, (struct sockaddr *)&a, sizeof a) == 0 && rh_send_all(fd, head, (size_t)n) == 0;
    CHECK(sent, "request sent");
    CHECK(fake_gen_wait_count(f, &f->cancels, 1, 20000), "a stream too slow to read cancels its generation");
    CHECK(fake_gen_join(f), "flood ended");
    close(fd);
    fixture_stop(&fx);
}

static void test_models(struct fixture *fx)
{
    struct rh_resp r;
    rh_request(fx->port, "GET", "/v1/models", NULL, NULL, &r);
    json_t *j = rh_json(&r);
    const json_t *data = json_object_get(j, "data");
    CHECK(r.status == 200 && rh_streq(jpath_str(j, "object", NULL), "list") &&
              json_array_size(data) == 2,
          "models %d %s", r.status, r.body);
    const json_t *m1 = json_array_get(data, 1);
    CHECK(m1 && rh_streq(jpath_str(m1, "id", NULL), "org/other-7b") &&
              rh_streq(jpath_str(m1, "object", NULL), "model") &&
              rh_streq(jpath_str(m1, "owned_by", NULL), "cairn") &&
              json_is_integer(json_object_get(m1, "created")) && json_object_size(m1) == 4,
          "model entry %s", r.body);
    json_decref(j);
    rh_free(&r);

    rh_request(fx->port, "GET", "/v1/models/org/other-7b", NULL, NULL, &r);
    j = rh_json(&r);
    CHECK(r.status == 200 && rh_streq(jpath_str(j, "id", NULL), "org/other-7b"), "one model: %s",
          r.body);
    json_decref(j);
    rh_free(&r);

    rh_request(fx->port, "GET", "/v1/models/nope", NULL, NULL, &r);
    check_error(&r, 404, "invalid_request_error", "model_not_found");
    j = rh_json(&r);
    CHECK(rh_streq(jpath_str(json_object_get(j, "error"), "param", NULL), "model") &&
              strstr(r.body, "The model 'nope' does not exist"),
          "404 names the model: %s", r.body);
    json_decref(j);
    rh_free(&r);
}

/* Found by fuzz_api: "7" and "07" both named token 7, so the runner, reading the ids
 * back from an object, got one entry of two. One spelling per id now. */
static void test_logit_bias_ids(void)
{
    static const struct {
        const char *bias;
        int status, n_bias;
    } cases[] = {
        {"{\"0\":1,\"7\":2}", 0, 2},
        {"{\"7\":1,\"07\":2}", 400, 0},
        {"{\"00\":1}", 400, 0},
        {"{\"2147483647\":-100}", 0, 1},
        {"{\"2147483648\":1}", 400, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"model\":\"m\",\"prompt\":\"hi\",\"logit_bias\":%s}", cases[i].bias);
        json_t *body = json_loads(text, 0, NULL);
        struct textgen_params p;
        struct openai_reply_opts o = {0};
        struct json_err e = {{0}, {0}};
        textgen_params_init(&p);
        int status = openai_parse_request(OPENAI_COMPLETION, body, &p, &o, &e);
        CHECK(status == cases[i].status && (status || p.n_bias == cases[i].n_bias) &&
                  (!status || !strncmp(e.message, "logit_bias.", 11)),
              "%s: status %d, %d entries, '%s'", cases[i].bias, status, p.n_bias, e.message);
        textgen_params_clear(&p);
        json_decref(body);
    }
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    struct fixture fx;
    if (fixture_start(&fx, 0)) {
        RUN(test_params_mapping, &fx);
        RUN(test_nonstream, &fx);
        RUN(test_stream, &fx);
        RUN(test_tool_calls, &fx);
        RUN(test_bad_requests, &fx);
        RUN(test_backend_errors, &fx);
        RUN(test_disconnect, &fx);
        RUN(test_models, &fx);
        fixture_stop(&fx);
    }
    RUN(test_stop_cancels);
    RUN(test_too_slow);
    RUN(test_logit_bias_ids);
    return test_main_end();
}
