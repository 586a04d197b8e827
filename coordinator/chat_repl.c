/* chat_repl.c - chat sessions over a carried sequence state and the `--chat` REPL (contract:
 * chat_repl.h). */
#include "coordinator/chat_repl.h"
#include "coordinator/draft.h"
#include "coordinator/generate.h"
#include "coordinator/state_gen.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct chat_session {
    engine *en;
    const tokenizer *tok;
    chat_options opt;
    chat_template tmpl;
    const char *system;     /* resolved: NULL = no system message */
    gen_seq g;              /* state, sampler, stop ids and the transcript g.ids[0, g.n): [0, st.pos) fed */
    int g_ok, broken;
    int32_t end_id;
    chat_ids msg;           /* a turn's rendered ids before they are pushed (reused) */
    size_t V;
    size_t sys_n;           /* ids of the system message at the start of the transcript */
    utf8_stream us;         /* the reply being streamed (on_token) */
    FILE *out;
    size_t n_gen;
};

void chat_options_default(chat_options *o) {
    memset(o, 0, sizeof *o);
    o->system = NULL;
    o->thinking = 1;
    o->tmpl = CHAT_TEMPLATE_AUTO;
    o->max_tokens = 512;
    sampler_config_default(&o->sampling);
    o->chunk = 64;
    o->max_context = 0;
    o->stats = 1;
}

/* Pushes s->msg as pending ids; a history past the context is refused (K3_EINPUT). */
static int push_msg(chat_session *s, k3_error *err) {
    k3_error perr = {0};
    if (gen_seq_push(&s->g, s->msg.ids, s->msg.n, &perr)) return k3_refuse(err, "%s; /reset to start over", perr.msg);
    return 0;
}

/* The system message (if any) as pending ids of an empty transcript. */
static int queue_system(chat_session *s, k3_error *err) {
    s->sys_n = 0;
    if (!s->system) return 0;
    s->msg.n = 0;
    int rc = chat_render_turn(s->tok, s->tmpl, "system", s->system, strlen(s->system), &s->msg, err);
    if (!rc) rc = push_msg(s, err);
    if (!rc) s->sys_n = s->g.n;
    return rc;
}

/* Snapshots: restore the longest stored prefix into an empty state; store the end of the system
 * message. Best effort: a failure to store is not an error of the turn. -1: engine failure. */
static int snap_before_turn(chat_session *s, k3_error *err) {
    k3_error kerr = {0};
    if (!s->opt.snaps) return 0;
    if (s->g.st.pos == 0) {
        long L = snap_lookup(s->opt.snaps, s->g.ids, s->g.n, s->g.n - 1, &s->g.st, &kerr);
        if (L < 0) {
            s->broken = 1;
            return k3_fail_as(err, kerr.kind, "%s", kerr.msg);
        }
    }
    if (s->sys_n && s->g.st.pos < s->sys_n && s->sys_n < s->g.n) {
        size_t from = s->g.st.pos;
        if (feed_tokens(s->en, &s->g.st, s->g.ids + from, s->sys_n - from, s->opt.chunk, (size_t)-1, NULL, &kerr)) {
            s->broken = 1;
            return k3_fail_as(err, kerr.kind, "%s", kerr.msg);
        }
        snap_insert(s->opt.snaps, s->g.ids, &s->g.st, &kerr);
    }
    return 0;
}

void chat_session_free(chat_session *s) {
    if (!s) return;
    if (s->g_ok) gen_seq_free(&s->g);
    chat_ids_free(&s->msg);
    free(s);
}

