#include "base/clock.h"
#include "base/err.h"
#include "base/mem.h"
#include "base/args.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/kv.h"
#include "engine/sample.h"
#include "model/model.h"
#include "tmpl/chat.h"
#include "tok/tok.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PROMPT (1 << 20)

static void usage(void)
{
    fprintf(stderr,
            "usage: cairn generate -m MODEL.gguf (--tokens ID,ID,... | -p TEXT | --chat MESSAGE [--system TEXT])\n"
            "                      [-n N] [--seed S] [--temp T] [--top-k K]\n"
            "                      [--top-p P] [--min-p P] [--repeat-penalty R] [--presence-penalty P]\n"
            "                      [--frequency-penalty F] [--penalty-last-n N] [-t THREADS] [-c|--ctx-size N]\n"
            "                      [-b|--batch N] [--ids] [--ignore-eos]\n"
            "Streams the generated text (with --tokens or --ids: token ids on one line) until an\n"
            "end-of-generation token or N tokens; timings go to stderr.\n");
}

int cli_generate(int argc, char **argv)
{
    struct args a = {argc, argv, 1, "generate", false};
    const char *model_path = NULL, *tokens = NULL, *text = NULL, *chat_msg = NULL, *system = NULL, *v;
    bool print_ids = false, ignore_eos = false;
    int64_t n_predict = 128, threads = 2, ctx = 0, batch = 512;
    struct sample_params sp = sample_defaults();
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "-m|--model", &v)) model_path = v;
        else if (args_opt(&a, "--tokens", &v)) tokens = v;
        else if (args_opt(&a, "-p|--prompt", &v)) text = v;
        else if (args_opt(&a, "--chat", &v)) chat_msg = v;
        else if (args_opt(&a, "--system", &v)) system = v;
        else if (args_opt(&a, "--ids", NULL)) print_ids = true;
        else if (args_opt(&a, "--ignore-eos", NULL)) ignore_eos = true;
        else if (args_opt(&a, "-n|--n-predict", &v)) n_predict = args_int(&a, "-n", v, 0, 1 << 24);
        else if (args_opt(&a, "-t|--threads", &v)) threads = args_int(&a, "-t", v, 1, 512);
        else if (args_opt(&a, "-c|--ctx-size", &v)) ctx = args_int(&a, "--ctx-size", v, 1, 1 << 24);
        else if (args_opt(&a, "-b|--batch", &v)) batch = args_int(&a, "--batch", v, 1, 8192);
        else if (args_opt(&a, "--seed", &v)) sp.seed = (uint64_t)args_int(&a, "--seed", v, 0, INT64_MAX);
        else if (args_opt(&a, "--temp", &v)) sp.temperature = (float)args_float(&a, "--temp", v, 0, 100);
        else if (args_opt(&a, "--top-k", &v)) sp.top_k = (int)args_int(&a, "--top-k", v, 0, 1 << 24);
        else if (args_opt(&a, "--top-p", &v)) sp.top_p = (float)args_float(&a, "--top-p", v, 1e-6, 1);
        else if (args_opt(&a, "--min-p", &v)) sp.min_p = (float)args_float(&a, "--min-p", v, 0, 1);
        else if (args_opt(&a, "--repeat-penalty", &v)) sp.repeat_penalty = (float)args_float(&a, "--repeat-penalty", v, 0.01, 100);
        else if (args_opt(&a, "--presence-penalty", &v)) sp.presence_penalty = (float)args_float(&a, "--presence-penalty", v, -100, 100);
        else if (args_opt(&a, "--frequency-penalty", &v)) sp.frequency_penalty = (float)args_float(&a, "--frequency-penalty", v, -100, 100);
        else if (args_opt(&a, "--penalty-last-n", &v)) sp.penalty_last_n = (int)args_int(&a, "--penalty-last-n", v, -1, 1 << 24);
        else if (args_opt(&a, "-h|--help", NULL)) { usage(); return 0; }
        else {
            fprintf(stderr, "cairn generate: unknown option '%s'\n", argv[a.i]);
            usage();
            return 2;
        }
    }
    if (a.bad)
        return 2;
    if (!model_path || (!tokens + !text + !chat_msg) != 2) {
        fprintf(stderr, "cairn generate: -m MODEL and one of --tokens, -p, --chat are required\n");
        usage();
        return 2;
    }
    int32_t *prompt = NULL;
    int64_t n_prompt = 0;
    if (tokens) {
        print_ids = true;
        prompt = malloc(MAX_PROMPT * sizeof *prompt);
        n_prompt = prompt ? args_int_list(&a, "--tokens", tokens, prompt, MAX_PROMPT) : -1;
        if (n_prompt <= 0) {
            if (n_prompt == 0)
                fprintf(stderr, "cairn generate: --tokens is empty\n");
            free(prompt);
            return 2;
        }
    }

    char err[512];
    struct tok *tk = NULL;
    struct chat *ch = NULL;
    struct model *m = NULL;
    struct engine *e = NULL;
    struct kv_cache *kv = NULL;
    struct sampler *smp = NULL;
    int32_t *history = NULL;
    float *logits = NULL;
    int ret = 1;
    if (model_load(&m, model_path, NULL, err, sizeof err)) {
        fprintf(stderr, "cairn generate: %s: %s\n", model_path, err);
        goto out;
    }
    if (!tokens) {
        if (tok_load(&tk, m->file, err, sizeof err) || chat_create(&ch, m->file, tk, err, sizeof err)) {
            fprintf(stderr, "cairn generate: %s: no usable tokenizer (%s); give --tokens instead\n", model_path, err);
            goto out;
        }
        char *rendered = NULL;
        size_t rlen = 0;
        if (chat_msg && !chat_has_template(ch))
            fprintf(stderr, "cairn generate: the model has no usable chat template; using a plain chat format\n");
        if (chat_msg) {
            json_t *vars = json_pack("{s:[]}", "messages");
            json_t *msgs = json_object_get(vars, "messages");
            if (system)
                json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system));
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", chat_msg));
            int rc = chat_render(ch, vars, true, &rendered, &rlen, err, sizeof err);
            json_decref(vars);
            if (rc) {
                fprintf(stderr, "cairn generate: chat template: %s\n", err);
                goto out;
            }
            text = rendered;
        } else {
            rlen = strlen(text);
        }
        int rc = chat_tokenize(ch, text, rlen, &prompt, &n_prompt, err, sizeof err);
        free(rendered);
        if (rc || n_prompt == 0) {
            fprintf(stderr, "cairn generate: %s\n", rc ? err : "the prompt is empty");
            goto out;
        }
    }
    if (!ctx)
        ctx = m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    if (n_prompt + n_predict > ctx) {
        fprintf(stderr, "cairn generate: prompt of %lld tokens + %lld to generate does not fit the context of %lld "
                "(raise --ctx-size, at most the model's %lld)\n", (long long)n_prompt, (long long)n_predict,
                (long long)ctx, (long long)m->hp.n_ctx_train);
        ret = 2;
        goto out;
    }
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] >= m->hp.n_vocab) {
            fprintf(stderr, "cairn generate: token %d is outside the vocabulary of %d\n", prompt[i], m->hp.n_vocab);
            ret = 2;
            goto out;
        }
    struct engine_config ec = {.n_threads = (int)threads, .max_batch = (int)batch, .max_ctx = ctx};
    struct kv_config kc = engine_kv_config(m, ctx, 1, 16);
    int64_t avail = mem_available();
    if (avail > 0 && kv_bytes_for(&kc) > (uint64_t)avail) {
        fprintf(stderr, "cairn generate: a KV cache for %lld positions needs %.1f MiB but only %.1f MiB of memory "
                "is available; lower --ctx-size\n", (long long)ctx, (double)kv_bytes_for(&kc) / (1 << 20),
                (double)avail / (1 << 20));
        ret = 2;
        goto out;
    }
    if (engine_create(&e, m, &ec, err, sizeof err) || kv_create(&kv, &kc, err, sizeof err) ||
        sample_create(&smp, m->hp.n_vocab)) {
        fprintf(stderr, "cairn generate: %s\n", err);
        goto out;
    }
    history = malloc((size_t)(n_prompt + n_predict) * sizeof *history);
    logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
    int32_t *seqs = calloc((size_t)batch, sizeof *seqs);
    int64_t *pos = malloc((size_t)batch * sizeof *pos);
    uint8_t *want = calloc((size_t)batch, 1);
    if (!history || !logits || !seqs || !pos || !want) {
        fprintf(stderr, "cairn generate: out of memory\n");
        free(seqs), free(pos), free(want);
        goto out;
    }
    memcpy(history, prompt, (size_t)n_prompt * sizeof *prompt);
    int64_t n_hist = n_prompt;

    double t0 = clock_sec();
    for (int64_t i = 0; i < n_prompt; i += batch) {
        int n = (int)(n_prompt - i < batch ? n_prompt - i : batch);
        for (int k = 0; k < n; k++) {
            pos[k] = i + k;
            want[k] = i + k == n_prompt - 1;
        }
        struct batch b = {.n = n, .token = prompt + i, .seq = seqs, .pos = pos, .logits = want};
        if (engine_forward(e, kv, &b, logits, err, sizeof err)) {
            fprintf(stderr, "cairn generate: %s\n", err);
            free(seqs), free(pos), free(want);
            goto out;
        }
    }
    double t1 = clock_sec();
    int64_t generated = 0;
    struct tok_stream ts;
    size_t text_cap = tk ? 3 * (tok_max_token_text(tk) + 4) : 0;
    char *piece = tk ? malloc(text_cap) : NULL;
    if (tk) {
        tok_stream_init(&ts, tk, 0);
        ts.started = 1; /* text continues the prompt: no SentencePiece leading-space removal */
    }
    for (; generated < n_predict; generated++) {
        int32_t tok = sample_token(smp, &sp, logits, history, n_hist, n_hist, NULL);
        if (tok < 0) {
            fprintf(stderr, "cairn generate: invalid sampling parameters\n");
            free(seqs), free(pos), free(want);
            goto out;
        }
        history[n_hist++] = tok;
        bool end = tk && !ignore_eos && tok_is_eog(tk, tok);
        if (print_ids) {
            printf("%s%d", generated ? " " : "", tok);
        } else if (!end && piece) {
            size_t len = 0;
            if (tok_stream_feed(&ts, tok, piece, text_cap, &len) == 0)
                fwrite(piece, 1, len, stdout);
        }
        fflush(stdout);
        if (end) {
            generated++;
            break;
        }
        if (generated + 1 == n_predict) {
            generated++;
            break;
        }
        pos[0] = n_hist - 1;
        want[0] = 1;
        struct batch b = {.n = 1, .token = &tok, .seq = seqs, .pos = pos, .logits = want};
        if (engine_forward(e, kv, &b, logits, err, sizeof err)) {
            fprintf(stderr, "\ncairn generate: %s\n", err);
            free(seqs), free(pos), free(want);
            goto out;
        }
    }
    double t2 = clock_sec();
    if (piece) {
        size_t len = 0;
        if (!print_ids && tok_stream_flush(&ts, piece, text_cap, &len) == 0)
            fwrite(piece, 1, len, stdout);
        free(piece);
    }
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "prompt: %lld tokens in %.3f s (%.1f tok/s); generated: %lld tokens in %.3f s (%.1f tok/s)\n",
            (long long)n_prompt, t1 - t0, (double)n_prompt / (t1 - t0), (long long)generated, t2 - t1,
            generated > 1 ? (double)(generated - 1) / (t2 - t1) : 0.0);
    free(seqs), free(pos), free(want);
    ret = 0;
out:
    free(prompt);
    chat_release(ch);
    tok_release(tk);
    free(history);
    free(logits);
    sample_release(smp);
    kv_release(kv);
    engine_release(e);
    model_release(m);
    return ret;
}
