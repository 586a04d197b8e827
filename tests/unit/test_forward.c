/* test_forward.c - the batched forward and the generation step.
 *
 * - forward_batch over several sequences (different lengths, positions, a prefill
 *   chunk next to single decode tokens) gives every sequence the logits bits of
 *   running it alone, with a streamed trunk (2 slots) and with everything pinned.
 * - A pass that fails half way (the expert backend fails inside a MoE layer, as a
 *   worker past --max-restarts does) is abandoned: the next forward on a fresh
 *   state gives the right bits, with a streamed trunk.
 * - gen_step_batch: greedy ids of 3 sequences decoded together equal each decoded
 *   alone with gen_step; a stop id ends a sequence; the context cap is enforced.
 * - The engine refuses a call over more rows than its arena was sized for.
 * - No forward allocates: in a thread made after engine_init (as the server's scheduler is),
 *   engine_reserve_thread first, then a prefill chunk and a decode token make no call to
 *   malloc, calloc, realloc, aligned_alloc or posix_memalign from the engine's code (linked
 *   with --wrap, Makefile WRAP_ALLOC); at the AVX-512 level, without it they do (the
 *   kernels' one-token input buffer and prefill workspace), so the check can fail.
 * Uses tests/models/m13 (run from the repository root). */
#include "tests/unit/check.h"
#include "coordinator/experts_local.h"
#include "coordinator/generate.h"
#include "coordinator/plan.h"
#include "coordinator/layers.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An expert backend that fails its n-th call, then behaves. */
typedef struct {
    expert_backend inner;
    int calls, fail_at;
} flaky;

static int flaky_run(expert_backend *b, int layer, const float *zlat, size_t ntok, const int32_t *pt, const int32_t *pe,
                     size_t np, float *out, k3_error *err) {
    flaky *f = b->impl;
    if (++f->calls == f->fail_at) return k3_fail(err, "injected: expert server 0 past its restart limit");
    return f->inner.run(&f->inner, layer, zlat, ntok, pt, pe, np, out, err);
}

static const int32_t A[] = {5, 17, 300, 42, 7, 99, 256, 1, 11, 12};
static const int32_t B[] = {9, 8, 7};
static const int32_t C[] = {400, 3, 2, 1, 60, 61};

typedef struct {
    k3_model m;
    trunk *tr;
    flaky fl;
    expert_backend eb;
    engine en;
} rig;

static void rig_open(rig *r, int streamed, size_t max_rows) {
    memset(r, 0, sizeof *r);
    k3_error err = {0};
    if (model_load("tests/models/m13", &r->m, &err)) { printf("load: %s\n", err.msg); exit(1); }
    const kernels *k = kernels_get(SIMD_AUTO);
    size_t rows = (size_t)r->m.cfg.vocab_size / 3 + 1;
    int walk = trunk_walk_units(&r->m, rows);
    trunk_config tc = {streamed ? 1 : walk, streamed ? 2 : 0, rows, 0, 0};
    if (!(r->tr = trunk_create(&r->m, &tc, &err))) { printf("trunk: %s\n", err.msg); exit(1); }
    if (experts_local_create(&r->fl.inner, &r->m, k, 1 << 20, CACHE_POLICY_LRU, &err)) { printf("experts: %s\n", err.msg); exit(1); }
    r->eb = (expert_backend){flaky_run, NULL, &r->fl, NULL, NULL};
    r->en = (engine){.model = &r->m, .trunk = r->tr, .k = k, .experts = &r->eb};
    if (engine_init(&r->en, max_rows, 128, 2, &err)) { printf("engine: %s\n", err.msg); exit(1); }
}

static void rig_close(rig *r) {
    engine_free(&r->en);
    r->fl.inner.destroy(&r->fl.inner);
    trunk_free(r->tr);
    model_free(&r->m);
}

/* logits of every position of ids fed alone, one chunk */
static float *alone(rig *r, const int32_t *ids, size_t n) {
    size_t V = (size_t)r->m.cfg.vocab_size;
    float *out = malloc(n * V * sizeof *out);
    seq_state st;
    k3_error err = {0};
    if (!out || seq_state_init(&st, &r->m.cfg, &err)) exit(1);
    if (feed_tokens(&r->en, &st, ids, n, n, 0, out, &err)) { printf("alone: %s\n", err.msg); exit(1); }
    seq_state_free(&st);
    return out;
}

