/* ring.h - the shared-memory object between the coordinator and one expert server.
 *
 * One object per worker: a control page, then a request ring and a response ring
 * of n_slots slots each. A slot carries a small msgpack header (wire.h) and a raw
 * float payload. Publishing: the producer writes header and payload, then stores
 * the slot's sequence number with RELEASE ordering and posts the ring's counting
 * semaphore; the consumer waits on the semaphore (always with a timeout), loads
 * the sequence number with ACQUIRE ordering and checks it is the one it expects.
 * Lengths in a slot are written by the other side: ring_slot_lengths() validates
 * them against this side's own capacities before anything is read.
 * Every byte of the object is untrusted: each side keeps its OWN copy of the
 * geometry (struct ring: slot count, capacities, slot sizes, from its own
 * arguments), and every address is computed from that copy, never from the
 * control page. The counting semaphores are plain 32-bit futex words driven by
 * raw futex system calls (never glibc sem_t, whose futex errors on a scribbled
 * page abort the process): a garbage count only wakes the waiter early, which
 * then finds no valid slot. ring_ctl_intact() tells the coordinator that a
 * server has scribbled the page (it is then restarted like one that sends garbage).
 * The object is created with a unique name, mode 0600, and unlinked immediately;
 * the worker maps it through the inherited file descriptor, so no name outlives
 * the moment of creation. Names start with "k3." and carry the creator's pid, so
 * ring_cleanup_stale() can remove objects left by a process that died in between. */
#ifndef K3_RING_H
#define K3_RING_H

#include "common/error.h"
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define RING_MAGIC 0x6b3372696e673031ull /* "k3ring01" */

typedef struct {
    uint64_t magic;
    uint32_t n_slots;
    uint32_t pad0;
    uint64_t hdr_cap, req_payload_cap, resp_payload_cap; /* bytes */
    uint64_t req_slot_bytes, resp_slot_bytes;
    _Atomic uint32_t req_items, resp_items; /* futex counting semaphores */
    uint32_t pad1;
    /* written by the worker, read by the coordinator (progress and stats) */
    _Atomic uint64_t heartbeat;
    _Atomic uint64_t stat_requests, stat_hits, stat_misses, stat_bytes_read, stat_compute_ns, stat_wait_ns;
    _Atomic uint64_t stat_hint_reads, stat_hint_hits, stat_hint_wasted; /* the cache's hint counters (expert_cache.h) */
    _Atomic uint64_t preloaded, preload_state; /* hello.preload: experts read so far; 0 running/not asked, 1 done, 2 failed */
} ring_ctl;

typedef struct {
    _Atomic uint64_t seq;   /* published last, with release ordering */
    uint64_t hdr_len;       /* bytes of msgpack header */
    uint64_t payload_len;   /* bytes of raw payload */
    uint64_t pad[5];        /* header starts 64 bytes into the slot */
} ring_slot_head;

typedef struct {
    int fd;
    size_t size;
    unsigned char *base;
    ring_ctl *ctl;        /* shared, untrusted: counters and stats only */
    /* this side's own copy of the geometry */
    uint32_t n_slots;
    uint64_t hdr_cap, req_cap, resp_cap, req_slot_bytes, resp_slot_bytes;
} ring;

/* Creates, sizes, maps and unlinks a new object; initialises control and semaphores. */
int ring_create(ring *r, uint32_t n_slots, uint64_t hdr_cap, uint64_t req_payload_cap, uint64_t resp_payload_cap,
                k3_error *err);
/* Re-initialises the control page from this side's geometry: magic, geometry,
 * semaphores, counters, slot sequence numbers (after the peer died). */
int ring_reset(ring *r, k3_error *err);
/* Maps an inherited fd; checks magic and that the sizes agree with expected caps. */
int ring_attach(ring *r, int fd, uint64_t hdr_cap, uint64_t req_payload_cap, uint64_t resp_payload_cap, uint32_t n_slots,
                k3_error *err);
void ring_close(ring *r);

ring_slot_head *ring_req_slot(const ring *r, uint64_t seq);
ring_slot_head *ring_resp_slot(const ring *r, uint64_t seq);
static inline unsigned char *ring_slot_hdr(ring_slot_head *s) { return (unsigned char *)s + sizeof(ring_slot_head); }
unsigned char *ring_slot_payload(const ring *r, ring_slot_head *s);

/* Publish slot contents (release) and post the semaphore. */
void ring_publish(ring_slot_head *s, uint64_t seq, uint64_t hdr_len, uint64_t payload_len, _Atomic uint32_t *items);
/* Wait up to timeout_ms for an item; 1 = got one, 0 = timeout, -1 = error. */
int ring_wait(_Atomic uint32_t *items, int timeout_ms);
/* 1 when the control page still holds the magic and this side's geometry. */
int ring_ctl_intact(const ring *r);
/* Acquire-load the slot's seq and check it and its lengths against our caps. */
int ring_slot_lengths(const ring *r, ring_slot_head *s, uint64_t want_seq, uint64_t payload_cap, uint64_t *hdr_len,
                      uint64_t *payload_len, k3_error *err);

/* Removes /dev/shm/k3.<pid>.* objects whose creator pid is no longer alive. Returns count. */
int ring_cleanup_stale(void);

/* 64-bit checksum of a payload (detects a corrupted answer). */
uint64_t payload_checksum(const void *p, size_t n);

#endif
