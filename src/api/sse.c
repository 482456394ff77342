#include "api/sse.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

int sse_start(struct http_request *req, struct http_stream **out)
{
    int rc = http_reply_stream(req, 200, "text/event-stream; charset=utf-8", out);
    if (rc == 0)
        http_stream_keepalive(*out, ": ping\n\n", 0);
    return rc;
}

int sse_start_deferred(struct http_stream *s)
{
    int rc = http_stream_start(s, 200, "text/event-stream; charset=utf-8");
    if (rc == 0)
        http_stream_keepalive(s, ": ping\n\n", 0);
    return rc;
}

/* Appends n bytes at *len, writing only what fits before cap - 1. */
static void put(char *buf, size_t cap, size_t *len, const char *s, size_t n)
{
    if (cap > 0 && *len < cap - 1) {
        size_t room = cap - 1 - *len;
        memcpy(buf + *len, s, n < room ? n : room);
    }
    *len += n;
}

long sse_format(char *buf, size_t cap, const char *event, const char *id, const char *data)
{
    if ((event && strpbrk(event, "\r\n")) || (id && strpbrk(id, "\r\n")))
        return -1;
    size_t len = 0;
    if (event) {
        put(buf, cap, &len, "event: ", 7);
        put(buf, cap, &len, event, strlen(event));
        put(buf, cap, &len, "\n", 1);
    }
    if (id) {
        put(buf, cap, &len, "id: ", 4);
        put(buf, cap, &len, id, strlen(id));
        put(buf, cap, &len, "\n", 1);
    }
    const char *p = data ? data : "";
    for (;;) {
        size_t n = strcspn(p, "\r\n");
        put(buf, cap, &len, "data: ", 6);
        put(buf, cap, &len, p, n);
        put(buf, cap, &len, "\n", 1);
        p += n;
        if (!*p)
            break;
        p += (p[0] == '\r' && p[1] == '\n') ? 2 : 1;
    }
    put(buf, cap, &len, "\n", 1);
    if (cap > 0)
        buf[len < cap - 1 ? len : cap - 1] = 0;
    return (long)len;
}

int sse_send(struct http_stream *s, const char *event, const char *id, const char *data)
{
    char small[1024];
    long n = sse_format(small, sizeof small, event, id, data);
    if (n < 0)
        return CAIRN_EINVAL;
    if ((size_t)n < sizeof small)
        return http_stream_write(s, small, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big)
        return CAIRN_ENOMEM;
    sse_format(big, (size_t)n + 1, event, id, data);
    int rc = http_stream_write(s, big, (size_t)n);
    free(big);
    return rc;
}

int sse_event(struct http_stream *s, const char *event, const char *data)
{
    return sse_send(s, event, NULL, data);
}

int sse_json(struct http_stream *s, const char *event, const json_t *j)
{
    /* Compact JSON escapes CR and LF inside strings, so it stays one data line. */
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    if (!text)
        return CAIRN_EINVAL;
    int rc = sse_send(s, event, NULL, text);
    free(text);
    return rc;
}

int sse_comment(struct http_stream *s, const char *text)
{
    if (!text || strpbrk(text, "\r\n"))
        return CAIRN_EINVAL;
    return http_stream_printf(s, ": %s\n\n", text);
}

int sse_done(struct http_stream *s)
{
    return http_stream_write(s, "data: [DONE]\n\n", 14);
}
