/* cairn bench --ranks W (bench_pipe.c): a pipelined model in one process against one slice. */
#ifndef CAIRN_CLI_BENCH_PIPE_H
#define CAIRN_CLI_BENCH_PIPE_H

#include <stdbool.h>
#include <stdint.h>

struct bench_pipe_opts {
    const char *model_path;
    int ranks;       /* 2..8 */
    int threads;     /* per rank; the one slice gets ranks * threads */
    int streams;     /* concurrent streams of the second run (the first has 1) */
    int64_t n_prompt, n_gen;
    int delay_us;    /* emulated one-way delay of every link */
    bool sealed;     /* links encrypted and authenticated, as in a sealed cluster */
};

/* Prints the table; 0, or 1 with a message on stderr. */
int bench_pipeline(const struct bench_pipe_opts *o);

#endif
