/* LAN discovery over IPv4 UDP broadcast; see discovery.h for the beacon and the rules. */
#include "net/discovery.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "proto/ids.h"

#define MS 1000000LL /* ns */
#define MAGIC "CRNB"
#define FLAG_MAC 0x01
#define KEY_CONTEXT "cairn discovery beacon key v1"
#define MAX_TARGETS 64   /* broadcast addresses one round sends to */
#define RECV_BUF 2048    /* larger than any beacon, so an oversized datagram shows */

struct peer {
    bool used;
    char id[DISCOVERY_ID_MAX];
    char addr[DISCOVERY_ADDR_MAX];
    int api_port, cluster_port;
    uint64_t epoch, seq;
    int64_t heard, addr_heard, reported; /* clock_ns of last beacon, last from addr, last report */
};

struct discovery {
    char id[DISCOVERY_ID_MAX];
    char ns[DISCOVERY_NS_MAX];
    char ifname[DISCOVERY_IFNAME_MAX]; /* "" in auto mode */
    bool off, has_key;
    uint8_t key[DISCOVERY_KEY_BYTES];
    int api_port, cluster_port, udp_port, interval_ms;
    int fd;
    unsigned ifindex;                  /* IFACE mode: resolved again each round */
    uint64_t epoch, seq;
    int64_t next_send;
    struct discovery_stats stats;
    struct peer *peers;                /* DISCOVERY_MAX_PEERS */
};

/* ---- beacon encoding ------------------------------------------------------------- */

static bool valid_ns(const char *s, size_t len)
{
    if (len >= DISCOVERY_NS_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] >= 0x7f)
            return false;
    return true;
}

static bool valid_id(const char *s) { return s && strlen(s) < DISCOVERY_ID_MAX && ids_valid_id(s); }

