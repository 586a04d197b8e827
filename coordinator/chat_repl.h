/* chat_repl.h - interactive chat over one carried sequence state: a session API (one turn at a
 * time, used by tests and tools) and the REPL loop behind `k3 MODEL --chat` (docs/CHAT.md).
 *
 * Contract
 * - A session owns a gen_seq (generate.h: the KDA/MLA state, the sampler, the stop ids and the
 *   transcript, every id of the conversation in order; at most opt->max_context ids, else the
 *   engine's context). A turn renders the user text (chat.h), pushes it, and generates with the one
 *   generation step (gen_step) until a stop id or opt->max_tokens: the first step feeds ONLY the ids
 *   not fed yet (the pending ids, then the user message, then the generation prompt) in chunks of
 *   opt->chunk; each token is picked by the sampler from the last position's logits, its text
 *   streamed to `out` by gen_seq's on_token (utf8_stream_write_token: complete code points, U+FFFD
 *   for ill-formed bytes, stop ids not printed) and, unless it ends the turn, fed by the next step.
 *   The conversation is never re-read.
 * - The id that ends the turn (the stop id, or after max_tokens the last generated id followed by the
 *   template's end of message, chat_end_id) becomes PENDING: it is part of the transcript at once and
 *   is fed at the start of the next turn together with the new message (one trunk pass fewer per
 *   turn; chunking never changes a bit). Likewise the system message (opt->system; NULL = the
 *   template's default, chat_default_system; "" = none) is pending from the start and after a reset.
 *   Invariant: transcript length == state position + pending count.
 * - chat_session_reset: fresh state (seq_state_reset), transcript cleared, sampler re-seeded, the
 *   system message pending again. The same inputs then give the same replies.
 * - opt->max_context (0 = none): a turn whose ids plus max_tokens would pass it is refused
 *   (K3_EINPUT) before anything is fed.
 * - Errors (common/error.h): 0, or -1 with err filled. chat_session_turn: err->kind K3_EINPUT
 *   (bad input, e.g. invalid UTF-8, or context full: nothing was fed, the session is unchanged and
 *   usable); K3_EFAIL (engine failure or non-finite logits: the state is undefined, stop using the
 *   session until chat_session_reset); K3_ENOMEM.
 * - Snapshots (opt->snaps): a turn that starts from an empty state restores the longest stored prefix
 *   of its ids (snapshots.h) and feeds only the rest; the state at the end of the system message and
 *   at the end of every turn is stored. Bits are unchanged (a snapshot is an exact copy).
 * - chat_repl: reads lines from `in` (a terminal or a pipe; "\n" or "\r\n" endings; the last line
 *   needs no newline). Each line is one user message. Commands (the whole line, blanks around it
 *   ignored): /reset, /exit, /quit, /help, /save FILE, /load FILE. Blank lines are skipped. Replies go to `out`, one line per
 *   turn (a "> " prompt is printed when `in` is a terminal); the banner, per-turn stats (tokens,
 *   tokens/s, why the turn ended) and errors go to `log`. The reply's tok/s is generated tokens /
 *   the time from the turn's first forward pass to its last pick (prefill included). EOF or /exit ends it.
 *   Returns 0 (normal end), 1 (run-time failure, message on log), 2 (refused options, message on
 *   log). */
#ifndef K3_CHAT_REPL_H
#define K3_CHAT_REPL_H

#include "coordinator/chat.h"
#include "coordinator/forward.h"
#include "coordinator/sampler.h"
#include "coordinator/snapshots.h"
#include "coordinator/state_file.h"
#include "coordinator/tokenizer.h"
#include <stdio.h>

typedef struct {
    const char *system;       /* NULL: template default; "": none */
    int thinking;             /* K3: <|open|>think<|sep|> (1, default) or <|open|>response<|sep|> (0) */
    chat_template tmpl;       /* CHAT_TEMPLATE_AUTO (default) detects from the tokenizer's specials */
    size_t max_tokens;        /* per reply, >= 1 (default 512) */
    sampler_config sampling;  /* default greedy */
    const int32_t *stop_ids;  /* extra stop ids (copied at session creation) */
    size_t n_stop_ids;
    size_t chunk;             /* prefill chunk in tokens, >= 1 (default 64) */
    size_t max_context;       /* 0 = no limit */
    int stats;                /* per-turn stats on log (default 1) */
    const state_fingerprint *fp; /* the model's fingerprint: /save, /load (NULL = unavailable) */
    const char *load_state;   /* chat_repl: reopen this saved conversation first (NULL = none) */
    snap_store *snaps;        /* prefix snapshots (end of the system message, end of every turn; NULL = none) */
    /* speculation (draft.h; NULL = none): after each pick up to draft_max proposals, verified by
     * gen_step_spec (the replies are those without it) */
    struct draft_source *draft;
    size_t draft_max;
    int draft_per_position;   /* rollback from per-position states (the plan's), else re-feed */
} chat_options;

void chat_options_default(chat_options *o);

typedef struct chat_session chat_session;

typedef struct {
    size_t n_fed;        /* ids fed before the first generated one (pending + message + prompt) */
    size_t n_gen;        /* generated ids (without the stop id) */
    int32_t stop_id;     /* the stop id that ended the turn, or -1 */
    int hit_limit;       /* 1 if max_tokens ended the turn */
    double prefill_s;    /* the turn's first forward pass (or snapshot restore) to its first pick */
    double decode_s;     /* the first pick to the last pick (the one that ended the turn) */
    size_t context;      /* transcript length after the turn */
} chat_turn_stats;

/* 0, or -1: K3_EINPUT for refused options (template, sampler settings, stop ids, max_tokens,
 * chunk); K3_ENOMEM; K3_EFAIL if the sequence state cannot be made. */
int chat_session_create(chat_session **s, engine *en, const tokenizer *tok, const chat_options *opt, k3_error *err);
void chat_session_free(chat_session *s);
int chat_session_reset(chat_session *s, k3_error *err);
/* One user message and the reply; out may be NULL (nothing printed); stats may be NULL. */
int chat_session_turn(chat_session *s, const char *text, size_t len, FILE *out, chat_turn_stats *stats, k3_error *err);
/* The transcript (fed and pending ids, in order) and how many of them are fed. */
const int32_t *chat_session_transcript(const chat_session *s, size_t *n, size_t *n_fed);
chat_template chat_session_template(const chat_session *s);
/* The stop ids in use (template ones first). */
const int32_t *chat_session_stop_ids(const chat_session *s, size_t *n);

/* State files (state_file.h). save: the transcript (fed + pending), the state, the sampler and its
 * generator, template and thinking. load: the file is validated completely (refusal: K3_EINPUT,
 * the session unchanged); a chat state saved with another template is refused; the session then
 * continues that conversation: its transcript, state and generator (and its sampler settings when
 * this session's are the defaults) replace the session's. A later /reset starts this session's
 * own fresh conversation. */
int chat_session_save(chat_session *s, const char *path, k3_error *err);
int chat_session_load(chat_session *s, const char *path, k3_error *err);

int chat_repl(engine *en, const tokenizer *tok, const chat_options *opt, FILE *in, FILE *out, FILE *log);

#endif
