/* Model cards: what the control plane knows of a model (its size per layer, shape and
 * identity), read by the node's catalog from a GGUF file's own metadata
 * (node/catalog.h) and used by the master to place instances (ctl/master.h). */
#ifndef CAIRN_CTL_CARD_H
#define CAIRN_CTL_CARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "ctl/place.h"
#include "proto/ids.h"

#define CATALOG_SHA256_HEX 65  /* 64 hex digits and the NUL */

/* One file of the catalog. With error set, only id, path, file_bytes and mtime_ns are
 * meaningful; the other fields are zero. */
struct catalog_card {
    char id[IDS_MODEL_MAX + 1];
    char *path;                 /* malloc'd: folder + "/" + file name */
    char *error;                /* malloc'd; NULL for a usable file */
    uint64_t file_bytes;        /* of the file (a split model's first part: what the card cache keys on) */
    uint64_t model_bytes;       /* of every part of the model (the file's, unless split) */
    int64_t mtime_ns;           /* modification time, ns since the epoch */
    char name[IDS_NAME_MAX + 1]; /* general.name (control bytes dropped) or "" */
    char arch[32];              /* general.architecture */
    int n_layers, n_embd, n_ff, n_head, n_head_kv, head_dim, n_vocab;
    int64_t n_ctx;              /* trained context length */
    bool chat_template;         /* tokenizer.chat_template present and not empty */
    bool tied_output;           /* no output.weight: the head is token_embd */
    uint64_t *layer_bytes;      /* n_layers entries, malloc'd: sum of blk.N.* tensor sizes */
    uint64_t embd_bytes;        /* token_embd.weight */
    uint64_t head_bytes;        /* output.weight, or token_embd.weight when tied */
    uint64_t output_norm_bytes; /* output_norm.weight */
    uint64_t other_bytes;       /* every other tensor (rope_freqs.weight ...) */
    uint64_t weight_bytes;      /* all tensors of the file once (a tied head counted once): what
                                   memory placement counts */
    int n_expert, n_expert_used, n_ff_exp; /* a mixture of experts, or 0 */
    uint64_t active_bytes;      /* of those, what one token reads: weight_bytes less the experts
                                   it does not use (n_expert - n_expert_used of n_expert of
                                   every blk.N.*_exps.* tensor); weight_bytes when dense. For
                                   speed estimates (decode reads this per token) */
    uint64_t kv_bytes_per_token_layer; /* F16 K and V: 2 * n_head_kv * head_dim * 2 */
    char pooling[8];            /* <arch>.pooling_type's name: "none" (a generative model),
                                   "mean", "cls", "last" (an embedding model) or "rank" */
    int64_t swa_window;         /* sliding-window layers' window (gemma3, gpt-oss), or 0 */
    uint8_t *layer_swa;         /* n_layers flags, malloc'd: 1 for a sliding-window layer; NULL
                                   when none slides */
    char sha256[CATALOG_SHA256_HEX]; /* lowercase hex, "" until computed */
};

/* Frees what a card owns and zeroes it; accepts a zeroed card. */
void catalog_card_clear(struct catalog_card *card);

/* Makes dst an independent deep copy of src (dst is overwritten, not freed); CAIRN_ENOMEM
 * leaves dst zeroed. */
int catalog_card_copy(struct catalog_card *dst, const struct catalog_card *src);

/* New JSON object of a card for GET /models, NULL when out of memory:
 *   {"id", "file", "bytes", "name", "architecture", "n_layers", "hidden_size",
 *    "feed_forward_size", "n_head", "n_head_kv", "head_dim", "context_length",
 *    "vocab_size", "chat_template", "tied_output", "layer_bytes": [..],
 *    "embedding_bytes", "head_bytes", "output_norm_bytes", "other_bytes",
 *    "weight_bytes", "active_bytes", "expert_count", "expert_used_count",
 *    "expert_feed_forward_size", "kv_bytes_per_token_layer", "pooling", "sliding_window",
 *    "sliding_window_layers", "model_bytes", "sha256": hex|null,
 *    "error": null}
 * and for an unusable file {"id", "file", "bytes", "error": text}. */
json_t *catalog_card_to_json(const struct catalog_card *card);

/* Fills the model part of a placement request from a usable card (id points into the
 * card); ctx_len and n_slots as given. CAIRN_ESTATE for a card with an error,
 * CAIRN_ERANGE when a count is beyond place.h's bounds. */
int catalog_card_place_model(const struct catalog_card *card, uint32_t ctx_len, uint32_t n_slots,
                             struct place_model *out, char *err, size_t errlen);

#endif
