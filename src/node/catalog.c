#include "node/catalog.h"
#include "node/hub.h"
#include "node/hubref.h"
#include "node/sha256.h"

#include "base/array.h"
#include "base/dtype.h"
#include "base/err.h"
#include "base/log.h"
#include "gguf/gguf.h"
#include "model/arch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

struct catalog {
    char *dir;
    struct catalog_card *cards; /* n entries sorted by (id, path) */
    size_t n;
};

static bool model_id_byte(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("._:/@+-", ch) != NULL);
}

/* A model's file: a GGUF, not hidden, and not a later part of a split model (its first
 * part stands for all of them). */
static bool gguf_name(const char *name)
{
    size_t len = strlen(name);
    int part, count;
    return name[0] != '.' && len > 5 && !strcasecmp(name + len - 5, ".gguf") &&
           !(hubref_split_part(name, &part, &count) && part > 1);
}

void catalog_id_from_file_name(const char *file_name, char *id)
{
    size_t len = strlen(file_name);
    if (len >= 5 && !strcasecmp(file_name + len - 5, ".gguf"))
        len -= 5;
    if (len > IDS_MODEL_MAX)
        len = IDS_MODEL_MAX;
    for (size_t i = 0; i < len; i++)
        id[i] = model_id_byte((unsigned char)file_name[i]) ? file_name[i] : '_';
    if (len == 0)
        id[len++] = '_';
    id[len] = 0;
}

/* Keeps only what a card with an error shows. */
static void drop_details(struct catalog_card *card)
{
    free(card->layer_bytes);
    free(card->layer_swa);
    struct catalog_card keep = {.path = card->path, .error = card->error,
                                .file_bytes = card->file_bytes, .mtime_ns = card->mtime_ns};
    memcpy(keep.id, card->id, sizeof keep.id);
    *card = keep;
}

static int64_t mtime_of(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* "blk.N." prefix: N, or -1 for other names. */
static int64_t block_index(const char *name)
{
    if (strncmp(name, "blk.", 4))
        return -1;
    int64_t n = 0;
    const char *p = name + 4;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        n = n * 10 + (*p - '0');
        if (n > (1 << 30))
            return -1;
    }
    return *p == '.' ? n : -1;
}

static int read_tensors(struct catalog_card *card, const struct gguf_file *f, char *err, size_t errlen)
{
    card->layer_bytes = calloc((size_t)card->n_layers, sizeof *card->layer_bytes);
    if (!card->layer_bytes)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    bool have_embd = false, have_head = false;
    uint64_t expert_bytes = 0;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        const struct dtype_info *ti = dtype_info(t->type);
        if (!ti || !ti->supported)
            return cairn_fail(err, errlen, CAIRN_EUNSUPPORTED, "tensor %s has type %s, which is not supported",
                              t->name, dtype_name(t->type));
        card->weight_bytes += t->size;
        if (strstr(t->name, "_exps."))
            expert_bytes += t->size;
        int64_t blk = block_index(t->name);
        if (blk >= 0) {
            if (blk >= card->n_layers)
                return cairn_fail(err, errlen, CAIRN_EFORMAT, "tensor %s is beyond block_count %d", t->name,
                                  card->n_layers);
            card->layer_bytes[blk] += t->size;
        } else if (!strcmp(t->name, "token_embd.weight")) {
            card->embd_bytes = t->size;
            have_embd = true;
        } else if (!strcmp(t->name, "output.weight")) {
            card->head_bytes = t->size;
            have_head = true;
        } else if (!strcmp(t->name, "output_norm.weight")) {
            card->output_norm_bytes = t->size;
        } else {
            card->other_bytes += t->size;
        }
    }
    if (!have_embd)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "tensor token_embd.weight is missing");
    for (int l = 0; l < card->n_layers; l++)
        if (!card->layer_bytes[l])
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "layer %d has no tensors (blk.%d.*)", l, l);
    card->active_bytes = card->weight_bytes;
    if (card->n_expert > 0) /* a token reads n_expert_used of each layer's n_expert experts */
        card->active_bytes = card->weight_bytes - expert_bytes +
                             expert_bytes / (uint64_t)card->n_expert * (uint64_t)card->n_expert_used;
    card->tied_output = !have_head;
    if (!have_head)
        card->head_bytes = card->embd_bytes;
    return 0;
}

