/* cairn generate: one sequence from a model in this process, streamed to stdout as text
 * or token ids, with the timings of prompt and generation on stderr. */
#include "base/clock.h"
#include "base/dtype.h"
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

/* Prints the command's options to stderr. */
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

/* The command line. */
struct gen_opts {
    const char *model_path, *tokens, *text, *chat_msg, *system;
    bool print_ids, ignore_eos;
    int64_t n_predict, threads, ctx, batch;
    int type_k, type_v; /* KV cache types */
    struct sample_params sp;
};

/* What one generation holds, each released by run_release. */
struct run {
    struct tok *tk;   /* NULL with --tokens */
    struct chat *ch;  /* NULL with --tokens */
    struct model *m;
    struct engine *e;
    struct kv_cache *kv;
    struct sampler *smp;
    int32_t *prompt;  /* n_prompt ids */
    int64_t n_prompt;
    int32_t *history; /* the prompt and the tokens generated so far: n_hist of n_prompt + n_predict */
    int64_t n_hist;
    float *logits;    /* n_vocab: the last position's */
    int32_t *seqs;    /* the batch: batch of each */
    int64_t *pos;
    uint8_t *want;
    struct tok_stream ts;
    char *piece;      /* text_cap: one token's text out of ts; NULL without a tokenizer */
    size_t text_cap;
    char err[512];
};

/* Reads the options into o; CLI_GO_ON, or the exit code. */
static int parse_opts(struct gen_opts *o, int argc, char **argv)
{
    struct args a = {argc, argv, 1, "generate", false};
    const char *v;
    *o = (struct gen_opts){.n_predict = 128, .threads = 2, .batch = 512, .type_k = DT_F16, .type_v = DT_F16,
                           .sp = sample_defaults()};
    struct sample_params *sp = &o->sp;
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "-m|--model", &v)) o->model_path = v;
        else if (args_opt(&a, "--tokens", &v)) o->tokens = v;
        else if (args_opt(&a, "-p|--prompt", &v)) o->text = v;
        else if (args_opt(&a, "--chat", &v)) o->chat_msg = v;
        else if (args_opt(&a, "--system", &v)) o->system = v;
        else if (args_opt(&a, "--ids", NULL)) o->print_ids = true;
        else if (args_opt(&a, "--ignore-eos", NULL)) o->ignore_eos = true;
        else if (args_opt(&a, "-n|--n-predict", &v)) o->n_predict = args_int(&a, "-n", v, 0, 1 << 24);
        else if (args_opt(&a, "-t|--threads", &v)) o->threads = args_int(&a, "-t", v, 1, 512);
        else if (args_opt(&a, "-c|--ctx-size", &v)) o->ctx = args_int(&a, "--ctx-size", v, 1, 1 << 24);
        else if (args_opt(&a, "-b|--batch", &v)) o->batch = args_int(&a, "--batch", v, 1, 8192);
        else if (args_opt(&a, "-ctk|--cache-type-k", &v)) o->type_k = cli_kv_type(&a, "-ctk", v);
        else if (args_opt(&a, "-ctv|--cache-type-v", &v)) o->type_v = cli_kv_type(&a, "-ctv", v);
        else if (args_opt(&a, "--seed", &v)) sp->seed = (uint64_t)args_int(&a, "--seed", v, 0, INT64_MAX);
        else if (args_opt(&a, "--temp", &v)) sp->temperature = (float)args_float(&a, "--temp", v, 0, 100);
        else if (args_opt(&a, "--top-k", &v)) sp->top_k = (int)args_int(&a, "--top-k", v, 0, 1 << 24);
        else if (args_opt(&a, "--top-p", &v)) sp->top_p = (float)args_float(&a, "--top-p", v, 1e-6, 1);
        else if (args_opt(&a, "--min-p", &v)) sp->min_p = (float)args_float(&a, "--min-p", v, 0, 1);
        else if (args_opt(&a, "--repeat-penalty", &v)) sp->repeat_penalty = (float)args_float(&a, "--repeat-penalty", v, 0.01, 100);
        else if (args_opt(&a, "--presence-penalty", &v)) sp->presence_penalty = (float)args_float(&a, "--presence-penalty", v, -100, 100);
        else if (args_opt(&a, "--frequency-penalty", &v)) sp->frequency_penalty = (float)args_float(&a, "--frequency-penalty", v, -100, 100);
        else if (args_opt(&a, "--penalty-last-n", &v)) sp->penalty_last_n = (int)args_int(&a, "--penalty-last-n", v, -1, 1 << 24);
        else if (args_opt(&a, "-h|--help", NULL)) { usage(); return 0; }
        else {
            fprintf(stderr, "cairn generate: unknown option '%s'\n", argv[a.i]);
            usage();
            return 2;
        }
    }
    if (a.bad)
        return 2;
    if (!o->model_path || (!o->tokens + !o->text + !o->chat_msg) != 2) {
        fprintf(stderr, "cairn generate: -m MODEL and one of --tokens, -p, --chat are required\n");
        usage();
        return 2;
    }
    if (o->tokens)
        o->print_ids = true;
    return CLI_GO_ON;
}

