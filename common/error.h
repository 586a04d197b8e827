/* error.h - one error message carried back up the call chain.
 * Functions that can fail take a `k3_error *` and return -1 (or NULL) after
 * filling it with a message that names the file, tensor or field at fault.
 * The first failure wins: later k3_fail calls do not overwrite it.
 * Messages quote bytes from files (tensor names, tokenizer lines, JSON keys), so
 * k3_fail passes the formatted message through k3_escape: a control byte, DEL,
 * a C1 control or a byte that is not part of valid UTF-8 reaches the terminal as
 * \xHH, never raw (no ESC / BEL sequences from a hostile file). */
#ifndef K3_ERROR_H
#define K3_ERROR_H

#include <stddef.h>

typedef struct {
    int set;
    char msg[1024];
} k3_error;

/* Formats the message into e (if not already set) and returns -1. */
int k3_fail(k3_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Copies the n bytes of src into dst (cap bytes, always NUL-terminated when
 * cap > 0) with every non-printable byte written as \xHH (see above); printable
 * ASCII and well-formed UTF-8 other than C1 controls pass unchanged. A string
 * cut at cap stays well formed. Returns the bytes written (without the NUL). */
size_t k3_escape(char *dst, size_t cap, const char *src, size_t n);

#endif