static void copy_name(char *dst, size_t cap, struct gguf_str s)
{
    size_t n = 0;
    for (uint64_t i = 0; i < s.len && n + 1 < cap; i++)
        if ((unsigned char)s.ptr[i] >= 0x20 && s.ptr[i] != 0x7f)
            dst[n++] = s.ptr[i];
    dst[n] = 0;
}

int catalog_card_read(struct catalog_card *out, const char *path, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    const char *base = strrchr(path, '/');
    catalog_id_from_file_name(base ? base + 1 : path, out->id);
    char ref[HUBREF_TEXT_MAX];
    if (hub_sidecar_id(path, ref)) /* a pulled model is named by its reference */
        snprintf(out->id, sizeof out->id, "%.255s", ref); /* a valid id: 255 bytes at most */
    out->path = strdup(path);
    if (!out->path)
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    struct stat st;
    if (stat(path, &st))
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot stat %s: %s", path, strerror(errno));
    out->file_bytes = (uint64_t)st.st_size;
    out->mtime_ns = mtime_of(&st);
    if (!S_ISREG(st.st_mode))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "%s is not a regular file", path);

    struct gguf_file *f = NULL;
    int rc = gguf_open(&f, path, err, errlen);
    if (rc)
        return rc;
    struct model_hparams hp;
    if ((rc = model_read_hparams(f, &hp, err, errlen)))
        goto out;
    memcpy(out->arch, hp.arch, sizeof out->arch);
    out->model_bytes = gguf_file_size(f);
    out->n_layers = hp.n_layers;
    out->n_embd = hp.n_embd;
    out->n_ff = hp.n_ff;
    out->n_expert = hp.n_expert;
    out->n_expert_used = hp.n_expert_used;
    out->n_ff_exp = hp.n_ff_exp;
    out->n_head = hp.n_head;
    out->n_head_kv = hp.n_head_kv;
    out->head_dim = hp.head_dim;
    out->n_vocab = hp.n_vocab;
    out->n_ctx = hp.n_ctx_train;
    out->kv_bytes_per_token_layer = 2ull * (uint64_t)hp.n_head_kv * (uint64_t)hp.head_dim * 2ull;
    const char *pooling = model_pooling_name(hp.pooling);
    snprintf(out->pooling, sizeof out->pooling, "%s", pooling ? pooling : "none");
    if (hp.swa_window > 0) {
        if (!(out->layer_swa = calloc((size_t)hp.n_layers, 1))) {
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
            goto out;
        }
        out->swa_window = hp.swa_window;
        for (int l = 0; l < hp.n_layers; l++)
            out->layer_swa[l] = model_layer_swa(&hp, l);
    }
    struct gguf_str s;
    if (gguf_get_str(f, "general.name", &s) == 0)
        copy_name(out->name, sizeof out->name, s);
    out->chat_template = gguf_get_str(f, "tokenizer.chat_template", &s) == 0 && s.len > 0;
    rc = read_tensors(out, f, err, errlen);
out:
    gguf_close(f);
    if (rc)
        drop_details(out);
    return rc;
}

int catalog_create(struct catalog **out, const char *dir, char *err, size_t errlen)
{
    *out = NULL;
    if (!dir || !dir[0])
        return cairn_fail(err, errlen, CAIRN_EINVAL, "no models folder given");
    struct catalog *c = calloc(1, sizeof *c);
    if (c)
        c->dir = strdup(dir);
    if (!c || !c->dir) {
        free(c);
        return cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
    }
    *out = c;
    return 0;
}

static void free_cards(struct catalog_card *cards, size_t n)
{
    for (size_t i = 0; i < n; i++)
        catalog_card_clear(&cards[i]);
    free(cards);
}

void catalog_release(struct catalog *c)
{
    if (!c)
        return;
    free_cards(c->cards, c->n);
    free(c->dir);
    free(c);
}

