/* cairn: one binary, many sub-commands. */
#include "cli/cli.h"
#include "runner/runner.h"

#include <stdio.h>
#include <string.h>

static const struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"run", cli_run, "chat with a model: pulled, placed and served by the cluster (or one answer to PROMPT)"},
    {"status", cli_status, "the cluster: nodes, links, master, instances, downloads (--watch)"},
    {"ps", cli_ps, "the instances and their throughput (--watch)"},
    {"stop", cli_stop, "stop (delete) an instance"},
    {"version", cli_version, "print the version and the CPU features in use"},
    {"tokenize", cli_tokenize, "print the tokens of a text under a model's tokenizer (--bench: speed)"},
    {"embed", cli_embed, "the embeddings of texts under an embedding model (and their throughput)"},
    {"mkmodel", cli_mkmodel, "write a synthetic GGUF model of a real architecture's shape"},
    {"generate", cli_generate, "generate tokens from a model"},
    {"bench", cli_bench, "measure prefill and decode speed against the memory roofline"},
    {"template", cli_template, "render a chat template (as Hugging Face renders it)"},
    {"node", cli_node, "run this machine's node of a cluster (the default with no command)"},
    {"pull", cli_pull, "fetch a GGUF model from the Hugging Face hub (hf.co/OWNER/REPO:TAG)"},
    {"ls", cli_ls, "list the models in the models folder"},
    {"rm", cli_rm, "delete a model from the models folder"},
    {"search", cli_search, "search the Hugging Face hub for GGUF models"},
    {"seal", cli_seal, "make this machine's cluster secret and print the command that joins others"},
    {"join", cli_join, "join the sealed cluster of a token from `cairn seal`, then run the node"},
    {"runner", runner_main, "serve one instance's layers for a node (started by cairn node)"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: cairn <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv)
{
    /* `cairn` alone is `cairn node` with its defaults: discovery, API and worker all on
     * (a cluster of one until other nodes are heard); `cairn --opt...` passes node options. */
    if (argc < 2 || (argv[1][0] == '-' && strcmp(argv[1], "-h") && strcmp(argv[1], "--help")))
        return cli_node(argc, argv);
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "cairn: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
