#include "proto/runner_proto.h"

#include "base/array.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/json.h"
#include "proto/status.h"
#include "proto/taskmsg.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *name_at(const char *const *names, int n, int v)
{
    return v >= 0 && v < n ? names[v] : NULL;
}

const char *runner_msg_type_name(int v)
{
    static const char *const names[] = {"status", "heartbeat", "token", "done", "task", "cancel", "shutdown",
                                         "start", "output", "seq_done", "draft", "peers", "embedding"};
    return name_at(names, RUNNER_MSG_TYPE_COUNT, v);
}

const char *runner_finish_name(int v)
{
    static const char *const names[] = {"stop", "length", "cancelled", "error"};
    return name_at(names, RUNNER_FINISH_COUNT, v);
}

void runner_config_defaults(struct runner_config *c)
{
    memset(c, 0, sizeof *c);
    c->layer_end = -1;
    c->slots = RUNNER_DEFAULT_SLOTS;
    c->threads = RUNNER_DEFAULT_THREADS;
    c->num_draft_tokens = 4;
    c->heartbeat_ms = 1000;
    c->world_size = 1;
    c->cache_type_k = c->cache_type_v = DT_F16;
}

struct runner_sampling runner_sampling_defaults(void)
{
    return (struct runner_sampling){.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                                    .repeat_penalty = 1.0f, .penalty_last_n = 64};
}

static bool put(json_t *o, const char *key, json_t *v)
{
    return v && json_object_set_new(o, key, v) == 0;
}

char *runner_text_clean(const char *s, size_t len, size_t max)
{
    char *out = malloc((len < max ? len : max) + 1);
    if (!out)
        return NULL;
    size_t n = 0;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        unsigned c = p[i];
        size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        bool ok = k > 0 && i + k <= len;
        uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
        for (size_t j = 1; ok && j < k; j++) {
            ok = (p[i + j] & 0xc0) == 0x80;
            cp = cp << 6 | (p[i + j] & 0x3f);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        ok = ok && cp >= min_cp[k] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff) && cp != 0;
        if (!ok)
            k = 1;
        if (n + k > max)
            break;
        if (ok)
            memcpy(out + n, s + i, k);
        else
            out[n] = '?';
        n += k;
        i += k;
    }
    out[n] = 0;
    return out;
}

static json_t *text_or_null(const char *s)
{
    if (!s)
        return json_null();
    char *c = runner_text_clean(s, strlen(s), IDS_TEXT_MAX);
    json_t *v = c ? json_string(c) : NULL;
    free(c);
    return v;
}

