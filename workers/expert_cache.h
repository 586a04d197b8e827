/* expert_cache.h - one expert server's cache of routed experts, with its own reader.
 *
 * A byte budget buys n_slots slots of expert_bytes + 2 * alignment bytes each.
 * A slot is EMPTY, READING or READY; a READY slot may be pinned (in use, or
 * prefetched and not yet used). Eviction takes the least recently used READY
 * slot that is not pinned; never a READING or pinned slot. If no slot can be
 * taken the call fails (it cannot happen when a batch pins at most n_slots-1
 * prefetched experts plus the one in use, which expert_cache_prefetch ensures).
 * Reads: one pread of the aligned window around the expert's contiguous run,
 * with O_DIRECT where the file system allows (else buffered, warned once); an
 * expert whose six tensors are not contiguous is read tensor by tensor. Misses
 * of one prefetch are read in parallel, issued in file-offset order. A short
 * read or I/O error names the shard and offset. Memory comes from the worker's
 * NUMA node when one is given. The cache is used by one thread at a time. */
#ifndef K3_EXPERT_CACHE_H
#define K3_EXPERT_CACHE_H

#include "workers/expert_batch.h"
#include "workers/expert_store.h"

typedef struct expert_cache expert_cache;

typedef struct {
    uint64_t hits, misses, bytes_read;
} expert_cache_stats;

/* node < 0: plain allocation. Fails (naming the minimum) if the budget is below one slot. */
expert_cache *expert_cache_create(const expert_store *st, checkpoint *ck, uint64_t budget_bytes, int node, k3_error *err);
void expert_cache_free(expert_cache *c);
size_t expert_cache_slots(const expert_cache *c);
uint64_t expert_cache_slot_bytes(const expert_store *st);
int expert_cache_direct_io(const expert_cache *c);
expert_cache_stats expert_cache_get_stats(const expert_cache *c);
/* The expert_source that expert_batch_run uses (acquire/release/prefetch). */
expert_source expert_cache_source(expert_cache *c);

#endif
