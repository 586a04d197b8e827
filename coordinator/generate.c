/* generate.c - the one generation step (see generate.h). */
#include "coordinator/generate.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int32_t argmax_logits(const float *logits, size_t n) {
    int32_t best = -1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(logits[i])) return -1;
        if (best < 0 || logits[i] > logits[best]) best = (int32_t)i;
    }
    return best;
}

int gen_seq_init(gen_seq *g, const k3_config *c, const sampler_config *sc, const int32_t *stop_ids, size_t n_stop_ids,
                 size_t cap_ids, k3_error *err) {
    memset(g, 0, sizeof *g);
    g->vocab = (size_t)c->vocab_size;
    g->cap = cap_ids;
    if (sampler_init(&g->smp, sc, err)) return -1;
    if (sampler_reserve(&g->smp, g->vocab, err) || seq_state_init(&g->st, c, err)) {
        sampler_free(&g->smp);
        return -1;
    }
    g->ids = malloc((cap_ids ? cap_ids : 1) * sizeof *g->ids);
    g->row = malloc(g->vocab * sizeof *g->row);
    g->stop_ids = malloc((n_stop_ids ? n_stop_ids : 1) * sizeof *g->stop_ids);
    if (!g->ids || !g->row || !g->stop_ids) {
        gen_seq_free(g);
        return k3_fail(err, "out of memory for a sequence of %zu ids", cap_ids);
    }
    for (size_t i = 0; i < n_stop_ids; i++) {
        if (stop_ids[i] < 0 || (size_t)stop_ids[i] >= g->vocab) {
            gen_seq_free(g);
            return k3_fail(err, "stop id %d is outside the vocabulary [0, %d)", stop_ids[i], c->vocab_size);
        }
        g->stop_ids[i] = stop_ids[i];
    }
    g->n_stop_ids = n_stop_ids;
    return 0;
}

void gen_seq_free(gen_seq *g) {
    seq_state_free(&g->st);
    sampler_free(&g->smp);
    free(g->ids);
    free(g->row);
    free(g->stop_ids);
    free(g->rows);
    free(g->spec_rows);
    free(g->spec_snap);
    memset(g, 0, sizeof *g);
}

void gen_seq_reset(gen_seq *g, const k3_config *c) {
    seq_state_reset(&g->st, c);
    sampler_reset(&g->smp);
    g->n = 0;
    g->feeding = 0;
    g->rows_next = 0;
}

int gen_seq_push(gen_seq *g, const int32_t *ids, size_t n, k3_error *err) {
    if (n > g->cap - g->n)
        return k3_fail(err, "context full: %zu positions used, %zu more do not fit the context of %zu (--max-context)",
                       g->n, n, g->cap);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= g->vocab)
            return k3_fail(err, "token id %d is outside the vocabulary [0, %zu)", ids[i], g->vocab);
    memcpy(g->ids + g->n, ids, n * sizeof *ids);
    g->n += n;
    return 0;
}

void gen_seq_truncate(gen_seq *g, size_t n) {
    if (n >= g->st.pos && n < g->n) g->n = n;
}

int gen_seq_watch_rows(gen_seq *g, size_t from, size_t chunk, void (*on_row)(void *, size_t, const float *), void *ctx,
                       k3_error *err) {
    if (chunk == 0) chunk = 1;
    float *r = realloc(g->rows, chunk * g->vocab * sizeof *r);
    if (!r) return k3_fail(err, "out of memory for %zu rows of logits", chunk);
    g->rows = r;
    g->rows_cap = chunk;
    g->rows_next = from;
    g->on_row = on_row;
    g->on_row_ctx = ctx;
    return 0;
}

static int is_stop(const gen_seq *g, int32_t id) {
    for (size_t i = 0; i < g->n_stop_ids; i++)
        if (g->stop_ids[i] == id) return 1;
    return 0;
}

/* Picks from g->row (the logits of position st.pos - 1) and appends the id as pending. */
static void pick(gen_seq *g, gen_event *ev) {
    size_t pos = g->st.pos - 1;
    ev->pos = pos;
    if (g->n >= g->cap) {
        ev->status = GEN_CONTEXT_FULL;
        snprintf(ev->why, sizeof ev->why, "context full: %zu positions (--max-context)", g->cap);
        return;
    }
    k3_error pe = {0};
    int32_t id = sampler_pick(&g->smp, g->row, g->vocab, &pe);
    if (id < 0) {
        ev->status = -1;
        snprintf(ev->why, sizeof ev->why, "position %zu: %.90s; refusing to emit a token", pos, pe.msg);
        return;
    }
    g->ids[g->n++] = id;
    g->feeding = 0;
    ev->picked = 1;
    ev->id = id;
    ev->stop = is_stop(g, id);
    if (g->on_token) g->on_token(g->on_token_ctx, id, ev->stop);
}

