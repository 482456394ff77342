/* Model loading: hyper-parameters from metadata, synthetic shapes, refusals that name
 * what is wrong (architecture, tensor type, missing tensor, shape, metadata), the same
 * whatever the number of loading threads. */
#include "base/dtype.h"
#include "base/err.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum edit { EDIT_ARCH, EDIT_TYPE, EDIT_DROP_TENSOR, EDIT_SHAPE, EDIT_DROP_KEY, EDIT_HEADS };

/* Copies src to dst with one edit. */
static int rewrite(const char *src, const char *dst, enum edit e)
{
    char err[256];
    struct gguf_file *f;
    if (gguf_open(&f, src, err, sizeof err))
        return -1;
    struct gguf_writer *w;
    gguf_writer_create(&w);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        struct gguf_str k = gguf_kv_key(f, i);
        if (e == EDIT_DROP_KEY && k.len == strlen("llama.block_count") && !memcmp(k.ptr, "llama.block_count", k.len))
            continue;
        gguf_writer_copy_kv(w, f, i);
    }
    if (e == EDIT_ARCH)
        gguf_writer_set_str(w, "general.architecture", "mamba", 5);
    if (e == EDIT_HEADS)
        gguf_writer_set_u32(w, "llama.attention.head_count_kv", 3); /* 4 heads are not a multiple of 3 */
    static char zeros[1 << 20];
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        int64_t ne[4];
        memcpy(ne, t->ne, sizeof ne);
        bool target = !strcmp(t->name, "blk.1.attn_q.weight");
        if (target && e == EDIT_DROP_TENSOR)
            continue;
        if (target && e == EDIT_TYPE) {
            gguf_writer_add_tensor(w, t->name, DT_IQ2_XXS, t->n_dims, ne, zeros, NULL, NULL);
            continue;
        }
        if (target && e == EDIT_SHAPE) {
            ne[1] /= 2;
            gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, NULL, NULL);
            continue;
        }
        gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, NULL, NULL);
    }
    int rc = gguf_writer_write(w, dst, err, sizeof err);
    gguf_writer_release(w);
    gguf_close(f);
    return rc;
}

/* Refused the same way whether the matrices load on one thread or several. */
static void expect_refusal(const char *path, const char *what, int code, const char *needle)
{
    char first[512] = "";
    for (int threads = 1; threads <= 4; threads += 3) {
        char err[512] = "";
        struct model *m = NULL;
        struct model_load_opts o = {.layer_end = -1, .threads = threads};
        int rc = model_load(&m, path, &o, err, sizeof err);
        CHECK(rc == code && m == NULL && strstr(err, needle), "%s (%d threads): rc %d (want %d), message '%s' lacks "
              "'%s'", what, threads, rc, code, err, needle);
        if (threads == 1)
            snprintf(first, sizeof first, "%s", err);
        else
            CHECK(!strcmp(err, first), "%s: '%s' on 4 threads, '%s' on 1", what, err, first);
        model_release(m);
    }
}

/* Resident memory of this process in KiB (VmRSS), -1 when unreadable. */
static long long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lld kB", &kib) == 1)
            break;
    if (f)
        fclose(f);
    return kib;
}

/* A pipeline rank maps only its layers: loading a quarter of the layers makes a quarter
 * of the weights resident, not the whole file. */
static void check_slice_memory(void)
{
    char path[128], err[512];
    snprintf(path, sizeof path, "test_model_slice_%d.gguf", (int)getpid());
    struct synth_spec s = {.arch = "llama", .n_layers = 8, .n_embd = 512, .n_ff = 1536, .n_head = 8, .n_head_kv = 8,
                           .head_dim = 64, .n_ctx = 256, .rope_base = 10000, .norm_eps = 1e-5f, .type = "q8_0",
                           .seed = 9, .vocab_size = 320};
    if (synth_write(&s, NULL, path, err, sizeof err)) {
        CHECK(0, "synth_write: %s", err);
        return;
    }
    long long grow[2] = {0, 0};
    uint64_t bytes[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        struct model_load_opts o = {.layer_begin = 0, .layer_end = i ? -1 : 2};
        struct model *m = NULL;
        long long before = rss_kib();
        if (model_load(&m, path, &o, err, sizeof err)) {
            CHECK(0, "load: %s", err);
            break;
        }
        grow[i] = rss_kib() - before;
        bytes[i] = m->weight_bytes;
        model_release(m);
    }
    unlink(path);
    printf("resident growth: layers [0, 2) of 8: %lld KiB (%.1f MiB of weights), all 8: %lld KiB (%.1f MiB)\n",
           grow[0], bytes[0] / 1048576.0, grow[1], bytes[1] / 1048576.0);
    CHECK(bytes[0] * 3 < bytes[1], "weights of a quarter slice: %llu of %llu bytes", (unsigned long long)bytes[0],
          (unsigned long long)bytes[1]);
    CHECK(grow[1] > 0 && grow[0] * 5 < grow[1] * 2, "a quarter slice grew the RSS by %lld KiB, the whole model by %lld",
          grow[0], grow[1]);
}