json_t *runner_config_to_json(const struct runner_config *c)
{
    json_t *o = json_object();
    char *path = runner_text_clean(c->model_path, strlen(c->model_path), RUNNER_PATH_MAX);
    bool ok = o && path && put(o, "instance_id", json_string(c->instance_id)) &&
              put(o, "runner_id", json_string(c->runner_id)) && put(o, "model_path", json_string(path)) &&
              put(o, "layer_begin", json_integer(c->layer_begin)) && put(o, "layer_end", json_integer(c->layer_end)) &&
              put(o, "ctx", json_integer(c->ctx)) && put(o, "slots", json_integer(c->slots)) &&
              put(o, "threads", json_integer(c->threads)) && put(o, "heartbeat_ms", json_integer(c->heartbeat_ms)) &&
              put(o, "draft_model_path", ids_json_string_or_null(c->draft_model_path, true)) &&
              put(o, "num_draft_tokens", json_integer(c->num_draft_tokens)) &&
              put(o, "rank", json_integer(c->rank)) && put(o, "world_size", json_integer(c->world_size)) &&
              put(o, "tensor", json_boolean(c->tensor)) &&
              put(o, "epoch", json_integer(c->epoch)) &&
              put(o, "model_identity", json_string(c->model_identity)) &&
              put(o, "data_bind", json_string(c->data_bind)) &&
              put(o, "cache_type_k", json_string(dtype_kv_name(c->cache_type_k))) &&
              put(o, "cache_type_v", json_string(dtype_kv_name(c->cache_type_v)));
    free(path);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Optional integer member in [lo, hi]; absent keeps *dst. */
static int opt_int(const json_t *j, const char *path, const char *key, int64_t lo, int64_t hi, int64_t *dst,
                   char *err, size_t errlen)
{
    if (!json_object_get(j, key))
        return 0;
    return json_get_int(j, path, key, lo, hi, dst, err, errlen);
}

static int opt_float(const json_t *j, const char *path, const char *key, double lo, double hi, bool lo_open,
                     float *dst, char *err, size_t errlen)
{
    json_t *v = json_object_get(j, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.%s: not a number", path, key);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.%s: %g outside %s%g, %g]", path, key, d, lo_open ? "(" : "[",
                          lo, hi);
    *dst = (float)d;
    return 0;
}

int runner_config_from_json(const json_t *j, struct runner_config *out, char *err, size_t errlen)
{
    runner_config_defaults(out);
    const char *path = "config";
    if (!json_is_object(j))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "config: not an object");
    int rc;
    if ((rc = ids_json_id(j, path, "instance_id", out->instance_id, err, errlen)) ||
        (rc = ids_json_id(j, path, "runner_id", out->runner_id, err, errlen)))
        return rc;
    json_t *mp = json_object_get(j, "model_path");
    if (!json_is_string(mp) || json_string_length(mp) == 0 || json_string_length(mp) >= RUNNER_PATH_MAX ||
        strlen(json_string_value(mp)) != json_string_length(mp))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "config.model_path: not a path of 1..%d bytes",
                          RUNNER_PATH_MAX - 1);
    memcpy(out->model_path, json_string_value(mp), json_string_length(mp) + 1);
    json_t *dp = json_object_get(j, "draft_model_path");
    if (dp && !json_is_null(dp)) {
        if (!json_is_string(dp) || json_string_length(dp) >= RUNNER_PATH_MAX ||
            strlen(json_string_value(dp)) != json_string_length(dp))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "config.draft_model_path: not a path of 0..%d bytes",
                              RUNNER_PATH_MAX - 1);
        memcpy(out->draft_model_path, json_string_value(dp), json_string_length(dp) + 1);
    }
    int64_t begin = 0, end = -1, ctx = 0, slots = RUNNER_DEFAULT_SLOTS, threads = RUNNER_DEFAULT_THREADS, hb = 1000, k = 4;
    int64_t rank = 0, world = 1;
    if ((rc = opt_int(j, path, "layer_begin", 0, 65535, &begin, err, errlen)) ||
        (rc = opt_int(j, path, "layer_end", -1, 65536, &end, err, errlen)) ||
        (rc = opt_int(j, path, "ctx", 0, 1 << 24, &ctx, err, errlen)) ||
        (rc = opt_int(j, path, "slots", 1, 256, &slots, err, errlen)) ||
        (rc = opt_int(j, path, "threads", 1, 512, &threads, err, errlen)) ||
        (rc = opt_int(j, path, "heartbeat_ms", 10, 600000, &hb, err, errlen)) ||
        (rc = opt_int(j, path, "num_draft_tokens", 0, CLUSTER_MAX_DRAFT_TOKENS, &k, err, errlen)) ||
        (rc = opt_int(j, path, "world_size", 1, CLUSTER_MAX_SHARDS, &world, err, errlen)) ||
        (rc = opt_int(j, path, "rank", 0, world - 1, &rank, err, errlen)) ||
        (rc = opt_int(j, path, "epoch", 0, IDS_COUNTER_MAX, &out->epoch, err, errlen)))
        return rc;
    json_t *mi = json_object_get(j, "model_identity");
    if (mi && !json_is_null(mi)) {
        size_t n = json_is_string(mi) ? json_string_length(mi) : RUNNER_IDENTITY_MAX + 1;
        const char *v = n <= RUNNER_IDENTITY_MAX ? json_string_value(mi) : "";
        bool printable = strlen(v) == n;
        for (size_t i = 0; i < n && printable; i++)
            printable = v[i] > 0x20 && v[i] < 0x7f;
        if (!printable)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "config.model_identity: not 0..%d printable ASCII bytes",
                              RUNNER_IDENTITY_MAX);
        memcpy(out->model_identity, v, n + 1);
    }
    const char *kvk[2] = {"cache_type_k", "cache_type_v"};
    int *kvt[2] = {&out->cache_type_k, &out->cache_type_v};
    for (int i = 0; i < 2; i++) {
        json_t *t = json_object_get(j, kvk[i]);
        *kvt[i] = DT_F16;
        if (!t || json_is_null(t))
            continue;
        *kvt[i] = json_is_string(t) && strlen(json_string_value(t)) == json_string_length(t)
                      ? dtype_kv_from_name(json_string_value(t))
                      : -1;
        if (*kvt[i] < 0)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "config.%s: not one of f16, f32, q8_0, q4_0", kvk[i]);
    }
    json_t *tj = json_object_get(j, "tensor");
    if (tj && !json_is_null(tj) && !json_is_boolean(tj))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "config.tensor: not a boolean");
    out->tensor = json_is_true(tj);
    json_t *db = json_object_get(j, "data_bind");
    if (db && !json_is_null(db)) {
        if (!json_is_string(db) || json_string_length(db) > IDS_ADDR_MAX ||
            strlen(json_string_value(db)) != json_string_length(db))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "config.data_bind: not an address");
        memcpy(out->data_bind, json_string_value(db), json_string_length(db) + 1);
    }
    out->num_draft_tokens = (int)k;
    out->rank = (int)rank;
    out->world_size = (int)world;
    if (end >= 0 && end <= begin)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "config.layer_end: %lld is not above layer_begin %lld",
                          (long long)end, (long long)begin);
    out->layer_begin = (int)begin;
    out->layer_end = (int)end;
    out->ctx = ctx;
    out->slots = (int)slots;
    out->threads = (int)threads;
    out->heartbeat_ms = (int)hb;
    return 0;
}

