/* config.c - reads and validates config.json (see config.h). */
#include "common/config.h"
#include "common/file_read.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM (1 << 24) /* any width above this is a corrupt file, not a model */

typedef struct {
    const char *path;
    json_t *main;   /* text_config, or the root for a flat file */
    json_t *linear; /* linear_attn_config, or NULL */
    k3_error *err;
} cfg_ctx;

/* Looks a key up in main; KDA keys (linear=1) in linear_attn_config first. */
static json_t *find(const cfg_ctx *c, const char *key, int linear) {
    json_t *v = NULL;
    if (linear && c->linear) v = json_object_get(c->linear, key);
    if (!v) v = json_object_get(c->main, key);
    return v;
}

static int req_int(const cfg_ctx *c, const char *key, int linear, int lo, int hi, int *out) {
    json_t *v = find(c, key, linear);
    if (!v) return k3_fail(c->err, "%s: missing required field '%s'", c->path, key);
    if (!json_is_integer(v)) return k3_fail(c->err, "%s: field '%s' must be an integer", c->path, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return k3_fail(c->err, "%s: field '%s' = %lld is out of range [%d, %d]", c->path, key, (long long)x, lo, hi);
    *out = (int)x;
    return 0;
}

static int req_num(const cfg_ctx *c, const char *key, int linear, double *out) {
    json_t *v = find(c, key, linear);
    if (!v) return k3_fail(c->err, "%s: missing required field '%s'", c->path, key);
    if (!json_is_number(v)) return k3_fail(c->err, "%s: field '%s' must be a number", c->path, key);
    *out = json_number_value(v);
    if (!(*out == *out) || *out > 1e30 || *out < -1e30)
        return k3_fail(c->err, "%s: field '%s' is not a finite number", c->path, key);
    return 0;
}

static int req_bool(const cfg_ctx *c, const char *key, int linear, int *out) {
    json_t *v = find(c, key, linear);
    if (!v) return k3_fail(c->err, "%s: missing required field '%s'", c->path, key);
    if (!json_is_boolean(v)) return k3_fail(c->err, "%s: field '%s' must be true or false", c->path, key);
    *out = json_is_true(v);
    return 0;
}

static int req_string_eq(const cfg_ctx *c, const char *key, const char *want) {
    json_t *v = find(c, key, 0);
    if (!v) return k3_fail(c->err, "%s: missing required field '%s'", c->path, key);
    if (!json_is_string(v)) return k3_fail(c->err, "%s: field '%s' must be a string", c->path, key);
    if (strcmp(json_string_value(v), want) != 0)
        return k3_fail(c->err, "%s: field '%s' = \"%s\" is not supported (only \"%s\")", c->path, key,
                       json_string_value(v), want);
    return 0;
}

static int opt_top_int(json_t *root, const char *key, const char *path, int *out, k3_error *err) {
    json_t *v = json_object_get(root, key);
    *out = -1;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > MAX_DIM)
        return k3_fail(err, "%s: field '%s' must be a non-negative integer", path, key);
    *out = (int)json_integer_value(v);
    return 0;
}

/* Fills cfg->layer_is_mla from the one-based full_attn_layers list and checks
 * kda_layers (when present) is exactly its complement. */