const char *catalog_dir(const struct catalog *c) { return c->dir; }

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_cards(const void *a, const void *b)
{
    const struct catalog_card *x = a, *y = b;
    int r = strcmp(x->id, y->id);
    return r ? r : strcmp(x->path, y->path);
}

/* Moves the old card of path into *dst when the file is unchanged and the card usable. */
static bool reuse(struct catalog *c, const char *path, const struct stat *st, struct catalog_card *dst)
{
    for (size_t i = 0; i < c->n; i++) {
        struct catalog_card *old = &c->cards[i];
        if (old->path && !old->error && !strcmp(old->path, path) && old->file_bytes == (uint64_t)st->st_size &&
            old->mtime_ns == mtime_of(st)) {
            *dst = *old;
            memset(old, 0, sizeof *old);
            return true;
        }
    }
    return false;
}

static int list_names(const char *dir, char ***names_out, size_t *n_out, bool *missing, char *err, size_t errlen)
{
    *names_out = NULL;
    *n_out = 0;
    *missing = false;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) {
            *missing = true;
            return 0;
        }
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot open models folder %s: %s", dir, strerror(errno));
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!gguf_name(e->d_name))
            continue;
        if (n == CATALOG_MAX_FILES) {
            log_warn("models folder %s: more than %d GGUF files, the rest are ignored", dir, CATALOG_MAX_FILES);
            break;
        }
        if (array_reserve(&names, &cap, n + 1, sizeof *names, 16)) {
            rc = CAIRN_ENOMEM;
            break;
        }
        if (!(names[n] = strdup(e->d_name))) {
            rc = CAIRN_ENOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            free(names[i]);
        free(names);
        return cairn_fail(err, errlen, rc, "out of memory");
    }
    if (n)
        qsort(names, n, sizeof *names, cmp_names);
    *names_out = names;
    *n_out = n;
    return 0;
}

int catalog_scan(struct catalog *c, char *err, size_t errlen)
{
    char **names;
    size_t n_names;
    bool missing;
    int rc = list_names(c->dir, &names, &n_names, &missing, err, errlen);
    if (rc)
        return rc;
    struct catalog_card *cards = n_names ? calloc(n_names, sizeof *cards) : NULL;
    if (n_names && !cards) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    size_t n = 0;
    for (size_t i = 0; i < n_names; i++) {
        size_t len = strlen(c->dir) + strlen(names[i]) + 2;
        char *path = malloc(len);
        if (!path) {
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
            break;
        }
        snprintf(path, len, "%s/%s", c->dir, names[i]);
        struct stat st;
        struct catalog_card *card = &cards[n];
        bool have_stat = stat(path, &st) == 0;
        if (have_stat && S_ISDIR(st.st_mode)) {
            free(path);
            continue;
        }
        if (have_stat && S_ISREG(st.st_mode) && reuse(c, path, &st, card)) {
            free(path);
            n++;
            continue;
        }
        char why[512];
        int rrc = catalog_card_read(card, path, why, sizeof why);
        free(path);
        if (rrc == CAIRN_ENOMEM || (rrc && !card->path)) {
            catalog_card_clear(card);
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
            break;
        }
        if (rrc && !(card->error = strdup(why))) {
            catalog_card_clear(card);
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
            break;
        }
        if (rrc)
            log_debug("models folder: %s: %s", card->path, why);
        n++;
    }
    if (rc) {
        free_cards(cards, n);
        goto out;
    }
    if (n)
        qsort(cards, n, sizeof *cards, cmp_cards);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(cards[i].id, cards[i - 1].id))
            continue;
        char why[512];
        snprintf(why, sizeof why, "id %s is already given to %s", cards[i].id, cards[i - 1].path);
        char *e = strdup(why);
        if (!e) {
            free_cards(cards, n);
            rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
            goto out;
        }
        free(cards[i].error);
        cards[i].error = e;
        drop_details(&cards[i]);
    }
    free_cards(c->cards, c->n);
    c->cards = cards;
    c->n = n;