/* The prompt from --tokens into r; 0, or 2 (message printed). */
static int parse_tokens(struct run *r, const char *tokens)
{
    struct args a = {0, NULL, 0, "generate", false}; /* for args_int_list's messages */
    r->prompt = malloc(MAX_PROMPT * sizeof *r->prompt);
    r->n_prompt = r->prompt ? args_int_list(&a, "--tokens", tokens, r->prompt, MAX_PROMPT) : -1;
    if (r->n_prompt <= 0) {
        if (r->n_prompt == 0)
            fprintf(stderr, "cairn generate: --tokens is empty\n");
        return 2;
    }
    return 0;
}

/* The text of --chat (and --system) through the model's chat template, with the
 * generation prompt; 0, or 1 (message printed). */
static int render_chat(struct run *r, const struct gen_opts *o, char **text, size_t *len)
{
    json_t *vars = json_pack("{s:[]}", "messages");
    json_t *msgs = json_object_get(vars, "messages");
    if (o->system)
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", o->system));
    json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", o->chat_msg));
    int rc = chat_render(r->ch, vars, true, text, len, r->err, sizeof r->err);
    json_decref(vars);
    if (rc) {
        fprintf(stderr, "cairn generate: chat template: %s\n", r->err);
        return 1;
    }
    return 0;
}

/* The prompt from -p or --chat, tokenized with the model's tokenizer (kept in r for the
 * output); 0, or 1 (message printed). */
static int tokenize_prompt(struct run *r, const struct gen_opts *o)
{
    if (tok_load(&r->tk, r->m->file, r->err, sizeof r->err) ||
        chat_create(&r->ch, r->m->file, r->tk, r->err, sizeof r->err)) {
        fprintf(stderr, "cairn generate: %s: no usable tokenizer (%s); give --tokens instead\n", o->model_path,
                r->err);
        return 1;
    }
    const char *text = o->text;
    char *rendered = NULL;
    size_t rlen = 0;
    if (o->chat_msg && !chat_has_template(r->ch))
        fprintf(stderr, "cairn generate: the model has no usable chat template; using a plain chat format\n");
    if (o->chat_msg) {
        if (render_chat(r, o, &rendered, &rlen))
            return 1;
        text = rendered;
    } else {
        rlen = strlen(text);
    }
    int rc = chat_tokenize(r->ch, text, rlen, &r->prompt, &r->n_prompt, r->err, sizeof r->err);
    free(rendered);
    if (rc || r->n_prompt == 0) {
        fprintf(stderr, "cairn generate: %s\n", rc ? r->err : "the prompt is empty");
        return 1;
    }
    return 0;
}

/* Loads the model and, without --tokens, makes the prompt; 0, or 1 (message printed). */
static int load(struct run *r, const struct gen_opts *o)
{
    if (model_load(&r->m, o->model_path, NULL, r->err, sizeof r->err)) {
        fprintf(stderr, "cairn generate: %s: %s\n", o->model_path, r->err);
        return 1;
    }
    return o->tokens ? 0 : tokenize_prompt(r, o);
}

/* Sets the context (the model's, at most 4096, unless given) and checks that the prompt
 * and the tokens to generate fit it and the vocabulary; 0, or 2 (message printed). */
