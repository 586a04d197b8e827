/* file_read.h - a whole file into memory.
 * file_read_all returns a malloc'd buffer holding the file's bytes plus a NUL
 * (not counted in *len), or NULL with err naming the path (cannot open, read
 * error, larger than max_bytes, out of memory). The caller frees it. */
#ifndef K3_FILE_READ_H
#define K3_FILE_READ_H

#include "common/error.h"
#include <stddef.h>

char *file_read_all(const char *path, size_t max_bytes, size_t *len, k3_error *err);

#endif
