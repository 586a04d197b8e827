/* test_expert_cache.c - unit test of workers/expert_cache (the cache eviction rules),
 * on the experts of tests/models/m13 (13 layers, 16 experts, top-4):
 *   - policy names parse and print; the default policy is CACHE_POLICY_DEFAULT (phit);
 *   - a budget below one slot is refused; a 1-slot cache works (no prefetch);
 *   - eviction never takes a pinned slot (prefetched and not yet used, or in use),
 *     nor a slot being read (the misses of one prefetch land in distinct slots),
 *     and a request never evicts its own resident experts (they are pinned first);
 *   - hit/miss/bytes accounting;
 *   - hand-made request sequences where the policies differ: the hit counts equal
 *     scripts/sim_expert_cache.py's (numbers in test_sequences);
 *   - expert bytes and expert_batch_run outputs identical for every policy and
 *     cache size (the policy changes only speed), with and without readers (several
 *     reads in flight) and hints (half of them wrong); hint accounting; on these
 *     sequences readers give the hit count of the synchronous path (not in general:
 *     expert_cache.h);
 *   - a failed read (the shard cut short under the cache) empties its slot: the next
 *     misses fill the emptied slot before evicting anything, and the expert reads
 *     right once the file is whole again (with and without readers).
 * Exits non-zero and prints every failure.
 *
 * Replay mode (used by tests/t_45_cache_policy.sh to check the C policies against
 * the simulator on a real trace):
 *   bin/test_expert_cache --replay TRACE --model DIR --workers W --slots N --policy P
 * replays a `bin/k3 --dump-expert-trace` file through W real caches (ownership as
 * k3-expertd) exactly as the simulator models it and prints "hits H misses M"; every
 * victim taken from phit's index or lru/lfu's heap is checked against a scan unless --verify 0 (to time it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/wire.h"
#include "workers/expert_batch.h"
#include "workers/expert_cache.h"
#include "tests/unit/check.h"

#define MODEL "tests/models/m13"



/* ---- one worker's view of the model ---- */

typedef struct {
    int worker, n_workers;
} owner_ctx;

static int owns(int layer, int expert, void *ctx) {
    const owner_ctx *o = ctx;
    return expert_owner(layer, expert, o->n_workers) == o->worker;
}

typedef struct {
    k3_config cfg;
    checkpoint ck;
    expert_store st;
    owner_ctx own;
    int open;
} model;

static int model_open(model *m, const char *dir, int worker, int n_workers, k3_error *err) {
    memset(m, 0, sizeof *m);
    m->own = (owner_ctx){worker, n_workers};
    if (config_load(dir, &m->cfg, err)) return -1;
    if (checkpoint_open(dir, &m->ck, err)) { config_free(&m->cfg); return -1; }
    if (expert_store_open(&m->st, &m->ck, &m->cfg, owns, &m->own, err)) {
        checkpoint_close(&m->ck);
        config_free(&m->cfg);
        return -1;
    }
    m->open = 1;
    return 0;
}

static void model_close(model *m) {
    if (!m->open) return;
    expert_store_free(&m->st);
    checkpoint_close(&m->ck);
    config_free(&m->cfg);
    m->open = 0;
}

/* cache_of's caches check every indexed victim against a scan (--replay --verify 0: not, to time the index) */
static int replay_verify = 1;

static expert_cache *cache_of(model *m, size_t slots, cache_policy p, k3_error *err) {
    expert_cache *c = expert_cache_create(&m->st, &m->ck, slots * expert_cache_slot_bytes(&m->st), -1, err);
    if (c) {
        expert_cache_set_policy(c, p);
        expert_cache_set_verify(c, replay_verify); /* indexed victims (phit's index, lru/lfu's heap) checked against a scan of all slots */
    }
    return c;
}

/* victims taken from the index (phit) or the heap (lru, lfu) and checked against the scan, over all caches of the run */
static uint64_t indexed_victims_checked;

/* Frees a cache of cache_of after checking that its index never disagreed with the scan. */
static void cache_done(expert_cache *c) {
    uint64_t checks = 0, bad = c ? expert_cache_verify_failures(c, &checks) : 0;
    indexed_victims_checked += checks;
    CHECK(bad == 0, "policy %s: %llu of %llu victims of the index differ from the scan's",
          c ? cache_policy_name(expert_cache_get_policy(c)) : "-", (unsigned long long)bad, (unsigned long long)checks);
    expert_cache_free(c);
}

/* ---- requests: (layer, distinct experts ascending), as expert_batch_run issues them ---- */

typedef struct {
    int layer, n;
    int32_t e[64];
} request;

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Only the experts `worker` owns; n == 0 when none (no request is sent). */
static request for_worker(const request *r, int worker, int n_workers) {
    request q = {r->layer, 0, {0}};
    for (int i = 0; i < r->n; i++)
        if (expert_owner(r->layer, r->e[i], n_workers) == worker) q.e[q.n++] = r->e[i];
    return q;
}

