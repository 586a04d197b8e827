/* forward.h - one forward pass over a chunk of tokens (K3-MODEL.md 4.5).
 *
 * forward_chunk consumes T tokens at positions st->pos.., advances st->pos by T
 * and writes the logits of chunk positions logits_from..T-1 into
 * logits[(t - logits_from) * vocab]. Bits of every position's logits are the
 * same whether the sequence is fed as one chunk, token by token, or recomputed
 * from scratch. The AttnRes block stack lives within the call only. */
#ifndef K3_FORWARD_H
#define K3_FORWARD_H

#include "coordinator/expert_backend.h"
#include "coordinator/model.h"
#include "coordinator/state.h"
#include "coordinator/trunk.h"

typedef struct {
    k3_model *model;
    trunk *trunk;             /* where the trunk's bytes come from (pinned or streamed) */
    const kernels *k;
    expert_backend *experts;
    /* optional: expert selection trace callback (layer, position, ids[top_k]) */
    void (*on_route)(void *ctx, int layer, size_t position, const int32_t *ids, int top_k);
    void *on_route_ctx;
} engine;

int forward_chunk(engine *en, seq_state *st, const int32_t *tokens, size_t T, size_t logits_from, float *logits,
                  k3_error *err);

#endif
