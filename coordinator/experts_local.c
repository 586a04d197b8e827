/* experts_local.c - in-process expert computation (see experts_local.h). */
#include "coordinator/experts_local.h"
#include "workers/expert_compute.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
    k3_model *m;
    const kernels *k;
} local_impl;

typedef struct { int32_t expert; uint32_t pair; } pair_key;

static int cmp_pair(const void *a, const void *b) {
    const pair_key *x = a, *y = b;
    if (x->expert != y->expert) return x->expert < y->expert ? -1 : 1;
    return x->pair < y->pair ? -1 : x->pair > y->pair;
}

static int local_run(expert_backend *b, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
                     const int32_t *pair_expert, size_t npairs, float *out, k3_error *err) {
    local_impl *li = b->impl;
    const expert_store *st = &li->m->experts;
    size_t L = st->L, I = st->I;
    pair_key *keys = malloc(npairs * sizeof *keys);
    float *z = malloc(npairs * L * sizeof *z), *y = malloc(npairs * L * sizeof *y);
    float *scratch = malloc(2 * npairs * I * sizeof *scratch);
    int rc = -1;
    if (!keys || !z || !y || !scratch) { k3_fail(err, "out of memory computing experts of layer %d", layer); goto out; }
    for (size_t i = 0; i < npairs; i++) {
        if (pair_token[i] < 0 || (size_t)pair_token[i] >= ntok) { k3_fail(err, "bad token slot %d", pair_token[i]); goto out; }
        keys[i] = (pair_key){pair_expert[i], (uint32_t)i};
    }
    qsort(keys, npairs, sizeof *keys, cmp_pair);
    for (size_t i = 0; i < npairs;) {
        size_t j = i;
        while (j < npairs && keys[j].expert == keys[i].expert) j++;
        expert_weights w;
        if (expert_weights_mapped(st, &li->m->ck, layer, keys[i].expert, &w, err) ||
            expert_weights_check(&w, expert_store_loc(st, layer, keys[i].expert), err))
            goto out;
        size_t n = j - i;
        for (size_t q = 0; q < n; q++) memcpy(z + q * L, zlat + (size_t)pair_token[keys[i + q].pair] * L, L * sizeof *z);
        expert_compute(li->k, &w, li->m->cfg.situ_beta, li->m->cfg.situ_linear_beta, z, n, y, scratch);
        for (size_t q = 0; q < n; q++) memcpy(out + (size_t)keys[i + q].pair * L, y + q * L, L * sizeof *y);
        i = j;
    }
    rc = 0;
out:
    free(keys); free(z); free(y); free(scratch);
    return rc;
}

static void local_destroy(expert_backend *b) {
    free(b->impl);
    b->impl = NULL;
}

int experts_local_create(expert_backend *b, k3_model *m, const kernels *k, k3_error *err) {
    local_impl *li = malloc(sizeof *li);
    if (!li) return k3_fail(err, "out of memory");
    li->m = m;
    li->k = k;
    *b = (expert_backend){local_run, local_destroy, li};
    return 0;
}
