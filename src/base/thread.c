/* A detached thread, started in one call (thread.h). */
#include "base/thread.h"

#include <errno.h>
#include <pthread.h>

int thread_start_detached(void *(*fn)(void *), void *arg, size_t stack_bytes)
{
    pthread_attr_t at;
    int e = pthread_attr_init(&at);
    if (e)
        return e;
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (stack_bytes)
        pthread_attr_setstacksize(&at, stack_bytes);
    pthread_t th;
    e = pthread_create(&th, &at, fn, arg);
    pthread_attr_destroy(&at);
    return e;
}
