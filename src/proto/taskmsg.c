#include "proto/taskmsg.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/json.h"

#define MS_MAX 1e12 /* a time in ms: 0 <= t < 31 years */

const char *task_seq_finish_name(int v)
{
    static const char *const names[] = {"stop", "length", "tool_calls", "cancelled", "error"};
    return v >= 0 && v < TASK_SEQ_FINISH_COUNT ? names[v] : NULL;
}

/* ---- reading ---- */

static int get_int(const json_t *j, const char *path, const char *key, int64_t hi, int64_t *dst, char *err,
                   size_t errlen)
{
    return json_get_int(j, path, key, 0, hi, dst, err, errlen);
}

/* An optional integer in [0, IDS_COUNTER_MAX]: 0 when absent. */
static int opt_count(const json_t *j, const char *path, const char *key, int64_t *dst, char *err, size_t errlen)
{
    *dst = 0;
    return json_object_get(j, key) ? get_int(j, path, key, IDS_COUNTER_MAX, dst, err, errlen) : 0;
}

/* A required string (any length the line allows) into *dst, borrowed from j. */
static int get_str(const json_t *j, const char *path, const char *key, const char **dst, char *err, size_t errlen)
{
    const json_t *v = json_object_get(j, key);
    if (!v)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.%s: missing", path, key);
    if (!json_is_string(v))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.%s: must be a string", path, key);
    *dst = json_string_value(v);
    return 0;
}

/* A string or null (absent counts as null) into *dst. */
static int opt_str(const json_t *j, const char *path, const char *key, const char **dst, char *err, size_t errlen)
{
    const json_t *v = json_object_get(j, key);
    *dst = NULL;
    if (!v || json_is_null(v))
        return 0;
    return get_str(j, path, key, dst, err, errlen);
}

/* An array or null (absent counts as null) into *dst. */
static int opt_array(const json_t *j, const char *path, const char *key, const json_t **dst, char *err,
                     size_t errlen)
{
    const json_t *v = json_object_get(j, key);
    *dst = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.%s: must be an array or null", path, key);
    *dst = v;
    return 0;
}

static int opt_ms(const json_t *j, const char *path, const char *key, double *dst, char *err, size_t errlen)
{
    const json_t *v = json_object_get(j, key);
    *dst = 0;
    if (!v)
        return 0;
    double d = json_is_number(v) ? json_number_value(v) : -1;
    if (!(d >= 0 && d < MS_MAX))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s.%s: must be a time in ms, 0 <= t < %.0f", path, key, MS_MAX);
    *dst = d;
    return 0;
}

static int read_stats(const json_t *j, const char *path, struct task_msg *m, char *err, size_t errlen)
{
    const json_t *st = json_object_get(j, "stats");
    if (!st)
        return 0;
    char p[64];
    snprintf(p, sizeof p, "%s.stats", path);
    if (!json_is_object(st))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: must be an object", p);
    struct task_stats *s = &m->stats;
    struct {
        const char *key;
        int64_t *dst;
    } f[] = {{"running", &s->running},
             {"queued", &s->queued},
             {"slots", &s->slots},
             {"kv_blocks_used", &s->kv_blocks_used},
             {"kv_blocks_total", &s->kv_blocks_total},
             {"preemptions", &s->preemptions},
             {"pipeline_steps", &s->pipeline_steps},
             {"pipeline_compute_us", &s->pipeline_compute_us},
             {"pipeline_wait_us", &s->pipeline_wait_us},
             {"pipeline_bytes", &s->pipeline_bytes},
             {"pipeline_result_bytes", &s->pipeline_result_bytes},
             {"pipeline_rows_sampled", &s->pipeline_rows_sampled},
             {"pipeline_rows_logits", &s->pipeline_rows_logits},
             {"pipeline_sealed_bytes", &s->pipeline_sealed_bytes}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        int rc = i < 6 ? get_int(st, p, f[i].key, IDS_COUNTER_MAX, f[i].dst, err, errlen)
                       : opt_count(st, p, f[i].key, f[i].dst, err, errlen);
        if (rc)
            return rc;
    }
    s->pipeline = json_object_get(st, "pipeline_steps") != NULL;
    m->has_stats = true;
    return 0;
}

