/* Commands: wire JSON round trips and refusals naming the field; API requests with their
 * defaults; results. */
#include "ctl/command.h"

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "testutil.h"

static char err[1024];

/* Encodes c, decodes the text and checks the second encoding is the same text. */
static void round_trip(const struct command *c)
{
    char *a = command_to_json(c);
    CHECK(a != NULL, "%s does not encode", command_kind_name((int)c->kind));
    if (!a)
        return;
    struct command back;
    int rc = command_from_json(a, strlen(a), &back, err, sizeof err);
    CHECK(rc == 0, "%s does not decode: %s", a, err);
    char *b = rc ? NULL : command_to_json(&back);
    CHECK(b && !strcmp(a, b), "round trip differs:\n%s\n%s", a, b ? b : "(null)");
    command_clear(&back);
    free(a);
    free(b);
}

/* Decoding text must fail with code, and the message must name `field`. */
static void refused(const char *text, int code, const char *field)
{
    struct command c;
    int rc = command_from_json(text, strlen(text), &c, err, sizeof err);
    CHECK(rc == code && strstr(err, field), "%s: rc %d (want %d), message '%s' should name '%s'",
          text, rc, code, err, field);
    CHECK(c.kind == 0 && c.id[0] == 0, "a refused command is zeroed");
}

