#include "ctl/election.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/array.h"
#include "base/err.h"
#include "base/json.h"
#include "base/log.h"

struct ballot {
    char id[IDS_ID_MAX + 1];
    bool force, incumbent;
    int64_t since_ms;
};

struct peer {
    char id[IDS_ID_MAX + 1];
    bool up;
    bool has_status;      /* force and since_ms below come from its status or ballot */
    bool force;
    int64_t since_ms;
    bool has_ballot;      /* ballot for ballot_term */
    int64_t ballot_term;
    struct ballot ballot;
};

struct election {
    char id[IDS_ID_MAX + 1];
    bool force;
    int64_t since_ms;
    int settle_ms, campaign_ms, status_ms, confirm_ms;
    election_send_fn send;
    void *send_ctx;

    enum election_role role;
    int64_t term;          /* current term */
    int64_t seen;          /* highest term seen anywhere */
    char master[IDS_ID_MAX + 1];
    bool confirmed;
    int64_t started_ms;    /* election created */
    int64_t deadline_ms;   /* campaign ends */
    int64_t followed_ms;   /* when we started following an unconfirmed master */
    int64_t next_status_ms;
    struct ballot own;     /* our ballot for the campaign of term */

    struct peer *peers;
    size_t n_peers, cap_peers;
};

const char *election_role_name(enum election_role r)
{
    switch (r) {
    case ELECTION_STARTING:
        return "starting";
    case ELECTION_CANDIDATE:
        return "candidate";
    case ELECTION_FOLLOWER:
        return "follower";
    case ELECTION_MASTER:
        return "master";
    }
    return "unknown";
}

int election_create(struct election **out, const struct election_config *cfg, int64_t now_ms,
                    char *err, size_t errlen)
{
    *out = NULL;
    if (!cfg || !cfg->node_id || !ids_valid_id(cfg->node_id) || !cfg->send || cfg->term < 0 ||
        cfg->settle_ms < 0 || cfg->campaign_ms < 0 || cfg->status_ms < 0 || cfg->confirm_ms < 0)
        return cairn_fail(err, errlen, CAIRN_EINVAL,
                          "election: needs a valid node id, a send function and times >= 0");
    struct election *e = calloc(1, sizeof *e);
    if (!e)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    snprintf(e->id, sizeof e->id, "%s", cfg->node_id);
    e->force = cfg->force_master;
    e->since_ms = cfg->since_ms;
    e->settle_ms = cfg->settle_ms ? cfg->settle_ms : ELECTION_SETTLE_MS;
    e->campaign_ms = cfg->campaign_ms ? cfg->campaign_ms : ELECTION_CAMPAIGN_MS;
    e->status_ms = cfg->status_ms ? cfg->status_ms : ELECTION_STATUS_MS;
    e->confirm_ms = cfg->confirm_ms ? cfg->confirm_ms : ELECTION_CONFIRM_MS;
    e->send = cfg->send;
    e->send_ctx = cfg->send_ctx;
    e->role = ELECTION_STARTING;
    e->term = e->seen = cfg->term;
    e->started_ms = now_ms;
    e->next_status_ms = now_ms;
    *out = e;
    return 0;
}

void election_release(struct election *e)
{
    if (!e)
        return;
    free(e->peers);
    free(e);
}

enum election_role election_role(const struct election *e) { return e->role; }
int64_t election_term(const struct election *e) { return e->term; }
const char *election_master(const struct election *e) { return e->master; }
bool election_confirmed(const struct election *e) { return e->confirmed; }

/* ---- peers ---- */

static const struct peer *known_peer(const struct election *e, const char *id)
{
    for (size_t i = 0; i < e->n_peers; i++)
        if (!strcmp(e->peers[i].id, id))
            return &e->peers[i];
    return NULL;
}

static struct peer *find_peer(struct election *e, const char *id, bool create)
{
    const struct peer *known = known_peer(e, id);
    if (known)
        return &e->peers[known - e->peers];
    if (!create || !ids_valid_id(id) || e->n_peers >= ELECTION_MAX_PEERS)
        return NULL;
    if (array_reserve(&e->peers, &e->cap_peers, e->n_peers + 1, sizeof *e->peers, 8))
        return NULL;
    struct peer *p = &e->peers[e->n_peers++];
    memset(p, 0, sizeof *p);
    snprintf(p->id, sizeof p->id, "%s", id);
    return p;
}