static void put16(uint8_t *p, unsigned v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static unsigned get16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

int discovery_beacon_key(const char *secret, uint8_t key[DISCOVERY_KEY_BYTES])
{
    if (!secret || !*secret || !key)
        return CAIRN_EINVAL;
    if (sodium_init() < 0)
        return CAIRN_EIO;
    crypto_generichash(key, DISCOVERY_KEY_BYTES, (const unsigned char *)secret, strlen(secret),
                       (const unsigned char *)KEY_CONTEXT, strlen(KEY_CONTEXT));
    return 0;
}

_Static_assert(crypto_auth_BYTES == DISCOVERY_MAC_BYTES, "beacon MAC is one crypto_auth tag");
_Static_assert(crypto_auth_KEYBYTES == DISCOVERY_KEY_BYTES, "beacon key is one crypto_auth key");

int discovery_beacon_encode(const struct discovery_beacon *b, const uint8_t *key,
                            uint8_t out[DISCOVERY_BEACON_MAX], size_t *len)
{
    if (!b || !out || !len || !valid_id(b->node_id))
        return CAIRN_EINVAL;
    size_t idlen = strlen(b->node_id), nslen = strnlen(b->ns, DISCOVERY_NS_MAX);
    if (!valid_ns(b->ns, nslen) || b->api_port < 0 || b->api_port > 65535 || b->cluster_port < 1 ||
        b->cluster_port > 65535)
        return CAIRN_EINVAL;
    memcpy(out, MAGIC, 4);
    out[4] = DISCOVERY_VERSION;
    out[5] = key ? FLAG_MAC : 0;
    put16(out + 6, (unsigned)b->api_port);
    put16(out + 8, (unsigned)b->cluster_port);
    put64(out + 10, b->epoch);
    put64(out + 18, b->seq);
    out[26] = (uint8_t)idlen;
    out[27] = (uint8_t)nslen;
    size_t n = DISCOVERY_HDR_SIZE;
    memcpy(out + n, b->node_id, idlen);
    n += idlen;
    memcpy(out + n, b->ns, nslen);
    n += nslen;
    if (key) {
        crypto_auth(out + n, out, n, key);
        n += DISCOVERY_MAC_BYTES;
    }
    *len = n;
    return 0;
}

int discovery_beacon_decode(const void *buf, size_t n, const uint8_t *key,
                            struct discovery_beacon *out, char *err, size_t errlen)
{
    const uint8_t *p = buf;
    if (!buf || !out)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no datagram");
    if (n < DISCOVERY_HDR_SIZE)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%zu bytes, shorter than a beacon header", n);
    if (n > DISCOVERY_BEACON_MAX)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%zu bytes, longer than any beacon", n);
    if (memcmp(p, MAGIC, 4))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "bad magic");
    if (p[4] != DISCOVERY_VERSION)
        return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "version %u (we speak %d)", p[4], DISCOVERY_VERSION);
    if (p[5] & ~FLAG_MAC)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "unknown flags 0x%02x", p[5]);
    bool mac = p[5] & FLAG_MAC;
    size_t idlen = p[26], nslen = p[27];
    size_t want = DISCOVERY_HDR_SIZE + idlen + nslen + (mac ? DISCOVERY_MAC_BYTES : 0);
    if (idlen == 0 || idlen >= DISCOVERY_ID_MAX || nslen >= DISCOVERY_NS_MAX)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "id length %zu or namespace length %zu out of range",
                          idlen, nslen);
    if (n != want)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%zu bytes where its lengths say %zu", n, want);
    unsigned api = get16(p + 6), cluster = get16(p + 8);
    if (cluster == 0)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "cluster port 0");
    char id[DISCOVERY_ID_MAX], ns[DISCOVERY_NS_MAX];
    memcpy(id, p + DISCOVERY_HDR_SIZE, idlen);
    id[idlen] = 0;
    memcpy(ns, p + DISCOVERY_HDR_SIZE + idlen, nslen);
    ns[nslen] = 0;
    if (strlen(id) != idlen || !ids_valid_id(id))
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "invalid node id");
    if (!valid_ns(ns, nslen) || strlen(ns) != nslen)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "namespace holds a control or non-ASCII byte");
    if (key && !mac)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "beacon without a MAC (we have a cluster secret)");
    if (!key && mac)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "beacon with a MAC (we have no cluster secret)");
    if (mac && crypto_auth_verify(p + n - DISCOVERY_MAC_BYTES, p, n - DISCOVERY_MAC_BYTES, key))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "bad MAC (another cluster secret, or forged)");
    memcpy(out->node_id, id, idlen + 1);
    memcpy(out->ns, ns, nslen + 1);
    out->api_port = (int)api;
    out->cluster_port = (int)cluster;
    out->epoch = get64(p + 10);
    out->seq = get64(p + 18);
    return 0;
}

/* ---- create / release ------------------------------------------------------------ */

static int validate(const struct discovery_config *cfg, char *err, size_t errlen)
{
    if (!cfg)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "discovery: no config");
    if (!valid_id(cfg->node_id))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "discovery: invalid node id");
    const char *ns = cfg->ns ? cfg->ns : "";
    if (!valid_ns(ns, strnlen(ns, DISCOVERY_NS_MAX)))
        return cairn_fail(err, errlen, CAIRN_EINVAL,
                          "discovery: namespace must be at most %d printable ASCII bytes", DISCOVERY_NS_MAX - 1);
    if (cfg->api_port < 0 || cfg->api_port > 65535)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "discovery: API port %d not in 0..65535", cfg->api_port);
    if (cfg->cluster_port < 1 || cfg->cluster_port > 65535)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "discovery: cluster port %d not in 1..65535",
                          cfg->cluster_port);
    if (cfg->udp_port < 0 || cfg->udp_port > 65535)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "discovery: UDP port %d not in 1..65535", cfg->udp_port);
    if (cfg->interval_ms && (cfg->interval_ms < DISCOVERY_INTERVAL_MS_MIN ||
                             cfg->interval_ms > DISCOVERY_INTERVAL_MS_MAX))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "discovery: interval %d ms not in %d..%d", cfg->interval_ms,
                          DISCOVERY_INTERVAL_MS_MIN, DISCOVERY_INTERVAL_MS_MAX);
    const char *mode = cfg->mode;
    if (mode && strcmp(mode, "off") && strcmp(mode, "auto")) {
        size_t len = strnlen(mode, DISCOVERY_IFNAME_MAX);
        if (len == 0 || len >= DISCOVERY_IFNAME_MAX || strchr(mode, '/'))
            return cairn_fail(err, errlen, CAIRN_EINVAL,
                              "discovery: mode must be off, auto or an interface name of at most %d bytes",
                              DISCOVERY_IFNAME_MAX - 1);
        if (!if_nametoindex(mode))
            return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "discovery: no interface named '%s'", mode);
    }
    return 0;
}