int runner_config_parse(const char *text, size_t len, struct runner_config *out, char *err, size_t errlen)
{
    runner_config_defaults(out);
    json_error_t je;
    json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "config: %s at line %d column %d", je.text, je.line, je.column);
    int rc = runner_config_from_json(j, out, err, errlen);
    json_decref(j);
    return rc;
}

void runner_task_clear(struct runner_task *t)
{
    if (!t)
        return;
    free(t->tokens);
    json_decref(t->params);
    memset(t, 0, sizeof *t);
}

int runner_task_copy(struct runner_task *dst, const struct runner_task *src)
{
    *dst = *src;
    dst->tokens = NULL;
    dst->params = src->params ? json_deep_copy(src->params) : NULL;
    if (src->params && !dst->params) {
        memset(dst, 0, sizeof *dst);
        return CAIRN_ENOMEM;
    }
    if (src->n_tokens > 0) {
        dst->tokens = malloc((size_t)src->n_tokens * sizeof *dst->tokens);
        if (!dst->tokens) {
            json_decref(dst->params);
            memset(dst, 0, sizeof *dst);
            return CAIRN_ENOMEM;
        }
        memcpy(dst->tokens, src->tokens, (size_t)src->n_tokens * sizeof *dst->tokens);
    }
    return 0;
}

void runner_msg_clear(struct runner_msg *m)
{
    if (!m)
        return;
    free(m->error);
    json_decref(m->body);
    runner_task_clear(&m->task);
    memset(m, 0, sizeof *m);
}

