/* Folders and durability: making a path of folders, and syncing a file or a folder so
 * that what was written (or a new name in a folder) survives a power cut. */
#ifndef CAIRN_BASE_FILES_H
#define CAIRN_BASE_FILES_H

#include <stddef.h>
#include <sys/types.h>

/* mkdir -p of path, the folders it makes with mode; 0, or CAIRN_EIO (path too long, or
 * a folder that cannot be made) with the folder named in err. */
int files_make_dirs(const char *path, mode_t mode, char *err, size_t errlen);

/* fsync of a file (or, with O_DIRECTORY in flags, a folder) opened by path with flags;
 * 0, or -1 with errno set. */
int files_sync(const char *path, int flags);

#endif
