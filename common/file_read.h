/* file_read.h - opening and reading input files without hanging on them.
 * file_open_regular opens path read-only (O_CLOEXEC, plus extra_flags) without
 * blocking (O_NONBLOCK, cleared again after the check) and refuses, naming the
 * path and what it is, anything that is not a regular file: a FIFO would block
 * forever, a directory or device has no meaningful size. Returns the fd or -1.
 * file_read_all returns a malloc'd buffer holding a regular file's bytes plus a
 * NUL (not counted in *len), or NULL with err naming the path (not a regular
 * file, cannot open, read error, larger than max_bytes, out of memory).
 * file_read_stream is the same but also accepts a pipe, FIFO or terminal (a
 * prompt given as /dev/stdin or <(...)); still never a directory. The caller frees. */
#ifndef K3_FILE_READ_H
#define K3_FILE_READ_H

#include "common/error.h"
#include <stddef.h>

int file_open_regular(const char *path, int extra_flags, k3_error *err);
char *file_read_all(const char *path, size_t max_bytes, size_t *len, k3_error *err);
char *file_read_stream(const char *path, size_t max_bytes, size_t *len, k3_error *err);

#endif
