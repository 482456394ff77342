/* Model loading: hyper-parameters from metadata, synthetic shapes, refusals that name
 * what is wrong (architecture, tensor type, missing tensor, shape, metadata), the same
 * whatever the number of loading threads. */
#include "base/dtype.h"
#include "base/err.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#include <stdbool.h>
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

/* Edits of a qwen3moe file: a metadata key set (u32 value, or dropped when drop), and a
 * tensor dropped, or re-declared as 2-D, or with its experts' dimension halved. */
struct moe_edit {
    const char *what;
    const char *key;
    uint32_t value;
    bool drop_key;
    const char *tensor;
    enum { T_NONE, T_DROP, T_FLAT, T_HALF } tedit;
    int code;
    const char *needle;
};

static int rewrite_moe(const char *src, const char *dst, const struct moe_edit *ed)
{
    char err[256];
    struct gguf_file *f;
    if (gguf_open(&f, src, err, sizeof err))
        return -1;
    struct gguf_writer *w;
    gguf_writer_create(&w);
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        struct gguf_str k = gguf_kv_key(f, i);
        if (ed->key && ed->drop_key && k.len == strlen(ed->key) && !memcmp(k.ptr, ed->key, k.len))
            continue;
        gguf_writer_copy_kv(w, f, i);
    }
    if (ed->key && !ed->drop_key)
        gguf_writer_set_u32(w, ed->key, ed->value);
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        int64_t ne[4];
        memcpy(ne, t->ne, sizeof ne);
        int n_dims = t->n_dims;
        if (ed->tensor && !strcmp(t->name, ed->tensor)) {
            if (ed->tedit == T_DROP)
                continue;
            if (ed->tedit == T_FLAT)
                ne[1] *= ne[2], ne[2] = 1, n_dims = 2;
            if (ed->tedit == T_HALF)
                ne[2] /= 2;
        }
        gguf_writer_add_tensor(w, t->name, t->type, n_dims, ne, t->data, NULL, NULL);
    }
    int rc = gguf_writer_write(w, dst, err, sizeof err);
    gguf_writer_release(w);
    gguf_close(f);
    return rc;
}

static void expect_refusal(const char *path, const char *what, int code, const char *needle);

/* A mixture of experts loads with its counts, and every inconsistency is refused with
 * the key or tensor at fault. */
