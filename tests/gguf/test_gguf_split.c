/* Models split by gguf-split (gguf/gguf.h): a file written as 3 parts opens from its
 * first part with every tensor, byte for byte, its key/values, the bytes of all parts,
 * and each tensor's file and offset (read back with pread); a missing part, a later part
 * opened alone, a first part with another name, a part of another split, a tensor count
 * that does not add up and a tensor in two parts are refused, naming the file. */
#include "base/dtype.h"
#include "base/err.h"
#include "gguf/gguf.h"
#include "testutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NT 7
static char dir[256];
static float data[NT][32];

/* A file of NT small F32 tensors with distinct values, and two key/values. */
static void write_source(const char *path)
{
    struct gguf_writer *w = NULL;
    CHECK(gguf_writer_create(&w) == 0, "writer");
    gguf_writer_set_str(w, "general.architecture", "llama", 5);
    gguf_writer_set_u32(w, "llama.block_count", 3);
    for (int i = 0; i < NT; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d.weight", i);
        for (int k = 0; k < 32; k++)
            data[i][k] = (float)(i * 100 + k);
        int64_t ne[4] = {32, 1, 1, 1};
        CHECK(gguf_writer_add_tensor(w, name, DT_F32, 1, ne, data[i], NULL, NULL) == 0, "add %s", name);
    }
    char err[256];
    CHECK(gguf_writer_write(w, path, err, sizeof err) == 0, "write: %s", err);
    gguf_writer_release(w);
}

static uint64_t size_of(const char *path)
{
    struct stat st;
    return stat(path, &st) ? 0 : (uint64_t)st.st_size;
}

static void test_open_split(void)
{
    char src[300], stem[300], p1[320], err[512];
    snprintf(src, sizeof src, "%s/m.gguf", dir);
    snprintf(stem, sizeof stem, "%s/m", dir);
    write_source(src);
    struct gguf_file *f = NULL, *g = NULL;
    CHECK(gguf_open(&f, src, err, sizeof err) == 0, "open the source: %s", err);
    CHECK(gguf_write_split(f, 3, stem, err, sizeof err) == 0, "split: %s", err);
    CHECK(gguf_write_split(f, NT + 1, stem, err, sizeof err) == CAIRN_EINVAL, "more parts than tensors: %s", err);
    gguf_close(f);
    snprintf(p1, sizeof p1, "%s-00001-of-00003.gguf", stem);
    CHECK(gguf_open(&g, p1, err, sizeof err) == 0, "open the first part: %s", err);
    if (!g)
        return;
    uint64_t total = 0;
    for (int k = 1; k <= 3; k++) {
        char p[320];
        snprintf(p, sizeof p, "%s-%05d-of-00003.gguf", stem, k);
        total += size_of(p);
    }
    CHECK(gguf_n_parts(g) == 3 && gguf_file_size(g) == total, "3 parts, %llu bytes (%llu)",
          (unsigned long long)gguf_file_size(g), (unsigned long long)total);
    CHECK(gguf_n_tensors(g) == NT, "every tensor: %lld", (long long)gguf_n_tensors(g));
    struct gguf_str arch;
    uint32_t blocks = 0;
    CHECK(gguf_get_str(g, "general.architecture", &arch) == 0 && arch.len == 5 &&
              gguf_get_u32(g, "llama.block_count", &blocks) == 0 && blocks == 3,
          "the key/values of the first part");
    int parts_seen[3] = {0};
    for (int i = 0; i < NT; i++) {
        char name[32];
        snprintf(name, sizeof name, "t%d.weight", i);
        const struct gguf_tensor *t = gguf_find_tensor(g, name);
        CHECK(t && t->size == sizeof data[i] && !memcmp(t->data, data[i], sizeof data[i]), "%s byte for byte", name);
        if (!t)
            continue;
        parts_seen[t->part]++;
        float back[32];
        int fd = open(gguf_tensor_file(g, t), O_RDONLY);
        CHECK(fd >= 0 && pread(fd, back, sizeof back, (off_t)gguf_tensor_file_offset(g, t)) == sizeof back &&
                  !memcmp(back, data[i], sizeof back),
              "%s read back from %s", name, gguf_tensor_file(g, t));
        if (fd >= 0)
            close(fd);
    }
    CHECK(parts_seen[0] && parts_seen[1] && parts_seen[2], "tensors in every part: %d %d %d", parts_seen[0],
          parts_seen[1], parts_seen[2]);
    gguf_close(g);
}

