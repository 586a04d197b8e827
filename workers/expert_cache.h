/* expert_cache.h - one expert server's cache of routed experts, with its own reader.
 *
 * A byte budget buys n_slots slots of expert_cache_slot_bytes each (the expert's
 * bytes in an aligned window: ls_buffer_bytes, the size the memory plan uses).
 * A slot is EMPTY, READING or READY; a READY slot may be pinned (in use, or
 * prefetched and not yet used). Eviction takes a READY slot that is not pinned,
 * chosen by the cache policy (below); never a READING or pinned slot, and an
 * EMPTY slot before any. If no slot can be taken the call fails (it cannot
 * happen when a batch pins at most n_slots-1 prefetched experts plus the one in
 * use, which expert_cache_prefetch ensures).
 * A request (one expert_batch_run) first pins its resident experts, then takes
 * slots for its misses, so a request never evicts an expert it is about to use.
 * Reads: one pread of the aligned window around the expert's contiguous run,
 * with O_DIRECT where the file system allows (else buffered, warned once); an
 * expert whose six tensors are not contiguous is read tensor by tensor. Misses
 * of one prefetch are read in parallel, issued in file-offset order. A short
 * read or I/O error names the shard and offset. Memory comes from the worker's
 * NUMA node when one is given. The cache is used by one thread at a time.
 * Finding an expert's slot is one index lookup (a resident K3 server holds tens of
 * thousands of slots, asked several times per expert use); the first EMPTY slot is
 * found from a cursor. Choosing phit's victim (a miss, when no slot is EMPTY) takes
 * O(180 + layers + hints out) from an index of the evictable unhinted slots by (age
 * bucket, rate class, layer), kept as slots change (each slot re-bucketed about once
 * per pass), and a list of the hinted slots; lru's and lfu's in O(log slots) from a binary
 * heap of the same slots by the policy's key (rebuilt, O(slots), when the policy is set and
 * when lfu halves its counts: every 16 x n_slots uses).
 *
 * Policies (which READY unpinned slot is evicted; they change only speed, never
 * a result). Layers come round once per forward pass (a "cycle"), so experts are
 * requested in a loop that is longer than the cache: LRU then evicts exactly the
 * experts whose layer comes next. scripts/sim_expert_cache.py models all three
 * exactly; docs/PERFORMANCE.md "Expert cache policy" has the numbers.
 *   lru   least recently used.
 *   lfu   least frequently used, with history (counts survive eviction) and
 *         aging (all counts halved every 16 x n_slots uses); ties: the most
 *         recently used (its layer comes round last).
 *   phit  predicted hit (default): the cache learns, from what it is asked,
 *         how likely an expert is to be used when its layer comes round next,
 *         as a function of its age (passes since its last use, 12 buckets)
 *         and its use rate (an exponential average per pass, 15 buckets);
 *         it evicts the expert with the lowest estimate, ties: the one whose
 *         layer comes round last. */
#ifndef K3_EXPERT_CACHE_H
#define K3_EXPERT_CACHE_H

#include "workers/expert_batch.h"
#include "workers/expert_store.h"

typedef struct expert_cache expert_cache;

typedef enum { CACHE_POLICY_LRU, CACHE_POLICY_LFU, CACHE_POLICY_PHIT, CACHE_POLICY_COUNT } cache_policy;

/* The policy expert_cache_create sets (the simulation's winner). */
#define CACHE_POLICY_DEFAULT CACHE_POLICY_PHIT

typedef struct {
    uint64_t hits, misses, bytes_read;
    uint64_t hint_reads;  /* reads started by expert_cache_hint (in bytes_read too) */
    uint64_t hint_hits;   /* lookups that found an expert a hint had read (in hits too) */
    uint64_t hint_wasted; /* hinted experts their layer's next request did not ask for */
    double read_wait_s;   /* time the requests waited for reads (the stall that reading costs compute) */
    uint64_t repacked;    /* experts rewritten into the lane layout (expert_cache_set_lanes) */
    double repack_s;      /* the time that took */
} expert_cache_stats;

