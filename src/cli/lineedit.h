/* Line editing for cairn run's prompt on a terminal, through libedit (BSD editline, its
 * readline interface): the keys people expect (Emacs or vi bindings, ~/.editrc), history
 * kept in a file, and input of several lines: a line that ends in '\' goes on, and a
 * block opened with """ ends at a line that ends with """.
 *
 * The caller's SIGINT handler writes a byte to a pipe; while a line is edited the
 * editor waits on the terminal and that pipe together, so Ctrl-C clears a line being
 * typed and, on an empty one, is given back to the caller. One editor per process
 * (libedit's readline interface is a global). */
#ifndef CAIRN_CLI_LINEEDIT_H
#define CAIRN_CLI_LINEEDIT_H

#include <stddef.h>

#define LINEEDIT_HISTORY_MAX 1000 /* entries kept */
#define LINEEDIT_INPUT_MAX ((size_t)1 << 20) /* bytes of one input, lines joined */

enum lineedit_result {
    LINEEDIT_TEXT = 0,       /* *text holds the input (malloc'd, the caller's) */
    LINEEDIT_EOF = 1,        /* Ctrl-D on an empty line, or stdin closed */
    LINEEDIT_INTERRUPT = 2,  /* Ctrl-C on an empty line */
};

struct lineedit;

/* Starts the editor on stdin/stdout with history from history_path (NULL: none kept);
 * sig_fd is the read end of the caller's signal pipe. NULL when out of memory. */
struct lineedit *lineedit_open(const char *history_path, int sig_fd);

/* Saves the history and gives the terminal back; accepts NULL. */
void lineedit_close(struct lineedit *e);

/* Reads one input after prompt (cont_prompt before each further line). */
enum lineedit_result lineedit_read(struct lineedit *e, const char *prompt, const char *cont_prompt, char **text);

/* Drains the signal pipe (bytes of interrupts already handled). */
void lineedit_drain(int sig_fd);

#endif
