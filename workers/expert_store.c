/* expert_store.c - locate and validate routed experts (see expert_store.h). */
#include "workers/expert_store.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const PART_NAME[EXPERT_NT] = {
    "w1.weight_packed", "w1.weight_scale", "w2.weight_packed", "w2.weight_scale", "w3.weight_packed", "w3.weight_scale",
};

static int check_u8(const ckpt_entry *e, const char *name, uint64_t rows, uint64_t cols, k3_error *err) {
    const st_tensor *t = e->t;
    if (t->dtype != ST_U8)
        return k3_fail(err, "tensor '%s': dtype %s, expected U8 (packed MXFP4)", name, st_dtype_name(t->dtype));
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return k3_fail(err, "tensor '%s': shape [%llu, %llu] (ndim %d), expected [%llu, %llu]", name,
                       (unsigned long long)(t->ndim > 0 ? t->shape[0] : 0), (unsigned long long)(t->ndim > 1 ? t->shape[1] : 0),
                       t->ndim, (unsigned long long)rows, (unsigned long long)cols);
    return 0;
}

int expert_store_open(expert_store *st, checkpoint *ck, const k3_config *cfg,
                      int (*want)(int layer, int expert, void *ctx), void *ctx, k3_error *err) {
    memset(st, 0, sizeof *st);
    st->n_layers = cfg->num_hidden_layers;
    st->n_experts = cfg->num_experts;
    st->I = (size_t)cfg->moe_intermediate_size;
    st->L = (size_t)cfg->routed_expert_hidden_size;
    st->loc = calloc((size_t)st->n_layers * (size_t)st->n_experts, sizeof *st->loc);
    if (!st->loc) return k3_fail(err, "out of memory for the expert table");
    const uint64_t I = st->I, L = st->L;
    /* rows, cols (logical) of w1, w2, w3 */
    const uint64_t rows[3] = {I, L, I}, cols[3] = {L, I, L};
    st->expert_bytes = 0;
    for (int m = 0; m < 3; m++) st->expert_bytes += rows[m] * (cols[m] / 2) + rows[m] * (cols[m] / 32);
    char name[512];
    for (int l = 0; l < st->n_layers; l++) {
        if (!cfg->layer_is_moe[l]) continue;
        for (int e = 0; e < st->n_experts; e++) {
            if (want && !want(l, e, ctx)) continue;
            expert_loc *loc = &st->loc[(size_t)l * st->n_experts + e];
            for (int p = 0; p < EXPERT_NT; p++) {
                snprintf(name, sizeof name, "language_model.model.layers.%d.block_sparse_moe.experts.%d.%s", l, e, PART_NAME[p]);
                const ckpt_entry *ce = checkpoint_find(ck, name);
                if (!ce) { expert_store_free(st); return k3_fail(err, "missing tensor '%s' (a checkpoint must hold every expert)", name); }
                int m = p / 2;
                if (check_u8(ce, name, rows[m], p % 2 ? cols[m] / 32 : cols[m] / 2, err)) { expert_store_free(st); return -1; }
                loc->t[p] = ce;
            }
            loc->contiguous = 1;
            for (int p = 1; p < EXPERT_NT; p++)
                if (loc->t[p]->shard != loc->t[0]->shard || loc->t[p]->t->begin != loc->t[p - 1]->t->end) loc->contiguous = 0;
            loc->run_begin = loc->t[0]->t->begin;
            loc->run_end = loc->t[EXPERT_NT - 1]->t->end;
        }
    }
    return 0;
}

void expert_store_free(expert_store *st) {
    free(st->loc);
    memset(st, 0, sizeof *st);
}

const expert_loc *expert_store_loc(const expert_store *st, int layer, int expert) {
    if (layer < 0 || layer >= st->n_layers || expert < 0 || expert >= st->n_experts) return NULL;
    const expert_loc *loc = &st->loc[(size_t)layer * st->n_experts + expert];
    return loc->t[0] ? loc : NULL;
}

static void set_weights(const expert_store *st, const uint8_t *const part[EXPERT_NT], expert_weights *w) {
    w->w1 = (mxfp4_weight){st->I, st->L, part[EXPERT_W1_P], part[EXPERT_W1_S]};
    w->w2 = (mxfp4_weight){st->L, st->I, part[EXPERT_W2_P], part[EXPERT_W2_S]};
    w->w3 = (mxfp4_weight){st->I, st->L, part[EXPERT_W3_P], part[EXPERT_W3_S]};
}

void expert_weights_from_run(const expert_store *st, const expert_loc *loc, const uint8_t *base, expert_weights *w) {
    const uint8_t *part[EXPERT_NT];
    for (int p = 0; p < EXPERT_NT; p++) part[p] = base + (loc->t[p]->t->begin - loc->run_begin);
    set_weights(st, part, w);
}

int expert_weights_mapped(const expert_store *st, checkpoint *ck, int layer, int expert, expert_weights *w, k3_error *err) {
    const expert_loc *loc = expert_store_loc(st, layer, expert);
    if (!loc) return k3_fail(err, "expert %d of layer %d is not in this store", expert, layer);
    const uint8_t *part[EXPERT_NT];
    for (int p = 0; p < EXPERT_NT; p++)
        if (!(part[p] = checkpoint_data(ck, loc->t[p], err))) return -1;
    set_weights(st, part, w);
    return 0;
}

int expert_weights_check(const expert_weights *w, const expert_loc *loc, k3_error *err) {
    const mxfp4_weight *m[3] = {&w->w1, &w->w2, &w->w3};
    const int scale_part[3] = {EXPERT_W1_S, EXPERT_W2_S, EXPERT_W3_S};
    for (int i = 0; i < 3; i++) {
        size_t row;
        if (mxfp4_check_scales(m[i], &row))
            return k3_fail(err, "tensor '%s': scale byte 255 (NaN in MXFP4) in row %zu: refusing the expert", loc->t[scale_part[i]]->name, row);
    }
    return 0;
}