static int read_seq(const json_t *j, const char *path, struct task_msg *m, char *err, size_t errlen)
{
    int64_t v = 0;
    int rc = get_int(j, path, "seq", RUNNER_MAX_SEQS - 1, &v, err, errlen);
    m->seq = (int)v;
    return rc;
}

static int read_start(const json_t *j, struct task_msg *m, char *err, size_t errlen)
{
    int rc;
    if (json_object_get(j, "error")) {
        int64_t status = 0;
        if ((rc = get_str(j, "start", "error", &m->error, err, errlen)) ||
            (rc = json_get_int(j, "start", "status", 400, 599, &status, err, errlen)))
            return rc;
        m->status = (int)status;
        return 0;
    }
    if ((rc = get_int(j, "start", "prompt_tokens", IDS_COUNTER_MAX, &m->prompt_tokens, err, errlen)) ||
        (rc = get_int(j, "start", "cached_tokens", m->prompt_tokens, &m->cached_tokens, err, errlen)))
        return rc;
    return read_stats(j, "start", m, err, errlen);
}

static int read_output(const json_t *j, struct task_msg *m, char *err, size_t errlen)
{
    int rc;
    if ((rc = read_seq(j, "output", m, err, errlen)) || (rc = get_str(j, "output", "content", &m->content, err, errlen)) ||
        (rc = get_str(j, "output", "reasoning", &m->reasoning, err, errlen)))
        return rc;
    return opt_array(j, "output", "logprobs", &m->logprobs, err, errlen);
}

static int read_seq_done(const json_t *j, struct task_msg *m, char *err, size_t errlen)
{
    const char *p = "seq_done";
    int fin = 0, rc;
    if ((rc = read_seq(j, p, m, err, errlen)) ||
        (rc = json_get_enum(j, p, "finish", task_seq_finish_name, TASK_SEQ_FINISH_COUNT, &fin, err, errlen)) ||
        (rc = opt_str(j, p, "stop_sequence", &m->stop_sequence, err, errlen)) ||
        (rc = opt_array(j, p, "tool_calls", &m->tool_calls, err, errlen)) ||
        (rc = get_int(j, p, "completion_tokens", IDS_COUNTER_MAX, &m->completion_tokens, err, errlen)) ||
        (rc = opt_count(j, p, "prompt_tokens", &m->prompt_tokens, err, errlen)) ||
        (rc = opt_count(j, p, "cached_tokens", &m->cached_tokens, err, errlen)) ||
        (rc = opt_count(j, p, "draft_tokens", &m->draft_tokens, err, errlen)) ||
        (rc = opt_count(j, p, "accepted_draft_tokens", &m->accepted_draft_tokens, err, errlen)) ||
        (rc = opt_ms(j, p, "prompt_ms", &m->prompt_ms, err, errlen)) ||
        (rc = opt_ms(j, p, "predicted_ms", &m->predicted_ms, err, errlen)))
        return rc;
    if (m->accepted_draft_tokens > m->draft_tokens)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "seq_done.accepted_draft_tokens: %lld, more than the %lld drafted",
                          (long long)m->accepted_draft_tokens, (long long)m->draft_tokens);
    m->seq_finish = (enum task_seq_finish)fin;
    return read_stats(j, p, m, err, errlen);
}

static const char b64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int b64_value(unsigned char c)
{
    const char *p = c ? strchr(b64_alphabet, c) : NULL;
    return p ? (int)(p - b64_alphabet) : -1;
}

/* Decodes standard padded base64 of whole float32 values: the byte count, or -1. out may
 * be NULL (only checks); else it receives the bytes. */