static int spec_step_batch(engine *en, gen_seq *const *g, size_t n, size_t chunk, int pick_done, const int32_t *const *d,
                           const size_t *k, const size_t *max_emit, gen_event *const *ev, size_t *n_ev, k3_error *err);

/* One forward_batch over the sequences' pending ids (see gen_step_batch). With pick_done, a
 * sequence whose pending ids are then all fed picks a token; without (gen_feed), nothing is
 * picked and the last row is kept in g->row only when no rows are watched. */
static int step_batch(engine *en, gen_seq *const *g, size_t n, size_t chunk, int pick_done, gen_event *ev,
                      k3_error *err) {
    gen_event *evp[GEN_MAX_BATCH];
    size_t n_ev[GEN_MAX_BATCH];
    if (n > GEN_MAX_BATCH) return k3_fail(err, "a batch of %zu sequences: at most %d", n, GEN_MAX_BATCH);
    for (size_t i = 0; i < n; i++) evp[i] = &ev[i];
    return spec_step_batch(en, g, n, chunk, pick_done, NULL, NULL, NULL, evp, n_ev, err);
}

int gen_step_batch(engine *en, gen_seq *const *g, size_t n, size_t chunk, gen_event *ev, k3_error *err) {
    return step_batch(en, g, n, chunk, 1, ev, err);
}

int gen_step(engine *en, gen_seq *g, size_t chunk, gen_event *ev, k3_error *err) {
    gen_seq *one[1] = {g};
    do {
        if (gen_step_batch(en, one, 1, chunk, ev, err)) return -1;
        if (ev->status) {
            k3_fail(err, "%s", ev->why);
            return ev->status;
        }
    } while (!ev->picked);
    return 0;
}

int gen_feed(engine *en, gen_seq *g, size_t chunk, k3_error *err) {
    gen_seq *one[1] = {g};
    gen_event ev;
    if (en->max_rows == 0) return k3_fail(err, "feed: the engine was not initialised (engine_init)");
    while (gen_seq_pending(g) > 0)
        if (step_batch(en, one, 1, chunk, 0, &ev, err)) return -1;
    g->feeding = 0;
    return 0;
}

int feed_tokens(engine *en, seq_state *st, const int32_t *ids, size_t n, size_t chunk, size_t want_from, float *logits,
                k3_error *err) {
    size_t V = (size_t)en->model->cfg.vocab_size;
    if (en->max_rows == 0) return k3_fail(err, "feed: the engine was not initialised (engine_init)");
    if (chunk == 0) chunk = 1;
    if (chunk > en->max_rows) chunk = en->max_rows;
    for (size_t off = 0; off < n;) {
        size_t T = n - off < chunk ? n - off : chunk;
        size_t start = st->pos; /* absolute position of ids[off] */
        size_t from = want_from > start ? want_from - start : 0;
        float *dst = NULL;
        if (logits && from < T) dst = logits + (start + from - want_from) * V;
        if (forward_chunk(en, st, ids + off, T, from, dst, err)) return -1;
        off += T;
    }
    return 0;
}

uint64_t gen_spec_bytes(const k3_config *c, size_t k, int per_position) {
    return (uint64_t)(k + 1) * (uint64_t)c->vocab_size * sizeof(float) +
           (uint64_t)(per_position ? k : 1) * seq_state_recurrent_bytes(c);
}

int gen_seq_speculate(gen_seq *g, const k3_config *c, size_t k, int per_position, k3_error *err) {
    if (k == 0) k = 1;
    if (g->spec_rows_cap < k + 1) {
        float *r = realloc(g->spec_rows, (k + 1) * g->vocab * sizeof *r);
        if (!r) return k3_fail(err, "out of memory for %zu rows of verification logits", k + 1);
        g->spec_rows = r;
        g->spec_rows_cap = k + 1;
    }
    size_t copies = per_position ? k : 1;
    if (!g->spec_snap || copies > g->spec_copies) {
        void *b = realloc(g->spec_snap, copies * seq_state_recurrent_bytes(c) + 1);
        if (!b) return k3_fail(err, "out of memory for %zu speculation state copies (%zu bytes each)", copies,
                               seq_state_recurrent_bytes(c));
        g->spec_snap = b;
        g->spec_copies = copies;
    }
    g->spec_per_position = per_position;
    return 0;
}

/* The proposals a sequence may have verified in this step (0: a plain step for it): one pending
 * id, no full recompute, room in the rows left, the context and max_emit. */
