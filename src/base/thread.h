/* A detached thread, started in one call: for work that ends by itself and that no one
 * joins (a pull, a cancel, a watcher). */
#ifndef CAIRN_BASE_THREAD_H
#define CAIRN_BASE_THREAD_H

#include <stddef.h>

/* Starts fn(arg) on a detached thread; stack_bytes 0 takes the default size. Returns 0,
 * or the errno value pthread_create gave. */
int thread_start_detached(void *(*fn)(void *), void *arg, size_t stack_bytes);

#endif
