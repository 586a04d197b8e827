/* layer_schema.h - the model's structure, written once: every tensor of a Kimi K3
 * checkpoint, per layer kind (docs/MODEL.md section 2).
 *
 * One table per kind: MODEL (embedding, lm head, final norm and mix), LAYER (the
 * norms and AttnRes vectors every layer has), the attention kinds KDA and MLA,
 * the FFN kinds MLP (dense) and MOE (router, latent projections, shared experts),
 * and EXPERT (the six MXFP4 tensors of one routed expert). A row gives:
 *   field   the member the loader fills (coordinator/model.h: relative to
 *           k3_model for MODEL, to layer_weights for the layer tables; for
 *           EXPERT the expert_loc.t[] index, workers/expert_store.h),
 *   suffix  the tensor name after the table's scope prefix (ls_tensor_name),
 *   place   where it lives: read at load into floats (SMALL, SMALL_PREFIX,
 *           FOLD_*), a trunk matrix streamed or pinned (TRUNK), the embedding
 *           (rows read on demand), the lm head (row chunks), an expert part,
 *   unit    the streaming unit part of a TRUNK matrix: the layer's attention or
 *           its FFN (ls_layout_group cuts parts into units),
 *   cond    the config flag the tensor depends on (absent when it is off),
 *   dtype   what is accepted (F32 or BF16 for every unquantised tensor, U8 for
 *           MXFP4) and what the release stores (sizes for --plan-only),
 *   shape   ndim and dims as symbols evaluated against the config (ls_dim_value).
 * Rows are in USE order: the order the layer code asks for its trunk matrices is
 * the order of the TRUNK rows, which is the trunk walk.
 *
 * The tables are X-macros so that the loader can turn `field` into an offsetof
 * without a second list; everything else reads the data tables (ls_table_get).
 * Who derives what from here: coordinator/model.c (names, checks, small vectors,
 * trunk units), coordinator/plan.c (walk, small vectors, expert slots, with or
 * without a checkpoint), workers/expert_store.c (expert names and shapes), and
 * workers/expertd_main.c (which tensor names belong to an expert). */
#ifndef K3_LAYER_SCHEMA_H
#define K3_LAYER_SCHEMA_H

#include "common/checkpoint.h"
#include "common/config.h"
#include <stdint.h>

typedef enum {
    LS_1,          /* 1 */
    LS_E,          /* hidden_size */
    LS_V,          /* vocab_size */
    LS_KDA_P,      /* kda_num_heads * kda_head_dim */
    LS_KDA_D,      /* kda_head_dim */
    LS_KDA_H,      /* kda_num_heads */
    LS_CONV_K,     /* short_conv_kernel_size */
    LS_MLA_QR,     /* q_lora_rank */
    LS_MLA_KR,     /* kv_lora_rank */
    LS_MLA_Q,      /* num_attention_heads * (qk_nope_head_dim + qk_rope_head_dim) */
    LS_MLA_KVA,    /* kv_lora_rank + qk_rope_head_dim */
    LS_MLA_KVB,    /* num_attention_heads * (qk_nope_head_dim + v_head_dim) */
    LS_MLA_V,      /* num_attention_heads * v_head_dim */
    LS_MLP_I,      /* intermediate_size (dense layers) */
    LS_N_EXP,      /* num_experts */
    LS_LAT,        /* routed_expert_hidden_size */
    LS_SHARED_I,   /* moe_intermediate_size * num_shared_experts */
    LS_EXP_I,      /* moe_intermediate_size */
    LS_LAT_PACK,   /* routed_expert_hidden_size / 2 (two E2M1 values a byte) */
    LS_LAT_SCALE,  /* routed_expert_hidden_size / 32 (one E8M0 scale per 32) */
    LS_EXP_I_PACK, /* moe_intermediate_size / 2 */
    LS_EXP_I_SCALE,/* moe_intermediate_size / 32 */
    LS_NDIMS
} ls_dim;