static int check_prompt(struct run *r, struct gen_opts *o)
{
    const struct model_hparams *hp = &r->m->hp;
    if (!o->ctx)
        o->ctx = hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096;
    if (r->n_prompt + o->n_predict > o->ctx) {
        fprintf(stderr, "cairn generate: prompt of %lld tokens + %lld to generate does not fit the context of %lld "
                "(raise --ctx-size, at most the model's %lld)\n", (long long)r->n_prompt, (long long)o->n_predict,
                (long long)o->ctx, (long long)hp->n_ctx_train);
        return 2;
    }
    for (int64_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] >= hp->n_vocab) {
            fprintf(stderr, "cairn generate: token %d is outside the vocabulary of %d\n", r->prompt[i], hp->n_vocab);
            return 2;
        }
    return 0;
}

int cli_kv_type(struct args *a, const char *opt, const char *v)
{
    int t = engine_kv_type(v);
    if (t >= 0)
        return t;
    fprintf(stderr, "cairn %s: bad value for %s: '%s' (f16, f32, q8_0 or q4_0)\n", a->cmd, opt, v);
    a->bad = true;
    return DT_F16;
}

/* Makes the engine, the KV cache (when memory allows it), the sampler and the buffers;
 * 0, or 1 or 2 (message printed). */
static int setup(struct run *r, const struct gen_opts *o)
{
    struct engine_config ec = {.n_threads = (int)o->threads, .max_batch = (int)o->batch, .max_ctx = o->ctx};
    struct kv_config kc = engine_kv_config(r->m, o->ctx, 1, 16);
    kc.type_k = o->type_k;
    kc.type_v = o->type_v;
    int64_t avail = mem_available();
    if (avail > 0 && kv_bytes_for(&kc) > (uint64_t)avail) {
        fprintf(stderr, "cairn generate: a KV cache for %lld positions needs %.1f MiB but only %.1f MiB of memory "
                "is available; lower --ctx-size\n", (long long)o->ctx, (double)kv_bytes_for(&kc) / (1 << 20),
                (double)avail / (1 << 20));
        return 2;
    }
    if (engine_create(&r->e, r->m, &ec, r->err, sizeof r->err) || kv_create(&r->kv, &kc, r->err, sizeof r->err) ||
        sample_create(&r->smp, r->m->hp.n_vocab)) {
        fprintf(stderr, "cairn generate: %s\n", r->err);
        return 1;
    }
    r->history = malloc((size_t)(r->n_prompt + o->n_predict) * sizeof *r->history);
    r->logits = malloc((size_t)r->m->hp.n_vocab * sizeof *r->logits);
    r->seqs = calloc((size_t)o->batch, sizeof *r->seqs);
    r->pos = malloc((size_t)o->batch * sizeof *r->pos);
    r->want = calloc((size_t)o->batch, 1);
    if (!r->history || !r->logits || !r->seqs || !r->pos || !r->want) {
        fprintf(stderr, "cairn generate: out of memory\n");
        return 1;
    }
    memcpy(r->history, r->prompt, (size_t)r->n_prompt * sizeof *r->prompt);
    r->n_hist = r->n_prompt;
    return 0;
}

/* Runs the prompt through the model in batches of --batch, leaving the last position's
 * logits; 0, or 1 (message printed). */
static int prefill(struct run *r, const struct gen_opts *o)
{
    for (int64_t i = 0; i < r->n_prompt; i += o->batch) {
        int n = (int)(r->n_prompt - i < o->batch ? r->n_prompt - i : o->batch);
        for (int k = 0; k < n; k++) {
            r->pos[k] = i + k;
            r->want[k] = i + k == r->n_prompt - 1;
        }
        struct batch b = {.n = n, .token = r->prompt + i, .seq = r->seqs, .pos = r->pos, .logits = r->want};
        if (engine_forward(r->e, r->kv, &b, r->logits, r->err, sizeof r->err)) {
            fprintf(stderr, "cairn generate: %s\n", r->err);
            return 1;
        }
    }
    return 0;
}

