/* layers.h - the four layer kinds of K3 over a chunk of T consecutive tokens.
 *
 * Each takes x [T][E] (the already-normalised layer input) and writes out [T][E].
 * Tokens of a chunk are positions st->pos .. st->pos+T-1. Every per-token result
 * is bit-identical whether the tokens arrive as one chunk or one at a time
 * (dot products per kernels.h; recurrences run token by token in order).
 * Trunk matrices are made readable through tr (trunk_matmul / trunk_need) in the
 * order they were registered by model.c; the caller releases the last unit.
 * Sections refer to K3-MODEL.md. */
#ifndef K3_LAYERS_H
#define K3_LAYERS_H

#include "coordinator/expert_backend.h"
#include "coordinator/model.h"
#include "coordinator/state.h"
#include "coordinator/trunk.h"

/* 4.2 Kimi Delta Attention; updates S and the conv history in st. */
int kda_forward(trunk *tr, const kernels *k, const k3_config *c, const kda_weights *w, kda_state *st, const float *x, size_t T,
                float *out, k3_error *err);
/* 4.3 gated MLA (NoPE); appends T rows to the cache (room reserved by the caller). */
int mla_forward(trunk *tr, const kernels *k, const k3_config *c, const mla_weights *w, mla_state *st, size_t pos, const float *x,
                size_t T, float *out, k3_error *err);
/* 4.1 MLP with SiTU-GLU (dense layer 0 and the fused shared experts). */
int mlp_forward(trunk *tr, const kernels *k, const k3_config *c, const mlp_weights *w, const float *x, size_t T, float *out,
                k3_error *err);
/* 4.4 Stable LatentMoE; experts computed by eb. If trace != NULL, the selected
 * expert ids are written there ([T][top_k], top-k order). */
int moe_forward(trunk *tr, const kernels *k, const k3_config *c, const moe_weights *w, int layer, expert_backend *eb,
                const float *x, size_t T, float *out, int32_t *trace, k3_error *err);

/* Selection for one token (exposed for tests): scores s_e = sigmoid(logit_e);
 * top-k over s_e + bias_e (ties: lower id), descending; weights from the
 * UNBIASED s, renormalised and scaled per config. */
void moe_route(const k3_config *c, const float *router_logits, const float *bias, int32_t *ids, double *weights);

/* acc[i] = sum_j weights[j] * y[j][i], summed in double in top-k order (j = 0..K-1). */
void moe_combine(const double *weights, const float *y, size_t K, size_t L, float *acc);

/* y = W.row(r) . x using the kernel of W's dtype. */
float dense_row_dot(const kernels *k, const dense_weight *W, size_t r, const float *x);
/* W[r][c] as float. */
float dense_at(const dense_weight *W, size_t r, size_t c);

#endif