typedef enum {
    LS_SMALL,        /* read at load into a float array (norms, biases, conv taps) */
    LS_SMALL_PREFIX, /* the first dims[0] values of a vector that holds at least that many (A_log) */
    LS_FOLD_NORM,    /* AttnRes: this [E] vector times the next row's [1, E] (LS_FOLD_PROJ), */
    LS_FOLD_PROJ,    /*   kept as ONE double vector (exact in double) */
    LS_TRUNK,        /* big trunk matrix: pinned or streamed, never resident otherwise */
    LS_EMBED,        /* the embedding: rows read on demand */
    LS_LM_HEAD,      /* the lm head: pinned or streamed in row chunks after the last layer */
    LS_EXPERT_PART   /* one of a routed expert's six MXFP4 tensors (expert servers) */
} ls_place;

typedef enum { LS_NO_UNIT, LS_UNIT_ATTN, LS_UNIT_FFN } ls_unit_part;

typedef enum {
    LS_ALWAYS,
    LS_IF_MLA_GATE,    /* mla_use_output_gate */
    LS_IF_LATENT_NORM, /* latent_moe_use_norm */
    LS_IF_SHARED       /* num_shared_experts > 0 */
} ls_cond;

typedef enum {
    LS_BF16, /* accepts F32 or BF16; the release stores BF16 */
    LS_F32,  /* accepts F32 or BF16; the release stores F32 */
    LS_U8    /* accepts U8 only (packed MXFP4 values or scales) */
} ls_dtype;

typedef enum { LS_MODEL, LS_LAYER, LS_KDA, LS_MLA, LS_MLP, LS_MOE, LS_EXPERT, LS_NKINDS } ls_kind;

/* X(field, suffix, place, unit, cond, dtype, ndim, d0, d1, d2); unused dims are LS_1. */

/* scope "language_model." */
#define LS_MODEL_TENSORS(X)                                                                            \
    X(embed, "model.embed_tokens.weight", LS_EMBED, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 2, LS_V, LS_E, LS_1) \
    X(final_norm, "model.norm.weight", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 1, LS_E, LS_1, LS_1)    \
    X(out_res_w, "model.output_attn_res_norm.weight", LS_FOLD_NORM, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 1, LS_E, LS_1, LS_1) \
    X(out_res_w, "model.output_attn_res_proj.weight", LS_FOLD_PROJ, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 2, LS_1, LS_E, LS_1) \
    X(lm_head, "lm_head.weight", LS_LM_HEAD, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 2, LS_V, LS_E, LS_1)

/* scope "language_model.model.layers.<l>." (every layer) */
#define LS_LAYER_TENSORS(X)                                                                                   \
    X(input_norm, "input_layernorm.weight", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 1, LS_E, LS_1, LS_1)        \
    X(post_norm, "post_attention_layernorm.weight", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 1, LS_E, LS_1, LS_1) \
    X(attn_res_w, "self_attention_res_norm.weight", LS_FOLD_NORM, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 1, LS_E, LS_1, LS_1) \
    X(attn_res_w, "self_attention_res_proj.weight", LS_FOLD_PROJ, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 2, LS_1, LS_E, LS_1) \
    X(mlp_res_w, "mlp_res_norm.weight", LS_FOLD_NORM, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 1, LS_E, LS_1, LS_1)        \
    X(mlp_res_w, "mlp_res_proj.weight", LS_FOLD_PROJ, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 2, LS_1, LS_E, LS_1)