static void test_batch(int streamed) {
    rig r;
    rig_open(&r, streamed, 32);
    size_t V = (size_t)r.m.cfg.vocab_size, nA = sizeof A / 4, nB = sizeof B / 4, nC = sizeof C / 4;
    float *ra = alone(&r, A, nA), *rb = alone(&r, B, nB), *rc = alone(&r, C, nC);
    /* batch: A's first 4 as a prefill chunk, B whole, C's first 5; then A's next 6 with C's last one */
    seq_state sa, sb, sc;
    k3_error err = {0};
    seq_state_init(&sa, &r.m.cfg, &err);
    seq_state_init(&sb, &r.m.cfg, &err);
    seq_state_init(&sc, &r.m.cfg, &err);
    float *la = malloc(nA * V * sizeof *la), *lb = malloc(nB * V * sizeof *lb), *lc = malloc(nC * V * sizeof *lc);
    forward_seq s1[3] = {{&sa, A, 4, 0, la}, {&sb, B, nB, 0, lb}, {&sc, C, 5, 2, lc + 2 * V}};
    CHECK(forward_batch(&r.en, s1, 3, &err) == 0, "batch 1: %s", err.msg);
    forward_seq s2[2] = {{&sc, C + 5, 1, 0, lc + 5 * V}, {&sa, A + 4, nA - 4, 0, la + 4 * V}};
    CHECK(forward_batch(&r.en, s2, 2, &err) == 0, "batch 2: %s", err.msg);
    CHECK(memcmp(la, ra, nA * V * 4) == 0, "sequence A batched differs from alone (streamed %d)", streamed);
    CHECK(memcmp(lb, rb, nB * V * 4) == 0, "sequence B batched differs from alone (streamed %d)", streamed);
    CHECK(memcmp(lc + 2 * V, rc + 2 * V, (nC - 2) * V * 4) == 0, "sequence C batched differs from alone (streamed %d)", streamed);
    CHECK(sa.pos == nA && sb.pos == nB && sc.pos == nC, "positions not advanced");

    /* more rows than the arena holds: refused, not overflowed */
    int32_t many[40] = {0};
    seq_state_reset(&sb, &r.m.cfg);
    err = (k3_error){0};
    CHECK(forward_chunk(&r.en, &sb, many, 40, 39, NULL, &err) != 0 && strstr(err.msg, "rows"), "40 rows past a 32-row engine: '%s'", err.msg);

    /* a pass failing half way (the 2nd MoE call) is abandoned; the next forward is right */
    seq_state_reset(&sa, &r.m.cfg);
    r.fl.calls = 0;
    r.fl.fail_at = 2;
    err = (k3_error){0};
    CHECK(forward_chunk(&r.en, &sa, A, nA, 0, la, &err) != 0 && strstr(err.msg, "injected"), "injected failure not reported: '%s'", err.msg);
    seq_state_reset(&sa, &r.m.cfg);
    err = (k3_error){0};
    memset(la, 0, nA * V * 4);
    CHECK(forward_chunk(&r.en, &sa, A, nA, 0, la, &err) == 0, "forward after an abandoned pass: %s", err.msg);
    CHECK(memcmp(la, ra, nA * V * 4) == 0, "logits after an abandoned pass differ (streamed %d)", streamed);
    r.fl.fail_at = 0;

    seq_state_free(&sa); seq_state_free(&sb); seq_state_free(&sc);
    free(la); free(lb); free(lc); free(ra); free(rb); free(rc);
    rig_close(&r);
}

static void decode_alone(rig *r, const int32_t *p, size_t n, size_t gen, int32_t *out) {
    gen_seq g;
    sampler_config sc;
    sampler_config_default(&sc);
    k3_error err = {0};
    if (gen_seq_init(&g, &r->m.cfg, &sc, NULL, 0, n + gen, &err) || gen_seq_push(&g, p, n, &err)) { printf("%s\n", err.msg); exit(1); }
    for (size_t i = 0; i < gen; i++) {
        gen_event ev;
        if (gen_step(&r->en, &g, 4, &ev, &err)) { printf("gen_step: %s\n", err.msg); exit(1); }
        out[i] = ev.id;
    }
    gen_seq_free(&g);
}

