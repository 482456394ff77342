/* The logits of a forward pass are the same bits on every kernel path and on every
 * architecture. For each weight type (all 16), and for two mixture-of-experts shapes, a
 * model written by synth_write (the same bytes on any machine) runs a prompt and a
 * decode step on the reference kernels and on the fastest path of this CPU; the two must
 * agree bit for bit. Each model's logits are then hashed (FNV-1a over their bits) and
 * printed as "forward-bits NAME HASH".
 *
 * Across architectures: when the working folder holds forward_bits_host.txt (those lines
 * from another machine's run: scripts/test-arm64.sh writes them from the x86-64 build
 * before it runs the ARM64 tests under qemu), every hash must equal the one there. */
#include "base/dtype.h"
#include "base/err.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "kern/kern.h"
#include "model/model.h"
#include "model/synth.h"
#include "testutil.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_PROMPT 9
#define HOST_FILE "forward_bits_host.txt"

/* Logits of N_PROMPT prompt positions and one decode step ((N_PROMPT + 1) x n_vocab). */
static float *run(const char *path, enum kern_path kp, int *n_vocab)
{
    char err[512];
    struct model *m = NULL;
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    float *out = NULL;
    struct model_load_opts o = {.layer_begin = 0, .layer_end = -1, .path = kp, .threads = 1};
    if (model_load(&m, path, &o, err, sizeof err)) {
        CHECK(0, "model_load %s: %s", path, err);
        return NULL;
    }
    struct engine_config ec = {.n_threads = 2, .max_batch = 16, .max_ctx = 64};
    struct kv_config kc = engine_kv_config(m, 64, 1, 16);
    if (engine_create(&e, m, &ec, err, sizeof err) || kv_create(&kv, &kc, err, sizeof err)) {
        CHECK(0, "engine/kv: %s", err);
        goto done;
    }
    int V = m->hp.n_vocab;
    *n_vocab = V;
    out = malloc((size_t)(N_PROMPT + 1) * (size_t)V * sizeof(float));
    int32_t toks[N_PROMPT + 1], seqs[N_PROMPT] = {0};
    int64_t pos[N_PROMPT];
    for (int i = 0; i <= N_PROMPT; i++)
        toks[i] = (int32_t)((i * 37 + 5) % V);
    for (int i = 0; i < N_PROMPT; i++)
        pos[i] = i;
    struct batch b = {.n = N_PROMPT, .token = toks, .seq = seqs, .pos = pos};
    int64_t dpos = N_PROMPT;
    struct batch d = {.n = 1, .token = toks + N_PROMPT, .seq = seqs, .pos = &dpos};
    if (engine_forward(e, kv, &b, out, err, sizeof err) ||
        engine_forward(e, kv, &d, out + (size_t)N_PROMPT * (size_t)V, err, sizeof err)) {
        CHECK(0, "engine_forward: %s", err);
        free(out);
        out = NULL;
    }
done:
    kv_release(kv);
    engine_release(e);
    model_release(m);
    return out;
}

static uint64_t fnv1a(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The host's hash of `type`, or 0 when the host file lacks it (or there is none). */
static uint64_t host_hash(const char *type, bool *have_file)
{
    FILE *f = fopen(HOST_FILE, "r");
    *have_file = f != NULL;
    if (!f)
        return 0;
    char line[256], name[64];
    uint64_t h = 0, v;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "forward-bits %63s %" SCNx64, name, &v) == 2 && !strcmp(name, type))
            h = v;
    fclose(f);
    return h;
}

int main(void)
{
    /* every weight type on a dense llama, and two mixtures of experts (gpt-oss's MXFP4
     * experts with Q8_0 elsewhere, qwen3moe in Q4_K) */
    static const struct { const char *name, *shape, *type; } cases[] = {
        {"f32", NULL, "f32"},       {"f16", NULL, "f16"},       {"bf16", NULL, "bf16"},
        {"q8_0", NULL, "q8_0"},     {"q4_0", NULL, "q4_0"},     {"q4_1", NULL, "q4_1"},
        {"q5_0", NULL, "q5_0"},     {"q5_1", NULL, "q5_1"},     {"q4_k", NULL, "q4_k"},
        {"q5_k", NULL, "q5_k"},     {"q6_k", NULL, "q6_k"},     {"q2_k", NULL, "q2_k"},
        {"q3_k", NULL, "q3_k"},     {"iq4_nl", NULL, "iq4_nl"}, {"iq4_xs", NULL, "iq4_xs"},
        {"mxfp4", NULL, "mxfp4"},
        {"gpt-oss-tiny/mxfp4", "gpt-oss-tiny", "mxfp4"},
        {"qwen3moe-tiny/q4_k", "qwen3moe-tiny", "q4_k"},
    };
    struct synth_spec base = {.arch = "llama", .n_layers = 2, .n_embd = 256, .n_ff = 512, .n_head = 4,
                              .n_head_kv = 2, .head_dim = 64, .n_ctx = 512, .rope_base = 10000,
                              .norm_eps = 1e-5f, .seed = 9, .vocab_size = 512};
    printf("best kernel path: %s\n", kern_path_name(kern_best_path()));
    /* the run-time choice on an emulated CPU of known features (CMakeLists.txt, ARM64) */
    const char *want_path = getenv("CAIRN_EXPECT_BEST_PATH");
    if (want_path && *want_path)
        CHECK(!strcmp(want_path, kern_path_name(kern_best_path())), "best path %s, expected %s",
              kern_path_name(kern_best_path()), want_path);
    int compared = 0;
    bool have_file = false;
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const char *name = cases[t].name;
        struct synth_spec s = base;
        if (cases[t].shape) {
            int rc = synth_shape(cases[t].shape, &s);
            CHECK(rc == 0, "synth_shape %s: %d", cases[t].shape, rc);
            s.seed = 9;
            s.vocab_size = 512;
        }
        snprintf(s.type, sizeof s.type, "%s", cases[t].type);
        char path[128], err[512];
        snprintf(path, sizeof path, "test_forward_bits_%d_%d.gguf", (int)t, (int)getpid());
        if (synth_write(&s, NULL, path, err, sizeof err)) {
            CHECK(0, "synth_write %s: %s", name, err);
            continue;
        }
        int V = 0, V2 = 0;
        float *ref = run(path, KERN_PATH_REF, &V), *best = run(path, KERN_PATH_AUTO, &V2);
        unlink(path);
        if (!ref || !best) {
            free(ref);
            free(best);
            continue;
        }
        size_t bytes = (size_t)(N_PROMPT + 1) * (size_t)V * sizeof(float);
        CHECK(V == V2 && memcmp(ref, best, bytes) == 0,
              "%s: logits on path %s differ from the reference path's", name,
              kern_path_name(kern_best_path()));
        uint64_t h = fnv1a(best, bytes);
        printf("forward-bits %s %016" PRIx64 "\n", name, h);
        uint64_t want = host_hash(name, &have_file);
        if (have_file) {
            CHECK(want == h, "%s: logits hash %016" PRIx64 " here, %016" PRIx64 " in %s", name, h,
                  want, HOST_FILE);
            compared++;
        }
        free(ref);
        free(best);
    }
    if (have_file)
        printf("compared %d hashes with %s\n", compared, HOST_FILE);
    else
        printf("no %s here: compared paths only\n", HOST_FILE);
    return test_main_end();
}