out:
    for (size_t i = 0; i < n_names; i++)
        free(names[i]);
    free(names);
    return rc;
}

size_t catalog_count(const struct catalog *c) { return c->n; }

const struct catalog_card *catalog_at(const struct catalog *c, size_t i)
{
    return i < c->n ? &c->cards[i] : NULL;
}

static struct catalog_card *find(const struct catalog *c, const char *id)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->cards[i].id, id))
            return &c->cards[i];
    return NULL;
}

const struct catalog_card *catalog_find(const struct catalog *c, const char *id) { return find(c, id); }

int catalog_file_sha256(const char *path, char *hex, uint64_t *size_out, int64_t *mtime_out, char *err,
                        size_t errlen)
{
    hex[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat before, after;
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    int rc = 0;
    if (!buf) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    if (fstat(fd, &before)) {
        rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot stat %s: %s", path, strerror(errno));
        goto out;
    }
    struct sha256 st = {0};
    if (sha256_init(&st)) {
        rc = cairn_fail(err, errlen, CAIRN_ENOMEM, "out of memory");
        goto out;
    }
    uint64_t total = 0;
    for (;;) {
        ssize_t got = read(fd, buf, cap);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            rc = cairn_fail(err, errlen, CAIRN_EIO, "cannot read %s: %s", path, strerror(errno));
            sha256_drop(&st);
            goto out;
        }
        if (got == 0)
            break;
        sha256_update(&st, buf, (size_t)got);
        total += (uint64_t)got;
    }
    char digest_hex[SHA256_HEX];
    sha256_final_hex(&st, digest_hex);
    if (fstat(fd, &after) || after.st_size != before.st_size || mtime_of(&after) != mtime_of(&before) ||
        total != (uint64_t)before.st_size) {
        rc = cairn_fail(err, errlen, CAIRN_ESTATE, "%s changed while it was hashed", path);
        goto out;
    }
    memcpy(hex, digest_hex, SHA256_HEX);
    if (size_out)
        *size_out = (uint64_t)before.st_size;
    if (mtime_out)
        *mtime_out = mtime_of(&before);
out:
    free(buf);
    close(fd);
    return rc;
}

int catalog_put_sha256(struct catalog *c, const char *path, uint64_t size, int64_t mtime_ns, const char *hex)
{
    for (size_t i = 0; i < c->n; i++) {
        struct catalog_card *card = &c->cards[i];
        if (card->path && !strcmp(card->path, path) && card->file_bytes == size && card->mtime_ns == mtime_ns &&
            strlen(hex) == CATALOG_SHA256_HEX - 1) {
            memcpy(card->sha256, hex, CATALOG_SHA256_HEX);
            return 0;
        }
    }
    return CAIRN_ENOTFOUND;
}

int catalog_sha256(struct catalog *c, const char *id, char *hex, char *err, size_t errlen)
{
    hex[0] = 0;
    struct catalog_card *card = find(c, id);
    if (!card)
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "no model %s in %s", id, c->dir);
    struct stat st;
    if (stat(card->path, &st))
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot stat %s: %s", card->path, strerror(errno));
    if ((uint64_t)st.st_size != card->file_bytes || mtime_of(&st) != card->mtime_ns) {
        card->sha256[0] = 0;
        return cairn_fail(err, errlen, CAIRN_ESTATE, "%s changed since the models folder was listed", card->path);
    }
    if (!card->sha256[0]) {
        uint64_t size;
        int64_t mtime;
        int rc = catalog_file_sha256(card->path, card->sha256, &size, &mtime, err, errlen);
        if (rc)
            return rc;
        if (size != card->file_bytes || mtime != card->mtime_ns) {
            card->sha256[0] = 0;
            return cairn_fail(err, errlen, CAIRN_ESTATE, "%s changed since the models folder was listed", card->path);
        }
    }
    memcpy(hex, card->sha256, CATALOG_SHA256_HEX);
    return 0;
}

json_t *catalog_to_json(const struct catalog *c)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < c->n; i++)
        if (json_array_append_new(a, catalog_card_to_json(&c->cards[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}
