/* layer_schema.c - the tables of layer_schema.h as data, and what derives from them. */
#include "common/layer_schema.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LS_ROW(field, suffix, place, unit, cond, dtype, ndim, d0, d1, d2) \
    {#field, suffix, place, unit, cond, dtype, ndim, {d0, d1, d2}},

static const ls_tensor MODEL_ROWS[] = {LS_MODEL_TENSORS(LS_ROW)};
static const ls_tensor LAYER_ROWS[] = {LS_LAYER_TENSORS(LS_ROW)};
static const ls_tensor KDA_ROWS[] = {LS_KDA_TENSORS(LS_ROW)};
static const ls_tensor MLA_ROWS[] = {LS_MLA_TENSORS(LS_ROW)};
static const ls_tensor MLP_ROWS[] = {LS_MLP_TENSORS(LS_ROW)};
static const ls_tensor MOE_ROWS[] = {LS_MOE_TENSORS(LS_ROW)};
static const ls_tensor EXPERT_ROWS[] = {LS_EXPERT_TENSORS(LS_ROW)};

_Static_assert(sizeof EXPERT_ROWS / sizeof EXPERT_ROWS[0] == LS_EXPERT_NT, "LS_EXPERT_NT");

#define N_OF(a) (int)(sizeof(a) / sizeof(a)[0])
#define LAYER_SCOPE "language_model.model.layers.%d."
#define EXPERT_SCOPE LAYER_SCOPE "block_sparse_moe.experts.%d."

static const ls_table TABLES[LS_NKINDS] = {
    [LS_MODEL] = {LS_MODEL, "model", "language_model.", MODEL_ROWS, N_OF(MODEL_ROWS)},
    [LS_LAYER] = {LS_LAYER, "layer", LAYER_SCOPE, LAYER_ROWS, N_OF(LAYER_ROWS)},
    [LS_KDA] = {LS_KDA, "KDA", LAYER_SCOPE, KDA_ROWS, N_OF(KDA_ROWS)},
    [LS_MLA] = {LS_MLA, "MLA", LAYER_SCOPE, MLA_ROWS, N_OF(MLA_ROWS)},
    [LS_MLP] = {LS_MLP, "MLP", LAYER_SCOPE, MLP_ROWS, N_OF(MLP_ROWS)},
    [LS_MOE] = {LS_MOE, "MoE", LAYER_SCOPE, MOE_ROWS, N_OF(MOE_ROWS)},
    [LS_EXPERT] = {LS_EXPERT, "expert", EXPERT_SCOPE, EXPERT_ROWS, N_OF(EXPERT_ROWS)},
};

const ls_table *ls_table_get(ls_kind kind) { return kind >= 0 && kind < LS_NKINDS ? &TABLES[kind] : NULL; }

ls_kind ls_attn_kind(const k3_config *c, int layer) { return c->layer_is_mla[layer] ? LS_MLA : LS_KDA; }
ls_kind ls_ffn_kind(const k3_config *c, int layer) { return c->layer_is_moe[layer] ? LS_MOE : LS_MLP; }

uint64_t ls_dim_value(const k3_config *c, ls_dim d) {
    uint64_t Hm = (uint64_t)c->num_attention_heads, nope = (uint64_t)c->qk_nope_head_dim,
             rope = (uint64_t)c->qk_rope_head_dim, vd = (uint64_t)c->v_head_dim;
    switch (d) {
    case LS_1: return 1;
    case LS_E: return (uint64_t)c->hidden_size;
    case LS_V: return (uint64_t)c->vocab_size;
    case LS_KDA_P: return (uint64_t)c->kda_num_heads * (uint64_t)c->kda_head_dim;
    case LS_KDA_D: return (uint64_t)c->kda_head_dim;
    case LS_KDA_H: return (uint64_t)c->kda_num_heads;
    case LS_CONV_K: return (uint64_t)c->short_conv_kernel_size;
    case LS_MLA_QR: return (uint64_t)c->q_lora_rank;
    case LS_MLA_KR: return (uint64_t)c->kv_lora_rank;
    case LS_MLA_Q: return Hm * (nope + rope);
    case LS_MLA_KVA: return (uint64_t)c->kv_lora_rank + rope;
    case LS_MLA_KVB: return Hm * (nope + vd);
    case LS_MLA_V: return Hm * vd;
    case LS_MLP_I: return (uint64_t)c->intermediate_size;
    case LS_N_EXP: return (uint64_t)c->num_experts;
    case LS_LAT: return (uint64_t)c->routed_expert_hidden_size;
    case LS_SHARED_I: return (uint64_t)c->moe_intermediate_size * (uint64_t)c->num_shared_experts;
    case LS_EXP_I: return (uint64_t)c->moe_intermediate_size;
    case LS_LAT_PACK: return (uint64_t)c->routed_expert_hidden_size / 2;
    case LS_LAT_SCALE: return (uint64_t)c->routed_expert_hidden_size / 32;
    case LS_EXP_I_PACK: return (uint64_t)c->moe_intermediate_size / 2;
    case LS_EXP_I_SCALE: return (uint64_t)c->moe_intermediate_size / 32;
    case LS_NDIMS: break;
    }
    return 0;
}

const char *ls_dim_name(ls_dim d) {
    static const char *const NAMES[LS_NDIMS] = {
        [LS_1] = "1",
        [LS_E] = "hidden_size",
        [LS_V] = "vocab_size",
        [LS_KDA_P] = "kda_num_heads*kda_head_dim",
        [LS_KDA_D] = "kda_head_dim",
        [LS_KDA_H] = "kda_num_heads",
        [LS_CONV_K] = "short_conv_kernel_size",
        [LS_MLA_QR] = "q_lora_rank",
        [LS_MLA_KR] = "kv_lora_rank",
        [LS_MLA_Q] = "num_attention_heads*(qk_nope_head_dim+qk_rope_head_dim)",
        [LS_MLA_KVA] = "kv_lora_rank+qk_rope_head_dim",
        [LS_MLA_KVB] = "num_attention_heads*(qk_nope_head_dim+v_head_dim)",
        [LS_MLA_V] = "num_attention_heads*v_head_dim",
        [LS_MLP_I] = "intermediate_size",
        [LS_N_EXP] = "num_experts",
        [LS_LAT] = "routed_expert_hidden_size",
        [LS_SHARED_I] = "moe_intermediate_size*num_shared_experts",
        [LS_EXP_I] = "moe_intermediate_size",
        [LS_LAT_PACK] = "routed_expert_hidden_size/2",
        [LS_LAT_SCALE] = "routed_expert_hidden_size/32",
        [LS_EXP_I_PACK] = "moe_intermediate_size/2",
        [LS_EXP_I_SCALE] = "moe_intermediate_size/32",
    };
    return d >= 0 && d < LS_NDIMS ? NAMES[d] : "?";
}

int ls_cond_holds(const k3_config *c, ls_cond cond) {
    switch (cond) {
    case LS_ALWAYS: return 1;
    case LS_IF_MLA_GATE: return c->mla_use_output_gate != 0;
    case LS_IF_LATENT_NORM: return c->latent_moe_use_norm != 0;
    case LS_IF_SHARED: return c->num_shared_experts > 0 && c->moe_intermediate_size > 0;
    }
    return 0;
}

uint64_t ls_numel(const k3_config *c, const ls_tensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= ls_dim_value(c, t->dim[i]);
    return n;
}

uint64_t ls_widest_trunk_input(const k3_config *c) {
    int present[LS_NKINDS] = {0}; /* the kinds some layer has (a config without dense layers has no MLP) */
    present[LS_MODEL] = 1;
    for (int l = 0; l < c->num_hidden_layers; l++) present[ls_attn_kind(c, l)] = present[ls_ffn_kind(c, l)] = 1;
    uint64_t w = 0;
    for (int k = 0; k < LS_NKINDS; k++)
        for (int r = 0; present[k] && r < TABLES[k].n; r++) {
            const ls_tensor *t = &TABLES[k].rows[r];
            if ((t->place != LS_TRUNK && t->place != LS_LM_HEAD) || t->ndim != 2 || !ls_cond_holds(c, t->cond)) continue;
            uint64_t cols = ls_dim_value(c, t->dim[1]);
            if (cols > w) w = cols;
        }
    return w;
}

int ls_dtype_ok(const ls_tensor *t, st_dtype d) {
    return t->dtype == LS_U8 ? d == ST_U8 : d == ST_F32 || d == ST_BF16;
}

size_t ls_release_size(const ls_tensor *t) { return t->dtype == LS_F32 ? 4 : t->dtype == LS_BF16 ? 2 : 1; }

const char *ls_dtype_text(const ls_tensor *t) { return t->dtype == LS_U8 ? "U8 (packed MXFP4)" : "F32 or BF16"; }

int ls_tensor_name(const ls_table *tb, const ls_tensor *t, int layer, int expert, char *buf, size_t len) {
    int n;
    if (tb->kind == LS_MODEL) n = snprintf(buf, len, "language_model.%s", t->suffix);
    else if (tb->kind == LS_EXPERT) n = snprintf(buf, len, EXPERT_SCOPE "%s", layer, expert, t->suffix);
    else n = snprintf(buf, len, LAYER_SCOPE "%s", layer, t->suffix);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* A decimal index: digits only, no sign, no leading zero, below 2^31. */
static const char *parse_index(const char *s, int *out) {
    if (*s < '0' || *s > '9' || (s[0] == '0' && s[1] >= '0' && s[1] <= '9')) return NULL;
    long v = 0;
    for (; *s >= '0' && *s <= '9'; s++)
        if ((v = v * 10 + (*s - '0')) > 0x7fffffffL) return NULL;
    *out = (int)v;
    return s;
}

int ls_expert_name_parse(const char *name, int *layer, int *expert) {
    static const char A[] = "language_model.model.layers.", B[] = ".block_sparse_moe.experts.";
    int l, e;
    if (strncmp(name, A, sizeof A - 1)) return 0;
    const char *s = parse_index(name + sizeof A - 1, &l);
    if (!s || strncmp(s, B, sizeof B - 1)) return 0;
    s = parse_index(s + sizeof B - 1, &e);
    if (!s || *s != '.') return 0;
    *layer = l;
    *expert = e;
    return 1;
}

static void shape_text(int ndim, const uint64_t *dims, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && o < len; i++) o += (size_t)snprintf(buf + o, len - o, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

int ls_check(const k3_config *c, const ls_tensor *t, const ckpt_entry *e, k3_error *err) {
    const st_tensor *s = e->t;
    if (!ls_dtype_ok(t, s->dtype))
        return k3_fail(err, "tensor '%s': dtype %s, expected %s", e->name, st_dtype_name(s->dtype), ls_dtype_text(t));
    if (t->place == LS_SMALL_PREFIX) { /* A_log: stored with any length >= H (the release pads it); per HEAD */
        uint64_t want = ls_dim_value(c, t->dim[0]), numel = 1;
        int leading_ones = 1;
        for (int i = 0; i < s->ndim; i++) numel *= s->shape[i];
        for (int i = 0; i + 1 < s->ndim; i++) leading_ones &= s->shape[i] == 1;
        if (s->ndim < 1 || !leading_ones || numel < want)
            return k3_fail(err, "tensor '%s': expected a vector of at least %llu (%s) values", e->name,
                           (unsigned long long)want, ls_dim_name(t->dim[0]));
        return 0;
    }
    uint64_t dims[3];
    int ok = s->ndim == t->ndim;
    for (int i = 0; i < t->ndim; i++) {
        dims[i] = ls_dim_value(c, t->dim[i]);
        ok = ok && s->shape[i] == dims[i];
    }
    if (ok) return 0;
    char have[160], want[96];
    shape_text(s->ndim, s->shape, have, sizeof have);
    shape_text(t->ndim, dims, want, sizeof want);
    return k3_fail(err, "tensor '%s': shape %s, expected %s", e->name, have, want);
}

uint64_t ls_expert_bytes(const k3_config *c) {
    uint64_t b = 0;
    for (int i = 0; i < N_OF(EXPERT_ROWS); i++) b += ls_numel(c, &EXPERT_ROWS[i]) * ls_release_size(&EXPERT_ROWS[i]);
    return b;
}

static int add_table(const k3_config *c, ls_layout *lay, ls_kind kind, int layer) {
    const ls_table *tb = &TABLES[kind];
    for (int r = 0; r < tb->n; r++) {
        const ls_tensor *t = &tb->rows[r];
        if (!ls_cond_holds(c, t->cond)) continue;
        ls_item *it = &lay->items[lay->n_items];
        *it = (ls_item){.tb = tb, .t = t, .row = r, .layer = layer, .numel = ls_numel(c, t), .unit = -1};
        it->bytes = it->numel * ls_release_size(t);
        if (t->place == LS_EMBED) lay->embed_item = lay->n_items;
        if (t->place == LS_LM_HEAD) lay->lm_head_item = lay->n_items;
        lay->n_items++;
    }
    return 0;
}

int ls_layout_build(const k3_config *c, ls_layout *lay, k3_error *err) {
    memset(lay, 0, sizeof *lay);
    int layers = c->num_hidden_layers, cap = TABLES[LS_MODEL].n;
    for (int l = 0; l < layers; l++) {
        cap += TABLES[LS_LAYER].n + TABLES[ls_attn_kind(c, l)].n + TABLES[ls_ffn_kind(c, l)].n;
        lay->n_moe_layers += c->layer_is_moe[l] != 0;
        lay->n_mla_layers += c->layer_is_mla[l] != 0;
    }
    lay->items = calloc((size_t)cap, sizeof *lay->items);
    if (!lay->items) return k3_fail(err, "out of memory for the model layout (%d tensors)", cap);
    lay->embed_item = lay->lm_head_item = -1;
    add_table(c, lay, LS_MODEL, -1);
    for (int l = 0; l < layers; l++) {
        add_table(c, lay, LS_LAYER, l);
        add_table(c, lay, ls_attn_kind(c, l), l);
        add_table(c, lay, ls_ffn_kind(c, l), l);
    }
    return 0;
}

int ls_layout_group(ls_layout *lay, k3_error *err) {
    free(lay->units);
    lay->units = NULL;
    lay->n_units = 0;
    lay->max_matrix_bytes = 0;
    int n_trunk = 0;
    for (int i = 0; i < lay->n_items; i++) {
        lay->items[i].unit = -1;
        if (lay->items[i].t->place != LS_TRUNK) continue;
        n_trunk++;
        if (lay->items[i].bytes > lay->max_matrix_bytes) lay->max_matrix_bytes = lay->items[i].bytes;
    }
    lay->units = calloc((size_t)n_trunk + 1, sizeof *lay->units); /* at most one unit per matrix */
    if (!lay->units) return k3_fail(err, "out of memory for %d trunk units", n_trunk);
    ls_unit *u = NULL;
    for (int i = 0; i < lay->n_items; i++) {
        ls_item *it = &lay->items[i];
        if (it->t->place != LS_TRUNK) continue;
        int same_part = u && u->layer == it->layer && u->part == it->t->unit;
        if (!same_part || u->n == LS_UNIT_MAX || u->bytes + it->bytes > lay->max_matrix_bytes) {
            ls_unit *nu = &lay->units[lay->n_units++];
            *nu = (ls_unit){.layer = it->layer, .part = it->t->unit};
            if (same_part) snprintf(nu->label, sizeof nu->label, "%.40s+", u->label); /* a part cut in two */
            else snprintf(nu->label, sizeof nu->label, "layer %d %s", it->layer, it->tb->name);
            u = nu;
        }
        it->unit = lay->n_units - 1;
        u->items[u->n++] = i;
        u->bytes += it->bytes;
    }
    return 0;
}

void ls_layout_free(ls_layout *lay) {
    free(lay->items);
    free(lay->units);
    memset(lay, 0, sizeof *lay);
}
