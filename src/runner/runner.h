/* The runner process (DESIGN.md, "The system in one picture"): one per (instance, node),
 * started by the node's supervisor (node/supervisor.h), speaking proto/runner_proto.h on
 * fd 3, serving the layers of its shard with the engine. */
#ifndef CAIRN_RUNNER_RUNNER_H
#define CAIRN_RUNNER_RUNNER_H

/* cairn runner --config JSON|- (or -m MODEL ...): runs until told to shut down or its
 * node goes away; returns the process exit code (0 ok, 1 failure, 2 bad usage). */
int runner_main(int argc, char **argv);

#endif
