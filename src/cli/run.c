/* cairn run MODEL [PROMPT]: a chat with a model of the cluster from the terminal.
 *
 * Uses the node that answers at --host (else $CAIRN_HOST, else the address a node noted
 * in the data dir, else 127.0.0.1:52415), or
 * starts one there for the session when none does (loopback only). The model is pulled
 * onto the node if it is a hub reference no node has, placed unless an instance exists,
 * then: with PROMPT, or stdin not a terminal, one answer (PROMPT, or all of stdin) and
 * exit; else a chat on the terminal (chat.h, lineedit.h) with slash commands. Ctrl-C
 * stops an answer (the connection closes, which cancels the request on the node) and,
 * at an empty prompt, leaves, as Ctrl-D does. */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/args.h"
#include "base/err.h"
#include "cli/convo.h"
#include "cli/cli.h"
#include "cli/client.h"
#include "cli/lineedit.h"
#include "cli/localnode.h"
#include "cli/session.h"

#define PROMPT ">>> "
#define CONT_PROMPT "... "

/* SIGINT: set by the handler, read by the stream (to cancel) and the line editor (through
 * the pipe, which wakes its wait). */
static atomic_bool interrupted;
static int sig_pipe[2] = {-1, -1};

static void on_sigint(int sig)
{
    (void)sig;
    int saved = errno;
    atomic_store(&interrupted, true);
    if (sig_pipe[1] >= 0 && write(sig_pipe[1], "", 1) < 0) {
        /* the pipe is full: an interrupt is already pending */
    }
    errno = saved;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cairn run MODEL [PROMPT...] [--host HOST:PORT] [--json] [--system TEXT]\n"
            "                 [--set NAME=VALUE]... [--models-dir DIR] [--discovery off|auto|IFACE]\n"
            "                 [--cluster-port N] [--data-dir DIR]\n"
            "Chats with MODEL (a model of the cluster, or a hub reference, pulled when no node has it)\n"
            "through the node at --host ($CAIRN_HOST, else DATA_DIR/api_address, else 127.0.0.1:52415);\n"
            "with no node there, one is started for the session (the rest of the options are for it).\n"
            "With PROMPT, or stdin not a terminal, prints one answer and exits. --json: one JSON object\n"
            "per answer. --set: a sampling setting (as /set in a chat).\n"
            "In a chat: Ctrl-C stops an answer, Ctrl-C on an empty line or Ctrl-D leaves; a line ending\n"
            "in \\ goes on, and \"\"\" opens a block that a line ending in \"\"\" closes. Type /help.\n");
}

static void chat_help(void)
{
    printf("/set                     the settings\n"
           "/set NAME VALUE          temperature, top_p, top_k, min_p, seed, max_tokens, repeat_penalty,\n"
           "                         presence_penalty, frequency_penalty, num_draft_tokens ('default' unsets)\n"
           "/set system TEXT         the system prompt (/set system alone clears it)\n"
           "/draft MODEL [K]         the instance's draft model (speculative decoding), K draft tokens\n"
           "/draft off               no draft model\n"
           "/stats                   the last answer: time to first token, tokens/s, drafted/accepted\n"
           "/clear                   forget the conversation (the system prompt stays)\n"
           "/bye                     leave (as Ctrl-D)\n");
}

struct run_opts {
    const char *model, *host, *system, *models_dir, *discovery, *cluster_port, *data_dir;
    const char *sets[32];
    int n_sets;
    bool json;
    char prompt[8192];
};

/* CLI_GO_ON, or the exit code. */
static int parse(struct run_opts *o, int argc, char **argv)
{
    struct args a = {argc, argv, 1, "run", false};
    const char *v;
    size_t plen = 0;
    for (; a.i < argc && !a.bad; a.i++) {
        if (args_opt(&a, "--host", &v)) o->host = v;
        else if (args_opt(&a, "--json", NULL)) o->json = true;
        else if (args_opt(&a, "--system", &v)) o->system = v;
        else if (args_opt(&a, "--set", &v)) {
            if (o->n_sets == (int)(sizeof o->sets / sizeof o->sets[0])) {
                fprintf(stderr, "cairn run: too many --set\n");
                return 2;
            }
            o->sets[o->n_sets++] = v;
        }
        else if (args_opt(&a, "--models-dir", &v)) o->models_dir = v;
        else if (args_opt(&a, "--discovery", &v)) o->discovery = v;
        else if (args_opt(&a, "--cluster-port", &v)) o->cluster_port = v;
        else if (args_opt(&a, "--data-dir", &v)) o->data_dir = v;
        else if (args_opt(&a, "-h|--help", NULL)) { usage(); return 0; }
        else if (argv[a.i][0] == '-' && argv[a.i][1]) {
            fprintf(stderr, "cairn run: unknown option '%s'\n", argv[a.i]);
            usage();
            return 2;
        } else if (!o->model) {
            o->model = argv[a.i];
        } else { /* the prompt's words */
            int w = snprintf(o->prompt + plen, sizeof o->prompt - plen, "%s%s", plen ? " " : "", argv[a.i]);
            if (w < 0 || (size_t)w >= sizeof o->prompt - plen) {
                fprintf(stderr, "cairn run: a PROMPT on the command line is at most %zu bytes (pipe longer ones)\n",
                        sizeof o->prompt - 1);
                return 2;
            }
            plen += (size_t)w;
        }
    }
    if (a.bad)
        return 2;
    if (!o->model) {
        usage();
        return 2;
    }
    return CLI_GO_ON;
}

