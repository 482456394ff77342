#include "ctl/card.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"

void catalog_card_clear(struct catalog_card *card)
{
    if (!card)
        return;
    free(card->path);
    free(card->error);
    free(card->layer_bytes);
    free(card->layer_swa);
    memset(card, 0, sizeof *card);
}

int catalog_card_copy(struct catalog_card *dst, const struct catalog_card *src)
{
    *dst = *src;
    dst->path = dst->error = NULL;
    dst->layer_bytes = NULL;
    dst->layer_swa = NULL;
    if ((src->path && !(dst->path = strdup(src->path))) || (src->error && !(dst->error = strdup(src->error))))
        goto fail;
    if (src->layer_bytes && src->n_layers > 0) {
        dst->layer_bytes = malloc((size_t)src->n_layers * sizeof *dst->layer_bytes);
        if (!dst->layer_bytes)
            goto fail;
        memcpy(dst->layer_bytes, src->layer_bytes, (size_t)src->n_layers * sizeof *dst->layer_bytes);
    }
    if (src->layer_swa && src->n_layers > 0) {
        if (!(dst->layer_swa = malloc((size_t)src->n_layers)))
            goto fail;
        memcpy(dst->layer_swa, src->layer_swa, (size_t)src->n_layers);
    }
    return 0;
fail:
    catalog_card_clear(dst);
    return CAIRN_ENOMEM;
}

static bool put(json_t *o, const char *key, json_t *v)
{
    return v && json_object_set_new(o, key, v) == 0;
}

static int swa_layers(const struct catalog_card *c)
{
    int n = 0;
    for (int l = 0; c->layer_swa && l < c->n_layers; l++)
        n += c->layer_swa[l] != 0;
    return n;
}

json_t *catalog_card_to_json(const struct catalog_card *c)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    bool ok = put(o, "id", json_string(c->id)) && put(o, "file", json_string(c->path ? c->path : "")) &&
              put(o, "bytes", json_integer((json_int_t)c->file_bytes));
    if (ok && c->error) {
        ok = put(o, "error", json_string(c->error));
    } else if (ok) {
        json_t *layers = json_array();
        ok = put(o, "layer_bytes", layers);
        for (int l = 0; ok && l < c->n_layers; l++)
            ok = json_array_append_new(layers, json_integer((json_int_t)c->layer_bytes[l])) == 0;
        ok = ok && put(o, "name", json_string(c->name)) && put(o, "architecture", json_string(c->arch)) &&
             put(o, "model_bytes", json_integer((json_int_t)c->model_bytes)) &&
             put(o, "n_layers", json_integer(c->n_layers)) && put(o, "hidden_size", json_integer(c->n_embd)) &&
             put(o, "feed_forward_size", json_integer(c->n_ff)) && put(o, "n_head", json_integer(c->n_head)) &&
             put(o, "n_head_kv", json_integer(c->n_head_kv)) && put(o, "head_dim", json_integer(c->head_dim)) &&
             put(o, "context_length", json_integer(c->n_ctx)) && put(o, "vocab_size", json_integer(c->n_vocab)) &&
             put(o, "chat_template", json_boolean(c->chat_template)) &&
             put(o, "tied_output", json_boolean(c->tied_output)) &&
             put(o, "embedding_bytes", json_integer((json_int_t)c->embd_bytes)) &&
             put(o, "head_bytes", json_integer((json_int_t)c->head_bytes)) &&
             put(o, "output_norm_bytes", json_integer((json_int_t)c->output_norm_bytes)) &&
             put(o, "other_bytes", json_integer((json_int_t)c->other_bytes)) &&
             put(o, "weight_bytes", json_integer((json_int_t)c->weight_bytes)) &&
             put(o, "active_bytes", json_integer((json_int_t)c->active_bytes)) &&
             put(o, "expert_count", json_integer(c->n_expert)) &&
             put(o, "expert_used_count", json_integer(c->n_expert_used)) &&
             put(o, "expert_feed_forward_size", json_integer(c->n_ff_exp)) &&
             put(o, "kv_bytes_per_token_layer", json_integer((json_int_t)c->kv_bytes_per_token_layer)) &&
             put(o, "pooling", json_string(c->pooling[0] ? c->pooling : "none")) &&
             put(o, "sliding_window", json_integer((json_int_t)c->swa_window)) &&
             put(o, "sliding_window_layers", json_integer(swa_layers(c))) &&
             put(o, "sha256", c->sha256[0] ? json_string(c->sha256) : json_null()) &&
             put(o, "error", json_null());
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int catalog_card_place_model(const struct catalog_card *c, uint32_t ctx_len, uint32_t n_slots,
                             struct place_model *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (c->error)
        return cairn_fail(err, errlen, CAIRN_ESTATE, "model %s is not usable: %s", c->id, c->error);
    if (c->n_layers < 1 || c->n_layers > PLACE_MAX_LAYERS || c->file_bytes > PLACE_BYTES_MAX)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "model %s: %d layers / %llu bytes beyond placement bounds",
                          c->id, c->n_layers, (unsigned long long)c->file_bytes);
    out->id = c->id;
    out->n_layers = (uint32_t)c->n_layers;
    out->layer_bytes_each = c->layer_bytes;
    out->layer_bytes = c->layer_bytes[0];
    out->embed_bytes = c->embd_bytes;
    out->head_bytes = c->tied_output ? 0 : c->head_bytes;
    out->tied = c->tied_output;
    out->norm_bytes = c->output_norm_bytes + c->other_bytes;
    out->kv_bytes_per_token_layer = c->kv_bytes_per_token_layer;
    out->ctx_len = ctx_len ? ctx_len : 1;
    out->n_slots = n_slots ? n_slots : 1;
    out->layer_window = c->layer_swa;
    out->window_positions = (uint64_t)out->ctx_len * out->n_slots; /* the master counts less (master.h) */
    out->n_head = (uint32_t)c->n_head;
    out->n_head_kv = (uint32_t)c->n_head_kv;
    out->n_expert = c->n_expert > 0 ? (uint32_t)c->n_expert : 0;
    return 0;
}
