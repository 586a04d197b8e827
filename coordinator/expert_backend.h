/* expert_backend.h - the one interface between the MoE layer and whoever computes experts.
 *
 * run(): for MoE layer `layer`, zlat holds ntok latent rows [ntok][L]; the call
 * computes npairs expert outputs, pair i = expert pair_expert[i] applied to
 * zlat row pair_token[i], into out[i][L]. Each output's bits do not depend on
 * the backend, on grouping, or on the order answers arrive. The coordinator
 * combines them in top-k order itself. Implementations: in-process
 * (experts_local.c) and expert-server processes over shared memory.
 *
 * hint() (optional, NULL: none): a prediction of `layer`'s experts, most likely first
 * (coordinator/expert_predict.h): the backend may start reading them; it never changes a
 * result. Returns the reads it started. predict (NULL: none) is the predictor moe_forward
 * asks after each MoE layer; it belongs to whoever set it, not to the backend. */
#ifndef K3_EXPERT_BACKEND_H
#define K3_EXPERT_BACKEND_H

#include "common/error.h"
#include <stddef.h>
#include <stdint.h>

typedef struct expert_backend expert_backend;
struct expert_backend {
    int (*run)(expert_backend *b, int layer, const float *zlat, size_t ntok, const int32_t *pair_token,
               const int32_t *pair_expert, size_t npairs, float *out, k3_error *err);
    void (*destroy)(expert_backend *b);
    void *impl;
    size_t (*hint)(expert_backend *b, int layer, const int32_t *experts, size_t n);
    struct expert_predict *predict;
};

#endif