/* What expert_batch_run does with the cache, minus the compute: prefetch the
 * distinct experts, then acquire and release each in order. Also checks that the
 * bytes handed out are the expert's bytes in the file. */
static int run_request(expert_cache *c, model *m, const request *r, int verify, k3_error *err) {
    expert_source src = expert_cache_source(c);
    if (src.prefetch(src.ctx, r->layer, r->e, (size_t)r->n, err)) return -1;
    for (int i = 0; i < r->n; i++) {
        expert_weights w, ref;
        if (src.acquire(src.ctx, r->layer, r->e[i], &w, err)) return -1;
        if (verify) {
            if (expert_weights_mapped(&m->st, &m->ck, r->layer, r->e[i], &ref, err)) return -1;
            const mxfp4_weight *a[3] = {&w.w1, &w.w2, &w.w3}, *b[3] = {&ref.w1, &ref.w2, &ref.w3};
            for (int j = 0; j < 3; j++) {
                size_t np = a[j]->rows * a[j]->cols / 2, ns = a[j]->rows * a[j]->cols / 32;
                CHECK(a[j]->rows == b[j]->rows && a[j]->cols == b[j]->cols && !memcmp(a[j]->packed, b[j]->packed, np) &&
                              !memcmp(a[j]->scales, b[j]->scales, ns),
                      "policy %s: layer %d expert %d: matrix %d differs from the file", cache_policy_name(expert_cache_get_policy(c)),
                      r->layer, r->e[i], j);
            }
        }
        src.release(src.ctx, r->layer, r->e[i]);
    }
    return 0;
}

/* ---- trace reading (same chunking as the simulator) ---- */

static request *read_trace(const char *path, int *n_out, k3_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) { k3_fail(err, "cannot open %s", path); return NULL; }
    size_t cap = 1024, n = 0;
    request *rq = malloc(cap * sizeof *rq);
    char line[4096];
    int cur_layer = -1;
    long last_pos = -1;
    while (rq && fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char *p = line, *end;
        long pos = strtol(p, &end, 10);
        if (end == p) continue;
        p = end;
        int layer = (int)strtol(p, &end, 10);
        p = end;
        if (layer != cur_layer || pos <= last_pos) {
            if (n == cap) {
                request *t = realloc(rq, 2 * cap * sizeof *rq);
                if (!t) { free(rq); rq = NULL; break; }
                rq = t;
                cap *= 2;
            }
            rq[n++] = (request){layer, 0, {0}};
            cur_layer = layer;
        }
        last_pos = pos;
        request *r = &rq[n - 1];
        for (;;) {
            long e = strtol(p, &end, 10);
            if (end == p) break;
            p = end;
            int dup = 0;
            for (int i = 0; i < r->n; i++) dup |= r->e[i] == e;
            if (!dup && r->n < 64) r->e[r->n++] = (int32_t)e;
        }
    }
    fclose(f);
    if (!rq) { k3_fail(err, "out of memory reading %s", path); return NULL; }
    for (size_t i = 0; i < n; i++) qsort(rq[i].e, (size_t)rq[i].n, sizeof rq[i].e[0], cmp_i32);
    *n_out = (int)n;
    return rq;
}

/* Replays requests through one cache per worker; hits/misses summed. */
static int replay(const char *dir, const request *rq, int n, int n_workers, size_t slots, cache_policy p, uint64_t *hits,
                  uint64_t *misses, k3_error *err) {
    *hits = *misses = 0;
    for (int w = 0; w < n_workers; w++) {
        model m;
        if (model_open(&m, dir, w, n_workers, err)) return -1;
        expert_cache *c = cache_of(&m, slots, p, err);
        int rc = c ? 0 : -1;
        for (int i = 0; i < n && !rc; i++) {
            request q = for_worker(&rq[i], w, n_workers);
            if (q.n) rc = run_request(c, &m, &q, 0, err);
        }
        if (c) {
            expert_cache_stats s = expert_cache_get_stats(c);
            *hits += s.hits;
            *misses += s.misses;
            uint64_t checks = 0, bad = expert_cache_verify_failures(c, &checks);
            indexed_victims_checked += checks;
            if (!rc && bad)
                rc = k3_fail(err, "worker %d: %llu of %llu indexed victims (phit's index, lru/lfu's heap) differ from a scan of the slots", w,
                             (unsigned long long)bad, (unsigned long long)checks);
        }
        expert_cache_free(c);
        model_close(&m);
        if (rc) return -1;
    }
    return 0;
}