int main(void)
{
    char path[128], bad[128];
    snprintf(path, sizeof path, "test_model_%d.gguf", (int)getpid());
    snprintf(bad, sizeof bad, "test_model_bad_%d.gguf", (int)getpid());
    struct synth_spec s = {.arch = "llama", .n_layers = 2, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2,
                           .head_dim = 64, .n_ctx = 1024, .rope_base = 10000, .norm_eps = 1e-5f, .type = "q4_k_m",
                           .seed = 3, .vocab_size = 320};
    char err[512];
    CHECK(synth_write(&s, NULL, path, err, sizeof err) == 0, "synth_write: %s", err);

    struct model *m = NULL;
    CHECK(model_load(&m, path, NULL, err, sizeof err) == 0, "model_load: %s", err);
    if (m) {
        const struct model_hparams *hp = &m->hp;
        CHECK(!strcmp(hp->arch, "llama") && hp->n_layers == 2 && hp->n_embd == 256 && hp->n_ff == 512 &&
                  hp->n_head == 4 && hp->n_head_kv == 2 && hp->head_dim == 64 && hp->n_vocab == 320 &&
                  hp->n_ctx_train == 1024 && hp->rope == ROPE_NORMAL && !hp->tied_output,
              "hyper-parameters read back wrong");
        CHECK(m->first && m->last && m->layers[1].wq, "slice flags");
        /* q4_k_m: Q6_K head, and attn_v of the last layer (more bits at the ends: of 2
         * layers, llama.cpp's rule picks layer 1), Q4_K elsewhere */
        CHECK(kern_mat_type(m->output) == DT_Q6_K, "head type %s", dtype_name(kern_mat_type(m->output)));
        CHECK(kern_mat_type(m->layers[1].wv) == DT_Q6_K, "layer 1 attn_v type %s", dtype_name(kern_mat_type(m->layers[1].wv)));
        CHECK(kern_mat_type(m->layers[0].wv) == DT_Q4_K, "layer 0 attn_v type %s", dtype_name(kern_mat_type(m->layers[0].wv)));
        CHECK(kern_mat_type(m->layers[0].wq) == DT_Q4_K, "attn_q type %s", dtype_name(kern_mat_type(m->layers[0].wq)));
        model_release(m);
    }
    /* A middle slice holds neither embeddings nor head. */
    struct model_load_opts o = {.layer_begin = 1, .layer_end = 2};
    m = NULL;
    CHECK(model_load(&m, path, &o, err, sizeof err) == 0 && m && !m->first && m->last && !m->tok_embd,
          "slice [1,2): %s", err);
    model_release(m);
    o = (struct model_load_opts){.layer_begin = 1, .layer_end = 5};
    m = NULL;
    CHECK(model_load(&m, path, &o, err, sizeof err) == CAIRN_EINVAL && strstr(err, "layer range"), "bad range: %s", err);

    /* K-quant rows not a multiple of 256 fall back as llama.cpp does. */
    CHECK(synth_tensor_type(&s, "blk.0.ffn_up.weight", 0, 896) == DT_Q5_0, "Q4_K fallback for 896");
    CHECK(synth_tensor_type(&s, "output.weight", -1, 896) == DT_Q8_0, "Q6_K fallback for 896");
    struct synth_spec lb = s;
    snprintf(lb.type, sizeof lb.type, "q2_k");
    CHECK(synth_tensor_type(&lb, "blk.0.ffn_up.weight", 0, 896) == DT_Q4_0, "Q2_K fallback for 896");
    CHECK(synth_tensor_type(&lb, "blk.0.ffn_up.weight", 0, 1024) == DT_Q2_K, "Q2_K for 1024");
    snprintf(lb.type, sizeof lb.type, "iq4_xs");
    CHECK(synth_tensor_type(&lb, "blk.0.ffn_up.weight", 0, 896) == DT_IQ4_NL, "IQ4_XS fallback for 896");
    snprintf(lb.type, sizeof lb.type, "mxfp4");
    CHECK(synth_tensor_type(&lb, "blk.0.ffn_up.weight", 0, 896) == DT_MXFP4, "MXFP4 for 896");

    /* Shapes carry the dimensions of the models they stand for. */
    struct synth_spec q = {0};
    CHECK(synth_shape("qwen3-0.6b", &q) == 0 && q.head_dim == 128 && q.n_embd == 1024 && q.n_layers == 28 &&
              !strcmp(q.arch, "qwen3"), "qwen3-0.6b shape");
    CHECK(synth_shape("llama-1b", &q) == 0 && q.n_embd == 2048 && q.n_head_kv == 8 && q.head_dim == 64 && q.tied &&
              q.llama3_rope, "llama-1b shape");
    CHECK(synth_shape("nope", &q) == CAIRN_ENOTFOUND, "unknown shape accepted");

    struct { enum edit e; const char *what; int code; const char *needle; } cases[] = {
        {EDIT_ARCH, "unknown architecture", CAIRN_EUNSUPPORTED, "mamba"},
        {EDIT_TYPE, "unsupported tensor type", CAIRN_EUNSUPPORTED, "blk.1.attn_q.weight has type IQ2_XXS"},
        {EDIT_DROP_TENSOR, "missing tensor", CAIRN_EFORMAT, "blk.1.attn_q.weight"},
        {EDIT_SHAPE, "wrong shape", CAIRN_EFORMAT, "blk.1.attn_q.weight"},
        {EDIT_DROP_KEY, "missing metadata", CAIRN_EFORMAT, "llama.block_count"},
        {EDIT_HEADS, "inconsistent heads", CAIRN_EFORMAT, "head_count_kv"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (rewrite(path, bad, cases[i].e)) {
            CHECK(0, "%s: cannot write the edited file", cases[i].what);
            continue;
        }
        expect_refusal(bad, cases[i].what, cases[i].code, cases[i].needle);
    }
    expect_refusal("/nonexistent/model.gguf", "missing file", CAIRN_ENOTFOUND, "/nonexistent/model.gguf");
    check_slice_memory();
    unlink(path);
    unlink(bad);
    return test_main_end();
}
