/* Model catalog: cards of synthetic llama/qwen2/qwen3 files with byte counts computed
 * from their shapes, files listed with their errors (truncated, garbage, unsupported
 * architecture or tensor type), the id rule, rescans that keep unchanged cards, the
 * lazy SHA-256 against sha256sum, JSON and the placement model. */
#include "node/catalog.h"

#include "base/dtype.h"
#include "base/err.h"
#include "gguf/gguf.h"
#include "model/synth.h"
#include "testutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];

static const char *path_in(const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

/* Byte counts a synthetic file of spec s must give (matrices of type f16, vectors F32). */
struct expect {
    uint64_t layer, embd, head, norm, other;
};

static struct expect expected(const struct synth_spec *s, int n_vocab)
{
    uint64_t E = (uint64_t)s->n_embd, F = (uint64_t)s->n_ff, q = (uint64_t)s->n_head * (uint64_t)s->head_dim,
             kv = (uint64_t)s->n_head_kv * (uint64_t)s->head_dim, V = (uint64_t)n_vocab;
    struct expect e = {0};
    e.layer = 2 * E * 4 + 2 * (q * E + 2 * kv * E + E * q + 3 * F * E);
    if (!strcmp(s->arch, "qwen2"))
        e.layer += (q + 2 * kv) * 4;
    if (!strcmp(s->arch, "qwen3"))
        e.layer += 2 * (uint64_t)s->head_dim * 4;
    e.embd = V * E * 2;
    e.head = s->tied ? e.embd : V * E * 2;
    e.norm = E * 4;
    e.other = s->llama3_rope ? (uint64_t)s->head_dim / 2 * 4 : 0;
    return e;
}

static struct synth_spec spec_of(const char *arch, int layers, int embd, int ff, int head, int head_kv, int head_dim,
                                 int tied, int vocab)
{
    struct synth_spec s = {0};
    snprintf(s.arch, sizeof s.arch, "%s", arch);
    s.n_layers = layers, s.n_embd = embd, s.n_ff = ff, s.n_head = head, s.n_head_kv = head_kv;
    s.head_dim = head_dim, s.n_ctx = 1024, s.rope_base = 10000, s.norm_eps = 1e-5f, s.tied = tied;
    snprintf(s.type, sizeof s.type, "f16");
    s.seed = 7;
    s.vocab_size = vocab;
    return s;
}

static void write_spec(const struct synth_spec *s, const char *vocab, const char *name)
{
    char err[256];
    int rc = synth_write(s, vocab, path_in(name), err, sizeof err);
    CHECK(rc == 0, "synth_write %s: %s", name, err);
}

static void check_card(const struct catalog_card *c, const struct synth_spec *s, int n_vocab, const char *what)
{
    CHECK(c != NULL, "%s: no card", what);
    if (!c)
        return;
    CHECK(c->error == NULL, "%s: error %s", what, c->error);
    if (c->error)
        return;
    struct expect e = expected(s, n_vocab);
    CHECK(!strcmp(c->arch, s->arch), "%s: arch %s", what, c->arch);
    CHECK_EQ_INT(c->n_layers, s->n_layers);
    CHECK_EQ_INT(c->n_embd, s->n_embd);
    CHECK_EQ_INT(c->n_ff, s->n_ff);
    CHECK_EQ_INT(c->n_head, s->n_head);
    CHECK_EQ_INT(c->n_head_kv, s->n_head_kv);
    CHECK_EQ_INT(c->head_dim, s->head_dim);
    CHECK_EQ_INT(c->n_ctx, s->n_ctx);
    CHECK_EQ_INT(c->n_vocab, n_vocab);
    CHECK(c->tied_output == (s->tied != 0), "%s: tied %d", what, c->tied_output);
    for (int l = 0; l < c->n_layers; l++)
        CHECK(c->layer_bytes[l] == e.layer, "%s: layer %d bytes %llu, expected %llu", what, l,
              (unsigned long long)c->layer_bytes[l], (unsigned long long)e.layer);
    CHECK(c->embd_bytes == e.embd, "%s: embd %llu vs %llu", what, (unsigned long long)c->embd_bytes,
          (unsigned long long)e.embd);
    CHECK(c->head_bytes == e.head, "%s: head %llu vs %llu", what, (unsigned long long)c->head_bytes,
          (unsigned long long)e.head);
    CHECK(c->output_norm_bytes == e.norm, "%s: norm %llu vs %llu", what, (unsigned long long)c->output_norm_bytes,
          (unsigned long long)e.norm);
    CHECK(c->other_bytes == e.other, "%s: other %llu vs %llu", what, (unsigned long long)c->other_bytes,
          (unsigned long long)e.other);
    uint64_t all = e.layer * (uint64_t)s->n_layers + e.embd + (s->tied ? 0 : e.head) + e.norm + e.other;
    CHECK(c->weight_bytes == all, "%s: weight bytes %llu vs %llu", what, (unsigned long long)c->weight_bytes,
          (unsigned long long)all);
    CHECK(c->file_bytes > all && c->file_bytes < all + (8u << 20), "%s: file bytes %llu for %llu of weights", what,
          (unsigned long long)c->file_bytes, (unsigned long long)all);
    CHECK(c->kv_bytes_per_token_layer == 4ull * (uint64_t)s->n_head_kv * (uint64_t)s->head_dim,
          "%s: kv bytes %llu", what, (unsigned long long)c->kv_bytes_per_token_layer);
    CHECK(c->sha256[0] == 0, "%s: sha computed eagerly", what);
}

static void write_bytes(const char *name, const void *data, size_t n)
{
    FILE *f = fopen(path_in(name), "wb");
    CHECK(f != NULL, "cannot write %s", name);
    if (f) {
        fwrite(data, 1, n, f);
        fclose(f);
    }
}

static void *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    *n = 0;
    void *buf = malloc((size_t)len);
    if (buf)
        *n = fread(buf, 1, (size_t)len, f);
    fclose(f);
    return buf;
}

