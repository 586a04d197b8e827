/* model.c - load and validate trunk weights (see model.h). */
#include "coordinator/model.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    k3_model *m;
    trunk_unit *unit;    /* where big tensors are being collected, or NULL */
    const char *prefix;  /* "language_model.model." */
    k3_error *err;
    char name[512];
} loader;

static const ckpt_entry *find_tensor(loader *ld, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const ckpt_entry *find_tensor(loader *ld, const char *fmt, ...) {
    int n = snprintf(ld->name, sizeof ld->name, "%s", ld->prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ld->name + n, sizeof ld->name - (size_t)n, fmt, ap);
    va_end(ap);
    const ckpt_entry *e = checkpoint_find(&ld->m->ck, ld->name);
    if (!e) k3_fail(ld->err, "missing tensor '%s'", ld->name);
    return e;
}

static int check_float_dtype(loader *ld, const ckpt_entry *e) {
    if (e->t->dtype != ST_F32 && e->t->dtype != ST_BF16)
        return k3_fail(ld->err, "tensor '%s': dtype %s, expected F32 or BF16", e->name, st_dtype_name(e->t->dtype));
    return 0;
}

static void shape_str(const st_tensor *t, char *buf, size_t len) {
    size_t o = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < t->ndim && o < len; i++) o += (size_t)snprintf(buf + o, len - o, "%s%llu", i ? ", " : "", (unsigned long long)t->shape[i]);
    if (o < len) snprintf(buf + o, len - o, "]");
}

/* Checks the tensor has exactly the given dims (ndim = count of dims). */
static int check_shape(loader *ld, const ckpt_entry *e, int ndim, const uint64_t *dims) {
    int ok = e->t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = e->t->shape[i] == dims[i];
    if (ok) return 0;
    char have[128], want[128];
    shape_str(e->t, have, sizeof have);
    st_tensor tmp = {.ndim = ndim};
    for (int i = 0; i < ndim; i++) tmp.shape[i] = dims[i];
    shape_str(&tmp, want, sizeof want);
    return k3_fail(ld->err, "tensor '%s': shape %s, expected %s", e->name, have, want);
}

static int get_dense_e(loader *ld, const ckpt_entry *e, size_t rows, size_t cols, dense_weight *w) {
    if (!e || check_float_dtype(ld, e) || check_shape(ld, e, 2, (uint64_t[]){rows, cols})) return -1;
    *w = (dense_weight){e->t->dtype == ST_F32 ? DTYPE_F32 : DTYPE_BF16, rows, cols, NULL, -1, 0};
    trunk_unit *u = ld->unit;
    uint64_t bytes = e->t->end - e->t->begin;
    if (u && u->n > 0 && u->bytes + bytes > ld->m->max_unit_bytes) { /* part too big for one unit: split */
        k3_model *m = ld->m;
        trunk_unit *nu = &m->units[m->n_units++];
        snprintf(nu->label, sizeof nu->label, "%.40s+", u->label);
        ld->unit = u = nu;
    }
    if (u) {
        if (u->n == UNIT_MAX_TENSORS) return k3_fail(ld->err, "internal: too many tensors in %s", u->label);
        u->w[u->n] = w;
        u->e[u->n] = e;
        u->n++;
        u->bytes += e->t->end - e->t->begin;
    }
    return 0;
}

/* Starts collecting the big tensors of one layer part into a new unit. */
static void begin_unit(loader *ld, const char *fmt, int layer) {
    k3_model *m = ld->m;
    ld->unit = &m->units[m->n_units++];
    snprintf(ld->unit->label, sizeof ld->unit->label, fmt, layer);
}

/* The largest single trunk matrix (not an expert, not embedding / lm head):
 * units never exceed it, so it sets the streaming slot size. */
static uint64_t largest_trunk_tensor(const checkpoint *ck) {
    uint64_t mx = 0;
    for (size_t i = 0; i < ck->n_entries; i++) {
        const ckpt_entry *e = &ck->entries[i];
        if (strstr(e->name, ".experts.") || strstr(e->name, "embed_tokens") || strstr(e->name, "lm_head")) continue;
        if (e->t->end - e->t->begin > mx) mx = e->t->end - e->t->begin;
    }
    return mx;
}

#define DENSE(ld, w, rows, cols, ...) get_dense_e(ld, find_tensor(ld, __VA_ARGS__), rows, cols, w)

