/* A small HTTP/1.1 client over raw sockets for the api tests, and readers of the JSON
 * in its replies. Requests go one per connection (Connection: close) and replies are
 * read until the server closes, so each test sees exactly the bytes a server sent;
 * chunked bodies are decoded. Every socket wait is bounded (RH_IO_TIMEOUT_S). */
#ifndef CAIRN_TESTS_API_RAWHTTP_H
#define CAIRN_TESTS_API_RAWHTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define RH_IO_TIMEOUT_S 10
#define RH_MAX_REPLY (64u << 20) /* bytes read at most */

struct rh_resp {
    int status;       /* 0 when no reply came */
    char *raw;        /* everything read (malloc'd); rh_parse ends the head with a NUL */
    size_t raw_len;
    const char *head; /* the status line and headers, each ending in CRLF ("" when none) */
    char *body;       /* decoded body (malloc'd, NUL-terminated, "" when none) */
    size_t body_len;
    bool complete;    /* the body ended as framed (length reached or last chunk seen) */
};

/* A connected TCP socket to 127.0.0.1:port with send and receive timeouts, or -1. */
int rh_connect(uint16_t port);

/* Sends all n bytes; 0, or -1 when the connection failed. */
int rh_send_all(int fd, const void *p, size_t n);

/* Sends a request with Connection: close and Content-Length (ctype NULL: no
 * Content-Type; body NULL: empty). 0 or -1. */
int rh_send_request(int fd, const char *method, const char *path, const char *ctype,
                    const char *body);

/* rh_connect and rh_send_request: the socket (the caller closes it), or -1. */
int rh_open(uint16_t port, const char *method, const char *path, const char *ctype,
            const char *body);

/* Reads until EOF, error or timeout, RH_MAX_REPLY bytes, or (stop_at not NULL) until
 * the bytes hold stop_at; *out gets them (malloc'd, NUL-terminated). Returns the count. */
size_t rh_read_all(int fd, char **out, const char *stop_at);

/* Parses r->raw (r->raw_len bytes, may be NULL) into status, head and body. */
void rh_parse(struct rh_resp *r);

/* Sends len raw bytes on a new connection and reads the reply until the server closes
 * or timeout_s passes. 0, or -1 when connecting or sending failed (r then holds what
 * came, status 0 when nothing). */
int rh_raw(uint16_t port, const void *req, size_t len, struct rh_resp *r, int timeout_s);

/* One request (as rh_send_request) and its whole reply into r. */
void rh_request(uint16_t port, const char *method, const char *path, const char *ctype,
                const char *body, struct rh_resp *r);

/* rh_request POST with Content-Type: application/json. */
void rh_post(uint16_t port, const char *path, const char *body, struct rh_resp *r);

/* The value of header name (case-insensitive) copied into buf, or NULL. */
const char *rh_header(const struct rh_resp *r, const char *name, char *buf, size_t cap);

/* Frees what r holds and zeroes it. */
void rh_free(struct rh_resp *r);

/* The body parsed as JSON (new reference), NULL when it does not parse. */
json_t *rh_json(const struct rh_resp *r);

/* Member key of object j as a string (NULL when absent or not a string) or an integer
 * (0 when absent). */
const char *rh_jstr(const json_t *j, const char *key);
long long rh_jint(const json_t *j, const char *key);

/* Both strings exist and are equal. */
bool rh_streq(const char *a, const char *b);

/* JSON equality of got and the JSON text want, printing both when they differ. */
bool rh_json_same(const json_t *got, const char *want_text);

#endif
