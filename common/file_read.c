/* file_read.c - read a whole file (see file_read.h). */
#include "common/file_read.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *file_read_all(const char *path, size_t max_bytes, size_t *len, k3_error *err) {
    FILE *f = fopen(path, "rb");
    if (!f) { k3_fail(err, "%s: cannot open: %s", path, strerror(errno)); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        if (n == cap) {
            if (cap >= max_bytes) { k3_fail(err, "%s: larger than %zu bytes", path, max_bytes); break; }
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) { k3_fail(err, "%s: out of memory", path); break; }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    if (!buf && !err->set) k3_fail(err, "%s: out of memory", path);
    int bad = ferror(f);
    fclose(f);
    if (err->set || bad) {
        if (!err->set) k3_fail(err, "%s: read error", path);
        free(buf);
        return NULL;
    }
    if (n > max_bytes) { k3_fail(err, "%s: larger than %zu bytes", path, max_bytes); free(buf); return NULL; }
    buf[n] = 0;
    *len = n;
    return buf;
}
