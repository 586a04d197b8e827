/* forward.h - one forward pass over a batch of sequences (docs/MODEL.md 4.5).
 *
 * forward_batch feeds each sequence i its n tokens at positions st->pos.., advances
 * its st->pos by n, and writes the logits of its rows logits_from..n-1 into
 * logits[(t - logits_from) * vocab]. The trunk is walked once and each routed
 * expert asked for once per call for the whole batch; each sequence keeps its own
 * KDA/MLA state. The bits of every sequence's logits are the same whether it is
 * fed alone or batched, as one chunk, token by token, or recomputed from scratch
 * (the numerics contract: every dot product is per (row, token), threads split
 * rows only). The AttnRes block stack lives within the call only.
 *
 * An engine is created once (engine_init) with the most rows one call may carry
 * (max_rows: the sum of n over the batch), the most positions a sequence may reach
 * (max_ctx) and its thread count; its scratch arena is allocated then, sized by
 * forward_scratch_bytes, and no forward call allocates. A call over more rows or
 * past max_ctx is refused. A failed call (a worker past its restart limit, a read
 * error) abandons its trunk pass, so the next call starts clean; the states of the
 * sequences in a failed call are undefined (callers reset or restore them). */
#ifndef K3_FORWARD_H
#define K3_FORWARD_H

#include "coordinator/expert_backend.h"
#include "coordinator/fwd_phases.h"
#include "coordinator/model.h"
#include "coordinator/scratch.h"
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
    /* set by engine_init */
    size_t max_rows, max_ctx;
    int nthreads;
    scratch arena;
    uint64_t passes;          /* forward calls made (each walks the whole trunk once) */
    fwd_phases phases;        /* every pass's time and FLOP by phase, summed (fwd_phases.h) */
    /* optional: called at the start of every pass (re-binds the OpenMP threads to their
     * NUMA nodes: a pass may run on a thread team that was created after the first binding) */
    void (*on_pass)(void *ctx);
    void *on_pass_ctx;
} engine;

typedef struct {
    seq_state *st;          /* the sequence's own state; its tokens go at st->pos.. and st->pos advances by n */
    const int32_t *tokens;  /* n >= 1 tokens to feed */
    size_t n;
    size_t logits_from;     /* logits wanted for rows logits_from..n-1 */
    float *logits;          /* [(n - logits_from)][vocab], or NULL */
} forward_seq;

/* Bytes of the scratch arena for max_rows rows, max_ctx positions and nthreads threads. */
size_t forward_scratch_bytes(const k3_config *c, size_t max_rows, size_t max_ctx, int nthreads, size_t lm_chunk_rows);

/* Doubles of one-token inputs that a forward's thread converts in one matmul call (kernels.h
 * matmul_reserve_x): two of the widest trunk inputs (a call of the layer code has at most two
 * distinct inputs: KDA's f_b, b, g) or the in-process experts' top-k down-projection inputs
 * (matmul_mxfp4_list), whichever is more. The plan counts it with the scratch. */
size_t forward_x_doubles(const k3_config *c);

/* Fills the engine's set-up fields and allocates its arena and, for the calling thread,
 * engine_reserve_thread's buffers. en->model and en->trunk must be set (and en->k for the
 * workspace). */
int engine_init(engine *en, size_t max_rows, size_t max_ctx, int nthreads, k3_error *err);
/* In the calling thread: its one-token input buffer (forward_x_doubles) and, in each of its
 * OpenMP team's nthreads threads, the prefill kernels' workspace (kernels.h matmul_reserve_gemm),
 * so that no forward allocates. engine_init does it for its own thread; a thread that runs the
 * forwards of an engine made elsewhere (the server's scheduler: libgomp gives it a team of its
 * own) calls it before its first forward. Without memory the kernels run without the buffers
 * (the same bits): -1 and err says which. */
int engine_reserve_thread(const engine *en, k3_error *err);
void engine_free(engine *en);

int forward_batch(engine *en, forward_seq *seqs, size_t n_seqs, k3_error *err);
/* One sequence: forward_batch of one. */
int forward_chunk(engine *en, seq_state *st, const int32_t *tokens, size_t T, size_t logits_from, float *logits,
                  k3_error *err);

#endif
