/* libFuzzer harness of what travels between a node and its runners, on arbitrary bytes:
 * the input goes through a pipe and is split by runner_lines (the lines and the
 * unfinished rest must give the input back), then each line is decoded as a runner
 * message (proto/runner_proto.c), a task line (proto/taskmsg.c), a runner config and a
 * task body (node/taskbody.c). A refusal must name its cause; an accepted message must
 * encode, and its encoding decode to the same encoding; an accepted task body is held
 * once, refused to another node than its sender, and given back equal to its params to
 * the sender (also after taskbody_encode). Built and run by tests/fuzz/run.sh. */
#include "base/err.h"
#include "node/taskbody.h"
#include "proto/runner_proto.h"
#include "proto/taskmsg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c)                                                        \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "fuzz_runner: %s:%d: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                    \
        }                                                               \
    } while (0)

static char err[1024];

static bool accepted(int rc)
{
    if (rc)
        CHECK((rc == CAIRN_EFORMAT || rc == CAIRN_ENOMEM) && err[0]);
    err[0] = 0;
    return rc == 0;
}

static char *msg_text(const char *line, size_t len)
{
    struct runner_msg m;
    int rc = runner_msg_decode(line, len, &m, err, sizeof err);
    size_t n;
    char *out = accepted(rc) ? runner_msg_encode(&m, &n) : NULL;
    CHECK(rc || (out && n == strlen(out) && out[n - 1] == '\n'));
    runner_msg_clear(&m);
    return out;
}

static char *dump(json_t *j)
{
    char *out = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    CHECK(out);
    json_decref(j);
    return out;
}

static char *task_text(const char *line, size_t len)
{
    struct task_msg m;
    if (!accepted(task_msg_decode(line, len, &m, err, sizeof err)))
        return NULL;
    char *out = dump(task_msg_to_json(&m));
    task_msg_clear(&m);
    return out;
}

static char *config_text(const char *line, size_t len)
{
    struct runner_config c;
    if (!accepted(runner_config_parse(line, len, &c, err, sizeof err)))
        return NULL;
    return dump(runner_config_to_json(&c));
}

/* decode -> encode -> decode -> encode gives the first encoding again. */
static void stable(char *(*fn)(const char *, size_t), const char *line, size_t len)
{
    char *once = fn(line, len), *twice = once ? fn(once, strlen(once)) : NULL;
    if (once && (!twice || strcmp(once, twice)))
        fprintf(stderr, "%s\n%s\n", once, twice ? twice : err);
    CHECK(!once || (twice && !strcmp(once, twice)));
    free(once);
    free(twice);
}

static void task_body(const char *line, size_t len)
{
    struct taskbody_store *s = taskbody_create();
    json_t *got, *j = json_loadb(line, len, 0, NULL), *params = json_object_get(j, "params");
    const char *id = json_string_value(json_object_get(j, "task_id"));
    char *msg;
    size_t n;
    int64_t bytes;
    if (accepted(taskbody_put(s, "n1", line, len, 1000, err, sizeof err))) {
        CHECK(j && id && json_is_object(params));
        CHECK(taskbody_put(s, "n1", line, len, 1000, err, sizeof err) == CAIRN_ESTATE && err[0]);
        CHECK(taskbody_take(s, id, "n2", &got, err, sizeof err) == CAIRN_EINVAL && !got && err[0]);
        CHECK(taskbody_count(s) == 0 && taskbody_put(s, "n1", line, len, 2000, err, sizeof err) == 0);
        CHECK(taskbody_take(s, id, "n1", &got, err, sizeof err) == 0 && json_equal(got, params));
        json_decref(got);
        CHECK(taskbody_encode(id, params, &msg, &n, &bytes, err, sizeof err) == 0 && n == strlen(msg));
        CHECK(taskbody_put(s, "n3", msg, n, 3000, err, sizeof err) == 0 && taskbody_count(s) == 1);
        CHECK(taskbody_take(s, id, "n3", &got, err, sizeof err) == 0 && json_equal(got, params));
        json_decref(got);
        CHECK(taskbody_take(s, id, "n3", &got, err, sizeof err) == CAIRN_ENOTFOUND && !got);
        free(msg);
    }
    json_decref(j);
    taskbody_release(s);
}

static void decode_line(const char *line, size_t len)
{
    stable(msg_text, line, len);
    stable(task_text, line, len);
    stable(config_text, line, len);
    task_body(line, len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd[2];
    if (size > 32768 || pipe(fd))
        return 0;
    CHECK(write(fd[1], data, size) == (ssize_t)size);
    close(fd[1]);
    struct runner_lines r = {0};
    const char *line;
    size_t len, at = 0;
    int rc;
    for (;;) {
        while ((rc = runner_lines_next(&r, &line, &len)) == 1) {
            CHECK(at + len < size && !memcmp(line, data + at, len) && data[at + len] == '\n');
            at += len + 1;
            decode_line(line, len);
        }
        CHECK(rc == 0);
        if ((rc = runner_lines_fill(&r, fd[0])) == RUNNER_LINES_EOF)
            break;
        CHECK(rc == RUNNER_LINES_DATA);
    }
    CHECK(at + r.len == size && !memcmp(r.buf + r.start, data + at, r.len));
    if (r.len) /* the unfinished last line */
        decode_line(r.buf + r.start, r.len);
    runner_lines_free(&r);
    close(fd[0]);
    return 0;
}