/* Kimi Delta Attention (docs/MODEL.md 4.2), kda_forward's order. */
#define LS_KDA_TENSORS(X)                                                                                           \
    X(kda.q, "self_attn.q_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_KDA_P, LS_E, LS_1)           \
    X(kda.k, "self_attn.k_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_KDA_P, LS_E, LS_1)           \
    X(kda.v, "self_attn.v_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_KDA_P, LS_E, LS_1)           \
    X(kda.f_a, "self_attn.f_a_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_KDA_D, LS_E, LS_1)       \
    X(kda.f_b, "self_attn.f_b_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_KDA_P, LS_KDA_D, LS_1)   \
    X(kda.b, "self_attn.b_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_KDA_H, LS_E, LS_1)           \
    X(kda.g, "self_attn.g_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_KDA_P, LS_E, LS_1)           \
    X(kda.o, "self_attn.o_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_E, LS_KDA_P, LS_1)           \
    X(kda.conv_q, "self_attn.q_conv1d.weight", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_F32, 3, LS_KDA_P, LS_1, LS_CONV_K) \
    X(kda.conv_k, "self_attn.k_conv1d.weight", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_F32, 3, LS_KDA_P, LS_1, LS_CONV_K) \
    X(kda.conv_v, "self_attn.v_conv1d.weight", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_F32, 3, LS_KDA_P, LS_1, LS_CONV_K) \
    X(kda.dt_bias, "self_attn.dt_bias", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_F32, 1, LS_KDA_P, LS_1, LS_1)              \
    X(kda.a_log, "self_attn.A_log", LS_SMALL_PREFIX, LS_NO_UNIT, LS_ALWAYS, LS_F32, 1, LS_KDA_H, LS_1, LS_1)           \
    X(kda.o_norm, "self_attn.o_norm.weight", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 1, LS_KDA_D, LS_1, LS_1)