static int64_t b64_decode(const char *s, size_t len, unsigned char *out)
{
    if (len == 0 || len % 4)
        return -1;
    int64_t n = 0;
    for (size_t i = 0; i < len; i += 4) {
        int v[4], pad = 0;
        for (int k = 0; k < 4; k++) {
            v[k] = b64_value((unsigned char)s[i + k]);
            if (v[k] < 0) {
                if (s[i + k] != '=' || i + 4 != len || k < 2)
                    return -1;
                pad++, v[k] = 0;
            } else if (pad) {
                return -1; /* data after padding */
            }
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        unsigned char b[3] = {(unsigned char)(w >> 16), (unsigned char)(w >> 8), (unsigned char)w};
        for (int k = 0; k < 3 - pad; k++)
            if (out)
                out[n++] = b[k];
            else
                n++;
    }
    return n;
}

char *task_embedding_encode(const float *v, int n)
{
    if (n < 0)
        return NULL;
    size_t bytes = (size_t)n * 4, len = (bytes + 2) / 3 * 4;
    char *s = malloc(len + 1);
    if (!s)
        return NULL;
    unsigned char *b = malloc(bytes ? bytes : 1);
    if (!b) {
        free(s);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int k = 0; k < 4; k++)
            b[(size_t)i * 4 + (size_t)k] = (unsigned char)(u >> (8 * k)); /* little-endian on any host */
    }
    size_t o = 0;
    for (size_t i = 0; i < bytes; i += 3) {
        uint32_t w = (uint32_t)b[i] << 16 | (i + 1 < bytes ? (uint32_t)b[i + 1] << 8 : 0) |
                     (i + 2 < bytes ? b[i + 2] : 0);
        s[o++] = b64_alphabet[w >> 18 & 63];
        s[o++] = b64_alphabet[w >> 12 & 63];
        s[o++] = i + 1 < bytes ? b64_alphabet[w >> 6 & 63] : '=';
        s[o++] = i + 2 < bytes ? b64_alphabet[w & 63] : '=';
    }
    s[o] = 0;
    free(b);
    return s;
}

int task_embedding_decode(const struct task_msg *m, float *out, char *err, size_t errlen)
{
    size_t len = m->embedding ? strlen(m->embedding) : 0;
    unsigned char *b = malloc((size_t)m->dim * 4 + 3);
    if (!b)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    int64_t n = b64_decode(m->embedding ? m->embedding : "", len, b);
    int rc = 0;
    if (n != (int64_t)m->dim * 4)
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "embedding: not base64 of %d values", m->dim);
    for (int i = 0; !rc && i < m->dim; i++) {
        uint32_t u = 0;
        for (int k = 0; k < 4; k++)
            u |= (uint32_t)b[(size_t)i * 4 + (size_t)k] << (8 * k);
        memcpy(&out[i], &u, 4);
        if (!isfinite(out[i]))
            rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "embedding[%d]: not a finite number", i);
    }
    free(b);
    return rc;
}

static int read_embedding(const json_t *j, struct task_msg *m, char *err, size_t errlen)
{
    const char *p = "embedding";
    int64_t index = 0;
    int rc;
    if ((rc = get_int(j, p, "index", TEXTGEN_MAX_EMBED_INPUTS - 1, &index, err, errlen)) ||
        (rc = get_int(j, p, "prompt_tokens", IDS_COUNTER_MAX, &m->prompt_tokens, err, errlen)) ||
        (rc = get_str(j, p, "embedding", &m->embedding, err, errlen)))
        return rc;
    m->index = (int)index;
    size_t len = strlen(m->embedding);
    if (len > ((size_t)TEXTGEN_MAX_EMBED_DIM * 4 + 2) / 3 * 4)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "embedding.embedding: more than %d values", TEXTGEN_MAX_EMBED_DIM);
    int64_t bytes = b64_decode(m->embedding, len, NULL);
    if (bytes < 4 || bytes % 4)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "embedding.embedding: not base64 of float32 values");
    m->dim = (int)(bytes / 4);
    return 0;
}