/* A GGUF with llama-like metadata under another architecture name, or with a tensor of
 * an unsupported type. */
static void write_odd(const char *name, const char *arch, int type)
{
    struct gguf_writer *w = NULL;
    CHECK(gguf_writer_create(&w) == 0, "writer");
    gguf_writer_set_str(w, "general.architecture", arch, strlen(arch));
    char key[64];
    const char *keys[] = {"block_count", "embedding_length", "feed_forward_length", "attention.head_count"};
    const uint32_t vals[] = {1, 256, 256, 4};
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, keys[i]);
        gguf_writer_set_u32(w, key, vals[i]);
    }
    int64_t ne[2] = {256, 4};
    const struct dtype_info *ti = dtype_info(type);
    size_t bytes = (size_t)(4 * 256 / ti->block_elems * ti->block_bytes);
    void *data = calloc(1, bytes);
    gguf_writer_add_tensor(w, "token_embd.weight", type, 2, ne, data, NULL, NULL);
    gguf_writer_add_tensor(w, "blk.0.attn_q.weight", type, 2, ne, data, NULL, NULL);
    char err[256];
    int rc = gguf_writer_write(w, path_in(name), err, sizeof err);
    CHECK(rc == 0, "write %s: %s", name, err);
    gguf_writer_release(w);
    free(data);
}

static const struct catalog_card *must_find(const struct catalog *c, const char *id)
{
    const struct catalog_card *card = catalog_find(c, id);
    CHECK(card != NULL, "no entry %s", id);
    return card;
}

