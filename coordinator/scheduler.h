/* scheduler.h - the server's generation loop: slots, a bounded queue, batched steps, cancellation.
 *
 * Contract
 * - One scheduler thread owns the engine. Up to `parallel` sequences (slots) are active at once;
 *   each slot is one gen_seq (generate.h: state, sampler, stop ids, id history of at most
 *   max_context ids, logits row). Requests wait in a FIFO queue of at most `max_queue` entries;
 *   sched_submit refuses more (SCHED_EFULL: the server answers 429).
 * - A step is the one generation step of generate.h, gen_step_batch, over every active slot
 *   (the same loop as `--ids` and the chat): newcomers from the queue take free slots (their
 *   prompt pushed as pending ids); decoding slots come first in the batch (one id each: the last
 *   pick), then prompts (oldest request first), which get what is left of the engine's max_rows in
 *   chunks of at most `chunk`, so a long prompt never stalls the others for more than one chunk. One forward call
 *   runs them all (forward_batch: the trunk and each routed expert read once per step). A slot
 *   whose prompt is fed picks with its own sampler from its own row; picks stream through the
 *   gen_seq's on_token hook. Per-sequence bits are independent of the batch and of chunking
 *   (forward.h), so every request's ids and logits equal those of the same request run alone
 *   (`bin/k3 --ids`). The step is one function (step()) where a per-slot draft plugs in: each
 *   slot gets a list of events, one per pick.
 * - Prefix reuse: a freed slot keeps its state and the ids it has consumed. A new request whose
 *   prompt strictly extends those ids takes that slot and feeds only the rest (req->n_cached says
 *   how many were skipped). Otherwise, with a snapshot store (cfg->snaps, snapshots.h), the slot
 *   restores the longest stored history the prompt strictly extends; the store gets the state at
 *   the end of every prompt and at the end of every request (its prompt + the fed reply), so a
 *   conversation's next turn skips what was computed before, whichever slot it lands on.
 *   Otherwise the slot's state is reset. Restored states are bit-exact (snapshots.h), so reuse
 *   never changes a bit.
 * - Forced ids (gen_request.force): pushed into the slot's gen_seq as pending ids when their
 *   trigger has been generated, and appended to the output; the next step feeds them (a chunk)
 *   and picks after them, exactly as if a prompt had ended with them.
 * - Ending: a stop id (not part of the output), max_tokens (finish LENGTH), a cancel
 *   (sched_cancel: a client went away or a stop string matched; the slot is freed at the next step),
 *   an engine failure (finish ERROR with a message; the slot's state is reset), or shutdown.
 * - Output goes to the request under its mutex (out[], n_out, done) and its condition variable is
 *   broadcast after every token, so an HTTP thread can stream. Ownership: the request is
 *   reference-counted (creator + scheduler); gen_request_release frees it at zero.
 * - Logprobs: with want_logprobs, each output token carries log softmax of its logit (double
 *   arithmetic over the row) and, for top_logprobs > 0, the top ids (highest first, lower id on a
 *   tie) with theirs. These never influence the pick. */
#ifndef K3_SCHEDULER_H
#define K3_SCHEDULER_H

#include "coordinator/forward.h"
#include "coordinator/generate.h"
#include "coordinator/sampler.h"
#include "coordinator/snapshots.h"
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum { SCHED_OK = 0, SCHED_EFULL = -1, SCHED_ESHUTDOWN = -2, SCHED_ENOMEM = -3 };
enum { FINISH_NONE = 0, FINISH_STOP, FINISH_LENGTH, FINISH_CANCEL, FINISH_ERROR };
#define SCHED_MAX_TOP_LOGPROBS 20

typedef struct gen_request {
    /* input (set before sched_submit, not changed after) */
    int32_t *prompt;
    size_t n_prompt;
    size_t max_tokens;
    sampler_config sampling;
    int32_t *stops;
    size_t n_stops;
    int want_logprobs, top_logprobs;
    /* forced ids (a tool call forced by tool_choice): once the output ends with
     * force_after[0..n_force_after) (at once when that is empty), force[0..n_force) are appended
     * to the output and to the sequence as if generated (logprob 0, the only top entry); the model
     * goes on after them. Once per request. */
    int32_t *force, *force_after;
    size_t n_force, n_force_after;
    /* output, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t *out;
    float *logprob;        /* [n_out] when want_logprobs */
    int32_t *top_id;       /* [n_out][top_logprobs] */
    float *top_lp;
    size_t n_out, cap;
    int done, finish;
    int32_t stop_id;       /* the stop id that ended it, or -1 */
    size_t n_cached;       /* prompt ids skipped thanks to a slot's kept state */
    int cancelled;         /* set by sched_cancel */
    char error[256];
    double t_submit, t_start, t_first, t_done; /* CLOCK_MONOTONIC seconds */
    /* the steps this request's sequence was fed in (scheduler step numbers, 1-based), and the most
     * prompt ids one of its steps fed (final once done) */
    uint64_t n_steps, step_first, step_last;
    size_t max_rows_step;
    int refs;
} gen_request;

/* A zeroed request with refs = 1, its mutex and condition ready. NULL when out of memory. */
gen_request *gen_request_new(void);
void gen_request_release(gen_request *r);

typedef struct scheduler scheduler;

typedef struct {
    size_t parallel, max_queue, chunk, max_context;
    snap_store *snaps; /* NULL: none; used by the scheduler thread only */
    /* speculation (--serve --draft ngram): up to draft_max n-gram proposals per decoding slot and
     * step, verified in the step's one forward (gen_step_spec_batch); 0 = off. The ids, logprobs
     * and finish of every request are those without it. Not for a request with forced ids. */
    size_t draft_max;
    int draft_per_position; /* rollback from per-position states (else snapshot + re-feed) */
} sched_config;

typedef struct {
    size_t active, queued, parallel;
    uint64_t steps, tokens_prefilled, tokens_generated, prefix_tokens_reused, snapshot_tokens_restored, batch_rows;
    uint64_t spec_passes, spec_proposed, spec_accepted; /* speculation: verification passes, proposals, accepted */
    double forward_s;
    snap_stats snap;  /* the snapshot store's counters (copied on the scheduler thread) */
} sched_stats;

/* Starts the scheduler thread. NULL on failure (message in err). */
scheduler *sched_create(engine *en, const sched_config *cfg, k3_error *err);
/* Queues r (takes a reference). SCHED_OK, SCHED_EFULL, SCHED_ESHUTDOWN. */
int sched_submit(scheduler *s, gen_request *r);
/* Asks for r to end (FINISH_CANCEL unless it ends otherwise first). Safe at any time. */
void sched_cancel(scheduler *s, gen_request *r);
void sched_get_stats(scheduler *s, sched_stats *st);
/* Cancels everything queued or running and stops the thread; the scheduler stays valid (submit
 * answers SCHED_ESHUTDOWN, cancel does nothing). Idempotent. */
void sched_stop(scheduler *s);
/* sched_stop, then frees everything. NULL is fine. */
void sched_destroy(scheduler *s);

#endif