static void test_wire(void)
{
    struct command c;
    char *text;
    command_init(&c, COMMAND_PLACE_INSTANCE);
    strcpy(c.id, "cmd.1");
    strcpy(c.place_instance.model_id, "org/model@q4+x");
    c.place_instance.sharding = CLUSTER_SHARDING_TENSOR;
    c.place_instance.min_nodes = 3;
    strcpy(c.place_instance.draft_model, "draft-1");
    c.place_instance.num_draft_tokens = 7;
    round_trip(&c);
    c.place_instance.kv.ctx_len = 32768;
    strcpy(c.place_instance.kv.type_v, "q4_0");
    round_trip(&c);
    text = command_to_json(&c);
    CHECK(text && strstr(text, "\"ctx_len\":32768") && strstr(text, "\"cache_type_v\":\"q4_0\"") &&
              !strstr(text, "cache_type_k"),
          "the KV cache asked for travels, defaults left out: %s", text);
    free(text);
    c.place_instance.kv = (struct cluster_kv){0};
    text = command_to_json(&c);
    CHECK(text && strstr(text, "\"kind\":\"PlaceInstance\"") && strstr(text, "\"min_nodes\":3") &&
              strstr(text, "\"sharding\":\"tensor\""),
          "PlaceInstance JSON: %s", text);
    free(text);
    c.place_instance.draft_model[0] = 0;
    text = command_to_json(&c);
    CHECK(text && strstr(text, "\"draft_model\":null"), "no draft is null: %s", text);
    free(text);
    /* "auto" travels as such: the master picks the sharding */
    c.place_instance.sharding = CLUSTER_SHARDING_PIPELINE;
    c.place_instance.sharding_auto = true;
    round_trip(&c);
    text = command_to_json(&c);
    CHECK(text && strstr(text, "\"sharding\":\"auto\""), "auto sharding: %s", text);
    free(text);
    command_clear(&c);

    command_init(&c, COMMAND_DELETE_INSTANCE);
    strcpy(c.id, "cmd.2");
    strcpy(c.delete_instance.instance_id, "inst-1");
    round_trip(&c);
    command_clear(&c);

    command_init(&c, COMMAND_SET_INSTANCE_DRAFT_MODEL);
    strcpy(c.id, "cmd.3");
    strcpy(c.set_draft_model.instance_id, "inst-1");
    c.set_draft_model.num_draft_tokens = 0;
    round_trip(&c);
    command_clear(&c);

    command_init(&c, COMMAND_CREATE_INSTANCE);
    strcpy(c.id, "cmd.4");
    struct cluster_instance *in = &c.create_instance;
    strcpy(in->id, "inst-2");
    strcpy(in->model_id, "m1");
    in->n_shards = 2;
    in->shards = calloc(2, sizeof *in->shards);
    for (int i = 0; i < 2; i++) {
        snprintf(in->shards[i].node_id, sizeof in->shards[i].node_id, "node%d", i);
        snprintf(in->shards[i].runner_id, sizeof in->shards[i].runner_id, "r%d", i);
        in->shards[i].rank = i;
        in->shards[i].world_size = 2;
        in->shards[i].layer_begin = i * 3;
        in->shards[i].layer_end = i * 3 + 3;
    }
    in->epoch = 1;
    round_trip(&c);
    in->kv.ctx_len = 8192;
    strcpy(in->kv.type_k, "q8_0");
    round_trip(&c);
    command_clear(&c);
    CHECK(c.create_instance.shards == NULL, "clear frees and zeroes");

    command_init(&c, (enum command_kind)99);
    CHECK(command_to_jsonv(&c) == NULL, "an unknown kind does not encode");
    CHECK(command_kind_name(COMMAND_KIND_COUNT) == NULL && command_kind_name(-1) == NULL,
          "names out of range are NULL");

    const char *good = "{\"kind\":\"PlaceInstance\",\"command_id\":\"c1\",\"model_id\":\"m\","
                       "\"sharding\":\"pipeline\",\"min_nodes\":1,\"draft_model\":null,"
                       "\"num_draft_tokens\":4}";
    CHECK(command_from_json(good, strlen(good), &c, err, sizeof err) == 0, "good: %s", err);
    command_clear(&c);
    refused("[1]", CAIRN_EFORMAT, "command");
    refused("{\"kind\":\"Fly\",\"command_id\":\"c1\"}", CAIRN_EFORMAT, "kind");
    refused("{\"kind\":\"DeleteInstance\",\"command_id\":\"c1\"}", CAIRN_EFORMAT,
            "DeleteInstance.instance_id");
    refused("{\"kind\":\"DeleteInstance\",\"command_id\":\"c1\",\"instance_id\":\"a/b\"}",
            CAIRN_EFORMAT, "instance_id");
    refused("{\"kind\":\"DeleteInstance\",\"command_id\":\"\",\"instance_id\":\"a\"}",
            CAIRN_EFORMAT, "command_id");
    refused("{\"kind\":\"DeleteInstance\",\"command_id\":\"c\",\"instance_id\":\"a\",\"x\":1}",
            CAIRN_EFORMAT, "x");
    refused("{\"kind\":\"PlaceInstance\",\"command_id\":\"c1\",\"model_id\":\"m\","
            "\"sharding\":\"pipeline\",\"min_nodes\":0,\"draft_model\":null,\"num_draft_tokens\":4}",
            CAIRN_EFORMAT, "min_nodes");
    refused("{\"kind\":\"PlaceInstance\",\"command_id\":\"c1\",\"model_id\":\"m\","
            "\"sharding\":\"ring\",\"min_nodes\":1,\"draft_model\":null,\"num_draft_tokens\":4}",
            CAIRN_EFORMAT, "sharding");
    refused("{\"kind\":\"PlaceInstance\",\"command_id\":\"c1\",\"model_id\":\"m m\","
            "\"sharding\":\"pipeline\",\"min_nodes\":1,\"draft_model\":null,\"num_draft_tokens\":4}",
            CAIRN_EFORMAT, "model_id");
    refused("{\"kind\":\"PlaceInstance\",\"command_id\":\"c1\",\"model_id\":\"m\","
            "\"sharding\":\"pipeline\",\"min_nodes\":1,\"draft_model\":null,\"num_draft_tokens\":4,"
            "\"cache_type_k\":\"q5_1\"}",
            CAIRN_EFORMAT, "cache_type_k");
    refused("{\"kind\":\"PlaceInstance\",\"command_id\":\"c1\",\"model_id\":\"m\","
            "\"sharding\":\"pipeline\",\"min_nodes\":1,\"draft_model\":null,\"num_draft_tokens\":4,"
            "\"ctx_len\":0}",
            CAIRN_EFORMAT, "ctx_len");
    refused("{\"kind\":\"SetInstanceDraftModel\",\"command_id\":\"c1\",\"instance_id\":\"i\","
            "\"draft_model\":null,\"num_draft_tokens\":257}",
            CAIRN_EFORMAT, "num_draft_tokens");
    refused("{\"kind\":\"CreateInstance\",\"command_id\":\"c1\",\"instance\":{}}", CAIRN_EFORMAT,
            "CreateInstance.instance");
    refused("{\"kind\":\"DeleteInstance\",\"command_id\":\"c1\",\"instance_id\":\"a\","
            "\"instance_id\":\"b\"}",
            CAIRN_EFORMAT, "duplicate");
}

