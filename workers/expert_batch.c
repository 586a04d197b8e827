/* expert_batch.c - pairs grouped by expert, computed once per expert (see expert_batch.h). */
#include "workers/expert_batch.h"
#include <stdlib.h>

#include "common/activations.h"
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
    else if (ws) {
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
    /* experts in groups of up to max_held (EXPERT_BATCH_GROUP_MAX): every w1/w3 product of a
     * group in one parallel region, every w2 product in another */
    size_t gmax = src->max_held > 1 ? src->max_held : 1;
    if (gmax > EXPERT_BATCH_GROUP_MAX) gmax = EXPERT_BATCH_GROUP_MAX;
    for (size_t i = 0; i < npairs;) {
        size_t ge = 0, s = i, lo[EXPERT_BATCH_GROUP_MAX], hi[EXPERT_BATCH_GROUP_MAX];
        /* a group: the next experts up to max_held, ending before one still being read */
        while (s < npairs && ge < gmax) {
            if (ge > 0 && src->ready && !src->ready(src->ctx, layer, keys[s].expert)) break;
            size_t j = s;
            while (j < npairs && keys[j].expert == keys[s].expert) j++;
            lo[ge] = s;
            hi[ge++] = j;
            s = j;
        }
        expert_weights w[EXPERT_BATCH_GROUP_MAX];
        size_t held = 0;
        for (; held < ge; held++)
            if (src->acquire(src->ctx, layer, keys[lo[held]].expert, &w[held], err)) break;
        if (held < ge) {
            for (size_t e = 0; e < held; e++)
                if (src->release) src->release(src->ctx, layer, keys[lo[e]].expert);
            goto out;
        }
        mxfp4_weight W13[2 * EXPERT_BATCH_GROUP_MAX], W2[EXPERT_BATCH_GROUP_MAX];
        const float *x13[2 * EXPERT_BATCH_GROUP_MAX], *x2[EXPERT_BATCH_GROUP_MAX];
        float *y13[2 * EXPERT_BATCH_GROUP_MAX], *y2[EXPERT_BATCH_GROUP_MAX];
        size_t n13[2 * EXPERT_BATCH_GROUP_MAX], n2[EXPERT_BATCH_GROUP_MAX];
        for (size_t e = 0; e < ge; e++) {
            size_t n = hi[e] - lo[e];
            const float *ze = zlat + (size_t)pair_token[keys[lo[e]].pair] * L; /* one token: its row as is */
            if (n > 1) {
                float *zc = z + lo[e] * L;
                for (size_t q = 0; q < n; q++)
                    memcpy(zc + q * L, zlat + (size_t)pair_token[keys[lo[e] + q].pair] * L, L * sizeof *z);
                ze = zc;
            }
            float *g = scratch + 2 * lo[e] * I, *u = g + n * I;
            W13[2 * e] = w[e].w1, W13[2 * e + 1] = w[e].w3;
            x13[2 * e] = x13[2 * e + 1] = ze;
            y13[2 * e] = g, y13[2 * e + 1] = u;
            n13[2 * e] = n13[2 * e + 1] = n;
            W2[e] = w[e].w2, x2[e] = g, y2[e] = y + lo[e] * L, n2[e] = n;
        }
        matmul_mxfp4_list(k, W13, x13, n13, y13, 2 * ge);
        /* the group's activations split over the threads (each expert's alone may be too small
         * for situ_glu to split) */
#pragma omp parallel for schedule(static) if (ge > 1)
        for (size_t e = 0; e < ge; e++) {
            size_t n = hi[e] - lo[e];
            float *g = scratch + 2 * lo[e] * I;
            situ_glu(g, g, g + n * I, n * I, situ_beta, situ_linear_beta);
        }
        matmul_mxfp4_list(k, W2, x2, n2, y2, ge);
        for (size_t e = 0; e < ge; e++)
            if (src->release) src->release(src->ctx, layer, keys[lo[e]].expert);
        for (size_t q = i; q < s; q++) memcpy(out + (size_t)keys[q].pair * L, y + q * L, L * sizeof *y);
        i = s;
    }
    rc = 0;
out:
    free(own);
    return rc;
}
