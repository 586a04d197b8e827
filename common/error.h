/* error.h - one error message carried back up the call chain: the ONE error convention of k3.
 * Functions that can fail take a `k3_error *` and return -1 (or NULL) after filling it with a
 * message that names the file, tensor or field at fault. Success is 0 (or a pointer, or an id
 * >= 0). No other failure codes: what kind of failure it was is e->kind, set by the function
 * that failed:
 *   k3_fail    K3_EFAIL   a run-time failure (I/O error, a worker past its restart limit,
 *                         non-finite logits): exit status 1
 *   k3_refuse  K3_EINPUT  refused input or usage (a malformed file, invalid UTF-8, an id out of
 *                         range, a bad flag value): exit status 2
 *   k3_nomem   K3_ENOMEM  out of memory: exit status 1
 * k3_exit_status(e) maps a failure to the process exit status. The first failure wins: later
 * calls do not overwrite it; a caller that wants to add context formats a new message into its
 * own k3_error from the callee's e.msg (keeping e.kind with k3_fail_as). Initialise with
 * `k3_error e = {0};` and reset with k3_error_clear before reusing one for a new attempt.
 * Messages quote bytes from files (tensor names, tokenizer lines, JSON keys), so every one of
 * these functions passes the formatted message through k3_escape: a control byte, DEL, a C1
 * control or a byte that is not part of valid UTF-8 reaches the terminal as \xHH, never raw
 * (no ESC / BEL sequences from a hostile file). */
#ifndef K3_ERROR_H
#define K3_ERROR_H

#include <stddef.h>

typedef enum { K3_EFAIL = 1, K3_EINPUT = 2, K3_ENOMEM = 3 } k3_errkind;

typedef struct {
    int set;
    k3_errkind kind; /* valid when set */
    char msg[1024];
} k3_error;

/* Formats the message into e (if not already set) and returns -1. */
int k3_fail(k3_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int k3_refuse(k3_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int k3_nomem(k3_error *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int k3_fail_as(k3_error *e, k3_errkind kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static inline void k3_error_clear(k3_error *e) {
    e->set = 0;
    e->kind = 0;
    e->msg[0] = 0;
}

/* 2 for a refused input, 1 for every other failure (and for an unset error). */
static inline int k3_exit_status(const k3_error *e) { return e->set && e->kind == K3_EINPUT ? 2 : 1; }

/* Copies the n bytes of src into dst (cap bytes, always NUL-terminated when
 * cap > 0) with every non-printable byte written as \xHH (see above); printable
 * ASCII and well-formed UTF-8 other than C1 controls pass unchanged. A string
 * cut at cap stays well formed. Returns the bytes written (without the NUL). */
size_t k3_escape(char *dst, size_t cap, const char *src, size_t n);

#endif