static bool peer_is_up(const struct election *e, const char *id)
{
    const struct peer *p = known_peer(e, id);
    return p && p->up;
}

/* ---- ranking ---- */

/* > 0 when a ranks above b. */
static int ballot_cmp(const struct ballot *a, const struct ballot *b)
{
    if (a->force != b->force)
        return a->force ? 1 : -1;
    if (a->incumbent != b->incumbent)
        return a->incumbent ? 1 : -1;
    if (a->since_ms != b->since_ms)
        return a->since_ms < b->since_ms ? 1 : -1; /* up longer */
    return strcmp(a->id, b->id);
}

/* ---- messages ---- */

static void send_json(struct election *e, const char *to, json_t *j)
{
    if (!j)
        return;
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    if (text) {
        e->send(e->send_ctx, to, text, strlen(text));
        free(text);
    }
}

static void send_status(struct election *e, const char *to)
{
    json_t *master = e->master[0] && (e->role == ELECTION_MASTER || e->role == ELECTION_FOLLOWER)
                         ? json_string(e->master)
                         : json_null();
    send_json(e, to,
              json_pack("{s:s, s:I, s:o, s:b, s:I}", "type", "status", "term", (json_int_t)e->term,
                        "master", master, "force", e->force, "since_ms",
                        (json_int_t)e->since_ms));
}

static void send_ballot(struct election *e, const char *to)
{
    send_json(e, to,
              json_pack("{s:s, s:I, s:b, s:b, s:I}", "type", "ballot", "term", (json_int_t)e->term,
                        "force", e->own.force, "incumbent", e->own.incumbent, "since_ms",
                        (json_int_t)e->own.since_ms));
}

/* ---- transitions ---- */

static void follow(struct election *e, const char *master, int64_t term, bool confirmed,
                   int64_t now_ms)
{
    bool changed = strcmp(e->master, master) || e->term != term || e->role != ELECTION_FOLLOWER;
    e->role = ELECTION_FOLLOWER;
    e->term = term;
    if (term > e->seen)
        e->seen = term;
    snprintf(e->master, sizeof e->master, "%s", master);
    e->confirmed = confirmed;
    e->followed_ms = now_ms;
    if (changed)
        log_info("election %s: following %s in term %lld%s", e->id, master, (long long)term,
                 confirmed ? "" : " (unconfirmed)");
}

static void become_master(struct election *e, int64_t term)
{
    e->role = ELECTION_MASTER;
    e->term = term;
    if (term > e->seen)
        e->seen = term;
    snprintf(e->master, sizeof e->master, "%s", e->id);
    e->confirmed = true;
    log_info("election %s: master of term %lld", e->id, (long long)term);
    send_status(e, NULL);
}

/* Campaigns for term (above every term seen). */
static void campaign(struct election *e, int64_t term, int64_t now_ms)
{
    /* A master that joins a campaign stays the incumbent through newer ones. */
    bool incumbent = e->role == ELECTION_MASTER || (e->role == ELECTION_CANDIDATE && e->own.incumbent);
    e->role = ELECTION_CANDIDATE;
    e->term = term;
    if (term > e->seen)
        e->seen = term;
    e->master[0] = 0;
    e->confirmed = false;
    e->deadline_ms = now_ms + e->campaign_ms;
    e->own = (struct ballot){.force = e->force, .incumbent = incumbent, .since_ms = e->since_ms};
    snprintf(e->own.id, sizeof e->own.id, "%s", e->id);
    log_info("election %s: campaigning for term %lld", e->id, (long long)term);
    send_ballot(e, NULL);
}

static void decide(struct election *e, int64_t now_ms)
{
    const struct ballot *best = &e->own;
    for (size_t i = 0; i < e->n_peers; i++) {
        const struct peer *p = &e->peers[i];
        if (p->up && p->has_ballot && p->ballot_term == e->term && ballot_cmp(&p->ballot, best) > 0)
            best = &p->ballot;
    }
    if (best == &e->own)
        become_master(e, e->term);
    else
        follow(e, best->id, e->term, false, now_ms);
}

/* The master peer (whose status we hold) ranks above us as a master of the same term. */
static bool ranks_above_us(struct election *e, const struct peer *p)
{
    struct ballot them = {.force = p->force, .since_ms = p->since_ms};
    struct ballot us = {.force = e->force, .since_ms = e->since_ms};
    snprintf(them.id, sizeof them.id, "%s", p->id);
    snprintf(us.id, sizeof us.id, "%s", e->id);
    return ballot_cmp(&them, &us) > 0;
}