static int read_done(const json_t *j, struct task_msg *m, char *err, size_t errlen)
{
    int fin = 0, rc;
    if ((rc = json_get_enum(j, "done", "finish", runner_finish_name, RUNNER_FINISH_COUNT, &fin, err, errlen)) ||
        (rc = get_int(j, "done", "n_generated", IDS_COUNTER_MAX, &m->n_generated, err, errlen)) ||
        (rc = opt_str(j, "done", "error", &m->error, err, errlen)))
        return rc;
    m->finish = (enum runner_finish)fin;
    return 0;
}

int task_msg_decode(const char *line, size_t len, struct task_msg *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    json_t *j = runner_line_parse(line, len, "task line", err, errlen);
    if (!j)
        return CAIRN_EFORMAT;
    int rc = task_msg_from_json(j, out, err, errlen);
    json_decref(j);
    return rc;
}

int task_msg_from_json(json_t *j, struct task_msg *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    out->root = json_incref(j);
    const char *type = json_string_value(json_object_get(j, "type"));
    int rc;
    if (!json_is_object(j) || !type)
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "task line: not an object with a \"type\"");
    else if (!strcmp(type, "start"))
        out->type = RUNNER_MSG_START, rc = 0;
    else if (!strcmp(type, "output"))
        out->type = RUNNER_MSG_OUTPUT, rc = 0;
    else if (!strcmp(type, "seq_done"))
        out->type = RUNNER_MSG_SEQ_DONE, rc = 0;
    else if (!strcmp(type, "done"))
        out->type = RUNNER_MSG_DONE, rc = 0;
    else if (!strcmp(type, "embedding"))
        out->type = RUNNER_MSG_EMBEDDING, rc = 0;
    else
        rc = cairn_fail(err, errlen, CAIRN_EFORMAT, "task line: type \"%.32s\" is not one of start, output, "
                        "seq_done, done, embedding", type);
    if (!rc)
        rc = ids_json_id(j, type, "task_id", out->task_id, err, errlen);
    if (!rc) {
        switch (out->type) {
        case RUNNER_MSG_START:
            rc = read_start(j, out, err, errlen);
            break;
        case RUNNER_MSG_OUTPUT:
            rc = read_output(j, out, err, errlen);
            break;
        case RUNNER_MSG_SEQ_DONE:
            rc = read_seq_done(j, out, err, errlen);
            break;
        case RUNNER_MSG_EMBEDDING:
            rc = read_embedding(j, out, err, errlen);
            break;
        default:
            rc = read_done(j, out, err, errlen);
        }
    }
    if (rc)
        task_msg_clear(out);
    return rc;
}

void task_msg_clear(struct task_msg *m)
{
    json_decref(m->root);
    memset(m, 0, sizeof *m);
}

/* ---- writing ---- */

static bool put(json_t *o, const char *key, json_t *v)
{
    return v && json_object_set_new(o, key, v) == 0;
}

static bool put_count(json_t *o, const char *key, int64_t v)
{
    return v >= 0 && v <= IDS_COUNTER_MAX && put(o, key, json_integer(v));
}

