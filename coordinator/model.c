/* model.c - load and validate trunk weights from the layer schema (see model.h). */
#include "coordinator/model.h"
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where each schema row's `field` lives: an offset into k3_model (MODEL rows) or
 * into layer_weights (every layer table). Generated from the same X-macro rows. */
#define OFF_MODEL(field, ...) offsetof(k3_model, field),
#define OFF_LAYER(field, ...) offsetof(layer_weights, field),
static const size_t MODEL_OFF[] = {LS_MODEL_TENSORS(OFF_MODEL)};
static const size_t LAYER_OFF[] = {LS_LAYER_TENSORS(OFF_LAYER)};
static const size_t KDA_OFF[] = {LS_KDA_TENSORS(OFF_LAYER)};
static const size_t MLA_OFF[] = {LS_MLA_TENSORS(OFF_LAYER)};
static const size_t MLP_OFF[] = {LS_MLP_TENSORS(OFF_LAYER)};
static const size_t MOE_OFF[] = {LS_MOE_TENSORS(OFF_LAYER)};
static const size_t *const FIELD_OFF[LS_NKINDS] = {
    [LS_MODEL] = MODEL_OFF, [LS_LAYER] = LAYER_OFF, [LS_KDA] = KDA_OFF,
    [LS_MLA] = MLA_OFF,     [LS_MLP] = MLP_OFF,     [LS_MOE] = MOE_OFF,
};

static void *field_of(k3_model *m, const ls_item *it) {
    char *base = it->layer < 0 ? (char *)m : (char *)&m->layers[it->layer];
    return base + FIELD_OFF[it->tb->kind][it->row];
}

/* THE reader of small vectors: the first n values of a small F32/BF16 tensor
 * into a new float array (every norm, bias, conv tap, A_log and AttnRes vector
 * comes through here); checkpoint_read_floats refuses a NaN or Inf anywhere in
 * the tensor, naming it and the element. */
static float *read_small(checkpoint *ck, const ckpt_entry *e, size_t n, k3_error *err) {
    return checkpoint_read_floats(ck, e, n, err);
}

/* Locates, checks and (small vectors) reads one layout item into its field.
 * *fold carries an AttnRes norm vector to the projection row that follows it. */
static int load_item(k3_model *m, ls_item *it, float **fold, k3_error *err) {
    char name[512];
    if (ls_tensor_name(it->tb, it->t, it->layer, -1, name, sizeof name))
        return k3_fail(err, "internal: tensor name too long (%s)", it->t->suffix);
    const ckpt_entry *e = checkpoint_find(&m->ck, name);
    if (!e) return k3_fail(err, "missing tensor '%s'", name);
    if (ls_check(&m->cfg, it->t, e, err)) return -1;
    it->e = e;
    it->bytes = e->t->end - e->t->begin;
    void *f = field_of(m, it);
    switch (it->t->place) {
    case LS_TRUNK:
    case LS_EMBED:
    case LS_LM_HEAD:
        *(dense_weight *)f = (dense_weight){.dtype = e->t->dtype == ST_F32 ? DTYPE_F32 : DTYPE_BF16,
                                            .rows = (size_t)ls_dim_value(&m->cfg, it->t->dim[0]),
                                            .cols = (size_t)ls_dim_value(&m->cfg, it->t->dim[1]),
                                            .unit = -1}; /* trunk_create gives trunk matrices their place */
        if (it->t->place == LS_EMBED) m->embed_entry = e;
        if (it->t->place == LS_LM_HEAD) m->lm_head_entry = e;
        return 0;
    case LS_SMALL:
    case LS_SMALL_PREFIX:
        return (*(float **)f = read_small(&m->ck, e, (size_t)it->numel, err)) ? 0 : -1;
    case LS_FOLD_NORM:
        free(*fold);
        return (*fold = read_small(&m->ck, e, (size_t)it->numel, err)) ? 0 : -1;
    case LS_FOLD_PROJ: { /* w_norm [E] and w_proj [1, E] folded into one double vector (exact in double) */
        if (!*fold) return k3_fail(err, "internal: '%s' has no norm row before it in the schema", name);
        float *wp = read_small(&m->ck, e, (size_t)it->numel, err);
        double *out = wp ? malloc((size_t)it->numel * sizeof *out) : NULL;
        if (wp && !out) k3_fail(err, "out of memory reading tensor '%s'", name);
        for (size_t i = 0; out && i < it->numel; i++) out[i] = (double)(*fold)[i] * (double)wp[i];
        free(wp);
        free(*fold);
        *fold = NULL;
        *(double **)f = out;
        return out ? 0 : -1;
    }
    case LS_EXPERT_PART: break;
    }
    return k3_fail(err, "internal: tensor '%s' has no place in the trunk", name);
}

/* The trunk units from the layout's grouping: data pointers to fill, entries to read. */
static int build_units(k3_model *m, k3_error *err) {
    ls_layout *lay = &m->layout;
    m->units = calloc((size_t)lay->n_units + 1, sizeof *m->units);
    if (!m->units) return k3_fail(err, "out of memory for %d trunk units", lay->n_units);
    for (int u = 0; u < lay->n_units; u++) {
        const ls_unit *lu = &lay->units[u];
        trunk_unit *tu = &m->units[u];
        tu->n = lu->n;
        tu->bytes = lu->bytes;
        snprintf(tu->label, sizeof tu->label, "%s", lu->label);
        for (int j = 0; j < lu->n; j++) {
            ls_item *it = &lay->items[lu->items[j]];
            tu->w[j] = field_of(m, it);
            tu->e[j] = it->e;
        }
    }
    m->n_units = lay->n_units;
    m->max_unit_bytes = lay->max_matrix_bytes;
    return 0;
}

int model_load(const char *dir, k3_model *m, k3_error *err) {
    memset(m, 0, sizeof *m);
    if (config_load(dir, &m->cfg, err)) return -1;
    if (checkpoint_open(dir, &m->ck, err)) { config_free(&m->cfg); return -1; }
    const k3_config *c = &m->cfg;
    int rc = -1;
    float *fold = NULL;
    if (ls_layout_build(c, &m->layout, err)) goto out;
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    if (!m->layers) { k3_fail(err, "out of memory"); goto out; }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        m->layers[l].is_mla = c->layer_is_mla[l];
        m->layers[l].is_moe = c->layer_is_moe[l];
    }
    for (int i = 0; i < m->layout.n_items; i++)
        if (load_item(m, &m->layout.items[i], &fold, err)) goto out;
    if (ls_layout_group(&m->layout, err) || build_units(m, err)) goto out;
    if (expert_store_open(&m->experts, &m->ck, c, NULL, NULL, err)) goto out;
    rc = 0;
out:
    free(fold);
    if (rc) model_free(m);
    return rc;
}

void model_free(k3_model *m) {
    for (int i = 0; m->layers && i < m->layout.n_items; i++) { /* every array read_small or a fold made */
        const ls_item *it = &m->layout.items[i];
        ls_place p = it->t->place;
        if (p == LS_SMALL || p == LS_SMALL_PREFIX || p == LS_FOLD_PROJ) {
            void **f = field_of(m, it);
            free(*f);
            *f = NULL;
        }
    }
    free(m->layers);
    free(m->units);
    ls_layout_free(&m->layout);
    expert_store_free(&m->experts);
    checkpoint_close(&m->ck);
    config_free(&m->cfg);
    memset(m, 0, sizeof *m);
}