/* Reads the first `take` values of a small F32/BF16 tensor into a new float array. */
static float *copy_floats(loader *ld, const ckpt_entry *e, size_t take) {
    size_t es = e->t->dtype == ST_F32 ? 4 : 2;
    float *out = malloc(take * sizeof *out);
    void *raw = malloc(take * es);
    if (!out || !raw) { free(out); free(raw); k3_fail(ld->err, "out of memory"); return NULL; }
    if (checkpoint_read(&ld->m->ck, e, 0, raw, take * es, ld->err)) { free(out); free(raw); return NULL; }
    for (size_t i = 0; i < take; i++) {
        if (es == 4) memcpy(&out[i], (const char *)raw + 4 * i, 4);
        else { uint16_t b; memcpy(&b, (const char *)raw + 2 * i, 2); out[i] = bf16_to_f32(b); }
    }
    free(raw);
    return out;
}

/* A vector tensor: shape [n] (or dims given). */
static float *get_vec_e(loader *ld, const ckpt_entry *e, int ndim, const uint64_t *dims, size_t n) {
    if (!e || check_float_dtype(ld, e) || check_shape(ld, e, ndim, dims)) return NULL;
    return copy_floats(ld, e, n);
}
#define VEC(ld, n, ...) get_vec_e(ld, find_tensor(ld, __VA_ARGS__), 1, (uint64_t[]){n}, n)

/* AttnRes: w_norm [E] and w_proj [1, E] folded into one double vector (exact in double). */
static double *get_attn_res(loader *ld, const char *norm_name, const char *proj_name, int layer) {
    size_t E = (size_t)ld->m->cfg.hidden_size;
    float *wn = layer < 0 ? VEC(ld, E, "%s", norm_name) : VEC(ld, E, "layers.%d.%s", layer, norm_name);
    if (!wn) return NULL;
    const ckpt_entry *pe = layer < 0 ? find_tensor(ld, "%s", proj_name) : find_tensor(ld, "layers.%d.%s", layer, proj_name);
    float *wp = get_vec_e(ld, pe, 2, (uint64_t[]){1, E}, E);
    double *out = wp ? malloc(E * sizeof *out) : NULL;
    if (wp && !out) k3_fail(ld->err, "out of memory");
    for (size_t i = 0; out && i < E; i++) out[i] = (double)wn[i] * (double)wp[i];
    free(wn);
    free(wp);
    return out;
}

static int load_mlp(loader *ld, mlp_weights *w, size_t E, size_t I, int layer, const char *scope) {
    return DENSE(ld, &w->gate, I, E, "layers.%d.%s.gate_proj.weight", layer, scope) ||
           DENSE(ld, &w->up, I, E, "layers.%d.%s.up_proj.weight", layer, scope) ||
           DENSE(ld, &w->down, E, I, "layers.%d.%s.down_proj.weight", layer, scope);
}