/* A request must fail with EFORMAT and a message naming field. */
static void bad_request(enum command_kind kind, const char *body, const char *id,
                        const char *field)
{
    struct command c;
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    int rc = command_from_request(kind, j, id, &c, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, field), "%s %s: rc %d, message '%s' should name '%s'",
          command_kind_name((int)kind), body ? body : "(no body)", rc, err, field);
    json_decref(j);
}

static int from_request(enum command_kind kind, const char *body, const char *id,
                        struct command *c)
{
    json_t *j = body ? json_loads(body, 0, NULL) : NULL;
    int rc = command_from_request(kind, j, id, c, err, sizeof err);
    json_decref(j);
    CHECK(rc == 0, "%s %s: %s", command_kind_name((int)kind), body ? body : "", err);
    return rc;
}

static void test_requests(void)
{
    struct command c;
    if (!from_request(COMMAND_PLACE_INSTANCE, "{\"model_id\":\"m1\"}", NULL, &c)) {
        CHECK(!strcmp(c.place_instance.model_id, "m1") &&
                  c.place_instance.sharding == CLUSTER_SHARDING_PIPELINE &&
                  c.place_instance.min_nodes == 1 && c.place_instance.draft_model[0] == 0 &&
                  c.place_instance.num_draft_tokens == COMMAND_DEFAULT_DRAFT_TOKENS &&
                  c.id[0] == 0,
              "defaults: sharding %d min_nodes %d draft '%s' tokens %d", c.place_instance.sharding,
              c.place_instance.min_nodes, c.place_instance.draft_model,
              c.place_instance.num_draft_tokens);
        command_clear(&c);
    }
    if (!from_request(COMMAND_PLACE_INSTANCE, "{\"model_id\":\"m1\",\"sharding\":\"auto\"}", NULL, &c)) {
        CHECK(c.place_instance.sharding_auto, "sharding auto");
        command_clear(&c);
    }
    if (!from_request(COMMAND_PLACE_INSTANCE,
                      "{\"model_id\":\"m1\",\"sharding\":\"tensor\",\"min_nodes\":2,"
                      "\"draft_model\":\"d\",\"num_draft_tokens\":8,\"instance_meta\":\"MlxRing\"}",
                      NULL, &c)) {
        CHECK(c.place_instance.sharding == CLUSTER_SHARDING_TENSOR &&
                  c.place_instance.min_nodes == 2 && !strcmp(c.place_instance.draft_model, "d") &&
                  c.place_instance.num_draft_tokens == 8,
              "given fields kept");
        command_clear(&c);
    }
    bad_request(COMMAND_PLACE_INSTANCE, "{}", NULL, "model_id");
    bad_request(COMMAND_PLACE_INSTANCE, "{\"model_id\":3}", NULL, "model_id");
    bad_request(COMMAND_PLACE_INSTANCE, "{\"model_id\":\"m\",\"min_nodes\":\"2\"}", NULL,
                "min_nodes");
    bad_request(COMMAND_PLACE_INSTANCE, "{\"model_id\":\"m\",\"min_nodes\":1000}", NULL,
                "min_nodes");
    bad_request(COMMAND_PLACE_INSTANCE, "{\"model_id\":\"m\",\"sharding\":\"ring\"}", NULL,
                "sharding");
    bad_request(COMMAND_PLACE_INSTANCE, "{\"model_id\":\"m\",\"draft\":\"d\"}", NULL, "draft");
    bad_request(COMMAND_PLACE_INSTANCE, "[]", NULL, "body");
    bad_request(COMMAND_PLACE_INSTANCE, NULL, NULL, "body");

    const char *two = "{\"model_id\":\"m1\",\"shards\":[{\"node_id\":\"a\",\"layer_begin\":0,"
                      "\"layer_end\":3},{\"node_id\":\"b\",\"layer_begin\":3,\"layer_end\":6}]}";
    if (!from_request(COMMAND_CREATE_INSTANCE, two, NULL, &c)) {
        const struct cluster_instance *in = &c.create_instance;
        CHECK(in->id[0] && in->n_shards == 2 && in->shards[0].runner_id[0] &&
                  strcmp(in->shards[0].runner_id, in->shards[1].runner_id) &&
                  in->shards[1].rank == 1 && in->shards[0].world_size == 2 &&
                  in->sharding == CLUSTER_SHARDING_PIPELINE && in->epoch == 1 &&
                  in->num_draft_tokens == COMMAND_DEFAULT_DRAFT_TOKENS,
              "ids, ranks and world sizes filled in: id '%s' shards %zu", in->id, in->n_shards);
        command_clear(&c);
    }
    char wrapped[512];
    snprintf(wrapped, sizeof wrapped, "{\"instance\":%s}", two);
    if (!from_request(COMMAND_CREATE_INSTANCE, wrapped, NULL, &c)) {
        CHECK(c.create_instance.n_shards == 2, "wrapped instance read");
        command_clear(&c);
    }
    const char *with_kv = "{\"model_id\":\"m1\",\"ctx_len\":2048,\"cache_type_k\":\"Q8_0\",\"shards\":"
                          "[{\"node_id\":\"a\",\"layer_begin\":0,\"layer_end\":3}]}";
    if (!from_request(COMMAND_CREATE_INSTANCE, with_kv, NULL, &c)) {
        CHECK(c.create_instance.kv.ctx_len == 2048 && !strcmp(c.create_instance.kv.type_k, "q8_0") &&
                  !c.create_instance.kv.type_v[0],
              "an explicit instance's KV cache read");
        command_clear(&c);
    }
    bad_request(COMMAND_CREATE_INSTANCE,
                "{\"model_id\":\"m1\",\"cache_type_v\":\"q6_k\",\"shards\":[{\"node_id\":\"a\",\"layer_begin\":0,"
                "\"layer_end\":3}]}",
                NULL, "cache_type_v");
    if (!from_request(COMMAND_CREATE_INSTANCE,
                      "{\"instance_id\":\"mine\",\"model_id\":\"m1\",\"shards\":[{\"node_id\":\"a\","
                      "\"runner_id\":\"r1\",\"layer_begin\":0,\"layer_end\":6}]}",
                      NULL, &c)) {
        CHECK(!strcmp(c.create_instance.id, "mine") &&
                  !strcmp(c.create_instance.shards[0].runner_id, "r1"),
              "given ids kept");
        command_clear(&c);
    }
    bad_request(COMMAND_CREATE_INSTANCE,
                "{\"model_id\":\"m1\",\"shards\":[{\"node_id\":\"a\",\"layer_begin\":0,"
                "\"layer_end\":3},{\"node_id\":\"b\",\"layer_begin\":2,\"layer_end\":6}]}",
                NULL, "instance.shards[1].layer_begin");
    bad_request(COMMAND_CREATE_INSTANCE,
                "{\"model_id\":\"m1\",\"shards\":[{\"node_id\":\"a\",\"layer_begin\":0,"
                "\"layer_end\":3},{\"node_id\":\"a\",\"layer_begin\":3,\"layer_end\":6}]}",
                NULL, "instance.shards[1].node_id");
    bad_request(COMMAND_CREATE_INSTANCE, "{\"model_id\":\"m1\",\"shards\":[]}", NULL,
                "instance.shards");
    bad_request(COMMAND_CREATE_INSTANCE,
                "{\"model_id\":\"m1\",\"shards\":[{\"node_id\":\"a\",\"layer_end\":3,\"gpu\":1}]}",
                NULL, "gpu");
    bad_request(COMMAND_CREATE_INSTANCE, "{\"instance\":{\"model_id\":\"m1\"},\"x\":1}", NULL, "x");
    bad_request(COMMAND_CREATE_INSTANCE, "{\"model_id\":\"m1\"}", NULL, "instance.shards");

    if (!from_request(COMMAND_DELETE_INSTANCE, NULL, "inst-1", &c)) {
        CHECK(!strcmp(c.delete_instance.instance_id, "inst-1"), "delete id from the path");
        command_clear(&c);
    }
    bad_request(COMMAND_DELETE_INSTANCE, NULL, "a b", "instance_id");
    bad_request(COMMAND_DELETE_INSTANCE, NULL, NULL, "instance_id");

    if (!from_request(COMMAND_SET_INSTANCE_DRAFT_MODEL, "{\"draft_model\":null}", "i1", &c)) {
        CHECK(c.set_draft_model.draft_model[0] == 0 && !strcmp(c.set_draft_model.instance_id, "i1"),
              "null draft");
        command_clear(&c);
    }
    if (!from_request(COMMAND_SET_INSTANCE_DRAFT_MODEL,
                      "{\"draft_model\":\"d1\",\"num_draft_tokens\":6}", "i1", &c)) {
        CHECK(!strcmp(c.set_draft_model.draft_model, "d1") &&
                  c.set_draft_model.num_draft_tokens == 6,
              "draft set");
        command_clear(&c);
    }
    bad_request(COMMAND_SET_INSTANCE_DRAFT_MODEL, "{}", "i1", "draft_model");
    bad_request(COMMAND_SET_INSTANCE_DRAFT_MODEL, "{\"draft_model\":\"d\",\"num_draft_tokens\":-1}",
                "i1", "num_draft_tokens");
    bad_request(COMMAND_SET_INSTANCE_DRAFT_MODEL, "{\"draft_model\":\"d\",\"instance_id\":\"x\"}",
                "i1", "instance_id");
}