static int replay_main(int argc, char **argv) {
    const char *trace = NULL, *dir = MODEL, *pname = "phit";
    int workers = 1;
    long slots = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--replay")) trace = argv[i + 1];
        else if (!strcmp(argv[i], "--model")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--workers")) workers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--slots")) slots = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--policy")) pname = argv[i + 1];
        else if (!strcmp(argv[i], "--verify")) replay_verify = atoi(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    cache_policy p;
    if (!trace || workers < 1 || slots < 1 || cache_policy_parse(pname, &p)) {
        fprintf(stderr, "usage: %s --replay TRACE [--model DIR] [--workers W] --slots N [--policy lru|lfu|phit] [--verify 0|1]\n", argv[0]);
        return 2;
    }
    k3_error err = {0};
    int n;
    request *rq = read_trace(trace, &n, &err);
    uint64_t h, m;
    if (!rq || replay(dir, rq, n, workers, (size_t)slots, p, &h, &m, &err)) {
        fprintf(stderr, "test_expert_cache: %s\n", err.msg);
        free(rq);
        return 1;
    }
    printf("hits %llu misses %llu\n", (unsigned long long)h, (unsigned long long)m);
    free(rq);
    return 0;
}

/* ---- the unit tests ---- */

static void test_names(void) {
    cache_policy p = CACHE_POLICY_COUNT;
    for (int i = 0; i < CACHE_POLICY_COUNT; i++) {
        CHECK(cache_policy_parse(cache_policy_name((cache_policy)i), &p) == 0 && p == (cache_policy)i, "policy %d round trip", i);
    }
    CHECK(cache_policy_parse("lru", &p) == 0 && p == CACHE_POLICY_LRU, "parse lru");
    CHECK(cache_policy_parse("lfu", &p) == 0 && p == CACHE_POLICY_LFU, "parse lfu");
    CHECK(cache_policy_parse("phit", &p) == 0 && p == CACHE_POLICY_PHIT, "parse phit");
    p = CACHE_POLICY_LFU;
    CHECK(cache_policy_parse("LRU", &p) == -1 && p == CACHE_POLICY_LFU, "'LRU' refused, out untouched");
    CHECK(cache_policy_parse("", &p) == -1 && cache_policy_parse(NULL, &p) == -1, "empty / NULL refused");
    CHECK(!strcmp(cache_policy_name(CACHE_POLICY_COUNT), "?"), "invalid value prints '?'");
}

static void test_create(model *m) {
    k3_error err = {0};
    uint64_t sb = expert_cache_slot_bytes(&m->st);
    CHECK(expert_cache_create(&m->st, &m->ck, sb - 1, -1, &err) == NULL && strstr(err.msg, "below one expert slot"),
          "budget below one slot: '%s'", err.msg);
    err = (k3_error){0};
    expert_cache *c = expert_cache_create(&m->st, &m->ck, 3 * sb + sb / 2, -1, &err);
    CHECK(c && expert_cache_slots(c) == 3, "3.5 slots of budget -> 3 slots");
    if (!c) return;
    CHECK(expert_cache_get_policy(c) == CACHE_POLICY_DEFAULT && CACHE_POLICY_DEFAULT == CACHE_POLICY_PHIT, "default policy is phit");
    expert_cache_set_policy(c, CACHE_POLICY_COUNT);
    CHECK(expert_cache_get_policy(c) == CACHE_POLICY_DEFAULT, "an invalid policy is ignored");
    expert_cache_set_policy(c, CACHE_POLICY_LRU);
    CHECK(expert_cache_get_policy(c) == CACHE_POLICY_LRU, "set lru");
    expert_cache_free(c);
}

/* One slot: no prefetch; everything on demand; a request may need more experts than slots. */
static void test_one_slot(model *m) {
    static const request seq[] = {{1, 1, {3}}, {1, 1, {3}}, {1, 2, {3, 5}}, {2, 1, {0}}, {2, 3, {0, 7, 9}}, {2, 1, {9}}};
    for (int p = 0; p < CACHE_POLICY_COUNT; p++) {
        k3_error err = {0};
        expert_cache *c = cache_of(m, 1, (cache_policy)p, &err);
        CHECK(c != NULL, "1-slot cache: %s", err.msg);
        if (!c) return;
        int rc = 0;
        for (size_t i = 0; i < sizeof seq / sizeof seq[0] && !rc; i++) rc = run_request(c, m, &seq[i], 1, &err);
        expert_cache_stats s = expert_cache_get_stats(c);
        /* hits: {3} again; 3 of {3,5}; 0 of {0,7,9}; 9 again. misses: 3, 5, 0, 7, 9 */
        CHECK(!rc && s.hits == 4 && s.misses == 5 && s.bytes_read == 5 * m->st.expert_bytes,
              "1 slot, %s: rc %d (%s) hits %llu misses %llu bytes %llu", cache_policy_name((cache_policy)p), rc, err.msg,
              (unsigned long long)s.hits, (unsigned long long)s.misses, (unsigned long long)s.bytes_read);
        cache_done(c);
    }
}

/* Pinned slots are never evicted; the misses of one prefetch get distinct slots
 * (a slot being read is never a victim); a request's resident experts are pinned
 * before its misses take slots. */
