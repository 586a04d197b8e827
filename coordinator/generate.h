/* generate.h - the one generation step: feed, pick, stop, stream (every caller uses it).
 *
 * A gen_seq is one sequence being generated: its KDA/MLA state, its sampler, and
 * its id history ids[0..n): ids[0..st.pos) are fed (in the state), ids[st.pos..n)
 * are PENDING (pushed, not fed yet). A step feeds the pending ids (a prefill in
 * chunks of at most `chunk`), picks the next id with the sampler from the last
 * fed position's logits, appends it as pending (it is fed by the next step),
 * tells whether it is a stop id, and hands it to on_token. So the id that ends a
 * generation is pending, never fed: a later push (the next chat message, a
 * resumed run) feeds it with the new ids in one pass.
 *
 * - The history never grows past cap_ids (the context, --max-context): a push or
 *   a pick beyond it is refused (k3_error, -1 from push; GEN_CONTEXT_FULL from a
 *   step), never a reallocation past the plan.
 * - gen_step_batch advances several sequences with ONE forward_batch: every
 *   sequence with pending ids gets up to `chunk` of them (at most the engine's
 *   max_rows in total, taken in order); each one whose pending ids are then all
 *   fed picks a token (ev[i].picked = 1). Ids and logits are those of running
 *   each sequence alone (forward.h).
 *   A sequence's own failure (non-finite logits, context full) is its ev[i].status,
 *   not the batch's; -1 from gen_step_batch means the forward itself failed (every
 *   sequence of the batch is then undefined).
 * - gen_step: one sequence, feeds until a token is picked; its status is returned.
 * - gen_feed: feeds every pending id and picks nothing (--gen 0, teacher forcing).
 * - Logit rows: with gen_seq_watch_rows, every row of positions >= from that a
 *   step computes is handed to on_row (teacher forcing, --dump-logits).
 * - full_recompute: every step resets the state and feeds the whole history
 *   (the same bits; a check of the carried state).
 * - Non-finite logits: the step fails ("refusing to emit a token"); the sampler is
 *   not advanced. After a failed step the state is undefined: gen_seq_reset it or
 *   restore it (state files). */
#ifndef K3_GENERATE_H
#define K3_GENERATE_H

#include "common/mono_clock.h" /* k3_now_s, for the callers that time steps */
#include "coordinator/forward.h"
#include "coordinator/sampler.h"

enum { GEN_CONTEXT_FULL = -3 };
#define GEN_MAX_BATCH 256 /* sequences in one gen_step_batch */

typedef struct {
    seq_state st;
    sampler smp;
    int32_t *ids;            /* history [cap] */
    size_t n, cap;
    int32_t *stop_ids;       /* owned copy */
    size_t n_stop_ids;
    size_t vocab;
    float *row;              /* logits of the last fed position [vocab] */
    int full_recompute;
    /* optional logit rows */
    void (*on_row)(void *ctx, size_t pos, const float *row);
    void *on_row_ctx;
    size_t rows_next;        /* next position whose row is reported */
    float *rows;             /* [chunk][vocab] while rows are watched */
    size_t rows_cap;         /* rows the buffer holds */
    int feeding;             /* a prefill is under way (full_recompute resets once per token) */
    /* speculation (gen_step_spec, gen_seq_speculate): rows of a verification pass; the recurrent
     * part before it (re-feed rollback) or after each of its first proposals (per-position
     * rollback); counters */
    float *spec_rows;
    size_t spec_rows_cap;
    void *spec_snap;
    size_t spec_copies;      /* copies of the recurrent part spec_snap holds */
    int spec_per_position;
    uint64_t spec_passes, spec_proposed, spec_accepted, spec_refeeds, spec_restores;
    /* optional streaming */
    void (*on_token)(void *ctx, int32_t id, int stop);
    void *on_token_ctx;
} gen_seq;

typedef struct {
    int status;      /* 0; GEN_CONTEXT_FULL; -1 non-finite logits or sampler failure (msg in `why`) */
    int picked;      /* a token was picked by this step */
    int32_t id;
    int stop;        /* id is one of the stop ids */
    size_t pos;      /* the position whose logits chose it */
    char why[160];
} gen_event;

/* cap_ids: the most ids the history may hold (the context). */
int gen_seq_init(gen_seq *g, const k3_config *c, const sampler_config *sc, const int32_t *stop_ids, size_t n_stop_ids,
                 size_t cap_ids, k3_error *err);
