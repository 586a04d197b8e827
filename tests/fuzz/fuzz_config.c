/* fuzz_config.c - libFuzzer harness for the config.json reader.
 *
 * The input is the text of config.json (not NUL-terminated: config_parse gets
 * the length). config_parse must either refuse with a non-empty message and
 * leave nothing allocated, or return a config whose every field is inside the
 * ranges config.c promises (checked here; a broken promise aborts). */
#include "common/config.h"
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
        config_free(&cfg);
        CHECK(cfg.layer_is_mla == NULL && cfg.layer_is_moe == NULL);
    }
    free(buf);
    return 0;
}
