/* The built-in catalog: cards of popular instruct models of the architectures cairn runs
 * (repo on the hub, shape, context, licence), to choose from before anything is
 * downloaded, searchable by words of their name, repo or architecture. Each card offers
 * the usual quantizations as hub references with estimated sizes (approx_bytes: the
 * parameter count times the mix's bits per weight); the exact bytes are the hub's, read
 * at pull time or from the header by /instance/previews. */
#ifndef CAIRN_NODE_CARDS_H
#define CAIRN_NODE_CARDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct card {
    const char *name, *repo, *arch;
    double params_b;     /* billions of parameters */
    int n_layers, n_embd;
    int64_t n_ctx;       /* trained context */
    const char *license;
    bool gated;          /* the repo wants HF_TOKEN */
};

size_t cards_count(void);
const struct card *cards_at(size_t i);

/* {"name", "repo", "arch", "params_b", "n_layers", "hidden_size", "context_length",
 *  "license", "gated", "quants": [{"tag", "ref", "approx_bytes"}]}; NULL when out of memory. */
json_t *card_to_json(const struct card *c);

/* New JSON array of the cards matching every word of q (NULL or "": all), at most limit,
 * in catalog order; NULL when out of memory. */
json_t *cards_search(const char *q, size_t limit);

#endif
