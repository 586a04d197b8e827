/* state.c - allocation of per-sequence KDA / MLA state (see state.h). */
#include "coordinator/state.h"
#include <stdlib.h>
#include <string.h>

static size_t kda_s_floats(const k3_config *c) { return (size_t)c->kda_num_heads * c->kda_head_dim * c->kda_head_dim; }
static size_t kda_conv_floats(const k3_config *c) {
    return 3 * (size_t)(c->short_conv_kernel_size - 1) * c->kda_num_heads * c->kda_head_dim;
}
static size_t mla_row(const k3_config *c) { return (size_t)c->kv_lora_rank + c->qk_rope_head_dim; }

int seq_state_init(seq_state *s, const k3_config *cfg, k3_error *err) {
    memset(s, 0, sizeof *s);
    s->n_layers = cfg->num_hidden_layers;
    s->kda = calloc((size_t)s->n_layers, sizeof *s->kda);
    s->mla = calloc((size_t)s->n_layers, sizeof *s->mla);
    if (!s->kda || !s->mla) { seq_state_free(s); return k3_fail(err, "out of memory for sequence state"); }
    for (int l = 0; l < s->n_layers; l++) {
        if (cfg->layer_is_mla[l]) continue;
        s->kda[l].S = calloc(kda_s_floats(cfg), sizeof(float));
        s->kda[l].conv = calloc(kda_conv_floats(cfg) ? kda_conv_floats(cfg) : 1, sizeof(float));
        if (!s->kda[l].S || !s->kda[l].conv) { seq_state_free(s); return k3_fail(err, "out of memory for KDA state"); }
    }
    return 0;
}

void seq_state_reset(seq_state *s, const k3_config *cfg) {
    for (int l = 0; l < s->n_layers; l++) {
        if (s->kda[l].S) memset(s->kda[l].S, 0, kda_s_floats(cfg) * sizeof(float));
        if (s->kda[l].conv) memset(s->kda[l].conv, 0, kda_conv_floats(cfg) * sizeof(float));
    }
    s->pos = 0;
}

int seq_state_reserve(seq_state *s, const k3_config *cfg, size_t need, k3_error *err) {
    if (s->max_pos && need > s->max_pos)
        return k3_fail(err, "context of %zu positions exceeds the planned maximum of %zu (--max-context)", need, s->max_pos);
    for (int l = 0; l < s->n_layers; l++) {
        if (!cfg->layer_is_mla[l] || s->mla[l].cap >= need) continue;
        size_t cap = s->mla[l].cap ? s->mla[l].cap : 64;
        while (cap < need) cap *= 2;
        if (s->max_pos && cap > s->max_pos) cap = s->max_pos; /* never allocate past the plan */
        float *n = realloc(s->mla[l].cache, cap * mla_row(cfg) * sizeof(float));
        if (!n) return k3_fail(err, "out of memory growing the MLA cache to %zu positions", cap);
        s->mla[l].cache = n;
        s->mla[l].cap = cap;
    }
    return 0;
}

void seq_state_free(seq_state *s) {
    for (int l = 0; s->kda && l < s->n_layers; l++) { free(s->kda[l].S); free(s->kda[l].conv); }
    for (int l = 0; s->mla && l < s->n_layers; l++) free(s->mla[l].cache);
    free(s->kda);
    free(s->mla);
    memset(s, 0, sizeof *s);
}

size_t seq_state_recurrent_bytes(const k3_config *cfg) {
    size_t n = 0;
    for (int l = 0; l < cfg->num_hidden_layers; l++)
        if (!cfg->layer_is_mla[l]) n += (kda_s_floats(cfg) + kda_conv_floats(cfg)) * sizeof(float);
    return n;
}

size_t seq_state_recurrent_offset(const k3_config *cfg, int l) {
    size_t n = 0;
    for (int i = 0; i < l; i++)
        if (!cfg->layer_is_mla[i]) n += (kda_s_floats(cfg) + kda_conv_floats(cfg)) * sizeof(float);
    return n;
}

void seq_state_save_recurrent(const seq_state *s, const k3_config *cfg, void *buf) {
    char *p = buf;
    for (int l = 0; l < s->n_layers; l++) {
        if (!s->kda[l].S) continue;
        memcpy(p, s->kda[l].S, kda_s_floats(cfg) * sizeof(float));
        p += kda_s_floats(cfg) * sizeof(float);
        memcpy(p, s->kda[l].conv, kda_conv_floats(cfg) * sizeof(float));
        p += kda_conv_floats(cfg) * sizeof(float);
    }
}

void seq_state_restore_recurrent(seq_state *s, const k3_config *cfg, const void *buf, size_t pos) {
    const char *p = buf;
    for (int l = 0; l < s->n_layers; l++) {
        if (!s->kda[l].S) continue;
        memcpy(s->kda[l].S, p, kda_s_floats(cfg) * sizeof(float));
        p += kda_s_floats(cfg) * sizeof(float);
        memcpy(s->kda[l].conv, p, kda_conv_floats(cfg) * sizeof(float));
        p += kda_conv_floats(cfg) * sizeof(float);
    }
    s->pos = pos;
}