json_t *runner_sampling_to_json(const struct runner_sampling *s)
{
    json_t *o = json_object();
    bool ok = o && put(o, "temperature", json_real(s->temperature)) && put(o, "top_k", json_integer(s->top_k)) &&
              put(o, "top_p", json_real(s->top_p)) && put(o, "min_p", json_real(s->min_p)) &&
              put(o, "repeat_penalty", json_real(s->repeat_penalty)) &&
              put(o, "presence_penalty", json_real(s->presence_penalty)) &&
              put(o, "frequency_penalty", json_real(s->frequency_penalty)) &&
              put(o, "penalty_last_n", json_integer(s->penalty_last_n)) &&
              put(o, "seed", json_integer((json_int_t)(s->seed & IDS_COUNTER_MAX)));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *task_to_json(json_t *o, const struct runner_task *t)
{
    if (t->params)
        return ids_valid_id(t->task_id) && json_is_object(t->params) && put(o, "task_id", json_string(t->task_id)) &&
                       put(o, "kind", json_string("TextGeneration")) && json_object_set(o, "params", t->params) == 0
                   ? o
                   : NULL;
    if (!ids_valid_id(t->task_id) || t->n_tokens < 1 || t->n_tokens > RUNNER_MAX_PROMPT || !t->tokens ||
        t->max_tokens < 1 || t->max_tokens > RUNNER_MAX_GENERATE)
        return NULL;
    json_t *toks = json_array();
    bool ok = put(o, "task_id", json_string(t->task_id)) && put(o, "kind", json_string("TextGeneration")) &&
              put(o, "tokens", toks) && put(o, "max_tokens", json_integer(t->max_tokens)) &&
              put(o, "ignore_eos", json_boolean(t->ignore_eos)) && put(o, "sampling", runner_sampling_to_json(&t->sampling));
    for (int64_t i = 0; ok && i < t->n_tokens; i++)
        ok = t->tokens[i] >= 0 && json_array_append_new(toks, json_integer(t->tokens[i])) == 0;
    return ok ? o : NULL;
}

static bool peers_to_json(json_t *o, const struct runner_peers *p)
{
    json_t *hosts = json_array();
    bool ok = p->n_hosts >= 1 && p->n_hosts <= RUNNER_MAX_PEER_HOSTS && p->next_port > 0 && p->next_port < 65536 &&
              p->next_rank >= 0 && p->epoch >= 0 && put(o, "epoch", json_integer(p->epoch)) &&
              put(o, "secret", p->secret[0] ? json_string(p->secret) : json_null()) &&
              put(o, "next_rank", json_integer(p->next_rank)) && put(o, "next_port", json_integer(p->next_port)) &&
              put(o, "hosts", hosts);
    for (int i = 0; ok && i < p->n_hosts; i++)
        ok = p->hosts[i][0] && json_array_append_new(hosts, json_string(p->hosts[i])) == 0;
    return ok;
}

static int peers_from_json(const json_t *j, struct runner_peers *p, char *err, size_t errlen)
{
    const char *path = "peers";
    int64_t rank, port;
    int rc;
    if ((rc = json_get_int(j, path, "epoch", 0, IDS_COUNTER_MAX, &p->epoch, err, errlen)) ||
        (rc = json_get_int(j, path, "next_rank", 0, CLUSTER_MAX_SHARDS - 1, &rank, err, errlen)) ||
        (rc = json_get_int(j, path, "next_port", 1, 65535, &port, err, errlen)))
        return rc;
    p->next_rank = (int)rank;
    p->next_port = (int)port;
    json_t *sec = json_object_get(j, "secret");
    if (sec && !json_is_null(sec)) {
        if (!json_is_string(sec) || json_string_length(sec) >= sizeof p->secret ||
            strlen(json_string_value(sec)) != json_string_length(sec))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "peers.secret: not a text of 0..%zu bytes",
                              sizeof p->secret - 1);
        memcpy(p->secret, json_string_value(sec), json_string_length(sec) + 1);
    }
    json_t *hosts;
    if ((rc = json_get_member(j, path, "hosts", JSON_ARRAY, &hosts, err, errlen)))
        return rc;
    size_t n = json_array_size(hosts);
    if (n < 1 || n > RUNNER_MAX_PEER_HOSTS)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "peers.hosts: %zu addresses, expected 1..%d", n,
                          RUNNER_MAX_PEER_HOSTS);
    for (size_t i = 0; i < n; i++) {
        json_t *h = json_array_get(hosts, i);
        if (!json_is_string(h) || json_string_length(h) < 1 || json_string_length(h) > IDS_ADDR_MAX ||
            strlen(json_string_value(h)) != json_string_length(h))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "peers.hosts[%zu]: not an address", i);
        memcpy(p->hosts[i], json_string_value(h), json_string_length(h) + 1);
    }
    p->n_hosts = (int)n;
    return 0;
}