static void test_pins(model *m) {
    for (int p = 0; p < CACHE_POLICY_COUNT; p++) {
        const char *pn = cache_policy_name((cache_policy)p);
        k3_error err = {0};
        expert_cache *c = cache_of(m, 3, (cache_policy)p, &err);
        if (!c) { CHECK(0, "%s", err.msg); return; }
        expert_source src = expert_cache_source(c);
        expert_weights w;
        /* three misses of one request into three slots (window = n_slots - 1 = 2, the third on demand) */
        request r = {1, 3, {2, 4, 6}};
        CHECK(run_request(c, m, &r, 1, &err) == 0, "%s: %s", pn, err.msg);
        expert_cache_stats s = expert_cache_get_stats(c);
        CHECK(s.misses == 3 && s.hits == 0, "%s: 3 misses expected, got %llu/%llu", pn, (unsigned long long)s.misses,
              (unsigned long long)s.hits);
        /* the first two were read by one prefetch into distinct slots: both still resident */
        request r2 = {1, 2, {2, 4}};
        CHECK(run_request(c, m, &r2, 1, &err) == 0, "%s: %s", pn, err.msg);
        s = expert_cache_get_stats(c);
        CHECK(s.hits == 2 && s.misses == 3, "%s: prefetched misses must land in distinct slots (hits %llu misses %llu)", pn,
              (unsigned long long)s.hits, (unsigned long long)s.misses);

        /* prefetch pins {2, 4}; while they are pinned, other experts may only use the third slot */
        int32_t pf[2] = {2, 4};
        CHECK(src.prefetch(src.ctx, 1, pf, 2, &err) == 0, "%s: prefetch: %s", pn, err.msg);
        for (int e = 8; e < 12; e++) {
            CHECK(src.acquire(src.ctx, 1, e, &w, &err) == 0, "%s: acquire %d with two pinned: %s", pn, e, err.msg);
            src.release(src.ctx, 1, e);
        }
        /* now hold expert 12 too: every slot is pinned, the next miss must fail, not evict */
        CHECK(src.acquire(src.ctx, 1, 12, &w, &err) == 0, "%s: acquire 12: %s", pn, err.msg);
        k3_error e2 = {0};
        CHECK(src.acquire(src.ctx, 1, 13, &w, &e2) == -1 && strstr(e2.msg, "every slot is in use"),
              "%s: a miss with every slot pinned must fail (got '%s')", pn, e2.msg);
        src.release(src.ctx, 1, 12);
        /* the pinned ones were never evicted: using them now are hits with the right bytes */
        uint64_t h0 = expert_cache_get_stats(c).hits;
        for (int i = 0; i < 2; i++) {
            expert_weights ref;
            CHECK(src.acquire(src.ctx, 1, pf[i], &w, &err) == 0 && expert_weights_mapped(&m->st, &m->ck, 1, pf[i], &ref, &err) == 0 &&
                          !memcmp(w.w1.packed, ref.w1.packed, w.w1.rows * w.w1.cols / 2),
                      "%s: pinned expert %d lost", pn, pf[i]);
            src.release(src.ctx, 1, pf[i]);
        }
        CHECK(expert_cache_get_stats(c).hits == h0, "%s: using prefetched experts counts no new hit", pn);
        cache_done(c);
    }

    /* a request's own resident experts are not evicted by its misses: with LRU the
     * oldest slot holds expert 5; request {1, 5} must pin 5 before 1 takes a slot */
    k3_error err = {0};
    expert_cache *c = cache_of(m, 3, CACHE_POLICY_LRU, &err);
    if (!c) { CHECK(0, "%s", err.msg); return; }
    static const request seq[] = {{1, 1, {5}}, {1, 1, {6}}, {1, 1, {7}}, {1, 2, {1, 5}}};
    for (int i = 0; i < 4; i++) CHECK(run_request(c, m, &seq[i], 1, &err) == 0, "%s", err.msg);
    expert_cache_stats s = expert_cache_get_stats(c);
    CHECK(s.hits == 1 && s.misses == 4, "resident expert of a request evicted by its own miss (hits %llu misses %llu)",
          (unsigned long long)s.hits, (unsigned long long)s.misses);
    cache_done(c);
}

/* Hand-made sequences where the policies differ; expected hit counts from the simulator. */
typedef struct {
    const char *name;
    int slots, workers;
    long hits[CACHE_POLICY_COUNT], lookups;
} expect;

/* loop: layers 1..4, expert 0, 8 passes (one expert per request): a loop longer than the cache */
static int seq_loop(request *out) {
    int n = 0;
    for (int pass = 0; pass < 8; pass++)
        for (int l = 1; l <= 4; l++) out[n++] = (request){l, 1, {0}};
    return n;
}

/* shift: 10 passes over {L1:e0, L2:e0}, then 12 passes over {L3:e1, L4:e1, L5:e1}:
 * recency wins (the old favourites are never used again) */
