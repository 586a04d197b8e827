#define _GNU_SOURCE /* nftw (tests/unit/harness.h) */
/* Job: unit tests for the rollback of exact speculation (coordinator/generate.c gen_step_spec,
 * the per-position states of coordinator/kda.c and state.h keep), on tests/models/m13 and
 * m14b12, run from the repository root (make unit).
 *   - per-position states: one chunk with keep_n set leaves, after each of its first keep_n
 *     tokens, the recurrent part (every KDA S and conv history) bit for bit equal to the one a
 *     token-by-token feed has after that token; the state at the end of the chunk is unchanged
 *     by keeping (== a chunk without keep).
 *   - gen_step_spec with both rollbacks (per-position states, snapshot + re-feed), greedy and
 *     seeded sampling, proposals right / partly right / wrong, k = 1..6: the ids, every logits
 *     row and the state after the run (recurrent part, position) are those of plain decoding;
 *     the per-position rollback makes no extra pass (passes == verification passes), the
 *     re-feed one pass per rejected block with accepted ids.
 *   - gen_step_spec_batch: three sequences (greedy and seeded, proposals right / partly wrong,
 *     both rollbacks) in one forward per step give each one's plain ids and final state.
 *   - the server's scheduler with n-gram speculation (both rollbacks): 5 requests over 3 slots
 *     (greedy, seeded, logprobs, a stop id, max_tokens 3) get the ids, logprobs and finish they
 *     get without it. */
#include "common/kernels.h"
#include "coordinator/experts_local.h"
#include "coordinator/generate.h"
#include "coordinator/plan.h"
#include "coordinator/scheduler.h"
#include "coordinator/trunk.h"
#include "tests/unit/check.h"
#include "tests/unit/harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NP 9
#define NGEN 24

static void prompt_of(int V, int32_t *p) {
    for (int i = 0; i < NP; i++) p[i] = (int32_t)((i * 37 + 11) % V);
}

static void test_keep(test_engine *te, const char *name) {
    const k3_config *c = &te->m.cfg;
    k3_error err = {0};
    int32_t ids[NP];
    prompt_of(c->vocab_size, ids);
    size_t rb = seq_state_recurrent_bytes(c), kn = 6;
    seq_state a, b, nk;
    if (seq_state_init(&a, c, &err) || seq_state_init(&b, c, &err) || seq_state_init(&nk, c, &err)) die(err.msg);
    char *keep = malloc(kn * rb + 1), *one = malloc(rb + 1), *two = malloc(rb + 1);
    if (!keep || !one || !two) die("out of memory");
    /* a: 2 ids, then 7 in one chunk keeping the first 6 states; b: one at a time */
    if (forward_chunk(&te->en, &a, ids, 2, 2, NULL, &err) || forward_chunk(&te->en, &nk, ids, 2, 2, NULL, &err)) die(err.msg);
    a.keep = keep;
    a.keep_n = kn;
    if (forward_chunk(&te->en, &a, ids + 2, NP - 2, NP - 2, NULL, &err)) die(err.msg);
    a.keep = NULL;
    a.keep_n = 0;
    if (forward_chunk(&te->en, &nk, ids + 2, NP - 2, NP - 2, NULL, &err)) die(err.msg);
    for (size_t i = 0; i < NP; i++) {
        if (forward_chunk(&te->en, &b, ids + i, 1, 1, NULL, &err)) die(err.msg);
        if (i >= 2 && i - 2 < kn)
            CHECK(!memcmp(keep + (i - 2) * rb, (seq_state_save_recurrent(&b, c, one), one), rb),
                  "%s: the state kept after chunk token %zu differs from a token-by-token feed", name, i - 2);
    }
    seq_state_save_recurrent(&a, c, one);
    seq_state_save_recurrent(&nk, c, two);
    CHECK(!memcmp(one, two, rb) && a.pos == nk.pos, "%s: keeping states changed the chunk's final state", name);
    seq_state_free(&a);
    seq_state_free(&b);
    seq_state_free(&nk);
    free(keep);
    free(one);
    free(two);
}

typedef struct {
    float *rows;
    size_t V, n;
} rows_log;

static void log_row(void *ctx, size_t pos, const float *row) {
    rows_log *l = ctx;
    if (pos < l->n) memcpy(l->rows + pos * l->V, row, l->V * sizeof *row);
}

