/* layers.h - the four layer kinds of K3 over a chunk of T consecutive tokens.
 *
 * Each takes x [T][E] (the already-normalised layer input) and writes out [T][E].
 * Every per-token result is bit-identical whether the tokens arrive as one chunk,
 * one at a time, or batched with other sequences (dot products per kernels.h;
 * recurrences run token by token in order, per sequence).
 * Trunk matrices are made readable through the pass tp (trunk_matmul /
 * trunk_get) in the order model.c registered them; the caller releases the last
 * unit. Layer code never allocates: temporaries come from the scratch arena.
 * pf (NULL: nothing timed) takes a lap (fwd_phases.h) at each of the function's phase
 * boundaries; its first lap counts from the caller's last one.
 * Sections refer to docs/MODEL.md. */
#ifndef K3_LAYERS_H
#define K3_LAYERS_H

#include "coordinator/expert_backend.h"
#include "coordinator/fwd_phases.h"
#include "coordinator/model.h"
#include "coordinator/state.h"
#include "coordinator/scratch.h"
#include "coordinator/trunk.h"

/* Rows [row0, row0+n) of a layer's input belong to one sequence, at positions
 * pos..pos+n-1 of that sequence (a batch holds several sequences; each keeps its
 * own state and every row's bits are those of the sequence run alone). */
typedef struct {
    seq_state *st;
    size_t row0, n, pos;
} fwd_segment;

/* Every layer function works on R = sum of the segments' n rows: x [R][E] (the
 * already-normalised layer input), out [R][E]. Temporaries come from sc (carved,
 * restored on return); *_scratch_bytes give the bytes for R rows, max_ctx
 * positions and nthreads threads, from the same layout code. */
/* 4.2 Kimi Delta Attention; updates S and the conv history of layer l of each segment's state. */
int kda_forward(trunk_pass *tp, const kernels *k, const k3_config *c, const kda_weights *w, int l, const fwd_segment *sg,
                size_t nseg, const float *x, size_t R, float *out, scratch *sc, int nthreads, fwd_phases *pf, k3_error *err);
size_t kda_scratch_bytes(const k3_config *c, size_t R, int nthreads);
/* 4.3 gated MLA (NoPE); appends each segment's rows to its layer-l cache (room reserved by the caller). */
int mla_forward(trunk_pass *tp, const kernels *k, const k3_config *c, const mla_weights *w, int l, const fwd_segment *sg,
                size_t nseg, const float *x, size_t R, float *out, scratch *sc, int nthreads, size_t max_ctx,
                fwd_phases *pf, k3_error *err);
size_t mla_scratch_bytes(const k3_config *c, size_t R, int nthreads, size_t max_ctx);
/* The scores of MLA_HB (8) absorbed queries against n cached rows, as mla_forward computes them
 * (for tests: the bits must be those of one position and one head at a time):
 * p[ps * 8 + j] = (sum_cc qT[cc * 8 + j] * c_ps[cc] + sum_r qpeT[r * 8 + j] * c_ps[kr + r]) * scale,
 * c_ps = cache + ps * row, each sum in order, products and sums in double. */
void mla_scores_heads(const double *qT, const double *qpeT, const float *cache, size_t row, size_t kr, size_t rope,
                      size_t n, double scale, double *p);
/* The latent contexts of nb <= 8 heads, as mla_forward computes them (for tests: the bits must be
 * those of one head and one position at a time): ctx[j * kr + cc] = sum_ps p[ps * 8 + j] *
 * c_ps[cc], from 0, ps in order, in double; p[ps * 8 + j] for j >= nb is read and must be finite. */
void mla_context_heads(const double *p, const float *cache, size_t row, size_t kr, size_t n, size_t nb, double *ctx);
/* 4.1 MLP with SiTU-GLU (dense layers and the fused shared experts); takes no lap (the
 * caller's phase; mlp_flop gives its FLOP for R rows). */
int mlp_forward(trunk_pass *tp, const kernels *k, const k3_config *c, const mlp_weights *w, const float *x, size_t R,
                float *out, scratch *sc, k3_error *err);
size_t mlp_scratch_bytes(const k3_config *c, size_t R);
double mlp_flop(const mlp_weights *w, size_t R);
/* 4.4 Stable LatentMoE; experts computed by eb. If trace != NULL, the selected
 * expert ids are written there ([R][top_k], top-k order). */
int moe_forward(trunk_pass *tp, const kernels *k, const k3_config *c, const moe_weights *w, int layer,
                expert_backend *eb, const float *x, size_t R, float *out, int32_t *trace, scratch *sc, fwd_phases *pf,
                k3_error *err);
size_t moe_scratch_bytes(const k3_config *c, size_t R);

/* Selection for one token (exposed for tests): scores s_e = sigmoid(logit_e);
 * top-k over s_e + bias_e (ties: lower id), descending; weights from the
 * UNBIASED s, renormalised and scaled per config. Returns 0, or -1-e when
 * expert e's logit or biased score is not finite (a NaN is never compared). */
int moe_route(const k3_config *c, const float *router_logits, const float *bias, int32_t *ids, double *weights);

/* acc[i] = sum_j weights[j] * y[j][i], summed in double in top-k order (j = 0..K-1). */
void moe_combine(const double *weights, const float *y, size_t K, size_t L, float *acc);

/* y = W.row(r) . x using the kernel of W's dtype. */
float dense_row_dot(const kernels *k, const dense_weight *W, size_t r, const float *x);
/* W[r][c] as float. */
float dense_at(const dense_weight *W, size_t r, size_t c);
/* 2 x rows x cols x R: the FLOP of W on R rows */
static inline double dense_flop(const dense_weight *W, size_t R) { return 2.0 * (double)W->rows * (double)W->cols * (double)R; }

#endif