static int open_socket(struct discovery *d, char *err, size_t errlen)
{
    d->fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_UDP);
    if (d->fd < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "discovery: UDP socket: %s", strerror(errno));
    int on = 1;
    if (setsockopt(d->fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on) ||
        setsockopt(d->fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof on) ||
        setsockopt(d->fd, SOL_SOCKET, SO_BROADCAST, &on, sizeof on) ||
        setsockopt(d->fd, IPPROTO_IP, IP_PKTINFO, &on, sizeof on))
        return cairn_fail(err, errlen, CAIRN_EIO, "discovery: setsockopt: %s", strerror(errno));
    /* Best effort: binding to the device needs CAP_NET_RAW on kernels before 5.7; the
     * arrival interface is checked on every datagram anyway (IP_PKTINFO). */
    if (d->ifname[0] &&
        setsockopt(d->fd, SOL_SOCKET, SO_BINDTODEVICE, d->ifname, (socklen_t)strlen(d->ifname)))
        log_debug("discovery: SO_BINDTODEVICE %s: %s (filtering by interface instead)", d->ifname,
                  strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d->udp_port),
                             .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(d->fd, (struct sockaddr *)&sa, sizeof sa))
        return cairn_fail(err, errlen, CAIRN_EIO, "discovery: bind UDP port %d: %s", d->udp_port, strerror(errno));
    return 0;
}

int discovery_create(struct discovery **out, const struct discovery_config *cfg, char *err, size_t errlen)
{
    if (!out)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "discovery: no output");
    *out = NULL;
    int rc = validate(cfg, err, errlen);
    if (rc)
        return rc;
    struct discovery *d = calloc(1, sizeof *d);
    if (!d)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "discovery: out of memory");
    d->fd = -1;
    d->peers = calloc(DISCOVERY_MAX_PEERS, sizeof *d->peers);
    if (!d->peers) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "discovery: out of memory");
        goto fail;
    }
    snprintf(d->id, sizeof d->id, "%s", cfg->node_id);
    snprintf(d->ns, sizeof d->ns, "%s", cfg->ns ? cfg->ns : "");
    d->api_port = cfg->api_port;
    d->cluster_port = cfg->cluster_port;
    d->udp_port = cfg->udp_port ? cfg->udp_port : DISCOVERY_PORT_DEFAULT;
    d->interval_ms = cfg->interval_ms ? cfg->interval_ms : DISCOVERY_INTERVAL_MS_DEFAULT;
    d->off = cfg->mode && !strcmp(cfg->mode, "off");
    if (cfg->mode && !d->off && strcmp(cfg->mode, "auto")) {
        snprintf(d->ifname, sizeof d->ifname, "%s", cfg->mode);
        d->ifindex = if_nametoindex(d->ifname);
    }
    if (cfg->secret && *cfg->secret) {
        rc = discovery_beacon_key(cfg->secret, d->key);
        if (rc) {
            cairn_fail(err, errlen, rc, "discovery: cannot derive the beacon key");
            goto fail;
        }
        d->has_key = true;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    d->epoch = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    d->next_send = clock_ns();
    if (!d->off) {
        rc = open_socket(d, err, errlen);
        if (rc)
            goto fail;
    }
    *out = d;
    return 0;
fail:
    discovery_release(d);
    return rc;
}

