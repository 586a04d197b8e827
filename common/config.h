/* config.h - the Kimi K3 model configuration (docs/MODEL.md section 1).
 *
 * config_load reads config.json in the nested release layout (text_config,
 * text_config.linear_attn_config) or flat (all keys at the root). Every field
 * that changes the math is required and type-checked; a missing, ill-typed or
 * unsupported value is a refusal whose message names the field. Nothing is
 * defaulted except where the spec defines absence (gate_lower_bound absent =
 * unbounded Kimi Linear gate). Both processes use this struct. */
#ifndef K3_CONFIG_H
#define K3_CONFIG_H

#include "common/error.h"
#include <stddef.h>

/* eps of the two MLA latent norms (q_a_layernorm, kv_a_layernorm): the released
 * modeling code builds them with the class default, not rms_norm_eps. */
#define MLA_LATENT_NORM_EPS 1e-6

typedef struct {
    int hidden_size, num_hidden_layers, vocab_size;
    double rms_norm_eps;
    double situ_beta, situ_linear_beta;
    int intermediate_size;                 /* dense MLP width (layers < first_k_dense_replace) */
    int first_k_dense_replace, moe_layer_freq;
    int num_experts, num_experts_per_token, num_shared_experts;
    int moe_intermediate_size;             /* routed expert inner width I */
    int routed_expert_hidden_size;         /* latent width L */
    int latent_moe_use_norm, moe_renormalize;
    double routed_scaling_factor;
    /* MLA */
    int num_attention_heads, q_lora_rank, kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int mla_use_output_gate;
    /* Attention Residuals block size, in layers */
    int attn_res_block_size;
    /* KDA */
    int kda_num_heads, kda_head_dim, short_conv_kernel_size;
    int has_gate_lower_bound;
    double gate_lower_bound;
    /* token ids from the top level (-1 when absent) */
    int bos_token_id, eos_token_id, pad_token_id;
    /* per layer (zero-based): 1 if MLA, else KDA; 1 if MoE, else dense */
    unsigned char *layer_is_mla;
    unsigned char *layer_is_moe;
} k3_config;

/* Parses config.json text. path is used in messages only. 0 or -1. */
int config_parse(const char *json_text, size_t len, const char *path, k3_config *cfg, k3_error *err);
/* Reads and parses DIR/config.json. */
int config_load(const char *model_dir, k3_config *cfg, k3_error *err);
void config_free(k3_config *cfg);

/* Number of AttnRes blocks that can be pushed: ceil(layers / block). */
int config_max_blocks(const k3_config *cfg);

#endif
