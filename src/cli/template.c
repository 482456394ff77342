/* cairn template: renders a chat template the way Hugging Face's tooling does and prints
 * only the rendered prompt (no trailing newline added). */
#include "base/args.h"
#include "cli/cli.h"

#include "base/err.h"
#include "gguf/gguf.h"
#include "tmpl/tmpl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cairn template (-m MODEL.gguf | --template FILE.jinja) --messages FILE.json\n"
            "                      [--tools FILE.json] [--add-generation-prompt] [--var NAME=JSON]...\n"
            "                      [--vars FILE.json]\n"
            "  -m, --model F            the GGUF's tokenizer.chat_template, BOS/EOS token texts\n"
            "  --template F             a template file (bos_token \"<s>\", eos_token \"</s>\" as\n"
            "                           render_ref.py sets them, unless --var overrides)\n"
            "  --messages F             a JSON array of OpenAI-style messages\n"
            "  --tools F                a JSON array of tools\n"
            "  --add-generation-prompt  set add_generation_prompt to true (false without it)\n"
            "  --var NAME=JSON          any other template variable (repeatable)\n"
            "  --vars F                 a JSON object of variables, applied before the above\n");
}


static json_t *load_json(const char *path, const char *what)
{
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!j)
        fprintf(stderr, "cairn template: %s %s: %s (line %d)\n", what, path, je.text, je.line);
    return j;
}

/* Token text of a special token id named by key (e.g. tokenizer.ggml.bos_token_id). */
static json_t *token_text(const struct gguf_file *g, const char *key)
{
    uint32_t id;
    struct gguf_array toks;
    if (gguf_get_u32(g, key, &id) || gguf_get_arr(g, "tokenizer.ggml.tokens", &toks) ||
        toks.type != GGUF_STRING || id >= toks.n)
        return NULL;
    struct gguf_str s = gguf_arr_str(g, &toks, id);
    return json_stringn_nocheck(s.ptr, s.len);
}

int cli_template(int argc, char **argv)
{
    struct args a = {.argc = argc, .argv = argv, .cmd = "template"};
    const char *model = NULL, *tpath = NULL, *mpath = NULL, *tools_path = NULL, *vars_path = NULL;
    bool agp = false;
    json_t *vars = json_object(), *extra = json_object();
    int rc = 1;
    char *src = NULL, *out = NULL;
    struct gguf_file *g = NULL;
    struct tmpl *t = NULL;
    if (!vars || !extra) {
        fprintf(stderr, "cairn template: out of memory\n");
        goto done;
    }
    for (a.i = 1; a.i < argc; a.i++) {
        const char *v;
        if (args_opt(&a, "-m|--model", &v)) model = v;
        else if (args_opt(&a, "--template", &v)) tpath = v;
        else if (args_opt(&a, "--messages", &v)) mpath = v;
        else if (args_opt(&a, "--tools", &v)) tools_path = v;
        else if (args_opt(&a, "--vars", &v)) vars_path = v;
        else if (args_opt(&a, "--add-generation-prompt", NULL)) agp = true;
        else if (args_opt(&a, "--var", &v)) {
            const char *eq = strchr(v, '=');
            json_error_t je;
            json_t *jv = eq ? json_loads(eq + 1, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je) : NULL;
            if (!eq || eq == v || !jv) {
                fprintf(stderr, "cairn template: --var wants NAME=JSON, got '%s'%s%s\n", v, jv || !eq ? "" : ": ",
                        jv || !eq ? "" : je.text);
                a.bad = true;
                json_decref(jv);
                continue;
            }
            char name[256];
            snprintf(name, sizeof name, "%.*s", (int)(eq - v), v);
            json_object_set_new(extra, name, jv);
        } else if (args_opt(&a, "-h|--help", NULL)) {
            usage(stdout);
            rc = 0;
            goto done;
        } else {
            fprintf(stderr, "cairn template: unknown option '%s'\n", argv[a.i]);
            a.bad = true;
        }
    }
    if (a.bad || (!model == !tpath) || !mpath) {
        if (!a.bad)
            fprintf(stderr, "cairn template: give one of -m/--template, and --messages\n");
        usage(stderr);
        rc = 2;
        goto done;
    }
    char err[512];
    size_t len = 0;
    if (tpath) {
        if (!(src = args_read_file(tpath, &len))) {
            fprintf(stderr, "cairn template: cannot read %s\n", tpath);
            goto done;
        }
        json_object_set_new(vars, "bos_token", json_string("<s>"));
        json_object_set_new(vars, "eos_token", json_string("</s>"));
    } else {
        if (gguf_open(&g, model, err, sizeof err)) {
            fprintf(stderr, "cairn template: %s: %s\n", model, err);
            goto done;
        }
        struct gguf_str s;
        if (gguf_get_str(g, "tokenizer.chat_template", &s)) {
            fprintf(stderr, "cairn template: %s has no tokenizer.chat_template\n", model);
            goto done;
        }
        if (!(src = malloc(s.len + 1))) {
            fprintf(stderr, "cairn template: out of memory\n");
            goto done;
        }
        memcpy(src, s.ptr, s.len);
        len = s.len;
        json_t *bos = token_text(g, "tokenizer.ggml.bos_token_id");
        json_t *eos = token_text(g, "tokenizer.ggml.eos_token_id");
        json_object_set_new(vars, "bos_token", bos ? bos : json_string(""));
        json_object_set_new(vars, "eos_token", eos ? eos : json_string(""));
    }
    if (vars_path) {
        json_t *j = load_json(vars_path, "vars");
        if (!j || !json_is_object(j)) {
            if (j)
                fprintf(stderr, "cairn template: %s is not a JSON object\n", vars_path);
            json_decref(j);
            goto done;
        }
        json_object_update(vars, j);
        json_decref(j);
    }
    json_t *msgs = load_json(mpath, "messages");
    if (!msgs)
        goto done;
    json_object_set_new(vars, "messages", msgs);
    if (tools_path) {
        json_t *tools = load_json(tools_path, "tools");
        if (!tools)
            goto done;
        json_object_set_new(vars, "tools", tools);
    }
    /* absent means false, as the models' own tooling renders it (a template that takes an
     * undefined add_generation_prompt for true would otherwise add one) */
    json_object_set_new(vars, "add_generation_prompt", json_boolean(agp));
    json_object_update(vars, extra);

    int e = tmpl_parse(&t, src, len, err, sizeof err);
    if (e) {
        fprintf(stderr, "cairn template: %s: %s (%s)\n", tpath ? tpath : model, err, cairn_strerror(e));
        goto done;
    }
    size_t out_len;
    e = tmpl_render(t, vars, &out, &out_len, err, sizeof err);
    if (e) {
        fprintf(stderr, "cairn template: %s%s\n", e == CAIRN_EINVAL ? "the template raised: " : "", err);
        goto done;
    }
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout)) {
        fprintf(stderr, "cairn template: write error\n");
        goto done;
    }
    rc = 0;
done:
    free(out);
    tmpl_free(t);
    gguf_close(g);
    free(src);
    json_decref(vars);
    json_decref(extra);
    return rc;
}