static void test_gen_batch(void) {
    rig r;
    rig_open(&r, 1, 8);
    enum { GEN = 6 };
    const int32_t *P[3] = {A, B, C};
    size_t NP[3] = {sizeof A / 4, sizeof B / 4, sizeof C / 4};
    int32_t want[3][GEN], got[3][GEN];
    for (int i = 0; i < 3; i++) decode_alone(&r, P[i], NP[i], GEN, want[i]);
    gen_seq g[3], *gp[3];
    sampler_config sc;
    sampler_config_default(&sc);
    k3_error err = {0};
    for (int i = 0; i < 3; i++) {
        gp[i] = &g[i];
        CHECK(gen_seq_init(&g[i], &r.m.cfg, &sc, NULL, 0, NP[i] + GEN, &err) == 0 && gen_seq_push(&g[i], P[i], NP[i], &err) == 0, "%s", err.msg);
    }
    size_t have[3] = {0};
    for (int step = 0; step < 40 && (have[0] < GEN || have[1] < GEN || have[2] < GEN); step++) {
        gen_event ev[3];
        gen_seq *live[3];
        int map[3], nl = 0;
        for (int i = 0; i < 3; i++) if (have[i] < GEN) { map[nl] = i; live[nl++] = gp[i]; }
        CHECK(gen_step_batch(&r.en, live, (size_t)nl, 4, ev, &err) == 0, "gen_step_batch: %s", err.msg);
        for (int j = 0; j < nl; j++) {
            CHECK(ev[j].status == 0, "status %d: %s", ev[j].status, ev[j].why);
            if (ev[j].picked) got[map[j]][have[map[j]]++] = ev[j].id;
        }
    }
    for (int i = 0; i < 3; i++) CHECK(have[i] == GEN && memcmp(got[i], want[i], sizeof want[i]) == 0, "sequence %d: batched ids differ", i);
    /* the context cap: the history holds NP + GEN ids, a further pick is refused */
    gen_event ev;
    err = (k3_error){0};
    CHECK(gen_step(&r.en, &g[0], 4, &ev, &err) == GEN_CONTEXT_FULL && strstr(err.msg, "context full"), "context cap not enforced: '%s'", err.msg);
    for (int i = 0; i < 3; i++) gen_seq_free(&g[i]);
    /* a stop id ends the sequence: stop at want[1][2] */
    gen_seq s;
    int32_t stop = want[1][2];
    CHECK(gen_seq_init(&s, &r.m.cfg, &sc, &stop, 1, 64, &err) == 0 && gen_seq_push(&s, B, NP[1], &err) == 0, "%s", err.msg);
    int stopped_at = -1;
    for (int i = 0; i < GEN && stopped_at < 0; i++) {
        CHECK(gen_step(&r.en, &s, 4, &ev, &err) == 0, "%s", err.msg);
        if (ev.stop) stopped_at = i;
    }
    int first = 0;
    while (want[1][first] != stop) first++;
    CHECK(stopped_at == first, "stop id seen at %d, expected %d", stopped_at, first);
    CHECK(gen_seq_pending(&s) == 1 && s.ids[s.n - 1] == stop, "the stop id must be pending, not fed");
    gen_seq_free(&s);
    rig_close(&r);
}

typedef struct {
    rig *r;
    int reserve;
    long allocs; /* allocation calls of the engine's code during the forwards */
    int ok;
} alloc_probe;

/* every allocation call of this program's own code (libk3.a and the test) while counting */
static atomic_int counting;
static atomic_long alloc_calls;
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
static void count_alloc(void) {
    if (atomic_load(&counting)) atomic_fetch_add(&alloc_calls, 1);
}
void *__wrap_malloc(size_t n) { count_alloc(); return __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t m) { count_alloc(); return __real_calloc(n, m); }
void *__wrap_realloc(void *p, size_t n) { count_alloc(); return __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t a, size_t n) { count_alloc(); return __real_aligned_alloc(a, n); }
int __wrap_posix_memalign(void **p, size_t a, size_t n) { count_alloc(); return __real_posix_memalign(p, a, n); }

static void *alloc_probe_main(void *arg) {
    alloc_probe *a = arg;
    k3_error err = {0};
    size_t x = 0;
    /* the thread's OpenMP team first (libgomp's own allocations, not the engine's) */
#pragma omp parallel for num_threads(2) schedule(dynamic, 1) reduction(+ : x)
    for (int i = 0; i < 64; i++) x += (size_t)i;
    if (a->reserve && engine_reserve_thread(&a->r->en, &err)) { printf("reserve: %s\n", err.msg); return NULL; }
    seq_state st;
    if (seq_state_init(&st, &a->r->m.cfg, &err)) return NULL;
    /* a first pass outside the window: the expert cache fills on its first use */
    int ok = forward_chunk(&a->r->en, &st, A, 4, 3, NULL, &err) == 0;
    seq_state_reset(&st, &a->r->m.cfg);
    atomic_store(&alloc_calls, 0);
    atomic_store(&counting, 1);
    ok &= forward_chunk(&a->r->en, &st, A, 4, 3, NULL, &err) == 0;    /* a prefill chunk */
    ok &= forward_chunk(&a->r->en, &st, A + 4, 1, 0, NULL, &err) == 0; /* a decode token */
    atomic_store(&counting, 0);
    a->allocs = atomic_load(&alloc_calls);
    seq_state_free(&st);
    a->ok = ok && x == 2016;
    return NULL;
}