static void test_errors(struct catalog *c)
{
    const struct catalog_card *t = must_find(c, "trunc");
    if (t) {
        CHECK(t->error != NULL, "truncated file has no error");
        CHECK(t->error && strstr(t->error, "past end"), "truncated: %s", t->error ? t->error : "(none)");
        CHECK(t->file_bytes > 0 && t->n_layers == 0 && t->layer_bytes == NULL, "truncated card details kept");
    }
    const struct catalog_card *g = must_find(c, "garbage");
    CHECK(g && g->error, "garbage file has no error");
    const struct catalog_card *m = must_find(c, "mamba-7b");
    CHECK(m && m->error && strstr(m->error, "architecture 'mamba' is not supported"), "mamba: %s",
          m && m->error ? m->error : "(none)");
    const struct catalog_card *q = must_find(c, "iq2");
    CHECK(q && q->error && strstr(q->error, "IQ2_XXS"), "iq2: %s", q && q->error ? q->error : "(none)");
    const struct catalog_card *e = must_find(c, "empty");
    CHECK(e && e->error, "empty file has no error");
    json_t *j = e ? catalog_card_to_json(e) : NULL;
    CHECK(j && json_is_string(json_object_get(j, "error")) && json_object_size(j) == 4,
          "error entry JSON has %zu keys", j ? json_object_size(j) : 0);
    json_decref(j);
}

static void test_ids(void)
{
    char id[IDS_MODEL_MAX + 1];
    catalog_id_from_file_name("Qwen2.5 0.5B (q4).GGUF", id);
    CHECK(!strcmp(id, "Qwen2.5_0.5B__q4_"), "id %s", id);
    catalog_id_from_file_name("org@x+y:z.gguf", id);
    CHECK(!strcmp(id, "org@x+y:z"), "id %s", id);
    catalog_id_from_file_name(".gguf", id);
    CHECK(!strcmp(id, "_"), "id of bare extension %s", id);
    char longname[400];
    memset(longname, 'a', 300);
    strcpy(longname + 300, ".gguf");
    catalog_id_from_file_name(longname, id);
    CHECK(strlen(id) == IDS_MODEL_MAX && ids_valid_model(id), "long id of %zu bytes", strlen(id));
}

static void sha256sum(const char *path, char *hex)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
    hex[0] = 0;
    FILE *p = popen(cmd, "r");
    if (p) {
        if (fscanf(p, "%64s", hex) != 1)
            hex[0] = 0;
        pclose(p);
    }
}

/* A model in 3 parts is one card: its file's bytes are the first part's (the cache's
 * key), its model bytes every part's. */