static int load_kda(loader *ld, kda_weights *w, int l) {
    const k3_config *c = &ld->m->cfg;
    size_t E = (size_t)c->hidden_size, H = (size_t)c->kda_num_heads, D = (size_t)c->kda_head_dim, P = H * D,
           K = (size_t)c->short_conv_kernel_size;
    if (DENSE(ld, &w->q, P, E, "layers.%d.self_attn.q_proj.weight", l) ||
        DENSE(ld, &w->k, P, E, "layers.%d.self_attn.k_proj.weight", l) ||
        DENSE(ld, &w->v, P, E, "layers.%d.self_attn.v_proj.weight", l) ||
        DENSE(ld, &w->f_a, D, E, "layers.%d.self_attn.f_a_proj.weight", l) ||
        DENSE(ld, &w->f_b, P, D, "layers.%d.self_attn.f_b_proj.weight", l) ||
        DENSE(ld, &w->b, H, E, "layers.%d.self_attn.b_proj.weight", l) ||
        DENSE(ld, &w->g, P, E, "layers.%d.self_attn.g_proj.weight", l) ||
        DENSE(ld, &w->o, E, P, "layers.%d.self_attn.o_proj.weight", l))
        return -1;
    const uint64_t conv_dims[3] = {P, 1, K};
    if (!(w->conv_q = get_vec_e(ld, find_tensor(ld, "layers.%d.self_attn.q_conv1d.weight", l), 3, conv_dims, P * K)) ||
        !(w->conv_k = get_vec_e(ld, find_tensor(ld, "layers.%d.self_attn.k_conv1d.weight", l), 3, conv_dims, P * K)) ||
        !(w->conv_v = get_vec_e(ld, find_tensor(ld, "layers.%d.self_attn.v_conv1d.weight", l), 3, conv_dims, P * K)) ||
        !(w->dt_bias = VEC(ld, P, "layers.%d.self_attn.dt_bias", l)) ||
        !(w->o_norm = VEC(ld, D, "layers.%d.self_attn.o_norm.weight", l)))
        return -1;
    /* A_log: stored with any length >= H (the release pads it to head_dim); per HEAD. */
    const ckpt_entry *a = find_tensor(ld, "layers.%d.self_attn.A_log", l);
    if (!a || check_float_dtype(ld, a)) return -1;
    uint64_t numel = 1;
    for (int i = 0; i < a->t->ndim; i++) numel *= a->t->shape[i];
    int leading_ones = 1;
    for (int i = 0; i + 1 < a->t->ndim; i++) leading_ones &= a->t->shape[i] == 1;
    if (a->t->ndim < 1 || !leading_ones || numel < H)
        return k3_fail(ld->err, "tensor '%s': expected a vector of at least %zu (num_heads) values", a->name, H);
    return (w->a_log = copy_floats(ld, a, H)) ? 0 : -1;
}

static int load_mla(loader *ld, mla_weights *w, int l) {
    const k3_config *c = &ld->m->cfg;
    size_t E = (size_t)c->hidden_size, H = (size_t)c->num_attention_heads, qr = (size_t)c->q_lora_rank,
           kr = (size_t)c->kv_lora_rank, nope = (size_t)c->qk_nope_head_dim, rope = (size_t)c->qk_rope_head_dim,
           vd = (size_t)c->v_head_dim;
    /* registered in the order mla_forward uses them (the trunk walk order) */
    if (DENSE(ld, &w->q_a, qr, E, "layers.%d.self_attn.q_a_proj.weight", l) ||
        DENSE(ld, &w->q_b, H * (nope + rope), qr, "layers.%d.self_attn.q_b_proj.weight", l) ||
        DENSE(ld, &w->kv_a, kr + rope, E, "layers.%d.self_attn.kv_a_proj_with_mqa.weight", l))
        return -1;
    if (c->mla_use_output_gate && DENSE(ld, &w->g, H * vd, E, "layers.%d.self_attn.g_proj.weight", l)) return -1;
    if (DENSE(ld, &w->kv_b, H * (nope + vd), kr, "layers.%d.self_attn.kv_b_proj.weight", l) ||
        DENSE(ld, &w->o, E, H * vd, "layers.%d.self_attn.o_proj.weight", l))
        return -1;
    if (!(w->q_a_norm = VEC(ld, qr, "layers.%d.self_attn.q_a_layernorm.weight", l)) ||
        !(w->kv_a_norm = VEC(ld, kr, "layers.%d.self_attn.kv_a_layernorm.weight", l)))
        return -1;
    return 0;
}

static int load_moe(loader *ld, moe_weights *w, int l) {
    const k3_config *c = &ld->m->cfg;
    size_t E = (size_t)c->hidden_size, N = (size_t)c->num_experts, L = (size_t)c->routed_expert_hidden_size,
           Ish = (size_t)c->moe_intermediate_size * (size_t)c->num_shared_experts;
    if (DENSE(ld, &w->router, N, E, "layers.%d.block_sparse_moe.gate.weight", l) ||
        !(w->router_bias = VEC(ld, N, "layers.%d.block_sparse_moe.gate.e_score_correction_bias", l)) ||
        DENSE(ld, &w->lat_down, L, E, "layers.%d.block_sparse_moe.routed_expert_down_proj.weight", l) ||
        DENSE(ld, &w->lat_up, E, L, "layers.%d.block_sparse_moe.routed_expert_up_proj.weight", l))
        return -1;
    if (c->latent_moe_use_norm && !(w->lat_norm = VEC(ld, L, "layers.%d.block_sparse_moe.routed_expert_norm.weight", l)))
        return -1;
    if (Ish && load_mlp(ld, &w->shared, E, Ish, l, "block_sparse_moe.shared_experts")) return -1;
    return 0;
}

