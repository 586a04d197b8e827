/* expert_batch.c - pairs grouped by expert, computed once per expert (see expert_batch.h). */
#include "workers/expert_batch.h"
#include <stdlib.h>
#include <string.h>

typedef struct { int32_t expert; uint32_t pair; } pair_key;

static int cmp_pair(const void *a, const void *b) {
    const pair_key *x = a, *y = b;
    if (x->expert != y->expert) return x->expert < y->expert ? -1 : 1;
    return x->pair < y->pair ? -1 : x->pair > y->pair;
}

void expert_batch_ws_free(expert_batch_ws *ws) {
    if (!ws) return;
    free(ws->buf);
    ws->buf = NULL;
    ws->cap = 0;
}

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

int expert_batch_run(const kernels *k, const expert_source *src, size_t L, size_t I, double situ_beta,
                     double situ_linear_beta, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
                     const int32_t *pair_expert, size_t npairs, float *out, k3_error *err) {
    return expert_batch_run_ws(k, src, L, I, situ_beta, situ_linear_beta, layer, zlat, ntok, pair_token, pair_expert,
                               npairs, out, NULL, err);
}

int expert_batch_run_ws(const kernels *k, const expert_source *src, size_t L, size_t I, double situ_beta,
                        double situ_linear_beta, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
                        const int32_t *pair_expert, size_t npairs, float *out, expert_batch_ws *ws, k3_error *err) {
    if (npairs == 0) return 0;
    /* one buffer: keys, distinct, z, y, scratch (2 * npairs * I floats), each 64-byte aligned */
    const size_t b_keys = up64(npairs * sizeof(pair_key)), b_dist = up64(npairs * sizeof(int32_t)),
                 b_zy = up64(npairs * L * sizeof(float)), b_scr = up64(2 * npairs * I * sizeof(float));
    const size_t need = b_keys + b_dist + 2 * b_zy + b_scr;
    void *own = NULL, *buf;
    if (ws && need <= ws->cap) buf = ws->buf;
    else if (ws && need <= EXPERT_BATCH_WS_KEEP) {
        expert_batch_ws_free(ws);
        if ((ws->buf = aligned_alloc(64, need))) ws->cap = need;
        buf = ws->buf;
    } else buf = own = aligned_alloc(64, need);
    if (!buf) return k3_fail(err, "out of memory computing experts of layer %d", layer);
    pair_key *keys = buf;
    int32_t *distinct = (int32_t *)((char *)buf + b_keys);
    float *z = (float *)((char *)buf + b_keys + b_dist), *y = (float *)((char *)z + b_zy);
    float *scratch = (float *)((char *)y + b_zy);
    int rc = -1;
    for (size_t i = 0; i < npairs; i++) {
        if (pair_token[i] < 0 || (size_t)pair_token[i] >= ntok) {
            k3_fail(err, "pair %zu names token slot %d of a %zu-token request", i, pair_token[i], ntok);
            goto out;
        }
        keys[i] = (pair_key){pair_expert[i], (uint32_t)i};
    }
    qsort(keys, npairs, sizeof *keys, cmp_pair);
    size_t nd = 0;
    for (size_t i = 0; i < npairs; i++)
        if (i == 0 || keys[i].expert != keys[i - 1].expert) distinct[nd++] = keys[i].expert;
    if (src->prefetch && src->prefetch(src->ctx, layer, distinct, nd, err)) goto out;
    for (size_t i = 0; i < npairs;) {
        size_t j = i;
        while (j < npairs && keys[j].expert == keys[i].expert) j++;
        expert_weights w;
        if (src->acquire(src->ctx, layer, keys[i].expert, &w, err)) goto out;
        size_t n = j - i;
        for (size_t q = 0; q < n; q++) memcpy(z + q * L, zlat + (size_t)pair_token[keys[i + q].pair] * L, L * sizeof *z);
        expert_compute(k, &w, situ_beta, situ_linear_beta, z, n, y, scratch);
        if (src->release) src->release(src->ctx, layer, keys[i].expert);
        for (size_t q = 0; q < n; q++) memcpy(out + (size_t)keys[i + q].pair * L, y + q * L, L * sizeof *y);
        i = j;
    }
    rc = 0;
out:
    free(own);
    return rc;
}