int chat_session_create(chat_session **out, engine *en, const tokenizer *tok, const chat_options *opt, k3_error *err) {
    *out = NULL;
    if (opt->max_tokens < 1) {
        k3_refuse(err, "--max-tokens must be at least 1");
        return -1;
    }
    if (opt->chunk < 1) {
        k3_refuse(err, "--chunk must be at least 1");
        return -1;
    }
    chat_session *s = calloc(1, sizeof *s);
    if (!s) {
        k3_nomem(err, "out of memory for a chat session");
        return -1;
    }
    s->en = en;
    s->tok = tok;
    s->opt = *opt;
    s->opt.stop_ids = NULL;
    s->opt.n_stop_ids = 0;
    s->V = (size_t)en->model->cfg.vocab_size;
    int rc = chat_template_resolve(tok, opt->tmpl, &s->tmpl, err);
    if (rc) goto fail;
    s->system = opt->system ? (opt->system[0] ? opt->system : NULL) : chat_default_system(s->tmpl);
    sampler probe_smp; /* refused sampler settings are the caller's (K3_EINPUT), before anything is made */
    if (sampler_init(&probe_smp, &opt->sampling, err)) {
        rc = -1;
        goto fail;
    }
    sampler_free(&probe_smp);
    int32_t *stops = NULL;
    size_t n_stops = 0;
    if ((rc = chat_stop_ids(tok, s->tmpl, opt->stop_ids, opt->n_stop_ids, &stops, &n_stops, err)))
        goto fail;
    s->end_id = chat_end_id(tok, s->tmpl);
    for (size_t i = 0; i < n_stops; i++)
        if ((size_t)stops[i] >= s->V) {
            k3_refuse(err, "stop id %d is outside the model's vocabulary [0, %zu)", stops[i], s->V);
            free(stops);
            rc = -1;
            goto fail;
        }
    /* every id the template uses must be one the model can read */
    chat_ids probe = {0};
    if (!(rc = chat_render_turn(tok, s->tmpl, "user", "", 0, &probe, err)))
        rc = chat_render_generation_prompt(tok, s->tmpl, opt->thinking, &probe, err);
    for (size_t i = 0; !rc && i < probe.n; i++)
        if ((size_t)probe.ids[i] >= s->V) {
            k3_refuse(err, "the %s chat template uses id %d, outside the model's vocabulary [0, %zu)",
                     chat_template_name(s->tmpl), probe.ids[i], s->V);
            rc = -1;
        }
    chat_ids_free(&probe);
    if (rc) {
        free(stops);
        goto fail;
    }
    /* the transcript never grows past the context: the plan's, else the engine's */
    rc = gen_seq_init(&s->g, &en->model->cfg, &opt->sampling, stops, n_stops,
                      opt->max_context ? opt->max_context : en->max_ctx, err);
    free(stops);
    if (rc) goto fail;
    s->g_ok = 1;
    s->g.st.max_pos = opt->max_context; /* the MLA cache never grows past the plan */
    if (opt->draft && (rc = gen_seq_speculate(&s->g, &en->model->cfg, opt->draft_max, opt->draft_per_position, err)))
        goto fail;
    if ((rc = queue_system(s, err))) goto fail;
    *out = s;
    return 0;
fail:
    chat_session_free(s);
    return rc;
}

int chat_session_reset(chat_session *s, k3_error *err) {
    gen_seq_reset(&s->g, &s->en->model->cfg);
    s->broken = 0;
    return queue_system(s, err);
}

const int32_t *chat_session_transcript(const chat_session *s, size_t *n, size_t *n_fed) {
    if (n) *n = s->g.n;
    if (n_fed) *n_fed = s->g.st.pos;
    return s->g.ids;
}

chat_template chat_session_template(const chat_session *s) { return s->tmpl; }

const int32_t *chat_session_stop_ids(const chat_session *s, size_t *n) {
    *n = s->g.n_stop_ids;
    return s->g.stop_ids;
}

/* gen_seq's on_token: a reply's text goes to the session's `out` as it is picked (stop ids are not
 * printed; utf8_stream_write_token: complete code points). */
static void stream_token(void *ctx, int32_t id, int stop) {
    chat_session *s = ctx;
    if (stop) return;
    s->n_gen++;
    if (s->out) utf8_stream_write_token(&s->us, s->tok, id, s->out);
}