char *runner_msg_encode(const struct runner_msg *m, size_t *len)
{
    const char *type = runner_msg_type_name(m->type);
    json_t *o = type ? json_object() : NULL;
    bool ok = o && put(o, "type", json_string(type));
    switch (ok ? m->type : RUNNER_MSG_TYPE_COUNT) {
    case RUNNER_MSG_STATUS:
        ok = cluster_runner_status_name(m->status) && put(o, "status", json_string(cluster_runner_status_name(m->status))) &&
             put(o, "error", text_or_null(m->error)) &&
             (m->data_port <= 0 || put(o, "data_port", json_integer(m->data_port)));
        break;
    case RUNNER_MSG_PEERS:
        ok = peers_to_json(o, &m->peers);
        break;
    case RUNNER_MSG_HEARTBEAT:
    case RUNNER_MSG_SHUTDOWN:
        break;
    case RUNNER_MSG_TOKEN:
        ok = ids_valid_id(m->task_id) && m->token >= 0 && m->index >= 0 && put(o, "task_id", json_string(m->task_id)) &&
             put(o, "token", json_integer(m->token)) && put(o, "index", json_integer(m->index));
        break;
    case RUNNER_MSG_DONE:
        ok = ids_valid_id(m->task_id) && runner_finish_name(m->finish) && m->n_generated >= 0 &&
             put(o, "task_id", json_string(m->task_id)) && put(o, "finish", json_string(runner_finish_name(m->finish))) &&
             put(o, "n_generated", json_integer(m->n_generated)) && put(o, "error", text_or_null(m->error));
        break;
    case RUNNER_MSG_TASK:
        ok = task_to_json(o, &m->task) != NULL;
        break;
    case RUNNER_MSG_CANCEL:
        ok = ids_valid_id(m->task_id) && put(o, "task_id", json_string(m->task_id));
        break;
    case RUNNER_MSG_DRAFT:
        ok = json_is_object(m->body) && json_object_update(o, m->body) == 0 && put(o, "type", json_string(type));
        break;
    case RUNNER_MSG_START:
    case RUNNER_MSG_OUTPUT:
    case RUNNER_MSG_SEQ_DONE:
    case RUNNER_MSG_EMBEDDING:
        ok = ids_valid_id(m->task_id) && json_is_object(m->body) && json_object_update(o, m->body) == 0 &&
             put(o, "type", json_string(type)) && put(o, "task_id", json_string(m->task_id));
        break;
    default:
        ok = false;
    }
    char *text = ok ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        return NULL;
    size_t n = strlen(text);
    char *line = realloc(text, n + 2);
    if (!line) {
        free(text);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = 0;
    *len = n + 1;
    return line;
}

int runner_sampling_from_json(const json_t *j, const char *path, struct runner_sampling *s, char *err,
                              size_t errlen)
{
    *s = runner_sampling_defaults();
    if (!j)
        return 0;
    if (!json_is_object(j))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: not an object", path);
    int64_t top_k = s->top_k, last_n = s->penalty_last_n, seed = 0;
    int rc;
    if ((rc = opt_float(j, path, "temperature", 0, 100, false, &s->temperature, err, errlen)) ||
        (rc = opt_float(j, path, "top_p", 0, 1, true, &s->top_p, err, errlen)) ||
        (rc = opt_float(j, path, "min_p", 0, 1, false, &s->min_p, err, errlen)) ||
        (rc = opt_float(j, path, "repeat_penalty", 0, 100, true, &s->repeat_penalty, err, errlen)) ||
        (rc = opt_float(j, path, "presence_penalty", -100, 100, false, &s->presence_penalty, err, errlen)) ||
        (rc = opt_float(j, path, "frequency_penalty", -100, 100, false, &s->frequency_penalty, err, errlen)) ||
        (rc = opt_int(j, path, "top_k", 0, 1 << 24, &top_k, err, errlen)) ||
        (rc = opt_int(j, path, "penalty_last_n", -1, 1 << 24, &last_n, err, errlen)) ||
        (rc = opt_int(j, path, "seed", 0, IDS_COUNTER_MAX, &seed, err, errlen)))
        return rc;
    s->top_k = (int)top_k;
    s->penalty_last_n = (int)last_n;
    s->seed = (uint64_t)seed;
    return 0;
}

static int task_from_json(const json_t *j, struct runner_task *t, char *err, size_t errlen)
{
    const char *path = "task";
    int rc = ids_json_id(j, path, "task_id", t->task_id, err, errlen);
    if (rc)
        return rc;
    json_t *kind = json_object_get(j, "kind");
    if (kind && !(json_is_string(kind) && !strcmp(json_string_value(kind), "TextGeneration")))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "task.kind: only TextGeneration is known");
    json_t *params = json_object_get(j, "params");
    if (params) {
        if (!json_is_object(params))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "task.params: not an object");
        t->params = json_incref(params);
        return 0;
    }
    json_t *toks;
    if ((rc = json_get_member(j, path, "tokens", JSON_ARRAY, &toks, err, errlen)))
        return rc;
    size_t n = json_array_size(toks);
    if (n < 1 || (int64_t)n > RUNNER_MAX_PROMPT)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "task.tokens: %zu tokens, expected 1..%lld", n,
                          (long long)RUNNER_MAX_PROMPT);
    t->tokens = malloc(n * sizeof *t->tokens);
    if (!t->tokens)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(toks, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "task.tokens[%zu]: not a token id", i);
        t->tokens[i] = (int32_t)json_integer_value(v);
    }
    t->n_tokens = (int64_t)n;
    if ((rc = json_get_int(j, path, "max_tokens", 1, RUNNER_MAX_GENERATE, &t->max_tokens, err, errlen)))
        return rc;
    if (json_object_get(j, "ignore_eos") && (rc = json_get_bool(j, path, "ignore_eos", &t->ignore_eos, err, errlen)))
        return rc;
    return runner_sampling_from_json(json_object_get(j, "sampling"), "task.sampling", &t->sampling, err, errlen);
}

