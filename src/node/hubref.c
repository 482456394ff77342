/* Model references and choosing a repo's files (hubref.h). */
#include "node/hubref.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/err.h"

static const char *const PREFIXES[] = {"https://huggingface.co/", "http://huggingface.co/", "https://hf.co/",
                                       "http://hf.co/", "huggingface.co/", "hf.co/", "hf://"};

static bool name_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.'; }

/* Reads a name of name_char bytes (1..max, not starting with '.' or '-') from *p up to a
 * byte in stops or the end into out. */
static bool take_name(const char **p, const char *stops, char *out, size_t max)
{
    size_t n = 0;
    const char *s = *p;
    while (s[n] && !strchr(stops, s[n])) {
        if (!name_char(s[n]) || n == max)
            return false;
        n++;
    }
    if (!n || s[0] == '.' || s[0] == '-')
        return false;
    memcpy(out, s, n);
    out[n] = 0;
    *p = s + n;
    return true;
}

static bool ends_with_gguf(const char *s)
{
    size_t n = strlen(s);
    return n > 5 && !strcasecmp(s + n - 5, ".gguf");
}

/* A path in a repo: segments of name bytes separated by single '/', none "." or "..". */
static bool valid_path(const char *s)
{
    size_t n = strlen(s);
    if (!n || n > HUBREF_PATH_MAX || s[0] == '/' || s[n - 1] == '/')
        return false;
    for (const char *seg = s; seg; seg = strchr(seg, '/') ? strchr(seg, '/') + 1 : NULL) {
        size_t len = strcspn(seg, "/");
        if (!len || (len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
            return false;
        for (size_t i = 0; i < len; i++)
            if (!name_char(seg[i]))
                return false;
    }
    return true;
}

static const char *skip_prefix(const char *text, bool *had)
{
    *had = false;
    for (size_t i = 0; i < sizeof PREFIXES / sizeof PREFIXES[0]; i++)
        if (!strncasecmp(text, PREFIXES[i], strlen(PREFIXES[i]))) {
            *had = true;
            return text + strlen(PREFIXES[i]);
        }
    return text;
}

int hubref_parse(const char *text, struct hub_ref *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    bool had;
    const char *p = skip_prefix(text ? text : "", &had);
    if (!take_name(&p, "/", r->owner, HUBREF_NAME_MAX) || *p++ != '/')
        return cairn_fail(err, errlen, CAIRN_EINVAL,
                          "'%.300s' is not a model reference: OWNER/REPO[:TAG] or OWNER/REPO/FILE.gguf, "
                          "optionally after hf.co/ (owner: 1..%d of A-Z a-z 0-9 . _ -)",
                          text ? text : "", HUBREF_NAME_MAX);
    if (!take_name(&p, ":/", r->repo, HUBREF_NAME_MAX))
        return cairn_fail(err, errlen, CAIRN_EINVAL, "'%.300s': the repo name must be 1..%d of A-Z a-z 0-9 . _ -",
                          text, HUBREF_NAME_MAX);
    if (*p == ':') {
        p++;
        size_t n = strlen(p);
        bool ok = n >= 1 && n <= HUBREF_TAG_MAX;
        for (size_t i = 0; ok && i < n; i++)
            ok = name_char(p[i]);
        if (!ok)
            return cairn_fail(err, errlen, CAIRN_EINVAL, "'%.300s': the tag must be 1..%d of A-Z a-z 0-9 . _ -", text,
                              HUBREF_TAG_MAX);
        for (size_t i = 0; i < n; i++)
            r->tag[i] = (char)toupper((unsigned char)p[i]);
    } else if (*p == '/') {
        p++;
        if (!valid_path(p) || !ends_with_gguf(p))
            return cairn_fail(err, errlen, CAIRN_EINVAL,
                              "'%.300s': the file must be a path in the repo ending in .gguf (1..%d of "
                              "A-Z a-z 0-9 . _ - /, no . or .. segments)", text, HUBREF_PATH_MAX);
        snprintf(r->path, sizeof r->path, "%s", p);
    }
    return 0;
}

bool hubref_looks_like(const char *text)
{
    bool had;
    skip_prefix(text, &had);
    struct hub_ref r;
    return (had || strchr(text, '/')) && hubref_parse(text, &r, NULL, 0) == 0;
}

void hubref_text(const struct hub_ref *r, const char *tag, char *out)
{
    if (r->path[0])
        snprintf(out, HUBREF_TEXT_MAX, "hf.co/%s/%s/%s", r->owner, r->repo, r->path);
    else
        snprintf(out, HUBREF_TEXT_MAX, "hf.co/%s/%s:%s", r->owner, r->repo, tag ? tag : r->tag);
}

bool hubref_canonical(const char *text, char *out)
{
    struct hub_ref r;
    out[0] = 0;
    if (!hubref_looks_like(text) || hubref_parse(text, &r, NULL, 0))
        return false;
    hubref_text(&r, r.tag[0] || r.path[0] ? NULL : HUBREF_DEFAULT_TAG, out);
    return true;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

bool hubref_split_part(const char *path, int *part, int *count)
{
    const char *b = base_name(path);
    size_t n = strlen(b);
    /* "-00001-of-00003.gguf": 20 bytes */
    if (n < 21 || !ends_with_gguf(b))
        return false;
    const char *s = b + n - 20;
    int a = 0, c = 0;
    if (s[0] != '-' || strncmp(s + 6, "-of-", 4))
        return false;
    for (int i = 0; i < 5; i++) {
        if (!isdigit((unsigned char)s[1 + i]) || !isdigit((unsigned char)s[10 + i]))
            return false;
        a = a * 10 + (s[1 + i] - '0');
        c = c * 10 + (s[10 + i] - '0');
    }
    if (a < 1 || c < 1 || a > c)
        return false;
    *part = a;
    *count = c;
    return true;
}

/* The stem of a file name: without ".gguf" and any split suffix; its length. */
static size_t stem_len(const char *b)
{
    int part, count;
    size_t n = strlen(b);
    if (hubref_split_part(b, &part, &count))
        return n - 20;
    return ends_with_gguf(b) ? n - 5 : n;
}

static bool quant_word(const char *w, size_t n)
{
    static const char *const heads[] = {"IQ", "TQ", "Q", "F16", "F32", "BF16", "MXFP4"};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        size_t h = strlen(heads[i]);
        if (n < h || strncasecmp(w, heads[i], h))
            continue;
        if ((h <= 2) && (n == h || !isdigit((unsigned char)w[h])))
            continue; /* Q and IQ are followed by a digit: "Qwen" is not a tag */
        for (size_t k = 0; k < n; k++)
            if (!isalnum((unsigned char)w[k]) && w[k] != '_')
                return false;
        return true;
    }
    return false;
}

bool hubref_file_tag(const char *path, char *tag)
{
    const char *b = base_name(path);
    size_t n = stem_len(b), start = n;
    while (start > 0 && b[start - 1] != '-' && b[start - 1] != '.')
        start--;
    if (n - start == 0 || n - start > HUBREF_TAG_MAX || !quant_word(b + start, n - start))
        return false;
    for (size_t i = start; i < n; i++)
        tag[i - start] = (char)toupper((unsigned char)b[i]);
    tag[n - start] = 0;
    return true;
}

/* Whether the file name holds tag as a word: after its start, '-', '.' or '_', and
 * before its stem's end, '-' or '.'. */
static bool has_tag_word(const char *path, const char *tag)
{
    const char *b = base_name(path);
    size_t n = stem_len(b), t = strlen(tag);
    for (size_t i = 0; t && i + t <= n; i++) {
        if (strncasecmp(b + i, tag, t))
            continue;
        bool before = i == 0 || b[i - 1] == '-' || b[i - 1] == '.' || b[i - 1] == '_';
        bool after = i + t == n || b[i + t] == '-' || b[i + t] == '.';
        if (before && after)
            return true;
    }
    return false;
}

static bool is_projector(const char *path)
{
    const char *b = base_name(path);
    for (const char *s = b; *s; s++)
        if (!strncasecmp(s, "mmproj", 6))
            return true;
    return false;
}

/* A model candidate: a GGUF that is not a projector and is whole or a split's first part. */
static bool candidate(const struct hub_file *f)
{
    int part, count;
    if (!valid_path(f->path) || !ends_with_gguf(f->path) || is_projector(f->path))
        return false;
    return !hubref_split_part(f->path, &part, &count) || part == 1;
}

static size_t depth(const char *p)
{
    size_t d = 0;
    for (; *p; p++)
        d += *p == '/';
    return d;
}

/* Of two candidates, the one nearer the top of the repo, then the shorter path. */
static bool better(const struct hub_file *a, const struct hub_file *b)
{
    size_t da = depth(a->path), db = depth(b->path);
    return da != db ? da < db : strlen(a->path) < strlen(b->path);
}

/* The parts of the model whose first file is files[first], in order, into pick. */
static int gather(const struct hub_file *files, size_t n, size_t first, size_t *pick, size_t *n_pick, char *err,
                  size_t errlen)
{
    int part, count;
    if (!hubref_split_part(files[first].path, &part, &count)) {
        pick[0] = first;
        *n_pick = 1;
        return 0;
    }
    if (part != 1)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s is part %d of a split model: name its first part",
                          files[first].path, part);
    if (count > HUBREF_MAX_PARTS)
        return cairn_fail(err, errlen, CAIRN_EFORMAT, "%s: a model in %d parts (at most %d)", files[first].path, count,
                          HUBREF_MAX_PARTS);
    size_t prefix = strlen(files[first].path) - 20;
    for (int k = 1; k <= count; k++) {
        char want[HUBREF_PATH_MAX + 32];
        snprintf(want, sizeof want, "%.*s-%05d-of-%05d%s", (int)prefix, files[first].path, k, count,
                 files[first].path + strlen(files[first].path) - 5);
        size_t i = 0;
        while (i < n && strcmp(files[i].path, want))
            i++;
        if (i == n)
            return cairn_fail(err, errlen, CAIRN_EFORMAT, "the split model %s has %d parts; part %d (%s) is not in the repo",
                              files[first].path, count, k, want);
        pick[k - 1] = i;
    }
    *n_pick = (size_t)count;
    return 0;
}

/* The tags of the repo's candidates, for an error: "Q4_K_M, Q8_0". */
static void list_tags(const struct hub_file *files, size_t n, char *out, size_t cap)
{
    size_t at = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && at + 1 < cap; i++) {
        char tag[HUBREF_TAG_MAX + 1];
        if (!candidate(&files[i]) || !hubref_file_tag(files[i].path, tag))
            continue;
        bool seen = false;
        for (size_t k = 0; k < i && !seen; k++) {
            char other[HUBREF_TAG_MAX + 1];
            seen = candidate(&files[k]) && hubref_file_tag(files[k].path, other) && !strcmp(other, tag);
        }
        if (!seen) {
            int w = snprintf(out + at, cap - at, "%s%s", at ? ", " : "", tag);
            at = w < 0 || (size_t)w >= cap - at ? cap - 1 : at + (size_t)w;
        }
    }
}