/* All of stdin (at most LINEEDIT_INPUT_MAX bytes) into *out; 0, or 1 (message printed). */
static int read_stdin(char **out)
{
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            if (cap >= LINEEDIT_INPUT_MAX) {
                fprintf(stderr, "cairn run: the prompt on stdin is over %zu bytes\n", LINEEDIT_INPUT_MAX);
                free(buf);
                return 1;
            }
            char *p = realloc(buf, cap * 2);
            if (!p)
                break;
            buf = p, cap *= 2;
        }
        ssize_t n = read(STDIN_FILENO, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR && !atomic_load(&interrupted))
            continue;
        if (n < 0) {
            fprintf(stderr, "cairn run: stdin: %s\n", strerror(errno));
            free(buf);
            return 1;
        }
        if (n == 0) {
            buf[len] = 0;
            *out = buf;
            return 0;
        }
        len += (size_t)n;
    }
    free(buf);
    fprintf(stderr, "cairn run: out of memory\n");
    return 1;
}

/* /draft MODEL [K] | /draft off: the instance's draft model. */
static void set_draft(const struct client *api, const char *instance, char *args)
{
    char *model = strtok(args, " \t"), *k = strtok(NULL, " \t");
    if (!model) {
        printf("usage: /draft MODEL [K] | /draft off\n");
        return;
    }
    json_t *body = json_object();
    json_object_set_new(body, "draft_model", strcmp(model, "off") ? json_string(model) : json_null());
    if (k) {
        char *end;
        long kv = strtol(k, &end, 10);
        if (*end || kv < 1 || kv > 32) {
            printf("K: a number of draft tokens from 1 to 32\n");
            json_decref(body);
            return;
        }
        json_object_set_new(body, "num_draft_tokens", json_integer(kv));
    }
    char path[128], err[1024];
    snprintf(path, sizeof path, "/instance/%s/draft_model", instance);
    int status = client_json(api, "PUT", path, body, NULL, err, sizeof err);
    json_decref(body);
    if (status == 200)
        printf(strcmp(model, "off") ? "draft model %s set (the runner loads it between steps)\n"
                                    : "draft model dropped%s\n",
               strcmp(model, "off") ? model : "");
    else
        printf("draft model not set: %s\n", err);
}

/* A slash command; false when it says to leave. */
static bool command(struct convo *c, const struct client *api, const char *instance, char *line)
{
    char *cmd = strtok(line, " \t"), *rest = strtok(NULL, "");
    char err[512];
    if (!strcmp(cmd, "/bye") || !strcmp(cmd, "/exit"))
        return false;
    if (!strcmp(cmd, "/help") || !strcmp(cmd, "/?"))
        chat_help();
    else if (!strcmp(cmd, "/stats"))
        convo_show_stats(c, stdout);
    else if (!strcmp(cmd, "/clear")) {
        json_t *first = json_array_get(c->messages, 0);
        const char *role = json_string_value(json_object_get(first, "role"));
        size_t keep = role && !strcmp(role, "system");
        while (json_array_size(c->messages) > keep)
            json_array_remove(c->messages, keep);
        printf("conversation cleared\n");
    } else if (!strcmp(cmd, "/draft"))
        set_draft(api, instance, rest ? rest : "");
    else if (!strcmp(cmd, "/set")) {
        char *name = rest ? strtok(rest, " \t") : NULL, *value = name ? strtok(NULL, "") : NULL;
        if (!name)
            convo_show_settings(c, stdout);
        else if (!strcmp(name, "system"))
            printf(convo_set_system(c, value) ? "out of memory\n" : value ? "system prompt set\n" : "system prompt cleared\n");
        else if (!value)
            printf("usage: /set NAME VALUE\n");
        else if (convo_set_option(c, name, value, err, sizeof err))
            printf("%s\n", err);
        else
            printf("%s %s\n", name, value);
    } else
        printf("unknown command %s (/help)\n", cmd);
    return true;
}