static int decode(const json_t *j, struct runner_msg *out, char *err, size_t errlen)
{
    if (!json_is_object(j))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "message: not an object");
    int type, rc;
    if ((rc = json_get_enum(j, "message", "type", runner_msg_type_name, RUNNER_MSG_TYPE_COUNT, &type, err, errlen)))
        return rc;
    out->type = (enum runner_msg_type)type;
    const char *path = runner_msg_type_name(type);
    int64_t v = 0;
    switch (out->type) {
    case RUNNER_MSG_STATUS:
        if ((rc = json_get_enum(j, path, "status", cluster_runner_status_name, CLUSTER_RUNNER_STATUS_COUNT,
                                &out->status, err, errlen)))
            return rc;
        if ((rc = opt_int(j, path, "data_port", 0, 65535, &v, err, errlen)))
            return rc;
        out->data_port = (int)v;
        return json_object_get(j, "error") ? json_get_text(j, path, "error", IDS_TEXT_MAX, &out->error, err, errlen) : 0;
    case RUNNER_MSG_PEERS:
        return peers_from_json(j, &out->peers, err, errlen);
    case RUNNER_MSG_HEARTBEAT:
    case RUNNER_MSG_SHUTDOWN:
        return 0;
    case RUNNER_MSG_TOKEN:
        if ((rc = ids_json_id(j, path, "task_id", out->task_id, err, errlen)) ||
            (rc = json_get_int(j, path, "token", 0, INT32_MAX, &v, err, errlen)))
            return rc;
        out->token = (int32_t)v;
        return json_get_int(j, path, "index", 0, RUNNER_MAX_GENERATE, &out->index, err, errlen);
    case RUNNER_MSG_DONE: {
        int finish;
        if ((rc = ids_json_id(j, path, "task_id", out->task_id, err, errlen)) ||
            (rc = json_get_enum(j, path, "finish", runner_finish_name, RUNNER_FINISH_COUNT, &finish, err, errlen)) ||
            (rc = json_get_int(j, path, "n_generated", 0, RUNNER_MAX_GENERATE, &out->n_generated, err, errlen)))
            return rc;
        out->finish = (enum runner_finish)finish;
        return json_object_get(j, "error") ? json_get_text(j, path, "error", IDS_TEXT_MAX, &out->error, err, errlen) : 0;
    }
    case RUNNER_MSG_TASK:
        rc = task_from_json(j, &out->task, err, errlen);
        memcpy(out->task_id, out->task.task_id, sizeof out->task_id);
        return rc;
    case RUNNER_MSG_CANCEL:
        return ids_json_id(j, path, "task_id", out->task_id, err, errlen);
    case RUNNER_MSG_DRAFT: {
        json_t *mp = json_object_get(j, "model_path");
        if (mp && !json_is_null(mp) && (!json_is_string(mp) || json_string_length(mp) >= RUNNER_PATH_MAX))
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "draft.model_path: not a path");
        if ((rc = opt_int(j, path, "num_draft_tokens", 0, CLUSTER_MAX_DRAFT_TOKENS, &v, err, errlen)))
            return rc;
        if (!(out->body = json_deep_copy(j)))
            return CAIRN_ENOMEM;
        json_object_del(out->body, "type");
        return 0;
    }
    case RUNNER_MSG_START:
    case RUNNER_MSG_OUTPUT:
    case RUNNER_MSG_SEQ_DONE:
    case RUNNER_MSG_EMBEDDING: { /* every member checked (taskmsg.h), then relayed as it is */
        struct task_msg tm;
        if ((rc = task_msg_from_json((json_t *)j, &tm, err, errlen)))
            return rc;
        memcpy(out->task_id, tm.task_id, sizeof out->task_id);
        task_msg_clear(&tm);
        if (!(out->body = json_deep_copy(j)))
            return CAIRN_ENOMEM;
        json_object_del(out->body, "type");
        json_object_del(out->body, "task_id");
        return 0;
    }
    default:
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "message.type: unknown");
    }
}