/* One run of NGEN ids: plain (mode < 0) or speculative with rollback mode (1 states, 0
 * re-feed) and proposals from want (every `wrong`-th one altered; wrong 1 = all wrong). */
static void gen_run(test_engine *te, const sampler_config *sc, int mode, size_t k, const int32_t *want, int wrong,
                    int32_t *out, float *rows, char *state, size_t *pos, uint64_t *passes, gen_seq *stats) {
    const k3_config *c = &te->m.cfg;
    k3_error err = {0};
    size_t V = (size_t)c->vocab_size, cap = NP + NGEN;
    int32_t ids[NP];
    prompt_of(c->vocab_size, ids);
    gen_seq g;
    if (gen_seq_init(&g, c, sc, NULL, 0, cap, &err)) die(err.msg);
    rows_log rl = {rows, V, cap};
    if (gen_seq_watch_rows(&g, 0, 16, log_row, &rl, &err)) die(err.msg);
    if (mode >= 0 && gen_seq_speculate(&g, c, k, mode, &err)) die(err.msg);
    if (gen_seq_push(&g, ids, NP, &err)) die(err.msg);
    uint64_t p0 = 0;
    for (size_t i = 0; i < NGEN;) {
        gen_event ev[8];
        size_t nev = 1, nk = 0;
        int32_t d[8];
        if (i > 0 && mode >= 0)
            for (; nk < k && i + nk < NGEN; nk++)
                d[nk] = wrong && (wrong == 1 || (i + nk) % (size_t)wrong == 0) ? (want[i + nk] + 1) % (int32_t)V : want[i + nk];
        if (i == 1) p0 = te->en.passes;
        int rc = nk ? gen_step_spec(&te->en, &g, d, nk, NGEN - i, ev, &nev, &err) : gen_step(&te->en, &g, 16, ev, &err);
        if (rc) die(err.msg);
        for (size_t j = 0; j < nev; j++) out[i++] = ev[j].id;
    }
    if (gen_feed(&te->en, &g, 16, &err)) die(err.msg); /* the last id too: compare whole states */
    seq_state_save_recurrent(&g.st, c, state);
    *pos = g.st.pos;
    *passes = te->en.passes - p0;
    if (stats) *stats = g;
    else gen_seq_free(&g);
}

static void test_spec(test_engine *te, const char *name) {
    const k3_config *c = &te->m.cfg;
    size_t V = (size_t)c->vocab_size, rb = seq_state_recurrent_bytes(c), cap = NP + NGEN;
    float *r0 = calloc(cap * V, sizeof *r0), *r1 = calloc(cap * V, sizeof *r1);
    char *s0 = malloc(rb + 1), *s1 = malloc(rb + 1);
    int32_t want[NGEN], got[NGEN];
    if (!r0 || !r1 || !s0 || !s1) die("out of memory");
    for (int seeded = 0; seeded <= 1; seeded++) {
        sampler_config sc;
        sampler_config_default(&sc);
        if (seeded) { sc.temperature = 0.9; sc.top_p = 0.95; sc.seed = 11; }
        size_t pos0, pos1;
        uint64_t pp;
        gen_run(te, &sc, -1, 0, NULL, 0, want, r0, s0, &pos0, &pp, NULL);
        for (int mode = 0; mode <= 1; mode++)
            for (size_t k = 1; k <= 4; k += 3)
                for (int wrong = 0; wrong <= 3; wrong++) {
                    gen_seq g;
                    uint64_t passes;
                    memset(r1, 0, cap * V * sizeof *r1);
                    gen_run(te, &sc, mode, k, want, wrong, got, r1, s1, &pos1, &passes, &g);
                    const char *how = mode ? "states" : "refeed";
                    CHECK(!memcmp(got, want, sizeof want), "%s %s k %zu wrong %d seeded %d: ids differ", name, how, k,
                          wrong, seeded);
                    CHECK(!memcmp(r0, r1, cap * V * sizeof *r0), "%s %s k %zu wrong %d seeded %d: logits differ", name,
                          how, k, wrong, seeded);
                    CHECK(pos0 == pos1 && !memcmp(s0, s1, rb), "%s %s k %zu wrong %d seeded %d: final state differs",
                          name, how, k, wrong, seeded);
                    /* passes after the first pick: verification passes, single steps, re-feeds, the final feed */
                    uint64_t singles = passes - g.spec_passes - g.spec_refeeds - 1;
                    if (mode) CHECK(g.spec_refeeds == 0, "%s states: %llu re-feeds", name, (unsigned long long)g.spec_refeeds);
                    else CHECK(g.spec_restores == 0, "%s refeed: %llu restores", name, (unsigned long long)g.spec_restores);
                    if (wrong == 0) CHECK(g.spec_accepted == g.spec_proposed && g.spec_proposed > 0, "%s %s k %zu: all accepted", name, how, k);
                    if (wrong == 1) CHECK(g.spec_accepted == 0, "%s %s k %zu: none accepted", name, how, k);
                    CHECK(singles < NGEN, "%s %s: pass count", name, how);
                    gen_seq_free(&g);
                }
    }
    free(r0);
    free(r1);
    free(s0);
    free(s1);
}