int chat_session_turn(chat_session *s, const char *text, size_t len, FILE *out, chat_turn_stats *stats, k3_error *err) {
    chat_turn_stats ts = {0};
    ts.stop_id = -1;
    if (stats) *stats = ts;
    if (s->broken) {
        k3_fail(err, "the conversation state was lost by an earlier failure; /reset to start over");
        return -1;
    }
    size_t n0 = s->g.n;
    s->msg.n = 0;
    int rc = chat_render_turn(s->tok, s->tmpl, "user", text, len, &s->msg, err);
    if (!rc) rc = chat_render_generation_prompt(s->tok, s->tmpl, s->opt.thinking, &s->msg, err);
    if (rc) return rc;
    /* + 1: the id that closes a reply cut by the limit */
    if (s->opt.max_context && n0 + s->msg.n + s->opt.max_tokens + 1 > s->opt.max_context) {
        k3_refuse(err,
                 "context full: %zu positions used, this message needs %zu more plus up to %zu for the reply "
                 "(limit %zu); /reset to start over",
                 n0, s->msg.n, s->opt.max_tokens + 1, s->opt.max_context);
        return -1;
    }
    if (push_msg(s, err)) return -1;
    /* the adjustments count this reply's ids; the repetition penalty's prompt is the conversation */
    sampler_clear_counts(&s->g.smp);
    sampler_observe_prompt(&s->g.smp, s->g.ids, s->g.n);
    /* timing: prefill_s from the turn's first forward pass to the first pick, decode_s from there
     * to the last pick (the one that ended the turn) */
    double t0 = k3_now_s();
    if (snap_before_turn(s, err)) return -1;
    ts.n_fed = s->g.n - s->g.st.pos;
    utf8_stream_init(&s->us, 1);
    s->out = out;
    s->n_gen = 0;
    s->g.on_token = stream_token;
    s->g.on_token_ctx = s;
    for (int first = 1;; first = 0) {
        gen_event evs[64];
        int32_t prop[63];
        size_t k = 0, nev = 1, dmax = s->opt.draft_max < 63 ? s->opt.draft_max : 63;
        /* speculation after the first pick: proposals verified in one pass, picks as without */
        if ((!first && s->opt.draft && draft_propose(s->opt.draft, s->g.ids, s->g.n, s->n_gen, prop, dmax, &k, err)) ||
            (k ? gen_step_spec(s->en, &s->g, prop, k, s->opt.max_tokens - s->n_gen, evs, &nev, err)
               : gen_step(s->en, &s->g, s->opt.chunk, evs, err))) {
            s->g.on_token = NULL;
            s->broken = 1;
            return -1;
        }
        gen_event ev = evs[nev - 1]; /* a stop id or max_tokens can only end a block */
        if (first) { /* the first pick: the prefill is done */
            ts.prefill_s = k3_now_s() - t0;
            t0 = k3_now_s();
        }
        if (ev.stop) {
            ts.stop_id = ev.id;
            break;
        }
        if (s->n_gen == s->opt.max_tokens) {
            ts.hit_limit = 1;
            if (gen_seq_push(&s->g, &s->end_id, 1, err)) {
                s->g.on_token = NULL;
                s->broken = 1;
                return -1;
            }
            break;
        }
    }
    ts.decode_s = k3_now_s() - t0;
    s->g.on_token = NULL;
    if (out) utf8_stream_write_end(&s->us, out);
    ts.n_gen = s->n_gen;
    ts.context = s->g.n;
    if (s->opt.snaps) {
        k3_error kerr = {0};
        snap_insert(s->opt.snaps, s->g.ids, &s->g.st, &kerr); /* best effort */
    }
    if (stats) *stats = ts;
    return 0;
}

/* ---- the REPL ---- */

static void trim(const char *s, size_t len, size_t *b, size_t *e) {
    size_t i = 0, j = len;
    while (i < j && (s[i] == ' ' || s[i] == '\t')) i++;
    while (j > i && (s[j - 1] == ' ' || s[j - 1] == '\t')) j--;
    *b = i;
    *e = j;
}

static int is_cmd(const char *line, size_t b, size_t e, const char *cmd) {
    size_t n = strlen(cmd);
    return e - b == n && !memcmp(line + b, cmd, n);
}