void discovery_release(struct discovery *d)
{
    if (!d)
        return;
    if (d->fd >= 0)
        close(d->fd);
    sodium_memzero(d->key, sizeof d->key);
    free(d->peers);
    free(d);
}

int discovery_fd(const struct discovery *d) { return d ? d->fd : -1; }

int64_t discovery_due_ms(const struct discovery *d)
{
    if (!d || d->off)
        return -1;
    int64_t left = d->next_send - clock_ns();
    return left > 0 ? (left + MS - 1) / MS : 0;
}

void discovery_get_stats(const struct discovery *d, struct discovery_stats *out)
{
    if (d && out)
        *out = d->stats;
}

/* ---- sending --------------------------------------------------------------------- */

struct target {
    unsigned ifindex;
    struct in_addr local, bcast;
};

/* Broadcast addresses of the interfaces this round beacons on. */
static int list_targets(struct discovery *d, struct target *t, int max)
{
    struct ifaddrs *all;
    if (getifaddrs(&all)) {
        log_debug("discovery: getifaddrs: %s", strerror(errno));
        return 0;
    }
    int n = 0;
    for (struct ifaddrs *a = all; a && n < max; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !a->ifa_broadaddr ||
            a->ifa_broadaddr->sa_family != AF_INET)
            continue;
        unsigned fl = a->ifa_flags;
        if (!(fl & IFF_UP) || !(fl & IFF_BROADCAST) || (fl & IFF_LOOPBACK))
            continue;
        if (d->ifname[0] && strcmp(a->ifa_name, d->ifname))
            continue;
        struct target c = {.ifindex = if_nametoindex(a->ifa_name),
                           .local = ((struct sockaddr_in *)a->ifa_addr)->sin_addr,
                           .bcast = ((struct sockaddr_in *)a->ifa_broadaddr)->sin_addr};
        bool dup = !c.ifindex;
        for (int i = 0; i < n && !dup; i++)
            dup = t[i].ifindex == c.ifindex && t[i].bcast.s_addr == c.bcast.s_addr;
        if (!dup)
            t[n++] = c;
    }
    freeifaddrs(all);
    return n;
}

static void send_round(struct discovery *d)
{
    if (d->ifname[0])
        d->ifindex = if_nametoindex(d->ifname); /* the interface may have come back anew */
    struct discovery_beacon b = {.api_port = d->api_port, .cluster_port = d->cluster_port,
                                 .epoch = d->epoch, .seq = ++d->seq};
    memcpy(b.node_id, d->id, sizeof b.node_id);
    memcpy(b.ns, d->ns, sizeof b.ns);
    uint8_t buf[DISCOVERY_BEACON_MAX];
    size_t len;
    if (discovery_beacon_encode(&b, d->has_key ? d->key : NULL, buf, &len))
        return; /* cannot happen: the config was validated */
    struct target t[MAX_TARGETS];
    int n = list_targets(d, t, MAX_TARGETS);
    for (int i = 0; i < n; i++) {
        struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d->udp_port),
                                 .sin_addr = t[i].bcast};
        struct iovec iov = {.iov_base = buf, .iov_len = len};
        union {
            char buf[CMSG_SPACE(sizeof(struct in_pktinfo))];
            struct cmsghdr align;
        } ctl;
        memset(&ctl, 0, sizeof ctl);
        struct msghdr m = {.msg_name = &to, .msg_namelen = sizeof to, .msg_iov = &iov, .msg_iovlen = 1,
                           .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = IPPROTO_IP;
        c->cmsg_type = IP_PKTINFO;
        c->cmsg_len = CMSG_LEN(sizeof(struct in_pktinfo));
        struct in_pktinfo pi = {.ipi_ifindex = (int)t[i].ifindex, .ipi_spec_dst = t[i].local};
        memcpy(CMSG_DATA(c), &pi, sizeof pi);
        if (sendmsg(d->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
            d->stats.send_failed++;
            log_debug("discovery: beacon to %s: %s", inet_ntoa(t[i].bcast), strerror(errno));
        } else {
            d->stats.sent++;
        }
    }
}

