/* The built-in catalog: every card's repo is a hub reference that parses, and each
 * quantization's reference is canonical (what a pull names the model); search matches
 * every word, in any case, and nothing else; sizes grow with the bits of the mix. */
#include "base/err.h"
#include "node/cards.h"
#include "node/hubref.h"
#include "testutil.h"

#include <stdio.h>
#include <string.h>

static size_t count(const char *q)
{
    json_t *a = cards_search(q, 1000);
    size_t n = json_array_size(a);
    json_decref(a);
    return n;
}

int main(void)
{
    CHECK(cards_count() >= 10, "%zu cards", cards_count());
    for (size_t i = 0; i < cards_count(); i++) {
        const struct card *c = cards_at(i);
        struct hub_ref r;
        char err[256];
        CHECK(hubref_parse(c->repo, &r, err, sizeof err) == 0, "%s: %s", c->repo, err);
        CHECK(c->n_layers > 0 && c->n_layers <= 200 && c->params_b > 0 && c->n_ctx >= 2048, "%s: shape", c->name);
        json_t *j = card_to_json(c), *q;
        size_t k;
        json_int_t last = 0;
        json_array_foreach(json_object_get(j, "quants"), k, q) {
            const char *ref = json_string_value(json_object_get(q, "ref"));
            char canon[HUBREF_TEXT_MAX];
            CHECK(ref && hubref_canonical(ref, canon) && !strcmp(canon, ref), "%s: not canonical", ref);
            json_int_t b = json_integer_value(json_object_get(q, "approx_bytes"));
            CHECK(b > last, "%s: %lld bytes after %lld", ref, (long long)b, (long long)last);
            last = b;
        }
        json_decref(j);
    }
    CHECK(cards_at(cards_count()) == NULL, "past the end");
    CHECK(count(NULL) == cards_count() && count("") == cards_count(), "no words: every card");
    CHECK(count("QWEN3 8b") == 1, "qwen3 8b: %zu", count("QWEN3 8b"));
    CHECK(count("llama") >= 4 && count("llama 70B") == 1, "llama: %zu", count("llama"));
    CHECK(count("qwen2") > 0 && count("qwen2 coder") == 2, "architecture words");
    CHECK(count("mamba") == 0 && count("llama qwen") == 0, "words that no card holds all of");
    json_t *two = cards_search("qwen", 2);
    CHECK(json_array_size(two) == 2, "limit");
    json_decref(two);
    return test_main_end();
}
