/* cairn's version, shown by `cairn version` and the APIs that report one. */
#ifndef CAIRN_BASE_VERSION_H
#define CAIRN_BASE_VERSION_H

#define CAIRN_VERSION "0.1.0"

#endif