/* Samples up to --n-predict tokens, each printed as it comes (its id, or its text) and
 * fed back, until an end-of-generation token unless --ignore-eos; *generated gets the
 * count; 0, or 1 (message printed). */
static int decode(struct run *r, const struct gen_opts *o, int64_t *generated)
{
    r->text_cap = r->tk ? 3 * (tok_max_token_text(r->tk) + 4) : 0;
    r->piece = r->tk ? malloc(r->text_cap) : NULL;
    if (r->tk) {
        tok_stream_init(&r->ts, r->tk, 0);
        r->ts.started = 1; /* text continues the prompt: no SentencePiece leading-space removal */
    }
    int64_t n = 0;
    for (; n < o->n_predict; n++) {
        int32_t tok = sample_token(r->smp, &o->sp, r->logits, r->history, r->n_hist, r->n_hist, NULL);
        if (tok < 0) {
            fprintf(stderr, "cairn generate: invalid sampling parameters\n");
            return 1;
        }
        r->history[r->n_hist++] = tok;
        bool end = r->tk && !o->ignore_eos && tok_is_eog(r->tk, tok);
        if (o->print_ids) {
            printf("%s%d", n ? " " : "", tok);
        } else if (!end && r->piece) {
            size_t len = 0;
            if (tok_stream_feed(&r->ts, tok, r->piece, r->text_cap, &len) == 0)
                fwrite(r->piece, 1, len, stdout);
        }
        fflush(stdout);
        if (end || n + 1 == o->n_predict) {
            n++;
            break;
        }
        r->pos[0] = r->n_hist - 1;
        r->want[0] = 1;
        struct batch b = {.n = 1, .token = &tok, .seq = r->seqs, .pos = r->pos, .logits = r->want};
        if (engine_forward(r->e, r->kv, &b, r->logits, r->err, sizeof r->err)) {
            fprintf(stderr, "\ncairn generate: %s\n", r->err);
            return 1;
        }
    }
    *generated = n;
    return 0;
}

/* Prints the text the stream still holds and ends the output line. */
static void finish_output(struct run *r, const struct gen_opts *o)
{
    if (r->piece) {
        size_t len = 0;
        if (!o->print_ids && tok_stream_flush(&r->ts, r->piece, r->text_cap, &len) == 0)
            fwrite(r->piece, 1, len, stdout);
    }
    printf("\n");
    fflush(stdout);
}

/* Prefill and decode, the output on stdout and their timings on stderr; 0, or 1
 * (message printed). */
static int generate(struct run *r, const struct gen_opts *o)
{
    double t0 = clock_sec();
    if (prefill(r, o))
        return 1;
    double t1 = clock_sec();
    int64_t generated = 0;
    if (decode(r, o, &generated))
        return 1;
    double t2 = clock_sec();
    finish_output(r, o);
    fprintf(stderr, "prompt: %lld tokens in %.3f s (%.1f tok/s); generated: %lld tokens in %.3f s (%.1f tok/s)\n",
            (long long)r->n_prompt, t1 - t0, (double)r->n_prompt / (t1 - t0), (long long)generated, t2 - t1,
            generated > 1 ? (double)(generated - 1) / (t2 - t1) : 0.0);
    return 0;
}

/* Releases everything r holds. */
static void run_release(struct run *r)
{
    free(r->piece);
    free(r->seqs);
    free(r->pos);
    free(r->want);
    free(r->prompt);
    chat_release(r->ch);
    tok_release(r->tk);
    free(r->history);
    free(r->logits);
    sample_release(r->smp);
    kv_release(r->kv);
    engine_release(r->e);
    model_release(r->m);
}

int cli_generate(int argc, char **argv)
{
    struct gen_opts o;
    int ret = parse_opts(&o, argc, argv);
    if (ret != CLI_GO_ON)
        return ret;
    struct run r = {0};
    ret = o.tokens ? parse_tokens(&r, o.tokens) : 0;
    if (!ret)
        ret = load(&r, &o);
    if (!ret)
        ret = check_prompt(&r, &o);
    if (!ret)
        ret = setup(&r, &o);
    if (!ret)
        ret = generate(&r, &o);
    run_release(&r);
    return ret;
}
