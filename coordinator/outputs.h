/* outputs.h - where a run's results go, checked before any work and after every write.
 *
 * outputs_init (first thing in main): SIGXFSZ is ignored, so a file-size limit
 * (`ulimit -f`) makes a write fail with EFBIG and a message instead of killing
 * the process; descriptors 0-2 that are closed are held open on /dev/null so no
 * file opened later can land on them (ids written into a shard or the --json
 * file). Returns -1 when stdout was closed: there is nowhere to write the ids.
 * outputs_check_paths: every output path (--json, --dump-logits,
 * --dump-expert-trace) must be writable BEFORE the model is loaded: an existing
 * directory, a missing parent directory or a path without write permission is a
 * usage error naming the flag and the path (nothing is created or truncated).
 * outputs_write_file writes a whole file and checks every write and the close.
 * outputs_finish (last thing in main): flushes and closes stdout; a write error
 * (a full device, a closed pipe) is reported and turns a success into exit 1. */
#ifndef K3_OUTPUTS_H
#define K3_OUTPUTS_H

#include "common/error.h"
#include <stddef.h>

int outputs_init(void);
/* One flag's path; NULL path = not asked for. */
int outputs_check_path(const char *flag, const char *path, k3_error *err);
/* The paths of `bin/k3 MODEL ...` (json, logits, trace; NULL = not given). */
int outputs_check_paths(const char *json_path, const char *logits_path, const char *trace_path, k3_error *err);
int outputs_write_file(const char *path, const void *data, size_t len, k3_error *err);
/* Returns the final exit status: status, or 1 when stdout could not be written. */
int outputs_finish(int status);

#endif
