/* experts_local.c - in-process expert computation through an expert cache (see experts_local.h). */
#include "coordinator/experts_local.h"
#include "workers/expert_cache.h"
#include "common/mono_clock.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    k3_model *m;
    const kernels *k;
    expert_cache *cache;
    expert_batch_ws ws; /* the batch's buffers, kept between MoE layers and chunks (no allocation per layer) */
    int hint_layer;           /* a prediction handed to hint(), started after the next run (-1: none) */
    int32_t *hint;            /* [n_experts] */
    size_t nhint;
} local_impl;

static int local_run(expert_backend *b, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
                     const int32_t *pair_expert, size_t npairs, float *out, k3_error *err) {
    local_impl *li = b->impl;
    expert_source src = expert_cache_source(li->cache);
    int rc = expert_batch_run_ws(li->k, &src, li->m->experts.L, li->m->experts.I, li->m->cfg.situ_beta,
                                 li->m->cfg.situ_linear_beta, layer, zlat, ntok, pair_token, pair_expert, npairs, out,
                                 &li->ws, err);
    if (rc == 0 && li->hint_layer >= 0) expert_cache_hint(li->cache, li->hint_layer, li->hint, li->nhint);
    li->hint_layer = -1;
    return rc;
}

/* Kept until the next run (this layer's) has its experts: then the reads start, so they
 * never take a slot this layer is about to use. */
static size_t local_hint(expert_backend *b, int layer, const int32_t *experts, size_t n) {
    local_impl *li = b->impl;
    size_t max = (size_t)li->m->cfg.num_experts;
    li->nhint = n < max ? n : max;
    memcpy(li->hint, experts, li->nhint * sizeof *experts);
    li->hint_layer = layer;
    return li->nhint;
}

static void local_destroy(expert_backend *b) {
    local_impl *li = b->impl;
    if (li) {
        expert_cache_free(li->cache);
        expert_batch_ws_free(&li->ws);
        free(li->hint);
    }
    free(li);
    b->impl = NULL;
}

int experts_local_create(expert_backend *b, k3_model *m, const kernels *k, uint64_t cache_bytes, cache_policy policy,
                         k3_error *err) {
    local_impl *li = calloc(1, sizeof *li);
    if (!li) return k3_fail(err, "out of memory");
    li->m = m;
    li->k = k;
    li->hint_layer = -1;
    if (!(li->hint = malloc((size_t)m->cfg.num_experts * sizeof *li->hint))) { free(li); return k3_fail(err, "out of memory"); }
    if (!(li->cache = expert_cache_create(&m->experts, &m->ck, cache_bytes, -1, err))) { free(li->hint); free(li); return -1; }
    expert_cache_set_policy(li->cache, policy);
    expert_cache_set_lanes(li->cache, k);
    /* a decode step's w2 products take K distinct one-token inputs in double (matmul_mxfp4_list):
     * the engine reserves them in its forward's thread (forward.h forward_x_doubles) */
    *b = (expert_backend){local_run, local_destroy, li, local_hint, NULL};
    return 0;
}

uint64_t experts_local_stats(const expert_backend *b, uint64_t *hits, uint64_t *misses) {
    const local_impl *li = b->impl;
    expert_cache_stats s = expert_cache_get_stats(li->cache);
    *hits = s.hits;
    *misses = s.misses;
    return s.bytes_read;
}

int experts_local_set_readers(expert_backend *b, int n_threads, k3_error *err) {
    local_impl *li = b->impl;
    return expert_cache_set_readers(li->cache, n_threads, err);
}

typedef struct { double t0, last; } preload_progress;

static void preload_note(void *ctx, size_t done, size_t total) {
    preload_progress *pp = ctx;
    double now = k3_now_s();
    if (done < total && now - pp->last < 1.0) return;
    pp->last = now;
    fprintf(stderr, "k3: preloading experts: %zu of %zu (%.1f s)\n", done, total, now - pp->t0);
}

int experts_local_preload(expert_backend *b, size_t *loaded, k3_error *err) {
    local_impl *li = b->impl;
    preload_progress pp = {k3_now_s(), k3_now_s()};
    return expert_cache_preload(li->cache, loaded, preload_note, &pp, err);
}

expert_cache_stats experts_local_cache_stats(const expert_backend *b) {
    const local_impl *li = b->impl;
    return expert_cache_get_stats(li->cache);
}