/* gen_step_spec_batch: 3 sequences (other prompts, greedy / seeded, proposals right / every 2nd
 * wrong / none; states and re-feed rollback mixed) stepped together in one forward per step
 * give each one's plain ids and final state. */
static void test_spec_batch(test_engine *te, const char *name) {
    const k3_config *c = &te->m.cfg;
    k3_error err = {0};
    size_t rb = seq_state_recurrent_bytes(c), cap = NP + NGEN, V = (size_t)c->vocab_size;
    enum { NS = 3 };
    gen_seq gs[NS];
    int32_t want[NS][NGEN], got[NS][NGEN];
    size_t ngot[NS] = {0};
    char *sa = malloc(rb + 1), *sb = malloc(rb + 1);
    if (!sa || !sb) die("out of memory");
    for (int i = 0; i < NS; i++) {
        sampler_config sc;
        sampler_config_default(&sc);
        if (i == 1) { sc.temperature = 0.8; sc.seed = 5; }
        int32_t p[NP];
        prompt_of(c->vocab_size - 3 * i, p);
        for (int pass = 0; pass < 2; pass++) { /* 0: alone, plain; 1: in the batch */
            if (gen_seq_init(&gs[i], c, &sc, NULL, 0, cap, &err) || gen_seq_push(&gs[i], p, NP, &err)) die(err.msg);
            if (pass == 1) {
                if (gen_seq_speculate(&gs[i], c, 4, i != 2, &err)) die(err.msg);
                break;
            }
            for (size_t n = 0; n < NGEN; n++) {
                gen_event ev;
                if (gen_step(&te->en, &gs[i], 16, &ev, &err)) die(err.msg);
                want[i][n] = ev.id;
            }
            if (gen_feed(&te->en, &gs[i], 16, &err)) die(err.msg);
            gen_seq_free(&gs[i]);
        }
    }
    for (int guard = 0; guard < 200; guard++) {
        gen_seq *b[NS];
        int32_t dd[NS][4];
        const int32_t *dp[NS];
        size_t kk[NS], me[NS], nev[NS], map[NS], nb = 0;
        gen_event evs[NS][5];
        gen_event *evp[NS];
        for (int i = 0; i < NS; i++) {
            if (ngot[i] >= NGEN) continue;
            map[nb] = (size_t)i;
            b[nb] = &gs[i];
            kk[nb] = 0;
            if (ngot[i] > 0 && i != 1)
                for (; kk[nb] < 4 && ngot[i] + kk[nb] < NGEN; kk[nb]++) {
                    size_t at = ngot[i] + kk[nb];
                    dd[nb][kk[nb]] = i == 2 && at % 2 ? (want[i][at] + 1) % (int32_t)V : want[i][at];
                }
            if (i == 1 && ngot[i] > 0) { kk[nb] = 3; for (int q = 0; q < 3; q++) dd[nb][q] = want[i][(ngot[i] + (size_t)q) % NGEN]; }
            dp[nb] = dd[nb];
            me[nb] = NGEN - ngot[i];
            evp[nb] = evs[nb];
            nb++;
        }
        if (nb == 0) break;
        if (gen_step_spec_batch(&te->en, b, nb, 16, dp, kk, me, evp, nev, &err)) die(err.msg);
        for (size_t j = 0; j < nb; j++)
            for (size_t e = 0; e < nev[j]; e++) {
                CHECK(evs[j][e].status == 0 && evs[j][e].picked, "%s batch: event status %d", name, evs[j][e].status);
                if (ngot[map[j]] < NGEN) got[map[j]][ngot[map[j]]++] = evs[j][e].id;
            }
    }
    for (int i = 0; i < NS; i++) {
        CHECK(ngot[i] == NGEN && !memcmp(got[i], want[i], sizeof want[i]), "%s batch: sequence %d ids differ", name, i);
        if (gen_feed(&te->en, &gs[i], 16, &err)) die(err.msg);
        seq_state_save_recurrent(&gs[i].st, c, sa);
        /* the plain state after the same ids, fed alone */
        seq_state st;
        if (seq_state_init(&st, c, &err)) die(err.msg);
        if (feed_tokens(&te->en, &st, gs[i].ids, gs[i].n, 16, gs[i].n, NULL, &err)) die(err.msg);
        seq_state_save_recurrent(&st, c, sb);
        CHECK(st.pos == gs[i].st.pos && !memcmp(sa, sb, rb), "%s batch: sequence %d final state differs", name, i);
        CHECK(i == 1 || gs[i].spec_passes > 0, "%s batch: sequence %d never speculated", name, i);
        seq_state_free(&st);
        gen_seq_free(&gs[i]);
    }
    free(sa);
    free(sb);
}