static void test_results(void)
{
    struct command_result r, back;
    memset(&r, 0, sizeof r);
    strcpy(r.command_id, "c.9");
    r.code = CAIRN_EFULL;
    strcpy(r.message, "no placement fits: \"quoted\" \xc3\xa9");
    r.term = 3;
    r.index = 17;
    json_t *j = command_result_to_jsonv(&r);
    CHECK(j != NULL, "result encodes");
    int rc = command_result_from_jsonv(j, &back, err, sizeof err);
    CHECK(rc == 0 && back.code == r.code && !strcmp(back.message, r.message) &&
              back.instance_id[0] == 0 && back.term == 3 && back.index == 17,
          "result round trip: %s", err);
    json_object_set_new(j, "code", json_integer(5));
    rc = command_result_from_jsonv(j, &back, err, sizeof err);
    CHECK(rc == CAIRN_EFORMAT && strstr(err, "code"), "a positive code is refused: %s", err);
    json_decref(j);
    strcpy(r.message, "bad \xff byte");
    j = command_result_to_jsonv(&r);
    CHECK(j && json_is_string(json_object_get(j, "message")), "a message that is not UTF-8 still encodes");
    json_decref(j);
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    RUN(test_wire);
    RUN(test_requests);
    RUN(test_results);
    return test_main_end();
}