static int seq_shift(request *out) {
    int n = 0;
    for (int pass = 0; pass < 10; pass++)
        for (int l = 1; l <= 2; l++) out[n++] = (request){l, 1, {0}};
    for (int pass = 0; pass < 12; pass++)
        for (int l = 3; l <= 5; l++) out[n++] = (request){l, 1, {1}};
    return n;
}

/* mixed: 40 passes over layers 1..12; layer l uses experts {l % 4, 4 + pass % 3, 8 + (pass * 7 + l) % 8}:
 * one always-used expert, one with a period of 3 passes, one that changes every pass */
static int seq_mixed(request *out) {
    int n = 0;
    for (int pass = 0; pass < 40; pass++)
        for (int l = 1; l <= 12; l++) {
            request r = {l, 3, {l % 4, 4 + pass % 3, 8 + (pass * 7 + l) % 8}};
            qsort(r.e, 3, sizeof r.e[0], cmp_i32);
            out[n++] = r;
        }
    return n;
}

static void test_sequences(void) {
    /* hits for lru, lfu, phit; lookups. The sequences written as traces (pos = pass,
     * one line per request) and replayed by scripts/sim_expert_cache.py --sizes S
     * --workers W give these numbers (and min / sieve / s3fifo, in the comments). */
    static const expect exp[] = {
        {"loop", 3, 1, {0, 14, 19}, 32},      /* min 19, sieve 0, s3fifo 12 */
        {"shift", 3, 1, {51, 21, 51}, 56},    /* min 51, sieve 18, s3fifo 18 */
        {"mixed", 6, 1, {0, 91, 102}, 1440},  /* min 129, sieve 0, s3fifo 0 */
        {"mixed", 12, 1, {0, 347, 298}, 1440}, /* min 384, sieve 0, s3fifo 0 */
        {"mixed", 4, 2, {0, 56, 68}, 1440},   /* min 98, sieve 0, s3fifo 0 */
        {"mixed", 8, 2, {0, 289, 241}, 1440}, /* min 325, sieve 0, s3fifo 0 */
    };
    static request buf[512];
    for (size_t i = 0; i < sizeof exp / sizeof exp[0]; i++) {
        int n = !strcmp(exp[i].name, "loop") ? seq_loop(buf) : !strcmp(exp[i].name, "shift") ? seq_shift(buf) : seq_mixed(buf);
        for (int p = 0; p < CACHE_POLICY_COUNT; p++) {
            uint64_t h, mi;
            k3_error err = {0};
            int rc = replay(MODEL, buf, n, exp[i].workers, (size_t)exp[i].slots, (cache_policy)p, &h, &mi, &err);
            CHECK(rc == 0 && (long)h == exp[i].hits[p] && (long)(h + mi) == exp[i].lookups,
                  "sequence %s, %d slots, %d workers, %s: hits %llu of %llu, simulator says %ld of %ld (%s)", exp[i].name,
                  exp[i].slots, exp[i].workers, cache_policy_name((cache_policy)p), (unsigned long long)h,
                  (unsigned long long)(h + mi), exp[i].hits[p], exp[i].lookups, err.msg);
        }
    }
}

/* expert_batch_run through the cache == through the mapped checkpoint, bit for bit,
 * for every policy and several cache sizes. */
typedef struct {
    const expert_store *st;
    checkpoint *ck;
} mapped_ctx;

static int mapped_acquire(void *ctx, int layer, int expert, expert_weights *w, k3_error *err) {
    mapped_ctx *m = ctx;
    return expert_weights_mapped(m->st, m->ck, layer, expert, w, err);
}

static int every_third_unready(void *ctx, int layer, int expert) {
    (void)ctx;
    (void)layer;
    return expert % 3 != 0;
}