static void check_moe(const char *bad)
{
    char path[128], err[512];
    snprintf(path, sizeof path, "test_model_moe_%d.gguf", (int)getpid());
    struct synth_spec s = {.arch = "qwen3moe", .n_layers = 2, .n_embd = 256, .n_ff = 512, .n_head = 4, .n_head_kv = 2,
                           .head_dim = 64, .n_ctx = 1024, .rope_base = 10000, .norm_eps = 1e-6f, .type = "q4_k_m",
                           .seed = 3, .vocab_size = 320, .n_expert = 8, .n_expert_used = 2, .n_ff_exp = 256};
    if (synth_write(&s, NULL, path, err, sizeof err)) {
        CHECK(0, "synth_write qwen3moe: %s", err);
        return;
    }
    struct model *m = NULL;
    CHECK(model_load(&m, path, NULL, err, sizeof err) == 0, "qwen3moe: %s", err);
    if (m) {
        const struct model_hparams *hp = &m->hp;
        CHECK(hp->n_expert == 8 && hp->n_expert_used == 2 && hp->n_ff_exp == 256 && hp->expert_norm && hp->qk_norm &&
                  hp->rope == ROPE_NEOX && m->layers[1].router && m->layers[1].exp_down[7] && !m->layers[1].w_gate,
              "qwen3moe hyper-parameters or tensors");
        CHECK(kern_mat_type(m->layers[0].router) == DT_F32 && kern_mat_rows(m->layers[0].router) == 8 &&
                  kern_mat_type(m->layers[0].exp_gate_up ? m->layers[0].exp_gate_up[3] : m->layers[0].exp_up[3]) == DT_Q4_K && kern_mat_rows(m->layers[0].exp_down[3]) == 256,
              "router / expert matrices");
        /* active bytes: everything but 6 of the 8 experts of each layer */
        uint64_t expert = 0;
        for (int l = 0; l < 2; l++)
            expert += model_expert_bytes(&m->layers[l], 0);
        CHECK(m->all_weight_bytes - m->weight_bytes == 6 * expert, "weight bytes %llu of %llu (one expert per layer: %llu)",
              (unsigned long long)m->weight_bytes, (unsigned long long)m->all_weight_bytes, (unsigned long long)expert);
        model_release(m);
    }
    const struct moe_edit cases[] = {
        {"more experts used than exist", "qwen3moe.expert_used_count", 9, false, NULL, T_NONE, CAIRN_EFORMAT,
         "qwen3moe.expert_used_count"},
        {"no experts used", "qwen3moe.expert_used_count", 0, false, NULL, T_NONE, CAIRN_EFORMAT,
         "qwen3moe.expert_used_count"},
        {"missing expert count", "qwen3moe.expert_count", 0, true, NULL, T_NONE, CAIRN_EFORMAT, "qwen3moe.expert_count"},
        {"one expert", "qwen3moe.expert_count", 1, false, NULL, T_NONE, CAIRN_EFORMAT, "qwen3moe.expert_count"},
        {"too many experts", "qwen3moe.expert_count", 5000, false, NULL, T_NONE, CAIRN_EFORMAT, "qwen3moe.expert_count"},
        {"expert count unlike the router", "qwen3moe.expert_count", 4, false, NULL, T_NONE, CAIRN_EFORMAT,
         "blk.0.ffn_gate_inp.weight"},
        {"expert width unlike the tensors", "qwen3moe.expert_feed_forward_length", 128, false, NULL, T_NONE,
         CAIRN_EFORMAT, "blk.0.ffn_gate_exps.weight"},
        {"sigmoid gating", "qwen3moe.expert_gating_func", 2, false, NULL, T_NONE, CAIRN_EUNSUPPORTED,
         "qwen3moe.expert_gating_func"},
        {"shared experts", "qwen3moe.expert_shared_count", 1, false, NULL, T_NONE, CAIRN_EUNSUPPORTED,
         "qwen3moe.expert_shared_count"},
        {"missing down experts", NULL, 0, false, "blk.1.ffn_down_exps.weight", T_DROP, CAIRN_EFORMAT,
         "blk.1.ffn_down_exps.weight"},
        {"missing router", NULL, 0, false, "blk.1.ffn_gate_inp.weight", T_DROP, CAIRN_EFORMAT,
         "blk.1.ffn_gate_inp.weight"},
        {"experts flattened to 2-D", NULL, 0, false, "blk.1.ffn_up_exps.weight", T_FLAT, CAIRN_EFORMAT,
         "blk.1.ffn_up_exps.weight"},
        {"half the experts", NULL, 0, false, "blk.0.ffn_gate_exps.weight", T_HALF, CAIRN_EFORMAT,
         "blk.0.ffn_gate_exps.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (rewrite_moe(path, bad, &cases[i])) {
            CHECK(0, "%s: cannot write the edited file", cases[i].what);
            continue;
        }
        expect_refusal(bad, cases[i].what, cases[i].code, cases[i].needle);
    }
    /* a llama file that declares experts must carry them */
    struct synth_spec d = s;
    snprintf(d.arch, sizeof d.arch, "llama");
    d.n_expert = 0;
    snprintf(path, sizeof path, "test_model_moe_%d.gguf", (int)getpid());
    if (synth_write(&d, NULL, path, err, sizeof err) == 0) {
        struct moe_edit e = {"llama with experts declared", "llama.expert_count", 8, false, NULL, T_NONE, 0, NULL};
        struct moe_edit u = {"", "llama.expert_used_count", 2, false, NULL, T_NONE, 0, NULL};
        char mid[160];
        snprintf(mid, sizeof mid, "%s.mid", bad);
        if (rewrite_moe(path, mid, &e) == 0 && rewrite_moe(mid, bad, &u) == 0)
            expect_refusal(bad, e.what, CAIRN_EFORMAT, "blk.0.ffn_gate_inp.weight");
        unlink(mid);
    }
    unlink(path);
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

/* An edit of a gemma3 or phi3 file: a tensor dropped or with half its rows, a key set. */
struct arch_edit {
    const char *what;
    const char *drop, *halve;    /* tensor names */
    const char *key;             /* metadata key to set: */
    enum { SET_NONE, SET_U32, SET_F32, SET_STR, ADD_TENSOR } set;
    double num;
    const char *str;             /* SET_STR's value; ADD_TENSOR's name (an F32 vector of 32) */
    int code;
    const char *needle;
};

static int rewrite_arch(const char *src, const char *dst, const struct arch_edit *e)
{
    char err[256];
    struct gguf_file *f;
    if (gguf_open(&f, src, err, sizeof err))
        return -1;
    struct gguf_writer *w;
    gguf_writer_create(&w);
    for (int64_t i = 0; i < gguf_n_kv(f); i++)
        gguf_writer_copy_kv(w, f, i);
    if (e->set == SET_U32)
        gguf_writer_set_u32(w, e->key, (uint32_t)e->num);
    else if (e->set == SET_F32)
        gguf_writer_set_f32(w, e->key, (float)e->num);
    else if (e->set == SET_STR)
        gguf_writer_set_str(w, e->key, e->str, strlen(e->str));
    static float ones[32] = {1};
    if (e->set == ADD_TENSOR) {
        int64_t ne[4] = {32, 1, 1, 1};
        gguf_writer_add_tensor(w, e->str, DT_F32, 1, ne, ones, NULL, NULL);
    }
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor(f, i);
        int64_t ne[4];
        memcpy(ne, t->ne, sizeof ne);
        if (e->drop && !strcmp(t->name, e->drop))
            continue;
        if (e->halve && !strcmp(t->name, e->halve))
            ne[t->n_dims > 1] /= 2; /* rows of a matrix, elements of a vector */
        gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, ne, t->data, NULL, NULL);
    }
    int rc = gguf_writer_write(w, dst, err, sizeof err);
    gguf_writer_release(w);
    gguf_close(f);
    return rc;
}