static void print_stats(const chat_session *s, const chat_turn_stats *ts, size_t turn, FILE *log) {
    char why[96];
    if (ts->hit_limit) snprintf(why, sizeof why, "the %zu-token limit", s->opt.max_tokens);
    else {
        const char *b;
        size_t len;
        if (tokenizer_token_bytes(s->tok, ts->stop_id, &b, &len) == 0 && len < 64)
            snprintf(why, sizeof why, "%.*s (id %d)", (int)len, b, ts->stop_id);
        else snprintf(why, sizeof why, "stop id %d", ts->stop_id);
    }
    double pre = ts->prefill_s > 0 ? (double)ts->n_fed / ts->prefill_s : 0;
    /* reply rate: generated tokens / the time from the turn's first forward pass to its last pick
     * (the prefill included: what the user waits for per token) */
    double all = ts->prefill_s + ts->decode_s, rate = all > 0 ? (double)ts->n_gen / all : 0;
    fprintf(log,
            "k3: [turn %zu: fed %zu tokens in %.3f s (%.1f tok/s); replied %zu tokens in %.3f s from the first "
            "forward pass to the last pick (%.2f tok/s); ended by %s; context %zu]\n",
            turn, ts->n_fed, ts->prefill_s, pre, ts->n_gen, all, rate, why, ts->context);
    if (s->opt.draft) /* the conversation so far */
        fprintf(log, "k3: [speculation: %llu of %llu proposals accepted in %llu verification passes]\n",
                (unsigned long long)s->g.spec_accepted, (unsigned long long)s->g.spec_proposed,
                (unsigned long long)s->g.spec_passes);
    fflush(log);
}

int chat_repl(engine *en, const tokenizer *tok, const chat_options *opt, FILE *in, FILE *out, FILE *log) {
    k3_error err = {0};
    chat_session *s = NULL;
    int rc = chat_session_create(&s, en, tok, opt, &err);
    if (rc) {
        fprintf(log, "k3: %s\n", err.msg);
        return k3_exit_status(&err);
    }
    if (opt->load_state && (rc = chat_session_load(s, opt->load_state, &err))) {
        fprintf(log, "k3: refusing the state file: %s\n", err.msg);
        chat_session_free(s);
        return k3_exit_status(&err);
    }
    int interactive = isatty(fileno(in));
    char desc[256];
    sampler_describe(&opt->sampling, desc, sizeof desc);
    fprintf(log, "k3: chat (template %s%s, %s, at most %zu tokens per reply); /reset starts over, /exit ends\n",
            chat_template_name(s->tmpl),
            s->tmpl == CHAT_TEMPLATE_K3 ? (opt->thinking ? ", thinking" : ", no thinking") : "", desc,
            opt->max_tokens);
    fflush(log);
    char *line = NULL;
    size_t cap = 0, turn = 0;
    int status = 0;
    for (;;) {
        if (interactive) {
            fputs("> ", out);
            fflush(out);
        }
        ssize_t got = getline(&line, &cap, in);
        if (got < 0) {
            if (interactive) fputc('\n', out);
            break;
        }
        size_t len = (size_t)got;
        if (len && line[len - 1] == '\n') len--;
        if (len && line[len - 1] == '\r') len--;
        size_t b, e;
        trim(line, len, &b, &e);
        if (b == e) continue;
        if (is_cmd(line, b, e, "/exit") || is_cmd(line, b, e, "/quit")) break;
        if (is_cmd(line, b, e, "/help")) {
            fputs("one line = one message; /reset starts a fresh conversation, /save FILE and /load FILE keep "
                  "one, /exit (or EOF) ends\n",
                  out);
            fflush(out);
            continue;
        }
        if (e - b > 6 && (!memcmp(line + b, "/save ", 6) || !memcmp(line + b, "/load ", 6))) {
            int save = line[b + 1] == 's';
            size_t pb = b + 6;
            while (pb < e && (line[pb] == ' ' || line[pb] == '\t')) pb++;
            line[e] = 0;
            k3_error_clear(&err);
            rc = save ? chat_session_save(s, line + pb, &err) : chat_session_load(s, line + pb, &err);
            size_t nt, nf;
            chat_session_transcript(s, &nt, &nf);
            if (rc) fprintf(log, "k3: %s\n", err.msg);
            else fprintf(log, "k3: %s %s (%zu ids, %zu fed)\n", save ? "saved to" : "loaded", line + pb, nt, nf);
            fflush(log);
            continue;
        }
        if (is_cmd(line, b, e, "/reset")) {
            k3_error_clear(&err);
            if (chat_session_reset(s, &err)) {
                fprintf(log, "k3: %s\n", err.msg);
                status = 1;
                break;
            }
            turn = 0;
            fprintf(log, "k3: conversation reset\n");
            fflush(log);
            continue;
        }
        chat_turn_stats ts;
        k3_error_clear(&err);
        rc = chat_session_turn(s, line, len, out, &ts, &err);
        if (rc && err.kind == K3_EINPUT) { /* refused before anything was fed: the session is usable */
            fprintf(log, "k3: %s (message ignored)\n", err.msg);
            fflush(log);
            continue;
        }
        fputc('\n', out);
        fflush(out);
        if (rc) {
            fprintf(log, "k3: %s\n", err.msg);
            status = 1;
            break;
        }
        if (opt->stats) print_stats(s, &ts, ++turn, log);
    }
    free(line);
    chat_session_free(s);
    return status;
}