static void test_no_alloc(void) {
    for (int reserve = 1; reserve >= 0; reserve--) {
        rig r;
        rig_open(&r, 0, 8);
        alloc_probe a = {&r, reserve, 0, 0};
        pthread_t th;
        CHECK(pthread_create(&th, NULL, alloc_probe_main, &a) == 0, "pthread_create");
        pthread_join(th, NULL);
        CHECK(a.ok, "forwards in a new thread failed");
        if (reserve) CHECK(a.allocs == 0, "a prefill chunk and a decode token made %ld allocations after engine_reserve_thread", a.allocs);
        else if (r.en.k->level == SIMD_AVX512)
            CHECK(a.allocs > 0, "without engine_reserve_thread a new thread's forwards should allocate its kernel buffers");
        rig_close(&r);
    }
}

/* mla_scores_heads (several positions at a time) against one position and one head at a time */
static void test_mla_scores(void) {
    enum { HB = 8, KR = 40, ROPE = 8, ROW = KR + ROPE + 3, NMAX = 13 };
    static double qT[KR * HB], qpeT[ROPE * HB], p[NMAX * HB];
    static float cache[NMAX * ROW];
    uint64_t s = 7;
    for (size_t i = 0; i < KR * HB; i++) qT[i] = (double)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 11) / 9007199254740992.0 - 0.5;
    for (size_t i = 0; i < ROPE * HB; i++) qpeT[i] = (double)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 11) / 4503599627370496.0 - 1.0;
    for (size_t i = 0; i < NMAX * ROW; i++) cache[i] = (float)((double)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 40) / 16777216.0 - 0.5);
    const double scale = 0.0883883476483184;
    for (size_t n = 1; n <= NMAX; n++) {
        mla_scores_heads(qT, qpeT, cache, ROW, KR, ROPE, n, scale, p);
        size_t bad = 0;
        for (size_t ps = 0; ps < n; ps++)
            for (size_t j = 0; j < HB; j++) {
                double dl = 0, dp = 0;
                for (size_t cc = 0; cc < KR; cc++) dl += qT[cc * HB + j] * (double)cache[ps * ROW + cc];
                for (size_t r = 0; r < ROPE; r++) dp += qpeT[r * HB + j] * (double)cache[ps * ROW + KR + r];
                const double want = (dl + dp) * scale;
                if (memcmp(&want, &p[ps * HB + j], sizeof want) != 0) bad++;
            }
        CHECK(bad == 0, "mla scores over %zu positions: %zu of %zu differ from one position at a time", n, bad, n * HB);
    }
}

/* mla_context_heads (16 columns x 8 heads in registers) against one head and one position at a
 * time; kv_lora 40 = 2 blocks of 16 + a remainder of 8, and 32 (no remainder) */
static void test_mla_context(void) {
    enum { HB = 8, KRMAX = 40, ROW = KRMAX + 11, NMAX = 13 };
    static double p[NMAX * HB], ctx[HB * KRMAX];
    static float cache[NMAX * ROW];
    uint64_t s = 11;
    for (size_t i = 0; i < NMAX * HB; i++) p[i] = (double)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 11) / 9007199254740992.0;
    for (size_t i = 0; i < NMAX * ROW; i++) cache[i] = (float)((double)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 40) / 16777216.0 - 0.5);
    const size_t krs[] = {KRMAX, 32};
    for (size_t ki = 0; ki < 2; ki++)
        for (size_t nb = 5; nb <= HB; nb += 3)
            for (size_t n = 1; n <= NMAX; n++) {
                const size_t kr = krs[ki];
                mla_context_heads(p, cache, ROW, kr, n, nb, ctx);
                size_t bad = 0;
                for (size_t j = 0; j < nb; j++)
                    for (size_t cc = 0; cc < kr; cc++) {
                        double want = 0;
                        for (size_t ps = 0; ps < n; ps++) want += p[ps * HB + j] * (double)cache[ps * ROW + cc];
                        if (memcmp(&want, &ctx[j * kr + cc], sizeof want) != 0) bad++;
                    }
                CHECK(bad == 0, "mla context over %zu positions, kv_lora %zu, %zu heads: %zu of %zu differ from one at a time", n,
                      kr, nb, bad, nb * kr);
            }
}

int main(void) {
    test_mla_scores();
    test_mla_context();
    test_no_alloc();
    test_batch(0);
    test_batch(1);
    test_gen_batch();
    return check_report("test_forward");
}
