/* direct_read.h - THE reader of byte ranges of checkpoint shards, used by the trunk streamer
 * (coordinator/trunk.c) and the expert cache (workers/expert_cache.c): O_DIRECT when the
 * filesystem allows it, buffered otherwise, with one set of messages.
 *
 * Contract
 * - direct_open(path): an O_DIRECT descriptor, or -1 when the filesystem (tmpfs, some FUSE/overlay)
 *   or the kernel refuses O_DIRECT. The caller keeps it and closes it.
 * - direct_read reads bytes [off, off + len) of the file:
 *     with dfd >= 0 (O_DIRECT): the aligned window [off rounded down to DIRECT_ALIGN, off + len
 *       rounded up) goes to buf (DIRECT_ALIGN-aligned, at least direct_window(off, len) bytes) and
 *       *data = buf + (off % DIRECT_ALIGN). A tail past the end of the file is fine (the window is
 *       cut by EOF) as long as off + len is inside it.
 *     with dfd < 0, or when the kernel refuses the aligned read (EINVAL): exactly [off, off + len)
 *       is read through bfd (a plain descriptor of the same file) into buf and *data = buf;
 *       *direct_refused (if not NULL) is set to 1 on EINVAL so the caller stops using dfd. A caller
 *       that opens its buffered descriptor only when needed passes bfd = -1 with dfd >= 0: on
 *       EINVAL it then gets -1 with *direct_refused = 1 and err untouched, and calls again with
 *       dfd = -1 and a buffered bfd.
 *   EINTR is retried and short reads are continued, in one place. Failures fill err (K3_EFAIL)
 *   naming the file, the offset and `what` (e.g. "tensor 'x'"; NULL for none):
 *     "read error in shard FILE at offset N (what): strerror"
 *     "short read in shard FILE at offset N (what): got G of L bytes (truncated shard?)".
 *   Thread-safe: no state besides the descriptors (pread), so several threads may read at once.
 * - pread_full: pread of n bytes with EINTR and short-read handling; returns the bytes read (< n
 *   only at end of file) or -1 with errno set. Every pread of this module goes through
 *   direct_pread_fn (pread by default; a test may set it, before any read, to inject EINTR,
 *   short reads and errors).
 *
 * Several reads in flight (dr_pool): a pool of reader threads. A submitted read (dr_read: the
 * arguments of direct_read) is cut into pieces of at most piece_bytes (multiples of DIRECT_ALIGN
 * inside its aligned window), each a pread by whichever thread is free, so one large read keeps
 * up to n_threads preads at the device and several reads keep the queue full. The pieces give
 * exactly direct_read's result: the same *data, the same fallback (an EINVAL on any piece reads
 * the whole range buffered through bfd when bfd >= 0, else rc -1 with direct_refused = 1 and err
 * untouched), the same messages (a piece names its own offset; a short read counts the bytes
 * from the window's start). dr_submit queues a read (urgent: ahead of every queued one; a
 * demand read passes prefetches); the caller keeps the dr_read and its buffer untouched until
 * dr_wait (or dr_poll) reports it done, and submits it once per use. dr_wait returns its rc (0,
 * or -1 with r->err). dr_pool_free waits for every submitted read. n_threads 0: dr_submit reads
 * at once in the caller (no threads). Thread-safe: any thread may submit and wait. */
#ifndef K3_DIRECT_READ_H
#define K3_DIRECT_READ_H

#include "common/error.h"
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define DIRECT_ALIGN 4096u

int direct_open(const char *path);
/* Bytes of buffer direct_read needs for [off, off + len) (the aligned window). */
uint64_t direct_window(uint64_t off, uint64_t len);
int direct_read(const char *path, int dfd, int bfd, uint64_t off, uint64_t len, uint8_t *buf, const uint8_t **data,
                int *direct_refused, const char *what, k3_error *err);
ssize_t pread_full(int fd, void *buf, size_t n, off_t off);
extern ssize_t (*direct_pread_fn)(int fd, void *buf, size_t n, off_t off);

typedef struct dr_pool dr_pool;
typedef struct dr_read {
    /* in (as direct_read) */
    const char *path;
    int dfd, bfd;
    uint64_t off, len;
    uint8_t *buf;
    const char *what;
    /* out, once done */
    const uint8_t *data;
    int rc, direct_refused;
    k3_error err;
    /* private to the pool */
    int n_pieces, next_piece, pieces_done, done, failed, einval;
    uint64_t a0, span;
    struct dr_read *qnext;
} dr_read;

#define DR_PIECE_DEFAULT (4u << 20)

dr_pool *dr_pool_create(int n_threads, uint64_t piece_bytes, k3_error *err);
void dr_pool_free(dr_pool *p);
int dr_pool_threads(const dr_pool *p);
void dr_submit(dr_pool *p, dr_read *r, int urgent);
int dr_wait(dr_pool *p, dr_read *r);
/* 1 when r is done (then dr_wait returns at once), 0 while it is queued or being read. */
int dr_poll(dr_pool *p, dr_read *r);

#endif