/* ---- state files ---- */

int chat_session_save(chat_session *s, const char *path, k3_error *err) {
    if (!s->opt.fp) {
        k3_refuse(err, "state files are not available here");
        return -1;
    }
    if (s->broken) {
        k3_refuse(err, "the conversation state was lost by an earlier failure: nothing to save");
        return -1;
    }
    if (sampler_adjusts(&s->g.smp.cfg)) {
        k3_refuse(err, "the penalties and logit biases are not kept in state files: nothing saved");
        return -1;
    }
    state_run run = {.kind = STATE_KIND_CHAT, .thinking = s->opt.thinking, .tmpl = (int)s->tmpl,
                     .gen_target = s->opt.max_tokens};
    k3_error kerr = {0};
    if (gen_seq_save(path, s->opt.fp, &s->en->model->cfg, &s->g, &run, &kerr)) {
        k3_fail_as(err, kerr.kind, "%s", kerr.msg);
        return -1;
    }
    return 0;
}

int chat_session_load(chat_session *s, const char *path, k3_error *err) {
    if (!s->opt.fp) {
        k3_refuse(err, "state files are not available here");
        return -1;
    }
    const k3_config *c = &s->en->model->cfg;
    k3_error kerr = {0};
    seq_state st;
    if (seq_state_init(&st, c, &kerr)) {
        k3_nomem(err, "%s", kerr.msg);
        return -1;
    }
    state_loaded ld;
    size_t maxp = s->opt.max_context ? s->opt.max_context : s->en->max_ctx;
    if (state_file_load(path, s->opt.fp, c, maxp, &st, &ld, &kerr)) {
        seq_state_free(&st);
        k3_refuse(err, "%s", kerr.msg); /* a refused state file: exit 2, the session unchanged */
        return -1;
    }
    int rc = 0;
    if (ld.run.kind == STATE_KIND_CHAT && ld.run.tmpl != (int)s->tmpl) {
        k3_refuse(err, "%s was saved with the %s chat template; this session uses %s (--template)", path,
                 chat_template_name((chat_template)ld.run.tmpl), chat_template_name(s->tmpl));
        rc = -1;
    } else if (gen_seq_adopt(&s->g, &st, ld.ids, ld.n_ids,
                             s->opt.sampling.seed == ld.run.sampling.seed ? &ld.run.rng : NULL, &kerr)) {
        k3_refuse(err, "%s", kerr.msg); /* maxp is the context: not reached */
        rc = -1;
    } else {
        s->g.st.max_pos = s->opt.max_context;
        sampler_config dflt;
        sampler_config_default(&dflt);
        if (!memcmp(&s->opt.sampling, &dflt, sizeof dflt)) s->g.smp.cfg = ld.run.sampling;
        s->broken = 0;
        s->sys_n = 0;
    }
    seq_state_free(&st);
    state_loaded_free(&ld);
    return rc;
}