int hubref_choose(const struct hub_ref *r, const struct hub_file *files, size_t n, size_t pick[HUBREF_MAX_PARTS],
                  size_t *n_pick, char *tag, char *err, size_t errlen)
{
    *n_pick = 0;
    tag[0] = 0;
    if (r->path[0]) {
        for (size_t i = 0; i < n; i++)
            if (!strcmp(files[i].path, r->path))
                return gather(files, n, i, pick, n_pick, err, errlen);
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "%s/%s has no file %s", r->owner, r->repo, r->path);
    }
    const char *want = r->tag[0] ? r->tag : HUBREF_DEFAULT_TAG;
    size_t best = n, models = 0, only = n;
    for (size_t i = 0; i < n; i++) {
        if (!candidate(&files[i]))
            continue;
        models++;
        only = i;
        if (has_tag_word(files[i].path, want) && (best == n || better(&files[i], &files[best])))
            best = i;
    }
    if (best == n && !r->tag[0] && models == 1)
        best = only;
    if (best == n) {
        char tags[512];
        list_tags(files, n, tags, sizeof tags);
        if (!models)
            return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "%s/%s has no GGUF model file", r->owner, r->repo);
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "%s/%s has no %s file%s%s; it has: %s", r->owner, r->repo, want,
                          r->tag[0] ? "" : " (the default; name a tag)", "", tags[0] ? tags : "files without a tag");
    }
    if (r->tag[0] || has_tag_word(files[best].path, want))
        snprintf(tag, HUBREF_TAG_MAX + 1, "%s", want);
    else if (!hubref_file_tag(files[best].path, tag))
        snprintf(tag, HUBREF_TAG_MAX + 1, "GGUF");
    return gather(files, n, best, pick, n_pick, err, errlen);
}

/* id with '/' as '~', without ".gguf" and a split suffix: the stem of its local files. */
static void local_stem(const char *id, char *out)
{
    snprintf(out, HUBREF_TEXT_MAX, "%s", id);
    for (char *p = out; *p; p++)
        if (*p == '/')
            *p = '~';
    int part, count;
    size_t n = strlen(out);
    if (hubref_split_part(out, &part, &count))
        out[n - 20] = 0;
    else if (ends_with_gguf(out))
        out[n - 5] = 0;
}

void hubref_local_name(const char *id, int part, int parts, char *out)
{
    char stem[HUBREF_TEXT_MAX];
    local_stem(id, stem);
    if (parts > 1)
        snprintf(out, HUBREF_TEXT_MAX, "%.400s-%05d-of-%05d.gguf", stem, part, parts);
    else
        snprintf(out, HUBREF_TEXT_MAX, "%.400s.gguf", stem);
}

void hubref_sidecar_name(const char *id, char *out)
{
    char stem[HUBREF_TEXT_MAX];
    local_stem(id, stem);
    snprintf(out, HUBREF_TEXT_MAX + 16, "%.400s.pull.json", stem);
}
