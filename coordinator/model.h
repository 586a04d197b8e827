/* model.h - the trunk weights of a Kimi K3 checkpoint, validated against the config.
 *
 * model_load opens the checkpoint and walks the layer schema (common/layer_schema.h:
 * every tensor's name, shape, dtype and place, written once): it checks EVERY
 * trunk tensor's dtype and shape against the config (F32 or BF16 accepted for any
 * unquantised tensor) and every routed expert's six MXFP4 tensors
 * (workers/expert_store.h), all before the first matmul. Nothing large is read
 * here: every big matrix is recorded in a trunk_unit (the schema's grouping of
 * one layer's attention or FFN matrices) whose bytes the trunk streamer
 * (trunk.h) reads into pinned memory or a streaming slot; a dense_weight's data
 * pointer is NULL except while its unit is acquired. Small vectors (norms, conv
 * taps, biases, A_log) are read into owned float arrays by one function
 * (read_small in model.c); the AttnRes norm*proj pair is folded into one double
 * vector. The embedding and lm head are located only (rows read on demand / in
 * chunks). The layout (which tensors, their bytes, the units) is kept for the
 * memory plan. */
#ifndef K3_MODEL_H
#define K3_MODEL_H

#include "common/checkpoint.h"
#include "common/config.h"
#include "common/kernels.h"
#include "common/layer_schema.h"
#include "workers/expert_store.h"

typedef struct {
    dense_weight q, k, v, f_a, f_b, b, g, o;
    float *conv_q, *conv_k, *conv_v; /* [P][K]: tap K-1 multiplies the current token */
    float *dt_bias;                  /* [P] */
    float *a_log;                    /* [H]: the first H entries of the stored vector */
    float *o_norm;                   /* [D] */
} kda_weights;

typedef struct {
    dense_weight q_a, q_b, kv_a, kv_b, g, o;
    float *q_a_norm, *kv_a_norm;     /* [q_lora], [kv_lora] */
} mla_weights;

typedef struct { dense_weight gate, up, down; } mlp_weights;

typedef struct {
    dense_weight router;             /* [n_experts, E] */
    float *router_bias;              /* [n_experts] e_score_correction_bias */
    dense_weight lat_down, lat_up;   /* [L, E], [E, L] */
    float *lat_norm;                 /* [L] */
    mlp_weights shared;              /* fused shared experts */
} moe_weights;

#define UNIT_MAX_TENSORS LS_UNIT_MAX

/* Big trunk tensors read and released together: one unit of the schema layout
 * (ls_layout_group: consecutive tensors of one layer part in the order the layer
 * uses them, no unit larger than the largest single trunk matrix). */
typedef struct {
    int n;
    dense_weight *w[UNIT_MAX_TENSORS];   /* where each tensor's data pointer lives */
    const ckpt_entry *e[UNIT_MAX_TENSORS];
    uint64_t bytes;                      /* sum of the tensors' bytes */
    char label[48];
} trunk_unit;

typedef struct {
    int is_mla, is_moe;
    double *attn_res_w, *mlp_res_w;  /* folded norm*proj, [E] */
    float *input_norm, *post_norm;   /* [E] */
    kda_weights kda;
    mla_weights mla;
    mlp_weights mlp;                 /* dense layers */
    moe_weights moe;
} layer_weights;

typedef struct {
    k3_config cfg;
    checkpoint ck;
    expert_store experts;            /* locations of every routed expert */
    dense_weight embed, lm_head;     /* [vocab, E]; data NULL (see trunk.h) */
    const ckpt_entry *embed_entry, *lm_head_entry;
    trunk_unit *units;               /* every layer's trunk matrices, in walk (use) order */
    int n_units;
    uint64_t max_unit_bytes;         /* the largest single trunk matrix */
    float *final_norm;               /* [E] */
    double *out_res_w;               /* folded output_attn_res_norm*proj */
    layer_weights *layers;
    ls_layout layout;                /* every non-expert tensor: entry, bytes, unit (plan.c reads it) */
} k3_model;

int model_load(const char *dir, k3_model *m, k3_error *err);
void model_free(k3_model *m);

#endif
