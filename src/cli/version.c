#include "base/cpu.h"
#include "cli/cli.h"

#include <stdio.h>

int cli_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    char feats[256];
    const struct cpu_features *f = cpu_features();
    cpu_features_string(f, feats, sizeof feats);
    printf("cairn %s\ncpu: %s\nfeatures: %s\n", CAIRN_VERSION, f->model, feats);
    return 0;
}
