/* scheduler.c - slots, queue and batched steps of the server (contract: scheduler.h). */
#include "coordinator/scheduler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

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
    free(r->out);
    free(r->logprob);
    free(r->top_id);
    free(r->top_lp);
    free(r);
}

int sched_forward(engine *en, sched_seq *seqs, size_t n_seqs, k3_error *err) {
    return forward_batch(en, seqs, n_seqs, err);
}

typedef struct {
    seq_state st;
    sampler smp;
    int smp_ok;
    float *logits;        /* one row */
    int32_t *hist;        /* ids consumed by st (st.pos of them) */
    size_t hist_cap;
    gen_request *req;     /* NULL: free */
    size_t fed;           /* prompt ids consumed for req */
    int32_t last;         /* last generated id, fed at the next step */
    int want_logits;      /* this step produces the row that picks the next id */
} slot;

struct scheduler {
    engine *en;
    sched_config cfg;
    size_t V;
    slot *slots;
    sched_seq *seqs;
    size_t *seq_slot;
    gen_request **queue; /* ring */
    size_t q_head, q_len;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    int th_ok, stop;
    sched_stats stats;
    double *lp_scratch;
};

static void finish(gen_request *r, int why, const char *msg) {
    pthread_mutex_lock(&r->mu);
    if (!r->done) {
        r->done = 1;
        r->finish = why;
        r->t_done = now_s();
        if (msg) snprintf(r->error, sizeof r->error, "%s", msg);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* Appends one output id (and its logprobs) under the request's lock. */
static int push_token(scheduler *s, slot *sl, int32_t id) {
    gen_request *r = sl->req;
    size_t k = (size_t)r->top_logprobs;
    double lp = 0;
    int32_t tid[SCHED_MAX_TOP_LOGPROBS];
    double tlp[SCHED_MAX_TOP_LOGPROBS];
    if (r->want_logprobs) {
        const float *x = sl->logits;
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
    if (n == 0) r->t_first = now_s();
    r->n_out = n + 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static void slot_free_req(scheduler *s, slot *sl) {
    (void)s;
    gen_request_release(sl->req);
    sl->req = NULL;
}

/* The slot forgets what it held: state to zero (used after failures and for unrelated prompts). */
static void slot_reset(scheduler *s, slot *sl) {
    seq_state_reset(&sl->st, &s->en->model->cfg);
}

/* hist[at .. at+n) = ids */
static int hist_put(slot *sl, size_t at, const int32_t *ids, size_t n) {
    if (at + n > sl->hist_cap) {
        size_t nc = sl->hist_cap ? sl->hist_cap : 256;
        while (nc < at + n) nc *= 2;
        int32_t *h = realloc(sl->hist, nc * sizeof *h);
        if (!h) return -1;
        sl->hist = h;
        sl->hist_cap = nc;
    }
    memcpy(sl->hist + at, ids, n * sizeof *ids);
    return 0;
}
static int hist_push(slot *sl, const int32_t *ids, size_t n) { return hist_put(sl, sl->st.pos, ids, n); }

/* The slot's state (st.pos ids of hist) into the snapshot store; a failure only costs reuse. */
static void snap_keep(scheduler *s, slot *sl) {
    if (!s->cfg.snaps || sl->st.pos == 0) return;
    k3_error e = {0};
    snap_insert(s->cfg.snaps, sl->hist, &sl->st, &e);
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
            size_t h = sl->st.pos;
            if (h > 0 && h < r->n_prompt && !memcmp(sl->hist, r->prompt, h * sizeof *sl->hist) && h > best_len) {
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
        if (best < 0) {
            slot_reset(s, sl);
            if (s->cfg.snaps && r->n_prompt > 1 && hist_put(sl, 0, r->prompt, r->n_prompt - 1) == 0) {
                k3_error e = {0};
                long L = snap_lookup(s->cfg.snaps, r->prompt, r->n_prompt, r->n_prompt - 1, &sl->st, &e);
                if (L > 0 && (size_t)L == sl->st.pos) {
                    have = (size_t)L;
                    s->stats.snapshot_tokens_restored += have;
                } else if (L != 0) slot_reset(s, sl); /* a failed restore leaves nothing usable */
            }
        }
        sl->req = r;
        sl->fed = have;
        r->n_cached = sl->fed;
        s->stats.prefix_tokens_reused += sl->fed;
        k3_error e = {0};
        if (sl->smp_ok) sampler_free(&sl->smp);
        sl->smp_ok = sampler_init(&sl->smp, &r->sampling, &e) == 0;
        r->t_start = now_s();
        if (!sl->smp_ok) {
            finish(r, FINISH_ERROR, e.msg);
            slot_free_req(s, sl);
        }
    }
}

static int is_stop(const gen_request *r, int32_t id) {
    for (size_t i = 0; i < r->n_stops; i++)
        if (r->stops[i] == id) return 1;
    return 0;
}

static void *loop(void *arg) {
    scheduler *s = arg;
    size_t P = s->cfg.parallel;
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
        size_t decoding = 0;
        for (size_t i = 0; i < P; i++)
            if (s->slots[i].req && s->slots[i].fed == s->slots[i].req->n_prompt) decoding++;
        pthread_mutex_unlock(&s->mu);

        /* the step: one token per decoding slot, prompt chunks from what is left of the budget */
        size_t budget = s->cfg.chunk > decoding ? s->cfg.chunk - decoding : 0, n_seqs = 0; /* rows <= chunk = the engine's max_rows */
        for (size_t i = 0; i < P; i++) {
            slot *sl = &s->slots[i];
            gen_request *r = sl->req;
            if (!r) continue;
            sched_seq *q = &s->seqs[n_seqs];
            sl->want_logits = 0;
            if (sl->fed < r->n_prompt) {
                if (budget == 0) continue;
                size_t left = r->n_prompt - sl->fed, n = left < budget ? left : budget;
                budget -= n;
                q->tokens = r->prompt + sl->fed;
                q->n = n;
                sl->want_logits = n == left;
                q->logits_from = sl->want_logits ? n - 1 : n;
            } else {
                q->tokens = &sl->last;
                q->n = 1;
                q->logits_from = 0;
                sl->want_logits = 1;
            }
            if (hist_push(sl, q->tokens, q->n)) {
                finish(r, FINISH_ERROR, "out of memory for a slot's history");
                slot_reset(s, sl);
                pthread_mutex_lock(&s->mu);
                slot_free_req(s, sl);
                pthread_mutex_unlock(&s->mu);
                continue;
            }
            q->st = &sl->st;
            q->logits = sl->want_logits ? sl->logits : NULL;
            s->seq_slot[n_seqs++] = i;
        }
        if (n_seqs == 0) continue;
        k3_error err = {0};
        double t0 = now_s();
        int bad = sched_forward(s->en, s->seqs, n_seqs, &err);
        double dt = now_s() - t0;
        pthread_mutex_lock(&s->mu);
        s->stats.steps++;
        s->stats.forward_s += dt;
        s->stats.batch_rows += n_seqs;
        for (size_t j = 0; j < n_seqs; j++) {
            slot *sl = &s->slots[s->seq_slot[j]];
            gen_request *r = sl->req;
            if (bad) {
                finish(r, FINISH_ERROR, err.msg);
                slot_reset(s, sl);
                slot_free_req(s, sl);
                continue;
            }
            if (sl->fed < r->n_prompt) {
                sl->fed += s->seqs[j].n;
                s->stats.tokens_prefilled += s->seqs[j].n;
                if (sl->fed == r->n_prompt) snap_keep(s, sl);
            }
            if (!sl->want_logits) continue;
            k3_error pe = {0};
            int32_t id = sampler_pick(&sl->smp, sl->logits, s->V, &pe);
            if (id < 0) {
                char m[sizeof pe.msg + 40];
                snprintf(m, sizeof m, "%s: refusing to emit a token", pe.msg);
                finish(r, FINISH_ERROR, m);
                slot_reset(s, sl);
                slot_free_req(s, sl);
                continue;
            }
            if (is_stop(r, id)) {
                pthread_mutex_lock(&r->mu);
                r->stop_id = id;
                pthread_mutex_unlock(&r->mu);
                finish(r, FINISH_STOP, NULL);
                slot_free_req(s, sl);
                snap_keep(s, sl);
                continue;
            }
            if (push_token(s, sl, id)) {
                finish(r, FINISH_ERROR, "out of memory for the output");
                slot_free_req(s, sl);
                continue;
            }
            s->stats.tokens_generated++;
            sl->last = id;
            if (r->n_out >= r->max_tokens) { /* n_out only grows here, on this thread */
                finish(r, FINISH_LENGTH, NULL);
                slot_free_req(s, sl);
                snap_keep(s, sl);
            }
        }
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

scheduler *sched_create(engine *en, const sched_config *cfg, k3_error *err) {
    if (cfg->parallel < 1 || cfg->max_queue < 1 || cfg->chunk < 1) {
        k3_fail(err, "scheduler: parallel, max_queue and chunk must be at least 1");
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
    s->seqs = calloc(cfg->parallel, sizeof *s->seqs);
    s->seq_slot = calloc(cfg->parallel, sizeof *s->seq_slot);
    s->queue = calloc(cfg->max_queue, sizeof *s->queue);
    if (!s->slots || !s->seqs || !s->seq_slot || !s->queue) {
        k3_fail(err, "out of memory for %zu slots", cfg->parallel);
        sched_destroy(s);
        return NULL;
    }
    for (size_t i = 0; i < cfg->parallel; i++) {
        slot *sl = &s->slots[i];
        sl->st.kda = NULL;
        if (seq_state_init(&sl->st, &en->model->cfg, err)) {
            sl->st.n_layers = -1;
            sched_destroy(s);
            return NULL;
        }
        if (!(sl->logits = malloc(s->V * sizeof *sl->logits))) {
            k3_fail(err, "out of memory for a row of %zu logits", s->V);
            sched_destroy(s);
            return NULL;
        }
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
        r->t_submit = now_s();
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
    for (size_t i = 0; s->slots && i < s->cfg.parallel; i++) {
        slot *sl = &s->slots[i];
        if (sl->st.n_layers > 0) seq_state_free(&sl->st);
        if (sl->smp_ok) sampler_free(&sl->smp);
        free(sl->logits);
        free(sl->hist);
    }
    free(s->slots);
    free(s->seqs);
    free(s->seq_slot);
    free(s->queue);
    free(s->lp_scratch);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