static void test_split_bytes(void)
{
    char sub[600], stem[700], err[512];
    snprintf(sub, sizeof sub, "%s/split", dir);
    CHECK(mkdir(sub, 0755) == 0, "mkdir %s", sub);
    snprintf(stem, sizeof stem, "%s/three", sub);
    struct gguf_file *f = NULL;
    CHECK(gguf_open(&f, path_in("llama-tiny.gguf"), err, sizeof err) == 0, "open: %s", err);
    CHECK(f && gguf_write_split(f, 3, stem, err, sizeof err) == 0, "split: %s", err);
    uint64_t whole = f ? gguf_file_size(f) : 0, parts = 0, first = 0;
    gguf_close(f);
    for (int k = 1; k <= 3; k++) {
        char part[800];
        struct stat st;
        snprintf(part, sizeof part, "%s/three-%05d-of-00003.gguf", sub, k);
        CHECK(stat(part, &st) == 0, "part %d written", k);
        parts += (uint64_t)st.st_size;
        first = k == 1 ? (uint64_t)st.st_size : first;
    }
    struct catalog *c = NULL;
    CHECK(catalog_create(&c, sub, err, sizeof err) == 0 && catalog_scan(c, err, sizeof err) == 0, "scan: %s", err);
    CHECK(c && catalog_count(c) == 1, "one card for the 3 parts");
    const struct catalog_card *k = c && catalog_count(c) ? catalog_at(c, 0) : NULL;
    CHECK(k && !k->error && k->file_bytes == first && k->model_bytes == parts && parts > whole / 2,
          "split card: file %llu (first part %llu), model %llu (parts %llu)", k ? (unsigned long long)k->file_bytes : 0,
          (unsigned long long)first, k ? (unsigned long long)k->model_bytes : 0, (unsigned long long)parts);
    json_t *j = k ? catalog_card_to_json(k) : NULL;
    CHECK(j && (uint64_t)json_integer_value(json_object_get(j, "model_bytes")) == parts, "model_bytes in the JSON");
    json_decref(j);
    catalog_release(c);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    snprintf(dir, sizeof dir, "/tmp/cairn-catalog-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_ids);
    char err[512];
    struct catalog *c = NULL;
    CHECK(catalog_create(&c, "", err, sizeof err) == CAIRN_EINVAL, "empty dir accepted");

    /* A folder that does not exist is an empty catalog. */
    CHECK(catalog_create(&c, path_in("nope"), err, sizeof err) == 0, "create: %s", err);
    CHECK(catalog_scan(c, err, sizeof err) == 0 && catalog_count(c) == 0, "missing folder: %s", err);
    catalog_release(c);

    struct synth_spec llama = spec_of("llama", 3, 64, 160, 4, 2, 16, 1, 300);
    llama.llama3_rope = 1;
    struct synth_spec qwen2 = spec_of("qwen2", 2, 96, 128, 6, 2, 16, 0, 500);
    struct synth_spec qwen3 = spec_of("qwen3", 2, 64, 96, 4, 2, 32, 1, 0);
    write_spec(&llama, NULL, "llama-tiny.gguf");
    write_spec(&qwen2, NULL, "qwen2 tiny.gguf");
    const char *qvocab = test_data_path("vocab/ggml-vocab-qwen2.gguf");
    write_spec(&qwen3, qvocab, "qwen3-tiny.GGUF");
    struct synth_spec quant = spec_of("llama", 4, 256, 512, 4, 4, 64, 0, 300);
    snprintf(quant.type, sizeof quant.type, "q4_k_m");
    write_spec(&quant, NULL, "llama-q4km.gguf");
    struct synth_spec moe = spec_of("qwen3moe", 2, 64, 96, 4, 2, 16, 0, 300);
    moe.n_expert = 8, moe.n_expert_used = 2, moe.n_ff_exp = 32;
    write_spec(&moe, NULL, "moe-tiny.gguf");
    struct synth_spec gem;
    CHECK(synth_shape("gemma3-tiny", &gem) == 0, "gemma3-tiny shape");
    snprintf(gem.type, sizeof gem.type, "f16");
    gem.vocab_size = 300;
    gem.seed = 7;
    write_spec(&gem, NULL, "gemma3-tiny.gguf");

    size_t n = 0;
    unsigned char *good = read_all(path_in("llama-tiny.gguf"), &n);
    CHECK(good && n > 1000, "read back %zu bytes", n);
    if (good) {
        write_bytes("trunc.gguf", good, n / 2);
        unsigned char junk[4096];
        uint64_t st = 1;
        for (size_t i = 0; i < sizeof junk; i++)
            junk[i] = (unsigned char)test_rand_u64(&st);
        write_bytes("garbage.gguf", junk, sizeof junk);
        write_bytes("empty.gguf", junk, 0);
        write_bytes("notes.txt", junk, 10);
        write_bytes(".hidden.gguf", good, n);
        free(good);
    }
    write_odd("mamba-7b.gguf", "mamba", DT_F16);
    write_odd("iq2.gguf", "llama", DT_IQ2_XXS);
    mkdir(path_in("sub.gguf"), 0755);

    CHECK(catalog_create(&c, dir, err, sizeof err) == 0, "create: %s", err);
    CHECK(catalog_scan(c, err, sizeof err) == 0, "scan: %s", err);
    CHECK_EQ_INT(catalog_count(c), 11);
    for (size_t i = 0; i < catalog_count(c); i++)
        printf("  %s: %s\n", catalog_at(c, i)->id, catalog_at(c, i)->error ? catalog_at(c, i)->error : "ok");
    for (size_t i = 1; i < catalog_count(c); i++)
        CHECK(strcmp(catalog_at(c, i - 1)->id, catalog_at(c, i)->id) < 0, "not sorted at %zu", i);
    check_card(must_find(c, "llama-tiny"), &llama, 300, "llama");
    check_card(must_find(c, "qwen2_tiny"), &qwen2, 500, "qwen2");
    const struct catalog_card *q3 = must_find(c, "qwen3-tiny");
    check_card(q3, &qwen3, 151936, "qwen3");
    CHECK(q3 && q3->chat_template, "qwen3 with the qwen2 vocabulary has no chat template");
    const struct catalog_card *ll = must_find(c, "llama-tiny");
    CHECK(ll && !ll->chat_template && !strcmp(ll->name, "cairn synthetic llama f16"), "llama name '%s'",
          ll ? ll->name : "");
    CHECK(catalog_find(c, "hidden") == NULL && catalog_find(c, ".hidden") == NULL, "hidden file listed");
    CHECK(catalog_find(c, "sub") == NULL, "folder listed");

    /* A quantized mix: layers differ, and the parts add up to every tensor. */
    const struct catalog_card *qk = must_find(c, "llama-q4km");
    if (qk && !qk->error) {
        uint64_t sum = qk->embd_bytes + qk->head_bytes + qk->output_norm_bytes + qk->other_bytes;
        bool differ = false;
        for (int l = 0; l < qk->n_layers; l++) {
            sum += qk->layer_bytes[l];
            differ |= qk->layer_bytes[l] != qk->layer_bytes[0];
        }
        CHECK(sum == qk->weight_bytes, "q4_k_m parts %llu vs %llu", (unsigned long long)sum,
              (unsigned long long)qk->weight_bytes);
        CHECK(differ, "q4_k_m layers all the same size");
        CHECK(qk->head_bytes > qk->embd_bytes, "Q6_K head %llu <= Q4_K embd %llu", (unsigned long long)qk->head_bytes,
              (unsigned long long)qk->embd_bytes);
    }
    /* A mixture of experts: memory counts every expert, a token reads 2 of the 8. */
    const struct catalog_card *mc = must_find(c, "moe-tiny");
    if (mc && !mc->error) {
        uint64_t experts = 0, layers = 0;
        for (int l = 0; l < mc->n_layers; l++)
            layers += mc->layer_bytes[l];
        experts = (uint64_t)mc->n_layers * 3 * 8 * 32 * 64 * 2; /* f16 gate, up, down of 8 experts */
        CHECK(mc->n_expert == 8 && mc->n_expert_used == 2 && mc->n_ff_exp == 32, "moe counts %d %d %d", mc->n_expert,
              mc->n_expert_used, mc->n_ff_exp);
        CHECK(layers > experts && mc->weight_bytes - mc->active_bytes == experts / 8 * 6,
              "moe: layers %llu, weight %llu, active %llu, experts %llu", (unsigned long long)layers,
              (unsigned long long)mc->weight_bytes, (unsigned long long)mc->active_bytes, (unsigned long long)experts);
        json_t *j = catalog_card_to_json(mc);
        CHECK(j && json_integer_value(json_object_get(j, "expert_count")) == 8 &&
                  json_integer_value(json_object_get(j, "active_bytes")) == (json_int_t)mc->active_bytes,
              "moe card JSON");
        json_decref(j);
    }
    CHECK(ll && ll->active_bytes == ll->weight_bytes && ll->n_expert == 0, "a dense card's active bytes are its weights");
    /* Sliding-window layers: gemma3 slides in 5 of every 6 layers, and the card says which. */
    const struct catalog_card *gc = must_find(c, "gemma3-tiny");
    if (gc && !gc->error) {
        int sliding = 0;
        for (int l = 0; gc->layer_swa && l < gc->n_layers; l++) {
            CHECK(gc->layer_swa[l] == (l % 6 != 5), "gemma3 layer %d slides: %d", l, gc->layer_swa[l]);
            sliding += gc->layer_swa[l];
        }
        CHECK(gc->layer_swa && gc->swa_window == gem.swa_window && sliding > 0, "gemma3 window %lld, %d sliding",
              (long long)gc->swa_window, sliding);
        json_t *j = catalog_card_to_json(gc);
        CHECK(j && json_integer_value(json_object_get(j, "sliding_window")) == gem.swa_window &&
                  json_integer_value(json_object_get(j, "sliding_window_layers")) == sliding,
              "gemma3 card JSON");
        json_decref(j);
        struct catalog_card gcopy;
        CHECK(catalog_card_copy(&gcopy, gc) == 0 && gcopy.layer_swa != gc->layer_swa &&
                  !memcmp(gcopy.layer_swa, gc->layer_swa, (size_t)gc->n_layers),
              "a card's copy has its own sliding flags");
        catalog_card_clear(&gcopy);
        struct place_model gpm;
        CHECK(catalog_card_place_model(gc, 4096, 1, &gpm, err, sizeof err) == 0 && gpm.layer_window == gc->layer_swa &&
                  gpm.window_positions == 4096,
              "gemma3 place model: %s", err);
    }
    CHECK(ll && !ll->layer_swa && ll->swa_window == 0, "llama has no sliding-window layers");
    RUN(test_errors, c);
    CHECK(ll && ll->model_bytes == ll->file_bytes, "one file: the model's bytes are the file's");
    RUN(test_split_bytes);

    /* JSON of a card. */
    json_t *j = ll ? catalog_card_to_json(ll) : NULL;
    CHECK(j && json_is_null(json_object_get(j, "error")) && json_is_null(json_object_get(j, "sha256")) &&
              json_integer_value(json_object_get(j, "n_head_kv")) == 2 &&
              json_integer_value(json_object_get(j, "context_length")) == 1024 &&
              json_array_size(json_object_get(j, "layer_bytes")) == 3 &&
              json_is_false(json_object_get(j, "chat_template")) &&
              !strcmp(json_string_value(json_object_get(j, "architecture")), "llama"),
          "card JSON");
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (text)
        printf("  card: %.300s...\n", text);
    free(text);
    json_decref(j);
    json_t *all = catalog_to_json(c);
    CHECK(json_array_size(all) == 11, "catalog JSON has %zu entries", json_array_size(all));
    json_decref(all);

    /* A deep copy outlives the catalog's card. */
    struct catalog_card copy;
    CHECK(ll && catalog_card_copy(&copy, ll) == 0, "card copy");
    if (ll) {
        CHECK(copy.path != ll->path && !strcmp(copy.path, ll->path) && copy.layer_bytes != ll->layer_bytes &&
                  copy.layer_bytes[2] == ll->layer_bytes[2] && copy.embd_bytes == ll->embd_bytes,
              "copy differs");
        catalog_card_clear(&copy);
    }
    /* Placement model from a card. */
    struct place_model pm;
    CHECK(ll && catalog_card_place_model(ll, 2048, 2, &pm, err, sizeof err) == 0, "place model: %s", err);
    if (ll) {
        CHECK(pm.n_layers == 3 && pm.layer_bytes_each == ll->layer_bytes && pm.tied && pm.head_bytes == 0 &&
                  pm.embed_bytes == ll->embd_bytes && pm.ctx_len == 2048 && pm.n_slots == 2 &&
                  pm.kv_bytes_per_token_layer == ll->kv_bytes_per_token_layer,
              "place model fields");
    }
    const struct catalog_card *tr = catalog_find(c, "trunc");
    CHECK(tr && catalog_card_place_model(tr, 1, 1, &pm, err, sizeof err) == CAIRN_ESTATE, "error card placed");

    /* SHA-256: lazily, equal to sha256sum, cached, kept over a rescan, dropped on change. */
    char hex[CATALOG_SHA256_HEX], want[80];
    sha256sum(path_in("llama-tiny.gguf"), want);
    CHECK(catalog_sha256(c, "llama-tiny", hex, err, sizeof err) == 0 && !strcmp(hex, want), "sha %s vs %s (%s)", hex,
          want, err);
    ll = catalog_find(c, "llama-tiny");
    CHECK(ll && !strcmp(ll->sha256, want), "sha not cached on the card");
    CHECK(catalog_sha256(c, "nope", hex, err, sizeof err) == CAIRN_ENOTFOUND, "unknown id hashed");
    CHECK(catalog_scan(c, err, sizeof err) == 0, "rescan: %s", err);
    ll = catalog_find(c, "llama-tiny");
    CHECK(ll && !strcmp(ll->sha256, want), "sha lost by a rescan of an unchanged file");
    struct timespec times[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = 1000000000, .tv_nsec = 5}};
    CHECK(utimensat(AT_FDCWD, path_in("llama-tiny.gguf"), times, 0) == 0, "utimensat");
    CHECK(catalog_sha256(c, "llama-tiny", hex, err, sizeof err) == CAIRN_ESTATE, "changed file hashed: %s", err);
    CHECK(catalog_scan(c, err, sizeof err) == 0, "rescan: %s", err);
    ll = catalog_find(c, "llama-tiny");
    CHECK(ll && ll->sha256[0] == 0 && ll->mtime_ns == 1000000000000000005ll, "changed file kept its hash");
    uint64_t size;
    int64_t mtime;
    CHECK(catalog_file_sha256(path_in("llama-tiny.gguf"), hex, &size, &mtime, err, sizeof err) == 0 &&
              !strcmp(hex, want),
          "file sha %s", hex);
    CHECK(catalog_put_sha256(c, path_in("llama-tiny.gguf"), size, mtime, hex) == 0, "put sha");
    CHECK(catalog_put_sha256(c, path_in("llama-tiny.gguf"), size + 1, mtime, hex) == CAIRN_ENOTFOUND,
          "put sha for another size");
    ll = catalog_find(c, "llama-tiny");
    CHECK(ll && !strcmp(ll->sha256, want), "put sha not stored");

    /* Removed and added files; an id collision lists the later file with an error. */
    unlink(path_in("garbage.gguf"));
    write_spec(&qwen2, NULL, "qwen2_tiny.gguf");
    CHECK(catalog_scan(c, err, sizeof err) == 0, "rescan: %s", err);
    CHECK_EQ_INT(catalog_count(c), 11);
    CHECK(catalog_find(c, "garbage") == NULL, "removed file still listed");
    size_t n_q2 = 0, n_q2_err = 0;
    for (size_t i = 0; i < catalog_count(c); i++)
        if (!strcmp(catalog_at(c, i)->id, "qwen2_tiny")) {
            n_q2++;
            n_q2_err += catalog_at(c, i)->error != NULL;
            if (catalog_at(c, i)->error)
                CHECK(strstr(catalog_at(c, i)->error, "qwen2 tiny.gguf") && strstr(catalog_at(c, i)->path, "qwen2_tiny"),
                      "collision error: %s", catalog_at(c, i)->error);
        }
    CHECK(n_q2 == 2 && n_q2_err == 1, "collision: %zu entries, %zu errors", n_q2, n_q2_err);
    catalog_release(c);

    /* An unreadable folder is an error, not an empty list (root reads everything). */
    if (geteuid() != 0) {
        chmod(dir, 0);
        CHECK(catalog_create(&c, dir, err, sizeof err) == 0, "create");
        CHECK(catalog_scan(c, err, sizeof err) == CAIRN_EIO, "unreadable folder: %s", err);
        catalog_release(c);
        chmod(dir, 0755);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    return test_main_end();
}