/* The chat on the terminal, until Ctrl-D, Ctrl-C on an empty line or /bye; the exit code
 * (0: a failed answer is said and the chat goes on). */
static int converse(struct convo *c, const struct client *api, const char *instance)
{
    char hist[4096], err[1024];
    struct lineedit *e = lineedit_open(cli_data_path(hist, sizeof hist, "run_history") ? NULL : hist, sig_pipe[0]);
    if (!e) {
        fprintf(stderr, "cairn run: out of memory\n");
        return 1;
    }
    fprintf(stderr, "Ctrl-C stops an answer, Ctrl-D leaves, /help for more.\n");
    for (;;) {
        atomic_store(&interrupted, false);
        lineedit_drain(sig_pipe[0]);
        char *text;
        enum lineedit_result r = lineedit_read(e, PROMPT, CONT_PROMPT, &text);
        if (r != LINEEDIT_TEXT)
            break;
        atomic_store(&interrupted, false); /* a Ctrl-C that cleared a line being typed */
        if (!text[0]) {
            free(text);
            continue;
        }
        bool go_on = true;
        if (text[0] == '/') {
            go_on = command(c, api, instance, text);
        } else {
            int a = convo_ask(c, text, &interrupted, err, sizeof err);
            if (a < 0)
                fprintf(stderr, "cairn run: %s\n", err);
        }
        free(text);
        if (!go_on)
            break;
    }
    lineedit_close(e);
    return 0;
}

/* Applies --system and --set to the conversation; 0, or 2 (message printed). */
static int apply_settings(struct convo *c, const struct run_opts *o)
{
    char err[512];
    if (o->system && convo_set_system(c, o->system))
        return 2;
    for (int i = 0; i < o->n_sets; i++) {
        char name[64];
        const char *eq = strchr(o->sets[i], '=');
        if (!eq || (size_t)(eq - o->sets[i]) >= sizeof name) {
            fprintf(stderr, "cairn run: --set NAME=VALUE, not '%s'\n", o->sets[i]);
            return 2;
        }
        snprintf(name, sizeof name, "%.*s", (int)(eq - o->sets[i]), o->sets[i]);
        if (convo_set_option(c, name, eq + 1, err, sizeof err)) {
            fprintf(stderr, "cairn run: %s\n", err);
            return 2;
        }
    }
    return 0;
}

int cli_run(int argc, char **argv)
{
    struct run_opts o = {0};
    int rc = parse(&o, argc, argv);
    if (rc != CLI_GO_ON)
        return rc;
    char err[1024];
    struct client api;
    if (client_init(&api, o.host, err, sizeof err)) {
        fprintf(stderr, "cairn run: %s\n", err);
        return 2;
    }
    if (pipe(sig_pipe)) {
        fprintf(stderr, "cairn run: pipe: %s\n", strerror(errno));
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    bool interactive = !o.prompt[0] && isatty(STDIN_FILENO);
    char *input = NULL;
    if (!interactive && !o.prompt[0] && read_stdin(&input))
        return 1;
    struct localnode local = {0};
    if (!client_alive(&api)) {
        struct localnode_config lc = {.models_dir = o.models_dir, .discovery = o.discovery,
                                      .cluster_port = o.cluster_port, .data_dir = o.data_dir};
        fprintf(stderr, "no node at %s: starting one for this session\n", api.base);
        if (localnode_start(&local, &api, &lc, &interrupted, err, sizeof err)) {
            fprintf(stderr, "cairn run: %s\n", err);
            free(input);
            return 1;
        }
    }
    struct session_model m;
    struct convo c;
    rc = session_ready(&api, o.model, &interrupted, &m, err, sizeof err);
    if (rc) {
        fprintf(stderr, "cairn run: %s\n", err);
        rc = 1;
    } else if (convo_init(&c, &api, m.id, isatty(STDOUT_FILENO) && !getenv("NO_COLOR"), o.json, stdout)) {
        fprintf(stderr, "cairn run: out of memory\n");
        rc = 1;
    } else {
        rc = apply_settings(&c, &o);
        if (!rc && interactive) {
            rc = converse(&c, &api, m.instance);
        } else if (!rc) {
            int a = convo_ask(&c, o.prompt[0] ? o.prompt : input, &interrupted, err, sizeof err);
            if (a < 0)
                fprintf(stderr, "cairn run: %s\n", err);
            rc = a == 0 ? 0 : a == 1 ? 130 : 1;
        }
        convo_release(&c);
    }
    free(input);
    localnode_stop(&local);
    return rc;
}