static size_t spec_k(const gen_seq *g, size_t k, size_t max_emit, size_t budget) {
    if (g->full_recompute || gen_seq_pending(g) != 1 || max_emit == 0 || budget < 2) return 0;
    if (k > max_emit - 1) k = max_emit - 1; /* picks past max_emit would be thrown away */
    if (k + 1 > budget) k = budget - 1;
    if (g->n + k > g->cap) k = g->cap - g->n; /* the context bounds the proposals too */
    return k;
}

/* Before the verification pass: buffers, the rollback's copy (per-position: the pass writes
 * them), the proposals after the history. */
static int spec_begin(gen_seq *g, const k3_config *c, const int32_t *d, size_t k, k3_error *err) {
    for (size_t i = 0; i < k; i++)
        if (d[i] < 0 || (size_t)d[i] >= g->vocab) return k3_fail(err, "draft id %d is outside the vocabulary", d[i]);
    if ((!g->spec_snap || g->spec_rows_cap < k + 1 || (g->spec_per_position && g->spec_copies < k)) &&
        gen_seq_speculate(g, c, k, g->spec_per_position, err))
        return -1;
    if (g->spec_per_position) {
        g->st.keep = g->spec_snap;
        g->st.keep_n = k;
    } else {
        seq_state_save_recurrent(&g->st, c, g->spec_snap);
    }
    memcpy(g->ids + g->n, d, k * sizeof *d); /* proposals sit past the history while verified */
    g->feeding = 1;
    return 0;
}

/* After the pass (the state at pos0 + k + 1, rows in spec_rows): picks as plain decoding (a
 * failed pick is the last event, with its status), then the rollback to the emitted ids.
 * -1 with err only when a re-feed pass failed. */
static int spec_end(engine *en, gen_seq *g, size_t pos0, const int32_t *d, size_t k, size_t max_emit, gen_event *ev,
                    size_t *n_ev, k3_error *err) {
    const k3_config *c = &en->model->cfg;
    size_t n0 = g->n, e = 0, rb = seq_state_recurrent_bytes(c);
    g->st.keep = NULL;
    g->st.keep_n = 0;
    g->spec_passes++;
    g->spec_proposed += k;
    for (size_t i = 0; i <= k; i++) {
        const float *row = g->spec_rows + i * g->vocab;
        if (g->on_row && pos0 + i >= g->rows_next) {
            g->on_row(g->on_row_ctx, pos0 + i, row);
            g->rows_next = pos0 + i + 1;
        }
        gen_event *x = &ev[e];
        memset(x, 0, sizeof *x);
        memcpy(g->row, row, g->vocab * sizeof *row);
        g->st.pos = pos0 + i + 1; /* pick() reads the position it picks at from here */
        g->n = n0 + i;
        pick(g, x);
        if (x->status == GEN_CONTEXT_FULL && e > 0) break; /* the next plain step reports it */
        if (x->status) { e++; break; }
        e++;
        int match = i < k && x->id == d[i];
        if (match) g->spec_accepted++;
        if (x->stop || e == max_emit || !match) break;
    }
    size_t picked = e > 0 && ev[e - 1].status ? e - 1 : e; /* a failed pick is an event, not an id */
    /* fed: [pending, picks 0..picked-2] = picked ids from pos0; the last pick is pending */
    g->n = n0 + picked;
    if (picked == 0 && g->spec_per_position) { /* a failed first pick: the state is undefined (generate.h) */
        g->st.pos = pos0;
    } else if (picked < k + 1 && g->spec_per_position) { /* the state the pass kept after its row picked-1 */
        seq_state_restore_recurrent(&g->st, c, (const char *)g->spec_snap + (picked - 1) * rb, pos0 + picked);
        g->spec_restores++;
    } else if (picked < k + 1) {
        seq_state_restore_recurrent(&g->st, c, g->spec_snap, pos0);
        if (picked > 0) {
            g->spec_refeeds++;
            if (forward_chunk(en, &g->st, g->ids + pos0, picked, picked, NULL, err)) return -1;
        }
    } else {
        g->st.pos = pos0 + k + 1;
    }
    g->feeding = 0;
    *n_ev = e;
    return 0;
}

