/* direct_read.c - O_DIRECT / buffered range reads of shards (contract: direct_read.h). */
#define _GNU_SOURCE
#include "common/direct_read.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int direct_open(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    return fd >= 0 ? fd : -1;
}

uint64_t direct_window(uint64_t off, uint64_t len) {
    uint64_t a0 = off / DIRECT_ALIGN * DIRECT_ALIGN;
    uint64_t a1 = (off + len + DIRECT_ALIGN - 1) / DIRECT_ALIGN * DIRECT_ALIGN;
    return a1 - a0;
}

ssize_t pread_full(int fd, void *buf, size_t n, off_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int failed(const char *path, uint64_t at, const char *what, ssize_t got, uint64_t want, k3_error *err) {
    char w[300] = "";
    if (what) snprintf(w, sizeof w, " (%s)", what);
    if (got < 0)
        return k3_fail(err, "read error in shard %s at offset %llu%s: %s", path, (unsigned long long)at, w, strerror(errno));
    return k3_fail(err, "short read in shard %s at offset %llu%s: got %zd of %llu bytes (truncated shard?)", path,
                   (unsigned long long)at, w, got, (unsigned long long)want);
}

int direct_read(const char *path, int dfd, int bfd, uint64_t off, uint64_t len, uint8_t *buf, const uint8_t **data,
                int *direct_refused, const char *what, k3_error *err) {
    if (dfd >= 0) {
        uint64_t a0 = off / DIRECT_ALIGN * DIRECT_ALIGN, n = direct_window(off, len);
        ssize_t got = pread_full(dfd, buf, n, (off_t)a0);
        if (got >= 0) {
            if ((uint64_t)got < off + len - a0) return failed(path, a0, what, got, off + len - a0, err);
            *data = buf + (off - a0);
            return 0;
        }
        if (errno != EINVAL) return failed(path, a0, what, -1, n, err);
        if (direct_refused) *direct_refused = 1; /* the alignment was refused: buffered below */
        if (bfd < 0) return -1;                  /* the caller retries with a buffered descriptor */
    }
    ssize_t got = pread_full(bfd, buf, len, (off_t)off);
    if (got < 0 || (uint64_t)got < len) return failed(path, off, what, got, len, err);
    *data = buf;
    return 0;
}
