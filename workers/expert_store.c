/* expert_store.c - locate and validate routed experts (see expert_store.h). */
#include "workers/expert_store.h"
#include "common/layer_schema.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* expert_loc.t[] index of each row of the schema's expert table (its `field`). */
#define PART_INDEX(field, ...) field,
static const int PART[LS_EXPERT_NT] = {LS_EXPERT_TENSORS(PART_INDEX)};
_Static_assert(LS_EXPERT_NT == EXPERT_NT, "the schema's expert table and expert_loc.t[] disagree");

int expert_store_open(expert_store *st, checkpoint *ck, const k3_config *cfg,
                      int (*want)(int layer, int expert, void *ctx), void *ctx, k3_error *err) {
    memset(st, 0, sizeof *st);
    st->n_layers = cfg->num_hidden_layers;
    st->n_experts = cfg->num_experts;
    st->I = (size_t)cfg->moe_intermediate_size;
    st->L = (size_t)cfg->routed_expert_hidden_size;
    st->loc = calloc((size_t)st->n_layers * (size_t)st->n_experts, sizeof *st->loc);
    if (!st->loc) return k3_fail(err, "out of memory for the expert table");
    const ls_table *tb = ls_table_get(LS_EXPERT);
    st->expert_bytes = ls_expert_bytes(cfg);
    char name[512];
    for (int l = 0; l < st->n_layers; l++) {
        if (!cfg->layer_is_moe[l]) continue;
        for (int e = 0; e < st->n_experts; e++) {
            if (want && !want(l, e, ctx)) continue;
            expert_loc *loc = &st->loc[(size_t)l * st->n_experts + e];
            for (int r = 0; r < tb->n; r++) {
                if (ls_tensor_name(tb, &tb->rows[r], l, e, name, sizeof name)) {
                    expert_store_free(st);
                    return k3_fail(err, "internal: expert tensor name too long");
                }
                const ckpt_entry *ce = checkpoint_find(ck, name);
                if (!ce) { expert_store_free(st); return k3_fail(err, "missing tensor '%s' (a checkpoint must hold every expert)", name); }
                if (ls_check(cfg, &tb->rows[r], ce, err)) { expert_store_free(st); return -1; }
                loc->t[PART[r]] = ce;
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
    w->w1 = (mxfp4_weight){st->I, st->L, part[EXPERT_W1_P], part[EXPERT_W1_S], 0};
    w->w2 = (mxfp4_weight){st->L, st->I, part[EXPERT_W2_P], part[EXPERT_W2_S], 0};
    w->w3 = (mxfp4_weight){st->I, st->L, part[EXPERT_W3_P], part[EXPERT_W3_S], 0};
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