/* Opens path and expects a refusal whose message holds want. */
static void refused(const char *path, const char *want)
{
    struct gguf_file *f = NULL;
    char err[512] = "";
    int rc = gguf_open(&f, path, err, sizeof err);
    CHECK(rc != 0 && !f && strstr(err, want), "%s: %d '%s' (want '%s')", path, rc, err, want);
    gguf_close(f);
}

static void test_refused(void)
{
    char src[300], stem[300], p1[320], p2[320], p3[320], other[320], err[512];
    snprintf(src, sizeof src, "%s/m.gguf", dir);
    snprintf(stem, sizeof stem, "%s/m", dir);
    snprintf(p1, sizeof p1, "%s-00001-of-00003.gguf", stem);
    snprintf(p2, sizeof p2, "%s-00002-of-00003.gguf", stem);
    snprintf(p3, sizeof p3, "%s-00003-of-00003.gguf", stem);
    refused(p2, "is part 2 of 3");
    snprintf(other, sizeof other, "%s/renamed.gguf", dir);
    CHECK(link(p1, other) == 0, "a first part under another name");
    refused(other, "must be named");
    unlink(other);

    /* part 3 from a 3-way split of another model: split keys fine, tensors collide */
    struct gguf_file *f = NULL;
    CHECK(gguf_open(&f, src, err, sizeof err) == 0, "%s", err);
    char stem2[300];
    snprintf(stem2, sizeof stem2, "%s/n", dir);
    CHECK(gguf_write_split(f, 3, stem2, err, sizeof err) == 0, "%s", err);
    gguf_close(f);
    char n2[320];
    snprintf(n2, sizeof n2, "%s-00002-of-00003.gguf", stem2);
    CHECK(rename(p3, other) == 0 && link(n2, p3) == 0, "part 3 replaced by another split's part 2");
    refused(p1, "split.no 2");
    unlink(p3);
    refused(p1, "part 3 of 3 of the split model is missing");
    CHECK(rename(other, p3) == 0, "part 3 back");

    /* a split of 2 whose parts repeat a tensor, and one whose count is off */
    struct gguf_writer *w = NULL;
    uint16_t no, count = 2;
    for (int k = 0; k < 2; k++) {
        gguf_writer_create(&w);
        no = (uint16_t)k;
        gguf_writer_set_scalar(w, "split.no", GGUF_UINT16, &no);
        gguf_writer_set_scalar(w, "split.count", GGUF_UINT16, &count);
        gguf_writer_set_i32(w, "split.tensors.count", 2);
        int64_t ne[4] = {32, 1, 1, 1};
        gguf_writer_add_tensor(w, "same.weight", DT_F32, 1, ne, data[k], NULL, NULL);
        char p[320];
        snprintf(p, sizeof p, "%s/d-%05d-of-00002.gguf", dir, k + 1);
        CHECK(gguf_writer_write(w, p, err, sizeof err) == 0, "%s", err);
        gguf_writer_release(w);
    }
    char d1[320];
    snprintf(d1, sizeof d1, "%s/d-00001-of-00002.gguf", dir);
    refused(d1, "'same.weight' is in two parts");
    gguf_writer_create(&w);
    no = 0;
    gguf_writer_set_scalar(w, "split.no", GGUF_UINT16, &no);
    gguf_writer_set_scalar(w, "split.count", GGUF_UINT16, &count);
    gguf_writer_set_i32(w, "split.tensors.count", 5);
    CHECK(gguf_writer_write(w, d1, err, sizeof err) == 0, "%s", err);
    gguf_writer_release(w);
    refused(d1, "split.tensors.count says 5");
}

int main(int argc, char **argv)
{
    test_begin(argc, argv);
    snprintf(dir, sizeof dir, "/tmp/cairn-test-split-%d", (int)getpid());
    mkdir(dir, 0700);
    RUN(test_open_split);
    RUN(test_refused);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return test_main_end();
}
