/* Deadlines that a trickle of bytes does not reset (http_int.h): libmicrohttpd's
 * connection timeout restarts with every byte, so a client sending one header byte every
 * few seconds (slow-loris) would hold its connection, and its thread, for ever. Each
 * connection is tracked from its start: its request head must be whole within
 * head_timeout_s of the connection's start (or of the previous reply on a kept-alive
 * connection), its body within body_timeout_s of the head. A connection past its
 * deadline is shut down (its thread then sees the socket close and frees it). While a
 * handler runs or a reply streams, no deadline applies. One thread sleeps until the
 * earliest deadline. */
#include "api/http_int.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"

enum phase { PHASE_HEAD = HTTP_GUARD_HEAD, PHASE_BODY = HTTP_GUARD_BODY, PHASE_BUSY = HTTP_GUARD_BUSY };

struct http_guard_conn {
    struct http_guard_conn *prev, *next;
    int fd;
    enum phase phase;
    int64_t deadline_ms; /* of the phase (HEAD, BODY) */
    bool cut;
};

static int64_t now_ms(void) { return clock_ns() / 1000000; }

/* Sets c's phase and its deadline (under mu). */
static void set_phase(struct http_server *srv, struct http_guard_conn *c, enum phase p)
{
    c->phase = p;
    c->deadline_ms = p == PHASE_HEAD   ? now_ms() + (int64_t)srv->head_timeout_s * 1000
                     : p == PHASE_BODY ? now_ms() + (int64_t)srv->body_timeout_s * 1000
                                       : 0;
    if (p != PHASE_BUSY)
        pthread_cond_signal(&srv->guard_cv);
}

void http_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode toe)
{
    struct http_server *srv = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct http_guard_conn *c = calloc(1, sizeof *c);
        *socket_context = c;
        if (!c)
            return; /* untracked: only the idle timeout applies */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        c->fd = ci ? ci->connect_fd : -1;
        pthread_mutex_lock(&srv->guard_mu);
        c->next = srv->guarded;
        if (c->next)
            c->next->prev = c;
        srv->guarded = c;
        set_phase(srv, c, PHASE_HEAD);
        pthread_mutex_unlock(&srv->guard_mu);
        return;
    }
    struct http_guard_conn *c = *socket_context;
    if (!c)
        return;
    pthread_mutex_lock(&srv->guard_mu);
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->guarded = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pthread_mutex_unlock(&srv->guard_mu);
    free(c);
    *socket_context = NULL;
}

/* The tracked record of conn, or NULL. */
static struct http_guard_conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void http_guard_phase(struct http_server *srv, struct MHD_Connection *conn, int phase)
{
    struct http_guard_conn *c = conn_of(conn);
    if (!c)
        return;
    pthread_mutex_lock(&srv->guard_mu);
    set_phase(srv, c, (enum phase)phase);
    pthread_mutex_unlock(&srv->guard_mu);
}

static void *guard_main(void *arg)
{
    struct http_server *srv = arg;
    pthread_mutex_lock(&srv->guard_mu);
    while (!srv->guard_stop) {
        int64_t now = now_ms(), next = 0;
        for (struct http_guard_conn *c = srv->guarded; c; c = c->next) {
            if (c->phase == PHASE_BUSY || c->cut)
                continue;
            if (c->deadline_ms <= now) {
                /* shutdown, not close: the connection's thread owns the descriptor */
                if (c->fd >= 0)
                    shutdown(c->fd, SHUT_RDWR);
                c->cut = true;
                srv->guard_cuts++;
                log_warn("http: a connection sent no whole request %s in %u s; closed",
                         c->phase == PHASE_HEAD ? "head" : "body",
                         c->phase == PHASE_HEAD ? srv->head_timeout_s : srv->body_timeout_s);
            } else if (!next || c->deadline_ms < next) {
                next = c->deadline_ms;
            }
        }
        if (!next) {
            pthread_cond_wait(&srv->guard_cv, &srv->guard_mu);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t wait = next - now;
            ts.tv_sec += wait / 1000;
            ts.tv_nsec += (wait % 1000) * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&srv->guard_cv, &srv->guard_mu, &ts);
        }
    }
    pthread_mutex_unlock(&srv->guard_mu);
    return NULL;
}

int http_guard_start(struct http_server *srv)
{
    srv->guard_stop = false;
    if (pthread_create(&srv->guard_thread, NULL, guard_main, srv))
        return -1;
    srv->guard_running = true;
    return 0;
}

void http_guard_stop(struct http_server *srv)
{
    if (!srv->guard_running)
        return;
    pthread_mutex_lock(&srv->guard_mu);
    srv->guard_stop = true;
    pthread_cond_signal(&srv->guard_cv);
    pthread_mutex_unlock(&srv->guard_mu);
    pthread_join(srv->guard_thread, NULL);
    srv->guard_running = false;
}
