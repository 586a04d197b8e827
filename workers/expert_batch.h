/* expert_batch.h - compute a list of (token, expert) pairs, grouped by expert.
 *
 * Pairs are grouped so each distinct expert is fetched once and applied to all
 * of its tokens at once (prefill by expert). The caller supplies the weights of
 * an expert through `acquire` and gives them back through `release` (a cache may
 * pin the slot in between). out[i] receives the result of pair i; the grouping
 * never changes a bit (expert_compute.h). Used by the in-process backend and by
 * k3-expertd. */
#ifndef K3_EXPERT_BATCH_H
#define K3_EXPERT_BATCH_H

#include "workers/expert_compute.h"

typedef struct {
    /* Fills w for (layer, expert); 0 or -1 with err set. */
    int (*acquire)(void *ctx, int layer, int expert, expert_weights *w, k3_error *err);
    void (*release)(void *ctx, int layer, int expert);
    /* Optional: called once with every distinct expert of the batch, in the
     * order they will be acquired, so a cache can read misses in parallel.
     * Returns 0 or -1 with err set. */
    int (*prefetch)(void *ctx, int layer, const int32_t *experts, size_t n, k3_error *err);
    void *ctx;
    /* How many experts a batch may hold acquired at once (0 or 1: one at a time, released
     * before the next is acquired). With more, expert_batch_run acquires up to that many and
     * computes all their w1/w3 products in one parallel region and all their w2 products in
     * another (matmul_mxfp4_list), instead of two regions per expert: the same bits. */
    size_t max_held;
    /* Optional, with max_held > 1: 1 if acquire(layer, expert) would not wait (resident). A
     * group ends before an expert that is not ready, which is then acquired and computed
     * alone, so that computing it overlaps the reads of the experts after it. */
    int (*ready)(void *ctx, int layer, int expert);
} expert_source;

int expert_batch_run(const kernels *k, const expert_source *src, size_t L, size_t I, double situ_beta,
                     double situ_linear_beta, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
                     const int32_t *pair_expert, size_t npairs, float *out, k3_error *err);

/* Working buffers a caller keeps across calls: expert_batch_run_ws takes them from ws,
 * grown when a call needs more and kept, whatever their size, until expert_batch_ws_free.
 * Without it every MoE layer of a decode step allocated and freed ~0.85 MB, which the C
 * library gives back to the kernel and faults in fresh (zeroed) again on the next layer
 * (~4 MB of page faults and clearing per token on rw6); a prefill chunk's buffers are
 * larger (64 tokens on rw6: 54 MB, above glibc's mmap threshold: each MoE layer faulted
 * them in again, 22 % of the experts' phase on the Zen 5 VM, 2026-12-01). The memory plan
 * counts a chunk's expert batch in the scratch (plan.c), so keeping it costs no budget.
 * Zero-initialise; expert_batch_ws_free releases it. expert_batch_run is
 * expert_batch_run_ws with none (its buffers freed after the call). */
typedef struct {
    void *buf;
    size_t cap;
} expert_batch_ws;
/* The most experts one group holds (expert_source.max_held is capped to it). */
#define EXPERT_BATCH_GROUP_MAX 32
int expert_batch_run_ws(const kernels *k, const expert_source *src, size_t L, size_t I, double situ_beta,
                        double situ_linear_beta, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
                        const int32_t *pair_expert, size_t npairs, float *out, expert_batch_ws *ws, k3_error *err);
void expert_batch_ws_free(expert_batch_ws *ws);

#endif