/* ---- receiving ------------------------------------------------------------------- */

static struct peer *find_slot(struct discovery *d, const char *id, int64_t now, bool *found)
{
    struct peer *free_slot = NULL, *oldest = NULL;
    *found = false;
    for (int i = 0; i < DISCOVERY_MAX_PEERS; i++) {
        struct peer *p = &d->peers[i];
        if (p->used && now - p->heard > DISCOVERY_FORGET_MS * MS) {
            p->used = false;
            d->stats.forgotten++;
        }
        if (!p->used) {
            if (!free_slot)
                free_slot = p;
            continue;
        }
        if (!strcmp(p->id, id)) {
            *found = true;
            return p;
        }
        if (!oldest || p->heard < oldest->heard)
            oldest = p;
    }
    if (free_slot)
        return free_slot;
    d->stats.forgotten++;
    log_debug("discovery: forgetting %s to make room", oldest->id);
    return oldest;
}

static void report(const struct peer *p, enum discovery_change change, struct discovery_peer *out)
{
    out->change = change;
    memcpy(out->node_id, p->id, sizeof out->node_id);
    memcpy(out->addr, p->addr, sizeof out->addr);
    out->api_port = p->api_port;
    out->cluster_port = p->cluster_port;
}

/* Updates the table with a valid beacon of our namespace from addr; 1 when it is worth
 * reporting (out filled). */
static int note_peer(struct discovery *d, const struct discovery_beacon *b, const char *addr,
                     struct discovery_peer *out)
{
    int64_t now = clock_ns();
    bool found;
    struct peer *p = find_slot(d, b->node_id, now, &found);
    if (!found) {
        memset(p, 0, sizeof *p);
        p->used = true;
        snprintf(p->id, sizeof p->id, "%s", b->node_id);
        snprintf(p->addr, sizeof p->addr, "%s", addr);
        p->api_port = b->api_port;
        p->cluster_port = b->cluster_port;
        p->epoch = b->epoch;
        p->seq = b->seq;
        p->heard = p->addr_heard = p->reported = now;
        d->stats.accepted++;
        log_info("discovery: found node %s at %s (API port %d, cluster port %d)", p->id, p->addr, p->api_port,
                 p->cluster_port);
        report(p, DISCOVERY_NEW, out);
        return 1;
    }
    bool same_addr = !strcmp(p->addr, addr);
    bool newer = b->epoch > p->epoch || (b->epoch == p->epoch && b->seq > p->seq);
    if (!newer) {
        /* A copy of a round we have (another interface of the peer, or a replay). It
         * confirms nothing: a replayer who echoes every round must not keep the address
         * it once gave us, so only newer beacons count for the address. */
        d->stats.stale++;
        return 0;
    }
    bool restarted = b->epoch != p->epoch;
    d->stats.accepted++;
    p->epoch = b->epoch;
    p->seq = b->seq;
    p->heard = now;
    bool changed = false;
    if (!same_addr && (restarted || now - p->addr_heard > DISCOVERY_STICKY_MS * MS)) {
        log_info("discovery: node %s moved from %s to %s", p->id, p->addr, addr);
        snprintf(p->addr, sizeof p->addr, "%s", addr);
        changed = true;
    }
    if (same_addr || changed)
        p->addr_heard = now;
    if (p->api_port != b->api_port || p->cluster_port != b->cluster_port) {
        p->api_port = b->api_port;
        p->cluster_port = b->cluster_port;
        changed = true;
    }
    if (!changed && now - p->reported < (int64_t)d->interval_ms * MS)
        return 0;
    p->reported = now;
    report(p, changed ? DISCOVERY_CHANGED : DISCOVERY_REFRESHED, out);
    return 1;
}

