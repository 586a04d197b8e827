/* experts_local.h - the in-process expert backend (--workers 0): the same
 * workers/ library an expert server runs (expert store, cache with its reader,
 * batch by expert), called directly. Each needed expert is computed once per
 * call for all of its tokens (prefill by expert). */
#ifndef K3_EXPERTS_LOCAL_H
#define K3_EXPERTS_LOCAL_H

#include "coordinator/expert_backend.h"
#include "coordinator/model.h"
#include "workers/expert_cache.h"

/* The backend borrows m and k; both must outlive it. cache_bytes as for a server. */
int experts_local_create(expert_backend *b, k3_model *m, const kernels *k, uint64_t cache_bytes, cache_policy policy,
                         k3_error *err);
/* Cache counters; returns bytes read. */
uint64_t experts_local_stats(const expert_backend *b, uint64_t *hits, uint64_t *misses);
/* Several reads in flight for the cache (expert_cache_set_readers). hint() starts reads of a
 * prediction (expert_cache_hint). */
int experts_local_set_readers(expert_backend *b, int n_threads, k3_error *err);
expert_cache_stats experts_local_cache_stats(const expert_backend *b);
/* --preload-experts: every expert read now (expert_cache_preload), progress on stderr.
 * *loaded: the experts read. 0, or -1 with err. */
int experts_local_preload(expert_backend *b, size_t *loaded, k3_error *err);

#endif
