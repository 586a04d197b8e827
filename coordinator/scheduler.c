/* scheduler.c - slots, queue and batched steps of the server (contract: scheduler.h). */
#include "coordinator/scheduler.h"
#include "common/mono_clock.h"
#include "coordinator/draft.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


gen_request *gen_request_new(void) {
    gen_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->stop_id = -1;
    return r;
}

void gen_request_release(gen_request *r) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    int left = --r->refs;
    pthread_mutex_unlock(&r->mu);
    if (left > 0) return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r->prompt);
    free(r->stops);
    free(r->force);
    free(r->force_after);
    free(r->out);
    free(r->logprob);
    free(r->top_id);
    free(r->top_lp);
    free(r);
}

/* A slot: one gen_seq (state, sampler, stop ids, id history, logits row) and the request it
 * serves. The step (generate.h) feeds, picks and streams; the scheduler only chooses who is in
 * the step and acts on the events. */
#define SCHED_EVENTS 64 /* picks one step may make for one slot (1 + draft length with speculation) */
typedef struct {
    scheduler *s;
    gen_seq g;
    int g_ok;
    gen_request *req;     /* NULL: free */
    size_t prompt_end;    /* g.n once the prompt is pushed: the prompt is fed when g.st.pos reaches it */
    int prompt_kept;      /* the state at the end of the prompt went to the snapshot store */
    int push_failed;      /* on_token could not store a token (out of memory) */
    int forced;           /* the request's forced ids are in */
    uint64_t admitted;    /* admission number of its request (prompts are fed oldest first) */
    gen_event ev[SCHED_EVENTS];
    size_t n_ev;
} slot;

struct scheduler {
    engine *en;
    sched_config cfg;
    size_t V;
    slot *slots;
    gen_seq **batch;     /* the step's sequences, decoding slots first */
    size_t *batch_slot;
    gen_event *batch_ev;
    gen_request **queue; /* ring */
    size_t q_head, q_len;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    int th_ok, stop;
    sched_stats stats;
    uint64_t n_admitted;
    uint64_t step_spec[3]; /* the last step's verification passes, proposals, acceptances */
};

