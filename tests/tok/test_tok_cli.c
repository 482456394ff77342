/* `cairn tokenize` end to end: runs the built binary on the real vocabularies and
 * compares its output and exit codes. (Skipped with a note when the cairn binary has not
 * been built, as when only the tok targets were.) */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char out[1 << 16];

/* Runs a shell command, captures stdout+stderr into out; returns the exit code. */
static int run(const char *fmt, const char *a, const char *b)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, CAIRN_BINARY, a, b);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void)
{
    if (access(CAIRN_BINARY, X_OK) != 0) {
        printf("skipped: %s not built\n", CAIRN_BINARY);
        return test_main_end();
    }
    char qwen[512], spm[512];
    snprintf(qwen, sizeof qwen, "%s", test_data_path("vocab/ggml-vocab-qwen2.gguf"));
    snprintf(spm, sizeof spm, "%s", test_data_path("vocab/ggml-vocab-llama-spm.gguf"));

    int rc = run("%s tokenize -m '%s' '%s' 2>&1", qwen, "Hello world");
    CHECK(rc == 0 && !strcmp(out, "9707\t'Hello'\n1879\t' world'\n"), "pieces: rc %d '%s'", rc, out);
    rc = run("%s tokenize -m '%s' --ids '%s' 2>&1", qwen, "Hello world");
    CHECK(rc == 0 && !strcmp(out, "9707 1879\n"), "--ids: rc %d '%s'", rc, out);
    rc = run("%s tokenize -m '%s' --ids --special '%s' 2>&1", qwen, "<|im_start|>");
    CHECK(rc == 0 && !strcmp(out, "151644\n"), "--special: rc %d '%s'", rc, out);
    rc = run("%s tokenize -m '%s' --ids '%s' 2>&1", qwen, "<|im_start|>");
    CHECK(rc == 0 && !strstr(out, "151644"), "control token parsed without --special: '%s'", out);
    rc = run("%s tokenize -m '%s' '%s' --special 2>&1", qwen, "<|im_end|>");
    CHECK(rc == 0 && !strcmp(out, "151645\t'<|im_end|>'\n"), "special piece: rc %d '%s'", rc, out);

    rc = run("%s tokenize -m '%s' --ids '%s' 2>&1", spm, "Hello");
    CHECK(rc == 0 && !strcmp(out, "1 15043\n"), "SPM adds BOS: rc %d '%s'", rc, out);
    rc = run("%s tokenize -m '%s' --no-bos --ids '%s' 2>&1", spm, "Hello");
    CHECK(rc == 0 && !strcmp(out, "15043\n"), "--no-bos: rc %d '%s'", rc, out);

    char path[] = "/tmp/cairn_tok_cli_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        CHECK(write(fd, "Hello world", 11) == 11, "write");
        close(fd);
        rc = run("%s tokenize -m '%s' --ids --file '%s' 2>&1", qwen, path);
        CHECK(rc == 0 && !strcmp(out, "9707 1879\n"), "--file: rc %d '%s'", rc, out);
        unlink(path);
    }

    rc = run("%s tokenize -m '%s' '%s' 2>&1", "/nonexistent/model.gguf", "x");
    CHECK(rc == 1 && strstr(out, "cannot open model '/nonexistent/model.gguf'"), "bad model: rc %d '%s'", rc, out);
    rc = run("%s tokenize %s%s 2>&1", "", "x");
    CHECK(rc == 2 && strstr(out, "no model"), "no -m: rc %d '%s'", rc, out);
    rc = run("%s tokenize -m '%s' --bogus%s 2>&1", qwen, "");
    CHECK(rc == 2, "unknown option: rc %d", rc);
    return test_main_end();
}