/* Gated MLA (docs/MODEL.md 4.3), mla_forward's order. */
#define LS_MLA_TENSORS(X)                                                                                                     \
    X(mla.q_a, "self_attn.q_a_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_MLA_QR, LS_E, LS_1)                  \
    X(mla.q_b, "self_attn.q_b_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_MLA_Q, LS_MLA_QR, LS_1)              \
    X(mla.kv_a, "self_attn.kv_a_proj_with_mqa.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_MLA_KVA, LS_E, LS_1)      \
    X(mla.g, "self_attn.g_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_IF_MLA_GATE, LS_BF16, 2, LS_MLA_V, LS_E, LS_1)                 \
    X(mla.kv_b, "self_attn.kv_b_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_MLA_KVB, LS_MLA_KR, LS_1)          \
    X(mla.o, "self_attn.o_proj.weight", LS_TRUNK, LS_UNIT_ATTN, LS_ALWAYS, LS_BF16, 2, LS_E, LS_MLA_V, LS_1)                      \
    X(mla.q_a_norm, "self_attn.q_a_layernorm.weight", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 1, LS_MLA_QR, LS_1, LS_1)         \
    X(mla.kv_a_norm, "self_attn.kv_a_layernorm.weight", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_BF16, 1, LS_MLA_KR, LS_1, LS_1)

/* Dense MLP with SiTU-GLU (docs/MODEL.md 4.1), mlp_forward's order. */
#define LS_MLP_TENSORS(X)                                                                                  \
    X(mlp.gate, "mlp.gate_proj.weight", LS_TRUNK, LS_UNIT_FFN, LS_ALWAYS, LS_BF16, 2, LS_MLP_I, LS_E, LS_1)   \
    X(mlp.up, "mlp.up_proj.weight", LS_TRUNK, LS_UNIT_FFN, LS_ALWAYS, LS_BF16, 2, LS_MLP_I, LS_E, LS_1)       \
    X(mlp.down, "mlp.down_proj.weight", LS_TRUNK, LS_UNIT_FFN, LS_ALWAYS, LS_BF16, 2, LS_E, LS_MLP_I, LS_1)

/* The MoE trunk part: Stable LatentMoE (docs/MODEL.md 4.4), moe_forward's order
 * (router, latent down, [experts], latent norm, latent up, shared MLP). */
#define LS_MOE_TENSORS(X)                                                                                                          \
    X(moe.router, "block_sparse_moe.gate.weight", LS_TRUNK, LS_UNIT_FFN, LS_ALWAYS, LS_BF16, 2, LS_N_EXP, LS_E, LS_1)                  \
    X(moe.router_bias, "block_sparse_moe.gate.e_score_correction_bias", LS_SMALL, LS_NO_UNIT, LS_ALWAYS, LS_F32, 1, LS_N_EXP, LS_1, LS_1) \
    X(moe.lat_down, "block_sparse_moe.routed_expert_down_proj.weight", LS_TRUNK, LS_UNIT_FFN, LS_ALWAYS, LS_BF16, 2, LS_LAT, LS_E, LS_1) \
    X(moe.lat_up, "block_sparse_moe.routed_expert_up_proj.weight", LS_TRUNK, LS_UNIT_FFN, LS_ALWAYS, LS_BF16, 2, LS_E, LS_LAT, LS_1)    \
    X(moe.lat_norm, "block_sparse_moe.routed_expert_norm.weight", LS_SMALL, LS_NO_UNIT, LS_IF_LATENT_NORM, LS_BF16, 1, LS_LAT, LS_1, LS_1) \
    X(moe.shared.gate, "block_sparse_moe.shared_experts.gate_proj.weight", LS_TRUNK, LS_UNIT_FFN, LS_IF_SHARED, LS_BF16, 2, LS_SHARED_I, LS_E, LS_1) \
    X(moe.shared.up, "block_sparse_moe.shared_experts.up_proj.weight", LS_TRUNK, LS_UNIT_FFN, LS_IF_SHARED, LS_BF16, 2, LS_SHARED_I, LS_E, LS_1)     \
    X(moe.shared.down, "block_sparse_moe.shared_experts.down_proj.weight", LS_TRUNK, LS_UNIT_FFN, LS_IF_SHARED, LS_BF16, 2, LS_E, LS_SHARED_I, LS_1)

/* One routed expert (docs/MODEL.md 4.4), scope
 * "language_model.model.layers.<l>.block_sparse_moe.experts.<e>.", in the release's
 * byte order (a contiguous run is read with one pread). w1 (gate) and w3 (up) are
 * logically [I, L], w2 (down) [L, I]: packed [rows, cols/2], scales [rows, cols/32]. */
#define LS_EXPERT_TENSORS(X)                                                                                           \
    X(EXPERT_W1_P, "w1.weight_packed", LS_EXPERT_PART, LS_NO_UNIT, LS_ALWAYS, LS_U8, 2, LS_EXP_I, LS_LAT_PACK, LS_1)       \
    X(EXPERT_W1_S, "w1.weight_scale", LS_EXPERT_PART, LS_NO_UNIT, LS_ALWAYS, LS_U8, 2, LS_EXP_I, LS_LAT_SCALE, LS_1)       \
    X(EXPERT_W2_P, "w2.weight_packed", LS_EXPERT_PART, LS_NO_UNIT, LS_ALWAYS, LS_U8, 2, LS_LAT, LS_EXP_I_PACK, LS_1)       \
    X(EXPERT_W2_S, "w2.weight_scale", LS_EXPERT_PART, LS_NO_UNIT, LS_ALWAYS, LS_U8, 2, LS_LAT, LS_EXP_I_SCALE, LS_1)       \
    X(EXPERT_W3_P, "w3.weight_packed", LS_EXPERT_PART, LS_NO_UNIT, LS_ALWAYS, LS_U8, 2, LS_EXP_I, LS_LAT_PACK, LS_1)       \
    X(EXPERT_W3_S, "w3.weight_scale", LS_EXPERT_PART, LS_NO_UNIT, LS_ALWAYS, LS_U8, 2, LS_EXP_I, LS_LAT_SCALE, LS_1)

#define LS_EXPERT_NT 6 /* rows of LS_EXPERT_TENSORS */

typedef struct {
    const char *field;   /* the loader's member, as text (messages, docs) */
    const char *suffix;
    ls_place place;
    ls_unit_part unit;
    ls_cond cond;
    ls_dtype dtype;
    int ndim;
    ls_dim dim[3];
} ls_tensor;

typedef struct {
    ls_kind kind;
    const char *name;    /* "KDA", "MLA", "MLP", "MoE", ... (unit labels) */
    const char *scope;   /* "language_model.", "...layers.%d.", "...experts.%d." */
    const ls_tensor *rows;
    int n;
} ls_table;

const ls_table *ls_table_get(ls_kind kind);
/* The attention kind (LS_KDA / LS_MLA) and FFN kind (LS_MLP / LS_MOE) of layer l. */
ls_kind ls_attn_kind(const k3_config *c, int layer);
ls_kind ls_ffn_kind(const k3_config *c, int layer);

uint64_t ls_dim_value(const k3_config *c, ls_dim d);
const char *ls_dim_name(ls_dim d);
int ls_cond_holds(const k3_config *c, ls_cond cond);
/* Values of a row's shape (product of its dims). */
uint64_t ls_numel(const k3_config *c, const ls_tensor *t);
/* The widest input (columns) of any trunk matrix or the lm head the config has: what one
 * one-token matmul converts of its x (the engine's per-thread input buffer, forward.h). */
uint64_t ls_widest_trunk_input(const k3_config *c);
/* Whether a stored dtype is accepted for the row; the release dtype's size. */
int ls_dtype_ok(const ls_tensor *t, st_dtype d);
size_t ls_release_size(const ls_tensor *t);
const char *ls_dtype_text(const ls_tensor *t);  /* "F32 or BF16", "U8" */

/* Full checkpoint name of a row for a layer / expert (ignored where the scope has
 * none). 0, or -1 if buf is too small. */
int ls_tensor_name(const ls_table *tb, const ls_tensor *t, int layer, int expert, char *buf, size_t len);
/* 1 and *layer, *expert if name is a routed expert's tensor (scope of LS_EXPERT), else 0. */
int ls_expert_name_parse(const char *name, int *layer, int *expert);

/* Checks a stored tensor against its row: dtype accepted, shape exactly the
 * row's dims (SMALL_PREFIX: leading dims 1 and at least dims[0] values). The
 * message names the tensor, what it has and what the config expects. */
int ls_check(const k3_config *c, const ls_tensor *t, const ckpt_entry *e, k3_error *err);

/* Bytes of one routed expert's six tensors (all U8). */
uint64_t ls_expert_bytes(const k3_config *c);

/* Reads go through 4 KiB-aligned windows (O_DIRECT); a buffer that must hold n
 * bytes found at ANY file offset needs ls_buffer_bytes(n). The trunk's unit
 * buffers, the expert cache's slots and the plan all size with this. */
#define LS_IO_ALIGN 4096u
static inline uint64_t ls_buffer_bytes(uint64_t n) {
    return (n + 2ull * LS_IO_ALIGN + LS_IO_ALIGN - 1) / LS_IO_ALIGN * LS_IO_ALIGN;
}

#define LS_UNIT_MAX 8 /* tensors in one streaming unit at most */

/* ---- the model laid out: every non-expert tensor of a config, in load order ---- */

typedef struct {
    const ls_table *tb;
    const ls_tensor *t;
    int row;             /* index of t in tb->rows */
    int layer;           /* -1 for MODEL rows */
    uint64_t numel;      /* values the shape holds (for SMALL_PREFIX: the values taken) */
    uint64_t bytes;      /* bytes in the checkpoint: the release's at build, the loader sets the real ones */
    const ckpt_entry *e; /* set by the loader (NULL from the config alone) */
    int unit;            /* streaming unit of a TRUNK row, else -1 (after ls_layout_group) */
} ls_item;

typedef struct {
    int layer;
    ls_unit_part part;
    int n, items[LS_UNIT_MAX];
    uint64_t bytes;      /* sum of the tensors' bytes */
    char label[48];      /* "layer 3 MoE", a split part "layer 3 MoE+" */
} ls_unit;

typedef struct {
    ls_item *items;
    int n_items;
    ls_unit *units;      /* the trunk walk's layer units, in walk order */
    int n_units;
    uint64_t max_matrix_bytes;  /* largest TRUNK row: no unit is larger (sets the slot size) */
    int n_moe_layers, n_mla_layers;
    int embed_item, lm_head_item;
} ls_layout;

/* Every non-expert row that applies to the config, in the tables' order (MODEL,
 * then per layer: LAYER, its attention kind, its FFN kind), with release bytes. */
int ls_layout_build(const k3_config *c, ls_layout *lay, k3_error *err);
/* Groups the TRUNK items into streaming units from their current bytes:
 * consecutive rows of one layer part, a new unit when adding a row would pass
 * the largest single trunk matrix or LS_UNIT_MAX rows. */
int ls_layout_group(ls_layout *lay, k3_error *err);
void ls_layout_free(ls_layout *lay);

#endif