static int read_layer_map(const cfg_ctx *c, k3_config *cfg) {
    int n = cfg->num_hidden_layers;
    json_t *full = find(c, "full_attn_layers", 1);
    if (!full) return k3_fail(c->err, "%s: missing required field 'full_attn_layers' (linear_attn_config)", c->path);
    if (!json_is_array(full)) return k3_fail(c->err, "%s: field 'full_attn_layers' must be an array", c->path);
    cfg->layer_is_mla = calloc((size_t)n, 1);
    cfg->layer_is_moe = calloc((size_t)n, 1);
    if (!cfg->layer_is_mla || !cfg->layer_is_moe) return k3_fail(c->err, "out of memory reading %s", c->path);
    size_t i;
    json_t *v;
    json_array_foreach(full, i, v) {
        if (!json_is_integer(v)) return k3_fail(c->err, "%s: 'full_attn_layers'[%zu] must be an integer", c->path, i);
        json_int_t l = json_integer_value(v);
        if (l < 1 || l > n)
            return k3_fail(c->err, "%s: 'full_attn_layers'[%zu] = %lld is outside the one-based range 1..%d", c->path, i,
                           (long long)l, n);
        if (cfg->layer_is_mla[l - 1])
            return k3_fail(c->err, "%s: 'full_attn_layers' lists layer %lld twice", c->path, (long long)l);
        cfg->layer_is_mla[l - 1] = 1;
    }
    json_t *kda = find(c, "kda_layers", 1);
    if (kda) {
        if (!json_is_array(kda)) return k3_fail(c->err, "%s: field 'kda_layers' must be an array", c->path);
        unsigned char *seen = calloc((size_t)n, 1);
        if (!seen) return k3_fail(c->err, "out of memory reading %s", c->path);
        int rc = 0;
        json_array_foreach(kda, i, v) {
            json_int_t l = json_is_integer(v) ? json_integer_value(v) : -1;
            if (l < 1 || l > n) { rc = k3_fail(c->err, "%s: 'kda_layers'[%zu] is not a one-based layer in 1..%d", c->path, i, n); break; }
            if (seen[l - 1] || cfg->layer_is_mla[l - 1]) {
                rc = k3_fail(c->err, "%s: 'kda_layers' entry %lld is duplicated or also in 'full_attn_layers'", c->path, (long long)l);
                break;
            }
            seen[l - 1] = 1;
        }
        for (int l = 0; rc == 0 && l < n; l++)
            if (!seen[l] && !cfg->layer_is_mla[l])
                rc = k3_fail(c->err, "%s: layer %d (one-based) is in neither 'kda_layers' nor 'full_attn_layers'", c->path, l + 1);
        free(seen);
        if (rc) return rc;
    }
    for (int l = 0; l < n; l++)
        cfg->layer_is_moe[l] = (l >= cfg->first_k_dense_replace && l % cfg->moe_layer_freq == 0);
    return 0;
}

static int check_quantization(json_t *q, const char *path, k3_error *err) {
    if (!q) return 0;
    if (!json_is_object(q)) return k3_fail(err, "%s: 'quantization_config' must be an object", path);
    json_t *fmt = json_object_get(q, "format");
    if (fmt && (!json_is_string(fmt) || strcmp(json_string_value(fmt), "mxfp4-pack-quantized") != 0))
        return k3_fail(err, "%s: quantization_config.format must be \"mxfp4-pack-quantized\"", path);
    /* group_size may sit at the top of quantization_config or inside config_groups.*.weights */
    json_t *gs = json_object_get(q, "group_size");
    if (gs && (!json_is_integer(gs) || json_integer_value(gs) != 32))
        return k3_fail(err, "%s: quantization_config.group_size must be 32", path);
    json_t *groups = json_object_get(q, "config_groups");
    if (groups && json_is_object(groups)) {
        const char *k;
        json_t *g;
        json_object_foreach(groups, k, g) {
            json_t *w = json_object_get(g, "weights");
            json_t *gsz = w ? json_object_get(w, "group_size") : NULL;
            if (gsz && (!json_is_integer(gsz) || json_integer_value(gsz) != 32))
                return k3_fail(err, "%s: quantization_config.config_groups.%s.weights.group_size must be 32", path, k);
        }
    }
    return 0;
}

