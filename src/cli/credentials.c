/* Where `cairn node` takes its secrets from (README, "Security"): a file or the
 * environment rather than the command line, which every user of the machine can read in
 * `ps`; and an API key made at first start for an API that other machines can reach. */
#include "cli/credentials.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"
#include "base/files.h"

#define KEY_FILE "api_key"

/* Whether s is a usable secret or key: printable ASCII without spaces. */
static bool printable(const char *s)
{
    for (; *s; s++)
        if (*s <= ' ' || *s > '~')
            return false;
    return true;
}

int cred_read_file(const char *path, const char *what, char *buf, size_t cap, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot open the %s file %s: %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) == 0 && (st.st_mode & 077))
        fprintf(stderr, "cairn node: warning: %s (the %s) can be read by other users (chmod 600 it)\n", path, what);
    ssize_t n = read(fd, buf, cap);
    close(fd);
    if (n < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot read %s: %s", path, strerror(errno));
    if ((size_t)n == cap)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "the %s in %s is longer than %zu bytes", what, path, cap - 1);
    buf[n] = 0;
    buf[strcspn(buf, "\r\n")] = 0; /* the first line */
    if (!buf[0] || !printable(buf))
        return cairn_fail(err, errlen, CAIRN_EFORMAT,
                          "the first line of %s must be the %s (printable characters, no spaces)", path, what);
    return 0;
}

/* Writes text to a new file path (mode 0600) and makes it and its folder durable. */
static int write_new(const char *dir, const char *path, const char *text, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot create %s: %s", path, strerror(errno));
    size_t len = strlen(text);
    bool ok = write(fd, text, len) == (ssize_t)len && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    ok = ok && files_sync(dir, O_RDONLY | O_DIRECTORY) == 0;
    if (!ok) {
        unlink(path);
        return cairn_fail(err, errlen, CAIRN_EIO, "cannot write %s: %s", path, strerror(errno));
    }
    return 0;
}

/* The secret kept in data_dir/file, made now when there is none (nbytes random bytes as
 * hex) and make is set; CAIRN_ENOTFOUND when there is none and make is not. */
static int kept_or_made(const char *data_dir, const char *file, const char *what, size_t nbytes, bool make,
                        char *buf, size_t cap, bool *created, char *err, size_t errlen)
{
    *created = false;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", data_dir, file);
    if (access(path, F_OK) == 0)
        return cred_read_file(path, what, buf, cap, err, errlen);
    if (!make)
        return cairn_fail(err, errlen, CAIRN_ENOTFOUND, "no %s in %s", what, path);
    if (cap < 2 * nbytes + 1 || nbytes > 64)
        return cairn_fail(err, errlen, CAIRN_ERANGE, "no room for a %s", what);
    if (sodium_init() < 0)
        return cairn_fail(err, errlen, CAIRN_EIO, "libsodium cannot start");
    unsigned char raw[64];
    randombytes_buf(raw, nbytes);
    sodium_bin2hex(buf, cap, raw, nbytes);
    sodium_memzero(raw, sizeof raw);
    int rc = files_make_dirs(data_dir, 0700, err, errlen);
    if (!rc)
        rc = write_new(data_dir, path, buf, err, errlen);
    if (!rc)
        *created = true;
    return rc;
}

int cred_api_key(const char *data_dir, char *buf, size_t cap, bool *created, char *err, size_t errlen)
{
    return kept_or_made(data_dir, KEY_FILE, "API key", CRED_KEY_BYTES, true, buf, cap, created, err, errlen);
}

int cred_cluster_secret(const char *data_dir, bool make, char *buf, size_t cap, bool *created, char *err,
                        size_t errlen)
{
    return kept_or_made(data_dir, CRED_SECRET_FILE, "cluster secret", CRED_SECRET_BYTES, make, buf, cap, created,
                        err, errlen);
}

int cred_store_secret(const char *data_dir, const char *secret, char *err, size_t errlen)
{
    char path[4200], kept[1024];
    snprintf(path, sizeof path, "%s/" CRED_SECRET_FILE, data_dir);
    if (access(path, F_OK) == 0) {
        int rc = cred_read_file(path, "cluster secret", kept, sizeof kept, err, errlen);
        bool same = !rc && !strcmp(kept, secret);
        sodium_memzero(kept, sizeof kept);
        if (rc || same)
            return rc;
        return cairn_fail(err, errlen, CAIRN_ESTATE,
                          "this machine already belongs to another cluster (%s); remove that file to join this one",
                          path);
    }
    int rc = files_make_dirs(data_dir, 0700, err, errlen);
    return rc ? rc : write_new(data_dir, path, secret, err, errlen);
}
