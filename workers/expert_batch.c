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

int expert_batch_run(const kernels *k, const expert_source *src, size_t L, size_t I, double situ_beta,
                     double situ_linear_beta, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
                     const int32_t *pair_expert, size_t npairs, float *out, k3_error *err) {
    if (npairs == 0) return 0;
    pair_key *keys = malloc(npairs * sizeof *keys);
    int32_t *distinct = malloc(npairs * sizeof *distinct);
    float *z = malloc(npairs * L * sizeof *z), *y = malloc(npairs * L * sizeof *y);
    float *scratch = malloc(2 * npairs * I * sizeof *scratch);
    int rc = -1;
    if (!keys || !distinct || !z || !y || !scratch) { k3_fail(err, "out of memory computing experts of layer %d", layer); goto out; }
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
    free(keys); free(distinct); free(z); free(y); free(scratch);
    return rc;
}
