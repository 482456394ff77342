/* cairn pull, ls and rm: models from the hub in this machine's models folder (node/hub.h).
 *   cairn pull REF [--models-dir DIR] [--revision REV]   fetch (or find) a model
 *   cairn ls [--models-dir DIR]                          the models here
 *   cairn rm REF [--models-dir DIR]                      delete a pulled model's files
 *   cairn search TEXT [--limit N]                        repos with GGUF files on the hub
 * A progress bar on a terminal, one line every few seconds otherwise; the exit status
 * says whether it worked. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/args.h"
#include "base/clock.h"
#include "base/err.h"
#include "base/log.h"
#include "cli/cli.h"
#include "cli/progress.h"
#include "node/catalog.h"
#include "node/cards.h"
#include "node/hub.h"

/* $CAIRN_MODELS_DIR, else the data folder's models/ (as cairn node). */
static const char *models_dir_default(char *buf, size_t cap)
{
    const char *env = getenv("CAIRN_MODELS_DIR");
    if (env && env[0])
        return env;
    return cli_data_path(buf, cap, "models") ? NULL : buf;
}

static void usage(const char *cmd)
{
    if (!strcmp(cmd, "pull"))
        fprintf(stderr,
                "usage: cairn pull REF [--models-dir DIR] [--revision REV] [--layers A:B] [--connections N]\n"
                "Fetches a GGUF model from the Hugging Face hub into the models folder (resumable,\n"
                "verified by SHA-256). REF: hf.co/OWNER/REPO:TAG, OWNER/REPO:TAG (TAG a quantization,\n"
                "e.g. Q4_K_M; without one, Q4_K_M or the repo's only model) or OWNER/REPO/FILE.gguf.\n"
                "HF_TOKEN (gated and private repos), HF_ENDPOINT and HF_HUB_OFFLINE are honoured.\n"
                "The model is then served under the canonical reference it prints. --layers A:B fetches\n"
                "the header and only what layers [A, B) read (a pipeline rank's share), as a node does\n"
                "when a placement gives it those layers. A file of 64 MiB or more comes over N connections\n"
                "at once (4; --connections 1: one).\n");
    else if (!strcmp(cmd, "rm"))
        fprintf(stderr, "usage: cairn rm REF [--models-dir DIR]\nDeletes a model's files from the models folder.\n");
    else
        fprintf(stderr, "usage: cairn ls [--models-dir DIR]\nLists the models in the models folder.\n");
}

/* The options shared by the three commands; the reference when want_ref. CLI_GO_ON or
 * the exit code. */
static int parse(int argc, char **argv, const char *cmd, bool want_ref, const char **ref, const char **dir,
                 const char **revision, const char **layers, int64_t *connections, char *buf, size_t cap)
{
    struct args a = {argc, argv, 1, cmd, false};
    const char *v;
    *ref = NULL;
    *dir = NULL;
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "--models-dir", &v)) *dir = v;
        else if (revision && args_opt(&a, "--revision", &v)) *revision = v;
        else if (layers && args_opt(&a, "--layers", &v)) *layers = v;
        else if (connections && args_opt(&a, "--connections", &v))
            *connections = args_int(&a, "--connections", v, 1, HUB_CONNECTIONS_MAX);
        else if (args_opt(&a, "-h|--help", NULL)) { usage(cmd); return 0; }
        else if (want_ref && !*ref && argv[a.i][0] != '-') *ref = argv[a.i];
        else {
            fprintf(stderr, "cairn %s: unexpected '%s'\n", cmd, argv[a.i]);
            usage(cmd);
            return 2;
        }
    }
    if (a.bad)
        return 2;
    if (want_ref && !*ref) {
        usage(cmd);
        return 2;
    }
    if (!*dir && !(*dir = models_dir_default(buf, cap))) {
        fprintf(stderr, "cairn %s: no --models-dir, and neither XDG_DATA_HOME nor HOME is set\n", cmd);
        return 2;
    }
    return CLI_GO_ON;
}

static atomic_bool interrupted;
static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&interrupted, true);
}

/* cairn pull REF --layers A:B: the header, then only the byte ranges layers [A, B) read
 * (a pipeline rank's share), into the models folder's .sparse (node/hub.h). */