static void claim(struct election *e, struct peer *p, int64_t term, int64_t now_ms)
{
    if (term > e->seen)
        e->seen = term;
    if (term < e->term) {
        send_status(e, p->id); /* it is behind: tell it who leads now */
        return;
    }
    if (term > e->term) {
        follow(e, p->id, term, true, now_ms);
        return;
    }
    switch (e->role) {
    case ELECTION_STARTING:
    case ELECTION_CANDIDATE:
        follow(e, p->id, term, true, now_ms);
        break;
    case ELECTION_FOLLOWER:
        if (!strcmp(e->master, p->id))
            e->confirmed = true;
        else if (!e->confirmed || !peer_is_up(e, e->master))
            follow(e, p->id, term, true, now_ms);
        break;
    case ELECTION_MASTER:
        if (!p->has_status)
            break; /* its status (sent on peer up) settles it */
        if (ranks_above_us(e, p)) {
            log_warn("election %s: %s is also master of term %lld and ranks above us: stepping down",
                     e->id, p->id, (long long)term);
            follow(e, p->id, term, true, now_ms);
        } else {
            log_warn("election %s: %s is also master of term %lld: moving to term %lld", e->id,
                     p->id, (long long)term, (long long)(e->seen + 1));
            become_master(e, e->seen + 1);
        }
        break;
    }
}

void election_claim(struct election *e, const char *peer, int64_t term, int64_t now_ms)
{
    struct peer *p = find_peer(e, peer, true);
    if (p && term >= 1)
        claim(e, p, term, now_ms);
}

void election_peer_up(struct election *e, const char *peer, int64_t now_ms)
{
    (void)now_ms;
    struct peer *p = find_peer(e, peer, true);
    if (!p)
        return;
    p->up = true;
    send_status(e, peer);
    if (e->role == ELECTION_CANDIDATE)
        send_ballot(e, peer);
}

void election_peer_down(struct election *e, const char *peer, int64_t now_ms)
{
    struct peer *p = find_peer(e, peer, false);
    if (!p)
        return;
    p->up = false;
    p->has_ballot = false;
    if (e->role == ELECTION_FOLLOWER && !strcmp(e->master, peer)) {
        log_warn("election %s: master %s is down", e->id, peer);
        campaign(e, e->seen + 1, now_ms);
    }
}

static int on_status(struct election *e, struct peer *p, const json_t *msg, int64_t now_ms,
                     char *err, size_t errlen)
{
    static const char *const keys[] = {"type", "term", "master", "force", "since_ms", NULL};
    char master[IDS_ID_MAX + 1];
    int64_t term, since;
    bool force;
    int rc = json_get_keys(msg, "status", keys, err, errlen);
    if (!rc)
        rc = json_get_int(msg, "status", "term", 0, IDS_COUNTER_MAX, &term, err, errlen);
    if (!rc)
        rc = ids_json_id_or_null(msg, "status", "master", master, err, errlen);
    if (!rc)
        rc = json_get_bool(msg, "status", "force", &force, err, errlen);
    if (!rc)
        rc = json_get_int(msg, "status", "since_ms", 0, IDS_COUNTER_MAX, &since, err, errlen);
    if (rc)
        return rc;
    p->has_status = true;
    p->force = force;
    p->since_ms = since;
    if (term > e->seen)
        e->seen = term;
    if (!strcmp(master, p->id) && term >= 1) {
        claim(e, p, term, now_ms);
        return 0;
    }
    /* Our master says another leads (a master without one is still campaigning; the
     * confirmation timer covers one that never takes the term). */
    if (e->role == ELECTION_FOLLOWER && !strcmp(e->master, p->id) && term >= e->term &&
        master[0]) {
        if (strcmp(master, e->id) && peer_is_up(e, master))
            follow(e, master, term, false, now_ms);
        else
            campaign(e, e->seen + 1, now_ms);
    }
    return 0;
}

