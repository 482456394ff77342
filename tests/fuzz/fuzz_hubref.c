/* libFuzzer harness of model references (node/hubref.c), which come from users and from
 * API requests: arbitrary text parses or is refused with a reason; a parsed reference's
 * canonical text parses back to the same owner, repo, tag and path; local file names stay
 * within one folder (no '/', no leading '.'); and choosing files from a listing made of
 * the input's lines never indexes outside it and picks only GGUF files, parts in order.
 * Built and run by tests/fuzz/run.sh (clang, ASan + UBSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "node/hubref.h"

static void check_ref(const char *text)
{
    struct hub_ref r, back;
    char err[512] = "", canon[HUBREF_TEXT_MAX], local[HUBREF_TEXT_MAX], side[HUBREF_TEXT_MAX + 16];
    if (hubref_parse(text, &r, err, sizeof err)) {
        if (!err[0])
            abort();
        return;
    }
    hubref_text(&r, r.tag[0] || r.path[0] ? NULL : "Q4_K_M", canon);
    if (hubref_parse(canon, &back, err, sizeof err) || strcmp(back.owner, r.owner) || strcmp(back.repo, r.repo) ||
        strcmp(back.path, r.path) || (r.tag[0] && strcmp(back.tag, r.tag)))
        abort();
    for (int parts = 1; parts <= 3; parts += 2) {
        hubref_local_name(canon, parts, parts, local);
        if (strchr(local, '/') || local[0] == '.')
            abort();
    }
    hubref_sidecar_name(canon, side);
    if (strchr(side, '/') || side[0] == '.')
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 8192)
        return 0;
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    /* line 1: a reference; the rest: a listing, one path per line */
    char *nl = strchr(text, '\n');
    if (nl)
        *nl = 0;
    check_ref(text);
    struct hub_file files[256];
    size_t n = 0;
    for (char *p = nl ? nl + 1 : NULL; p && n < 256; n++) {
        char *e = strchr(p, '\n');
        if (e)
            *e = 0;
        files[n] = (struct hub_file){.path = p, .size = n, .sha256 = NULL};
        p = e ? e + 1 : NULL;
    }
    struct hub_ref r;
    if (!hubref_parse(text, &r, NULL, 0)) {
        size_t pick[HUBREF_MAX_PARTS], np = 0;
        char tag[HUBREF_TAG_MAX + 1], err[512];
        if (!hubref_choose(&r, files, n, pick, &np, tag, err, sizeof err)) {
            if (!np || np > HUBREF_MAX_PARTS)
                abort();
            for (size_t k = 0; k < np; k++) {
                size_t len = pick[k] < n ? strlen(files[pick[k]].path) : 0;
                if (pick[k] >= n || len < 5 || strcasecmp(files[pick[k]].path + len - 5, ".gguf"))
                    abort();
            }
        }
    }
    char tag[HUBREF_TAG_MAX + 1];
    int part, count;
    for (size_t i = 0; i < n; i++) {
        hubref_file_tag(files[i].path, tag);
        if (hubref_split_part(files[i].path, &part, &count) && (part < 1 || part > count))
            abort();
    }
    free(text);
    return 0;
}