static void test_identical(model *m) {
    const kernels *k = kernels_get(SIMD_AUTO);
    size_t L = m->st.L, I = m->st.I;
    enum { NTOK = 6, K = 4, NREQ = 40 };
    float *z = malloc(NTOK * L * sizeof *z), *ref = malloc(NREQ * NTOK * K * L * sizeof *ref),
          *out = malloc(NTOK * K * L * sizeof *out);
    int32_t ptok[NTOK * K], pexp[NTOK * K], players[NREQ];
    if (!z || !ref || !out) { CHECK(0, "out of memory"); goto done; }
    uint64_t seed = 12345;
    for (size_t i = 0; i < NTOK * L; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        z[i] = (float)((double)(seed >> 40) / (double)(1u << 24) - 0.5);
    }
    mapped_ctx mc = {&m->st, &m->ck};
    expert_source msrc = {mapped_acquire, NULL, NULL, &mc, 0, NULL}; /* one expert at a time */
    k3_error err = {0};
    /* 40 requests cycling over the MoE layers; each token picks K experts with some repetition */
    int32_t all_exp[NREQ][NTOK * K];
    for (int q = 0; q < NREQ; q++) {
        players[q] = 1 + q % (m->cfg.num_hidden_layers - 1);
        for (int t = 0; t < NTOK; t++) { /* K distinct experts per token, few distinct per request */
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int base = (int)((seed >> 33) % 6), step = 1 + (int)((seed >> 45) % 3);
            for (int j = 0; j < K; j++) all_exp[q][t * K + j] = (base + j * step) % m->cfg.num_experts;
        }
        for (int i = 0; i < NTOK * K; i++) { ptok[i] = i / K; pexp[i] = all_exp[q][i]; }
        if (expert_batch_run(k, &msrc, L, I, m->cfg.situ_beta, m->cfg.situ_linear_beta, players[q], z, NTOK, ptok, pexp,
                             NTOK * K, ref + (size_t)q * NTOK * K * L, &err)) {
            CHECK(0, "reference run: %s", err.msg);
            goto done;
        }
    }
    /* experts held in groups (every w1/w3 of a group in one parallel region, every w2 in
     * another) == one at a time */
    static const size_t groups[] = {2, 3, EXPERT_BATCH_GROUP_MAX, EXPERT_BATCH_GROUP_MAX};
    for (size_t gi = 0; gi < sizeof groups / sizeof groups[0]; gi++) {
        expert_source gsrc = msrc;
        gsrc.max_held = groups[gi];
        if (gi == 3) gsrc.ready = every_third_unready; /* groups end before an unready expert */
        int same = 1, rc = 0;
        for (int q = 0; q < NREQ && !rc; q++) {
            for (int i = 0; i < NTOK * K; i++) { ptok[i] = i / K; pexp[i] = all_exp[q][i]; }
            rc = expert_batch_run(k, &gsrc, L, I, m->cfg.situ_beta, m->cfg.situ_linear_beta, players[q], z, NTOK, ptok,
                                  pexp, NTOK * K, out, &err);
            same &= !memcmp(out, ref + (size_t)q * NTOK * K * L, NTOK * K * L * sizeof *out);
        }
        CHECK(rc == 0 && same, "experts held %zu at a time: outputs differ from one at a time (rc %d: %s)", groups[gi], rc,
              err.msg);
    }
    /* one expert_batch_ws kept across requests of changing size (a decode step's few pairs, a
     * prefill chunk's many: the buffer grows, is kept whatever its size and reused by smaller
     * requests) == a fresh buffer per request, bit for bit */
    {
        expert_batch_ws ws = {0};
        float *fresh = malloc(NTOK * K * L * sizeof *fresh);
        int same = 1, rc = 0, kept = 1;
        void *last = NULL;
        for (int q = 0; q < NREQ && !rc && fresh; q++) {
            size_t np = (size_t)K * (size_t)(q % 3 == 0 ? NTOK : 1 + q % 2); /* 24, 8, 4, 24, ... pairs */
            for (int i = 0; i < NTOK * K; i++) { ptok[i] = i / K; pexp[i] = all_exp[q][i]; }
            rc = expert_batch_run_ws(k, &msrc, L, I, m->cfg.situ_beta, m->cfg.situ_linear_beta, players[q], z, NTOK, ptok,
                                     pexp, np, out, &ws, &err);
            rc = rc ? rc : expert_batch_run(k, &msrc, L, I, m->cfg.situ_beta, m->cfg.situ_linear_beta, players[q], z, NTOK,
                                            ptok, pexp, np, fresh, &err);
            same &= !memcmp(out, fresh, np * L * sizeof *out);
            if (q >= 1) kept &= ws.buf == last; /* the largest request came first: never reallocated */
            last = ws.buf;
        }
        CHECK(fresh && rc == 0 && same, "a kept expert_batch_ws: outputs differ from a fresh buffer's (rc %d: %s)", rc,
              err.msg);
        CHECK(kept, "expert_batch_ws: the buffer was reallocated for a smaller request");
        expert_batch_ws_free(&ws);
        free(fresh);
    }
    static const size_t sizes[] = {1, 2, 3, 5, 9, 400};
    /* readers: 0 = reads as before; 1, 4 = the pool (several reads in flight, pipelined misses);
     * hints (with readers): after each request, the next request's experts, half of them wrong */
    static const int variants[][2] = {{0, 0}, {1, 0}, {4, 0}, {1, 1}, {4, 1}};
    uint64_t hint_hits_seen = 0;
    for (int p = 0; p < CACHE_POLICY_COUNT; p++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
            int readers = variants[vi][0], hints = variants[vi][1];
            expert_cache *c = cache_of(m, sizes[si], (cache_policy)p, &err);
            if (!c) { CHECK(0, "%s", err.msg); goto done; }
            if (expert_cache_set_readers(c, readers, &err)) { CHECK(0, "readers: %s", err.msg); expert_cache_free(c); goto done; }
            CHECK(expert_cache_readers(c) == readers || !expert_cache_direct_io(c), "readers %d", expert_cache_readers(c));
            expert_source src = expert_cache_source(c);
            CHECK((src.max_held > 1) == (sizes[si] == 400), "%zu slots: max_held %zu (only a cache holding every expert "
                  "lets a batch hold several)", sizes[si], src.max_held);
            int same = 1, rc = 0;
            for (int q = 0; q < NREQ && !rc; q++) {
                for (int i = 0; i < NTOK * K; i++) { ptok[i] = i / K; pexp[i] = all_exp[q][i]; }
                rc = expert_batch_run(k, &src, L, I, m->cfg.situ_beta, m->cfg.situ_linear_beta, players[q], z, NTOK, ptok, pexp,
                                      NTOK * K, out, &err);
                same &= !memcmp(out, ref + (size_t)q * NTOK * K * L, NTOK * K * L * sizeof *out);
                if (hints && q + 1 < NREQ) {
                    int32_t h[NTOK * K];
                    for (int i = 0; i < NTOK * K; i++) h[i] = i % 2 ? all_exp[q + 1][i] : (all_exp[q + 1][i] + 7) % m->cfg.num_experts;
                    expert_cache_hint(c, players[q + 1], h, NTOK * K); /* repeats among them are skipped */
                }
            }
            expert_cache_stats s = expert_cache_get_stats(c);
            CHECK(rc == 0 && same, "policy %s, %zu slots, %d readers, hints %d: outputs differ from the mapped experts (rc %d: %s)",
                  cache_policy_name((cache_policy)p), sizes[si], readers, hints, rc, err.msg);
            CHECK(s.bytes_read == (s.misses + s.hint_reads) * m->st.expert_bytes && s.hits + s.misses > 0,
                  "policy %s, %zu slots: bytes_read", cache_policy_name((cache_policy)p), sizes[si]);
            CHECK(s.hint_hits <= s.hint_reads && s.hint_hits <= s.hits && s.hint_hits + s.hint_wasted <= s.hint_reads,
                  "hint accounting: reads %llu hits %llu wasted %llu", (unsigned long long)s.hint_reads,
                  (unsigned long long)s.hint_hits, (unsigned long long)s.hint_wasted);
            CHECK(hints || s.hint_reads == 0, "a hint read without hints");
            CHECK(readers || s.hint_reads == 0, "hints without readers must do nothing");
            if (!readers && !hints && p == CACHE_POLICY_PHIT) { /* on these sequences the pool changes no count */
                expert_cache *c2 = cache_of(m, sizes[si], (cache_policy)p, &err);
                if (c2 && !expert_cache_set_readers(c2, 4, &err)) {
                    expert_source s2 = expert_cache_source(c2);
                    for (int q = 0; q < NREQ; q++) {
                        for (int i = 0; i < NTOK * K; i++) { ptok[i] = i / K; pexp[i] = all_exp[q][i]; }
                        expert_batch_run(k, &s2, L, I, m->cfg.situ_beta, m->cfg.situ_linear_beta, players[q], z, NTOK, ptok, pexp,
                                         NTOK * K, out, &err);
                    }
                    expert_cache_stats t = expert_cache_get_stats(c2);
                    CHECK(sizes[si] < 2 || (t.hits == s.hits && t.misses == s.misses),
                          "%zu slots: readers changed the hit count (%llu/%llu vs %llu/%llu)", sizes[si],
                          (unsigned long long)t.hits, (unsigned long long)t.misses, (unsigned long long)s.hits,
                          (unsigned long long)s.misses);
                }
                cache_done(c2);
            }
            hint_hits_seen += s.hint_hits;
            cache_done(c);
        }
    CHECK(hint_hits_seen > 0, "no hint was ever used");
done:
    free(z); free(ref); free(out);
}