/* The server's scheduler with --draft ngram (states and re-feed rollback) gives every request the
 * ids, logprobs and finish it has without speculation: 3 slots, 5 requests (greedy, seeded, with
 * logprobs, a stop id, a short max_tokens) on a repetitive prompt, so the n-gram source proposes. */
typedef struct {
    int32_t out[64];
    float lp[64];
    size_t n;
    int finish;
} sched_result;

static void sched_run(test_engine *te, size_t draft_max, int per_position, sched_result *res, sched_stats *st) {
    k3_error err = {0};
    sched_config sc = {.parallel = 3, .max_queue = 8, .chunk = 16, .max_context = 128, .draft_max = draft_max,
                       .draft_per_position = per_position};
    scheduler *s = sched_create(&te->en, &sc, &err);
    if (!s) die(err.msg);
    gen_request *r[5];
    int32_t p[24];
    for (int i = 0; i < 24; i++) p[i] = (int32_t)(100 + (i % 6) * 7);
    for (int i = 0; i < 5; i++) {
        r[i] = gen_request_new();
        r[i]->n_prompt = (size_t)(18 + i);
        r[i]->prompt = malloc(r[i]->n_prompt * sizeof *p);
        memcpy(r[i]->prompt, p, r[i]->n_prompt * sizeof *p);
        r[i]->max_tokens = i == 4 ? 3 : 20;
        sampler_config_default(&r[i]->sampling);
        if (i == 1 || i == 3) { r[i]->sampling.temperature = 0.7; r[i]->sampling.seed = (uint64_t)(9 + i); }
        r[i]->want_logprobs = i == 2;
        r[i]->top_logprobs = i == 2 ? 2 : 0;
        if (i == 3) {
            r[i]->stops = malloc(sizeof(int32_t));
            r[i]->stops[0] = res[3].n ? res[3].out[5] : 0; /* second run: a stop id taken from the first */
            r[i]->n_stops = res[3].n ? 1 : 0;
        }
        if (sched_submit(s, r[i]) != SCHED_OK) die("submit");
    }
    for (int i = 0; i < 5; i++) {
        pthread_mutex_lock(&r[i]->mu);
        while (!r[i]->done) pthread_cond_wait(&r[i]->cv, &r[i]->mu);
        pthread_mutex_unlock(&r[i]->mu);
        res[i].n = r[i]->n_out < 64 ? r[i]->n_out : 64;
        memcpy(res[i].out, r[i]->out, res[i].n * sizeof *r[i]->out);
        if (r[i]->want_logprobs) memcpy(res[i].lp, r[i]->logprob, res[i].n * sizeof *r[i]->logprob);
        res[i].finish = r[i]->finish;
        gen_request_release(r[i]);
    }
    sched_get_stats(s, st);
    sched_destroy(s);
}