static int on_ballot(struct election *e, struct peer *p, const json_t *msg, int64_t now_ms,
                     char *err, size_t errlen)
{
    static const char *const keys[] = {"type", "term", "force", "incumbent", "since_ms", NULL};
    struct ballot b;
    int64_t term;
    memset(&b, 0, sizeof b);
    int rc = json_get_keys(msg, "ballot", keys, err, errlen);
    if (!rc)
        rc = json_get_int(msg, "ballot", "term", 1, IDS_COUNTER_MAX, &term, err, errlen);
    if (!rc)
        rc = json_get_bool(msg, "ballot", "force", &b.force, err, errlen);
    if (!rc)
        rc = json_get_bool(msg, "ballot", "incumbent", &b.incumbent, err, errlen);
    if (!rc)
        rc = json_get_int(msg, "ballot", "since_ms", 0, IDS_COUNTER_MAX, &b.since_ms, err, errlen);
    if (rc)
        return rc;
    snprintf(b.id, sizeof b.id, "%s", p->id);
    p->has_status = true;
    p->force = b.force;
    p->since_ms = b.since_ms;
    p->has_ballot = true;
    p->ballot_term = term;
    p->ballot = b;
    if (term > e->seen)
        e->seen = term;
    if (term > e->term) {
        campaign(e, term, now_ms); /* join the newer campaign */
        return 0;
    }
    if (term == e->term && e->role == ELECTION_STARTING) {
        campaign(e, term, now_ms);
        return 0;
    }
    if (term < e->term || e->role == ELECTION_MASTER || e->role == ELECTION_FOLLOWER)
        send_status(e, p->id); /* decided (or stale): it learns who leads */
    return 0;
}

int election_receive(struct election *e, const char *from, const json_t *msg, int64_t now_ms,
                     char *err, size_t errlen)
{
    const char *type = json_string_value(json_object_get(msg, "type"));
    if (!type)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "election.type: missing");
    bool status = !strcmp(type, "status"), ballot = !strcmp(type, "ballot");
    if (!status && !ballot)
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "election.type: %.32s is not ours", type);
    struct peer *p = from ? find_peer(e, from, true) : NULL;
    if (!p)
        return cairn_fail(err, errlen, CAIRN_EINVAL, "election: bad or too many peers");
    return status ? on_status(e, p, msg, now_ms, err, errlen)
                  : on_ballot(e, p, msg, now_ms, err, errlen);
}

/* The master we follow: a --force-master node takes over from one without the flag. */
static bool should_take_over(const struct election *e)
{
    if (!e->force || e->role != ELECTION_FOLLOWER || !e->confirmed)
        return false;
    const struct peer *m = known_peer(e, e->master);
    return m && m->has_status && !m->force;
}

void election_tick(struct election *e, int64_t now_ms)
{
    switch (e->role) {
    case ELECTION_STARTING:
        if (now_ms - e->started_ms >= e->settle_ms)
            campaign(e, e->seen + 1, now_ms);
        break;
    case ELECTION_CANDIDATE:
        if (now_ms >= e->deadline_ms)
            decide(e, now_ms);
        break;
    case ELECTION_FOLLOWER:
        if (!peer_is_up(e, e->master) && now_ms - e->followed_ms >= e->confirm_ms) {
            log_warn("election %s: master %s is not reachable", e->id, e->master);
            campaign(e, e->seen + 1, now_ms);
        } else if (!e->confirmed && now_ms - e->followed_ms >= e->confirm_ms) {
            log_warn("election %s: %s did not take term %lld", e->id, e->master,
                     (long long)e->term);
            campaign(e, e->seen + 1, now_ms);
        } else if (should_take_over(e)) {
            campaign(e, e->seen + 1, now_ms);
        }
        break;
    case ELECTION_MASTER:
        break;
    }
    if (now_ms >= e->next_status_ms) {
        e->next_status_ms = now_ms + e->status_ms;
        send_status(e, NULL);
        if (e->role == ELECTION_CANDIDATE)
            send_ballot(e, NULL);
    }
}

int64_t election_due_ms(const struct election *e, int64_t now_ms)
{
    int64_t due = e->next_status_ms;
    if (e->role == ELECTION_STARTING && e->started_ms + e->settle_ms < due)
        due = e->started_ms + e->settle_ms;
    if (e->role == ELECTION_CANDIDATE && e->deadline_ms < due)
        due = e->deadline_ms;
    /* A follower's confirm deadline matters only while its master is unconfirmed or
     * down (election_tick then campaigns); once passed with a confirmed, reachable master
     * it is no deadline at all, and counting it made every follower poll without sleeping. */
    if (e->role == ELECTION_FOLLOWER && (!e->confirmed || !peer_is_up(e, e->master)) &&
        e->followed_ms + e->confirm_ms < due)
        due = e->followed_ms + e->confirm_ms;
    if (e->role == ELECTION_FOLLOWER && should_take_over(e))
        due = now_ms;
    return due > now_ms ? due - now_ms : 0;
}
