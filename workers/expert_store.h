/* expert_store.h - where each routed expert lives in the checkpoint.
 *
 * For every MoE layer and expert, the six MXFP4 tensors of the layer schema's
 * expert table (common/layer_schema.h: names
 * `...block_sparse_moe.experts.E.{w1,w2,w3}.{weight_packed,weight_scale}`,
 * w1/w3 logical [I, L], w2 [L, I]; packed [rows, cols/2] U8, scale
 * [rows, cols/32] U8) are located and checked against the config before any compute.
 * When the six tensors form one contiguous byte run in one shard in the release
 * order (w1.p, w1.s, w2.p, w2.s, w3.p, w3.s) the run is recorded so a reader can
 * fetch the expert with one pread. Used by the in-process path and k3-expertd. */
#ifndef K3_EXPERT_STORE_H
#define K3_EXPERT_STORE_H

#include "common/checkpoint.h"
#include "common/config.h"
#include "common/kernels.h"

enum { EXPERT_W1_P, EXPERT_W1_S, EXPERT_W2_P, EXPERT_W2_S, EXPERT_W3_P, EXPERT_W3_S, EXPERT_NT };

typedef struct {
    const ckpt_entry *t[EXPERT_NT];
    int contiguous;          /* 1 if one run [run_begin, run_end) in shard t[0]->shard */
    uint64_t run_begin, run_end;
} expert_loc;

typedef struct {
    int n_layers, n_experts;
    size_t I, L;             /* moe_intermediate_size, routed_expert_hidden_size */
    expert_loc *loc;         /* [n_layers * n_experts]; unused for dense layers */
    uint64_t expert_bytes;   /* bytes of one expert's six tensors */
} expert_store;

/* The six weights of one expert as kernel operands. */
typedef struct {
    mxfp4_weight w1, w2, w3; /* gate [I,L], down [L,I], up [I,L] */
} expert_weights;

/* Locates and validates every routed expert of every MoE layer (only experts
 * for which want(layer, expert, ctx) is nonzero, or all when want is NULL). */
int expert_store_open(expert_store *st, checkpoint *ck, const k3_config *cfg,
                      int (*want)(int layer, int expert, void *ctx), void *ctx, k3_error *err);
void expert_store_free(expert_store *st);
const expert_loc *expert_store_loc(const expert_store *st, int layer, int expert);

/* Points w at an expert's bytes laid out as in the file, starting at base,
 * where base holds the bytes of [loc->run_begin, loc->run_end) (contiguous
 * experts) - used by caches that read the run into their own buffer. */
void expert_weights_from_run(const expert_store *st, const expert_loc *loc, const uint8_t *base, expert_weights *w);
/* Points w at an expert's bytes in the mapped checkpoint. */
int expert_weights_mapped(const expert_store *st, checkpoint *ck, int layer, int expert, expert_weights *w, k3_error *err);
/* Refuses an expert with a scale byte 255 (NaN in OCP MXFP4), naming the tensor. */
int expert_weights_check(const expert_weights *w, const expert_loc *loc, k3_error *err);

#endif
