/* error.h - one error message carried back up the call chain.
 * Functions that can fail take a `k3_error *` and return -1 (or NULL) after
 * filling it with a message that names the file, tensor or field at fault.
 * The first failure wins: later k3_fail calls do not overwrite it. */
#ifndef K3_ERROR_H
#define K3_ERROR_H

typedef struct {
    int set;
    char msg[1024];
} k3_error;

/* Formats the message into e (if not already set) and returns -1. */
int k3_fail(k3_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
