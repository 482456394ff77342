/* Server-sent events (text/event-stream) over an http_stream: each event is formatted
 * whole and queued in one write, so events never interleave or split. */
#ifndef CAIRN_API_SSE_H
#define CAIRN_API_SSE_H

#include <jansson.h>
#include <stddef.h>

#include "api/http.h"

/* Starts a 200 text/event-stream reply with ": ping" comments on idle (the server's
 * keepalive_ms); *out owned by the caller (http_stream_release). */
int sse_start(struct http_request *req, struct http_stream **out);

/* Same for a reply deferred with http_reply_defer. */
int sse_start_deferred(struct http_stream *s);

/* Formats one event into buf (cap bytes, NUL-terminated when cap > 0) and returns its
 * length, which may exceed cap - 1 as with snprintf. event and id (either may be NULL)
 * must not hold CR or LF (-1 otherwise); data is split at CR, LF and CRLF into
 * "data:" lines. */
long sse_format(char *buf, size_t cap, const char *event, const char *id, const char *data);

/* Queues one event; errors as http_stream_write, EINVAL for a bad event or id. */
int sse_send(struct http_stream *s, const char *event, const char *id, const char *data);
/* sse_send(s, event, NULL, data). */
int sse_event(struct http_stream *s, const char *event, const char *data);
/* An event whose data is j as compact JSON (one line). */
int sse_json(struct http_stream *s, const char *event, const json_t *j);
/* A comment line (": text"), ignored by clients; text must not hold CR or LF. */
int sse_comment(struct http_stream *s, const char *text);
/* OpenAI's end marker, "data: [DONE]". */
int sse_done(struct http_stream *s);

#endif
