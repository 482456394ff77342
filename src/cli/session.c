/* Readying a model for cairn run (session.h). */
#include "cli/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/err.h"
#include "cli/progress.h"

#define POLL_MS 250

/* Whether s is an id as the cluster makes them (the node's own check is on its side;
 * this keeps what we print and put in paths plain). */
static bool plain_id(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (!n || n > max)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-", s[i]))
            return false;
    return true;
}

const char *session_instance_of(const json_t *state, const char *model_id)
{
    const char *key;
    json_t *in;
    json_object_foreach(json_object_get(state, "instances"), key, in) {
        const char *m = json_string_value(json_object_get(in, "model_id"));
        if (m && !strcmp(m, model_id) && plain_id(key, IDS_ID_MAX))
            return key;
    }
    return NULL;
}

/* Whether the cluster's model list (GET /models) names id. 1 yes, 0 no, else an error. */
static int cluster_has(const struct client *api, const char *id, char *err, size_t errlen)
{
    json_t *j = NULL;
    int status = client_json(api, "GET", "/models", NULL, &j, err, errlen);
    if (status != 200) {
        json_decref(j);
        return CAIRN_EIO;
    }
    size_t i;
    json_t *m;
    int found = 0;
    json_array_foreach(json_object_get(j, "models"), i, m) {
        const char *mid = json_string_value(json_object_get(m, "id"));
        if (mid && !strcmp(mid, id) && !json_string_value(json_object_get(m, "error")))
            found = 1;
    }
    json_decref(j);
    return found;
}

/* A pull's progress lines (Ollama's) as the progress bar's. */
struct pull_view {
    struct progress_bar bar;
    char error[512];
    char model[HUBREF_TEXT_MAX];
    bool success;
    uint64_t done, total; /* of the file last reported */
    const char *ref;
};

static int on_pull_line(void *ctx, char *line, size_t len)
{
    struct pull_view *v = ctx;
    if (!len)
        return 0;
    json_t *j = json_loads(line, 0, NULL);
    const char *status = json_string_value(json_object_get(j, "status"));
    const char *error = json_string_value(json_object_get(j, "error"));
    int rc = 0;
    if (error || !status) {
        snprintf(v->error, sizeof v->error, "%s", error ? error : "a malformed progress line from the node");
        rc = 1;
    } else {
        /* Ollama's lines: "pulling manifest", "pulling DIGEST" with total and completed
         * (of one file), "verifying sha256 digest", "writing manifest", "success" */
        json_int_t total = json_integer_value(json_object_get(j, "total"));
        json_int_t done = json_integer_value(json_object_get(j, "completed"));
        if (json_object_get(j, "total") && total >= 0 && done >= 0 && done <= total)
            v->done = (uint64_t)done, v->total = (uint64_t)total;
        struct hub_progress p = {.status = "downloading", .id = v->ref, .file = "", .sha256 = "", .part = 1, .parts = 1,
                                 .file_done = v->done, .done = v->done, .file_total = v->total, .total = v->total};
        if (!strcmp(status, "pulling manifest"))
            p.status = "listing";
        else if (!strcmp(status, "verifying sha256 digest"))
            p.status = "verifying";
        else if (!strcmp(status, "success"))
            p.status = "success";
        else if (!json_object_get(j, "total"))
            p.status = NULL; /* "writing manifest" */
        if (!strcmp(status, "success")) {
            const char *m = json_string_value(json_object_get(j, "model"));
            if (m)
                snprintf(v->model, sizeof v->model, "%s", m);
            v->success = true;
        }
        if (p.status)
            progress_show(&v->bar, &p);
    }
    json_decref(j);
    return rc;
}

/* Pulls ref onto the node (POST /api/pull, streamed); the model's id into id. */
static int pull(const struct client *api, const char *ref, const atomic_bool *cancel, char *id, char *err,
                size_t errlen)
{
    fprintf(stderr, "pulling %s onto the node\n", ref);
    struct pull_view v = {.bar.tty = isatty(2), .ref = ref};
    json_t *body = json_pack("{s:s,s:b}", "model", ref, "stream", 1);
    bool cancelled = false;
    int status = client_stream(api, "/api/pull", body, cancel, on_pull_line, &v, &cancelled, err, errlen);
    json_decref(body);
    progress_end(&v.bar);
    if (cancelled)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "pull interrupted (run it again to resume)");
    if (v.error[0])
        return cairn_fail(err, errlen, CAIRN_EIO, "pull: %s", v.error);
    if (status != 200)
        return CAIRN_EIO;
    if (!v.success)
        return cairn_fail(err, errlen, CAIRN_EIO, "pull: the node ended it without success");
    if (v.model[0])
        snprintf(id, HUBREF_TEXT_MAX, "%s", v.model);
    fprintf(stderr, "pulled %s\n", id);
    return 0;
}

/* The host name of node_id in state, or its id's first 8 characters. */
static void node_name(const json_t *state, const char *node_id, char *out, size_t cap)
{
    const json_t *n = json_object_get(json_object_get(state, "nodes"), node_id);
    const char *host = json_string_value(json_object_get(json_object_get(n, "info"), "hostname"));
    snprintf(out, cap, "%.8s (%.64s)", node_id, host ? host : "?");
}

/* Prints where instance iid (in state) runs: each shard's node and layers. */
static void show_placement(const json_t *state, const json_t *in)
{
    const json_t *shards = json_object_get(in, "shards");
    size_t i, n = json_array_size(shards);
    const json_t *sh;
    fprintf(stderr, "%s runs on %zu node%s:\n", json_string_value(json_object_get(in, "model_id")), n,
            n == 1 ? "" : "s");
    json_array_foreach(shards, i, sh) {
        const char *node = json_string_value(json_object_get(sh, "node_id"));
        json_int_t b = json_integer_value(json_object_get(sh, "layer_begin"));
        json_int_t e = json_integer_value(json_object_get(sh, "layer_end"));
        char name[96];
        node_name(state, node ? node : "?", name, sizeof name);
        fprintf(stderr, "  rank %lld  %s  layers %lld-%lld (%lld)\n",
                (long long)json_integer_value(json_object_get(sh, "rank")), name, (long long)b,
                (long long)(e > 0 ? e - 1 : 0), (long long)(e - b));
    }
}

