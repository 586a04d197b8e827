/* wire.h - the msgpack messages between coordinator and expert servers.
 *
 * hello / ready travel over the control socket (SOCK_SEQPACKET, one message per
 * packet); request / response headers sit in ring slots next to raw float
 * payloads (ring.h). Every decoder validates types, ranges and lengths against
 * the receiver's own limits and refuses anything else with a message. */
#ifndef K3_WIRE_H
#define K3_WIRE_H

#include "common/error.h"
#include <stddef.h>
#include <stdint.h>

typedef struct {
    char model_dir[4096];
    int worker, n_workers;     /* ownership: expert_owner_in(layer, expert, group, n_groups, n_workers) == worker */
    int group, n_groups;       /* the expert rank this server is behind (n_groups 0: none, one level) */
    uint64_t cache_bytes;
    int threads, node;         /* node -1: no NUMA binding */
    uint32_t n_slots;
    uint64_t hdr_cap, req_cap, resp_cap;
    uint32_t max_tokens, max_pairs;
    int life;                  /* 0 for the first start, +1 per restart */
    char simd[16];
    char policy[16];           /* expert-cache policy name (cache_policy_parse) */
    int read_threads;          /* the cache's reads in flight (expert_cache_set_readers; 0: none) */
    int preload;               /* 1: read the experts the cache holds after `ready`, before serving
                                * (expert_cache_preload; ring_ctl preloaded / preload_state); optional, absent 0 */
} wire_hello;

typedef struct {
    int ok;
    char error[1024];
    int experts, cache_slots, node, direct_io;
} wire_ready;

enum { WIRE_REQ_EXPERTS = 1, WIRE_REQ_SHUTDOWN = 2 };

typedef struct {
    int kind;
    uint64_t id;
    int layer;
    uint32_t ntok, npairs;
    int32_t *pair_token, *pair_expert; /* decode: point into caller-provided arrays of max_pairs */
    /* optional prefetch hint (coordinator/expert_predict.h): after answering, the server may start
     * reading these experts of hint_layer (most likely first; it skips what it does not own).
     * nhint 0: none (the keys are absent). At most wire_hint_max(max_pairs) entries, each in
     * [0, 2^20); decode: hint points into a caller-provided array of that many. */
    int hint_layer;
    uint32_t nhint;
    int32_t *hint;
} wire_request;

/* Entries a request's hint may carry: a quarter of max_pairs, so the header still fits the
 * ring slot's cap (sized for the pairs), at least 16. */
static inline uint32_t wire_hint_max(uint32_t max_pairs) { return max_pairs / 4 > 16 ? max_pairs / 4 : 16; }

typedef struct {
    uint64_t id;
    int layer;
    uint32_t npairs;
    int ok;
    char error[1024];
    uint64_t checksum;
} wire_response;

/* Encoders write at most cap bytes into buf and return the length, or -1. */
long wire_encode_hello(const wire_hello *h, void *buf, size_t cap);
long wire_encode_ready(const wire_ready *r, void *buf, size_t cap);
long wire_encode_request(const wire_request *q, void *buf, size_t cap);
long wire_encode_response(const wire_response *r, void *buf, size_t cap);

int wire_decode_hello(const void *buf, size_t len, wire_hello *h, k3_error *err);
int wire_decode_ready(const void *buf, size_t len, wire_ready *r, k3_error *err);
/* q->pair_token / pair_expert must point at arrays of max_pairs entries, q->hint at one of
 * wire_hint_max(max_pairs) (or NULL: a request with a hint is then refused). */
int wire_decode_request(const void *buf, size_t len, uint32_t max_pairs, wire_request *q, k3_error *err);
int wire_decode_response(const void *buf, size_t len, wire_response *r, k3_error *err);

/* The deterministic ownership map: spreads each layer's experts over workers
 * and rotates by layer so one expert index does not always land on one worker. */
static inline int expert_owner(int layer, int expert, int n_workers) {
    return (int)(((unsigned)expert + (unsigned)layer) % (unsigned)n_workers);
}

/* Two levels (`--mpi --workers N`): expert rank `group` of n_groups owns the experts with
 * expert_owner(layer, expert, n_groups) == group and spreads them over its n_workers local
 * servers; the server of (layer, expert), or -1 when the group does not own it. With one
 * group it is expert_owner. Consecutive experts of a group go to consecutive servers. */
static inline int expert_owner_in(int layer, int expert, int group, int n_groups, int n_workers) {
    unsigned v = (unsigned)expert + (unsigned)layer;
    if (n_groups < 1) n_groups = 1;
    if ((int)(v % (unsigned)n_groups) != group) return -1;
    return (int)((v / (unsigned)n_groups) % (unsigned)n_workers);
}

#endif
