/* Line editing through libedit's readline interface (lineedit.h). */
#include "cli/lineedit.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <editline/readline.h>

#define WAIT_SLICE_MS 1000 /* a poll's bound; the loop goes on until input or a signal */

struct lineedit {
    char history[4096]; /* "" when none is kept */
    int sig_fd;
};

/* The line the callback interface hands over: libedit calls line_done from inside
 * rl_callback_read_char, which has no context argument. */
static struct {
    bool done;
    char *line; /* malloc'd by libedit; NULL at end of input */
} got;

static void line_done(char *line)
{
    got.done = true;
    got.line = line;
}

struct lineedit *lineedit_open(const char *history_path, int sig_fd)
{
    struct lineedit *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->sig_fd = sig_fd;
    if (history_path)
        snprintf(e->history, sizeof e->history, "%s", history_path);
    rl_catch_signals = 0; /* SIGINT is the caller's: it comes to us through sig_fd */
    rl_initialize();
    using_history();
    stifle_history(LINEEDIT_HISTORY_MAX);
    if (e->history[0])
        read_history(e->history);
    return e;
}

void lineedit_close(struct lineedit *e)
{
    if (!e)
        return;
    if (e->history[0])
        write_history(e->history);
    free(e);
}

void lineedit_drain(int sig_fd)
{
    char buf[64];
    struct pollfd p = {.fd = sig_fd, .events = POLLIN};
    for (int i = 0; i < 64 && poll(&p, 1, 0) == 1 && read(sig_fd, buf, sizeof buf) > 0; i++)
        ;
}

/* One line after prompt: 1 with *line (malloc'd), 0 at end of input, 2 on Ctrl-C with
 * the line empty (a line being typed is cleared, and the prompt shown again). */
static int read_line(struct lineedit *e, const char *prompt, char **line)
{
    got.done = false;
    got.line = NULL;
    rl_callback_handler_install(prompt, line_done);
    int rc = -1;
    while (rc < 0) {
        struct pollfd p[2] = {{.fd = STDIN_FILENO, .events = POLLIN}, {.fd = e->sig_fd, .events = POLLIN}};
        int n = poll(p, 2, WAIT_SLICE_MS);
        if (n < 0 && errno != EINTR) {
            rc = 0;
            break;
        }
        if (n > 0 && (p[1].revents & POLLIN)) {
            lineedit_drain(e->sig_fd);
            bool empty = !rl_line_buffer || !rl_line_buffer[0];
            fputs("^C\n", stdout);
            if (empty) {
                rc = 2;
                break;
            }
            /* a line being typed is dropped, as a shell does */
            rl_callback_handler_remove();
            rl_callback_handler_install(prompt, line_done);
            continue;
        }
        if (n > 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            rl_callback_read_char();
            if (got.done)
                rc = got.line ? 1 : 0;
        }
    }
    rl_callback_handler_remove();
    if (rc == 0)
        fputs("\n", stdout);
    fflush(stdout);
    *line = rc == 1 ? got.line : NULL;
    if (rc != 1)
        free(got.line);
    return rc;
}

/* Appends line (and a newline before it when b is not empty) to b; false past the limit. */
static bool append(char **b, size_t *len, const char *line, size_t n)
{
    if (*len + n + 2 > LINEEDIT_INPUT_MAX)
        return false;
    char *p = realloc(*b, *len + n + 2);
    if (!p)
        return false;
    if (*len)
        p[(*len)++] = '\n';
    memcpy(p + *len, line, n);
    *len += n;
    p[*len] = 0;
    *b = p;
    return true;
}

static bool ends_with(const char *s, size_t n, const char *tail)
{
    size_t t = strlen(tail);
    return n >= t && !memcmp(s + n - t, tail, t);
}

enum lineedit_result lineedit_read(struct lineedit *e, const char *prompt, const char *cont_prompt, char **text)
{
    *text = NULL;
    char *buf = NULL, *line;
    size_t len = 0;
    bool block = false; /* inside """ ... """ */
    for (int lines = 0;; lines++) {
        int rc = read_line(e, lines ? cont_prompt : prompt, &line);
        if (rc != 1) {
            free(buf);
            return rc == 2 ? LINEEDIT_INTERRUPT : LINEEDIT_EOF;
        }
        size_t n = strlen(line);
        const char *start = line;
        bool more = false;
        if (!lines && n >= 3 && !strncmp(line, "\"\"\"", 3)) { /* a block opens */
            start += 3, n -= 3;
            block = true;
            if (n >= 3 && ends_with(start, n, "\"\"\"")) /* and closes on its one line */
                n -= 3, block = false;
        } else if (block && ends_with(line, n, "\"\"\"")) {
            n -= 3;
            block = false;
        } else if (!block && n && line[n - 1] == '\\') {
            n--;
            more = true;
        }
        bool ok = append(&buf, &len, start, n);
        free(line);
        if (!ok) {
            fprintf(stderr, "cairn: an input is at most %zu bytes\n", LINEEDIT_INPUT_MAX);
            free(buf);
            buf = NULL, len = 0, block = false, lines = -1;
            continue;
        }
        if (!block && !more)
            break;
    }
    if (len)
        add_history(buf);
    *text = buf ? buf : strdup("");
    return LINEEDIT_TEXT;
}