json_t *runner_line_parse(const char *line, size_t len, const char *what, char *err, size_t errlen)
{
    if (len && line[len - 1] == '\n')
        len--;
    json_error_t je;
    json_t *j = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: not JSON (%s at column %d)", what, je.text, je.column);
    return j;
}

int runner_msg_decode(const char *line, size_t len, struct runner_msg *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    json_t *j = runner_line_parse(line, len, "message", err, errlen);
    if (!j)
        return CAIRN_EFORMAT;
    int rc = decode(j, out, err, errlen);
    json_decref(j);
    if (rc == CAIRN_ENOMEM)
        cairn_fail(err, errlen, rc, "out of memory");
    if (rc)
        runner_msg_clear(out);
    return rc;
}

int runner_send_bytes(int fd, const char *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == ENOTSOCK)
            w = write(fd, buf + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return CAIRN_EIO;
        off += (size_t)w;
    }
    return 0;
}

int runner_msg_send(int fd, const struct runner_msg *m)
{
    size_t len;
    char *line = runner_msg_encode(m, &len);
    if (!line)
        return CAIRN_ENOMEM;
    int rc = runner_send_bytes(fd, line, len);
    free(line);
    return rc;
}

int runner_lines_fill(struct runner_lines *r, int fd)
{
    if (r->len > RUNNER_MAX_LINE)
        return CAIRN_EFORMAT; /* the caller did not drain a line runner_lines_next refuses */
    if (r->start && (r->len == 0 || r->cap - r->start - r->len < 4096)) {
        memmove(r->buf, r->buf + r->start, r->len);
        r->start = 0;
    }
    if (array_reserve(&r->buf, &r->cap, r->start + r->len + 4096, 1, 65536))
        return CAIRN_ENOMEM;
    ssize_t got = read(fd, r->buf + r->start + r->len, r->cap - r->start - r->len);
    if (got < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? RUNNER_LINES_AGAIN : CAIRN_EIO;
    if (got == 0)
        return RUNNER_LINES_EOF;
    r->len += (size_t)got;
    return RUNNER_LINES_DATA;
}

int runner_lines_next(struct runner_lines *r, const char **line, size_t *len)
{
    /* Nothing new to scan may mean no buffer yet (a zeroed reader): no pointer arithmetic on NULL. */
    char *nl = r->len > r->scanned ? memchr(r->buf + r->start + r->scanned, '\n', r->len - r->scanned) : NULL;
    if (!nl) {
        r->scanned = r->len;
        return r->len > RUNNER_MAX_LINE ? CAIRN_EFORMAT : 0;
    }
    char *p = r->buf + r->start;
    size_t n = (size_t)(nl - p);
    if (n > RUNNER_MAX_LINE)
        return CAIRN_EFORMAT;
    *line = p;
    *len = n;
    r->start += n + 1;
    r->len -= n + 1;
    r->scanned = 0;
    return 1;
}

void runner_lines_free(struct runner_lines *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}
