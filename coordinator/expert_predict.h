/* expert_predict.h - router-score prediction of the next MoE layer's experts (prefetch hints).
 *
 * At MoE layer l, once its experts are computed, the NEXT MoE layer's router (a copy read
 * at start, bf16, `expert_predict_bytes`; the trunk's own copy may be streamed and not in
 * memory yet) is applied to layer l's MoE input x: each token's top-k by the same rule as
 * the real routing (sigmoid + bias, moe_route), the union ordered by how many tokens chose
 * an expert, then by id. In mode EP_HINT those experts' reads are started through the
 * backend's hint (coordinator/expert_backend.h); the real routing of that layer runs
 * later, as always, from its own input: a prediction only starts reads, it never chooses an
 * expert, so the ids are those of a run without it (tests/t_56_prefetch.sh).
 * When the next layer's routing comes, the prediction is scored: recall = |predicted &
 * actual| / |actual| (distinct experts of the layer's batch), summed over every MoE layer
 * that had a prediction. Mode EP_PREDICT scores without starting reads (recall at no I/O).
 * Memory: the router copies, a count per expert, the predicted lists; no allocation after
 * create. */
#ifndef K3_EXPERT_PREDICT_H
#define K3_EXPERT_PREDICT_H

#include "common/kernels.h"
#include "coordinator/model.h"

typedef enum { EP_OFF = 0, EP_PREDICT = 1, EP_HINT = 2 } ep_mode;

typedef struct {
    uint64_t layers;     /* MoE layer batches that had a prediction to score */
    uint64_t actual;     /* distinct experts they used, summed */
    uint64_t predicted;  /* distinct experts predicted for them, summed */
    uint64_t correct;    /* predicted and used */
    uint64_t hinted;     /* experts handed to the backend's hint (EP_HINT); what it read of them: its own counters */
    double predict_s;    /* time spent predicting (router matvecs, selection) */
} ep_stats;

typedef struct expert_predict expert_predict;

/* Bytes of the router copies for cfg (what the memory plan counts for modes != EP_OFF). */
uint64_t expert_predict_bytes(const k3_config *cfg);
/* Reads the router of every MoE layer but the first (the layers a prediction is for). */
expert_predict *expert_predict_create(k3_model *m, ep_mode mode, k3_error *err);
void expert_predict_free(expert_predict *p);
ep_mode expert_predict_mode(const expert_predict *p);
/* Layer `layer` (MoE) ran on x [R][E]: predicts the next MoE layer's experts into the
 * predictor (scratch: logits [R][n_experts] floats, ids [R][k] ints, weights [R][k] doubles,
 * all the caller's). Returns the next MoE layer (or -1: none) and sets *list, *n to the
 * prediction, most likely first. */
int expert_predict_next(expert_predict *p, const kernels *k, int layer, const float *x, size_t R, float *logits,
                        int32_t *ids, double *weights, const int32_t **list, size_t *n);
/* The real routing of `layer`: ids [n] (k per token, any order, repeats allowed). */
void expert_predict_score(expert_predict *p, int layer, const int32_t *ids, size_t n);
void expert_predict_add_hinted(expert_predict *p, size_t n);
ep_stats expert_predict_stats(const expert_predict *p);

#endif