/* step_batch with verification passes for the sequences that have proposals (pick_done only). */
static int spec_step_batch(engine *en, gen_seq *const *g, size_t n, size_t chunk, int pick_done, const int32_t *const *d,
                           const size_t *k, const size_t *max_emit, gen_event *const *ev, size_t *n_ev, k3_error *err) {
    forward_seq fs[GEN_MAX_BATCH];
    size_t idx[GEN_MAX_BATCH], take[GEN_MAX_BATCH], ks[GEN_MAX_BATCH], nf = 0, budget = en->max_rows;
    if (n > GEN_MAX_BATCH) return k3_fail(err, "a batch of %zu sequences: at most %d", n, GEN_MAX_BATCH);
    if (en->max_rows == 0) return k3_fail(err, "generate: the engine was not initialised (engine_init)");
    if (chunk == 0) chunk = 1;
    for (size_t i = 0; i < n; i++) {
        memset(&ev[i][0], 0, sizeof ev[i][0]);
        n_ev[i] = 0;
        gen_seq *s = g[i];
        if (s->full_recompute && !s->feeding && s->n > 0) seq_state_reset(&s->st, &en->model->cfg);
        size_t p = gen_seq_pending(s);
        if (p == 0 || budget == 0) continue;
        size_t kk = pick_done && d && d[i] && k[i] ? spec_k(s, k[i], max_emit[i], budget) : 0;
        if (kk) { /* a verification pass: [pending, d0..d(kk-1)], every row's logits */
            size_t pos0 = s->st.pos;
            if (spec_begin(s, &en->model->cfg, d[i], kk, err)) return -1;
            fs[nf] = (forward_seq){&s->st, s->ids + pos0, kk + 1, 0, s->spec_rows};
            idx[nf] = i;
            take[nf] = kk + 1;
            ks[nf] = kk;
            nf++;
            budget -= kk + 1;
            continue;
        }
        size_t t = p < chunk ? p : chunk;
        if (t > budget) t = budget;
        if (s->on_row && t > s->rows_cap) t = s->rows_cap;
        s->feeding = 1;
        size_t pos0 = s->st.pos, from = t; /* no logits unless wanted */
        float *dst = NULL;
        if (s->on_row) {
            size_t want = s->rows_next > pos0 ? s->rows_next - pos0 : 0;
            if (pick_done && t == p && want > t - 1) want = t - 1; /* the pick needs the last row */
            if (want < t) { from = want; dst = s->rows; }
        } else if (t == p) {
            from = t - 1;
            dst = s->row;
        }
        fs[nf] = (forward_seq){&s->st, s->ids + pos0, t, from, dst};
        idx[nf] = i;
        take[nf] = t;
        ks[nf] = 0;
        nf++;
        budget -= t;
    }
    int frc = forward_batch(en, fs, nf, err);
    for (size_t j = 0; j < nf; j++) { /* no keep pointer outlives the pass */
        g[idx[j]]->st.keep = NULL;
        g[idx[j]]->st.keep_n = 0;
    }
    if (frc) return -1;
    for (size_t j = 0; j < nf; j++) {
        gen_seq *s = g[idx[j]];
        size_t t = take[j], pos0 = s->st.pos - t;
        if (ks[j]) {
            if (spec_end(en, s, pos0, d[idx[j]], ks[j], max_emit[idx[j]], ev[idx[j]], &n_ev[idx[j]], err)) return -1;
            continue;
        }
        if (s->on_row && fs[j].logits) {
            for (size_t r = fs[j].logits_from; r < t; r++)
                if (pos0 + r >= s->rows_next) s->on_row(s->on_row_ctx, pos0 + r, s->rows + (r - fs[j].logits_from) * s->vocab);
            if (pos0 + t > s->rows_next) s->rows_next = pos0 + t;
            if (gen_seq_pending(s) == 0) memcpy(s->row, s->rows + (t - 1 - fs[j].logits_from) * s->vocab, s->vocab * sizeof *s->row);
        }
        if (pick_done && gen_seq_pending(s) == 0) {
            pick(s, &ev[idx[j]][0]);
            n_ev[idx[j]] = 1;
        }
    }
    return 0;
}

int gen_step_spec_batch(engine *en, gen_seq *const *g, size_t n, size_t chunk, const int32_t *const *d, const size_t *k,
                        const size_t *max_emit, gen_event *const *ev, size_t *n_ev, k3_error *err) {
    return spec_step_batch(en, g, n, chunk, 1, d, k, max_emit, ev, n_ev, err);
}

int gen_step_spec(engine *en, gen_seq *g, const int32_t *d, size_t k, size_t max_emit, gen_event *ev, size_t *n_ev,
                  k3_error *err) {
    *n_ev = 0;
    if (max_emit == 0) return 0;
    if (spec_k(g, k, max_emit, en->max_rows) == 0) {
        *n_ev = 1;
        return gen_step(en, g, 1, ev, err);
    }
    gen_seq *one[1] = {g};
    gen_event *evp[1] = {ev};
    const int32_t *dp[1] = {d};
    if (gen_step_spec_batch(en, one, 1, 1, dp, &k, &max_emit, evp, n_ev, err)) return -1;
    for (size_t i = 0; i < *n_ev; i++)
        if (ev[i].status) {
            k3_fail(err, "%s", ev[i].why);
            return ev[i].status;
        }
    return 0;
}