int model_load(const char *dir, k3_model *m, k3_error *err) {
    memset(m, 0, sizeof *m);
    if (config_load(dir, &m->cfg, err)) return -1;
    if (checkpoint_open(dir, &m->ck, err)) { config_free(&m->cfg); return -1; }
    loader ld = {.m = m, .err = err};
    int rc = -1;
    const k3_config *c = &m->cfg;
    size_t E = (size_t)c->hidden_size, V = (size_t)c->vocab_size;
    /* Names carry the release prefix (K3-MODEL.md section 2); expert servers look
     * their experts up under the same prefix. */
    const char *lm_name = "language_model.lm_head.weight";
    ld.prefix = "language_model.model.";
    if (DENSE(&ld, &m->embed, V, E, "embed_tokens.weight")) goto out;
    m->embed_entry = checkpoint_find(&m->ck, ld.name);
    m->lm_head_entry = checkpoint_find(&m->ck, lm_name);
    if (!m->lm_head_entry) { k3_fail(err, "missing tensor '%s'", lm_name); goto out; }
    if (get_dense_e(&ld, m->lm_head_entry, V, E, &m->lm_head)) goto out;
    if (!(m->final_norm = VEC(&ld, E, "norm.weight"))) goto out;
    if (!(m->out_res_w = get_attn_res(&ld, "output_attn_res_norm.weight", "output_attn_res_proj.weight", -1))) goto out;
    m->layers = calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    m->units = calloc(2 * (size_t)c->num_hidden_layers * UNIT_MAX_TENSORS, sizeof *m->units);
    m->max_unit_bytes = largest_trunk_tensor(&m->ck);
    if (!m->layers || !m->units) { k3_fail(err, "out of memory"); goto out; }
    for (int l = 0; l < c->num_hidden_layers; l++) {
        layer_weights *lw = &m->layers[l];
        lw->is_mla = c->layer_is_mla[l];
        lw->is_moe = c->layer_is_moe[l];
        if (!(lw->input_norm = VEC(&ld, E, "layers.%d.input_layernorm.weight", l)) ||
            !(lw->post_norm = VEC(&ld, E, "layers.%d.post_attention_layernorm.weight", l)) ||
            !(lw->attn_res_w = get_attn_res(&ld, "self_attention_res_norm.weight", "self_attention_res_proj.weight", l)) ||
            !(lw->mlp_res_w = get_attn_res(&ld, "mlp_res_norm.weight", "mlp_res_proj.weight", l)))
            goto out;
        begin_unit(&ld, lw->is_mla ? "layer %d MLA" : "layer %d KDA", l);
        if (lw->is_mla ? load_mla(&ld, &lw->mla, l) : load_kda(&ld, &lw->kda, l)) goto out;
        begin_unit(&ld, lw->is_moe ? "layer %d MoE" : "layer %d MLP", l);
        if (lw->is_moe ? load_moe(&ld, &lw->moe, l) : load_mlp(&ld, &lw->mlp, E, (size_t)c->intermediate_size, l, "mlp"))
            goto out;
        ld.unit = NULL;
    }
    if (expert_store_open(&m->experts, &m->ck, c, NULL, NULL, err)) goto out;
    rc = 0;
out:
    if (rc) model_free(m);
    return rc;
}

static void free_layer(layer_weights *lw) {
    free(lw->attn_res_w); free(lw->mlp_res_w); free(lw->input_norm); free(lw->post_norm);
    free(lw->kda.conv_q); free(lw->kda.conv_k); free(lw->kda.conv_v); free(lw->kda.dt_bias);
    free(lw->kda.a_log); free(lw->kda.o_norm);
    free(lw->mla.q_a_norm); free(lw->mla.kv_a_norm);
    free(lw->moe.router_bias); free(lw->moe.lat_norm);
}

void model_free(k3_model *m) {
    if (m->layers)
        for (int l = 0; l < m->cfg.num_hidden_layers; l++) free_layer(&m->layers[l]);
    free(m->layers);
    free(m->units);
    free(m->final_norm);
    free(m->out_res_w);
    expert_store_free(&m->experts);
    checkpoint_close(&m->ck);
    config_free(&m->cfg);
    memset(m, 0, sizeof *m);
}
