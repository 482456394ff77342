#define _GNU_SOURCE
#include "rawhttp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

int rh_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = RH_IO_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int rh_send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int rh_send_request(int fd, const char *method, const char *path, const char *ctype,
                    const char *body)
{
    size_t blen = body ? strlen(body) : 0;
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
                     "%s%s%sContent-Length: %zu\r\n\r\n",
                     method, path, ctype ? "Content-Type: " : "", ctype ? ctype : "",
                     ctype ? "\r\n" : "", blen);
    if (n < 0 || (size_t)n >= sizeof head)
        return -1;
    return rh_send_all(fd, head, (size_t)n) == 0 && rh_send_all(fd, body, blen) == 0 ? 0 : -1;
}

int rh_open(uint16_t port, const char *method, const char *path, const char *ctype,
            const char *body)
{
    int fd = rh_connect(port);
    if (fd >= 0 && rh_send_request(fd, method, path, ctype, body) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

size_t rh_read_all(int fd, char **out, const char *stop_at)
{
    size_t cap = 8192, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (n == cap) {
            if (cap >= RH_MAX_REPLY)
                break;
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
        ssize_t r = recv(fd, buf + n, cap - n, 0);
        if (r <= 0)
            break;
        n += (size_t)r;
        buf[n] = 0;
        if (stop_at && strstr(buf, stop_at))
            break;
    }
    buf[n] = 0;
    *out = buf;
    return n;
}

/* Decodes a chunked body; true when the last chunk was seen (a chunk cut short ends
 * the body there). */
static bool dechunk(const char *p, size_t n, char **out, size_t *out_len)
{
    char *b = malloc(n + 1);
    size_t len = 0, i = 0;
    bool done = false;
    while (i < n) {
        char *end;
        unsigned long sz = strtoul(p + i, &end, 16);
        const char *crlf = memmem(p + i, n - i, "\r\n", 2);
        if (!crlf || end == p + i)
            break;
        i = (size_t)(crlf - p) + 2;
        if (sz == 0) {
            done = true;
            break;
        }
        if (i + sz > n)
            break;
        memcpy(b + len, p + i, sz);
        len += sz;
        i += sz + 2;
    }
    b[len] = 0;
    *out = b;
    *out_len = len;
    return done;
}

void rh_parse(struct rh_resp *r)
{
    free(r->body);
    r->body = NULL;
    r->body_len = 0;
    r->head = "";
    r->complete = false;
    r->status = 0;
    char *hend = r->raw ? memmem(r->raw, r->raw_len, "\r\n\r\n", 4) : NULL;
    if (!hend || sscanf(r->raw, "HTTP/1.%*d %d", &r->status) != 1) {
        r->status = 0;
        r->body = calloc(1, 1);
        return;
    }
    hend[2] = 0; /* the head ends after its last CRLF */
    r->head = r->raw;
    const char *b = hend + 4;
    size_t bl = r->raw_len - (size_t)(b - r->raw);
    char v[64];
    if (rh_header(r, "Transfer-Encoding", v, sizeof v) && strcasecmp(v, "chunked") == 0) {
        r->complete = dechunk(b, bl, &r->body, &r->body_len);
        return;
    }
    size_t cl = bl;
    if (rh_header(r, "Content-Length", v, sizeof v))
        cl = strtoul(v, NULL, 10);
    r->complete = bl >= cl;
    if (cl > bl)
        cl = bl;
    r->body = malloc(cl + 1);
    memcpy(r->body, b, cl);
    r->body[cl] = 0;
    r->body_len = cl;
}

int rh_raw(uint16_t port, const void *req, size_t len, struct rh_resp *r, int timeout_s)
{
    memset(r, 0, sizeof *r);
    int fd = rh_connect(port);
    if (fd < 0) {
        rh_parse(r);
        return -1;
    }
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int rc = rh_send_all(fd, req, len);
    r->raw_len = rh_read_all(fd, &r->raw, NULL);
    close(fd);
    rh_parse(r);
    return rc;
}

void rh_request(uint16_t port, const char *method, const char *path, const char *ctype,
                const char *body, struct rh_resp *r)
{
    memset(r, 0, sizeof *r);
    int fd = rh_open(port, method, path, ctype, body);
    if (fd >= 0) {
        r->raw_len = rh_read_all(fd, &r->raw, NULL);
        close(fd);
    }
    rh_parse(r);
}

void rh_post(uint16_t port, const char *path, const char *body, struct rh_resp *r)
{
    rh_request(port, "POST", path, "application/json", body, r);
}

const char *rh_header(const struct rh_resp *r, const char *name, char *buf, size_t cap)
{
    if (!r->head)
        return NULL;
    size_t nl = strlen(name);
    for (const char *line = strstr(r->head, "\r\n"); line && line[2];
         line = strstr(line + 2, "\r\n")) {
        const char *l = line + 2;
        if (strncasecmp(l, name, nl) == 0 && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ')
                v++;
            size_t vl = strcspn(v, "\r\n");
            if (vl >= cap)
                vl = cap - 1;
            memcpy(buf, v, vl);
            buf[vl] = 0;
            return buf;
        }
    }
    return NULL;
}

void rh_free(struct rh_resp *r)
{
    free(r->raw);
    free(r->body);
    memset(r, 0, sizeof *r);
}

json_t *rh_json(const struct rh_resp *r)
{
    return r->body ? json_loads(r->body, 0, NULL) : NULL;
}

const char *rh_jstr(const json_t *j, const char *key)
{
    return json_string_value(json_object_get(j, key));
}

long long rh_jint(const json_t *j, const char *key)
{
    return json_integer_value(json_object_get(j, key));
}

bool rh_streq(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

bool rh_json_same(const json_t *got, const char *want_text)
{
    json_t *want = json_loads(want_text, JSON_DECODE_ANY, NULL);
    bool same = want && got && json_equal((json_t *)got, want);
    if (!same) {
        char *g = got ? json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
        char *w = want ? json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
        fprintf(stderr, "  got:  %s\n  want: %s\n", g ? g : "(null)", w ? w : "(bad want)");
        free(g);
        free(w);
    }
    json_decref(want);
    return same;
}
