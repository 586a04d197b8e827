/* fuzz_config.c - libFuzzer harness for the config.json reader.
 *
 * The input is the text of config.json (not NUL-terminated: config_parse gets
 * the length). config_parse must either refuse with a non-empty message and
 * leave nothing allocated, or return a config whose every field is inside the
 * ranges config.c promises and whose layer maps agree with an independent
 * reading of the JSON (checked here; a broken promise aborts). */
#include "common/config.h"
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "fuzz_config: broken promise: %s (line %d)\n", #cond, __LINE__);         \
            abort();                                                                                 \
        }                                                                                            \
    } while (0)


/* Independent reading of the accepted document: where the spec puts each key. */
static json_t *lookup(json_t *root, const char *key, int linear) {
    json_t *tc = json_object_get(root, "text_config");
    json_t *main_obj = json_is_object(tc) ? tc : root;
    json_t *lac = json_object_get(main_obj, "linear_attn_config");
    if (!lac && json_is_object(tc)) lac = json_object_get(root, "linear_attn_config");
    json_t *v = linear && json_is_object(lac) ? json_object_get(lac, key) : NULL;
    return v ? v : json_object_get(main_obj, key);
}

static void check_against_json(const uint8_t *data, size_t size, const k3_config *cfg) {
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    CHECK(json_is_object(root));
    CHECK(json_integer_value(lookup(root, "hidden_size", 0)) == cfg->hidden_size);
    CHECK(json_integer_value(lookup(root, "num_hidden_layers", 0)) == cfg->num_hidden_layers);
    CHECK(json_integer_value(lookup(root, "num_heads", 1)) == cfg->kda_num_heads);
    CHECK(json_integer_value(lookup(root, "head_dim", 1)) == cfg->kda_head_dim);
    CHECK(json_integer_value(lookup(root, "num_experts", 0)) == cfg->num_experts);
    CHECK(json_integer_value(lookup(root, "num_key_value_heads", 0)) == cfg->num_attention_heads);
    CHECK(json_is_true(lookup(root, "mla_use_nope", 0)) && json_is_true(lookup(root, "use_full_rank_gate", 1)));
    CHECK(strcmp(json_string_value(lookup(root, "hidden_act", 0)), "situ") == 0);
    CHECK(strcmp(json_string_value(lookup(root, "moe_router_activation_func", 0)), "sigmoid") == 0);
    json_t *ng = lookup(root, "num_expert_group", 0);
    CHECK(!ng || json_integer_value(ng) == 1);
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    CHECK(!tie || json_is_false(tie));
    int n = cfg->num_hidden_layers, n_mla = 0;
    json_t *full = lookup(root, "full_attn_layers", 1), *kda = lookup(root, "kda_layers", 1);
    size_t i;
    json_t *v;
    json_array_foreach(full, i, v) {
        json_int_t l = json_integer_value(v);
        CHECK(json_is_integer(v) && l >= 1 && l <= n && cfg->layer_is_mla[l - 1]);
    }
    for (int l = 0; l < n; l++) n_mla += cfg->layer_is_mla[l];
    CHECK((size_t)n_mla == json_array_size(full)); /* no duplicates, nothing else marked */
    if (kda) {
        CHECK(json_array_size(kda) + json_array_size(full) == (size_t)n);
        json_array_foreach(kda, i, v) {
            json_int_t l = json_integer_value(v);
            CHECK(json_is_integer(v) && l >= 1 && l <= n && !cfg->layer_is_mla[l - 1]);
        }
    }
    for (int l = 0; l < n; l++)
        CHECK(cfg->layer_is_moe[l] == (l >= cfg->first_k_dense_replace && l % cfg->moe_layer_freq == 0));
    json_decref(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size ? size : 1); /* exact size: ASan catches any read past len */
    if (!buf) return 0;
    memcpy(buf, data, size);
    k3_config cfg;
    k3_error err = {0};
    int rc = config_parse(buf, size, "fuzz/config.json", &cfg, &err);
    if (rc != 0) {
        CHECK(rc == -1);
        CHECK(err.set && err.msg[0] && memchr(err.msg, 0, sizeof err.msg));
        CHECK(cfg.layer_is_mla == NULL && cfg.layer_is_moe == NULL);
    } else {
        CHECK(!err.set);
        CHECK(cfg.hidden_size >= 1 && cfg.vocab_size >= 1);
        CHECK(cfg.num_hidden_layers >= 1 && cfg.num_hidden_layers <= 4096);
        CHECK(cfg.rms_norm_eps > 0 && cfg.rms_norm_eps < 1);
        CHECK(cfg.situ_beta > 0 && cfg.situ_linear_beta > 0);
        CHECK(cfg.num_experts >= 1 && cfg.num_experts_per_token >= 1);
        CHECK(cfg.num_experts_per_token <= cfg.num_experts);
        CHECK(cfg.moe_intermediate_size % 32 == 0 && cfg.moe_intermediate_size >= 32);
        CHECK(cfg.routed_expert_hidden_size % 32 == 0 && cfg.routed_expert_hidden_size >= 32);
        CHECK(cfg.moe_layer_freq >= 1 && cfg.attn_res_block_size >= 1);
        CHECK(cfg.kda_num_heads >= 1 && cfg.kda_head_dim >= 1);
        CHECK(cfg.short_conv_kernel_size >= 1 && cfg.short_conv_kernel_size <= 64);
        CHECK(cfg.num_attention_heads >= 1 && cfg.q_lora_rank >= 1 && cfg.kv_lora_rank >= 1);
        CHECK(cfg.qk_nope_head_dim >= 1 && cfg.qk_rope_head_dim >= 0 && cfg.v_head_dim >= 1);
        CHECK(cfg.layer_is_mla && cfg.layer_is_moe);
        for (int l = 0; l < cfg.num_hidden_layers; l++)
            CHECK(cfg.layer_is_mla[l] <= 1 && cfg.layer_is_moe[l] <= 1);
        CHECK(config_max_blocks(&cfg) >= 1 && config_max_blocks(&cfg) <= cfg.num_hidden_layers);
        check_against_json(data, size, &cfg);
        config_free(&cfg);
        CHECK(cfg.layer_is_mla == NULL && cfg.layer_is_moe == NULL);
    }
    free(buf);
    return 0;
}