/* Places an instance of id (POST /place_instance); its id into iid. */
static int place(const struct client *api, const char *id, char *iid, char *err, size_t errlen)
{
    json_t *body = json_pack("{s:s}", "model_id", id), *reply = NULL;
    int status = client_json(api, "POST", "/place_instance", body, &reply, err, errlen);
    json_decref(body);
    const char *got = json_string_value(json_object_get(reply, "instance_id"));
    int rc = 0;
    if (status != 200)
        rc = status == 404 ? CAIRN_ENOTFOUND : CAIRN_EIO;
    else if (!plain_id(got, IDS_ID_MAX))
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "the node placed an instance without a valid id");
    else
        snprintf(iid, IDS_ID_MAX + 1, "%s", got);
    json_decref(reply);
    return rc;
}

/* 1 when every runner of instance iid in state is ready, 0 while they load, else an
 * error (a runner failed, the instance is gone). */
static int runners_ready(const json_t *state, const char *iid, char *phase, size_t pcap, char *err, size_t errlen)
{
    const json_t *in = json_object_get(json_object_get(state, "instances"), iid);
    if (!in)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "instance %s was deleted", iid);
    const json_t *runners = json_object_get(state, "runners");
    size_t i;
    const json_t *sh;
    int ready = 1;
    snprintf(phase, pcap, "waiting");
    json_array_foreach(json_object_get(in, "shards"), i, sh) {
        const char *rid = json_string_value(json_object_get(sh, "runner_id"));
        const json_t *r = rid ? json_object_get(runners, rid) : NULL;
        const char *st = json_string_value(json_object_get(r, "status"));
        if (st && !strcmp(st, "Failed")) {
            const char *why = json_string_value(json_object_get(r, "error"));
            return cairn_fail(err, errlen, CAIRN_EIO, "a runner failed: %s", why ? why : "(no reason)");
        }
        if (!st || (strcmp(st, "Ready") && strcmp(st, "Running"))) {
            ready = 0;
            snprintf(phase, pcap, "%s", st ? st : "starting");
        }
    }
    return ready;
}

int session_ready(const struct client *api, const char *model, const atomic_bool *cancel, struct session_model *out,
                  char *err, size_t errlen)
{
    *out = (struct session_model){0};
    if (snprintf(out->id, sizeof out->id, "%s", model) >= (int)sizeof out->id)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "a model name is at most %d bytes", IDS_MODEL_MAX);
    int has = cluster_has(api, out->id, err, errlen);
    char canon[HUBREF_TEXT_MAX];
    if (has == 0 && hubref_canonical(model, canon)) { /* a hub reference, as typed */
        snprintf(out->id, sizeof out->id, "%s", canon);
        has = cluster_has(api, out->id, err, errlen);
        if (has == 0)
            has = pull(api, model, cancel, out->id, err, errlen) ? -1 : 1;
    }
    if (has < 0)
        return CAIRN_EIO;
    if (has == 0)
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND,
                          "no model '%s' in the cluster (`cairn ls` lists this machine's; a hub reference such as "
                          "hf.co/OWNER/REPO:Q4_K_M is pulled)", model);
    json_t *state = NULL;
    int status = client_json(api, "GET", "/state", NULL, &state, err, errlen);
    if (status != 200 || !json_is_object(state)) {
        json_decref(state);
        return status == 200 ? cairn_fail(err, errlen, CAIRN_EFORMAT, "the node's state is not JSON") : CAIRN_EIO;
    }
    const char *iid = session_instance_of(state, out->id);
    int rc = 0;
    if (iid) {
        snprintf(out->instance, sizeof out->instance, "%s", iid);
    } else {
        fprintf(stderr, "placing %s\n", out->id);
        rc = place(api, out->id, out->instance, err, errlen);
    }
    json_decref(state);
    if (rc)
        return rc;
    /* Waits for the runners, showing where the instance went once the state has it. */
    bool shown = false;
    char phase[32] = "", last_phase[32] = "";
    int64_t t0 = clock_ns();
    rc = CAIRN_EIO;
    snprintf(err, errlen, "the instance was not ready within %d s", SESSION_READY_S);
    while (clock_ns() - t0 < (int64_t)SESSION_READY_S * 1000000000) {
        if (cancel && atomic_load(cancel)) {
            rc = cairn_fail(err, errlen, CAIRN_ESTATE, "interrupted");
            break;
        }
        state = NULL;
        status = client_json(api, "GET", "/state", NULL, &state, err, errlen);
        if (status != 200) {
            json_decref(state);
            rc = CAIRN_EIO;
            break;
        }
        const json_t *in = json_object_get(json_object_get(state, "instances"), out->instance);
        if (in && !shown) {
            show_placement(state, in);
            shown = true;
        }
        int ready = in ? runners_ready(state, out->instance, phase, sizeof phase, err, errlen) : 0;
        json_decref(state);
        if (ready < 0) {
            rc = ready;
            break;
        }
        if (ready) {
            rc = 0;
            break;
        }
        if (shown && strcmp(phase, last_phase)) {
            fprintf(stderr, "  %s\n", phase);
            snprintf(last_phase, sizeof last_phase, "%s", phase);
        }
        clock_sleep_ms(POLL_MS);
    }
    return rc;
}