static void test_sched_spec(test_engine *te, const char *name) {
    sched_result base[5], got[5];
    memset(base, 0, sizeof base);
    sched_stats st;
    sched_run(te, 0, 0, base, &st); /* fills res[3] so the next runs have a stop id */
    sched_run(te, 0, 0, base, &st);
    for (int mode = 0; mode < 2; mode++) {
        memcpy(got, base, sizeof got);
        sched_run(te, 4, mode, got, &st);
        for (int i = 0; i < 5; i++)
            CHECK(got[i].n == base[i].n && !memcmp(got[i].out, base[i].out, base[i].n * sizeof *base[i].out) &&
                      !memcmp(got[i].lp, base[i].lp, sizeof base[i].lp) && got[i].finish == base[i].finish,
                  "%s scheduler (%s): request %d differs with speculation (%zu vs %zu ids)", name,
                  mode ? "states" : "refeed", i, got[i].n, base[i].n);
        /* m13 continues the repeated prompt with ids the prompt has, so n-gram proposes; m14b12 not */
        if (strstr(name, "m13")) CHECK(st.spec_passes > 0 && st.spec_proposed > 0, "%s scheduler: no verification pass", name);
    }
}

/* gen_feed (gen_step_batch's step without the pick): every watched row and the last row equal
 * feed_tokens' logits at chunk 4 and at chunk 16, nothing is picked, and the state is that of
 * feed_tokens (the same bits). */
typedef struct { float *rows; size_t V; } feed_rows;
static void keep_feed_row(void *ctx, size_t pos, const float *row) {
    feed_rows *fr = ctx;
    memcpy(fr->rows + pos * fr->V, row, fr->V * sizeof *row);
}

static void test_feed(test_engine *te, const char *name) {
    const k3_config *c = &te->m.cfg;
    k3_error err = {0};
    size_t V = (size_t)c->vocab_size, rb = seq_state_recurrent_bytes(c);
    int32_t ids[NP];
    prompt_of(c->vocab_size, ids);
    float *want = malloc(NP * V * sizeof *want), *got = malloc(NP * V * sizeof *got);
    char *s0 = malloc(rb + 1), *s1 = malloc(rb + 1);
    seq_state st;
    if (!want || !got || !s0 || !s1 || seq_state_init(&st, c, &err)) die("out of memory");
    if (feed_tokens(&te->en, &st, ids, NP, 16, 0, want, &err)) die(err.msg);
    seq_state_save_recurrent(&st, c, s0);
    sampler_config sc;
    sampler_config_default(&sc);
    for (int watch = 0; watch < 2; watch++)
        for (size_t chunk = 4; chunk <= 16; chunk += 12) {
            gen_seq g;
            feed_rows fr = {got, V};
            memset(got, 0, NP * V * sizeof *got);
            if (gen_seq_init(&g, c, &sc, NULL, 0, NP + 1, &err) || gen_seq_push(&g, ids, NP, &err)) die(err.msg);
            if (watch && gen_seq_watch_rows(&g, 0, chunk, keep_feed_row, &fr, &err)) die(err.msg);
            CHECK(gen_feed(&te->en, &g, chunk, &err) == 0, "%s gen_feed: %s", name, err.msg);
            CHECK(g.n == NP && g.st.pos == NP, "%s gen_feed chunk %zu: %zu ids, %zu fed", name, chunk, g.n, g.st.pos);
            if (watch) CHECK(!memcmp(got, want, NP * V * sizeof *got), "%s gen_feed chunk %zu: watched rows", name, chunk);
            else CHECK(!memcmp(g.row, want + (NP - 1) * V, V * sizeof *got), "%s gen_feed chunk %zu: last row", name, chunk);
            seq_state_save_recurrent(&g.st, c, s1);
            CHECK(!memcmp(s0, s1, rb), "%s gen_feed chunk %zu: state", name, chunk);
            gen_seq_free(&g);
        }
    seq_state_free(&st);
    free(want);
    free(got);
    free(s0);
    free(s1);
}

int main(void) {
    const char *models[] = {"tests/models/m13", "tests/models/m14b12"};
    for (size_t i = 0; i < 2; i++) {
        test_engine te;
        test_engine_open(&te, models[i], 16, 256);
        test_keep(&te, models[i]);
        test_feed(&te, models[i]);
        test_spec(&te, models[i]);
        test_spec_batch(&te, models[i]);
        test_sched_spec(&te, models[i]);
        test_engine_close(&te);
    }
    return check_report("test_spec");
}