static json_t *stats_to_json(const struct task_stats *s)
{
    json_t *o = json_object();
    bool ok = o && put_count(o, "running", s->running) && put_count(o, "queued", s->queued) &&
              put_count(o, "slots", s->slots) && put_count(o, "kv_blocks_used", s->kv_blocks_used) &&
              put_count(o, "kv_blocks_total", s->kv_blocks_total) && put_count(o, "preemptions", s->preemptions);
    if (ok && s->pipeline)
        ok = put_count(o, "pipeline_steps", s->pipeline_steps) &&
             put_count(o, "pipeline_compute_us", s->pipeline_compute_us) &&
             put_count(o, "pipeline_wait_us", s->pipeline_wait_us) &&
             put_count(o, "pipeline_bytes", s->pipeline_bytes) &&
             put_count(o, "pipeline_result_bytes", s->pipeline_result_bytes) &&
             put_count(o, "pipeline_rows_sampled", s->pipeline_rows_sampled) &&
             put_count(o, "pipeline_rows_logits", s->pipeline_rows_logits) &&
             put_count(o, "pipeline_sealed_bytes", s->pipeline_sealed_bytes);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static bool seq_ok(int seq) { return seq >= 0 && seq < RUNNER_MAX_SEQS; }

static bool ms_ok(double ms) { return ms >= 0 && ms < MS_MAX; }

json_t *task_msg_to_json(const struct task_msg *m)
{
    json_t *o = json_object();
    const char *type = runner_msg_type_name(m->type);
    bool ok = o && ids_valid_id(m->task_id) && put(o, "type", json_string(type ? type : "")) &&
              put(o, "task_id", json_string(m->task_id));
    switch (m->type) {
    case RUNNER_MSG_START:
        if (m->error)
            ok = ok && m->status >= 400 && m->status <= 599 && put(o, "error", json_string(m->error)) &&
                 put(o, "status", json_integer(m->status));
        else
            ok = ok && m->cached_tokens <= m->prompt_tokens && put_count(o, "prompt_tokens", m->prompt_tokens) &&
                 put_count(o, "cached_tokens", m->cached_tokens);
        break;
    case RUNNER_MSG_OUTPUT:
        ok = ok && seq_ok(m->seq) && put(o, "seq", json_integer(m->seq)) &&
             put(o, "content", json_string(m->content ? m->content : "")) &&
             put(o, "reasoning", json_string(m->reasoning ? m->reasoning : "")) &&
             (!m->logprobs || (json_is_array(m->logprobs) && json_object_set(o, "logprobs", (json_t *)m->logprobs) == 0));
        break;
    case RUNNER_MSG_SEQ_DONE:
        ok = ok && seq_ok(m->seq) && task_seq_finish_name(m->seq_finish) &&
             m->accepted_draft_tokens <= m->draft_tokens && ms_ok(m->prompt_ms) && ms_ok(m->predicted_ms) &&
             put(o, "seq", json_integer(m->seq)) && put(o, "finish", json_string(task_seq_finish_name(m->seq_finish))) &&
             put(o, "stop_sequence", ids_json_string_or_null(m->stop_sequence, false)) &&
             put(o, "tool_calls", m->tool_calls ? json_deep_copy(m->tool_calls) : json_null()) &&
             put_count(o, "completion_tokens", m->completion_tokens) && put_count(o, "prompt_tokens", m->prompt_tokens) &&
             put_count(o, "cached_tokens", m->cached_tokens) && put_count(o, "draft_tokens", m->draft_tokens) &&
             put_count(o, "accepted_draft_tokens", m->accepted_draft_tokens) &&
             (!m->prompt_ms || put(o, "prompt_ms", json_real(m->prompt_ms))) &&
             (!m->predicted_ms || put(o, "predicted_ms", json_real(m->predicted_ms)));
        break;
    case RUNNER_MSG_EMBEDDING:
        ok = ok && m->index >= 0 && m->index < TEXTGEN_MAX_EMBED_INPUTS && m->embedding &&
             put(o, "index", json_integer(m->index)) && put_count(o, "prompt_tokens", m->prompt_tokens) &&
             put(o, "embedding", json_string(m->embedding));
        break;
    case RUNNER_MSG_DONE:
        ok = ok && runner_finish_name(m->finish) && put(o, "finish", json_string(runner_finish_name(m->finish))) &&
             put_count(o, "n_generated", m->n_generated) && put(o, "error", ids_json_string_or_null(m->error, false));
        break;
    default:
        ok = false;
    }
    if (ok && m->has_stats && (m->type == RUNNER_MSG_START || m->type == RUNNER_MSG_SEQ_DONE))
        ok = put(o, "stats", stats_to_json(&m->stats));
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}