static void finish(gen_request *r, int why, const char *msg) {
    pthread_mutex_lock(&r->mu);
    if (!r->done) {
        r->done = 1;
        r->finish = why;
        r->t_done = k3_now_s();
        if (msg) snprintf(r->error, sizeof r->error, "%.*s", (int)(sizeof r->error - 1), msg); /* cut to fit */
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Appends one output id (and its logprobs from row, the logits that picked it) under the
 * request's lock. */
static int push_token(scheduler *s, gen_request *r, const float *row, int32_t id) {
    size_t k = (size_t)r->top_logprobs;
    double lp = 0;
    int32_t tid[SCHED_MAX_TOP_LOGPROBS];
    double tlp[SCHED_MAX_TOP_LOGPROBS];
    if (r->want_logprobs && !row) { /* a forced id: probability 1 */
        for (size_t j = 0; j < k; j++) {
            tid[j] = j ? -1 : id;
            tlp[j] = 0;
        }
    } else if (r->want_logprobs) {
        const float *x = row;
        double mx = -INFINITY, z = 0;
        for (size_t i = 0; i < s->V; i++)
            if (x[i] > mx) mx = x[i];
        for (size_t i = 0; i < s->V; i++) z += exp((double)x[i] - mx);
        double lz = mx + log(z);
        lp = (double)x[id] - lz;
        /* top k by a partial selection: k <= 20 passes */
        for (size_t j = 0; j < k && j < s->V; j++) {
            int32_t best = -1;
            for (size_t i = 0; i < s->V; i++) {
                int taken = 0;
                for (size_t q = 0; q < j; q++) taken |= tid[q] == (int32_t)i;
                if (taken) continue;
                if (best < 0 || x[i] > x[best]) best = (int32_t)i;
            }
            tid[j] = best;
            tlp[j] = (double)x[best] - lz;
        }
    }
    pthread_mutex_lock(&r->mu);
    if (r->n_out == r->cap) {
        size_t nc = r->cap ? 2 * r->cap : 64;
        int32_t *o = realloc(r->out, nc * sizeof *o);
        if (o) r->out = o;
        float *l = NULL, *tl = NULL;
        int32_t *ti = NULL;
        int bad = !o;
        if (!bad && r->want_logprobs) {
            if ((l = realloc(r->logprob, nc * sizeof *l))) r->logprob = l;
            if (k && (ti = realloc(r->top_id, nc * k * sizeof *ti))) r->top_id = ti;
            if (k && (tl = realloc(r->top_lp, nc * k * sizeof *tl))) r->top_lp = tl;
            bad = !l || (k && (!ti || !tl));
        }
        if (bad) {
            pthread_mutex_unlock(&r->mu);
            return -1;
        }
        r->cap = nc;
    }
    size_t n = r->n_out;
    r->out[n] = id;
    if (r->want_logprobs) {
        r->logprob[n] = (float)lp;
        for (size_t j = 0; j < k; j++) {
            r->top_id[n * k + j] = tid[j];
            r->top_lp[n * k + j] = (float)tlp[j];
        }
    }
    if (n == 0) r->t_first = k3_now_s();
    r->n_out = n + 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* The step's streaming hook (gen_seq.on_token): every pick but a stop id goes to the request
 * as it is made; g.row holds the logits that picked it (also for each pick of a speculative
 * step). */
static void on_token(void *ctx, int32_t id, int stop) {
    slot *sl = ctx;
    if (stop || !sl->req || sl->push_failed) return;
    if (push_token(sl->s, sl->req, sl->g.row, id)) sl->push_failed = 1;
}

static void slot_free_req(scheduler *s, slot *sl) {
    (void)s;
    gen_request_release(sl->req);
    sl->req = NULL;
}

/* The slot forgets what it held: empty history, state to zero (after failures and for unrelated
 * prompts). */
static void slot_reset(scheduler *s, slot *sl) { gen_seq_reset(&sl->g, &s->en->model->cfg); }

/* The slot's state (its g.st.pos fed ids) into the snapshot store; a failure only costs reuse. */
static void snap_keep(scheduler *s, slot *sl) {
    if (!s->cfg.snaps || sl->g.st.pos == 0) return;
    k3_error e = {0};
    snap_insert(s->cfg.snaps, sl->g.ids, &sl->g.st, &e);
    s->stats.snap = snap_get_stats(s->cfg.snaps);
}

/* The request's sampler and stop ids into the slot's gen_seq. */
static int slot_configure(slot *sl, const gen_request *r, k3_error *e) {
    sampler_free(&sl->g.smp);
    if (sampler_init(&sl->g.smp, &r->sampling, e) || sampler_reserve(&sl->g.smp, sl->g.vocab, e)) return -1;
    if (r->n_stops > sl->g.n_stop_ids) {
        int32_t *st = realloc(sl->g.stop_ids, r->n_stops * sizeof *st);
        if (!st) return k3_fail(e, "out of memory for %zu stop ids", r->n_stops);
        sl->g.stop_ids = st;
    }
    if (r->n_stops) memcpy(sl->g.stop_ids, r->stops, r->n_stops * sizeof *r->stops);
    sl->g.n_stop_ids = r->n_stops;
    return 0;
}

/* The request's forced ids (as many as max_tokens leaves room for) into the sequence (pending) and
 * the output. -1 with e filled when the context cannot hold them or the output cannot grow. */
static int force_ids(scheduler *s, slot *sl, k3_error *e) {
    gen_request *r = sl->req;
    size_t n = r->max_tokens - r->n_out < r->n_force ? r->max_tokens - r->n_out : r->n_force;
    sl->forced = 1;
    if (gen_seq_push(&sl->g, r->force, n, e)) return -1;
    for (size_t i = 0; i < n; i++) {
        if (push_token(s, r, NULL, r->force[i])) return k3_fail(e, "out of memory for the output");
        sampler_observe(&sl->g.smp, r->force[i]); /* in the reply: the penalties count it */
    }
    return 0;
}

/* The output ends with the request's force_after ids (the scheduler thread is its only writer). */
static int force_due(const slot *sl) {
    const gen_request *r = sl->req;
    if (sl->forced || r->n_force == 0 || r->n_out < r->n_force_after) return 0;
    if (r->n_force_after == 0) return 1; /* forced at once (memcmp of 0 bytes may still not get NULL) */
    return !memcmp(r->out + r->n_out - r->n_force_after, r->force_after, r->n_force_after * sizeof *r->out);
}

/* Moves queued requests into free slots; under s->mu. */
static void admit(scheduler *s) {
    while (s->q_len > 0) {
        gen_request *r = s->queue[s->q_head];
        /* best free slot: the longest kept history that r's prompt strictly extends; else the
         * free slot with the shortest history */
        long best = -1, fresh = -1;
        size_t best_len = 0, fresh_len = (size_t)-1;
        for (size_t i = 0; i < s->cfg.parallel; i++) {
            slot *sl = &s->slots[i];
            if (sl->req) continue;
            size_t h = sl->g.st.pos;
            if (h > 0 && h < r->n_prompt && !memcmp(sl->g.ids, r->prompt, h * sizeof *sl->g.ids) && h > best_len) {
                best = (long)i;
                best_len = h;
            }
            if (h < fresh_len) {
                fresh = (long)i;
                fresh_len = h;
            }
        }
        if (fresh < 0) return; /* no free slot */
        s->q_head = (s->q_head + 1) % s->cfg.max_queue;
        s->q_len--;
        slot *sl = &s->slots[best >= 0 ? best : fresh];
        size_t have = best >= 0 ? best_len : 0;
        k3_error e = {0};
        sl->req = r;
        r->t_start = k3_now_s();
        if (slot_configure(sl, r, &e)) {
            finish(r, FINISH_ERROR, e.msg);
            slot_free_req(s, sl);
            continue;
        }
        if (best >= 0) {
            gen_seq_truncate(&sl->g, have); /* drops the last pick of the previous request (pending) */
        } else {
            slot_reset(s, sl);
        }
        if (gen_seq_push(&sl->g, r->prompt + have, r->n_prompt - have, &e)) {
            finish(r, FINISH_ERROR, e.msg);
            slot_reset(s, sl);
            slot_free_req(s, sl);
            continue;
        }
        if (best < 0 && s->cfg.snaps && r->n_prompt > 1) {
            long L = snap_lookup(s->cfg.snaps, r->prompt, r->n_prompt, r->n_prompt - 1, &sl->g.st, &e);
            s->stats.snap = snap_get_stats(s->cfg.snaps);
            if (L > 0 && (size_t)L == sl->g.st.pos) {
                have = (size_t)L;
                s->stats.snapshot_tokens_restored += have;
            } else if (L != 0) { /* a failed restore leaves nothing usable */
                slot_reset(s, sl);
                if (gen_seq_push(&sl->g, r->prompt, r->n_prompt, &e)) {
                    finish(r, FINISH_ERROR, e.msg);
                    slot_free_req(s, sl);
                    continue;
                }
            }
        }
        sampler_observe_prompt(&sl->g.smp, r->prompt, r->n_prompt); /* repetition_penalty's ids (after any reset) */
        sl->admitted = ++s->n_admitted;
        sl->prompt_end = sl->g.n;
        sl->prompt_kept = 0;
        sl->push_failed = 0;
        sl->forced = 0;
        if (force_due(sl) && force_ids(s, sl, &e)) {
            finish(r, FINISH_ERROR, e.msg);
            slot_reset(s, sl);
            slot_free_req(s, sl);
            continue;
        }
        r->n_cached = have;
        s->stats.prefix_tokens_reused += have;
        if (r->n_out >= r->max_tokens) { /* the forced ids took every token allowed */
            finish(r, FINISH_LENGTH, NULL);
            slot_free_req(s, sl); /* r may be gone now */
        }
    }
}

/* One step over the active slots (the batch is built by the caller): ONE gen_step_batch, so the
 * trunk and each routed expert are read once for every sequence in it. Fills each slot's events
 * (ev[0..n_ev)); -1 when the forward itself failed. A per-slot draft (speculation) plugs in
 * here: a slot with proposals gets its picks from a verification pass, one event per pick
 * (SCHED_EVENTS bounds them; give it max_emit = req->max_tokens - req->n_out so that no pick
 * past max_tokens streams through on_token; a slot whose request ended on an event ignores the
 * events after it). */
static int step(scheduler *s, size_t n, k3_error *err) {
    draft_source ngram = {.kind = DRAFT_NGRAM};
    int32_t prop[GEN_MAX_BATCH][SCHED_EVENTS - 1];
    const int32_t *d[GEN_MAX_BATCH] = {0};
    size_t k[GEN_MAX_BATCH] = {0}, max_emit[GEN_MAX_BATCH] = {0}, n_ev[GEN_MAX_BATCH];
    gen_event *ev[GEN_MAX_BATCH] = {0};
    uint64_t p0 = 0, q0 = 0, a0 = 0;
    for (size_t j = 0; j < n; j++) {
        slot *sl = &s->slots[s->batch_slot[j]];
        gen_request *r = sl->req;
        k[j] = 0;
        d[j] = prop[j];
        ev[j] = sl->ev;
        max_emit[j] = r && r->max_tokens > r->n_out ? r->max_tokens - r->n_out : 1; /* n_out grows on this thread only */
        if (s->cfg.draft_max && r && r->n_force == 0 && sl->g.st.pos >= sl->prompt_end && gen_seq_pending(&sl->g) == 1) {
            k3_error de = {0};
            draft_propose(&ngram, sl->g.ids, sl->g.n, 0, prop[j], s->cfg.draft_max, &k[j], &de);
        }
        p0 += sl->g.spec_passes;
        q0 += sl->g.spec_proposed;
        a0 += sl->g.spec_accepted;
    }
    int rc = gen_step_spec_batch(s->en, s->batch, n, s->cfg.chunk, d, k, max_emit, ev, n_ev, err);
    for (size_t j = 0; j < n; j++) { /* the step's counters; into stats under s->mu by the loop */
        slot *sl = &s->slots[s->batch_slot[j]];
        sl->n_ev = rc ? 0 : n_ev[j];
        p0 -= sl->g.spec_passes;
        q0 -= sl->g.spec_proposed;
        a0 -= sl->g.spec_accepted;
    }
    s->step_spec[0] = -p0;
    s->step_spec[1] = -q0;
    s->step_spec[2] = -a0;
    return rc;
}

/* Acts on one event of a slot; under s->mu. 1 when the slot's request ended. */
static int on_event(scheduler *s, slot *sl, const gen_event *ev) {
    gen_request *r = sl->req;
    if (ev->status == GEN_CONTEXT_FULL) { /* openai_api keeps prompt + max_tokens within the context */
        finish(r, FINISH_LENGTH, NULL);
        slot_free_req(s, sl);
        snap_keep(s, sl);
        return 1;
    }
    if (ev->status) {
        finish(r, FINISH_ERROR, ev->why);
        slot_reset(s, sl);
        slot_free_req(s, sl);
        return 1;
    }
    if (!ev->picked) return 0;
    if (ev->stop) {
        pthread_mutex_lock(&r->mu);
        r->stop_id = ev->id;
        pthread_mutex_unlock(&r->mu);
        finish(r, FINISH_STOP, NULL);
        slot_free_req(s, sl);
        snap_keep(s, sl);
        return 1;
    }
    if (sl->push_failed) {
        finish(r, FINISH_ERROR, "out of memory for the output");
        slot_free_req(s, sl);
        return 1;
    }
    s->stats.tokens_generated++;
    if (r->n_out < r->max_tokens && force_due(sl)) {
        k3_error e = {0};
        if (force_ids(s, sl, &e)) {
            finish(r, FINISH_ERROR, e.msg);
            slot_reset(s, sl);
            slot_free_req(s, sl);
            return 1;
        }
    }
    if (r->n_out >= r->max_tokens) { /* n_out only grows on this thread */
        finish(r, FINISH_LENGTH, NULL);
        slot_free_req(s, sl);
        snap_keep(s, sl);
        return 1;
    }
    return 0;
}

static void *loop(void *arg) {
    scheduler *s = arg;
    size_t P = s->cfg.parallel;
    { /* this thread runs every forward: its kernels' buffers now, not in the first request */
        k3_error e = {0};
        if (engine_reserve_thread(s->en, &e)) fprintf(stderr, "k3: server: %s (the kernels run without it: the same bits)\n", e.msg);
    }
    for (;;) {
        pthread_mutex_lock(&s->mu);
        for (;;) {
            size_t active = 0;
            for (size_t i = 0; i < P; i++) active += s->slots[i].req != NULL;
            if (s->stop || active || s->q_len) break;
            pthread_cond_wait(&s->cv, &s->mu);
        }
        if (s->stop) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        /* cancellations first: their slots take newcomers in this very step */
        for (size_t i = 0; i < P; i++) {
            slot *sl = &s->slots[i];
            if (!sl->req) continue;
            pthread_mutex_lock(&sl->req->mu);
            int c = sl->req->cancelled;
            pthread_mutex_unlock(&sl->req->mu);
            if (c) {
                finish(sl->req, FINISH_CANCEL, NULL);
                slot_free_req(s, sl);
            }
        }
        admit(s);
        /* the batch: decoding slots first (one id each), then the prompts, which share what is
         * left of the step's rows (the engine's max_rows) in chunks of at most cfg.chunk, oldest
         * request first, so a long prompt never stalls the others for more than one chunk */
        size_t n = 0, n_dec;
        size_t pos0[GEN_MAX_BATCH];
        for (int pass = 0; pass < 2; pass++) {
            n_dec = n;
            for (size_t i = 0; i < P; i++) {
                slot *sl = &s->slots[i];
                if (!sl->req || (sl->g.st.pos >= sl->prompt_end) != (pass == 0)) continue;
                s->batch_slot[n++] = i;
            }
        }
        /* prompts in the order their requests were admitted: the oldest gets its rows first */
        for (size_t a = n_dec + 1; a < n; a++)
            for (size_t b = a; b > n_dec && s->slots[s->batch_slot[b - 1]].admitted > s->slots[s->batch_slot[b]].admitted; b--) {
                size_t t = s->batch_slot[b];
                s->batch_slot[b] = s->batch_slot[b - 1];
                s->batch_slot[b - 1] = t;
            }
        for (size_t j = 0; j < n; j++) {
            slot *sl = &s->slots[s->batch_slot[j]];
            pos0[j] = sl->g.st.pos;
            s->batch[j] = &sl->g;
        }
        pthread_mutex_unlock(&s->mu);
        if (n == 0) continue;
        k3_error err = {0};
        double t0 = k3_now_s();
        int bad = step(s, n, &err);
        double dt = k3_now_s() - t0;
        pthread_mutex_lock(&s->mu);
        s->stats.steps++;
        s->stats.spec_passes += s->step_spec[0];
        s->stats.spec_proposed += s->step_spec[1];
        s->stats.spec_accepted += s->step_spec[2];
        s->stats.forward_s += dt;
        for (size_t j = 0; j < n; j++) {
            slot *sl = &s->slots[s->batch_slot[j]];
            if (bad) {
                finish(sl->req, FINISH_ERROR, err.msg);
                slot_reset(s, sl);
                slot_free_req(s, sl);
                continue;
            }
            size_t fed_to = sl->g.st.pos;
            if (fed_to > pos0[j]) {
                gen_request *r = sl->req;
                s->stats.batch_rows++;
                if (r->n_steps++ == 0) r->step_first = s->stats.steps;
                r->step_last = s->stats.steps;
                if (pos0[j] < sl->prompt_end && fed_to - pos0[j] > r->max_rows_step) r->max_rows_step = fed_to - pos0[j];
            }
            if (pos0[j] < sl->prompt_end) {
                s->stats.tokens_prefilled += (fed_to < sl->prompt_end ? fed_to : sl->prompt_end) - pos0[j];
                if (fed_to >= sl->prompt_end && !sl->prompt_kept) {
                    /* the state at the end of the prompt (fed_to == prompt_end without speculation) */
                    if (fed_to == sl->prompt_end) snap_keep(s, sl);
                    sl->prompt_kept = 1;
                }
            }
            for (size_t e = 0; e < sl->n_ev; e++)
                if (on_event(s, sl, &sl->ev[e])) break;
        }
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

scheduler *sched_create(engine *en, const sched_config *cfg, k3_error *err) {
    if (cfg->draft_max > SCHED_EVENTS - 1) {
        k3_fail(err, "scheduler: at most %d proposals per step (--draft-max %zu)", SCHED_EVENTS - 1, cfg->draft_max);
        return NULL;
    }
    if (cfg->parallel < 1 || cfg->max_queue < 1 || cfg->chunk < 1 || cfg->max_context < 2) {
        k3_fail(err, "scheduler: parallel, max_queue and chunk must be at least 1, max_context at least 2");
        return NULL;
    }
    if (cfg->parallel > GEN_MAX_BATCH || cfg->parallel > en->max_rows) {
        k3_fail(err, "scheduler: at most %d slots and at most the engine's rows per step (--parallel %zu, --chunk %zu)",
                GEN_MAX_BATCH, cfg->parallel, en->max_rows);
        return NULL;
    }
    scheduler *s = calloc(1, sizeof *s);
    if (!s) {
        k3_fail(err, "out of memory for the scheduler");
        return NULL;
    }
    s->en = en;
    s->cfg = *cfg;
    s->V = (size_t)en->model->cfg.vocab_size;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->slots = calloc(cfg->parallel, sizeof *s->slots);
    s->batch = calloc(cfg->parallel, sizeof *s->batch);
    s->batch_slot = calloc(cfg->parallel, sizeof *s->batch_slot);
    s->batch_ev = calloc(cfg->parallel, sizeof *s->batch_ev);
    s->queue = calloc(cfg->max_queue, sizeof *s->queue);
    if (!s->slots || !s->batch || !s->batch_slot || !s->batch_ev || !s->queue) {
        k3_fail(err, "out of memory for %zu slots", cfg->parallel);
        sched_destroy(s);
        return NULL;
    }
    sampler_config greedy;
    sampler_config_default(&greedy);
    for (size_t i = 0; i < cfg->parallel; i++) {
        slot *sl = &s->slots[i];
        sl->s = s;
        if (gen_seq_init(&sl->g, &en->model->cfg, &greedy, NULL, 0, cfg->max_context, err)) {
            sched_destroy(s);
            return NULL;
        }
        sl->g_ok = 1;
        if (cfg->draft_max && gen_seq_speculate(&sl->g, &en->model->cfg, cfg->draft_max, cfg->draft_per_position, err)) {
            sched_destroy(s);
            return NULL;
        }
        sl->g.on_token = on_token;
        sl->g.on_token_ctx = sl;
    }
    if (pthread_create(&s->th, NULL, loop, s)) {
        k3_fail(err, "cannot start the scheduler thread");
        sched_destroy(s);
        return NULL;
    }
    s->th_ok = 1;
    s->stats.parallel = cfg->parallel;
    return s;
}

int sched_submit(scheduler *s, gen_request *r) {
    pthread_mutex_lock(&s->mu);
    int rc = SCHED_OK;
    if (s->stop) rc = SCHED_ESHUTDOWN;
    else if (s->q_len == s->cfg.max_queue) rc = SCHED_EFULL;
    else {
        pthread_mutex_lock(&r->mu);
        r->refs++;
        r->t_submit = k3_now_s();
        pthread_mutex_unlock(&r->mu);
        s->queue[(s->q_head + s->q_len) % s->cfg.max_queue] = r;
        s->q_len++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void sched_cancel(scheduler *s, gen_request *r) {
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&r->mu);
    r->cancelled = 1;
    pthread_mutex_unlock(&r->mu);
    /* still queued: drop it now */
    for (size_t i = 0; i < s->q_len; i++) {
        size_t k = (s->q_head + i) % s->cfg.max_queue;
        if (s->queue[k] != r) continue;
        for (size_t j = i; j + 1 < s->q_len; j++)
            s->queue[(s->q_head + j) % s->cfg.max_queue] = s->queue[(s->q_head + j + 1) % s->cfg.max_queue];
        s->q_len--;
        finish(r, FINISH_CANCEL, NULL);
        gen_request_release(r);
        break;
    }
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void sched_get_stats(scheduler *s, sched_stats *st) {
    pthread_mutex_lock(&s->mu);
    *st = s->stats;
    st->queued = s->q_len;
    st->active = 0;
    for (size_t i = 0; i < s->cfg.parallel; i++) st->active += s->slots[i].req != NULL;
    pthread_mutex_unlock(&s->mu);
}

void sched_stop(scheduler *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->th_ok) pthread_join(s->th, NULL);
    s->th_ok = 0;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; s->queue && i < s->q_len; i++) {
        gen_request *r = s->queue[(s->q_head + i) % s->cfg.max_queue];
        finish(r, FINISH_CANCEL, "the server is shutting down");
        gen_request_release(r);
    }
    s->q_len = 0;
    for (size_t i = 0; s->slots && i < s->cfg.parallel; i++) {
        slot *sl = &s->slots[i];
        if (sl->req) {
            finish(sl->req, FINISH_CANCEL, "the server is shutting down");
            slot_free_req(s, sl);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

void sched_destroy(scheduler *s) {
    if (!s) return;
    sched_stop(s);
    for (size_t i = 0; s->slots && i < s->cfg.parallel; i++)
        if (s->slots[i].g_ok) gen_seq_free(&s->slots[i].g);
    free(s->slots);
    free(s->batch);
    free(s->batch_slot);
    free(s->batch_ev);
    free(s->queue);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
