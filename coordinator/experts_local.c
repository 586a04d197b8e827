/* experts_local.c - in-process expert computation (see experts_local.h). */
#include "coordinator/experts_local.h"
#include "workers/expert_batch.h"
#include <stdlib.h>

typedef struct {
    k3_model *m;
    const kernels *k;
} local_impl;

static int local_acquire(void *ctx, int layer, int expert, expert_weights *w, k3_error *err) {
    local_impl *li = ctx;
    const expert_loc *loc = expert_store_loc(&li->m->experts, layer, expert);
    if (!loc) return k3_fail(err, "layer %d has no routed expert %d", layer, expert);
    if (expert_weights_mapped(&li->m->experts, &li->m->ck, layer, expert, w, err)) return -1;
    return expert_weights_check(w, loc, err);
}

static int local_run(expert_backend *b, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
                     const int32_t *pair_expert, size_t npairs, float *out, k3_error *err) {
    local_impl *li = b->impl;
    expert_source src = {.acquire = local_acquire, .ctx = li};
    return expert_batch_run(li->k, &src, li->m->experts.L, li->m->experts.I, li->m->cfg.situ_beta,
                            li->m->cfg.situ_linear_beta, layer, zlat, ntok, pair_token, pair_expert, npairs, out, err);
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
