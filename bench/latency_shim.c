/* LD_PRELOAD shim that emulates network-storage latency: every open() of a path under
 * $LATENCY_PREFIX sleeps $LATENCY_US microseconds first (default 5000 = 5 ms).
 *
 *   gcc -O2 -shared -fPIC -o /tmp/latency_shim.so bench/latency_shim.c -ldl
 *   LD_PRELOAD=/tmp/latency_shim.so LATENCY_PREFIX=/tmp/photos5k LATENCY_US=5000 trainer bench ...
 *
 * Only the open is delayed (a first-byte latency per file); reads are not. That is the
 * cost a one-file-per-image reader pays per image and a sharded reader pays per shard.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void delay(const char *path) {
    static const char *prefix = NULL;
    static long us = -1;
    if (us < 0) {
        const char *v = getenv("LATENCY_US");
        us = v ? atol(v) : 5000;
        prefix = getenv("LATENCY_PREFIX");
    }
    if (path && prefix && strncmp(path, prefix, strlen(prefix)) == 0 && us > 0) usleep((useconds_t)us);
}

#define WRAP(name)                                                              \
    int name(const char *path, int flags, ...) {                                \
        static int (*real)(const char *, int, ...) = NULL;                      \
        if (!real) real = dlsym(RTLD_NEXT, #name);                              \
        mode_t mode = 0;                                                        \
        if (flags & (O_CREAT | O_TMPFILE)) {                                    \
            va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); \
        }                                                                       \
        delay(path);                                                            \
        return real(path, flags, mode);                                         \
    }
WRAP(open)
WRAP(open64)

#define WRAPAT(name)                                                            \
    int name(int dirfd, const char *path, int flags, ...) {                     \
        static int (*real)(int, const char *, int, ...) = NULL;                 \
        if (!real) real = dlsym(RTLD_NEXT, #name);                              \
        mode_t mode = 0;                                                        \
        if (flags & (O_CREAT | O_TMPFILE)) {                                    \
            va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); \
        }                                                                       \
        delay(path);                                                            \
        return real(dirfd, path, flags, mode);                                  \
    }
WRAPAT(openat)
WRAPAT(openat64)
