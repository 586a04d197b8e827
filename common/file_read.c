/* file_read.c - open and read input files (see file_read.h). */
#include "common/file_read.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *kind_of(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO" : S_ISCHR(m) ? "a character device" :
           S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

/* Opens path without blocking; accepts a regular file, or also a stream when streams is set. */
static int open_checked(const char *path, int extra_flags, int streams, k3_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_flags);
    if (fd < 0) return k3_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return k3_fail(err, "%s: cannot stat: %s", path, strerror(e));
    }
    int ok = S_ISREG(st.st_mode) || (streams && (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode) || S_ISSOCK(st.st_mode)));
    if (!ok) {
        close(fd);
        return k3_fail(err, "%s: is %s, not a regular file", path, kind_of(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return k3_fail(err, "%s: fcntl: %s", path, strerror(e));
    }
    return fd;
}

int file_open_regular(const char *path, int extra_flags, k3_error *err) {
    return open_checked(path, extra_flags, 0, err);
}

static char *read_fd(int fd, const char *path, size_t max_bytes, size_t *len, k3_error *err) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) { close(fd); k3_fail(err, "%s: out of memory", path); return NULL; }
    for (;;) {
        if (n == cap) {
            if (cap > max_bytes) { k3_fail(err, "%s: larger than %zu bytes", path, max_bytes); goto fail; }
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) { k3_fail(err, "%s: out of memory", path); goto fail; }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { k3_fail(err, "%s: read error: %s", path, strerror(errno)); goto fail; }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (n > max_bytes) { k3_fail(err, "%s: larger than %zu bytes", path, max_bytes); free(buf); return NULL; }
    buf[n] = 0;
    *len = n;
    return buf;
fail:
    close(fd);
    free(buf);
    return NULL;
}

char *file_read_all(const char *path, size_t max_bytes, size_t *len, k3_error *err) {
    int fd = open_checked(path, 0, 0, err);
    return fd < 0 ? NULL : read_fd(fd, path, max_bytes, len, err);
}

char *file_read_stream(const char *path, size_t max_bytes, size_t *len, k3_error *err) {
    int fd = open_checked(path, 0, 1, err);
    return fd < 0 ? NULL : read_fd(fd, path, max_bytes, len, err);
}
