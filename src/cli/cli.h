/* Sub-commands of the cairn binary. Each takes (argc, argv) with argv[0] = its name
 * and returns the process exit code: 0 ok, 1 failure, 2 bad usage. */
#ifndef CAIRN_CLI_CLI_H
#define CAIRN_CLI_CLI_H

#include <stddef.h>

#include "base/version.h"

/* What a sub-command's option parser returns when the command goes on; otherwise it
 * returns the exit code to end with (0 after --help, 2 on bad usage). */
#define CLI_GO_ON (-1)

int cli_version(int argc, char **argv);
/* cairn tokenize -m MODEL [--ids] [--special] [--no-bos] [--file F | TEXT] [--bench] */
int cli_tokenize(int argc, char **argv);
/* cairn embed -m MODEL [-t N] [--ctx N] [--batch N] [--repeat N] [--no-vectors] (TEXT... | --file F) */
int cli_embed(int argc, char **argv);
int cli_mkmodel(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_bench(int argc, char **argv);
/* The KV cache type named by v for option opt (-ctk/-ctv), or DT_F16 after printing what
 * is wrong and setting a->bad. */
struct args;
int cli_kv_type(struct args *a, const char *opt, const char *v);
/* cairn template (-m MODEL | --template FILE) --messages FILE [--tools FILE] [--add-generation-prompt] [--var NAME=JSON] */
int cli_template(int argc, char **argv);
/* cairn node [--api-port N] [--peer HOST:PORT]... (see its --help); runs until SIGINT/SIGTERM */
int cli_node(int argc, char **argv);
/* cairn node with a join token's secret (kept in the data dir), namespace and peers. */
struct jointoken;
int cli_node_join(int argc, char **argv, const struct jointoken *join);
/* cairn seal [--data-dir DIR] [--namespace NS] [--address HOST:PORT]...: the join command */
int cli_seal(int argc, char **argv);
/* cairn join TOKEN [node options]: keeps the token's secret and runs the node */
int cli_join(int argc, char **argv);
/* cairn pull REF, cairn ls, cairn rm REF: models from the hub in the models folder */
int cli_pull(int argc, char **argv);
int cli_ls(int argc, char **argv);
int cli_rm(int argc, char **argv);
int cli_search(int argc, char **argv);
/* cairn run MODEL [PROMPT...]: a chat with a model of the cluster (see its --help) */
int cli_run(int argc, char **argv);
/* cairn status, ps, stop INSTANCE: the cluster through a node's public API */
int cli_status(int argc, char **argv);
int cli_ps(int argc, char **argv);
int cli_stop(int argc, char **argv);
/* Where a running node's API is, in its data dir: "HOST:PORT" and a newline. */
#define CLI_API_ADDRESS_FILE "api_address"
/* $XDG_DATA_HOME/cairn[/sub], or ~/.local/share/cairn[/sub]; -1 when neither is set. */
int cli_data_path(char *out, size_t n, const char *sub);

#endif