static int pull_layers(const struct hub_config *cfg, const char *ref, const char *layers, struct progress_bar *b)
{
    int first, end, used = 0;
    char err[1024], id[HUBREF_TEXT_MAX];
    if (sscanf(layers, "%d:%d%n", &first, &end, &used) != 2 || layers[used] || first < 0 || end <= first) {
        fprintf(stderr, "cairn pull: --layers wants A:B with 0 <= A < B (layers [A, B)), not '%s'\n", layers);
        return 2;
    }
    struct hub_sparse_result res;
    int rc = hub_sparse_header(cfg, ref, id, err, sizeof err);
    if (!rc)
        rc = hub_sparse_fill(cfg, id, first, end, progress_show, b, &res, err, sizeof err);
    if (rc) {
        progress_end(b);
        fprintf(stderr, "cairn pull: %s\n", atomic_load(&interrupted) ? "interrupted (run it again to resume)" : err);
        return 1;
    }
    struct stat st;
    uint64_t file = stat(res.path, &st) ? 0 : (uint64_t)st.st_size;
    printf("%s\n", id);
    fprintf(stderr, "%s: layers %d..%d: %" PRIu64 " bytes read by them (%.3f of the first file's %" PRIu64
                    "), %" PRIu64 " fetched now%s\n",
            id, first, end, res.needed, file ? (double)res.needed / (double)file : 0.0, file, res.fetched,
            res.promoted ? "; every byte is here: verified and moved into the models folder" : "");
    return 0;
}