void gen_seq_free(gen_seq *g);
/* Empty history, zero state, sampler re-seeded. */
void gen_seq_reset(gen_seq *g, const k3_config *c);
/* Appends pending ids (checked against the vocabulary and the context). */
int gen_seq_push(gen_seq *g, const int32_t *ids, size_t n, k3_error *err);
/* Drops pending ids past n (n >= st.pos): a refused chat turn un-pushes its ids. */
void gen_seq_truncate(gen_seq *g, size_t n);
/* Report every logits row of positions >= from to on_row; rows computed a chunk at a time. */
int gen_seq_watch_rows(gen_seq *g, size_t from, size_t chunk, void (*on_row)(void *, size_t, const float *),
                       void *ctx, k3_error *err);
static inline size_t gen_seq_pending(const gen_seq *g) { return g->n - g->st.pos; }

int gen_step_batch(engine *en, gen_seq *const *g, size_t n, size_t chunk, gen_event *ev, k3_error *err);
int gen_step(engine *en, gen_seq *g, size_t chunk, gen_event *ev, k3_error *err);
int gen_feed(engine *en, gen_seq *g, size_t chunk, k3_error *err);

/* Speculation buffers for up to k proposals per pass: k+1 logits rows, and either one copy
 * of the recurrent part (per_position 0: rollback = restore + re-feed the kept ids, a second
 * pass) or k copies (per_position 1: the verification pass keeps the state after each
 * position, rollback = restore, no pass). Bytes: gen_spec_bytes (the plan's speculation line). */
int gen_seq_speculate(gen_seq *g, const k3_config *c, size_t k, int per_position, k3_error *err);
uint64_t gen_spec_bytes(const k3_config *c, size_t k, int per_position);

/* Exact speculation. With exactly one pending id (the last pick) and proposals d[0..k) for
 * the ids after it: ONE forward over [pending, d0..d(k-1)] with the logits of all k+1 rows,
 * then picks in order with the sampler, exactly as plain decoding would (the same logits
 * bits, one generator draw per pick): pick i comes from row i; the step goes on while pick
 * i == d[i], and ends at the first mismatch (that pick is the correction), after the pick
 * from the last row (all accepted: a bonus id), at a stop id, or after max_emit picks. Each
 * pick is an event (ev[0..*n_ev), room for k+1). The state ends as plain decoding leaves
 * it: every emitted id fed but the last, which is pending. When fewer than k+1 rows were
 * kept, the KDA recurrent state is rolled back (gen_seq_speculate; buffers too small for k
 * are grown here, keeping the method): restored from the state the pass kept at the last
 * kept position, or from a snapshot taken before the pass with the kept ids re-fed (MLA rows
 * past the kept positions are simply overwritten later). Ids and logits are those of plain
 * decoding, always, with either rollback. Without exactly one pending id, or with k == 0,
 * it is one gen_step. Returns like gen_step. */
int gen_step_spec(engine *en, gen_seq *g, const int32_t *d, size_t k, size_t max_emit, gen_event *ev, size_t *n_ev,
                  k3_error *err);

/* gen_step_batch with speculation: sequence i with proposals d[i][0..k[i]) (d NULL, d[i] NULL
 * or k[i] 0: none) and exactly one pending id gets a verification pass of [pending, d...]
 * (k[i] cut to max_emit[i] - 1, the rows left and the context) in the same ONE forward_batch
 * as the others' plain steps, and its picks as gen_step_spec makes them: events ev[i][0..n_ev[i])
 * (room for k[i]+1; a failed pick is the last event, with its status, as in gen_step_batch).
 * Every other sequence is stepped as by gen_step_batch (ev[i][0], n_ev[i] 0 or 1). Ids and
 * logits are those of each sequence decoded alone without speculation. -1: the forward (or a
 * re-feed pass) failed. */
int gen_step_spec_batch(engine *en, gen_seq *const *g, size_t n, size_t chunk, const int32_t *const *d, const size_t *k,
                        const size_t *max_emit, gen_event *const *ev, size_t *n_ev, k3_error *err);

/* Feeds ids[0..n) through st in chunks, keeping the logits of positions >= want_from
 * at logits[(p - want_from) * vocab] (tests and tools; generation uses gen_step). */
int feed_tokens(engine *en, seq_state *st, const int32_t *ids, size_t n, size_t chunk, size_t want_from, float *logits,
                k3_error *err);
/* arg-max, lowest id on ties; -1 if any logit is not finite. */
int32_t argmax_logits(const float *logits, size_t n);

#endif
