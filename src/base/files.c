#include "base/files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/err.h"

int files_make_dirs(const char *path, mode_t mode, char *err, size_t errlen)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return cairn_fail(err, errlen, CAIRN_EIO, "path too long: %.64s...", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p)
            continue;
        char c = *p;
        *p = 0;
        if (mkdir(buf, mode) != 0 && errno != EEXIST)
            return cairn_fail(err, errlen, CAIRN_EIO, "cannot create %s: %s", buf, strerror(errno));
        *p = c;
        if (!c)
            break;
    }
    return 0;
}

int files_sync(const char *path, int flags)
{
    int fd = open(path, flags | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}