/* gemma3, phi3 and gpt-oss files with a tensor or a key wrong are refused with its name; the
 * good ones load with the hyper-parameters their metadata says. */
static void check_arch_refusals(void)
{
    static const struct arch_edit gemma[] = {
        {"no post-attention norm", "blk.1.post_attention_norm.weight", NULL, NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT,
         "blk.1.post_attention_norm.weight"},
        {"no post-FFN norm", "blk.2.post_ffw_norm.weight", NULL, NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT, "blk.2.post_ffw_norm.weight"},
        {"no k norm", "blk.0.attn_k_norm.weight", NULL, NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT, "blk.0.attn_k_norm.weight"},
        {"post norm of half a row", NULL, "blk.3.post_ffw_norm.weight", NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT, "blk.3.post_ffw_norm.weight"},
        {"window out of range", NULL, NULL, "gemma3.attention.sliding_window", SET_U32, 4e9, NULL, CAIRN_EFORMAT,
         "gemma3.attention.sliding_window"},
        {"pattern 0", NULL, NULL, "gemma3.attention.sliding_window_pattern", SET_U32, 0, NULL, CAIRN_EFORMAT,
         "gemma3.attention.sliding_window_pattern"},
        {"negative softcap", NULL, NULL, "gemma3.final_logit_softcapping", SET_F32, -30, NULL, CAIRN_EFORMAT,
         "gemma3.final_logit_softcapping"},
        {"negative local RoPE base", NULL, NULL, "gemma3.rope.freq_base_swa", SET_F32, -1, NULL, CAIRN_EFORMAT,
         "gemma3.rope.freq_base_swa"},
    };
    static const struct arch_edit phi[] = {
        {"no fused qkv", "blk.0.attn_qkv.weight", NULL, NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT, "blk.0.attn_qkv.weight"},
        {"gate/up of n_ff rows", NULL, "blk.1.ffn_up.weight", NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT, "blk.1.ffn_up.weight"},
        {"qkv of half its rows", NULL, "blk.1.attn_qkv.weight", NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT, "blk.1.attn_qkv.weight"},
        {"128k rope factors", NULL, NULL, NULL, ADD_TENSOR, 0, "rope_factors_long.weight", CAIRN_EUNSUPPORTED,
         "rope_factors_long"},
        {"longrope scaling", NULL, NULL, "phi3.rope.scaling.type", SET_STR, 0, "longrope", CAIRN_EUNSUPPORTED, "longrope"},
    };
    static const struct arch_edit oss[] = {
        {"no sinks", "blk.1.attn_sinks.weight", NULL, NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT, "blk.1.attn_sinks.weight"},
        {"sinks of half the heads", NULL, "blk.2.attn_sinks.weight", NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT,
         "blk.2.attn_sinks.weight"},
        {"no output bias", "blk.0.attn_output.bias", NULL, NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT, "blk.0.attn_output.bias"},
        {"no FFN norm", "blk.3.post_attention_norm.weight", NULL, NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT,
         "blk.3.post_attention_norm.weight"},
        {"no router bias", "blk.3.ffn_gate_inp.bias", NULL, NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT, "blk.3.ffn_gate_inp.bias"},
        {"no down experts' bias", "blk.0.ffn_down_exps.bias", NULL, NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT,
         "blk.0.ffn_down_exps.bias"},
        {"up experts' bias for half the experts", NULL, "blk.1.ffn_up_exps.bias", NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT,
         "blk.1.ffn_up_exps.bias"},
        {"gate experts of half their rows", NULL, "blk.2.ffn_gate_exps.weight", NULL, SET_NONE, 0, NULL, CAIRN_EFORMAT,
         "blk.2.ffn_gate_exps.weight"},
        {"window 0", NULL, NULL, "gpt-oss.attention.sliding_window", SET_U32, 0, NULL, CAIRN_EFORMAT,
         "gpt-oss.attention.sliding_window"},
        {"expert width 0", NULL, NULL, "gpt-oss.expert_feed_forward_length", SET_U32, 0, NULL, CAIRN_EFORMAT,
         "gpt-oss.expert_feed_forward_length"},
        {"a RoPE base of the sliding layers' own", NULL, NULL, "gpt-oss.rope.freq_base_swa", SET_F32, 10000, NULL,
         CAIRN_EUNSUPPORTED, "gpt-oss.rope.freq_base_swa"},
        {"rope dimension below the head size", NULL, NULL, "gpt-oss.rope.dimension_count", SET_U32, 16, NULL,
         CAIRN_EUNSUPPORTED, "rope dimension 16"},
    };
    char err[512], path[128], bad[128];
    snprintf(path, sizeof path, "test_model_arch_%d.gguf", (int)getpid());
    snprintf(bad, sizeof bad, "test_model_arch_bad_%d.gguf", (int)getpid());
    for (int a = 0; a < 3; a++) {
        struct synth_spec s = {.arch = "gemma3", .n_layers = 6, .n_embd = 64, .n_ff = 128, .n_head = 2, .n_head_kv = 1,
                               .head_dim = 32, .n_ctx = 256, .rope_base = 1000000, .norm_eps = 1e-6f, .tied = 1,
                               .swa_window = 16, .type = "f16", .seed = 3, .vocab_size = 100};
        if (a == 1) {
            snprintf(s.arch, sizeof s.arch, "phi3");
            s.n_head_kv = 2, s.tied = 0, s.swa_window = 0;
        }
        if (a == 2) {
            snprintf(s.arch, sizeof s.arch, "gpt-oss");
            s.n_layers = 4, s.tied = 0, s.yarn_factor = 32, s.n_expert = 4, s.n_expert_used = 2, s.n_ff_exp = 32;
        }
        CHECK(synth_write(&s, NULL, path, err, sizeof err) == 0, "synth_write: %s", err);
        struct model *m = NULL;
        CHECK(model_load(&m, path, NULL, err, sizeof err) == 0, "%s: %s", s.arch, err);
        if (m && a == 0)
            CHECK(m->hp.gemma && m->hp.swa_window == 16 && m->hp.swa_pattern == 6 && m->hp.rope_base_swa == 10000.0f &&
                      model_layer_swa(&m->hp, 4) && !model_layer_swa(&m->hp, 5) && m->layers[1].attn_post_norm &&
                      m->layers[1].ffn_post_norm && m->layers[1].q_norm && m->hp.rope == ROPE_NEOX,
                  "gemma3 hyper-parameters");
        if (m && a == 1)
            CHECK(m->hp.fused && !m->hp.gemma && m->hp.swa_window == 0 && kern_mat_rows(m->layers[0].wk) == 64 &&
                      kern_mat_rows(m->layers[0].w_up) == 128 && !m->layers[0].attn_post_norm,
                  "phi3 hyper-parameters");
        if (m && a == 2) {
            const struct model_layer *L = &m->layers[1];
            CHECK(m->hp.oss && !m->hp.gemma && m->hp.swa_window == 16 && m->hp.swa_pattern == 2 &&
                      model_layer_swa(&m->hp, 0) && !model_layer_swa(&m->hp, 1) && model_layer_swa(&m->hp, 2) &&
                      m->hp.rope_yarn_factor == 32.0f && !m->hp.expert_norm && m->hp.n_ff_exp == 32 &&
                      L->sinks && L->bo && L->bq && L->bk && L->bv && L->router_b && L->exp_gate_b && L->exp_up_b &&
                      L->exp_down_b && L->ffn_norm && !L->attn_post_norm && m->hp.rope == ROPE_NEOX,
                  "gpt-oss hyper-parameters");
        }
        model_release(m);
        const struct arch_edit *edits = a == 2 ? oss : a ? phi : gemma;
        size_t n = a == 2 ? sizeof oss / sizeof oss[0] : a ? sizeof phi / sizeof phi[0] : sizeof gemma / sizeof gemma[0];
        for (size_t i = 0; i < n; i++) {
            if (rewrite_arch(path, bad, &edits[i])) {
                CHECK(0, "%s: cannot write the edited file", edits[i].what);
                continue;
            }
            expect_refusal(bad, edits[i].what, edits[i].code, edits[i].needle);
        }
    }
    unlink(path);
    unlink(bad);
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
    /* the gemma3 and phi3 shapes write the chat templates test_tmpl renders against jinja2 */
    const char *tshapes[][2] = {{"gemma3-tiny", "cairn-gemma3"}, {"gemma3-4b", "cairn-gemma3"}, {"phi3-mini", "cairn-phi3"}};
    for (int i = 0; i < 3; i++) {
        char tpath[512], text[4096] = "";
        snprintf(tpath, sizeof tpath, "%s/tests/tmpl/tmpl_cases/templates/%s.jinja", CAIRN_SOURCE_DIR, tshapes[i][1]);
        FILE *tf = fopen(tpath, "rb");
        size_t got = tf ? fread(text, 1, sizeof text - 1, tf) : 0;
        text[got] = 0;
        if (tf)
            fclose(tf);
        CHECK(synth_shape(tshapes[i][0], &q) == 0 && q.chat_template && !strcmp(q.chat_template, text),
              "%s's chat template differs from %s", tshapes[i][0], tpath);
    }
    CHECK(synth_shape("gemma3-1b", &q) == 0 && q.n_layers == 26 && q.n_embd == 1152 && q.head_dim == 256 &&
              q.n_head_kv == 1 && q.swa_window == 512 && q.tied, "gemma3-1b shape");

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
    CHECK(synth_shape("qwen3-30b-a3b", &q) == 0 && !strcmp(q.arch, "qwen3moe") && q.n_layers == 48 && q.n_embd == 2048 &&
              q.n_expert == 128 && q.n_expert_used == 8 && q.n_ff_exp == 768 && q.n_head == 32 && q.n_head_kv == 4 &&
              q.head_dim == 128, "qwen3-30b-a3b shape");
    check_moe(bad);
    check_arch_refusals();
    unlink(path);
    unlink(bad);
    return test_main_end();
}