int config_parse(const char *text, size_t len, const char *path, k3_config *cfg, k3_error *err) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return k3_fail(err, "%s: invalid JSON at line %d column %d: %s", path, jerr.line, jerr.column, jerr.text);
    int rc = -1;
    if (!json_is_object(root)) { k3_fail(err, "%s: top level is not a JSON object", path); goto out; }
    cfg_ctx c = {path, root, NULL, err};
    json_t *text_cfg = json_object_get(root, "text_config");
    if (text_cfg) {
        if (!json_is_object(text_cfg)) { k3_fail(err, "%s: 'text_config' must be an object", path); goto out; }
        c.main = text_cfg;
    }
    json_t *lac = json_object_get(c.main, "linear_attn_config");
    if (!lac && text_cfg) lac = json_object_get(root, "linear_attn_config");
    if (lac && !json_is_object(lac)) { k3_fail(err, "%s: 'linear_attn_config' must be an object", path); goto out; }
    c.linear = lac;

    json_t *ties[2] = {json_object_get(root, "tie_word_embeddings"), text_cfg ? json_object_get(text_cfg, "tie_word_embeddings") : NULL};
    for (int i = 0; i < 2; i++)
        if (ties[i] && !json_is_false(ties[i])) {
            k3_fail(err, "%s: '%stie_word_embeddings' must be false (K3 has an untied lm_head)", path, i ? "text_config." : "");
            goto out;
        }

    int use_nope, full_rank_gate, n_kv_heads;
    if (req_int(&c, "hidden_size", 0, 1, MAX_DIM, &cfg->hidden_size) ||
        req_int(&c, "num_hidden_layers", 0, 1, 4096, &cfg->num_hidden_layers) ||
        req_int(&c, "vocab_size", 0, 1, MAX_DIM, &cfg->vocab_size) ||
        req_num(&c, "rms_norm_eps", 0, &cfg->rms_norm_eps) ||
        req_string_eq(&c, "hidden_act", "situ") ||
        req_num(&c, "activation_situ_beta", 0, &cfg->situ_beta) ||
        req_num(&c, "activation_situ_linear_beta", 0, &cfg->situ_linear_beta) ||
        req_int(&c, "intermediate_size", 0, 1, MAX_DIM, &cfg->intermediate_size) ||
        req_int(&c, "first_k_dense_replace", 0, 0, 4096, &cfg->first_k_dense_replace) ||
        req_int(&c, "moe_layer_freq", 0, 1, 4096, &cfg->moe_layer_freq) ||
        req_int(&c, "num_experts", 0, 1, 1 << 20, &cfg->num_experts) ||
        req_int(&c, "num_experts_per_token", 0, 1, 1 << 20, &cfg->num_experts_per_token) ||
        req_int(&c, "num_shared_experts", 0, 0, 1024, &cfg->num_shared_experts) ||
        req_int(&c, "moe_intermediate_size", 0, 32, MAX_DIM, &cfg->moe_intermediate_size) ||
        req_int(&c, "routed_expert_hidden_size", 0, 32, MAX_DIM, &cfg->routed_expert_hidden_size) ||
        req_bool(&c, "latent_moe_use_norm", 0, &cfg->latent_moe_use_norm) ||
        req_string_eq(&c, "moe_router_activation_func", "sigmoid") ||
        req_bool(&c, "moe_renormalize", 0, &cfg->moe_renormalize) ||
        req_num(&c, "routed_scaling_factor", 0, &cfg->routed_scaling_factor) ||
        req_int(&c, "num_attention_heads", 0, 1, 1 << 16, &cfg->num_attention_heads) ||
        req_int(&c, "num_key_value_heads", 0, 1, 1 << 16, &n_kv_heads) ||
        req_int(&c, "q_lora_rank", 0, 1, MAX_DIM, &cfg->q_lora_rank) ||
        req_int(&c, "kv_lora_rank", 0, 1, MAX_DIM, &cfg->kv_lora_rank) ||
        req_int(&c, "qk_nope_head_dim", 0, 1, 1 << 16, &cfg->qk_nope_head_dim) ||
        req_int(&c, "qk_rope_head_dim", 0, 0, 1 << 16, &cfg->qk_rope_head_dim) ||
        req_int(&c, "v_head_dim", 0, 1, 1 << 16, &cfg->v_head_dim) ||
        req_bool(&c, "mla_use_nope", 0, &use_nope) ||
        req_bool(&c, "mla_use_output_gate", 0, &cfg->mla_use_output_gate) ||
        req_int(&c, "attn_res_block_size", 0, 1, 4096, &cfg->attn_res_block_size) ||
        req_int(&c, "num_heads", 1, 1, 1 << 16, &cfg->kda_num_heads) ||
        req_int(&c, "head_dim", 1, 1, 1 << 16, &cfg->kda_head_dim) ||
        req_int(&c, "short_conv_kernel_size", 1, 1, 64, &cfg->short_conv_kernel_size) ||
        req_bool(&c, "use_full_rank_gate", 1, &full_rank_gate))
        goto out;
    if (!use_nope) { k3_fail(err, "%s: 'mla_use_nope' = false is not supported (K3 MLA is NoPE)", path); goto out; }
    if (!full_rank_gate) { k3_fail(err, "%s: 'use_full_rank_gate' = false (low-rank KDA output gate) is not supported", path); goto out; }
    if (n_kv_heads != cfg->num_attention_heads) {
        k3_fail(err, "%s: 'num_key_value_heads' (%d) must equal 'num_attention_heads' (%d): MLA has no GQA", path, n_kv_heads,
                cfg->num_attention_heads);
        goto out;
    }
    if (!(cfg->rms_norm_eps > 0 && cfg->rms_norm_eps < 1)) { k3_fail(err, "%s: 'rms_norm_eps' must be in (0, 1)", path); goto out; }
    if (!(cfg->situ_beta > 0) || !(cfg->situ_linear_beta > 0)) { k3_fail(err, "%s: SiTU betas must be positive", path); goto out; }
    if (cfg->num_experts_per_token > cfg->num_experts) {
        k3_fail(err, "%s: 'num_experts_per_token' (%d) exceeds 'num_experts' (%d)", path, cfg->num_experts_per_token, cfg->num_experts);
        goto out;
    }
    if (cfg->routed_expert_hidden_size % 32 || cfg->moe_intermediate_size % 32) {
        k3_fail(err, "%s: 'routed_expert_hidden_size' and 'moe_intermediate_size' must be multiples of the MXFP4 group (32)", path);
        goto out;
    }
    json_t *glb = find(&c, "gate_lower_bound", 1);
    if (glb && !json_is_null(glb)) {
        if (req_num(&c, "gate_lower_bound", 1, &cfg->gate_lower_bound)) goto out;
        cfg->has_gate_lower_bound = 1;
    }
    json_t *ng = find(&c, "num_expert_group", 0);
    if (ng && (!json_is_integer(ng) || json_integer_value(ng) != 1)) {
        k3_fail(err, "%s: 'num_expert_group' must be 1 (grouped top-k with more groups is not implemented)", path);
        goto out;
    }
    json_t *tg = find(&c, "topk_group", 0);
    if (tg && (!json_is_integer(tg) || json_integer_value(tg) != 1)) { k3_fail(err, "%s: 'topk_group' must be 1", path); goto out; }
    json_t *tm = find(&c, "topk_method", 0);
    if (tm && (!json_is_string(tm) || strcmp(json_string_value(tm), "noaux_tc") != 0)) {
        k3_fail(err, "%s: 'topk_method' must be \"noaux_tc\"", path);
        goto out;
    }
    if (check_quantization(json_object_get(root, "quantization_config"), path, err)) goto out;
    if (text_cfg && check_quantization(json_object_get(text_cfg, "quantization_config"), path, err)) goto out;
    if (opt_top_int(root, "bos_token_id", path, &cfg->bos_token_id, err) ||
        opt_top_int(root, "eos_token_id", path, &cfg->eos_token_id, err) ||
        opt_top_int(root, "pad_token_id", path, &cfg->pad_token_id, err))
        goto out;
    if (read_layer_map(&c, cfg)) goto out;
    rc = 0;
out:
    json_decref(root);
    if (rc) config_free(cfg);
    return rc;
}

int config_load(const char *model_dir, k3_config *cfg, k3_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    size_t len;
    char *buf = file_read_all(path, 64u << 20, &len, err);
    if (!buf) return -1;
    int rc = config_parse(buf, len, path, cfg, err);
    free(buf);
    return rc;
}

void config_free(k3_config *cfg) {
    free(cfg->layer_is_mla);
    free(cfg->layer_is_moe);
    cfg->layer_is_mla = cfg->layer_is_moe = NULL;
}

int config_max_blocks(const k3_config *cfg) {
    return (cfg->num_hidden_layers + cfg->attn_res_block_size - 1) / cfg->attn_res_block_size;
}