int cli_pull(int argc, char **argv)
{
    const char *ref, *dir, *revision = NULL;
    char buf[4096], err[1024];
    const char *layers = NULL;
    int64_t connections = 0;
    int rc = parse(argc, argv, "pull", true, &ref, &dir, &revision, &layers, &connections, buf, sizeof buf);
    if (rc != CLI_GO_ON)
        return rc;
    log_set_level(LOG_WARN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    struct hub_config cfg = {.models_dir = dir, .revision = revision, .cancel = &interrupted,
                             .connections = (int)connections};
    struct progress_bar b = {.tty = isatty(2)};
    if (layers)
        return pull_layers(&cfg, ref, layers, &b);
    struct hub_pulled got;
    rc = hub_pull(&cfg, ref, progress_show, &b, &got, err, sizeof err);
    if (rc)
        progress_end(&b);
    if (rc) {
        fprintf(stderr, "cairn pull: %s\n", atomic_load(&interrupted) ? "interrupted (run it again to resume)" : err);
        return 1;
    }
    char size[32];
    progress_human((double)got.bytes, size, sizeof size);
    printf("%s\n", got.id);
    fprintf(stderr, "%s: %s, %s in %d file%s at commit %.12s (%s)\n", got.id, got.already ? "already here" : "pulled",
            size, got.parts, got.parts > 1 ? "s" : "", got.commit, got.path);
    return 0;
}

int cli_ls(int argc, char **argv)
{
    const char *ref, *dir;
    char buf[4096], err[512];
    int rc = parse(argc, argv, "ls", false, &ref, &dir, NULL, NULL, NULL, buf, sizeof buf);
    if (rc != CLI_GO_ON)
        return rc;
    struct catalog *c = NULL;
    if (catalog_create(&c, dir, err, sizeof err) || catalog_scan(c, err, sizeof err)) {
        fprintf(stderr, "cairn ls: %s\n", err);
        catalog_release(c);
        return 1;
    }
    printf("%-60s %10s  %s\n", "NAME", "SIZE", "ARCH / ERROR");
    for (size_t i = 0; i < catalog_count(c); i++) {
        const struct catalog_card *k = catalog_at(c, i);
        char size[32];
        progress_human((double)k->file_bytes, size, sizeof size);
        printf("%-60s %10s  %s\n", k->id, size, k->error ? k->error : k->arch);
    }
    catalog_release(c);
    /* the models of which this machine holds some layers only (a pipeline rank's) */
    char sparse[4200];
    c = NULL;
    if (!hub_sparse_dir(dir, sparse, sizeof sparse) && !catalog_create(&c, sparse, err, sizeof err) &&
        !catalog_scan(c, err, sizeof err)) {
        for (size_t i = 0; i < catalog_count(c); i++) {
            const struct catalog_card *k = catalog_at(c, i);
            struct stat st;
            char here[32], whole[32];
            progress_human(stat(k->path, &st) ? 0.0 : (double)st.st_blocks * 512, here, sizeof here);
            progress_human((double)k->file_bytes, whole, sizeof whole);
            printf("%-60s %10s  %s (layers only: %s of %s here)\n", k->id, whole, k->error ? k->error : k->arch, here,
                   whole);
        }
    }
    catalog_release(c);
    return 0;
}

int cli_rm(int argc, char **argv)
{
    const char *ref, *dir;
    char buf[4096], err[512], id[HUBREF_TEXT_MAX];
    int rc = parse(argc, argv, "rm", true, &ref, &dir, NULL, NULL, NULL, buf, sizeof buf);
    if (rc != CLI_GO_ON)
        return rc;
    /* a reference as typed names the canonical id; a local model is named as listed */
    if (!hubref_canonical(ref, id))
        snprintf(id, sizeof id, "%s", ref);
    rc = hub_remove(dir, id, err, sizeof err);
    if (rc) {
        fprintf(stderr, "cairn rm: %s\n", err);
        return 1;
    }
    fprintf(stderr, "deleted %s\n", id);
    return 0;
}

int cli_search(int argc, char **argv)
{
    struct args a = {argc, argv, 1, "search", false};
    const char *v, *query = NULL;
    int64_t limit = 20;
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "--limit", &v)) limit = args_int(&a, "--limit", v, 1, HUB_SEARCH_MAX);
        else if (args_opt(&a, "-h|--help", NULL)) {
            fprintf(stderr, "usage: cairn search TEXT [--limit N]\nRepos of the Hugging Face hub with GGUF files whose "
                            "names hold TEXT, most downloaded first\n(HF_ENDPOINT, HF_TOKEN as for cairn pull), after the models of cairn's "
                            "built-in catalog\nwhose name, repo or architecture hold every word of TEXT.\n");
            return 0;
        } else if (!query && argv[a.i][0] != '-') query = argv[a.i];
        else {
            fprintf(stderr, "cairn search: unexpected '%s'\n", argv[a.i]);
            return 2;
        }
    }
    if (a.bad || !query) {
        fprintf(stderr, "usage: cairn search TEXT [--limit N]\n");
        return 2;
    }
    json_t *cat = cards_search(query, (size_t)limit), *e;
    size_t i;
    if (json_array_size(cat))
        printf("%-64s %7s %6s %8s  %s\n", "IN CAIRN'S CATALOG", "PARAMS", "LAYERS", "CONTEXT", "Q4_K_M (about)");
    json_array_foreach(cat, i, e) {
        json_t *q4 = json_array_get(json_object_get(e, "quants"), 0);
        printf("%-64s %6.1fB %6lld %8lld  %.1f GB\n", json_string_value(json_object_get(q4, "ref")),
               json_real_value(json_object_get(e, "params_b")),
               (long long)json_integer_value(json_object_get(e, "n_layers")),
               (long long)json_integer_value(json_object_get(e, "context_length")),
               (double)json_integer_value(json_object_get(q4, "approx_bytes")) / 1e9);
    }
    if (json_array_size(cat))
        printf("\n");
    json_decref(cat);
    struct hub_config cfg = {.models_dir = "."};
    json_t *found = NULL;
    char err[512];
    if (hub_search(&cfg, query, (int)limit, &found, err, sizeof err)) {
        fprintf(stderr, "cairn search: %s\n", err);
        return 1;
    }
    printf("%-64s %12s %7s\n", "ON THE HUB (cairn pull it, with :TAG)", "DOWNLOADS", "LIKES");
    json_array_foreach(found, i, e) {
        printf("%-64s %12lld %7lld%s\n", json_string_value(json_object_get(e, "ref")),
               (long long)json_integer_value(json_object_get(e, "downloads")),
               (long long)json_integer_value(json_object_get(e, "likes")),
               json_is_true(json_object_get(e, "gated")) ? "  (gated: HF_TOKEN)" : "");
    }
    json_decref(found);
    return 0;
}