/* node < 0: plain allocation. Fails (naming the minimum) if the budget is below one slot. */
expert_cache *expert_cache_create(const expert_store *st, checkpoint *ck, uint64_t budget_bytes, int node, k3_error *err);
void expert_cache_free(expert_cache *c);
size_t expert_cache_slots(const expert_cache *c);
uint64_t expert_cache_slot_bytes(const expert_store *st);
int expert_cache_direct_io(const expert_cache *c);
expert_cache_stats expert_cache_get_stats(const expert_cache *c);
/* The expert_source that expert_batch_run uses (acquire/release/prefetch). When every
 * expert of the store has a slot (a resident run: nothing is ever evicted) a batch may hold
 * all its experts at once (max_held), else one at a time; an expert still being read ends a
 * group (ready). */
expert_source expert_cache_source(expert_cache *c);

/* Several reads in flight (common/direct_read dr_pool of n_threads, pieces of 4 MiB): with
 * it a request's misses are submitted at once (demand reads ahead of hinted ones) and each
 * acquire waits only for its own expert, so computing one expert overlaps reading the next;
 * misses beyond the slots a request can pin start as soon as a slot is released. Without it
 * (n_threads 0, the default) misses are read as before (an OpenMP loop, then on demand).
 * Only with O_DIRECT; call once, before the first request. 0 or -1 with err. The pipelined
 * misses take their slots earlier than the synchronous path does (while the request's earlier
 * experts are still pinned), so the policy may choose other victims: hit counts can differ a
 * little from scripts/sim_expert_cache.py, which models the synchronous path (t_45 runs it). */
int expert_cache_set_readers(expert_cache *c, int n_threads, k3_error *err);
int expert_cache_readers(const expert_cache *c);

/* The layout the kernels k read fastest (matmul_mxfp4_lanes_wanted, per matrix width): with it,
 * in a resident run (a slot for every owned expert) each expert's codes are rewritten in place
 * into the lane layout once, when its first use checks its scales (expert_cache_preload does it
 * for all), and acquire hands them out with mxfp4_weight.lanes set. A streamed cache keeps the
 * release layout (an expert is used about once per read there). Changes no result: matmul_mxfp4
 * gives either layout the same bits. Call before the first request. */
void expert_cache_set_lanes(expert_cache *c, const kernels *k);

/* A prediction (coordinator/expert_predict.c): the experts of `layer` likely asked for next,
 * most likely first. Starts reads (behind every demand read) of those neither resident nor
 * being read, into EMPTY slots or slots the policy would evict, never a pinned slot nor
 * one another pending hint holds; at most n_slots - 1 pending hints. Changes no result:
 * a hinted expert is only bytes in a slot; a request finds it (a hit, hint_hits) or evicts
 * it first (hint_wasted); a failed hint read leaves the slot EMPTY (the request that needs
 * the expert reads it again and reports the error). Without readers it does nothing.
 * Returns the reads started. */
size_t expert_cache_hint(expert_cache *c, int layer, const int32_t *experts, size_t n);

/* Reads this cache's experts now (layer by layer, each layer's in one prefetch: several reads
 * in flight with readers), as many as there are slots (all of them when the cache holds every
 * expert it owns: a resident run), so that no request waits for a first read; every expert's
 * scales are checked on the way. The reads count as misses and bytes read. progress (may be
 * NULL) is called after each expert with the experts read so far and the number to read.
 * 0, or -1 with err (the first failed read or bad expert; the failed layer's other experts may
 * stay pinned, as after a failed request: the caller stops). */
int expert_cache_preload(expert_cache *c, size_t *loaded, void (*progress)(void *ctx, size_t done, size_t total),
                         void *progress_ctx, k3_error *err);

/* "lru", "lfu", "phit" (case-sensitive) -> 0, or -1 for anything else (out untouched). */
int cache_policy_parse(const char *name, cache_policy *out);
/* The name cache_policy_parse accepts; "?" for an invalid value. */
const char *cache_policy_name(cache_policy p);
/* Switches the eviction policy; the contents and the statistics stay (call it
 * before the first request for a clean comparison). An invalid value is ignored. */
void expert_cache_set_policy(expert_cache *c, cache_policy p);
cache_policy expert_cache_get_policy(const expert_cache *c);

/* Tests: with verify on, every victim taken from phit's index or lru/lfu's heap is also chosen
 * by a scan of all slots (the definition) and the index and heap are checked slot by slot; each disagreement counts
 * (expert_cache_verify_failures: 0 is the only right answer; *checks, if not NULL, gets the
 * number of indexed choices checked). O(slots) per victim: tests only. */
void expert_cache_set_verify(expert_cache *c, int on);
uint64_t expert_cache_verify_failures(const expert_cache *c, uint64_t *checks);

#endif