/* Reads one datagram; 1 when it filled out, 0 when it was ignored, -1 when none waits,
 * CAIRN_EIO when the socket failed. */
static int read_one(struct discovery *d, struct discovery_peer *out)
{
    uint8_t buf[RECV_BUF];
    struct sockaddr_in from;
    union {
        char buf[CMSG_SPACE(sizeof(struct in_pktinfo)) + 64];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
    struct msghdr m = {.msg_name = &from, .msg_namelen = sizeof from, .msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(d->fd, &m, MSG_DONTWAIT);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return -1;
        if (errno == ECONNREFUSED || errno == ENETUNREACH || errno == EHOSTUNREACH)
            return 0; /* an ICMP error queued on the socket, not a datagram */
        log_warn("discovery: recvmsg: %s", strerror(errno));
        return CAIRN_EIO;
    }
    d->stats.received++;
    if (d->ifname[0]) {
        int arrived = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
                struct in_pktinfo pi;
                memcpy(&pi, CMSG_DATA(c), sizeof pi);
                arrived = pi.ipi_ifindex;
            }
        if (arrived <= 0 || (unsigned)arrived != d->ifindex) {
            d->stats.other_iface++;
            return 0;
        }
    }
    if (m.msg_namelen < sizeof from || from.sin_family != AF_INET) {
        d->stats.malformed++;
        return 0;
    }
    char addr[DISCOVERY_ADDR_MAX];
    if (!inet_ntop(AF_INET, &from.sin_addr, addr, sizeof addr)) {
        d->stats.malformed++;
        return 0;
    }
    struct discovery_beacon b;
    char why[128];
    if (m.msg_flags & MSG_TRUNC) {
        d->stats.malformed++;
        return 0;
    }
    int rc = discovery_beacon_decode(buf, (size_t)n, d->has_key ? d->key : NULL, &b, why, sizeof why);
    if (rc == CAIRN_EINVAL) {
        d->stats.unauthenticated++;
        log_debug("discovery: ignored a beacon from %s: %s", addr, why);
        return 0;
    }
    if (rc) {
        d->stats.malformed++;
        log_debug("discovery: ignored %zd bytes from %s: %s", n, addr, why);
        return 0;
    }
    if (strcmp(b.ns, d->ns)) {
        d->stats.other_ns++;
        return 0;
    }
    if (!strcmp(b.node_id, d->id)) {
        d->stats.own++;
        return 0;
    }
    return note_peer(d, &b, addr, out);
}

int discovery_poll(struct discovery *d, int timeout_ms, struct discovery_peer *out)
{
    if (!d || !out || timeout_ms < 0)
        return CAIRN_EINVAL;
    int64_t deadline = clock_ns() + (int64_t)timeout_ms * MS;
    if (d->off) {
        if (timeout_ms > 0)
            poll(NULL, 0, timeout_ms);
        return 0;
    }
    int reads = 0;
    for (;;) {
        int64_t now = clock_ns();
        if (now >= d->next_send) {
            send_round(d);
            /* Never catch up with a burst after a long pause: the next beacon is due
             * one interval from now. */
            d->next_send = now + (int64_t)d->interval_ms * MS;
        }
        while (reads < DISCOVERY_DRAIN_MAX) {
            int rc = read_one(d, out);
            if (rc == -1)
                break;
            reads++;
            if (rc)
                return rc;
        }
        if (reads >= DISCOVERY_DRAIN_MAX)
            return 0;
        now = clock_ns();
        if (now >= deadline)
            return 0;
        int64_t until = d->next_send < deadline ? d->next_send : deadline;
        int wait = (int)((until - now + MS - 1) / MS);
        struct pollfd pfd = {.fd = d->fd, .events = POLLIN};
        int rc = poll(&pfd, 1, wait);
        if (rc < 0) {
            if (errno == EINTR)
                return 0;
            log_warn("discovery: poll: %s", strerror(errno));
            return CAIRN_EIO;
        }
    }
}