/* A read that fails (the shard is cut short just before expert B) leaves its slot EMPTY and
 * the cache's bookkeeping whole: with 3 slots, A resident, B failed, the misses C and D take
 * the two free slots (nothing evicted: {A, C, D} are then 3 hits), and B reads right once the
 * file is restored. Run on a copy of the model, without and with readers. */
static void test_failed_read(void) {
    const char *tmp = getenv("K3_TEST_TMP");
    char dir[512], cmd[1200];
    snprintf(dir, sizeof dir, "%s/cache_fail.XXXXXX", tmp && *tmp ? tmp : "/var/tmp");
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp %s", dir); return; }
    snprintf(cmd, sizeof cmd, "cp %s/* '%s'/", MODEL, dir);
    if (system(cmd) != 0) { CHECK(0, "%s failed", cmd); return; }
    for (int readers = 0; readers <= 2; readers += 2) {
        model m;
        k3_error err = {0};
        if (model_open(&m, dir, 0, 1, &err)) { CHECK(0, "%s", err.msg); break; }
        int layer = -1;
        for (int l = 0; l < m.cfg.num_hidden_layers && layer < 0; l++)
            if (expert_store_loc(&m.st, l, 0)) layer = l;
        /* B: the expert stored last (shard, offset) in that layer; A, C, D: three others */
        int b = 0;
        for (int e = 1; e < m.cfg.num_experts; e++) {
            const expert_loc *x = expert_store_loc(&m.st, layer, e), *y = expert_store_loc(&m.st, layer, b);
            if (x->t[0]->shard > y->t[0]->shard || (x->t[0]->shard == y->t[0]->shard && x->run_begin > y->run_begin)) b = e;
        }
        const int a = (b + 1) % 16, c = (b + 2) % 16, d = (b + 3) % 16;
        const expert_loc *lb = expert_store_loc(&m.st, layer, b);
        CHECK(lb->contiguous, "expert %d of layer %d is not one run", b, layer);
        const char *path = m.ck.shards[lb->t[0]->shard].file.path;
        FILE *f = fopen(path, "rb");
        long size = -1;
        if (f && fseek(f, 0, SEEK_END) == 0) size = ftell(f);
        size_t tail = size > (long)lb->run_begin ? (size_t)size - lb->run_begin : 0;
        uint8_t *saved = tail ? malloc(tail) : NULL;
        int ok = f && saved && fseek(f, (long)lb->run_begin, SEEK_SET) == 0 && fread(saved, 1, tail, f) == tail;
        if (f) fclose(f);
        expert_cache *ca = ok ? cache_of(&m, 3, CACHE_POLICY_LRU, &err) : NULL;
        if (!ca) { CHECK(0, "setup (readers %d): %s", readers, ok ? err.msg : "reading the shard"); free(saved); model_close(&m); break; }
        if (readers) CHECK(expert_cache_set_readers(ca, readers, &err) == 0, "readers: %s", err.msg);
        expert_source src = expert_cache_source(ca);
        expert_weights w;
        request ra = {layer, 1, {a}};
        CHECK(run_request(ca, &m, &ra, 1, &err) == 0, "readers %d: A: %s", readers, err.msg);
        CHECK(truncate(path, (off_t)lb->run_begin) == 0, "truncate %s", path);
        k3_error e2 = {0};
        CHECK(src.acquire(src.ctx, layer, b, &w, &e2) == -1 && strstr(e2.msg, "model-0000"),
              "readers %d: a read past the cut must fail naming the shard (got '%s')", readers, e2.msg);
        f = fopen(path, "r+b");
        CHECK(f && fseek(f, (long)lb->run_begin, SEEK_SET) == 0 && fwrite(saved, 1, tail, f) == tail && fclose(f) == 0,
              "restore %s", path);
        request rc1 = {layer, 1, {c}}, rd = {layer, 1, {d}};
        CHECK(run_request(ca, &m, &rc1, 1, &err) == 0 && run_request(ca, &m, &rd, 1, &err) == 0, "readers %d: C, D: %s",
              readers, err.msg);
        expert_cache_stats s0 = expert_cache_get_stats(ca);
        int32_t acd[3] = {a, c, d};
        qsort(acd, 3, sizeof acd[0], cmp_i32);
        request r3 = {layer, 3, {acd[0], acd[1], acd[2]}};
        CHECK(run_request(ca, &m, &r3, 1, &err) == 0, "readers %d: {A, C, D}: %s", readers, err.msg);
        expert_cache_stats s1 = expert_cache_get_stats(ca);
        CHECK(s0.misses == 3 && s1.hits - s0.hits == 3 && s1.misses == 3,
              "readers %d: after a failed read the free slots must be used first (misses %llu, then %llu hits %llu misses)",
              readers, (unsigned long long)s0.misses, (unsigned long long)(s1.hits - s0.hits), (unsigned long long)s1.misses);
        request rb = {layer, 1, {b}};
        CHECK(run_request(ca, &m, &rb, 1, &err) == 0, "readers %d: B after the restore: %s", readers, err.msg);
        cache_done(ca);
        free(saved);
        model_close(&m);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "note: %s failed\n", cmd);
}

int main(int argc, char **argv) {
    if (argc > 1) return replay_main(argc, argv);
    model m;
    k3_error err = {0};
    if (model_open(&m, MODEL, 0, 1, &err)) {
        printf("FAIL: cannot open %s: %s\n", MODEL, err.msg);
        return 1;
    }
    test_names();
    test_create(&m);
    test_one_slot(&m);
    test_pins(&m);
    test_sequences();
    test_identical(&m);
    model_close(&m);
    test_failed_read();
    /* the index must have been asked (phit with a full cache), else the checks above checked nothing */
    CHECK(indexed_victims_checked > 100, "only %llu victims came from the index or heap", (unsigned long long)indexed_victims_checked);
    printf("victims from phit's index and lru/lfu's heap, each checked against a scan: %llu\n", (unsigned long long)indexed_victims_checked);
    printf("%s: %d checks, %d failures\n", check_failures ? "FAIL" : "ok", check_count, check_failures);
    return check_failures ? 1 : 0;
}
